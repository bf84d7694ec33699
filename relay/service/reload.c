#include "reload.h"

#include <stdio.h>
#include <string.h>

#include "databases.h"
#include "kafka.h"
#include "log.h"
#include "secrets.h"
#include "strbuf.h"

typedef struct Changes {
    StrBuf applied, restart;
} Changes;

static void add_name(StrBuf *list, const char *name)
{
    if (list->len > 0)
        strbuf_puts(list, ",");
    strbuf_puts(list, name);
}

static void on_change(const char *option, bool reloadable, void *arg)
{
    Changes *c = arg;
    add_name(reloadable ? &c->applied : &c->restart, option);
}

/* What start-up refuses beyond config_load (main.c run_input) and a reload can bring: each
 * database's own checks (databases_entry_check: a template that breaks order, a dead-letter topic,
 * a plaintext URL under --require-tls), and a --delivery-timeout past the running producer's
 * message.timeout.ms. All of it before anything is applied: a reload is taken whole or not at
 * all, so a bad entry never leaves the relay half on the new settings. */
static bool reload_check(const Config *running, const Config *fresh, char *err, size_t errlen)
{
    /* A running relay takes a changed list over (ops.c: databases_reload), but not a switch
     * between one database and a list: a process runs one Relay or a Databases set, made at
     * start-up. Refused whole, not half applied under a "configuration reloaded" line. */
    if ((running->n_dbs > 0) != (fresh->n_dbs > 0)) {
        snprintf(err, errlen, "%s",
                 running->n_dbs > 0
                     ? "the databases list is gone: a relay started with --databases keeps one "
                       "until a restart"
                     : "a databases list appeared: a relay started with one database takes a "
                       "list only at a restart");
        return false;
    }
    for (int i = 0; i < fresh->n_dbs; i++)
        if (!databases_entry_check(&fresh->dbs[i], err, errlen))
            return false;
    if (!fresh->n_dbs && !databases_entry_check(fresh, err, errlen))
        return false;
    return kafka_reload_check(running, fresh, err, errlen);
}

bool reload_config(Config *running, int argc, char **argv)
{
    return reload_config_then(running, argc, argv, NULL, NULL, NULL);
}

bool reload_config_then(Config *running, int argc, char **argv,
                        bool (*check)(const Config *fresh, void *arg, char *err, size_t errlen),
                        void (*then)(Config *, void *), void *arg)
{
    Config fresh;
    char err[1024], q[1100];
    if (!config_load_reload(&fresh, argc, argv, err, sizeof(err))) {
        log_error("configuration reload failed; keeping the running configuration", "error=%s",
                  log_quote(err, q, sizeof(q)));
        config_free(&fresh);
        return false;
    }
    /* A changed password file is not applied (restart-only) but must never be printed either:
     * registered before anything (the checks' errors included) can show it. */
    secrets_count_short_anew(); /* the reloaded configuration's, each once */
    size_t short_before = secrets_too_short();
    config_register_secrets(&fresh);
    /* As at start-up (main.c): a secret too short to register is masked in connection strings
     * only, so the reloaded configuration's are said, whether or not the reload is taken (its
     * errors may show them). Said on every reload that holds one, as every start says it. */
    size_t short_now = secrets_too_short() - short_before;
    log_warn_short_secrets(short_now);
    if (!reload_check(running, &fresh, err, sizeof(err)) ||
        (check && !check(&fresh, arg, err, sizeof(err)))) {
        log_error("configuration reload failed; keeping the running configuration", "error=%s",
                  log_quote(err, q, sizeof(q)));
        config_free(&fresh);
        return false;
    }

    Changes c = {{0}, {0}};
    config_diff(running, &fresh, on_change, &c);
    config_apply_reloadable(running, &fresh);
    /* A list the running relay takes over (databases_reload) is the one the next reload is told
     * apart from: config_apply_reloadable copies no strings, and the start-up list kept would
     * have every later reload say changed=databases, nothing changed. */
    if (running->n_dbs > 0) {
        char *taken = fresh.databases;
        fresh.databases = running->databases;
        running->databases = taken;
    }
    log_set_level(running->log_level);
    log_info("configuration reloaded", "changed=%s", c.applied.len ? c.applied.s : "none");
    if (c.restart.len)
        log_warn("changed options need a restart; they keep their running values", "options=%s",
                 c.restart.s);
    strbuf_free(&c.applied);
    strbuf_free(&c.restart);
    if (then)
        then(&fresh, arg);
    config_free(&fresh);
    return true;
}
