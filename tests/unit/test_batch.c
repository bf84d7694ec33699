/* Unit tests for batch: holding an aggregate after a failure, the mark parameters, and the
 * order-break check. Rows are filled in directly (no PGresult needed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "batch.h"
#include "message.h"

static void add_row(Batch *b, long long id, const char *agg, bool dead_letter)
{
    BatchRow *br = &b->rows[b->n++];
    memset(br, 0, sizeof(*br));
    br->row.id = id;
    br->row.event_id = "00000000-0000-0000-0000-000000000000";
    br->row.aggregate_type = "order";
    br->row.aggregate_id = agg;
    br->row.event_type = "Created";
    br->dead_letter = dead_letter;
}

static int setup(void **state)
{
    static Batch b;
    assert_true(batch_init(&b, 16));
    *state = &b;
    return 0;
}

static int teardown(void **state)
{
    batch_free(*state);
    return 0;
}

/* A failure holds its aggregate, and only its aggregate. */
static void test_fail_holds_aggregate(void **state)
{
    Batch *b = *state;
    add_row(b, 1, "a", false);
    add_row(b, 2, "a", false);
    add_row(b, 3, "b", false);
    assert_false(batch_is_held(b, &b->rows[1].row));
    batch_fail(b, &b->rows[0], "boom", true);
    assert_true(batch_is_held(b, &b->rows[1].row));
    assert_false(batch_is_held(b, &b->rows[2].row));
    assert_int_equal(b->failed, 1);
    batch_clear(b);
    assert_false(batch_is_held(b, &b->rows[1].row));
}

/* A failed dead-letter publication does not hold the aggregate's events. */
static void test_dead_letter_failure_does_not_hold(void **state)
{
    Batch *b = *state;
    add_row(b, 1, "a", false);
    add_row(b, 9, "a", true);
    batch_fail(b, &b->rows[1], "dlq down", false);
    assert_false(batch_is_held(b, &b->rows[0].row));
    batch_clear(b);
}

/* A bytea payload (--payload-format binary) arrives as its hex text and is published as its
 * bytes, NULs and all; text payloads stay as they are. */
static void test_bytea_payload_decoded(void **state)
{
    Batch *b = *state;
    PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    PGresAttDesc attrs[ROW_COL_PAYLOAD_BYTES];
    memset(attrs, 0, sizeof(attrs));
    for (int c = 0; c < ROW_COL_PAYLOAD_BYTES; c++) {
        attrs[c].name = (char *)"c";
        attrs[c].typid = c == ROW_COL_PAYLOAD ? 17 : 25;
        attrs[c].typlen = -1;
        attrs[c].atttypmod = -1;
    }
    assert_true(PQsetResultAttrs(res, ROW_COL_PAYLOAD_BYTES, attrs));
    const char *values[ROW_COL_PAYLOAD_BYTES] = {
        [ROW_COL_ID] = "1",           [ROW_COL_EVENT_ID] = "e",   [ROW_COL_AGGREGATE_TYPE] = "t",
        [ROW_COL_AGGREGATE_ID] = "a", [ROW_COL_EVENT_TYPE] = "x", [ROW_COL_PAYLOAD] = "\\x00ff410a",
        [ROW_COL_ATTEMPTS] = "0",     [ROW_COL_PARTITION] = "3"};
    for (int c = 0; c < ROW_COL_PAYLOAD_BYTES; c++)
        assert_true(
            PQsetvalue(res, 0, c, (char *)values[c], values[c] ? (int)strlen(values[c]) : -1));
    batch_load(b, res, NULL);
    assert_int_equal(b->n, 1);
    assert_int_equal(b->rows[0].row.payload_len, 4);
    assert_false(b->rows[0].undecodable);
    assert_memory_equal(b->rows[0].row.payload, "\x00\xff\x41\x0a", 4);
    assert_string_equal(b->rows[0].row.partition, "3");
    assert_null(b->rows[0].row.timestamp_ms);
    batch_clear(b);
    /* A text form that does not decode (odd hex) marks the row, which produce fails rather
     * than publish an empty payload. */
    res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    assert_true(PQsetResultAttrs(res, ROW_COL_PAYLOAD_BYTES, attrs));
    values[ROW_COL_PAYLOAD] = "\\x00f";
    for (int c = 0; c < ROW_COL_PAYLOAD_BYTES; c++)
        assert_true(
            PQsetvalue(res, 0, c, (char *)values[c], values[c] ? (int)strlen(values[c]) : -1));
    batch_load(b, res, NULL);
    assert_int_equal(b->n, 1);
    assert_true(b->rows[0].undecodable);
    batch_clear(b);
}

/* A batch given up while the producer still holds its messages keeps their encoded values (the
 * producer does not copy them) until batch_free: ASan fails this test on a use after free,
 * LeakSanitizer on a value never freed. */
static void test_retire_keeps_values(void **state)
{
    Batch *b = *state;
    add_row(b, 1, "a", false);
    add_row(b, 2, "b", false);
    b->rows[0].value = strdup("avro bytes");
    const char *held = b->rows[0].value; /* what librdkafka would point at */
    batch_retire(b);
    batch_clear(b);
    assert_string_equal(held, "avro bytes");
    assert_int_equal(b->n_retired_values, 1);
}

/* Headers built ahead for rows that are then never produced (held, stopping) are the batch's to
 * free: LeakSanitizer fails this test if batch_clear forgets them. */
static void test_clear_frees_unproduced_headers(void **state)
{
    Batch *b = *state;
    add_row(b, 1, "a", false);
    add_row(b, 2, "b", false);
    b->rows[0].headers = rd_kafka_headers_new(1);
    rd_kafka_header_add(b->rows[0].headers, "traceparent", -1, "00-x", -1);
    b->rows[1].headers = rd_kafka_headers_new(1);
    b->prepared = 2;
    batch_clear(b);
    assert_null(b->rows[0].headers);
    assert_null(b->rows[1].headers);
    assert_int_equal(b->prepared, 0);
}

/* Mark parameters: acked, failed (with escaped errors and classes), dead-letter outcomes; rows
 * never produced or still in flight appear nowhere. */
static void test_marks(void **state)
{
    Batch *b = *state;
    BatchMarks m = {0};
    add_row(b, 1, "a", false);
    add_row(b, 2, "b", false);
    add_row(b, 3, "c", false);
    add_row(b, 4, "d", false);
    add_row(b, 5, "e", false);
    add_row(b, 6, "f", true);
    add_row(b, 7, "g", true);
    b->rows[0].state = ROW_ACKED;
    batch_fail(b, &b->rows[1], "say \"no\"\\", true);
    batch_fail(b, &b->rows[2], "later", false);
    b->rows[3].state = ROW_PENDING;
    b->rows[4].state = ROW_QUEUED;
    b->rows[5].state = ROW_ACKED;
    batch_fail(b, &b->rows[6], "dlq", false);
    const BatchRow *first = batch_marks(b, &m);
    assert_ptr_equal(first, &b->rows[1]);
    assert_string_equal(m.sent.s, "{1}");
    assert_string_equal(m.failed_ids.s, "{2,3}");
    assert_string_equal(m.failed_errors.s, "{\"say \\\"no\\\"\\\\\",\"later\"}");
    assert_string_equal(m.failed_permanent.s, "{\"t\",\"f\"}");
    assert_string_equal(m.dl_sent.s, "{6}");
    assert_string_equal(m.dl_failed_ids.s, "{7}");
    assert_string_equal(m.dl_failed_parked.s, "{\"f\"}");
    batch_marks_free(&m);
    batch_clear(b);
}

/* An acknowledged event after a failed earlier event of its aggregate is an order break; other
 * aggregates and earlier acknowledgements are not. */
static void test_order_breaks(void **state)
{
    Batch *b = *state;
    add_row(b, 1, "a", false);
    add_row(b, 2, "a", false);
    add_row(b, 3, "b", false);
    add_row(b, 4, "a", false);
    b->rows[0].state = ROW_ACKED;
    batch_fail(b, &b->rows[1], "rejected by broker", true);
    b->rows[2].state = ROW_ACKED;
    b->rows[3].state = ROW_ACKED;
    assert_int_equal(batch_order_breaks(b, NULL, false), 1);
    b->rows[3].state = ROW_PENDING;
    assert_int_equal(batch_order_breaks(b, NULL, false), 0);
    batch_clear(b);
}

/* An event delivered after an earlier event of its aggregate was cancelled (purged as the
 * producer failed: left unsent, no attempt counted) is an order break too. */
static void test_order_breaks_after_cancelled(void **state)
{
    Batch *b = *state;
    add_row(b, 1, "a", false);
    add_row(b, 2, "a", false);
    batch_cancelled(b, &b->rows[0]);
    assert_int_equal(b->rows[0].state, ROW_PENDING);
    b->rows[1].state = ROW_ACKED;
    assert_int_equal(batch_order_breaks(b, NULL, false), 1);
    batch_clear(b);
}

/* With --order-scope topic, order is promised within each topic: a later event of the aggregate
 * in another topic is no break, one in the same topic still is. */
static void test_order_breaks_per_topic(void **state)
{
    Batch *b = *state;
    add_row(b, 1, "a", false);
    add_row(b, 2, "a", false);
    add_row(b, 3, "a", false);
    b->rows[1].row.event_type = "Shipped";
    batch_fail(b, &b->rows[0], "timed out", false);
    b->rows[1].state = ROW_ACKED;
    assert_int_equal(batch_order_breaks(b, "ev.{event_type}", false), 0);
    assert_int_equal(batch_order_breaks(b, "ev.{aggregate_type}", false), 1);
    assert_int_equal(batch_order_breaks(b, NULL, false), 1);
    b->rows[2].state = ROW_ACKED; /* Created again: the failed event's topic */
    assert_int_equal(batch_order_breaks(b, "ev.{event_type}", false), 1);
    batch_clear(b);
}

/* With --order-scope partition, order is promised within each topic and partition: a later event
 * of the aggregate acknowledged in another partition is no break; one in the same partition, or
 * one placed by its key (its partition unknown to the relay), is. */
static void test_order_breaks_per_partition(void **state)
{
    Batch *b = *state;
    add_row(b, 1, "a", false);
    add_row(b, 2, "a", false);
    b->rows[0].partition = 0;
    b->rows[1].partition = 1;
    batch_fail(b, &b->rows[0], "timed out", false);
    b->rows[1].state = ROW_ACKED;
    assert_int_equal(batch_order_breaks(b, "ev.{aggregate_type}", true), 0);
    assert_int_equal(batch_order_breaks(b, "ev.{aggregate_type}", false), 1);
    b->rows[1].partition = MESSAGE_PARTITION_ANY;
    assert_int_equal(batch_order_breaks(b, "ev.{aggregate_type}", true), 1);
    b->rows[1].partition = 0;
    assert_int_equal(batch_order_breaks(b, "ev.{aggregate_type}", true), 1);
    batch_clear(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fail_holds_aggregate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_letter_failure_does_not_hold, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bytea_payload_decoded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retire_keeps_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clear_frees_unproduced_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_marks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_breaks_per_topic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_breaks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_breaks_after_cancelled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_breaks_per_partition, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
