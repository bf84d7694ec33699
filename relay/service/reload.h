/* reload: SIGHUP re-reads the configuration — the same flags, the environment and the config file,
 * with the same precedence as at start-up — and takes over the options that can change in a
 * running relay (config_option_reloadable). Changed options that need a restart are logged by name
 * and keep their running values; a configuration that does not load is logged in one line and
 * ignored. Values are never logged: they may be secrets. */
#ifndef OUTBOX_RELOAD_H
#define OUTBOX_RELOAD_H

#include <stdbool.h>

#include "config.h"

/* Loads the configuration from argv (as main did) and applies its reloadable options to running,
 * including the log level. Returns true when it loaded (whether or not anything changed). */
bool reload_config(Config *running, int argc, char **argv);

/* reload_config that also hands the freshly loaded configuration to then(fresh, arg) before it
 * is released (then may take parts of it, leaving them zeroed): the databases of --databases. */
bool reload_config_then(Config *running, int argc, char **argv, void (*then)(Config *, void *),
                        void *arg);

#endif
