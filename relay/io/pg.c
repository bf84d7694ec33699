#include "pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "db.h"
#include "log.h"

#define PG_MAX_QUERIES 8
/* Distinct statements a connection prepares; beyond that, statements are sent unprepared. */
#define PG_MAX_PREPARED 8
/* A connection attempt to one host that has not completed after this long (when the URL sets no
 * connect_timeout) moves on to the next host: libpq enforces connect_timeout only in blocking
 * mode, so a black-holed host would otherwise stall the attempt until TCP gives up (minutes). */
#define PG_CONNECT_TIMEOUT_S 10.0
#define PG_BACKOFF_BASE_S 0.2
/* Capped at 5 s rather than more: after a failover the relay should find the new primary within
 * seconds, and an attempt costs a refused SYN or one startup exchange. */
#define PG_BACKOFF_CAP_S 5.0

/* The process-wide session timeout (pg_set_session_timeout). */
static long session_timeout_ms = PG_SESSION_TIMEOUT_DEFAULT_MS;

/* PG_SETUP: connected, the session's timeouts being set; the owner hears "up" after that. */
typedef enum { PG_DOWN, PG_CONNECTING, PG_SETUP, PG_UP } PgState;

/* One host of the connection string, tried in turn. */
typedef struct PgTarget {
    PgHost addr;
    char *shown;      /* "host:port" for the logs */
    char *last_error; /* the failure last logged for this host, until it connects */
} PgTarget;

/* A statement prepared (or being prepared) on the current connection. Names are never reused
 * within a connection: a statement dropped from this list after a failure may still exist on
 * the server. */
typedef struct Prepared {
    char *sql; /* a copy: the statement's identity; NULL = free slot */
    char name[32];
} Prepared;

/* What one result of a request answers: the preparing of a statement, or a statement of the
 * request (run as a prepared one when slot >= 0). */
typedef struct Expected {
    bool preparing;
    int slot; /* the prepared statement's, or -1 */
} Expected;

struct PgConn {
    struct ev_loop *loop;
    char *conninfo;
    char tag[40]; /* "conn=NAME " in log lines of a named connection, else "" */
    PGconn *conn;
    PgState state;
    /* What every attempt passes to PQconnectStartParams: the parsed connection string (without
     * host, hostaddr and port, which come from the target) plus the relay's keepalive defaults. */
    const char **keys, **values;
    int nparams, expand_dbname;
    PQconninfoOption *parsed; /* owns the strings in values */
    char keepalive_values[5][16];
    PgTarget *targets;
    int ntargets, target; /* the host being tried */
    double connect_timeout_s;
    double request_timeout_s;
    bool ever_up;     /* for "connected" vs "reconnected" in the log */
    bool down_logged; /* the current outage was logged once; retries go to debug */
    ev_io io;
    int io_fd, io_events;
    ev_timer timer;    /* connect timeout while connecting, reconnect delay while down */
    ev_timer quiet;    /* restarted at every send: a third of the session timeout of silence */
    ev_timer deadline; /* runs while an answer is outstanding (request_timeout_s) */
    bool heartbeat;    /* a heartbeat's Sync is in the pipeline, ahead of any request */
    ev_tstamp heartbeat_sent_at;
    unsigned long syncs_done; /* answers completed: progress, for the deadline */
    char *broken;   /* a result said this session is unusable (read-only, shutting down) */
    ev_timer defer; /* reports a send failure from the loop, not from inside pg_conn_send */
    char *deferred_loss;
    Backoff backoff;

    Prepared prepared[PG_MAX_PREPARED];
    unsigned long prepared_count; /* names given out on this connection */

    /* The request in flight. */
    bool busy;
    PgResultFn cb;
    void *cb_arg;
    int nqueries, nresults;
    PGresult *results[PG_MAX_QUERIES];
    Expected expected[2 * PG_MAX_QUERIES]; /* in send order */
    int nexpected, nreceived;
    char *error;

    PgStateFn on_state;
    PgNotifyFn on_notify;
    void *arg;
};

/* Watches fd for events. A connection attempt moves between sockets (the next address or host,
 * an SSL retry) and a new socket often gets the number the old one had: libev must then be told
 * afresh (rearm), or it keeps waiting on a registration the kernel dropped with the old socket. */
static void watch(PgConn *pg, int fd, int events, bool rearm)
{
    if (!rearm && pg->io_fd == fd && pg->io_events == events && ev_is_active(&pg->io))
        return;
    ev_io_stop(pg->loop, &pg->io);
    pg->io_fd = fd;
    pg->io_events = events;
    if (fd >= 0 && events) {
        ev_io_set(&pg->io, fd, events);
        ev_io_start(pg->loop, &pg->io);
    }
}

static void set_io(PgConn *pg, int fd, int events)
{
    watch(pg, fd, events, false);
}

/* Connected as far as the socket goes: setting up the session, or up. */
static bool linked(const PgConn *pg)
{
    return pg->state == PG_SETUP || pg->state == PG_UP;
}

/* An answer (a request's or a heartbeat's) is outstanding. */
static bool awaiting(const PgConn *pg)
{
    return pg->busy || pg->heartbeat;
}

static void start_connect(PgConn *pg);
static void attempt_target(PgConn *pg);

static void forget_prepared(PgConn *pg, int slot)
{
    free(pg->prepared[slot].sql);
    pg->prepared[slot].sql = NULL;
}

/* A new connection has none of the old one's statements. */
static void forget_all_prepared(PgConn *pg)
{
    for (int i = 0; i < PG_MAX_PREPARED; i++)
        forget_prepared(pg, i);
    pg->prepared_count = 0;
}

/* Routes server notices into our log instead of libpq's default raw stderr output. */
static void notice_to_log(void *arg, const char *message)
{
    char q[512];
    log_debug("postgres notice", "notice=%s", log_quote(db_error_line(message), q, sizeof(q)));
}

/* Fails the request in flight, if any. */
static void fail_request(PgConn *pg, const char *reason)
{
    if (!pg->busy)
        return;
    pg->busy = false;
    for (int i = 0; i < pg->nresults; i++)
        PQclear(pg->results[i]);
    pg->nresults = 0;
    free(pg->error);
    pg->error = NULL;
    pg->cb(pg, NULL, 0, reason, pg->cb_arg);
}

/* Closes the libpq connection and everything that watches it. */
static void close_conn(PgConn *pg)
{
    set_io(pg, -1, 0);
    ev_timer_stop(pg->loop, &pg->timer);
    ev_timer_stop(pg->loop, &pg->defer);
    ev_timer_stop(pg->loop, &pg->quiet);
    ev_timer_stop(pg->loop, &pg->deadline);
    free(pg->deferred_loss);
    pg->deferred_loss = NULL;
    free(pg->broken);
    pg->broken = NULL;
    pg->heartbeat = false;
    if (pg->conn)
        PQfinish(pg->conn);
    pg->conn = NULL;
}

/* The connection is gone (or never came up): close it, fail the request, schedule a retry. */
static void lose(PgConn *pg, const char *why)
{
    char reason[512];
    snprintf(reason, sizeof(reason), "%s", db_error_line(why));
    bool was_up = pg->state == PG_UP;

    close_conn(pg);
    pg->state = PG_DOWN;
    forget_all_prepared(pg);

    double delay = backoff_next(&pg->backoff);
    char q[600];
    if (!pg->down_logged) {
        log_warn(was_up ? "postgres connection lost" : "postgres unreachable",
                 "%serror=%s retry_in_s=%.2f", pg->tag, log_quote(reason, q, sizeof(q)), delay);
        pg->down_logged = true;
    } else {
        log_debug("postgres still unreachable", "%serror=%s retry_in_s=%.2f", pg->tag,
                  log_quote(reason, q, sizeof(q)), delay);
    }
    ev_timer_set(&pg->timer, delay, 0);
    ev_timer_start(pg->loop, &pg->timer);

    fail_request(pg, reason);
    if (was_up)
        pg->on_state(pg, false, reason, pg->arg);
}

/* Settings that make PostgreSQL end this session when the relay stops talking, within the
 * session timeout T, however it stopped:
 * - a frozen process (SIGSTOP, a paused VM) whose kernel still answers TCP: only the idle
 *   timeouts see it, as the backend waits for its next message (in a transaction or not);
 * - a dead host or network while the backend waits: the same idle timeouts; while it has unsent
 *   or unacknowledged data: tcp_user_timeout; keepalives for a socket that is otherwise quiet.
 * The relay's heartbeat (every T/3 of silence) keeps a healthy session from looking idle for T.
 * client_connection_check_interval lets a backend stuck in a long statement notice that the
 * relay gave the connection up (its deadline) instead of running on with the lanes' locks.
 * Older servers get what they know. */
static void setup_sql(const PgConn *pg, char *sql, size_t len)
{
    long t = session_timeout_ms;
    long idle_s = t / 3000 > 0 ? t / 3000 : 1, interval_s = t / 9000 > 0 ? t / 9000 : 1;
    int v = PQserverVersion(pg->conn);
    int n = snprintf(sql, len,
                     "SELECT set_config('idle_in_transaction_session_timeout', '%ld', false),"
                     " set_config('tcp_keepalives_idle', '%ld', false),"
                     " set_config('tcp_keepalives_interval', '%ld', false),"
                     " set_config('tcp_keepalives_count', '3', false)",
                     t, idle_s, interval_s);
    if (v >= 120000 && n > 0 && (size_t)n < len)
        n +=
            snprintf(sql + n, len - (size_t)n, ", set_config('tcp_user_timeout', '%ld', false)", t);
    if (v >= 140000 && n > 0 && (size_t)n < len)
        snprintf(sql + n, len - (size_t)n,
                 ", set_config('idle_session_timeout', '%ld', false),"
                 " set_config('client_connection_check_interval', '%ld', false)",
                 t, t / 3 > 1000 ? t / 3 : 1000);
}

static void on_setup(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    if (!results)
        return; /* lost: lose() has taken over */
    if (error) {
        /* The relay still works, only a silent relay keeps its lanes until TCP gives up. */
        char q[512];
        log_warn("cannot set the session timeouts; a silent relay may keep its lanes for long",
                 "%serror=%s", pg->tag, log_quote(error, q, sizeof(q)));
    }
    pg->state = PG_UP;
    pg->on_state(pg, true, NULL, pg->arg);
}

static bool send_internal(PgConn *pg, const char *sql, PgResultFn cb);

static void connected(PgConn *pg)
{
    ev_timer_stop(pg->loop, &pg->timer);
    if (PQsetnonblocking(pg->conn, 1) != 0 || PQenterPipelineMode(pg->conn) != 1) {
        lose(pg, PQerrorMessage(pg->conn));
        return;
    }
    PQsetNoticeProcessor(pg->conn, notice_to_log, NULL);
    PgTarget *t = &pg->targets[pg->target];
    free(t->last_error);
    t->last_error = NULL;
    pg->state = PG_SETUP;
    backoff_reset(&pg->backoff);
    char q1[300], q2[40];
    if (!pg->ever_up || pg->down_logged)
        log_info(pg->ever_up ? "postgres reconnected" : "postgres connected",
                 "%sserver_version=%d host=%s port=%s", pg->tag, PQserverVersion(pg->conn),
                 log_quote(PQhost(pg->conn), q1, sizeof(q1)),
                 log_quote(PQport(pg->conn), q2, sizeof(q2)));
    pg->ever_up = true;
    pg->down_logged = false;
    watch(pg, PQsocket(pg->conn), EV_READ, true);
    char sql[512];
    setup_sql(pg, sql, sizeof(sql));
    if (!send_internal(pg, sql, on_setup))
        lose(pg, "cannot send the session setup");
}

/* One host failed (refused, timed out, rejected by target_session_attrs...): try the next one,
 * or, after the last, wait and start over. With several hosts, each logs its failure once per
 * change (a host that keeps refusing logs once), the retries at debug level. */
static void target_failed(PgConn *pg, const char *why)
{
    char reason[512];
    snprintf(reason, sizeof(reason), "%s", db_error_line(why));
    close_conn(pg);
    pg->state = PG_DOWN;
    if (pg->ntargets > 1) {
        PgTarget *t = &pg->targets[pg->target];
        char q[600], q2[300];
        bool changed = !t->last_error || strcmp(t->last_error, reason) != 0;
        log_write(changed ? LOG_WARN : LOG_DEBUG, "postgres host failed", "%shost=%s error=%s",
                  pg->tag, log_quote(t->shown, q2, sizeof(q2)), log_quote(reason, q, sizeof(q)));
        if (changed) {
            free(t->last_error);
            t->last_error = strdup(reason);
        }
        if (++pg->target < pg->ntargets) {
            attempt_target(pg);
            return;
        }
    }
    lose(pg, reason);
}

static void connect_step(PgConn *pg)
{
    switch (PQconnectPoll(pg->conn)) {
    case PGRES_POLLING_READING:
        watch(pg, PQsocket(pg->conn), EV_READ, true);
        break;
    case PGRES_POLLING_WRITING:
        watch(pg, PQsocket(pg->conn), EV_WRITE, true);
        break;
    case PGRES_POLLING_OK:
        connected(pg);
        break;
    default:
        target_failed(pg, PQerrorMessage(pg->conn));
        break;
    }
}

/* Starts connecting to the current target (one host of the list). */
static void attempt_target(PgConn *pg)
{
    const PgTarget *t = &pg->targets[pg->target];
    int n = pg->nparams;
    pg->keys[n] = "host", pg->values[n++] = t->addr.host;
    pg->keys[n] = "hostaddr", pg->values[n++] = t->addr.hostaddr;
    pg->keys[n] = "port", pg->values[n++] = t->addr.port;
    pg->keys[n] = NULL, pg->values[n] = NULL;
    pg->conn = PQconnectStartParams(pg->keys, pg->values, pg->expand_dbname);
    if (!pg->conn || PQstatus(pg->conn) == CONNECTION_BAD) {
        target_failed(pg, pg->conn ? PQerrorMessage(pg->conn) : "out of memory");
        return;
    }
    pg->state = PG_CONNECTING;
    ev_timer_set(&pg->timer, pg->connect_timeout_s, 0);
    ev_timer_start(pg->loop, &pg->timer);
    /* PQconnectStart leaves the first step as "writing" (the TCP connect in progress). */
    watch(pg, PQsocket(pg->conn), EV_WRITE, true);
}

static void start_connect(PgConn *pg)
{
    pg->target = 0;
    attempt_target(pg);
}

/* Something went to the server: restart the quiet timer, and the deadline unless an earlier
 * answer is still awaited (its deadline stands). */
static void sent(PgConn *pg, bool was_awaiting)
{
    ev_timer_again(pg->loop, &pg->quiet);
    if (!was_awaiting)
        ev_timer_again(pg->loop, &pg->deadline);
}

/* An answer completed: the next outstanding one (if any) gets a full deadline. */
static void answered(PgConn *pg)
{
    pg->syncs_done++;
    if (awaiting(pg))
        ev_timer_again(pg->loop, &pg->deadline);
    else
        ev_timer_stop(pg->loop, &pg->deadline);
}

static void complete_request(PgConn *pg)
{
    PGresult *results[PG_MAX_QUERIES] = {0};
    int n = pg->nresults;
    memcpy(results, pg->results, sizeof(PGresult *) * (size_t)n);
    char *error = pg->error;
    PgResultFn cb = pg->cb;
    void *cb_arg = pg->cb_arg;

    /* Idle again before the callback runs, so it can send the next request at once. */
    pg->busy = false;
    pg->nresults = 0;
    pg->error = NULL;
    answered(pg);
    cb(pg, results, n, error, cb_arg);
    for (int i = 0; i < n; i++)
        PQclear(results[i]);
    free(error);
}

/* Errors after which this session is of no use, whatever the statement: the server became
 * read-only (a primary demoted, or a standby reached through a URL without
 * target_session_attrs=read-write), is shutting down or restarting, or the connection broke.
 * Retrying on the same session would fail the same way for ever; a new connection finds the
 * (new) primary. */
static bool session_unusable(const char *sqlstate)
{
    return sqlstate && (strcmp(sqlstate, "25006") == 0 /* read_only_sql_transaction */ ||
                        strcmp(sqlstate, "57P01") == 0 /* admin_shutdown */ ||
                        strcmp(sqlstate, "57P02") == 0 /* crash_shutdown */ ||
                        strcmp(sqlstate, "57P03") == 0 /* cannot_connect_now */ ||
                        strncmp(sqlstate, "08", 2) == 0 /* connection_exception */);
}

static void read_results(PgConn *pg)
{
    int nulls = 0;
    while (linked(pg) && awaiting(pg) && !PQisBusy(pg->conn)) {
        PGresult *r = PQgetResult(pg->conn);
        if (!r) {
            /* NULL ends each statement's results in pipeline mode; two in a row means nothing
             * more has arrived yet. */
            if (++nulls > 1)
                break;
            continue;
        }
        nulls = 0;
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            if (pg->heartbeat) {
                /* Heartbeats are sent only while no request is in flight, so the first Sync
                 * answered is the heartbeat's. */
                pg->heartbeat = false;
                log_debug("postgres heartbeat", "%srtt_ms=%.3f", pg->tag,
                          (ev_time() - pg->heartbeat_sent_at) * 1e3);
                answered(pg);
            } else if (pg->broken) {
                char reason[600];
                snprintf(reason, sizeof(reason), "%s; reconnecting", pg->broken);
                lose(pg, reason);
            } else {
                complete_request(pg);
            }
            continue;
        }
        bool failed = st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR;
        if (failed && !pg->error)
            pg->error = strdup(db_error_line(PQresultErrorMessage(r)));
        const char *state = failed ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
        if (session_unusable(state) && !pg->broken) {
            char reason[560];
            snprintf(reason, sizeof(reason), "%s (SQLSTATE %s)",
                     db_error_line(PQresultErrorMessage(r)), state);
            pg->broken = strdup(reason);
        }
        Expected of =
            pg->nreceived < pg->nexpected ? pg->expected[pg->nreceived] : (Expected){false, -1};
        pg->nreceived++;
        if (of.preparing) {
            /* Unless the preparing worked, the statement does not exist on the server. */
            if (st != PGRES_COMMAND_OK)
                forget_prepared(pg, of.slot);
            PQclear(r);
            continue;
        }
        if (pg->nresults < pg->nqueries) {
            /* A prepared statement whose result columns a schema change altered fails at every
             * run ("cached plan must not change result type"): prepare it afresh next time. */
            if (of.slot >= 0 && state && strcmp(state, "0A000") == 0)
                forget_prepared(pg, of.slot);
            pg->results[pg->nresults++] = r;
        } else {
            PQclear(r);
        }
    }
}

static void read_notifies(PgConn *pg)
{
    PGnotify *n;
    while (pg->state == PG_UP && (n = PQnotifies(pg->conn)) != NULL) {
        pg->on_notify(pg, n->relname, n->extra, pg->arg);
        PQfreemem(n);
    }
}

static void flush_output(PgConn *pg)
{
    int r = PQflush(pg->conn);
    if (r < 0)
        lose(pg, PQerrorMessage(pg->conn));
    else
        /* 1: more to send; libpq wants read-readiness too so it can make room. */
        set_io(pg, PQsocket(pg->conn), r ? EV_READ | EV_WRITE : EV_READ);
}

/* Reads what the server sent and hands it out. False when the connection broke (lost). */
static bool consume(PgConn *pg)
{
    if (!PQconsumeInput(pg->conn) || PQstatus(pg->conn) == CONNECTION_BAD) {
        lose(pg, PQerrorMessage(pg->conn));
        return false;
    }
    read_notifies(pg);
    read_results(pg);
    /* Reading results may have parsed notifications that came with them: hand them out now,
     * not whenever the socket next has data. */
    read_notifies(pg);
    return linked(pg);
}

static void on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    PgConn *pg = w->data;
    if (pg->state == PG_CONNECTING) {
        connect_step(pg);
        return;
    }
    if (!linked(pg))
        return;
    if ((revents & EV_READ) && !consume(pg))
        return;
    if (linked(pg) && (pg->io_events & EV_WRITE))
        flush_output(pg);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    if (pg->state == PG_CONNECTING) {
        char why[96];
        snprintf(why, sizeof(why), "no connection within %.0f s (connect_timeout)",
                 pg->connect_timeout_s);
        target_failed(pg, why);
    } else if (pg->state == PG_DOWN) {
        start_connect(pg);
    }
}

static void on_defer(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    char reason[512];
    snprintf(reason, sizeof(reason), "%s", pg->deferred_loss ? pg->deferred_loss : "send failed");
    lose(pg, reason);
}

/* Nothing went to the server for a third of the session timeout: a heartbeat, so that neither
 * the server's idle timeouts nor a silent network go unnoticed. A lone Sync is the cheapest
 * round trip the protocol has (5 bytes out, 6 back, nothing parsed or planned); inside an open
 * transaction it commits nothing. It is sent only while no request is in flight (a busy
 * backend is not idle, and the request's own deadline watches it); a request sent meanwhile
 * queues behind it in the pipeline, so the owner never notices it. */
static void on_quiet(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    if (pg->state != PG_UP || awaiting(pg) || pg->deferred_loss)
        return;
    if (PQpipelineSync(pg->conn) != 1) {
        lose(pg, PQerrorMessage(pg->conn));
        return;
    }
    pg->heartbeat = true;
    pg->heartbeat_sent_at = ev_time();
    sent(pg, false);
    flush_output(pg);
}

/* No answer within the deadline. The answer may be waiting in the socket unread (the relay
 * itself was frozen, and its timers fire before its reads when it wakes): read first, and give
 * up only if nothing completed. */
static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    if (!linked(pg) || !awaiting(pg))
        return;
    unsigned long before = pg->syncs_done;
    if (!consume(pg) || pg->syncs_done != before || !awaiting(pg))
        return;
    char why[160];
    snprintf(why, sizeof(why),
             "no answer from PostgreSQL within %.0f ms (--session-timeout); giving the connection "
             "up",
             pg->request_timeout_s * 1e3);
    lose(pg, why);
}

static void free_targets(PgConn *pg)
{
    for (int i = 0; i < pg->ntargets; i++) {
        PgTarget *t = &pg->targets[i];
        free(t->addr.host);
        free(t->addr.hostaddr);
        free(t->addr.port);
        free(t->shown);
        free(t->last_error);
    }
    free(pg->targets);
    pg->targets = NULL;
    pg->ntargets = 0;
    free(pg->keys);
    free(pg->values);
    pg->keys = NULL;
    pg->values = NULL;
    if (pg->parsed)
        PQconninfoFree(pg->parsed);
    pg->parsed = NULL;
}

/* Elements in a comma-separated list ("" has one, NULL none). */
static int list_count(const char *list)
{
    if (!list)
        return 0;
    int n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    return n;
}

/* Element i of a list for host i of n: NULL for no list, the whole list when it is not split
 * (split false) or has one element (a single port applies to every host, as in libpq). */
static bool list_item(const char *list, int i, bool split, char **out)
{
    *out = NULL;
    if (!list)
        return true;
    if (!split || list_count(list) == 1) {
        *out = strdup(list);
        return *out != NULL;
    }
    const char *p = list;
    for (; i > 0; i--)
        p = strchr(p, ',') + 1;
    *out = strndup(p, strcspn(p, ","));
    return *out != NULL;
}

int pg_hosts_split(const char *host, const char *hostaddr, const char *port, PgHost **out)
{
    int nhost = list_count(host), naddr = list_count(hostaddr), nport = list_count(port);
    int n = nhost > naddr ? nhost : naddr;
    bool split = n > 1 && (nhost == 0 || nhost == n) && (naddr == 0 || naddr == n) &&
                 (nport <= 1 || nport == n);
    if (!split)
        n = 1;
    *out = calloc((size_t)n, sizeof(PgHost));
    if (!*out)
        return 0;
    for (int i = 0; i < n; i++) {
        PgHost *h = &(*out)[i];
        if (!list_item(host, i, split, &h->host) || !list_item(hostaddr, i, split, &h->hostaddr) ||
            !list_item(port, i, split, &h->port)) {
            pg_hosts_free(*out, n);
            *out = NULL;
            return 0;
        }
    }
    return n;
}

void pg_hosts_free(PgHost *hosts, int n)
{
    for (int i = 0; hosts && i < n; i++) {
        free(hosts[i].host);
        free(hosts[i].hostaddr);
        free(hosts[i].port);
    }
    free(hosts);
}

/* The value the connection string gives a keyword, else the environment's (PGHOST...). */
static const char *option_value(const PQconninfoOption *parsed, const PQconninfoOption *defaults,
                                const char *keyword)
{
    for (const PQconninfoOption *o = parsed; o && o->keyword; o++)
        if (strcmp(o->keyword, keyword) == 0 && o->val)
            return o->val;
    for (const PQconninfoOption *o = defaults; o && o->keyword; o++)
        if (strcmp(o->keyword, keyword) == 0 && o->envvar && o->val && getenv(o->envvar))
            return o->val;
    return NULL;
}

/* Splits the connection string into one target per host, and the parameters every attempt
 * shares, with the relay's keepalive defaults for what the string leaves unset. Lists libpq
 * would reject (counts that do not match) are left whole for libpq to report. False only when
 * out of memory; an unparsable string is left to PQconnectStartParams to report. */
static bool plan_targets(PgConn *pg)
{
    char *why = NULL;
    pg->parsed = PQconninfoParse(pg->conninfo, &why);
    PQfreemem(why);
    PQconninfoOption *defaults = PQconndefaults();
    const char *host = option_value(pg->parsed, defaults, "host");
    const char *hostaddr = option_value(pg->parsed, defaults, "hostaddr");
    const char *port = option_value(pg->parsed, defaults, "port");
    const char *timeout = option_value(pg->parsed, defaults, "connect_timeout");
    PgHost *hosts = NULL;
    int n = pg_hosts_split(host, hostaddr, port, &hosts);
    pg->connect_timeout_s = timeout && atoi(timeout) > 0 ? atoi(timeout) : PG_CONNECT_TIMEOUT_S;
    if (pg->connect_timeout_s < 2)
        pg->connect_timeout_s = 2; /* libpq's minimum */

    size_t nopts = 0;
    for (const PQconninfoOption *o = pg->parsed; o && o->keyword; o++)
        nopts++;
    /* parsed options + 5 keepalive defaults + host, hostaddr, port + terminator */
    pg->keys = calloc(nopts + 9, sizeof(char *));
    pg->values = calloc(nopts + 9, sizeof(char *));
    pg->targets = n > 0 ? calloc((size_t)n, sizeof(PgTarget)) : NULL;
    bool ok = pg->keys && pg->values && pg->targets;
    if (ok && !pg->parsed) {
        /* Unparsable (main.c checks at start-up, so rarely): libpq reports why at every try. */
        pg->keys[pg->nparams] = "dbname";
        pg->values[pg->nparams++] = pg->conninfo;
        pg->expand_dbname = 1;
    }
    for (const PQconninfoOption *o = pg->parsed; ok && o && o->keyword; o++) {
        if (!o->val || strcmp(o->keyword, "host") == 0 || strcmp(o->keyword, "hostaddr") == 0 ||
            strcmp(o->keyword, "port") == 0)
            continue;
        pg->keys[pg->nparams] = o->keyword;
        pg->values[pg->nparams++] = o->val;
    }
    /* Client side of the same bound: a dead server or network is noticed within the session
     * timeout even while the relay waits for nothing (keepalives) or for an acknowledgement of
     * what it sent (tcp_user_timeout). */
    long t = session_timeout_ms;
    static const char *const keepalive_keys[5] = {"keepalives", "keepalives_idle",
                                                  "keepalives_interval", "keepalives_count",
                                                  "tcp_user_timeout"};
    long keepalive_vals[5] = {1, t / 3000 > 0 ? t / 3000 : 1, t / 9000 > 0 ? t / 9000 : 1, 3, t};
    for (int i = 0; ok && i < 5; i++) {
        if (option_value(pg->parsed, NULL, keepalive_keys[i]))
            continue; /* the user's setting wins */
        snprintf(pg->keepalive_values[i], sizeof(pg->keepalive_values[i]), "%ld",
                 keepalive_vals[i]);
        pg->keys[pg->nparams] = keepalive_keys[i];
        pg->values[pg->nparams++] = pg->keepalive_values[i];
    }
    for (int i = 0; ok && i < n; i++) {
        PgTarget *tg = &pg->targets[i];
        tg->addr = hosts[i];
        hosts[i] = (PgHost){NULL, NULL, NULL}; /* moved */
        pg->ntargets = i + 1;
        const char *shown = tg->addr.host && *tg->addr.host ? tg->addr.host
                            : tg->addr.hostaddr             ? tg->addr.hostaddr
                                                            : "(default)";
        const char *shown_port = tg->addr.port ? tg->addr.port : "";
        size_t len = strlen(shown) + strlen(shown_port) + 2;
        tg->shown = malloc(len);
        if (tg->shown)
            snprintf(tg->shown, len, "%s:%s", shown, shown_port);
        ok = tg->shown != NULL;
    }
    pg_hosts_free(hosts, n);
    PQconninfoFree(defaults);
    return ok;
}

void pg_set_session_timeout(long ms)
{
    session_timeout_ms = ms;
}

PgConn *pg_conn_new(struct ev_loop *loop, const char *conninfo, PgStateFn on_state,
                    PgNotifyFn on_notify, void *arg)
{
    return pg_conn_new_named(loop, conninfo, NULL, on_state, on_notify, arg);
}

PgConn *pg_conn_new_named(struct ev_loop *loop, const char *conninfo, const char *name,
                          PgStateFn on_state, PgNotifyFn on_notify, void *arg)
{
    PgConn *pg = calloc(1, sizeof(*pg));
    if (!pg)
        return NULL;
    if (name)
        snprintf(pg->tag, sizeof(pg->tag), "conn=%s ", name);
    pg->loop = loop;
    pg->conninfo = strdup(conninfo);
    if (!pg->conninfo || !plan_targets(pg)) {
        free_targets(pg);
        free(pg->conninfo);
        free(pg);
        return NULL;
    }
    pg->on_state = on_state;
    pg->on_notify = on_notify;
    pg->arg = arg;
    pg->io_fd = -1;
    pg->request_timeout_s = (double)session_timeout_ms / 1000.0;
    backoff_init(&pg->backoff, PG_BACKOFF_BASE_S, PG_BACKOFF_CAP_S, 0);
    ev_init(&pg->io, on_io);
    pg->io.data = pg;
    ev_init(&pg->timer, on_timer);
    pg->timer.data = pg;
    ev_init(&pg->defer, on_defer);
    pg->defer.data = pg;
    ev_init(&pg->quiet, on_quiet);
    pg->quiet.repeat = (double)session_timeout_ms / 3000.0;
    pg->quiet.data = pg;
    ev_init(&pg->deadline, on_deadline);
    pg->deadline.repeat = pg->request_timeout_s;
    pg->deadline.data = pg;
    start_connect(pg);
    return pg;
}

void pg_conn_set_request_timeout(PgConn *pg, double seconds)
{
    pg->request_timeout_s = seconds;
    pg->deadline.repeat = seconds;
    if (ev_is_active(&pg->deadline))
        ev_timer_again(pg->loop, &pg->deadline);
}

void pg_conn_free(PgConn *pg)
{
    if (!pg)
        return;
    close_conn(pg);
    for (int i = 0; i < pg->nresults; i++)
        PQclear(pg->results[i]);
    forget_all_prepared(pg);
    free(pg->error);
    free_targets(pg);
    free(pg->conninfo);
    free(pg);
}

bool pg_conn_up(const PgConn *pg)
{
    return pg->state == PG_UP && !pg->deferred_loss;
}

PGconn *pg_conn_libpq(PgConn *pg)
{
    return pg_conn_up(pg) ? pg->conn : NULL;
}

bool pg_conn_idle(const PgConn *pg)
{
    return pg_conn_up(pg) && !pg->busy;
}

/* The slot of a statement prepared (or being prepared) on this connection, or -1. */
static int find_prepared(const PgConn *pg, const char *sql)
{
    for (int i = 0; i < PG_MAX_PREPARED; i++)
        if (pg->prepared[i].sql && strcmp(pg->prepared[i].sql, sql) == 0)
            return i;
    return -1;
}

/* A free slot for sql, named and ready to send its preparation; -1 when none is left. */
static int claim_prepared_slot(PgConn *pg, const char *sql)
{
    for (int i = 0; i < PG_MAX_PREPARED; i++) {
        Prepared *p = &pg->prepared[i];
        if (p->sql)
            continue;
        p->sql = strdup(sql);
        if (!p->sql)
            return -1;
        snprintf(p->name, sizeof(p->name), "outbox_relay_%lu", ++pg->prepared_count);
        return i;
    }
    return -1;
}

/* Sends one statement of a request: prepared when asked and possible (preparing it first, in
 * the same pipeline, on its first use on this connection), else as it is. */
static bool send_query(PgConn *pg, const PgQuery *q)
{
    int slot = q->prepare ? find_prepared(pg, q->sql) : -1;
    if (q->prepare && slot < 0) {
        slot = claim_prepared_slot(pg, q->sql);
        if (slot >= 0) {
            if (PQsendPrepare(pg->conn, pg->prepared[slot].name, q->sql, q->nparams, NULL) != 1)
                return false;
            pg->expected[pg->nexpected++] = (Expected){true, slot};
        }
    }
    pg->expected[pg->nexpected++] = (Expected){false, slot};
    if (slot >= 0)
        return PQsendQueryPrepared(pg->conn, pg->prepared[slot].name, q->nparams, q->values, NULL,
                                   NULL, 0) == 1;
    return PQsendQueryParams(pg->conn, q->sql, q->nparams, NULL, q->values, NULL, NULL, 0) == 1;
}

/* Sends a request whose statements are already known to fit (both the owner's and the
 * connection's own setup go through here). The caller checked that no request is in flight; a
 * heartbeat may be, and the request then queues behind it. */
static bool send_request(PgConn *pg, const PgQuery *queries, int n, PgResultFn cb, void *arg)
{
    bool was_awaiting = awaiting(pg);
    pg->busy = true;
    pg->cb = cb;
    pg->cb_arg = arg;
    pg->nqueries = n;
    pg->nresults = 0;
    pg->nexpected = 0;
    pg->nreceived = 0;
    bool ok = true;
    for (int i = 0; i < n && ok; i++)
        ok = send_query(pg, &queries[i]);
    if (ok)
        ok = PQpipelineSync(pg->conn) == 1;
    int flushed = ok ? PQflush(pg->conn) : -1;
    if (flushed < 0) {
        /* Report from the loop so the caller never sees its callback run inside this call. */
        pg->deferred_loss = strdup(db_error_line(PQerrorMessage(pg->conn)));
        ev_timer_set(&pg->defer, 0, 0);
        ev_timer_start(pg->loop, &pg->defer);
        return true;
    }
    sent(pg, was_awaiting);
    set_io(pg, PQsocket(pg->conn), flushed ? EV_READ | EV_WRITE : EV_READ);
    return true;
}

static bool send_internal(PgConn *pg, const char *sql, PgResultFn cb)
{
    PgQuery q = {sql, 0, NULL, false};
    return send_request(pg, &q, 1, cb, NULL);
}

bool pg_conn_send(PgConn *pg, const PgQuery *queries, int n, PgResultFn cb, void *arg)
{
    if (!pg_conn_idle(pg) || n < 1 || n > PG_MAX_QUERIES)
        return false;
    return send_request(pg, queries, n, cb, arg);
}

void pg_conn_reset(PgConn *pg, const char *reason)
{
    if (pg->state != PG_DOWN)
        lose(pg, reason);
}
