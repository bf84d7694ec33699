/* serializer: the message value in a Schema Registry format (--value-format avro | json-schema).
 *
 * A payload (JSON text, as the claim returns it) is encoded by the schema the registry holds for
 * the message's subject, in Confluent's wire format: byte 0, the schema id as 4 bytes big-endian,
 * then the Avro binary encoding or the JSON text. The subject follows --subject-name-strategy:
 * topic (TopicNameStrategy, "<topic>-value"), record ("<event type>") or topic-record
 * ("<topic>-<event type>"): the relay has no record of its own, so the row's event type names it.
 * A subject longer than 599 characters is the row's fault (cut short, it would be another), and
 * so is an empty one (an empty event type with record).
 * The version is the latest (as Confluent's serializers with use.latest.version) or the one
 * pinned by --schema-version, fetched once per subject and kept.
 *
 * Avro: avro-c parses the schema and writes the binary encoding (avro_value_write); the JSON
 * payload is walked into an avro value by its schema (avro-c has no JSON decoder). A union takes
 * the branch an Avro-JSON wrapper {"type": value} names (a named type by its full name,
 * "ns.Name", or by its short name when no other branch has it), else the first branch the JSON
 * value fits, its own kind first (an integer in an int's range, then a long, then a double; a
 * decimal only a number or numeric string it holds exactly, at its scale and precision); an
 * object that more than one record or map branch could take needs the wrapper (else the row is
 * refused as ambiguous), and so does a one-key object that is both a wrapper and a map or record
 * of the union as it is ({"string": "x"} with a map of strings: refused, not guessed). int and long
 * take whole-number reals (100.0) in range; a float refuses a number beyond its range (it would be
 * Infinity). A decimal (logicalType on bytes or fixed, read from the schema's text: avro-c drops
 * it) takes a JSON number or numeric string and is written as Avro's two's-complement unscaled
 * integer; more fractional digits than its scale or more digits than its precision are refused.
 * Other logical types (date, time-*, timestamp-*, uuid, duration) are their underlying type,
 * written from the JSON value as it is: a timestamp is a JSON integer (a date's text is refused,
 * never parsed), a uuid any string (not checked as a UUID), a duration a fixed 12's string. A
 * record field missing from the payload is its default when the schema gives one (a union's
 * first branch, or the first the default fits; bytes as Avro's JSON encoding has them), else null
 * when its type allows null, a fault otherwise; payload fields the schema lacks are ignored (as
 * Confluent's JavaScript serializer does). A value whose encoding would be over the producer's
 * message.max.bytes, or that would take avro-c over 16 times that to build, is the row's fault,
 * refused before it is built past the bound (defaults and fixeds can make it many times its
 * payload); a schema whose value alone takes avro-c more (a fixed of 1 GB) cannot be used.
 *
 * JSON Schema: the payload is checked against type, properties, required, additionalProperties,
 * items, enum and const (others are not checked) and sent as it is; an integer beyond 64 bits is
 * checked as a real, and a payload with a key given twice is refused (a consumer may read the
 * value the check did not).
 *
 * One serializer per relay, on the loop's thread. */
#ifndef OUTBOX_SERIALIZER_H
#define OUTBOX_SERIALIZER_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "registry.h"

typedef struct Serializer Serializer;

typedef enum {
    SERIALIZER_OK,          /* *out holds the value (malloc'd, the caller's) */
    SERIALIZER_ROW_FAULT,   /* the payload does not fit its schema: err names the field and the
                             * schema id; retrying cannot help (a rejection) */
    SERIALIZER_RETRY_LATER, /* no schema for the subject yet (the registry says so), or memory
                             * ran out: a failure of the row that a later try may not have
                             * (counted, not dead-lettered) */
    SERIALIZER_WAIT,        /* the schema is being fetched: ask again after the ready callback */
    SERIALIZER_UNAVAILABLE, /* the registry is down (backoff): the ready callback says when to ask
                             * again; nobody's row's fault */
} SerializerOutcome;

/* Called on the loop when an encode that answered WAIT or UNAVAILABLE may succeed now. */
typedef void (*SerializerReadyFn)(void *arg);

/* A serializer for cfg's --value-format (NULL with err empty for json: values go as they are).
 * Returns NULL with one line in err on bad configuration (unreadable auth file, ...). */
Serializer *serializer_new(struct ev_loop *loop, const Config *cfg, SerializerReadyFn ready,
                           void *arg, char *err, size_t errlen);
void serializer_free(Serializer *s);

/* Encodes payload (payload_len bytes of JSON text; need not be NUL-terminated) for topic, the
 * record name being the row's event type. On SERIALIZER_OK, *out (malloc'd) and *out_len hold the
 * value; otherwise err says why. Never blocks. */
SerializerOutcome serializer_encode(Serializer *s, const char *topic, const char *record,
                                    const char *payload, size_t payload_len, char **out,
                                    size_t *out_len, char *err, size_t errlen);

/* The encoding itself, by a schema already at hand (serializer_encode after the registry
 * answered; the unit tests, without a registry): parses rs->text on first use into rs->parsed
 * (release it with serializer_schema_release), then encodes as serializer_encode does. subject
 * is for the errors. max_len bounds an Avro value, its wire header included (serializer_encode
 * gives the producer's message.max.bytes): a value that would be larger (a payload's empty
 * records filled with the schema's defaults can be many times the payload) is a row fault,
 * refused before it is built much past the bound. Returns SERIALIZER_OK, SERIALIZER_ROW_FAULT, or
 * SERIALIZER_RETRY_LATER when the schema itself cannot be used (wrong type, not parsable) or memory
 * ran out ("out of memory": never the payload's fault). */
SerializerOutcome serializer_encode_schema(ValueFormat format, RegistrySchema *rs,
                                           const char *subject, const char *payload,
                                           size_t payload_len, size_t max_len, char **out,
                                           size_t *out_len, char *err, size_t errlen);
void serializer_schema_release(RegistrySchema *rs);

/* For tests: the slots looked at, since start, by the walks that find which reals of a payload
 * were written with more digits than a double keeps. A payload's walk looks at a bounded number
 * per number (not per number already found): tests check that it grows with the payload's size,
 * not with its square. Not thread-safe (the serializer runs on the loop). */
size_t serializer_walk_probes(void);

/* For tests: the schema nodes looked at, since start, to size what avro-c holds for an array's
 * items or a map's values (the Avro bound, serializer_encode_schema's max_len): once per item
 * schema for the schema's life, not once per array nor once per row. Not thread-safe (the
 * serializer runs on the loop). */
size_t serializer_inline_steps(void);

/* For tests: the steps taken, since start, to find a field's default or a decimal's precision
 * and scale among a schema's: a binary search each, so a record of n defaulted fields takes about
 * n log n, not n x n. Not thread-safe (the serializer runs on the loop). */
size_t serializer_schema_probes(void);

/* For tests: the comparisons, since start, of two numbers by their text (JSON Schema's const and
 * enum): only numbers of the same double are compared so, so an enum of n numbers costs a number
 * of a payload n comparisons of doubles and at most one of text. Not thread-safe (the serializer
 * runs on the loop). */
size_t serializer_token_compares(void);

/* For tests: the comparisons, since start, of a payload value with a JSON Schema enum's members
 * (schema_equal): an enum's members are indexed by a hash of their value once per schema, so a
 * value is compared with those of its hash alone (about one), not with all n. Not thread-safe
 * (the serializer runs on the loop). */
size_t serializer_enum_compares(void);

/* For tests: put_union's looks, since start, at a branch or a branch's name to find the one an
 * Avro-JSON wrapper names, the branches a one-key object could be as it is, and the first that
 * takes an unwrapped value: a union's branches are indexed by name (and its enums by symbol) the
 * first time a row meets it, so a value costs about log n looks, not n. Not thread-safe (the
 * serializer runs on the loop). */
size_t serializer_union_probes(void);

/* False while the registry is down (for /readyz and the metric). */
bool serializer_up(const Serializer *s);

/* The registry's start-up check (registry_probe): false with one line in err when it refuses the
 * credentials or answers with a redirect alone (never followed); a registry not answering, or
 * answering 404 as no registry does, or 403 on /subjects alone (listing refused), or a URL passed
 * over for a later one that answered, only logs a warning, whose text goes to warned (if given; ""
 * when the registry answered without one). Blocks up to the request timeout: call it before the
 * loop runs. */
bool serializer_probe(Serializer *s, char *warned, size_t warnedlen, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* to, not probed, starts as from did after serializer_probe (registry_take_probe). Returns
 * whether it did (false when their registries' URLs differ). */
bool serializer_take_probe(Serializer *to, const Serializer *from);

#endif
