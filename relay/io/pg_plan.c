/* pg_plan: a connection string turned into the hosts to try and what each attempt passes to
 * libpq (pg_plan.h). */
#include "pg_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "secrets.h"

void pg_plan_free(PgPlan *plan)
{
    for (int i = 0; i < plan->ntargets; i++) {
        PgTarget *t = &plan->targets[i];
        free(t->addr.host);
        free(t->addr.hostaddr);
        free(t->addr.port);
        free(t->shown);
        free(t->last_error);
    }
    free(plan->targets);
    plan->targets = NULL;
    free(plan->options);
    plan->options = NULL;
    plan->ntargets = 0;
    free(plan->keys);
    free(plan->values);
    plan->keys = NULL;
    plan->values = NULL;
    if (plan->parsed)
        secrets_conninfo_free(plan->parsed);
    memset(plan, 0, sizeof(*plan));
}

/* The value the connection string gives a keyword. */
static const char *option_value(const PQconninfoOption *parsed, const char *keyword)
{
    for (const PQconninfoOption *o = parsed; o && o->keyword; o++)
        if (strcmp(o->keyword, keyword) == 0 && o->val)
            return o->val;
    return NULL;
}

/* Whether the string or its service file sets keyword (libpq's environment variables aside). */
static bool user_sets(const PQconninfoOption *parsed, const char *keyword)
{
    char *value = NULL, from[80];
    bool set = db_effective_value(parsed, keyword, NULL, &value, from, sizeof(from));
    free(value);
    return set;
}

/* Splits the connection string into one target per host, and the parameters every attempt
 * shares, with the relay's keepalive defaults for what neither the string nor its service file
 * sets. Lists libpq would reject (counts that do not match) are left whole for libpq to report.
 * False only when out of memory; an unparsable string is left to PQconnectStartParams to report. */
bool pg_plan_make(PgPlan *plan, const char *conninfo, long session_timeout_ms, const char *app)
{
    char *why = NULL;
    plan->parsed = PQconninfoParse(conninfo, &why);
    PQfreemem(why);
    /* The string's, else its service's (pg_service.conf), else PGCONNECT_TIMEOUT: libpq's order.
     * Zero or less is libpq's "no limit", which the relay's own timer must not take over. */
    char *timeout = NULL, from[80];
    bool has_timeout =
        plan->parsed && db_effective_value(plan->parsed, "connect_timeout", "PGCONNECT_TIMEOUT",
                                           &timeout, from, sizeof(from));
    DbHost *hosts = NULL;
    int n = db_hosts(plan->parsed, &hosts);
    plan->connect_timeout_s =
        has_timeout && atoi(timeout) > 0 ? atoi(timeout) : PG_PLAN_CONNECT_TIMEOUT_S;
    free(timeout);
    if (plan->connect_timeout_s < 2)
        plan->connect_timeout_s = 2; /* libpq's minimum */

    size_t nopts = 0;
    for (const PQconninfoOption *o = plan->parsed; o && o->keyword; o++)
        nopts++;
    /* parsed options + 5 keepalive defaults + options + fallback_application_name + the host's
     * string (dbname) + the pinned TLS files (DB_PINS_MAX, pg.c) + terminator */
    plan->keys = calloc(nopts + 11 + DB_PINS_MAX, sizeof(char *));
    plan->values = calloc(nopts + 11 + DB_PINS_MAX, sizeof(char *));
    plan->targets = n > 0 ? calloc((size_t)n, sizeof(PgTarget)) : NULL;
    bool ok = plan->keys && plan->values && plan->targets;
    if (ok && !plan->parsed) {
        /* Unparsable (main.c checks at start-up, so rarely): libpq reports why at every try. */
        plan->keys[plan->nparams] = "dbname";
        plan->values[plan->nparams++] = conninfo;
        plan->expand_dbname = 1;
    }
    /* The string's settings but options (below) and those that go in each attempt's string
     * with the host's entries (db_host_conninfo, pg.c connect_target): its dbname, and its empty
     * settings, which libpq would take from the environment if passed here. */
    for (const PQconninfoOption *o = plan->parsed; ok && o && o->keyword; o++) {
        if (!db_setting_shared(o) || strcmp(o->keyword, "options") == 0)
            continue;
        plan->keys[plan->nparams] = o->keyword;
        plan->values[plan->nparams++] = o->val;
    }
    /* The user's options with the pinned search_path after them (db.h). The user's are the
     * string's, else its service's, else PGOPTIONS (an options entry here hides the other two
     * from libpq, so they are looked up as libpq would). Nothing pinned: the string's own, and
     * libpq fills in the service's or PGOPTIONS itself. */
    if (ok && plan->parsed) {
        /* Whole, however long: cut, a "-c statement_timeout=10000" could go as "=1". */
        char *user = NULL;
        bool has_user =
            db_effective_value(plan->parsed, "options", "PGOPTIONS", &user, from, sizeof(from));
        plan->options = db_startup_options(has_user ? user : NULL);
        free(user);
        const char *options = plan->options ? plan->options : option_value(plan->parsed, "options");
        if (options) {
            plan->keys[plan->nparams] = "options";
            plan->values[plan->nparams++] = options;
        }
    }
    /* Client side of the same bound: a dead server or network is noticed within the session
     * timeout even while the relay waits for nothing (keepalives) or for an acknowledgement of
     * what it sent (tcp_user_timeout). Defaults only: the relay's own bound is its heartbeat and
     * request deadline (pg.c on_quiet, on_deadline), which need none of these, so a setting the
     * user made, in the string or its service file, wins (passed here, the default beat the
     * service file's, which libpq fills in only where nothing is set). libpq reads no
     * environment variable for them. */
    long t = session_timeout_ms;
    static const char *const keepalive_keys[5] = {"keepalives", "keepalives_idle",
                                                  "keepalives_interval", "keepalives_count",
                                                  "tcp_user_timeout"};
    long keepalive_vals[5] = {1, t / 3000 > 0 ? t / 3000 : 1, t / 9000 > 0 ? t / 9000 : 1, 3, t};
    for (int i = 0; ok && i < 5; i++) {
        if (user_sets(plan->parsed, keepalive_keys[i]))
            continue;
        snprintf(plan->keepalive_values[i], sizeof(plan->keepalive_values[i]), "%ld",
                 keepalive_vals[i]);
        plan->keys[plan->nparams] = keepalive_keys[i];
        plan->values[plan->nparams++] = plan->keepalive_values[i];
    }
    /* Names the connection in pg_stat_activity ("outbox-relay session-0"), so an operator can
     * tell the relay's sessions apart from each other and from the applications; a libpq
     * fallback, so the string's own application_name wins. */
    if (ok && app && plan->parsed && !user_sets(plan->parsed, "fallback_application_name")) {
        snprintf(plan->app_name, sizeof(plan->app_name), "%s", app);
        plan->keys[plan->nparams] = "fallback_application_name";
        plan->values[plan->nparams++] = plan->app_name;
    }
    for (int i = 0; ok && i < n; i++) {
        PgTarget *tg = &plan->targets[i];
        tg->addr = hosts[i];
        hosts[i] = (DbHost){NULL, NULL, NULL}; /* moved */
        plan->ntargets = i + 1;
        size_t len = (tg->addr.host ? strlen(tg->addr.host) : 0) +
                     (tg->addr.hostaddr ? strlen(tg->addr.hostaddr) : 0) +
                     (tg->addr.port ? strlen(tg->addr.port) : 0) + 16;
        tg->shown = malloc(len);
        if (tg->shown)
            db_host_label(&tg->addr, tg->shown, len);
        ok = tg->shown != NULL;
    }
    db_hosts_free(hosts, n);
    return ok;
}

const char *pg_error_name_host(const char *msg, const char *host, char *out, size_t outlen)
{
    static const char lead[] = "connection to server at \"";
    size_t len = 0;
    if (outlen == 0)
        return out;
    out[0] = '\0';
    const char *p = msg;
    for (const char *at; (at = strstr(p, lead)) != NULL && len < outlen;) {
        const char *addr = at + strlen(lead);
        const char *end = strchr(addr, '"');
        if (!end) /* not the shape looked for: the rest as it is */
            break;
        if (end[1] != ',') { /* named already ("HOST" (ADDR)): as it is */
            len += (size_t)snprintf(out + len, outlen - len, "%.*s", (int)(end + 1 - p), p);
            p = end + 1;
            continue;
        }
        len += (size_t)snprintf(out + len, outlen - len, "%.*s%s%s\" (%.*s)", (int)(at - p), p,
                                lead, host, (int)(end - addr), addr);
        p = end + 1;
    }
    if (len < outlen)
        snprintf(out + len, outlen - len, "%s", p);
    return out;
}
