/* event: what one Kafka message means to consumer-demo.
 *
 * Pure functions over the message's parts, so every way a message can be unusable is covered by
 * unit tests. The relay's contract (docs/integration.md): the `id` header is the event's UUID (the
 * dedupe key), `event_type` names the event, the value is the payload as JSON. */
#ifndef CONSUMER_EVENT_H
#define CONSUMER_EVENT_H

#include <stdbool.h>
#include <stddef.h>

#define EVENT_TEXT_MAX 255

typedef enum {
    EVENT_APPLY,     /* an OrderCreated or OrderUpdated event: ship the order, or update it */
    EVENT_IGNORE,    /* a well-formed event of another type: nothing to do */
    EVENT_MALFORMED, /* unusable: logged, counted and parked, never retried */
} EventVerdict;

/* A message's parts; a pointer is NULL when the header or value is absent. */
typedef struct EventInput {
    const char *id;
    size_t id_len;
    const char *type;
    size_t type_len;
    const char *payload;
    size_t payload_len;
    /* What a pointer alone cannot say: the header came with no value (id NULL then), or came
     * more than once with different values (id is the last one). */
    bool id_null, id_differs;
    bool type_null, type_differs;
} EventInput;

/* An order's state as OrderCreated and OrderUpdated carry it: both events carry the whole order,
 * so either can be applied on its own; version orders them. */
typedef struct OrderEvent {
    char event_id[37]; /* lower-case canonical UUID */
    bool updated;      /* OrderUpdated (else OrderCreated) */
    char order_id[EVENT_TEXT_MAX + 1];
    char customer_id[EVENT_TEXT_MAX + 1];
    long long amount_cents;
    char currency[4];
    char status[EVENT_TEXT_MAX + 1]; /* the order's status; "created" when OrderCreated has none */
    long long version;               /* 1..2^31-1; 1 when OrderCreated has none */
    /* SHA-256 of the message's value as it came (its raw bytes, not the parsed JSON), in
     * lower-case hex: a redelivery carries the same bytes, so another digest under the same
     * event id means a producer reused the id for other content (a conflict, store.h). */
    char payload_sha256[65];
} OrderEvent;

/* Classifies a message. EVENT_APPLY fills out. EVENT_MALFORMED when the id header is missing,
 * has no value, comes twice with different values or is not a UUID, event_type is missing, has no
 * value or comes twice with different values, or an OrderCreated/OrderUpdated payload is not a
 * JSON object (an object with a name twice is not) with id, customer_id (non-empty strings of at
 * most 255 bytes), amount_cents (an integer > 0), currency (three upper-case letters), and for
 * OrderUpdated also version (an integer 1..2^31-1) and status (like customer_id); OrderCreated may
 * carry version and status too (checked the same way when present). Other fields are allowed, so
 * producers can add some. reason gets one line of printable ASCII for EVENT_IGNORE and
 * EVENT_MALFORMED. */
EventVerdict event_parse(const EventInput *in, OrderEvent *out, char *reason, size_t reasonlen);

/* True when text[0..len) is a UUID in canonical 8-4-4-4-12 form; writes it lower-cased to
 * out[37]. */
bool event_uuid(const char *text, size_t len, char out[37]);

#endif
