#include "api.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "idem.h"
#include "log.h"
#include "order.h"

#define ENDPOINT_CREATE "POST /orders"
#define RETRY_AFTER_BUSY 1        /* seconds: a claimed key is usually done within one */
#define RETRY_AFTER_UNAVAILABLE 2 /* seconds: PostgreSQL is down or every connection busy */

/* Timestamps in the API: UTC, microseconds, as PostgreSQL stores them. */
#define CREATED_AT_SQL "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

static const char *status_title(int status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 413:
        return "Content Too Large";
    case 422:
        return "Unprocessable Content";
    case 503:
        return "Service Unavailable";
    default:
        return "Internal Server Error";
    }
}

void api_problem(ApiResponse *r, int status, const char *detail)
{
    free(r->body);
    r->status = status;
    r->content_type = "application/problem+json";
    json_t *o = json_pack("{s:s, s:s, s:i, s:s}", "type", "about:blank", "title",
                          status_title(status), "status", status, "detail", detail);
    r->body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!r->body) /* detail was not UTF-8, or no memory: still answer */
        r->body = strdup("{\"type\":\"about:blank\",\"title\":\"Internal Server Error\"}");
}

static void set_json(ApiResponse *r, int status, char *body)
{
    r->status = status;
    r->content_type = "application/json";
    r->body = body;
    if (!body)
        api_problem(r, 500, "out of memory");
}

void api_response_free(ApiResponse *r)
{
    free(r->body);
    r->body = NULL;
}

/* Maps a database failure to a response: 503 when PostgreSQL is unreachable (retry later), 500
 * for anything else. Returns true when the connection must be dropped. */
static bool db_failed(ApiResponse *r, const char *step, const DbError *e)
{
    char q[400];
    if (e->conn_lost) {
        log_warn("database connection lost", "step=%s error=%s", step,
                 log_quote(db_error_text(e), q, sizeof(q)));
        api_problem(r, 503, "the database is unavailable; retry later");
        r->retry_after = RETRY_AFTER_UNAVAILABLE;
        return true;
    }
    log_error("database error", "step=%s error=%s", step,
              log_quote(db_error_text(e), q, sizeof(q)));
    api_problem(r, 500, "internal error");
    return false;
}

/* Takes a connection and opens a transaction. A pooled connection may have died while idle
 * (PostgreSQL restarted): nothing has happened yet, so one retry on a fresh connection is safe. */
static PGconn *begin(Api *api, ApiResponse *r)
{
    char err[300];
    for (int attempt = 0; attempt < 2; attempt++) {
        PGconn *conn = pool_acquire(api->pool, api->pool_wait_ms, err, sizeof(err));
        if (!conn)
            break; /* the pool logged why */
        DbError e;
        if (db_exec(conn, "BEGIN", &e))
            return conn;
        pool_release(api->pool, conn, true);
        if (!e.conn_lost) {
            db_failed(r, "begin", &e);
            return NULL;
        }
    }
    api_problem(r, 503, "the database is unavailable; retry later");
    r->retry_after = RETRY_AFTER_UNAVAILABLE;
    return NULL;
}

/* Writes the order, its outbox event and the key's response; returns false with r filled on a
 * database error (the caller rolls back). */
static bool insert_order(PGconn *conn, const IdemRequest *req, const OrderInput *in, ApiResponse *r,
                         bool *broken)
{
    DbError e;
    char amount[32];
    snprintf(amount, sizeof(amount), "%lld", in->amount_cents);
    const char *ov[3] = {in->customer_id, amount, in->currency};
    PGresult *res = db_query(conn,
                             "INSERT INTO orders (customer_id, amount_cents, currency)"
                             " VALUES ($1, $2, $3) RETURNING id, status, " CREATED_AT_SQL,
                             3, ov, &e);
    if (!res) {
        *broken = db_failed(r, "insert order", &e);
        return false;
    }
    char *json = order_json(PQgetvalue(res, 0, 0), in->customer_id, in->amount_cents, in->currency,
                            PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2));
    snprintf(r->location, sizeof(r->location), "/orders/%s", PQgetvalue(res, 0, 0));
    const char *xv[2] = {PQgetvalue(res, 0, 0), json};
    bool ok = false;
    if (!json) {
        api_problem(r, 500, "out of memory");
        goto done;
    }
    /* The event is the order itself: consumers need no call back to this service. */
    PGresult *xres =
        db_query(conn,
                 "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)"
                 " VALUES ('order', $1, 'OrderCreated', $2::jsonb)",
                 2, xv, &e);
    if (!xres) {
        *broken = db_failed(r, "insert outbox", &e);
        goto done;
    }
    PQclear(xres);
    if (!idem_complete(conn, req, 201, json, r->location, &e)) {
        *broken = db_failed(r, "store response", &e);
        goto done;
    }
    set_json(r, 201, json);
    json = NULL;
    ok = true;
done:
    free(json);
    PQclear(res);
    return ok;
}

void api_create_order(Api *api, const char *key_header, int key_count, const char *body,
                      size_t body_len, ApiResponse *r)
{
    char key[IDEM_KEY_MAX + 1], err[300];
    if (key_count == 0 || !key_header) {
        api_problem(r, 400, "the Idempotency-Key header is required");
        return;
    }
    if (key_count > 1) {
        api_problem(r, 400, "send exactly one Idempotency-Key header");
        return;
    }
    if (!idem_key_parse(key_header, key, err, sizeof(err))) {
        api_problem(r, 400, err);
        return;
    }
    OrderInput in;
    int invalid = order_parse(body, body_len, &in, err, sizeof(err));
    if (invalid) {
        api_problem(r, invalid, err);
        return;
    }

    PGconn *conn = begin(api, r);
    if (!conn)
        return;
    IdemRequest req = {ENDPOINT_CREATE, key, "POST", "/orders", body, body_len, api->key_ttl_s};
    IdemStored stored;
    DbError e;
    bool broken = false, commit = false;
    switch (idem_claim(conn, &req, &stored, &e)) {
    case IDEM_NEW:
        commit = insert_order(conn, &req, &in, r, &broken);
        break;
    case IDEM_REPLAY:
        r->replayed = true;
        r->status = stored.status;
        r->content_type = "application/json";
        r->body = stored.body;
        stored.body = NULL;
        snprintf(r->location, sizeof(r->location), "%s", stored.location ? stored.location : "");
        idem_stored_free(&stored);
        break;
    case IDEM_MISMATCH:
        api_problem(r, 422, "this Idempotency-Key was already used with a different request");
        break;
    case IDEM_BUSY:
        api_problem(r, 409, "a request with this Idempotency-Key is still being processed");
        r->retry_after = RETRY_AFTER_BUSY;
        break;
    case IDEM_FAILED:
        broken = db_failed(r, "claim key", &e);
        break;
    }
    if (commit && !db_exec(conn, "COMMIT", &e)) {
        /* Whether a lost COMMIT took effect is unknown; the client's retry with the same key
         * finds out (replay if it did, a fresh attempt if not). */
        api_response_free(r);
        *r = (ApiResponse){0};
        broken = db_failed(r, "commit", &e);
    }
    if (!commit && !broken)
        db_rollback(conn);
    pool_release(api->pool, conn, broken);
}

void api_get_order(Api *api, const char *id, ApiResponse *r)
{
    if (!order_id_valid(id)) {
        api_problem(r, 404, "no such order");
        return;
    }
    char err[300];
    PGconn *conn = pool_acquire(api->pool, api->pool_wait_ms, err, sizeof(err));
    if (!conn) {
        api_problem(r, 503, "the database is unavailable; retry later");
        r->retry_after = RETRY_AFTER_UNAVAILABLE;
        return;
    }
    DbError e;
    const char *values[1] = {id};
    PGresult *res =
        db_query(conn,
                 "SELECT id, customer_id, amount_cents, currency, status, " CREATED_AT_SQL
                 " FROM orders WHERE id = $1",
                 1, values, &e);
    bool broken = false;
    if (!res)
        broken = db_failed(r, "get order", &e);
    else if (PQntuples(res) == 0)
        api_problem(r, 404, "no such order");
    else
        set_json(r, 200,
                 order_json(PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1),
                            atoll(PQgetvalue(res, 0, 2)), PQgetvalue(res, 0, 3),
                            PQgetvalue(res, 0, 4), PQgetvalue(res, 0, 5)));
    PQclear(res);
    pool_release(api->pool, conn, broken);
}

void api_health(Api *api, ApiResponse *r)
{
    char err[300];
    PGconn *conn = pool_acquire(api->pool, api->pool_wait_ms, err, sizeof(err));
    DbError e;
    bool ok = conn && db_exec(conn, "SELECT 1", &e);
    if (conn)
        pool_release(api->pool, conn, !ok);
    if (ok)
        set_json(r, 200, strdup("{\"status\":\"ok\"}"));
    else
        api_problem(r, 503, "the database is unavailable");
}
