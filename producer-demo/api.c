#include "api.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "idem.h"
#include "fastpath.h"
#include "log.h"
#include "order.h"
#include "utf8.h"

#define ENDPOINT_CREATE "POST /orders"
#define ENDPOINT_UPDATE "PATCH /orders/{id}"
#define RETRY_AFTER_BUSY 1        /* seconds: a claimed key is usually done within one */
#define RETRY_AFTER_UNAVAILABLE 2 /* seconds: PostgreSQL is down or every connection busy */
#define RETRY_AFTER_TIMEOUT 2     /* seconds: a statement ran into --lock/--statement-timeout */

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
    case 412:
        return "Precondition Failed";
    case 428:
        return "Precondition Required";
    case 413:
        return "Content Too Large";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Content";
    case 501:
        return "Not Implemented";
    case 503:
        return "Service Unavailable";
    default:
        return "Internal Server Error";
    }
}

/* A copy of s in which every byte that does not belong to a valid UTF-8 sequence is '?'
 * (jansson refuses strings that are not UTF-8); NULL when out of memory. */
static char *utf8_or_question_marks(const char *s)
{
    char *out = strdup(s);
    for (char *p = out; p && *p;) {
        int32_t cp;
        size_t n = utf8_decode(p, &cp);
        if (cp < 0)
            *p = '?';
        p += n;
    }
    return out;
}

bool api_session_sql(long lock_timeout_ms, long statement_timeout_ms, char *out, size_t outlen)
{
    int n =
        snprintf(out, outlen,
                 DB_BOUND_SETTING_SQL("lock_timeout", "%ldms", "false") "; " DB_BOUND_SETTING_SQL(
                     "statement_timeout", "%ldms", "false"),
                 lock_timeout_ms, lock_timeout_ms, statement_timeout_ms, statement_timeout_ms);
    return n > 0 && (size_t)n < outlen;
}

void api_problem(ApiResponse *r, int status, const char *detail)
{
    free(r->body);
    r->status = status;
    r->content_type = "application/problem+json";
    char *text = utf8_or_question_marks(detail);
    json_t *o = text ? json_pack("{s:s, s:s, s:i, s:s}", "type", "about:blank", "title",
                                 status_title(status), "status", status, "detail", text)
                     : NULL;
    r->body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    free(text);
    if (!r->body) { /* no memory: still answer, with the same status and title */
        char body[128];
        snprintf(body, sizeof(body), "{\"type\":\"about:blank\",\"title\":\"%s\",\"status\":%d}",
                 status_title(status), status);
        r->body = strdup(body);
    }
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
/* The answers for a key used with another request (422) and for one whose request is still
 * running (409 with Retry-After), from whichever path found it so. */
static void answer_key_mismatch(ApiResponse *r)
{
    api_problem(r, 422, "this Idempotency-Key was already used with a different request");
}

static void answer_key_busy(ApiResponse *r)
{
    api_problem(r, 409, "a request with this Idempotency-Key is still being processed");
    r->retry_after = RETRY_AFTER_BUSY;
}

static bool db_failed(ApiResponse *r, const char *step, const DbError *e)
{
    char q[400];
    /* A wait cut by the session's bounds (api_session_sql): the transaction is rolled back by
     * the caller, which frees the Idempotency-Key it claimed, and the connection stays good. */
    if (!e->conn_lost && (strcmp(e->sqlstate, "55P03") == 0 || strcmp(e->sqlstate, "57014") == 0)) {
        log_warn("database wait timed out", "step=%s error=%s", step,
                 log_quote(db_error_text(e), q, sizeof(q)));
        api_problem(r, 503,
                    "the database did not answer in time (a lock or statement timeout); retry "
                    "later with the same Idempotency-Key");
        r->retry_after = RETRY_AFTER_TIMEOUT;
        return false;
    }
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

static void answer_unavailable(ApiResponse *r)
{
    api_problem(r, 503, "the database is unavailable; retry later");
    r->retry_after = RETRY_AFTER_UNAVAILABLE;
}

/* Whether a read that failed with e on its attempt-th pooled connection (0 first) is to run once
 * more on a fresh one. A pooled connection may have died while idle (PostgreSQL restarted, an
 * idle session killed): its first statement is where that shows, and a read that failed so
 * changed nothing. Without the retry every connection left from before a restart would cost
 * one client a 503 (a load balancer's /healthz included) although PostgreSQL is up. */
static bool read_again(const DbError *e, int attempt)
{
    return e->conn_lost && attempt == 0;
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

static void set_etag(ApiResponse *r, const char *version)
{
    snprintf(r->etag, sizeof(r->etag), "\"%s\"", version);
}

/* The work one idempotent request does inside its transaction. Returns true when the
 * transaction is to be committed (r holds the response to store with the key); false with r
 * filled otherwise (rolled back: the key stays free, a retry runs again), *broken when the
 * connection must be dropped. */
typedef bool (*Work)(PGconn *conn, const IdemRequest *req, void *arg, ApiResponse *r, bool *broken);

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void replay(ApiResponse *r, IdemStored *stored)
{
    r->replayed = true;
    r->status = stored->status;
    r->content_type = "application/json";
    r->body = stored->body;
    stored->body = NULL;
    snprintf(r->location, sizeof(r->location), "%s", stored->location ? stored->location : "");
    snprintf(r->etag, sizeof(r->etag), "%s", stored->etag ? stored->etag : "");
    idem_stored_free(stored);
}

/* A duplicate found Redis's in-progress guard taken. Before answering 409, PostgreSQL is asked
 * (one SELECT, no transaction): a request that finished has its record there, whatever became of
 * the guard (a late SET NX reply, Redis dropping before the release), and is replayed; only a
 * key without a committed record is still in progress. */
static void busy_or_replay(Api *api, const IdemRequest *req, const char *fp, ApiResponse *r)
{
    char err[300];
    PGconn *conn;
    double asked_at;
    IdemStored stored;
    DbError e;
    IdemOutcome found;
    for (int attempt = 0;; attempt++) {
        conn = pool_acquire(api->pool, api->pool_wait_ms, err, sizeof(err));
        if (!conn) {
            answer_unavailable(r);
            return;
        }
        asked_at = mono_ms();
        found = idem_lookup(conn, req, &stored, &e);
        if (found != IDEM_FAILED || !read_again(&e, attempt))
            break;
        pool_release(api->pool, conn, true);
    }
    bool broken = false;
    switch (found) {
    case IDEM_REPLAY: {
        long long cache_ms = stored.left_ms - (long long)(mono_ms() - asked_at);
        replay(r, &stored);
        if (cache_ms > api->cache_ttl_ms)
            cache_ms = api->cache_ttl_ms;
        fastpath_store(api->redis, req, fp, r->status, r->body, r->location, r->etag, cache_ms,
                       false);
        break;
    }
    case IDEM_MISMATCH:
        answer_key_mismatch(r);
        break;
    case IDEM_NEW:
    case IDEM_BUSY:
        answer_key_busy(r);
        break;
    case IDEM_FAILED:
        broken = db_failed(r, "look key up", &e);
        break;
    }
    pool_release(api->pool, conn, broken);
}

/* Runs work under req's Idempotency-Key (req NULL: no key, work runs in a plain transaction).
 *
 * With Redis configured, a cached response answers first (fingerprint checked), and a guard
 * turns concurrent duplicates away early (after checking PostgreSQL's record: busy_or_replay);
 * both are shortcuts around the same decisions that idem_claim makes in PostgreSQL, which still
 * runs for everything not answered from the cache. */
static void run_idempotent(Api *api, const IdemRequest *req, Work work, void *arg, ApiResponse *r)
{
    char fp[65] = "", token[33] = "";
    bool guarded = false; /* Redis holds (or may hold) our guard: release it at the end */
    if (req && api->redis) {
        idem_fingerprint(req, fp);
        IdemStored cached;
        switch (fastpath_lookup(api->redis, req, fp, &cached)) {
        case FAST_HIT:
            api->redis_hits++;
            replay(r, &cached);
            r->from_redis = true;
            return;
        case FAST_MISMATCH:
            api->redis_hits++;
            answer_key_mismatch(r);
            r->from_redis = true;
            return;
        case FAST_MISS:
            api->redis_misses++;
            break;
        }
        if (api->guard_ms > 0) {
            switch (fastpath_guard(api->redis, req, api->guard_ms, token)) {
            case GUARD_BUSY:
                /* Redis is a hint: the guard may be one whose release was lost. */
                busy_or_replay(api, req, fp, r);
                return;
            case GUARD_TAKEN:
            case GUARD_UNKNOWN: /* the reply came late: Redis may hold it all the same */
                guarded = true;
                break;
            case GUARD_UNAVAILABLE:
                break;
            }
        }
    }

    PGconn *conn = begin(api, r);
    if (!conn)
        goto out;
    double claimed_at = mono_ms();
    IdemStored stored;
    DbError e;
    bool broken = false, commit = false, cache = false;
    long long cache_ms = 0;
    switch (req ? idem_claim(conn, req, &stored, &e) : IDEM_NEW) {
    case IDEM_NEW:
        commit = work(conn, req, arg, r, &broken);
        if (!commit)
            r->location[0] = '\0'; /* rolled back: the order it named does not exist */
        break;
    case IDEM_REPLAY:
        /* Answered by PostgreSQL: worth caching for the retries that may follow, for what the
         * record had left when the SELECT ran (after claimed_at) minus the time since. */
        cache = true;
        cache_ms = stored.left_ms;
        replay(r, &stored);
        break;
    case IDEM_MISMATCH:
        answer_key_mismatch(r);
        break;
    case IDEM_BUSY:
        answer_key_busy(r);
        break;
    case IDEM_FAILED:
        broken = db_failed(r, "claim key", &e);
        break;
    }
    if (commit) {
        if (db_exec(conn, "COMMIT", &e)) {
            /* The record expires key_ttl_s after its INSERT, which ran after claimed_at: a
             * cache entry that lives key_ttl_s from claimed_at never outlives it. */
            cache = true;
            cache_ms = (long long)((double)api->key_ttl_s * 1e3 - (mono_ms() - claimed_at));
        } else {
            /* Whether a lost COMMIT took effect is unknown; the client's retry with the same
             * key finds out (replay if it did, a fresh attempt if not). */
            api_response_free(r);
            *r = (ApiResponse){0};
            broken = db_failed(r, "commit", &e);
        }
    }
    if (!commit && !broken)
        db_rollback(conn);
    pool_release(api->pool, conn, broken);
    if (cache && req && api->redis) {
        if (!commit)
            cache_ms -= (long long)(mono_ms() - claimed_at);
        if (cache_ms > api->cache_ttl_ms)
            cache_ms = api->cache_ttl_ms;
        /* Forced when Redis may hold our guard: the cached answer is what lets a retry in the
         * guard's lifetime be answered without PostgreSQL. */
        fastpath_store(api->redis, req, fp, r->status, r->body, r->location, r->etag, cache_ms,
                       guarded);
    }
out:
    if (guarded)
        fastpath_release(api->redis, req, token);
}

/* Writes the order, its outbox event and the key's response; returns false with r filled on a
 * database error (the caller rolls back). */
static bool insert_order(PGconn *conn, const IdemRequest *req, void *arg, ApiResponse *r,
                         bool *broken)
{
    const OrderInput *in = arg;
    DbError e;
    char amount[32];
    snprintf(amount, sizeof(amount), "%lld", in->amount_cents);
    const char *ov[3] = {in->customer_id, amount, in->currency};
    PGresult *res = db_query(conn,
                             "INSERT INTO orders (customer_id, amount_cents, currency)"
                             " VALUES ($1, $2, $3) RETURNING id, status, version, " CREATED_AT_SQL,
                             3, ov, &e);
    if (!res) {
        *broken = db_failed(r, "insert order", &e);
        return false;
    }
    char *json =
        order_json(PQgetvalue(res, 0, 0), in->customer_id, in->amount_cents, in->currency,
                   PQgetvalue(res, 0, 1), atoll(PQgetvalue(res, 0, 2)), PQgetvalue(res, 0, 3));
    snprintf(r->location, sizeof(r->location), "/orders/%s", PQgetvalue(res, 0, 0));
    set_etag(r, PQgetvalue(res, 0, 2));
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
    if (!idem_complete(conn, req, 201, json, r->location, r->etag, &e)) {
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

/* Parses the Idempotency-Key header(s). Returns false with r filled (400) on bad input; *has is
 * false when no key was sent and that is allowed. */
static bool parse_key(const char *key_header, int key_count, bool required, char *key, bool *has,
                      ApiResponse *r)
{
    char err[300];
    *has = false;
    if (key_count == 0 || !key_header) {
        if (required)
            api_problem(r, 400, "the Idempotency-Key header is required");
        return !required;
    }
    if (key_count > 1) {
        api_problem(r, 400, "send exactly one Idempotency-Key header");
        return false;
    }
    if (!idem_key_parse(key_header, key, err, sizeof(err))) {
        api_problem(r, 400, err);
        return false;
    }
    *has = true;
    return true;
}

void api_create_order(Api *api, const char *key_header, int key_count, const char *body,
                      size_t body_len, ApiResponse *r)
{
    char key[IDEM_KEY_MAX + 1], err[300];
    bool has_key;
    if (!parse_key(key_header, key_count, true, key, &has_key, r))
        return;
    OrderInput in;
    int invalid = order_parse(body, body_len, &in, err, sizeof(err));
    if (invalid) {
        api_problem(r, invalid, err);
        return;
    }
    IdemRequest req = {ENDPOINT_CREATE, key, "POST", "/orders", body, body_len, api->key_ttl_s};
    run_idempotent(api, &req, insert_order, &in, r);
}

typedef struct PatchArgs {
    const char *id;
    OrderIfMatch if_match;
    OrderPatch patch;
} PatchArgs;

/* The If-Match check and the update, under the order's row lock. */
static bool update_order(PGconn *conn, const IdemRequest *req, void *arg, ApiResponse *r,
                         bool *broken)
{
    const PatchArgs *a = arg;
    DbError e;
    char err[300];
    /* Concurrent PATCHes of one order queue on its row lock, each held for a few statements;
     * the session's lock_timeout (--lock-timeout, api_session_sql) turns a lock held by
     * something else (an operator's open transaction) into a 409 instead of a request that
     * hangs. */
    const char *iv[1] = {a->id};
    PGresult *res =
        db_query(conn, "SELECT status, version FROM orders WHERE id = $1 FOR UPDATE", 1, iv, &e);
    if (!res) {
        if (strcmp(e.sqlstate, "55P03") == 0) {
            api_problem(r, 409, "the order is locked by another change; retry");
            r->retry_after = RETRY_AFTER_BUSY;
        } else {
            *broken = db_failed(r, "lock order", &e);
        }
        return false;
    }
    bool ok = false;
    if (PQntuples(res) == 0) {
        api_problem(r, 404, "no such order");
        goto done;
    }
    /* The version is compared under the lock: of N requests based on one version, the first to
     * get the lock changes it and every later one sees the new version (412). */
    if (!order_if_match_matches(&a->if_match, atoll(PQgetvalue(res, 0, 1)))) {
        set_etag(r, PQgetvalue(res, 0, 1));
        api_problem(r, 412,
                    a->if_match.weak
                        ? "no entity tag in If-Match is the order's current version (a weak "
                          "tag, W/\"...\", never matches: If-Match compares strongly); GET it "
                          "(or use this response's ETag) and decide again"
                        : "the order changed since the version in If-Match; GET it (or use "
                          "this response's ETag) and decide again");
        goto done;
    }
    if (!order_patch_allowed(PQgetvalue(res, 0, 0), &a->patch, err, sizeof(err))) {
        set_etag(r, PQgetvalue(res, 0, 1));
        api_problem(r, 409, err);
        goto done;
    }
    PQclear(res);
    char amount[32];
    snprintf(amount, sizeof(amount), "%lld", a->patch.amount_cents);
    const char *uv[3] = {a->id, a->patch.has_amount ? amount : NULL,
                         a->patch.has_status ? a->patch.status : NULL};
    res = db_query(conn,
                   "UPDATE orders SET amount_cents = coalesce($2::bigint, amount_cents),"
                   " status = coalesce($3, status), version = version + 1, updated_at = now()"
                   " WHERE id = $1 RETURNING id, customer_id, amount_cents, currency, status,"
                   " version, " CREATED_AT_SQL,
                   3, uv, &e);
    if (!res) {
        *broken = db_failed(r, "update order", &e);
        return false;
    }
    char *json =
        order_json(PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1), atoll(PQgetvalue(res, 0, 2)),
                   PQgetvalue(res, 0, 3), PQgetvalue(res, 0, 4), atoll(PQgetvalue(res, 0, 5)),
                   PQgetvalue(res, 0, 6));
    if (!json) {
        api_problem(r, 500, "out of memory");
        goto done;
    }
    set_etag(r, PQgetvalue(res, 0, 5));
    /* The event carries the whole new state and its version, so a consumer can apply it
     * without a call back and tell a newer state from a stale or repeated one. */
    const char *xv[2] = {PQgetvalue(res, 0, 0), json};
    PGresult *xres =
        db_query(conn,
                 "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)"
                 " VALUES ('order', $1, 'OrderUpdated', $2::jsonb)",
                 2, xv, &e);
    if (!xres) {
        *broken = db_failed(r, "insert outbox", &e);
        free(json);
        goto done;
    }
    PQclear(xres);
    if (req && !idem_complete(conn, req, 200, json, NULL, r->etag, &e)) {
        *broken = db_failed(r, "store response", &e);
        free(json);
        goto done;
    }
    set_json(r, 200, json);
    ok = true;
done:
    PQclear(res);
    return ok;
}

void api_update_order(Api *api, const char *id, const char *if_match, const char *key_header,
                      int key_count, const char *body, size_t body_len, ApiResponse *r)
{
    char key[IDEM_KEY_MAX + 1], err[300];
    bool has_key;
    if (!order_id_valid(id)) {
        api_problem(r, 404, "no such order");
        return;
    }
    if (!parse_key(key_header, key_count, false, key, &has_key, r))
        return;
    if (!if_match) {
        api_problem(r, 428,
                    "PATCH needs If-Match: \"<version>\", the ETag of the order the change is "
                    "based on");
        return;
    }
    PatchArgs a = {id, {0}, {0}};
    if (!order_if_match_parse(if_match, &a.if_match)) {
        api_problem(r, 400,
                    "If-Match must be * or a comma-separated list of ETags, like \"3\" or "
                    "\"3\", \"4\"");
        return;
    }
    int invalid = order_patch_parse(body, body_len, &a.patch, err, sizeof(err));
    if (invalid) {
        api_problem(r, invalid, err);
        return;
    }
    if (!has_key) {
        run_idempotent(api, NULL, update_order, &a, r);
        return;
    }
    /* The fingerprint covers the If-Match value too: the same key with another base version is
     * another request (422), not a retry. */
    /* The id as the database reads it (a uuid: case does not matter), so a retry that writes
     * the id in other case is the same request, not another one (422). */
    char path[64];
    int plen = snprintf(path, sizeof(path), "/orders/%s", id);
    for (int i = plen - 36; i < plen; i++)
        path[i] = (char)tolower((unsigned char)path[i]);
    size_t mlen = strlen(if_match) + 1, flen = body_len + mlen + 16;
    char *canon = malloc(mlen), *fbody = malloc(flen);
    if (!canon || !fbody || !order_if_match_canon(&a.if_match, canon, mlen)) {
        free(canon);
        free(fbody);
        api_problem(r, 500, "out of memory");
        return;
    }
    int head = snprintf(fbody, flen, "If-Match: %s\n", canon);
    free(canon);
    memcpy(fbody + head, body, body_len);
    IdemRequest req = {ENDPOINT_UPDATE,         key,           "PATCH", path, fbody,
                       (size_t)head + body_len, api->key_ttl_s};
    run_idempotent(api, &req, update_order, &a, r);
    free(fbody);
}

void api_get_order(Api *api, const char *id, ApiResponse *r)
{
    if (!order_id_valid(id)) {
        api_problem(r, 404, "no such order");
        return;
    }
    char err[300];
    PGconn *conn;
    DbError e;
    const char *values[1] = {id};
    PGresult *res;
    for (int attempt = 0;; attempt++) {
        conn = pool_acquire(api->pool, api->pool_wait_ms, err, sizeof(err));
        if (!conn) {
            answer_unavailable(r);
            return;
        }
        res = db_query(conn,
                       "SELECT id, customer_id, amount_cents, currency, status,"
                       " version, " CREATED_AT_SQL " FROM orders WHERE id = $1",
                       1, values, &e);
        if (res || !read_again(&e, attempt))
            break;
        pool_release(api->pool, conn, true);
    }
    bool broken = false;
    if (!res)
        broken = db_failed(r, "get order", &e);
    else if (PQntuples(res) == 0)
        api_problem(r, 404, "no such order");
    else {
        set_etag(r, PQgetvalue(res, 0, 5));
        set_json(r, 200,
                 order_json(PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1),
                            atoll(PQgetvalue(res, 0, 2)), PQgetvalue(res, 0, 3),
                            PQgetvalue(res, 0, 4), atoll(PQgetvalue(res, 0, 5)),
                            PQgetvalue(res, 0, 6)));
    }
    PQclear(res);
    pool_release(api->pool, conn, broken);
}

void api_health(Api *api, ApiResponse *r)
{
    char err[300];
    bool ok = false;
    for (int attempt = 0;; attempt++) {
        PGconn *conn = pool_acquire(api->pool, api->pool_wait_ms, err, sizeof(err));
        if (!conn)
            break;
        DbError e;
        ok = db_exec(conn, "SELECT 1", &e);
        pool_release(api->pool, conn, !ok);
        if (ok || !read_again(&e, attempt))
            break;
    }
    if (ok && api->redis) {
        RCacheStats st = rcache_stats(api->redis);
        json_t *o = json_pack("{s:s, s:{s:b, s:I, s:I, s:I, s:I, s:I, s:I}}", "status", "ok",
                              "redis", "up", st.up, "hits", (json_int_t)api->redis_hits, "misses",
                              (json_int_t)api->redis_misses, "calls", (json_int_t)st.calls,
                              "failures", (json_int_t)st.failures, "skipped",
                              (json_int_t)st.skipped, "outages", (json_int_t)st.outages);
        set_json(r, 200, o ? json_dumps(o, JSON_COMPACT) : NULL);
        json_decref(o);
    } else if (ok)
        set_json(r, 200, strdup("{\"status\":\"ok\"}"));
    else
        api_problem(r, 503, "the database is unavailable");
}
