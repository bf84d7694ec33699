/* route: what one outbox row becomes in Kafka — topic, key, value and headers.
 *
 * Pure functions over an OutboxRow; the relay owns the rows and the producer. */
#ifndef OUTBOX_ROUTE_H
#define OUTBOX_ROUTE_H

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>

#include "table.h"

/* Kafka's own limit on topic names (and its legal characters: [a-zA-Z0-9._-]). */
#define ROUTE_TOPIC_MAX 249

/* Bounds on a row's own headers (its headers column and additional fields together): a row
 * beyond either fails with a last_error saying which (and is dead-lettered like any rejected
 * row), so one hostile row cannot make the relay build megabytes of headers per attempt. */
#define ROUTE_HEADERS_MAX 100
#define ROUTE_HEADERS_MAX_BYTES (64 * 1024)

/* True for a header name a row may not set (it is dropped): id; with identity_headers also
 * event_type and aggregate_type; every name starting with "dlq." (the relay's dead-letter
 * headers). ASCII names compare ignoring case; a name with non-ASCII characters is reserved when
 * its shape is a reserved name's (invisible characters and combining marks left out, any other
 * non-ASCII character standing for any letter: İd, ıd, ｉｄ, aggregate_typе with a Cyrillic е).
 * Any name holding a control character, invalid UTF-8 or an invisible, bidi or line-separator
 * character (utf8_unsafe) is dropped as well, whatever it spells. */
bool route_header_reserved(const char *name, bool identity_headers);

/* Checks a topic template at start-up: only {aggregate_type} (also spelt ${routedByValue}, as in
 * Debezium's route.topic.replacement) and {event_type} placeholders, and its literal text must be
 * legal in a topic name. {event_type} only with per_topic_order: it sends one aggregate's events
 * to several topics, and Kafka keeps order only within a partition, so the relay could not keep
 * the aggregate's order (docs/guarantees.md). On failure writes one line to err. */
bool route_template_check(const char *tmpl, bool per_topic_order, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Checks at start-up that no row can be routed into the dead-letter topic: with placeholders
 * standing for any text (a writer chooses it), tmpl must not be able to expand to
 * dead_letter_topic (NULL: nothing to check). Otherwise a writer could put events beside the
 * relay's dead letters, with forged dlq.* contents in the payload, for whoever reads them. On
 * failure writes one line to err. */
bool route_dead_letter_check(const char *tmpl, const char *dead_letter_topic, char *err,
                             size_t errlen) __attribute__((warn_unused_result));

/* Expands the template for row into out (at least ROUTE_TOPIC_MAX + 1 bytes). Returns false with
 * a reason in err when the result is not a legal Kafka topic name: empty, longer than 249
 * characters, or with a character outside [a-zA-Z0-9._-]. */
bool route_topic(const char *tmpl, const OutboxRow *row, char *out, size_t outlen, char *err,
                 size_t errlen) __attribute__((warn_unused_result));

/* Builds the message headers: the row's own headers object, then its additional fields (string
 * values as they are, other JSON values as their compact JSON text (the column's text without
 * its white space: numbers as written), null as a header without a value; entries named as
 * route_header_reserved says are dropped so a row cannot spoof them), then id = event_id and, with
 * identity_headers, event_type and aggregate_type. Without identity_headers (the Debezium
 * layout) id comes first instead, as Debezium's Outbox Event Router adds it. Returns NULL with a
 * reason in err when the headers column is not a JSON object or the row's headers exceed
 * ROUTE_HEADERS_MAX entries or ROUTE_HEADERS_MAX_BYTES bytes. The caller owns the result
 * (rd_kafka_headers_destroy, or hand it to rd_kafka_producev). */
rd_kafka_headers_t *route_headers(const OutboxRow *row, bool identity_headers, char *err,
                                  size_t errlen);

/* Headers of a dead event published to the dead-letter topic: those of route_headers (without
 * the row's own headers if they are malformed), plus dlq.error, dlq.attempts and
 * dlq.original_topic (empty when the event had no legal topic). Never NULL. */
rd_kafka_headers_t *route_dead_letter_headers(const OutboxRow *row, bool identity_headers,
                                              const char *error, int attempts,
                                              const char *original_topic);

/* Checks a fixed topic name (e.g. --dead-letter-topic) against Kafka's rules; one line in err. */
bool route_topic_name_check(const char *option, const char *topic, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* True for a header name route_cloudevents_add replaces: one of its attributes' names (ce_id,
 * content-type, ...), ASCII letters in any case, other characters judged by their shape as
 * route_header_reserved judges them. */
bool route_cloudevents_reserved(const char *name);

/* Adds the CloudEvents attributes of a row (Kafka protocol binding, binary content mode:
 * ce_specversion 1.0, ce_id = event id, ce_source = source, ce_type = event type, ce_time =
 * created_at, ce_subject = aggregate id, content-type), replacing any header of those names the
 * row brought itself. The value stays the payload, so a CloudEvents SDK reads it as the event's
 * data. hdrs stays the caller's. False only when out of memory: a header of those names may then
 * be left in, so the message must not be sent. */
bool route_cloudevents_add(rd_kafka_headers_t *hdrs, const OutboxRow *row, const char *source,
                           const char *content_type) __attribute__((warn_unused_result));

#endif
