/* pg_request: a PgConn's requests — statements pipelined with one Sync, prepared on first use,
 * their results read back and handed to the owner's callback (pg.h, pg_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "pg_internal.h"

static void forget_prepared(PgConn *pg, int slot)
{
    free(pg->prepared[slot].sql);
    pg->prepared[slot].sql = NULL;
}

void pg_forget_all_prepared(PgConn *pg)
{
    for (int i = 0; i < PG_MAX_PREPARED; i++)
        forget_prepared(pg, i);
    pg->prepared_count = 0;
}

void pg_drop_prepare_failure(PgConn *pg)
{
    PQclear(pg->prepare_failure);
    pg->prepare_failure = NULL;
}

void pg_fail_request(PgConn *pg, const char *reason)
{
    if (!pg->busy)
        return;
    pg->busy = false;
    pg_drop_prepare_failure(pg);
    for (int i = 0; i < pg->nresults; i++)
        PQclear(pg->results[i]);
    pg->nresults = 0;
    free(pg->error);
    pg->error = NULL;
    pg->cb(pg, NULL, 0, reason, pg->cb_arg);
}

void pg_sent(PgConn *pg, bool was_awaiting)
{
    ev_timer_again(pg->loop, &pg->quiet);
    if (!was_awaiting)
        ev_timer_again(pg->loop, &pg->deadline);
}

/* An answer completed: the next outstanding one (if any) gets a full deadline. */
static void answered(PgConn *pg)
{
    pg->syncs_done++;
    if (pg_awaiting(pg))
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
    pg_drop_prepare_failure(pg);
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

void pg_read_results(PgConn *pg)
{
    int nulls = 0;
    while (pg_linked(pg) && pg_awaiting(pg) && !PQisBusy(pg->conn)) {
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
                pg_lose(pg, reason);
            } else {
                complete_request(pg);
            }
            continue;
        }
        bool failed = st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR;
        const char *state = failed ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
        if (session_unusable(state) && !pg->broken) {
            char reason[560];
            snprintf(reason, sizeof(reason), "%s (SQLSTATE %s)",
                     db_error_line(PQresultErrorMessage(r)), state);
            pg->broken = strdup(reason);
        }
        if (!pg->busy) {
            /* Only a heartbeat's Sync is awaited, and it has no result of its own: this is the
             * server ending the session (an error sent just before it closes, while the Sync was
             * on its way). It belongs to no request: kept as the reason for the loss, never
             * handed to the next request as its error or results. */
            if (failed)
                pg_keep_server_fatal(pg, r);
            PQclear(r);
            continue;
        }
        if (failed && !pg->error)
            pg->error = strdup(db_error_line(PQresultErrorMessage(r)));
        Expected of =
            pg->nreceived < pg->nexpected ? pg->expected[pg->nreceived] : (Expected){false, -1};
        pg->nreceived++;
        if (of.preparing) {
            /* Unless the preparing worked, the statement does not exist on the server. */
            if (st != PGRES_COMMAND_OK)
                forget_prepared(pg, of.slot);
            if (failed && !pg->prepare_failure)
                pg->prepare_failure = r; /* stands in for the statement's aborted result */
            else
                PQclear(r);
            continue;
        }
        if (st == PGRES_PIPELINE_ABORTED && pg->prepare_failure) {
            PQclear(r);
            r = pg->prepare_failure;
            pg->prepare_failure = NULL;
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
    bool was_awaiting = pg_awaiting(pg);
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
    pg_sent(pg, was_awaiting);
    pg_set_io(pg, PQsocket(pg->conn), flushed ? EV_READ | EV_WRITE : EV_READ);
    return true;
}

bool pg_send_internal(PgConn *pg, const char *sql, PgResultFn cb)
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

int pg_first_failed(PGresult *const *results, int n)
{
    for (int i = 0; i < n; i++) {
        ExecStatusType st = results[i] ? PQresultStatus(results[i]) : PGRES_PIPELINE_ABORTED;
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
            return i;
    }
    return n;
}

const char *pg_failed_sqlstate(PGresult *const *results, int n)
{
    int i = pg_first_failed(results, n);
    return i < n && results[i] ? PQresultErrorField(results[i], PG_DIAG_SQLSTATE) : NULL;
}
