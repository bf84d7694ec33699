#include "ops.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "log.h"
#include "metrics.h"
#include "readiness.h"
#include "reload.h"
#include "upkeep.h"

struct Ops {
    struct ev_loop *loop;
    Config *cfg;
    int argc;
    char **argv;
    Relay *relay;
    Databases *dbs; /* instead of relay, with --databases */
    HttpServer *http;
    Upkeep *upkeep;
    ev_signal sighup;
};

/* /healthz answers from the loop itself, so a 200 proves the loop turns; /readyz also needs both
 * ends of the pipe. Neither touches the network: they are safe to poll often. */
/* With several databases the process is ready while at least one of them is: one database down
 * (its own outage, a lock, revoked grants) is that database's problem, which restarting or
 * routing around this process would not cure, and it must not take the others' relay out of
 * a rollout. Each database's state is in the body and in outbox_database_ready. */
static int handle_databases(Ops *o, const char *path, StrBuf *body, const char **content_type)
{
    if (strcmp(path, "/metrics") == 0) {
        databases_metrics(o->dbs, body);
        *content_type = "text/plain; version=0.0.4; charset=utf-8";
        return 200;
    }
    if (strcmp(path, "/healthz") == 0) {
        strbuf_puts(body, "ok\n");
        return 200;
    }
    if (strcmp(path, "/readyz") == 0) {
        DatabasesStatus st;
        databases_status(o->dbs, &st);
        bool ready = st.ready > 0 && !st.stopping;
        char line[120];
        snprintf(line, sizeof(line), "%s: %d of %d databases ready%s\n",
                 ready ? "ready" : "not ready", st.ready, st.total,
                 st.stopping ? ", shutting down" : "");
        strbuf_puts(body, line);
        databases_readyz(o->dbs, body);
        return ready ? 200 : 503;
    }
    strbuf_puts(body, "not found\n");
    return 404;
}

/* The paths handle and handle_databases serve (http_server_new: 405, not 404, for another method
 * there). */
static const char *const ops_paths[] = {"/metrics", "/healthz", "/readyz", NULL};

static int handle(const char *path, StrBuf *body, const char **content_type, void *arg)
{
    Ops *o = arg;
    log_set_context(NULL);
    if (o->dbs)
        return handle_databases(o, path, body, content_type);
    RelayStatus st;
    relay_status(o->relay, &st);
    if (strcmp(path, "/metrics") == 0) {
        MetricsLive live = {.postgres_up = st.postgres_up,
                            .kafka_up = st.kafka_up,
                            .registry_up = st.registry_up,
                            .lanes_owned = st.lanes_owned,
                            .live_sessions = st.live_sessions,
                            .claim_sessions = st.claim_sessions,
                            .held_aggregate_types = st.held_aggregate_types,
                            .kafka_away = st.kafka_away,
                            .ready = readiness_judge(&st, upkeep_lane_squatters(o->upkeep), NULL)};
        metrics_render(body, &live);
        *content_type = "text/plain; version=0.0.4; charset=utf-8";
        return 200;
    }
    if (strcmp(path, "/healthz") == 0) {
        strbuf_puts(body, "ok\n");
        return 200;
    }
    if (strcmp(path, "/readyz") == 0) {
        StrBuf why = {0};
        bool ready = readiness_judge(&st, upkeep_lane_squatters(o->upkeep), &why);
        strbuf_puts(body, ready ? "ready\n" : "not ready:");
        if (!ready) {
            strbuf_puts(body, why.s ? why.s : "");
            strbuf_puts(body, "\n");
        }
        strbuf_free(&why);
        return ready ? 200 : 503;
    }
    strbuf_puts(body, "not found\n");
    return 404;
}

static bool check_databases(const Config *fresh, void *arg, char *err, size_t errlen)
{
    return databases_reload_check(arg, fresh, err, errlen);
}

static void reload_databases(Config *fresh, void *arg)
{
    databases_reload(arg, fresh);
}

/* True once SIGTERM/SIGINT started the shutdown (a relay failure's included, with databases). */
static bool shutting_down(const Ops *o)
{
    if (o->dbs) {
        DatabasesStatus st;
        databases_status(o->dbs, &st);
        return st.stopping;
    }
    RelayStatus st;
    relay_status(o->relay, &st);
    return st.stopping;
}

static void on_sighup(struct ev_loop *loop, ev_signal *w, int revents)
{
    Ops *o = w->data;
    log_set_context(NULL);
    metrics_select(NULL);
    /* Nothing a reload changes reaches a shutdown already under way: the drain runs on the
     * --shutdown-timeout it started with, and databases_reload neither adds nor drops a database
     * then. Taking the file would log "configuration reloaded" for changes that never happen. */
    if (shutting_down(o)) {
        log_warn("reload ignored: shutting down", NULL);
        return;
    }
    if (o->dbs) {
        reload_config_then(o->cfg, o->argc, o->argv, check_databases, reload_databases, o->dbs);
        return;
    }
    if (reload_config(o->cfg, o->argc, o->argv) && o->upkeep)
        upkeep_reconfigure(o->upkeep);
}

Ops *ops_new(struct ev_loop *loop, Config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    Ops *o = calloc(1, sizeof(*o));
    if (!o) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    o->loop = loop;
    o->cfg = cfg;
    o->argc = argc;
    o->argv = argv;
    if (cfg->metrics_listen) {
        o->http = http_server_new(loop, cfg->metrics_listen, ops_paths, handle, o, err, errlen);
        if (!o->http) {
            free(o);
            return NULL;
        }
    }
    ev_signal_init(&o->sighup, on_sighup, SIGHUP);
    o->sighup.data = o;
    return o;
}

/* The reload handler, and SIGHUP let through at last: main blocked it until now, so that one sent
 * while the relay started is neither fatal nor lost (it reloads on the loop's first turn). */
static void sighup_start(Ops *o)
{
    ev_signal_start(o->loop, &o->sighup);
    /* With EVFLAG_SIGNALFD (main.c's loop ignores LIBEV_FLAGS, but a caller's loop may ask it)
     * libev installs no handler: it blocks the signal and reads it from a signalfd. Let through,
     * it had its default action, and the first reload ended the relay (exit 129). */
    struct sigaction now;
    if (sigaction(SIGHUP, NULL, &now) == 0 && now.sa_handler == SIG_DFL)
        return;
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    sigprocmask(SIG_UNBLOCK, &hup, NULL);
}

void ops_start(Ops *o, Relay *relay)
{
    o->relay = relay;
    if (o->http)
        log_info("metrics listening", "address=%s paths=/metrics,/healthz,/readyz",
                 http_server_address(o->http));
    o->upkeep = upkeep_new(o->loop, o->cfg, o->http != NULL);
    sighup_start(o);
}

void ops_start_databases(Ops *o, Databases *dbs)
{
    o->dbs = dbs;
    if (o->http)
        log_info("metrics listening", "address=%s paths=/metrics,/healthz,/readyz",
                 http_server_address(o->http));
    sighup_start(o);
}

void ops_free(Ops *o)
{
    if (!o)
        return;
    /* The loop is over: a reload has nothing left to apply. libev gives the signal back its
     * default as the handler stops, which ended a relay in the middle of its teardown (the
     * producers' last flush, the wait for old ones) with a death by signal (exit 129) in place of
     * its own status and last lines. Blocked in this thread from before the stop until it is
     * ignored: one sent between the two stays pending, and is dropped as it becomes ignored.
     * Ignored before the stop as well: with a signalfd (sighup_start) libev kept it blocked, and
     * its stop unblocks it in place of restoring a default it never replaced, which delivered
     * one pending then with that default (the block above undone). Unblocked at the end in
     * either case: ignored, it can do no harm. */
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    sigprocmask(SIG_BLOCK, &hup, NULL);
    signal(SIGHUP, SIG_IGN);
    ev_signal_stop(o->loop, &o->sighup);
    signal(SIGHUP, SIG_IGN);
    sigprocmask(SIG_UNBLOCK, &hup, NULL);
    upkeep_free(o->upkeep);
    http_server_free(o->http);
    free(o);
}

void ops_sd_status(const void *arg, RelayStatus *st, char *status, size_t len)
{
    const Ops *o = arg;
    relay_status(o->relay, st);
    StrBuf why = {0};
    if (st->stopping)
        snprintf(status, len, "shutting down");
    else if (readiness_judge(st, upkeep_lane_squatters(o->upkeep), &why))
        snprintf(status, len, "ready: %d lanes owned, %d sessions in the group", st->lanes_owned,
                 st->live_sessions);
    else
        snprintf(status, len, "not ready:%s", why.s ? why.s : "");
    strbuf_free(&why);
}
