#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How often a statement that waits for the server looks at the stop flag. */
#define STOP_CHECK_MS 100

/* consumer-demo's bounds on waiting for PostgreSQL
 * (docs/demos.md#consumer-demo-the-shipping-service). A lock held by someone else (an operator's
 * open UPDATE of a shipment, a member that has not yet noticed it lost the partition) fails the
 * statement after LOCK_TIMEOUT with 55P03, and anything else that stalls an apply statement fails
 * it after STATEMENT_TIMEOUT with 57014: both are outages, retried with backoff (consumer.c), so a
 * stuck wait shows in the log instead of holding the loop silently. lock_timeout is the session's
 * (the schema's ALTER TABLEs at start-up wait for locks too); statement_timeout only the apply
 * transaction's, since the schema's CREATE INDEX on a large table may rightly take long. A
 * connection string that sets a stricter (non-zero, smaller) value keeps its own. */
#define LOCK_TIMEOUT "5s"
#define STATEMENT_TIMEOUT "10s"

/* Opens the apply transaction with its statement_timeout, in the BEGIN's round trip. */
static const char begin_sql[] =
    "BEGIN; " DB_BOUND_SETTING_SQL("statement_timeout", STATEMENT_TIMEOUT, "true");

bool store_prepare_session(PGconn *conn, DbError *e)
{
    PGresult *res =
        db_query(conn, DB_BOUND_SETTING_SQL("lock_timeout", LOCK_TIMEOUT, "false"), 0, NULL, e);
    PQclear(res);
    return res != NULL;
}

/* db_query, except that it stops waiting for the server as soon as *stop is set: a statement
 * that waits for a lock (up to LOCK_TIMEOUT) must not hold up a SIGTERM. Returns the result when
 * the statement succeeded (the caller PQclears it); NULL with e filled when it failed, or with
 * *stopped set when it was left running: the connection is then still busy with it and must be
 * closed, never used again (closing it ends the transaction uncommitted; the server finds out at
 * the latest when the statement's own timeout ends the wait). */
static PGresult *query_bin_until_stop(PGconn *conn, const char *sql, int nparams,
                                      const char *const *values, const int *lengths,
                                      const int *formats, const volatile sig_atomic_t *stop,
                                      bool *stopped, DbError *e)
{
    *stopped = false;
    if (!PQsendQueryParams(conn, sql, nparams, NULL, values, lengths, formats, 0))
        return db_result(conn, NULL, e);
    while (PQisBusy(conn)) {
        struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLIN};
        if (pfd.fd < 0)
            break; /* no connection any more: PQgetResult reports it */
        int n = poll(&pfd, 1, STOP_CHECK_MS);
        if (n > 0) {
            if (!PQconsumeInput(conn))
                break; /* the connection broke: PQgetResult reports it */
            continue;
        }
        if (n < 0 && errno != EINTR) {
            *e = (DbError){.conn_lost = true};
            snprintf(e->message, sizeof(e->message), "poll: %s", strerror(errno));
            return NULL;
        }
        if (*stop) { /* no answer yet, and asked to stop (the signal may have cut the poll) */
            *stopped = true;
            *e = (DbError){.conn_lost = true};
            snprintf(e->message, sizeof(e->message), "stopped while waiting for the server");
            return NULL;
        }
    }
    PGresult *res = PQgetResult(conn);
    for (PGresult *more; (more = PQgetResult(conn)) != NULL;)
        PQclear(more);
    return db_result(conn, res, e);
}

/* query_bin_until_stop with every parameter as text. */
static PGresult *query_until_stop(PGconn *conn, const char *sql, int nparams,
                                  const char *const *values, const volatile sig_atomic_t *stop,
                                  bool *stopped, DbError *e)
{
    return query_bin_until_stop(conn, sql, nparams, values, NULL, NULL, stop, stopped, e);
}

/* The dedupe, in the statement's one round trip: inserts the id with its payload digest and
 * returns one row, (true, NULL) when it went in, or (false, the applied copy's digest in hex or
 * NULL) when the id was there. All parts of the statement share one snapshot, so a row that
 * another member committed while this insert waited for it (two members applying one event
 * during a rebalance) conflicts but is not seen: no row then, and applied_digest looks again. */
static const char record_sql[] =
    "WITH ins AS (INSERT INTO processed_events (event_id, topic, \"partition\", \"offset\","
    " expires_at, payload_sha256)"
    " VALUES ($1, $2, $3, $4, now() + $5 * interval '1 second', decode($6, 'hex'))"
    " ON CONFLICT (event_id) DO NOTHING RETURNING 1)"
    " SELECT true, NULL FROM ins"
    " UNION ALL SELECT false, encode(payload_sha256, 'hex') FROM processed_events"
    " WHERE event_id = $1 AND NOT EXISTS (SELECT FROM ins)";

/* The digest recorded for event_id, read by a statement of its own (a fresh snapshot), for
 * record_sql's race above. Into out: the hex digest, "" when unknown (NULL, or the row is gone:
 * swept since). Returns false when the query failed or was stopped (like query_until_stop). */
static bool applied_digest(PGconn *conn, const char *event_id, char out[65],
                           const volatile sig_atomic_t *stop, bool *stopped, DbError *e)
{
    const char *v[1] = {event_id};
    PGresult *res = query_until_stop(conn,
                                     "SELECT encode(payload_sha256, 'hex') FROM processed_events"
                                     " WHERE event_id = $1",
                                     1, v, stop, stopped, e);
    if (!res)
        return false;
    snprintf(out, 65, "%s", PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : "");
    PQclear(res);
    return true;
}

StoreResult store_apply(PGconn *conn, const OrderEvent *ev, const MessagePos *pos, long ttl_s,
                        const volatile sig_atomic_t *stop, char applied_sha256[65], DbError *e)
{
    char partition[16], offset[32], amount[32], version[32], ttl[32];
    snprintf(ttl, sizeof(ttl), "%ld", ttl_s);
    snprintf(partition, sizeof(partition), "%" PRId32, pos->partition);
    snprintf(offset, sizeof(offset), "%" PRId64, pos->offset);
    snprintf(amount, sizeof(amount), "%lld", ev->amount_cents);
    snprintf(version, sizeof(version), "%lld", ev->version);

    PGresult *res = db_run_script(conn, begin_sql, e);
    PQclear(res);
    if (!res)
        goto failed; /* a SET that failed leaves the transaction open (aborted) */
    bool stopped;
    const char *pv[6] = {ev->event_id, pos->topic, partition, offset, ttl, ev->payload_sha256};
    res = query_until_stop(conn, record_sql, 6, pv, stop, &stopped, e);
    if (stopped)
        return STORE_STOPPED;
    if (!res)
        goto failed;
    bool first_time = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
    char applied[65] = "";
    if (!first_time && PQntuples(res) == 1)
        snprintf(applied, sizeof(applied), "%s", PQgetvalue(res, 0, 1)); /* "" for NULL */
    bool look_again = PQntuples(res) == 0;
    PQclear(res);
    if (look_again && !applied_digest(conn, ev->event_id, applied, stop, &stopped, e)) {
        if (stopped)
            return STORE_STOPPED;
        goto failed;
    }
    if (!first_time) {
        db_rollback(conn);
        /* Unknown (a row from before digests were kept) is not a conflict: nothing says the
         * payloads differ. */
        if (applied[0] == '\0' || strcmp(applied, ev->payload_sha256) == 0)
            return STORE_DUPLICATE;
        snprintf(applied_sha256, 65, "%s", applied);
        return STORE_CONFLICT;
    }
    /* The version comparison happens under the row lock the upsert takes, so two consumers
     * racing on one order (a rebalance) still end at the highest version. A cancelled order
     * cancels its shipment. */
    const char *sv[7] = {ev->order_id, ev->event_id, ev->customer_id, amount,
                         ev->currency, ev->status,   version};
    res = query_until_stop(
        conn,
        "INSERT INTO shipments (order_id, event_id, customer_id, amount_cents, currency,"
        " order_status, order_version, last_event_id, status)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $2,"
        " CASE WHEN $6 = 'cancelled' THEN 'cancelled' ELSE 'pending' END)"
        " ON CONFLICT (order_id) DO UPDATE SET customer_id = EXCLUDED.customer_id,"
        " amount_cents = EXCLUDED.amount_cents, currency = EXCLUDED.currency,"
        " order_status = EXCLUDED.order_status, order_version = EXCLUDED.order_version,"
        " last_event_id = EXCLUDED.last_event_id, updated_at = now(),"
        " status = CASE WHEN EXCLUDED.order_status = 'cancelled' THEN 'cancelled'"
        " ELSE shipments.status END"
        " WHERE shipments.order_version < EXCLUDED.order_version"
        " RETURNING 1",
        7, sv, stop, &stopped, e);
    if (stopped)
        return STORE_STOPPED;
    if (!res)
        goto failed;
    bool changed = PQntuples(res) == 1;
    PQclear(res);
    /* A stale event still commits its processed_events row: it is dealt with, and its
     * redelivery is then a plain duplicate. */
    if (!db_exec(conn, "COMMIT", e))
        goto failed;
    return changed ? STORE_APPLIED : STORE_STALE;
failed:
    db_rollback(conn);
    return STORE_FAILED;
}

bool store_park(PGconn *conn, const ParkedMessage *m, const volatile sig_atomic_t *stop,
                bool *stopped, DbError *e)
{
    *stopped = false;
    char partition[16], offset[32];
    snprintf(partition, sizeof(partition), "%" PRId32, m->pos.partition);
    snprintf(offset, sizeof(offset), "%" PRId64, m->pos.offset);
    /* Key and payload are arbitrary bytes: sent as binary bytea, never as text. */
    const char *values[7] = {m->pos.topic,    partition,  offset,   m->key,
                             m->headers_json, m->payload, m->reason};
    const int lengths[7] = {0, 0, 0, (int)m->key_len, 0, (int)m->payload_len, 0};
    const int formats[7] = {0, 0, 0, 1, 0, 1, 0};
    /* In a transaction of its own for begin_sql's statement_timeout, like the apply: outside it
     * an INSERT that stalled (a slow disk, a trigger) held the loop and SIGTERM without limit. */
    PGresult *res = db_run_script(conn, begin_sql, e);
    PQclear(res);
    if (!res)
        goto failed;
    res = query_bin_until_stop(conn,
                               "INSERT INTO parked_messages (topic, \"partition\", \"offset\","
                               " key, headers, payload, reason)"
                               " VALUES ($1, $2, $3, $4::bytea, $5, $6::bytea, $7)"
                               " ON CONFLICT (topic, \"partition\", \"offset\") DO NOTHING",
                               7, values, lengths, formats, stop, stopped, e);
    if (*stopped)
        return false;
    if (!res)
        goto failed;
    PQclear(res);
    if (db_exec(conn, "COMMIT", e))
        return true;
failed:
    db_rollback(conn);
    return false;
}

long store_sweep(PGconn *conn, long batch, const volatile sig_atomic_t *stop, bool *stopped,
                 DbError *e)
{
    *stopped = false;
    char limit[32];
    snprintf(limit, sizeof(limit), "%ld", batch);
    const char *v[1] = {limit};
    /* In a transaction of its own for begin_sql's statement_timeout: FOR UPDATE SKIP LOCKED
     * never waits for a row, and lock_timeout bounds a wait for the table, but nothing else
     * bounded a DELETE that stalls (a slow disk, a trigger), and the loop waited in it. */
    PGresult *res = db_run_script(conn, begin_sql, e);
    PQclear(res);
    if (!res)
        goto failed;
    res = query_until_stop(conn,
                           "DELETE FROM processed_events WHERE event_id IN ("
                           " SELECT event_id FROM processed_events WHERE expires_at <= now()"
                           " ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)",
                           1, v, stop, stopped, e);
    if (*stopped)
        return -1;
    if (!res)
        goto failed;
    long n = atol(PQcmdTuples(res));
    PQclear(res);
    if (!db_exec(conn, "COMMIT", e))
        goto failed;
    return n;
failed:
    db_rollback(conn);
    return -1;
}
