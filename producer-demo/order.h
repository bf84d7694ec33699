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

/* An If-Match header value (RFC 9110 section 13.1.1): "*" or a comma-separated list of entity
 * tags. Several If-Match header lines are one list (RFC 9110 section 5.3): the caller joins them
 * with ", " before parsing. */
typedef struct OrderIfMatch {
    bool any;          /* "*": matches any current version of an existing order */
    bool weak;         /* the list holds a weak tag (W/"..."), which never matches */
    const char *value; /* the header value (the caller's, must outlive this) */
} OrderIfMatch;

/* Parses an If-Match value: "*" alone, or one or more entity tags ("3", W/"3", "x"), separated
 * by commas with optional spaces or tabs around them (empty list elements are skipped, as RFC
 * 9110 section 5.6.1 asks). Returns false when the value is neither (no tag at all, an unquoted
 * or unterminated tag, "*" inside a list, a byte an entity tag cannot hold); the API answers 400
 * then. A well-formed tag that names no version ("0", "01", "abc", a weak tag) is valid: it just
 * never matches (412). */
bool order_if_match_parse(const char *value, OrderIfMatch *out);

/* Whether the parsed If-Match matches an order at version: "*" does, and so does a list holding
 * the strong tag "<version>" (strong comparison: byte for byte, weak tags never match). */
bool order_if_match_matches(const OrderIfMatch *m, long long version);

/* The parsed If-Match in one canonical form, for the idempotency fingerprint: "*", a lone strong
 * tag of digits as those digits (3 for "3", as the fingerprint has always written it), anything
 * else as its tags joined by ",". Two values that differ only in spaces or empty elements give
 * the same form. out needs strlen(m->value) + 1 bytes (the form is never longer); returns false
 * when outlen is smaller. */
bool order_if_match_canon(const OrderIfMatch *m, char *out, size_t outlen);

/* True when s is a UUID in canonical text form (8-4-4-4-12 hex digits), the form order ids take. */
bool order_id_valid(const char *s);

#endif
