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
 * customer_id, amount_cents, currency, status and created_at, in that order. Returns a malloc'd
 * string, NULL when out of memory. */
char *order_json(const char *id, const char *customer_id, long long amount_cents,
                 const char *currency, const char *status, const char *created_at);

/* True when s is a UUID in canonical text form (8-4-4-4-12 hex digits), the form order ids take. */
bool order_id_valid(const char *s);

#endif
