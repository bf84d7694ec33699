#include "batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "message.h"
#include "metrics.h"
#include "table.h"

bool batch_init(Batch *b, int capacity)
{
    memset(b, 0, sizeof(*b));
    b->rows = calloc((size_t)capacity, sizeof(BatchRow));
    b->capacity = capacity;
    return b->rows != NULL;
}

void batch_retired_free(BatchRetired *r)
{
    PQclear(r->results[0]);
    PQclear(r->results[1]);
    r->results[0] = r->results[1] = NULL;
    for (int i = 0; i < r->n_values; i++)
        free(r->values[i]);
    free(r->values);
    r->values = NULL;
    r->n_values = 0;
}

void batch_take_retired(Batch *b, BatchRetired *out)
{
    *out = (BatchRetired){{b->retired[0], b->retired[1]}, b->retired_values, b->n_retired_values};
    b->retired[0] = b->retired[1] = NULL;
    b->retired_values = NULL;
    b->n_retired_values = 0;
}

void batch_free(Batch *b)
{
    batch_clear(b);
    BatchRetired kept;
    batch_take_retired(b, &kept);
    batch_retired_free(&kept);
    free(b->rows);
    b->rows = NULL;
}

void batch_clear(Batch *b)
{
    for (int i = 0; i < b->n; i++) {
        free(b->rows[i].error);
        b->rows[i].error = NULL;
        if (b->rows[i].headers)
            rd_kafka_headers_destroy(b->rows[i].headers); /* never produced */
        b->rows[i].headers = NULL;
        free(b->rows[i].topic);
        b->rows[i].topic = NULL;
        free(b->rows[i].value); /* the producer's report is in: nothing points at it any more */
        b->rows[i].value = NULL;
    }
    PQclear(b->claim);
    PQclear(b->dead);
    b->claim = b->dead = NULL;
    b->n = b->next = b->prepared = b->in_flight = b->acked = b->failed = 0;
    b->bytes = 0;
    b->abandoned = b->timed_out = b->held_whole = false;
    b->setup_faults = 0;
    b->cancelled = 0;
    b->isolated_out = false;
    b->setup_err = RD_KAFKA_RESP_ERR_NO_ERROR;
    b->setup_topic[0] = '\0';
    if (b->any_held)
        memset(b->held, 0, sizeof(b->held));
    b->any_held = false;
}

void batch_retire(Batch *b)
{
    if (b->retired[0] || b->retired[1] || b->retired_values)
        return;
    b->retired[0] = b->claim;
    b->retired[1] = b->dead;
    /* Encoded values too: librdkafka points at them until its reports are in. If there is no
     * room to keep them, they leak rather than be freed under the producer. */
    b->retired_values = calloc((size_t)(b->n > 0 ? b->n : 1), sizeof(char *));
    for (int i = 0; b->retired_values && i < b->n; i++) {
        if (b->rows[i].value)
            b->retired_values[b->n_retired_values++] = b->rows[i].value;
        b->rows[i].value = NULL;
    }
    for (int i = 0; !b->retired_values && i < b->n; i++)
        b->rows[i].value = NULL;
    b->claim = b->dead = NULL; /* the rows' strings stay valid: the results live on */
}

bool batch_given_up(const Batch *b)
{
    return b->retired[0] || b->retired[1] || b->retired_values;
}

bool batch_reserve(Batch *b, int capacity)
{
    if (capacity <= b->capacity)
        return true;
    if (b->n > 0)
        return false;
    BatchRow *rows = calloc((size_t)capacity, sizeof(BatchRow));
    if (!rows)
        return false;
    free(b->rows);
    b->rows = rows;
    b->capacity = capacity;
    return true;
}

/* PostgreSQL's type oid of bytea (catalog/pg_type.dat), which libpq does not export. */
#define BYTEA_OID 17

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Decodes a bytea's text form (hex "\\x...", or the escape format of bytea_output = escape) in
 * place, into the result's own memory: the bytes are never longer than their text, and no copy
 * means the claim's memory bound holds for binary payloads too. Returns the byte count, or
 * (size_t)-1 when the text is malformed (PostgreSQL never sends that). */
static size_t bytea_decode_in_place(char *text, size_t len)
{
    size_t out = 0;
    if (len >= 2 && text[0] == '\\' && text[1] == 'x') {
        if (len % 2 != 0)
            return (size_t)-1;
        for (size_t i = 2; i < len; i += 2) {
            int hi = hex_digit(text[i]), lo = hex_digit(text[i + 1]);
            if (hi < 0 || lo < 0)
                return (size_t)-1;
            text[out++] = (char)(hi << 4 | lo);
        }
        return out;
    }
    for (size_t i = 0; i < len;) {
        if (text[i] != '\\') {
            text[out++] = text[i++];
        } else if (i + 1 < len && text[i + 1] == '\\') {
            text[out++] = '\\';
            i += 2;
        } else if (i + 3 < len && text[i + 1] >= '0' && text[i + 1] <= '3' && text[i + 2] >= '0' &&
                   text[i + 2] <= '7' && text[i + 3] >= '0' && text[i + 3] <= '7') {
            text[out++] =
                (char)((text[i + 1] - '0') << 6 | (text[i + 2] - '0') << 3 | (text[i + 3] - '0'));
            i += 4;
        } else {
            return (size_t)-1;
        }
    }
    return out;
}

static void load_result(Batch *b, PGresult *res, bool dead_letter)
{
    /* A binary payload column (--payload-format binary) arrives as bytea's text form. */
    bool bytea =
        res && PQnfields(res) > ROW_COL_PAYLOAD && PQftype(res, ROW_COL_PAYLOAD) == BYTEA_OID;
    int rows = res ? PQntuples(res) : 0;
    for (int i = 0; i < rows && b->n < b->capacity; i++) {
        BatchRow *br = &b->rows[b->n++];
        OutboxRow *row = &br->row;
        row->id = strtoll(PQgetvalue(res, i, ROW_COL_ID), NULL, 10);
        row->event_id = PQgetvalue(res, i, ROW_COL_EVENT_ID);
        row->aggregate_type = PQgetvalue(res, i, ROW_COL_AGGREGATE_TYPE);
        row->aggregate_id = PQgetvalue(res, i, ROW_COL_AGGREGATE_ID);
        row->event_type = PQgetvalue(res, i, ROW_COL_EVENT_TYPE);
        row->payload =
            PQgetisnull(res, i, ROW_COL_PAYLOAD) ? NULL : PQgetvalue(res, i, ROW_COL_PAYLOAD);
        row->payload_len = row->payload ? (size_t)PQgetlength(res, i, ROW_COL_PAYLOAD) : 0;
        size_t text_len = row->payload_len; /* what the result holds, for the budget below */
        br->undecodable = false;
        if (bytea && row->payload) {
            size_t n = bytea_decode_in_place(PQgetvalue(res, i, ROW_COL_PAYLOAD), text_len);
            br->undecodable = n == (size_t)-1;
            row->payload_len = br->undecodable ? 0 : n;
        }
        row->headers =
            PQgetisnull(res, i, ROW_COL_HEADERS) ? NULL : PQgetvalue(res, i, ROW_COL_HEADERS);
        br->attempts = atoi(PQgetvalue(res, i, ROW_COL_ATTEMPTS));
        br->last_error =
            PQgetisnull(res, i, ROW_COL_LAST_ERROR) ? NULL : PQgetvalue(res, i, ROW_COL_LAST_ERROR);
        br->age_s = PQnfields(res) > ROW_COL_AGE && !PQgetisnull(res, i, ROW_COL_AGE)
                        ? strtoll(PQgetvalue(res, i, ROW_COL_AGE), NULL, 10) / 1e6
                        : -1.0;
        row->created_at =
            PQnfields(res) > ROW_COL_CREATED_AT && !PQgetisnull(res, i, ROW_COL_CREATED_AT)
                ? PQgetvalue(res, i, ROW_COL_CREATED_AT)
                : NULL;
        row->extra_headers =
            PQnfields(res) > ROW_COL_EXTRA_HEADERS && !PQgetisnull(res, i, ROW_COL_EXTRA_HEADERS)
                ? PQgetvalue(res, i, ROW_COL_EXTRA_HEADERS)
                : NULL;
        row->timestamp_ms =
            PQnfields(res) > ROW_COL_TIMESTAMP && !PQgetisnull(res, i, ROW_COL_TIMESTAMP)
                ? PQgetvalue(res, i, ROW_COL_TIMESTAMP)
                : NULL;
        row->partition =
            PQnfields(res) > ROW_COL_PARTITION && !PQgetisnull(res, i, ROW_COL_PARTITION)
                ? PQgetvalue(res, i, ROW_COL_PARTITION)
                : NULL;
        bool sized =
            PQnfields(res) > ROW_COL_PAYLOAD_BYTES && !PQgetisnull(res, i, ROW_COL_PAYLOAD_BYTES);
        /* What the claim's budget counted of the row (statements.c, SQL_WITHIN_BUDGET): every
         * column that becomes part of its message, as loaded. */
        size_t loaded = 0;
        static const RowColumn message_columns[] = {
            ROW_COL_EVENT_ID, ROW_COL_AGGREGATE_TYPE, ROW_COL_AGGREGATE_ID,  ROW_COL_EVENT_TYPE,
            ROW_COL_PAYLOAD,  ROW_COL_HEADERS,        ROW_COL_EXTRA_HEADERS, ROW_COL_CREATED_AT};
        for (size_t c = 0; c < sizeof(message_columns) / sizeof(message_columns[0]); c++)
            if ((int)message_columns[c] < PQnfields(res))
                loaded += message_columns[c] == ROW_COL_PAYLOAD
                              ? text_len
                              : (size_t)PQgetlength(res, i, (int)message_columns[c]);
        br->message_bytes =
            sized ? (size_t)strtoull(PQgetvalue(res, i, ROW_COL_PAYLOAD_BYTES), NULL, 10) : loaded;
        br->too_large = sized && !row->payload;
        b->bytes += loaded;
        br->dead_letter = dead_letter;
        br->state = ROW_PENDING;
        br->permanent = false;
        br->setup_fault = false;
        br->sent_value = br->sent_key = br->sent_headers = 0;
        br->cancelled = false;
        br->shared = br->isolated = br->parked = false;
        br->produced_seq = 0;
        br->error = NULL;
        br->headers = NULL;
        br->topic = NULL;
        br->value = NULL;
        br->value_len = 0;
        br->partition = MESSAGE_PARTITION_ANY;
        br->owner = b->owner;
    }
}

void batch_load(Batch *b, PGresult *claim, PGresult *dead)
{
    b->claim = claim;
    b->dead = dead;
    load_result(b, claim, false);
    load_result(b, dead, true);
}

/* FNV-1a over aggregate_type, a separator, aggregate_id. */
static uint32_t aggregate_hash(const OutboxRow *row)
{
    uint32_t h = 2166136261u;
    for (const char *p = row->aggregate_type; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    h = (h ^ 0xffu) * 16777619u;
    for (const char *p = row->aggregate_id; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return h % BATCH_HELD_BITS;
}

void batch_hold(Batch *b, const OutboxRow *row)
{
    uint32_t bit = aggregate_hash(row);
    b->held[bit / 8] |= (uint8_t)(1u << (bit % 8));
    b->any_held = true;
}

bool batch_is_held(const Batch *b, const OutboxRow *row)
{
    if (!b->any_held)
        return false;
    uint32_t bit = aggregate_hash(row);
    return (b->held[bit / 8] >> (bit % 8)) & 1u;
}

void batch_fail(Batch *b, BatchRow *br, const char *why, bool permanent)
{
    br->state = ROW_FAILED;
    br->permanent = permanent;
    free(br->error);
    br->error = strdup(why);
    b->failed++;
    metrics_failure(permanent);
    if (!br->dead_letter)
        batch_hold(b, &br->row);
}

void batch_unsent(Batch *b, BatchRow *br, rd_kafka_resp_err_t err)
{
    br->state = ROW_PENDING;
    br->setup_fault = true;
    if (b->setup_faults++ == 0) {
        b->setup_err = err;
        snprintf(b->setup_topic, sizeof(b->setup_topic), "%s", br->topic ? br->topic : "");
    }
    metrics_failure(false); /* an attempt that failed, for a reason that may pass */
    batch_hold(b, &br->row);
}

void batch_leave_unsent(Batch *b, BatchRow *br)
{
    br->state = ROW_PENDING;
    br->cancelled = true;
    b->cancelled++;
    if (!br->dead_letter)
        batch_hold(b, &br->row);
}

void batch_cancelled(Batch *b, BatchRow *br)
{
    batch_leave_unsent(b, br);
    metrics_failure(false); /* a delivery that failed, for a reason that may pass */
}

bool batch_row_recorded(const BatchRow *br)
{
    return br->state == ROW_ACKED || br->state == ROW_FAILED;
}

const BatchRow *batch_marks(const Batch *b, BatchMarks *m)
{
    return batch_marks_range(b, 0, b->n, m);
}

const BatchRow *batch_marks_range(const Batch *b, int from, int to, BatchMarks *m)
{
    const BatchRow *first_failed = NULL;
    strbuf_array_begin(&m->sent);
    strbuf_array_begin(&m->failed_ids);
    strbuf_array_begin(&m->failed_errors);
    strbuf_array_begin(&m->failed_permanent);
    strbuf_array_begin(&m->dl_sent);
    strbuf_array_begin(&m->dl_failed_ids);
    strbuf_array_begin(&m->dl_failed_parked);
    for (int i = from; i < to && i < b->n; i++) {
        const BatchRow *br = &b->rows[i];
        const char *error = br->error ? br->error : "unknown error";
        if (br->state == ROW_ACKED) {
            strbuf_array_int(br->dead_letter ? &m->dl_sent : &m->sent, br->row.id);
        } else if (br->state == ROW_FAILED && br->dead_letter) {
            strbuf_array_int(&m->dl_failed_ids, br->row.id);
            strbuf_array_text(&m->dl_failed_parked, br->parked ? "t" : "f");
        } else if (br->state == ROW_FAILED) {
            strbuf_array_int(&m->failed_ids, br->row.id);
            strbuf_array_text(&m->failed_errors, error);
            strbuf_array_text(&m->failed_permanent, br->permanent ? "t" : "f");
            if (!first_failed)
                first_failed = br;
        }
        /* PENDING and QUEUED rows stay as they are: unsent, no attempt counted. */
    }
    strbuf_array_end(&m->sent);
    strbuf_array_end(&m->failed_ids);
    strbuf_array_end(&m->failed_errors);
    strbuf_array_end(&m->failed_permanent);
    strbuf_array_end(&m->dl_sent);
    strbuf_array_end(&m->dl_failed_ids);
    strbuf_array_end(&m->dl_failed_parked);
    return first_failed;
}

void batch_marks_free(BatchMarks *m)
{
    strbuf_free(&m->sent);
    strbuf_free(&m->failed_ids);
    strbuf_free(&m->failed_errors);
    strbuf_free(&m->failed_permanent);
    strbuf_free(&m->dl_sent);
    strbuf_free(&m->dl_failed_ids);
    strbuf_free(&m->dl_failed_parked);
}

static bool same_aggregate(const OutboxRow *a, const OutboxRow *b)
{
    return strcmp(a->aggregate_id, b->aggregate_id) == 0 &&
           strcmp(a->aggregate_type, b->aggregate_type) == 0;
}

/* Whether two rows of one aggregate go to the same topic under tmpl (NULL: order is promised
 * across topics, so they count as one). Rows without a legal topic were never produced. */
static bool same_topic(const OutboxRow *a, const OutboxRow *b, const char *tmpl)
{
    char ta[ROUTE_TOPIC_MAX + 1], tb[ROUTE_TOPIC_MAX + 1], why[256];
    if (!tmpl)
        return true;
    return route_topic(tmpl, a, ta, sizeof(ta), why, sizeof(why)) &&
           route_topic(tmpl, b, tb, sizeof(tb), why, sizeof(why)) && strcmp(ta, tb) == 0;
}

/* Whether two rows of one topic may share a partition: the same partition column, or one (or
 * both) placed by the key, which for one aggregate in one topic is one partition. */
static bool same_partition(const BatchRow *a, const BatchRow *b)
{
    return a->partition == b->partition || a->partition == MESSAGE_PARTITION_ANY ||
           b->partition == MESSAGE_PARTITION_ANY;
}

int batch_order_breaks(const Batch *b, const char *per_topic_template, bool per_partition)
{
    if (b->failed == 0 && b->setup_faults == 0 && b->cancelled == 0)
        return 0;
    int breaks = 0;
    for (int i = 0; i < b->n; i++) {
        const BatchRow *later = &b->rows[i];
        if (later->dead_letter || later->state != ROW_ACKED || !batch_is_held(b, &later->row))
            continue;
        for (int j = 0; j < i; j++) {
            const BatchRow *earlier = &b->rows[j];
            if ((earlier->state == ROW_FAILED || earlier->setup_fault || earlier->cancelled) &&
                !earlier->dead_letter && same_aggregate(&earlier->row, &later->row) &&
                same_topic(&earlier->row, &later->row, per_topic_template) &&
                (!per_partition || same_partition(earlier, later))) {
                log_error("order broken: an event was delivered after an earlier event of its "
                          "aggregate failed",
                          "failed_id=%lld delivered_id=%lld aggregate_id=%s", earlier->row.id,
                          later->row.id, later->row.aggregate_id);
                breaks++;
                break;
            }
        }
    }
    return breaks;
}
