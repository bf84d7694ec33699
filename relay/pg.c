#include "pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "log.h"

#define PG_MAX_QUERIES 8
/* Distinct statements a connection prepares; beyond that, statements are sent unprepared. */
#define PG_MAX_PREPARED 8
#define PG_CONNECT_TIMEOUT_S 10.0
#define PG_BACKOFF_BASE_S 0.2
#define PG_BACKOFF_CAP_S 10.0

typedef enum { PG_DOWN, PG_CONNECTING, PG_UP } PgState;

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
    bool ever_up;     /* for "connected" vs "reconnected" in the log */
    bool down_logged; /* the current outage was logged once; retries go to debug */
    ev_io io;
    int io_fd, io_events;
    ev_timer timer; /* connect timeout while connecting, reconnect delay while down */
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

const char *pg_error_line(const char *message)
{
    static _Thread_local char line[512];
    if (!message || !*message)
        return "unknown error";
    size_t n = strcspn(message, "\n");
    if (n >= sizeof(line))
        n = sizeof(line) - 1;
    memcpy(line, message, n);
    line[n] = '\0';
    return line;
}

static void set_io(PgConn *pg, int fd, int events)
{
    if (pg->io_fd == fd && pg->io_events == events && ev_is_active(&pg->io))
        return;
    ev_io_stop(pg->loop, &pg->io);
    pg->io_fd = fd;
    pg->io_events = events;
    if (fd >= 0 && events) {
        ev_io_set(&pg->io, fd, events);
        ev_io_start(pg->loop, &pg->io);
    }
}

static void start_connect(PgConn *pg);

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
    log_debug("postgres notice", "notice=%s", log_quote(pg_error_line(message), q, sizeof(q)));
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

/* The connection is gone (or never came up): close it, fail the request, schedule a retry. */
static void lose(PgConn *pg, const char *why)
{
    char reason[512];
    snprintf(reason, sizeof(reason), "%s", pg_error_line(why));
    bool was_up = pg->state == PG_UP;

    set_io(pg, -1, 0);
    ev_timer_stop(pg->loop, &pg->timer);
    ev_timer_stop(pg->loop, &pg->defer);
    free(pg->deferred_loss);
    pg->deferred_loss = NULL;
    if (pg->conn)
        PQfinish(pg->conn);
    pg->conn = NULL;
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

static void connected(PgConn *pg)
{
    ev_timer_stop(pg->loop, &pg->timer);
    if (PQsetnonblocking(pg->conn, 1) != 0 || PQenterPipelineMode(pg->conn) != 1) {
        lose(pg, PQerrorMessage(pg->conn));
        return;
    }
    PQsetNoticeProcessor(pg->conn, notice_to_log, NULL);
    pg->state = PG_UP;
    backoff_reset(&pg->backoff);
    if (!pg->ever_up || pg->down_logged)
        log_info(pg->ever_up ? "postgres reconnected" : "postgres connected", "%sserver_version=%d",
                 pg->tag, PQserverVersion(pg->conn));
    pg->ever_up = true;
    pg->down_logged = false;
    set_io(pg, PQsocket(pg->conn), EV_READ);
    pg->on_state(pg, true, NULL, pg->arg);
}

static void connect_step(PgConn *pg)
{
    switch (PQconnectPoll(pg->conn)) {
    case PGRES_POLLING_READING:
        /* libpq may switch sockets between attempts (several hosts, SSL retry): re-read it. */
        set_io(pg, PQsocket(pg->conn), EV_READ);
        break;
    case PGRES_POLLING_WRITING:
        set_io(pg, PQsocket(pg->conn), EV_WRITE);
        break;
    case PGRES_POLLING_OK:
        connected(pg);
        break;
    default:
        lose(pg, PQerrorMessage(pg->conn));
        break;
    }
}

static void start_connect(PgConn *pg)
{
    pg->conn = PQconnectStart(pg->conninfo);
    if (!pg->conn || PQstatus(pg->conn) == CONNECTION_BAD) {
        lose(pg, pg->conn ? PQerrorMessage(pg->conn) : "out of memory");
        return;
    }
    pg->state = PG_CONNECTING;
    ev_timer_set(&pg->timer, PG_CONNECT_TIMEOUT_S, 0);
    ev_timer_start(pg->loop, &pg->timer);
    /* PQconnectStart leaves the first step as "writing" (the TCP connect in progress). */
    set_io(pg, PQsocket(pg->conn), EV_WRITE);
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
    cb(pg, results, n, error, cb_arg);
    for (int i = 0; i < n; i++)
        PQclear(results[i]);
    free(error);
}

static void read_results(PgConn *pg)
{
    int nulls = 0;
    while (pg->state == PG_UP && pg->busy && !PQisBusy(pg->conn)) {
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
            complete_request(pg);
            continue;
        }
        bool failed = st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR;
        if (failed && !pg->error)
            pg->error = strdup(pg_error_line(PQresultErrorMessage(r)));
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
            const char *state = failed ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
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

static void on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    PgConn *pg = w->data;
    if (pg->state == PG_CONNECTING) {
        connect_step(pg);
        return;
    }
    if (pg->state != PG_UP)
        return;
    if (revents & EV_READ) {
        if (!PQconsumeInput(pg->conn) || PQstatus(pg->conn) == CONNECTION_BAD) {
            lose(pg, PQerrorMessage(pg->conn));
            return;
        }
        read_notifies(pg);
        read_results(pg);
        /* Reading results may have parsed notifications that came with them: hand them out now,
         * not whenever the socket next has data. */
        read_notifies(pg);
    }
    if (pg->state == PG_UP && (pg->io_events & EV_WRITE))
        flush_output(pg);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    if (pg->state == PG_CONNECTING)
        lose(pg, "connection attempt timed out");
    else if (pg->state == PG_DOWN)
        start_connect(pg);
}

static void on_defer(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    char reason[512];
    snprintf(reason, sizeof(reason), "%s", pg->deferred_loss ? pg->deferred_loss : "send failed");
    lose(pg, reason);
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
    pg->on_state = on_state;
    pg->on_notify = on_notify;
    pg->arg = arg;
    pg->io_fd = -1;
    backoff_init(&pg->backoff, PG_BACKOFF_BASE_S, PG_BACKOFF_CAP_S, 0);
    ev_init(&pg->io, on_io);
    pg->io.data = pg;
    ev_init(&pg->timer, on_timer);
    pg->timer.data = pg;
    ev_init(&pg->defer, on_defer);
    pg->defer.data = pg;
    start_connect(pg);
    return pg;
}

void pg_conn_free(PgConn *pg)
{
    if (!pg)
        return;
    set_io(pg, -1, 0);
    ev_timer_stop(pg->loop, &pg->timer);
    ev_timer_stop(pg->loop, &pg->defer);
    for (int i = 0; i < pg->nresults; i++)
        PQclear(pg->results[i]);
    if (pg->conn)
        PQfinish(pg->conn);
    forget_all_prepared(pg);
    free(pg->deferred_loss);
    free(pg->error);
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

bool pg_conn_send(PgConn *pg, const PgQuery *queries, int n, PgResultFn cb, void *arg)
{
    if (!pg_conn_idle(pg) || n < 1 || n > PG_MAX_QUERIES)
        return false;
    pg->busy = true;
    pg->cb = cb;
    pg->cb_arg = arg;
    pg->nqueries = n;
    pg->nresults = 0;
    pg->nexpected = 0;
    pg->nreceived = 0;
    bool sent = true;
    for (int i = 0; i < n && sent; i++)
        sent = send_query(pg, &queries[i]);
    if (sent)
        sent = PQpipelineSync(pg->conn) == 1;
    int flushed = sent ? PQflush(pg->conn) : -1;
    if (flushed < 0) {
        /* Report from the loop so the caller never sees its callback run inside this call. */
        pg->deferred_loss = strdup(pg_error_line(PQerrorMessage(pg->conn)));
        ev_timer_set(&pg->defer, 0, 0);
        ev_timer_start(pg->loop, &pg->defer);
        return true;
    }
    set_io(pg, PQsocket(pg->conn), flushed ? EV_READ | EV_WRITE : EV_READ);
    return true;
}

void pg_conn_reset(PgConn *pg, const char *reason)
{
    if (pg->state != PG_DOWN)
        lose(pg, reason);
}
