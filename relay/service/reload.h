/* reload: SIGHUP re-reads the configuration — the same flags, the environment and the config file,
 * with the same precedence as at start-up — and takes over the options that can change in a
 * running relay (config_option_reloadable). Changed options that need a restart are logged by name
 * and keep their running values; a configuration that does not load, or that start-up would
 * refuse (a --databases entry, a --delivery-timeout past the running producer's
 * message.timeout.ms, a switch between one database and a --databases list), is logged in one line
 * naming what is wrong and ignored whole: nothing of it is applied. Values are never logged: they
 * may be secrets. */
#ifndef OUTBOX_RELOAD_H
#define OUTBOX_RELOAD_H

#include <stdbool.h>

#include "config.h"

/* Loads the configuration from argv (as main did), checks it as start-up would, and only then
 * applies its reloadable options to running, including the log level. Returns true when it was
 * applied (whether or not anything changed), false when it was refused (running untouched). */
bool reload_config(Config *running, int argc, char **argv);

/* reload_config that also hands the freshly loaded configuration to then(fresh, arg) before it
 * is released (then may take parts of it, leaving them zeroed): the databases of --databases.
 * check (may be NULL) is asked after the start-up checks and before anything is applied; what
 * it refuses (false, one line in err) is refused whole like they are, and then is not called:
 * the checks that need the running relay (the databases of --databases). Either may be NULL. */
bool reload_config_then(Config *running, int argc, char **argv,
                        bool (*check)(const Config *fresh, void *arg, char *err, size_t errlen),
                        void (*then)(Config *, void *), void *arg);

#endif
