/* order: the order resource of producer-demo — request validation and its JSON form.
 *
 * Pure functions, no I/O: the API module calls them before touching the database, so a bad body
 * is rejected without writing anything, and the unit tests cover every rule. */
#ifndef PRODUCER_ORDER_H
#define PRODUCER_ORDER_H

#include <stdbool.h>
#include <stddef.h>

#define ORDER_CUSTOMER_ID_MAX 255
#define ORDER_BODY_MAX 65536 /* bytes accepted in a POST /orders body */

typedef struct OrderInput {
    char customer_id[ORDER_CUSTOMER_ID_MAX + 1];
    long long amount_cents;
    char currency[4];
} OrderInput;

/* Validates a POST /orders body: a JSON object with exactly customer_id (1-255 bytes of text
 * without control characters), amount_cents (an integer > 0) and currency (an ISO 4217 code of
 * a circulating currency, upper case). Returns 0 and fills out when valid; otherwise the HTTP
 * status to answer — 400 when the body is not a JSON object, 422 when a field is missing,
 * unknown, of the wrong type or out of range — with one line in err. */
int order_parse(const char *body, size_t len, OrderInput *out, char *err, size_t errlen);

/* True for the ISO 4217 code of a circulating currency ("EUR", "USD", ...). */
bool order_currency_known(const char *code);

/* The order as the API shows it and the outbox carries it: a compact JSON object with id,
 * customer_id, amount_cents, currency, status, version and created_at, in that order. The
 * version is the one the response's ETag names and OrderCreated/OrderUpdated events carry, so
 * a consumer can tell a newer state from an older one. Returns a malloc'd string, NULL when out
 * of memory. */
char *order_json(const char *id, const char *customer_id, long long amount_cents,
                 const char *currency, const char *status, long long version,
                 const char *created_at);

#define ORDER_STATUS_MAX 16

/* A PATCH /orders/{id} body (JSON merge patch of the amendable fields). */
typedef struct OrderPatch {
    bool has_amount;
    long long amount_cents;
    bool has_status;
    char status[ORDER_STATUS_MAX];
} OrderPatch;

/* Validates a PATCH body: a JSON object with at least one of amount_cents (an integer > 0) and
 * status (one of "created", "confirmed", "cancelled"), and nothing else. Returns 0 and fills out
 * when valid; otherwise 400 (not a JSON object) or 422 (empty, unknown field, wrong type or
 * value), with one line in err. A null value is refused (422): no field may be removed. */
int order_patch_parse(const char *body, size_t len, OrderPatch *out, char *err, size_t errlen);

/* Whether an order in status from may be patched to the state p describes. The life cycle is
 * created -> confirmed -> cancelled, or created -> cancelled; cancelled is final (no field of a
 * cancelled order changes any more) and a status never goes back. Setting a status to the one
 * the order has is allowed (a merge patch may repeat a field). On refusal writes one line to
 * err; the API answers 409. */
bool order_patch_allowed(const char *from, const OrderPatch *p, char *err, size_t errlen);

/* Parses an If-Match header value: exactly one strong entity tag "N" with N a version (a
 * decimal integer 1..2^31-1). Returns the version, or 0 when the value is anything else (a
 * weak tag, "*", a list, garbage); the API answers 400 then. */
long long order_if_match(const char *value);

/* True when s is a UUID in canonical text form (8-4-4-4-12 hex digits), the form order ids take. */
bool order_id_valid(const char *s);

#endif
