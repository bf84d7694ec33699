/* api: what producer-demo's endpoints do, independent of the HTTP library.
 *
 *   POST /orders        create an order; requires an Idempotency-Key (see idem.h)
 *   GET  /orders/{id}   the order, or 404
 *   GET  /healthz       200 when PostgreSQL answers, else 503
 *
 * Each handler fills an ApiResponse; server.c turns it into HTTP. Errors are RFC 9457 problem
 * documents ({"type","title","status","detail"}, application/problem+json) with a one-line
 * detail. Handlers block on PostgreSQL and are called from the server's connection threads. */
#ifndef PRODUCER_API_H
#define PRODUCER_API_H

#include <stdbool.h>
#include <stddef.h>

#include "pool.h"

typedef struct Api {
    DbPool *pool;
    long key_ttl_s;   /* how long an Idempotency-Key record is kept */
    int pool_wait_ms; /* how long a request waits for a free database connection */
} Api;

typedef struct ApiResponse {
    int status;
    char *body; /* malloc'd */
    const char *content_type;
    char location[64]; /* "" when none */
    int retry_after;   /* seconds; 0 when none */
    bool replayed;     /* a stored response, sent with Idempotency-Replayed: true */
    const char *allow; /* the Allow header of a 405, else NULL */
} ApiResponse;

/* POST /orders. key_header is the Idempotency-Key value (NULL when absent) and key_count how
 * many such headers came. The body is read as JSON whatever its Content-Type says (clients such
 * as curl -d label JSON as a form by default). */
void api_create_order(Api *api, const char *key_header, int key_count, const char *body,
                      size_t body_len, ApiResponse *r);

/* GET /orders/{id}. */
void api_get_order(Api *api, const char *id, ApiResponse *r);

/* GET /healthz. */
void api_health(Api *api, ApiResponse *r);

/* Fills r with a problem document for status, with detail as its one-line explanation. */
void api_problem(ApiResponse *r, int status, const char *detail);

void api_response_free(ApiResponse *r);

#endif
