/* api: what producer-demo's endpoints do, independent of the HTTP library.
 *
 *   POST  /orders        create an order; requires an Idempotency-Key (see idem.h)
 *   GET   /orders/{id}   the order, or 404; ETag: "<version>"
 *   PATCH /orders/{id}   change amount_cents and/or status; requires If-Match: "<version>"
 *                        (optimistic locking; "*" or a list, as RFC 9110 has it); honours
 *                        an Idempotency-Key when one is sent
 *   GET   /healthz       200 when PostgreSQL answers, else 503 (Redis is optional: not checked)
 *
 * Each handler fills an ApiResponse; server.c turns it into HTTP. Errors are RFC 9457 problem
 * documents ({"type","title","status","detail"}, application/problem+json) with a one-line
 * detail. Handlers block on PostgreSQL and are called from the server's connection threads. */
#ifndef PRODUCER_API_H
#define PRODUCER_API_H

#include <stdbool.h>
#include <stddef.h>

#include "pool.h"
#include "rcache.h"

typedef struct Api {
    DbPool *pool;
    long key_ttl_s;         /* how long an Idempotency-Key record is kept */
    int pool_wait_ms;       /* how long a request waits for a free database connection */
    RCache *redis;          /* the fast path (fastpath.h), or NULL */
    long guard_ms;          /* Redis in-progress guard lifetime; 0 = no guard */
    long long cache_ttl_ms; /* cap on a cached response's lifetime in Redis */
    _Atomic long redis_hits, redis_misses; /* cache lookups answered / not answered */
} Api;

typedef struct ApiResponse {
    int status;
    char *body; /* malloc'd */
    const char *content_type;
    char location[64]; /* "" when none */
    int retry_after;   /* seconds; 0 when none */
    bool replayed;     /* a stored response, sent with Idempotency-Replayed: true */
    bool from_redis;   /* answered from the Redis fast path, without PostgreSQL */
    const char *allow; /* the Allow header of a 405, else NULL */
    char etag[24];     /* "\"<version>\"" of the order the response shows (or, on 412, has now) */
    bool close;        /* close the connection after this response (Connection: close) */
} ApiResponse;

/* POST /orders. key_header is the Idempotency-Key value (NULL when absent) and key_count how
 * many such headers came. The body is read as JSON whatever its Content-Type says (clients such
 * as curl -d label JSON as a form by default). */
void api_create_order(Api *api, const char *key_header, int key_count, const char *body,
                      size_t body_len, ApiResponse *r);

/* PATCH /orders/{id}. if_match is the If-Match value, several header lines joined with ", "
 * (NULL when absent: 428; not "*" or a list of entity tags: 400); key_header and
 * key_count as for POST, except that the key is optional here (0 headers: no key). A match
 * updates the order, bumps its version and writes an OrderUpdated outbox event with the new
 * state, in one transaction: 200 with the order and its new ETag ("*" matches any version, a
 * list when one strong tag names the current version). No match gets 412 with
 * the current ETag, an unknown order 404, a forbidden status change 409. With a key, a retry of
 * a PATCH that succeeded replays its response instead of answering 412. */
void api_update_order(Api *api, const char *id, const char *if_match, const char *key_header,
                      int key_count, const char *body, size_t body_len, ApiResponse *r);

/* GET /orders/{id}. */
void api_get_order(Api *api, const char *id, ApiResponse *r);

/* GET /healthz. With Redis configured the body also shows its state and counters
 * ({"redis":{"up","hits","misses","calls","failures","skipped","outages"}}); Redis being down
 * does not make the service unhealthy, it only makes retries slower. */
void api_health(Api *api, ApiResponse *r);

/* Writes to out the SQL that bounds a pooled session's waits (run on every new connection,
 * pool_new's setup_sql): lock_timeout and statement_timeout, in milliseconds, unless the
 * connection string set a stricter non-zero value. Every statement of every handler then waits
 * for a lock at most lock_timeout_ms (55P03) and runs at most statement_timeout_ms (57014);
 * either is answered 503 + Retry-After with a problem document, after the transaction rolled
 * back (a claimed Idempotency-Key with it, so a retry with the same key runs again), except for
 * PATCH's wait for the order's row lock, which is 409 + Retry-After. False when out is too
 * small. */
bool api_session_sql(long lock_timeout_ms, long statement_timeout_ms, char *out, size_t outlen)
    __attribute__((warn_unused_result));

/* Fills r with a problem document for status, with detail as its one-line explanation. */
void api_problem(ApiResponse *r, int status, const char *detail);

void api_response_free(ApiResponse *r);

#endif
