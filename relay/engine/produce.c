/* produce: handing a batch to the shared producer, and its delivery reports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"
#include "monotime.h"
#include "message.h"
#include "metrics.h"
#include "route.h"
#include "statements.h"

/* ---- producing ---------------------------------------------------------------------------- */

bool produce_finished(const Session *s)
{
    const Batch *b = &s->batch;
    return b->next >= b->n && b->in_flight == 0;
}

/* The CloudEvents content-type: --ce-content-type, else the media type of what the value holds,
 * so that a CloudEvents SDK does not read Avro or a bytea payload's bytes as JSON. */
static const char *ce_content_type(const Config *cfg)
{
    if (cfg->ce_content_type)
        return cfg->ce_content_type;
    if (cfg->value_format == VALUE_AVRO)
        return "application/avro";
    if (cfg->map.payload_binary)
        return "application/octet-stream";
    return "application/json";
}

/* The headers of an event's message in the configured format; NULL with why in err. */
static rd_kafka_headers_t *message_headers(const Session *s, const OutboxRow *row, char *err,
                                           size_t errlen)
{
    rd_kafka_headers_t *hdrs = route_headers(row, s->cfg->map.identity_headers, err, errlen);
    if (hdrs && s->cfg->message_format == FORMAT_CLOUDEVENTS &&
        !route_cloudevents_add(hdrs, row, s->cfg->ce_source, ce_content_type(s->cfg))) {
        rd_kafka_headers_destroy(hdrs);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    return hdrs;
}

/* The bytes of the headers as the record carries them (names and values). */
static size_t headers_bytes(const rd_kafka_headers_t *hdrs)
{
    size_t n = 0, size;
    const char *name;
    const void *value;
    for (size_t i = 0; hdrs && rd_kafka_header_get_all(hdrs, i, &name, &value, &size) ==
                                   RD_KAFKA_RESP_ERR_NO_ERROR;
         i++)
        n += strlen(name) + size;
    return n;
}

static bool isolate_bare(const Isolate *iso, long long id);

/* Produces a dead event to the dead-letter topic, with why it died in the headers. A payload too
 * large for Kafka (a common reason to die) is left out rather than failing again: too large for
 * the producer (the claim's measure, or librdkafka's answer here), or for the dead-letter topic
 * (the broker refused the copy alone: isolate_bare). */
static rd_kafka_resp_err_t produce_dead_letter(Session *s, BatchRow *br)
{
    const OutboxRow *row = &br->row;
    char topic[ROUTE_TOPIC_MAX + 1], why[256];
    if (!route_topic(s->cfg->topic_template, row, topic, sizeof(topic), why, sizeof(why)))
        topic[0] = '\0';
    rd_kafka_headers_t *hdrs = route_dead_letter_headers(row, s->cfg->map.identity_headers,
                                                         br->last_error, br->attempts, topic);
    /* A payload too large, or one that did not decode, goes out omitted, and the header says so. */
    bool omit = br->too_large || br->undecodable || isolate_bare(&s->relay->isolate, row->id);
    rd_kafka_resp_err_t err =
        omit ? RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE
             : kafka_produce(s->relay->kafka, s->cfg->dead_letter_topic, RD_KAFKA_PARTITION_UA, 0,
                             row->aggregate_id, strlen(row->aggregate_id), row->payload,
                             row->payload_len, hdrs, br);
    /* What went out, for the report: a copy refused alone with no payload has nothing to leave
     * out (produce_record_report), and its error names the sizes (copy_unfit). */
    br->sent_value = row->payload ? row->payload_len : 0;
    br->sent_key = strlen(row->aggregate_id);
    br->sent_headers = headers_bytes(hdrs);
    if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        br->sent_value = 0;
        rd_kafka_header_add(hdrs, "dlq.payload_omitted", -1, "true", -1);
        br->sent_headers = headers_bytes(hdrs);
        err = kafka_produce(s->relay->kafka, s->cfg->dead_letter_topic, RD_KAFKA_PARTITION_UA, 0,
                            row->aggregate_id, strlen(row->aggregate_id), NULL, 0, hdrs, br);
    }
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        rd_kafka_headers_destroy(hdrs);
    return err;
}

/* The producer's message.max.bytes, for the errors below ("" when there is no producer). */
static void max_message_text(const Session *s, char *out, size_t outlen)
{
    if (s->relay->kafka)
        snprintf(out, outlen, " of %ld", kafka_message_max_bytes(s->relay->kafka));
    else
        out[0] = '\0';
}

/* The failure of a row the claim found too large for the producer (it did not load its large
 * columns): bytes counts its payload, key and headers' columns, as the claim measured them. */
static void fail_too_large(Session *s, BatchRow *br, size_t bytes)
{
    char why[256], limit[32];
    max_message_text(s, limit, sizeof(limit));
    /* librdkafka's text says "Broker:" but no broker saw it: say what actually happened. */
    snprintf(why, sizeof(why),
             "message too large: %zu bytes with key and headers, over the producer's "
             "message.max.bytes%s (not sent)",
             bytes, limit);
    batch_fail(&s->batch, br, why, true);
}

/* The failure of a message refused as too large once produced, by librdkafka (broker: false)
 * or by the broker (a topic's max.message.bytes, or the broker's message.max.bytes, below the
 * producer's): the claim measured the row's columns, but the message is what was produced (an
 * encoded value, the headers the relay adds), so its error names that message's sizes. */
static void fail_produced_too_large(Session *s, BatchRow *br, bool broker)
{
    char why[384], limit[32];
    max_message_text(s, limit, sizeof(limit));
    size_t total = br->sent_value + br->sent_key + br->sent_headers;
    if (broker)
        snprintf(why, sizeof(why),
                 "message too large for the broker: %zu bytes as produced (value %zu, key %zu, "
                 "headers %zu), over the topic's max.message.bytes or the broker's "
                 "message.max.bytes (the producer's message.max.bytes%s)",
                 total, br->sent_value, br->sent_key, br->sent_headers, limit);
    else
        snprintf(why, sizeof(why),
                 "message too large: %zu bytes as produced (value %zu, key %zu, headers %zu, "
                 "before the record's overhead), over the producer's message.max.bytes%s (not "
                 "sent)",
                 total, br->sent_value, br->sent_key, br->sent_headers, limit);
    batch_fail(&s->batch, br, why, true);
}

/* ---- rows the broker refused as too large with others: produced again alone ---------------- */

static int isolate_find(const Isolate *iso, long long id)
{
    for (int i = 0; i < iso->n; i++)
        if (iso->ids[i] == id)
            return i;
    return -1;
}

/* Whether the dead event's copy id goes without its payload (Isolate, engine.h). */
static bool isolate_bare(const Isolate *iso, long long id)
{
    int i = isolate_find(iso, id);
    return i >= 0 && iso->bare[i];
}

/* Whether br is an event or a dead event's copy to produce alone (Isolate, engine.h); notes that
 * a claim met it. A copy's bare mark is dropped when no claim has met it for ISOLATE_STALE_S (its
 * bare publication failed for a passing reason and waited that long, or its lane moved and came
 * back): the dead-letter topic's max.message.bytes may have been raised meanwhile, so it goes
 * alone with its payload again, and goes bare at once if refused again. */
static bool isolate_wanted(Relay *r, const BatchRow *br)
{
    Isolate *iso = &r->isolate;
    if (iso->n == 0)
        return false;
    int i = isolate_find(iso, br->row.id);
    if (i < 0)
        return false;
    double now = monotime_now();
    if (now - iso->met[i] >= ISOLATE_STALE_S)
        iso->bare[i] = false;
    iso->met[i] = now;
    return true;
}

/* Takes entry i out of the set (the last one moves into its place). */
static void isolate_remove(Isolate *iso, int i)
{
    iso->n--;
    iso->ids[i] = iso->ids[iso->n];
    iso->met[i] = iso->met[iso->n];
    iso->bare[i] = iso->bare[iso->n];
    if (iso->n == 0)
        iso->warned = false; /* the episode is over: the next refusal is said again */
}

/* Its outcome is known (delivered, or refused alone): it goes with others from now on. */
static void isolate_forget(Relay *r, long long id)
{
    int i = isolate_find(&r->isolate, id);
    if (i >= 0)
        isolate_remove(&r->isolate, i);
}

/* Drops the rows no claim has met for ISOLATE_STALE_S: their lane went to another relay (which
 * sent them), or they were dead-lettered, requeued or deleted, and this relay may never meet them
 * again. Kept, they would hold the episode open for good (its warning never said again) and
 * take room in the set. */
static void isolate_expire(Relay *r)
{
    Isolate *iso = &r->isolate;
    double now = monotime_now();
    for (int i = 0; i < iso->n;) {
        if (now - iso->met[i] < ISOLATE_STALE_S)
            i++;
        else
            isolate_remove(iso, i); /* the last entry moves to i: looked at next */
    }
}

void produce_isolate_forget_all(Relay *r)
{
    Isolate *iso = &r->isolate;
    iso->n = 0;
    iso->warned = false; /* a refusal of the new table's rows starts an episode of its own */
}

/* The entry a bare mark may take in a full set: the one met longest ago that has none, or -1. */
static int isolate_evictable(const Isolate *iso)
{
    int oldest = -1;
    for (int i = 0; i < iso->n; i++)
        if (!iso->bare[i] && (oldest < 0 || iso->met[i] < iso->met[oldest]))
            oldest = i;
    return oldest;
}

/* Adds id to the rows to produce alone (stale ones dropped first by the caller), met now; in a
 * full set, one to go bare (bare) takes isolate_evictable's entry. Its index, or -1 when there is
 * no room. The caller sets the entry's bare mark. */
static int isolate_add(Relay *r, long long id, bool bare)
{
    Isolate *iso = &r->isolate;
    int i = isolate_find(iso, id);
    if (i < 0 && iso->n < ISOLATE_MAX) {
        i = iso->n++;
        iso->bare[i] = false;
    } else if (i < 0 && bare) {
        i = isolate_evictable(iso); /* an entry without a bare mark: bare[i] is false */
    }
    if (i < 0)
        return -1;
    iso->ids[i] = id;
    iso->met[i] = monotime_now();
    return i;
}

/* Whether s must not produce its next row now: a row produced alone (any session's, s's own
 * too) awaits its report, or another session waits to produce one alone, which goes first
 * (when s's next row is to go alone as well, the lower index goes first, so two never wait on
 * each other). Each paused session is resumed by a report (relay.c, resume_waiting). */
static bool isolation_blocks(const Relay *r, const Session *s, bool isolating)
{
    for (int i = 0; i < r->n_sessions; i++) {
        const Session *o = &r->sessions[i];
        if (o->batch.isolated_out)
            return true;
        if (o != s && o->isolate_wait && o->waiting && o->phase == PHASE_PRODUCING &&
            (!isolating || o->index < s->index))
            return true;
    }
    return false;
}

/* Keeps br to produce again alone, bare (a dead event's copy without its payload) or as it was
 * (a bare mark already there stays): it stays unsent with no attempt counted (its aggregate held
 * for the batch). False when the set is full, with nothing done. A bare mark is known, not
 * guessed: the copy was refused alone, so its payload can never go to the dead-letter topic as
 * it is. In a full set it takes the place of the row met longest ago that waits to go alone for
 * a refusal shared with others, which then goes with others again (refused again, it counts a
 * transient failure while the set is full): that costs the row a retry, whereas without its
 * mark the copy would go with its payload again, refused each time, as long as the set stays
 * full. */
static bool isolate_again(Session *s, BatchRow *br, bool bare)
{
    Relay *r = s->relay;
    isolate_expire(r); /* rows no claim meets any more make room */
    int i = isolate_add(r, br->row.id, bare);
    if (i < 0)
        return false;
    if (bare)
        r->isolate.bare[i] = true;
    batch_cancelled(&s->batch, br);
    return true;
}

/* A message the broker refused as too large though it was not alone in its produce request:
 * Kafka refuses the whole request when the record batch is over the topic's max.message.bytes,
 * however small each message is, so that is no fault of the row. It stays unsent with no
 * attempt counted (its aggregate held for the batch) and goes alone next time; when the set of
 * such rows is full, it counts a transient failure (an attempt, never a rejection). A dead
 * event's copy likewise (a failure of a copy is a failed publication: SQL_MARK_DEAD_LETTER_FAILED).
 */
static void refused_with_others(Session *s, BatchRow *br)
{
    Relay *r = s->relay;
    const char *topic = br->dead_letter ? s->cfg->dead_letter_topic : br->topic;
    isolate_expire(r); /* an episode of rows no claim meets any more is over */
    if (!r->isolate.warned) {
        r->isolate.warned = true;
        log_warn("the broker refused a produce request as too large though its messages were "
                 "within message.max.bytes: set --kafka batch.size (and message.max.bytes) at or "
                 "below the smallest topic's max.message.bytes",
                 "topic=%s id=%lld", topic ? topic : "", br->row.id);
    }
    if (isolate_again(s, br, false))
        return;
    char why[256];
    snprintf(why, sizeof(why),
             "message too large for the broker in a produce request with other messages (not "
             "counted as a rejection: more such rows than the %d the relay produces alone)",
             ISOLATE_MAX);
    batch_fail(&s->batch, br, why, false);
}

/* A dead event's copy the broker refused as too large though it was alone in its request, with
 * its payload: its own size is over the dead-letter topic's max.message.bytes (or the broker's
 * message.max.bytes), below the producer's, which produce_dead_letter meets itself. It goes
 * again as that one does: alone (the next claim meets it), without its payload, the
 * dlq.payload_omitted header saying so. When the set is full of bare marks alone it is a failed
 * publication (30 s, then as long as it has been dead), its payload kept. */
static void copy_refused_alone(Session *s, BatchRow *br, rd_kafka_resp_err_t err)
{
    if (!isolate_again(s, br, true))
        batch_fail(&s->batch, br, rd_kafka_err2str(err), true);
}

/* A dead event's copy the broker refused as too large alone and without its payload: its key
 * and headers (the row's own and the dlq.* ones) are over the dead-letter topic's
 * max.message.bytes (or the broker's message.max.bytes) by themselves. Sent again it would be
 * refused again for ever, each time after trying its payload once more: it is parked instead, a
 * failed publication that is not retried (SQL_MARK_DEAD_LETTER_FAILED), said in one error line,
 * counted as a permanent failure and, until the event is requeued, in the backlog's failed
 * copies (outbox_dead_letter_unpublished_rows, status). */
static void copy_unfit(Session *s, BatchRow *br)
{
    char why[384], eid[160];
    snprintf(why, sizeof(why),
             "dead-letter copy " DEAD_COPY_PARKED_WHY ": %zu bytes as "
             "produced (key %zu, headers %zu), over the dead-letter topic's max.message.bytes or "
             "the broker's message.max.bytes (not retried)",
             br->sent_key + br->sent_headers, br->sent_key, br->sent_headers);
    log_error("a dead event's copy is too large for the dead-letter topic even without its "
              "payload; it is not retried: raise the topic's max.message.bytes, then requeue the "
              "event",
              "id=%lld event_id=%s bytes=%zu key=%zu headers=%zu topic=%s", br->row.id,
              log_quote(br->row.event_id, eid, sizeof(eid)), br->sent_key + br->sent_headers,
              br->sent_key, br->sent_headers, s->cfg->dead_letter_topic);
    batch_fail(&s->batch, br, why, true);
    br->parked = true;
}

/* Produces one event row. Returns the producer's answer; failures that happen before the
 * producer (topic, headers) are recorded here and reported as NO_ERROR with the row FAILED. */
static rd_kafka_resp_err_t produce_event(Session *s, BatchRow *br)
{
    const OutboxRow *row = &br->row;
    char topic[ROUTE_TOPIC_MAX + 1], why[512];
    if (br->too_large) {
        fail_too_large(s, br, br->message_bytes);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    if (br->undecodable) {
        batch_fail(&s->batch, br, "payload: its bytea text form did not decode (not sent)", true);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    /* Built once per row: a retry after a full queue reuses it. */
    if (!br->topic) {
        if (!route_topic(s->cfg->topic_template, row, topic, sizeof(topic), why, sizeof(why))) {
            batch_fail(&s->batch, br, why, true);
            return RD_KAFKA_RESP_ERR_NO_ERROR;
        }
        br->topic = strdup(topic);
        if (!br->topic) {
            batch_fail(&s->batch, br, "out of memory", false);
            return RD_KAFKA_RESP_ERR_NO_ERROR;
        }
    }
    /* Checked before the headers are taken: a faulty row fails here with nothing to free. */
    MessageParts parts;
    if (!message_parts(row, &s->cfg->map, &parts, why, sizeof(why))) {
        batch_fail(&s->batch, br, why, true);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    br->partition = parts.partition; /* for the order check (batch_order_breaks) */
    /* The value in the configured format, encoded once (a retry after a full queue reuses it).
     * The Schema Registry's answer may not be here yet, or it may be down: the row then waits,
     * and with it the rest of the batch, so order is kept (produce_more pauses). */
    const char *value = row->payload;
    size_t value_len = row->payload_len;
    if (s->relay->serializer && row->payload) {
        if (!br->value) {
            switch (serializer_encode(s->relay->serializer, br->topic, row->event_type,
                                      row->payload, row->payload_len, &br->value, &br->value_len,
                                      why, sizeof(why))) {
            case SERIALIZER_OK:
                break;
            case SERIALIZER_ROW_FAULT:
                batch_fail(&s->batch, br, why, true);
                return RD_KAFKA_RESP_ERR_NO_ERROR;
            case SERIALIZER_RETRY_LATER:
                batch_fail(&s->batch, br, why, false);
                return RD_KAFKA_RESP_ERR_NO_ERROR;
            case SERIALIZER_WAIT:
            case SERIALIZER_UNAVAILABLE:
                return RD_KAFKA_RESP_ERR__WAIT_CACHE;
            }
        }
        value = br->value;
        value_len = br->value_len;
    }
    rd_kafka_headers_t *hdrs = br->headers; /* from prepare_headers, or built here */
    br->headers = NULL;
    if (!hdrs)
        hdrs = message_headers(s, row, why, sizeof(why));
    if (!hdrs) {
        batch_fail(&s->batch, br, why, true);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    br->sent_value = value ? value_len : 0;
    br->sent_key = strlen(row->aggregate_id);
    br->sent_headers = headers_bytes(hdrs);
    rd_kafka_resp_err_t err =
        kafka_produce(s->relay->kafka, br->topic, parts.partition, parts.timestamp_ms,
                      row->aggregate_id, strlen(row->aggregate_id), value, value_len, hdrs, br);
    if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
        br->headers = hdrs; /* kept for the retry (produce_more, once reports free room) */
    else if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        rd_kafka_headers_destroy(hdrs);
    if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        fail_produced_too_large(s, br, false);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    return err;
}

/* Builds the headers of the event rows not produced yet, before producing any of them, so that
 * the produce loop hands the batch to librdkafka in one quick burst: its broker threads wake on a
 * partition's first queued message and send what is queued by then, so a slower loop makes more,
 * smaller produce requests. Measured on 100,000-row drains: about 8 % more events/s, and a third
 * less CPU for the (mock) broker, which gets fewer requests. A row whose headers cannot be built is
 * left to the loop, which fails it in order (failing it here would hold its aggregate back before
 * its earlier rows were produced). */
static void prepare_headers(Session *s)
{
    Batch *b = &s->batch;
    char why[512];
    for (; b->prepared < b->n; b->prepared++) {
        BatchRow *br = &b->rows[b->prepared];
        if (!br->dead_letter && br->state == ROW_PENDING)
            br->headers = message_headers(s, &br->row, why, sizeof(why));
    }
}

void produce_more(Session *s)
{
    Batch *b = &s->batch;
    Relay *r = s->relay;
    s->waiting = false;
    s->isolate_wait = false;
    /* Nothing new goes to the producer while a purge is under way: the purge is not
     * instantaneous, and a message of this batch caught by it while later ones get through
     * would leave a gap in its aggregate's order. (Nothing in the loop changes these.) */
    /* Nor on a producer that failed: it would fail each row with __FATAL, an attempt counted
     * against rows that never failed; they stay unsent (below) for the recreated one. */
    bool producer_failed = kafka_fatal(r->kafka);
    bool may_produce = !s->stopping && !b->timed_out && !r->purging && !producer_failed;
    if (may_produce)
        prepare_headers(s);
    while (may_produce && b->next < b->n) {
        BatchRow *br = &b->rows[b->next];
        if (!br->dead_letter && batch_is_held(b, &br->row)) {
            b->next++; /* an earlier event of its aggregate failed: it waits for the retry */
            continue;
        }
        if (marks_skip_unrecordable(s, br)) {
            batch_leave_unsent(b, br); /* its outcome cannot be recorded: not published again */
            b->next++;
            continue;
        }
        bool isolating = isolate_wanted(r, br);
        if (isolation_blocks(r, s, isolating) || (isolating && relay_in_flight(r) > 0)) {
            s->waiting = true; /* a report resumes it; the row (and its aggregate) waits */
            s->isolate_wait = isolating;
            break;
        }
        rd_kafka_resp_err_t err =
            br->dead_letter ? produce_dead_letter(s, br) : produce_event(s, br);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && relay_in_flight(r) > 0) {
            s->waiting = true; /* backpressure: a report of any session frees room */
            break;
        }
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && r->in_report) {
            /* The last message out is still in librdkafka's queue until its report, being
             * served now, returns: room comes then (a queue of one message, or of a few large
             * ones), not the row's fault. */
            s->waiting = true;
            relay_room_after_report(r);
            break;
        }
        if (err == RD_KAFKA_RESP_ERR__WAIT_CACHE) {
            s->waiting = true; /* the Schema Registry: its ready callback resumes */
            break;
        }
        if (err == RD_KAFKA_RESP_ERR__FATAL) {
            /* The producer failed: librdkafka refuses to produce from the moment a broker thread
             * raises the fatal error, before the loop serves the error event that sets
             * kafka_fatal (a claim or a report served in between meets it here). No row's
             * fault: left unsent like the rows after it, no attempt counted. */
            batch_leave_unsent(b, br);
            producer_failed = true;
            break;
        }
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR && !br->dead_letter && kafka_error_setup(err))
            batch_unsent(b, br, err); /* the topic's or the credentials' fault, not the row's */
        else if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
            batch_fail(b, br, rd_kafka_err2str(err), kafka_error_permanent(err));
        else if (br->state == ROW_PENDING) {
            br->state = ROW_QUEUED;
            br->shared = relay_in_flight(r) > 0;
            br->produced_seq = ++r->produced;
            b->in_flight++;
        }
        if (isolating && br->state == ROW_FAILED)
            isolate_forget(r, br->row.id); /* refused before it went out (librdkafka's size) */
        b->next++;
        if (isolating && br->state == ROW_QUEUED) {
            /* Alone in its request: nothing else goes out until its report (isolation_blocks). */
            br->isolated = b->isolated_out = true;
            s->waiting = true;
            break;
        }
    }
    if (s->stopping || b->timed_out || producer_failed)
        b->next = b->n; /* rows not produced yet stay unsent, with no attempt counted */
    else if (r->purging && b->next < b->n)
        s->waiting = true;
}

void produce_record_report(Session *s, BatchRow *br, rd_kafka_resp_err_t err)
{
    Batch *b = &s->batch;
    if (br->state != ROW_QUEUED)
        return; /* reported after shutdown gave up on it */
    b->in_flight--;
    bool isolated = br->isolated;
    if (isolated) {
        br->isolated = b->isolated_out = false; /* the others may produce again */
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE)
            isolate_forget(s->relay, br->row.id); /* it fitted, or it is too large itself */
    }
    if (b->abandoned && err != RD_KAFKA_RESP_ERR_NO_ERROR) {
        /* The batch went with its connection: nothing of it is recorded, the row is claimed and
         * sent again, so its purge or failure is no failure of the row (nor of the metric). */
        br->state = ROW_FAILED;
        return;
    }
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        br->state = ROW_ACKED;
        b->acked++;
        metrics_row_acked(b, br, monotime_now());
    } else if (b->timed_out && (err == RD_KAFKA_RESP_ERR__PURGE_QUEUE ||
                                err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)) {
        char why[128];
        snprintf(why, sizeof(why), "not acknowledged within the delivery timeout (%ld ms)",
                 s->cfg->delivery_timeout_ms);
        batch_fail(b, br, why, false);
    } else if (kafka_fatal(s->relay->kafka) && (err == RD_KAFKA_RESP_ERR__PURGE_QUEUE ||
                                                err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)) {
        /* The producer failed (kafka.c purges what it held then): the message was cancelled
         * for another message's fault or the producer's, never this row's, which stays unsent
         * with no attempt counted and goes out again on the recreated producer. */
        batch_cancelled(b, br);
    } else if (err == RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP &&
               (!br->row.timestamp_ms || strtoll(br->row.timestamp_ms, NULL, 10) == 0)) {
        /* The producer's clock (no timestamp column, or a row stamped 0, which librdkafka reads
         * as "now"), not the row's value: the host's clock is off from the broker's
         * by more than the topic allows, which every row would meet. Retried, never
         * dead-lettered: it passes once the clock is set right. */
        batch_fail(b, br, "Broker: Invalid timestamp (the relay host's clock, not the row's)",
                   false);
    } else if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE &&
               (br->shared || br->produced_seq != s->relay->produced)) {
        /* Something else of the relay was in flight while it was out: it may have shared the
         * request the broker refused whole (a record batch over the topic's max.message.bytes). */
        refused_with_others(s, br);
    } else if (!br->dead_letter && err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        fail_produced_too_large(s, br, true); /* alone, and still too large: the row's own fault */
    } else if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE && br->sent_value > 0) {
        copy_refused_alone(s, br, err); /* a copy alone, too large with its payload */
    } else if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        copy_unfit(s, br); /* a copy alone and bare, still too large */
    } else if (!br->dead_letter && kafka_error_setup(err)) {
        /* Not authorised, or no such topic: every event of the topic would meet it until an
         * operator acts, so it is never counted against the row (nor dead-letters it): the row
         * stays unsent and its aggregate type is held out of the claims until a probe (marks.c).
         * A dead event's copy is recorded as failed as before: that counts nothing against it,
         * and its own backoff (30 s, growing to an hour) keeps a missing dead-letter topic from
         * slowing every batch. */
        batch_unsent(b, br, err);
    } else {
        batch_fail(b, br, rd_kafka_err2str(err), kafka_error_permanent(err));
    }
}

void produce_delivery_timeout(Session *s)
{
    Batch *b = &s->batch;
    if (b->n == 0)
        return;
    if (b->in_flight == 0) {
        /* Nothing of this batch is at the producer: it waits for room (queue full) or for
         * another session's purge. Its rest stays unsent, with no attempt counted. */
        b->timed_out = true;
        return;
    }
    /* Like log_batch_failures: loud once per streak of failing batches, then debug. */
    log_write(s->last_failure[0] ? LOG_DEBUG : LOG_WARN,
              "delivery timeout: cancelling the rest of the batch, it will be retried",
              "in_flight=%d acked=%d timeout_ms=%ld session=%d", b->in_flight, b->acked,
              s->cfg->delivery_timeout_ms, s->index);
    /* The purge cancels what every session has in flight: each counts it as its own timeout, so
     * what reached the broker stays a prefix of each batch per partition. */
    Relay *r = s->relay;
    for (int i = 0; i < r->n_sessions; i++)
        if (r->sessions[i].batch.in_flight > 0)
            r->sessions[i].batch.timed_out = true;
    /* A session whose own timer ends while that purge's reports are not all in (a request
     * partly written when it came is reported only later, relay.c) met the same cut: one in the
     * streak of --kafka-away-after, not one per session, which sent a relay of two sessions
     * away after a single timeout. Nothing new is produced while the purge lasts. */
    bool same_cut = r->purging;
    relay_start_purge(r);
    if (!same_cut)
        relay_kafka_timed_out(r);
}

void produce_give_up_waiting(Session *s)
{
    Batch *b = &s->batch;
    /* Reports that arrive from now on are ignored: those rows stay unsent. The producer still
     * holds their messages, whose payloads point into the claim results: those live until the
     * producer is gone (relay_free frees it before the sessions). */
    for (int i = 0; i < b->n; i++)
        if (b->rows[i].state == ROW_QUEUED)
            b->rows[i].state = ROW_PENDING;
    b->in_flight = 0;
    b->next = b->n;
    b->isolated_out = false; /* its report, if it comes, is ignored: the others go on */
    batch_retire(b);
}
