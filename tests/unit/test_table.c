/* Unit tests for table.c: the table and column mapping, and the statements written for it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "table.h"

/* PQescapeIdentifier needs a connection object for its encoding; one that never connected will
 * do (SQL_ASCII quoting, which is right for UTF-8 text too). */
static PGconn *conn;

static int setup(void **state)
{
    conn = PQconnectStart("host=/nonexistent-outbox-relay-test connect_timeout=1");
    return conn ? 0 : -1;
}

static int teardown(void **state)
{
    PQfinish(conn);
    return 0;
}

static void expect_sql(const TableMap *m, const char *tmpl, const char *expected)
{
    char err[256] = "";
    char *sql = table_sql(m, conn, tmpl, err, sizeof(err));
    if (!sql)
        fail_msg("table_sql(%s) failed: %s", tmpl, err);
    assert_string_equal(sql, expected);
    free(sql);
}

static void expect_init_error(const TableOptions *o, const char *fragment)
{
    TableMap m;
    char err[256] = "";
    assert_false(table_map_init(&m, o, err, sizeof(err)));
    if (!strstr(err, fragment))
        fail_msg("error \"%s\" lacks \"%s\"", err, fragment);
    assert_null(strchr(err, '\n'));
    table_map_free(&m);
}

static void test_relay_layout_is_own(void **state)
{
    TableOptions o = {.layout = LAYOUT_RELAY};
    TableMap m;
    char err[256];
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    assert_true(table_map_is_own(&m, "public"));
    assert_true(m.identity_headers);
    expect_sql(&m,
               "SELECT o.{seq}, {o.headers}, {o.extra_headers} FROM {table} o"
               " WHERE x = '{}' AND y = '{1,2}'",
               "SELECT o.\"id\", o.\"headers\"::text, NULL::text FROM \"outbox\" o"
               " WHERE x = '{}' AND y = '{1,2}'");
    /* A claim carries the headers column as stored and converts it after the byte budget's cut
     * (88_debezium_router part 7). */
    expect_sql(&m, "{o.claim_headers} {p.headers_text}", "o.\"headers\" p.stored_headers::text");
    table_map_free(&m);
}

/* --table public.outbox (or SCHEMA.outbox with --schema SCHEMA) is the relay's own table written
 * out: migrate used to take it for another table to adopt, and failed on a fresh database. */
static void test_own_table_qualified(void **state)
{
    TableMap m;
    char err[256];
    TableOptions o = {.layout = LAYOUT_RELAY, .table = "public.outbox"};
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    assert_true(table_map_is_own(&m, "public"));
    assert_true(table_map_is_own(&m, NULL));     /* no --schema: public */
    assert_false(table_map_is_own(&m, "relay")); /* public.outbox beside the relay's schema */
    table_map_free(&m);
    o.table = "relay.outbox";
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    assert_true(table_map_is_own(&m, "relay"));
    assert_false(table_map_is_own(&m, "public"));
    table_map_free(&m);
    o.table = "public.events";
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    assert_false(table_map_is_own(&m, "public"));
    table_map_free(&m);
}

static void test_debezium_layout(void **state)
{
    TableOptions o = {.layout = LAYOUT_DEBEZIUM, .additional_fields = "type:header:eventType"};
    TableMap m;
    char err[256];
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    assert_false(table_map_is_own(&m, "public"));
    assert_false(m.identity_headers);
    expect_sql(&m, "{seq} {event_id} {aggregate_type} {aggregate_id} {event_type} {payload}",
               "\"seq\" \"id\" \"aggregatetype\" \"aggregateid\" \"type\" \"payload\"");
    expect_sql(&m, "{o.headers} {o.extra_headers}",
               "NULL::text pg_catalog.json_build_object('eventType', o.\"type\"::text)::text");
    table_map_free(&m);
}

/* A connector's table.fields.additional.placement carries over as Debezium reads it: each part
 * trimmed (tabs too), the placement in any case. */
static void test_debezium_placement_spelling(void **state)
{
    TableOptions o = {.layout = LAYOUT_DEBEZIUM,
                      .additional_fields = " type : HEADER : eventType ,\tpart:Partition, "
                                           "kind :Envelope\t"};
    TableMap m;
    char err[256] = "";
    if (!table_map_init(&m, &o, err, sizeof(err))) {
        table_map_free(&m);
        fail_msg("placement refused: %s", err);
    }
    expect_sql(&m, "{o.extra_headers}",
               "pg_catalog.json_build_object('eventType', o.\"type\"::text)::text");
    assert_string_equal(m.partition, "part");
    assert_int_equal(m.n_envelope, 1);
    assert_string_equal(m.envelope[0].column, "kind");
    assert_string_equal(m.envelope[0].header, "kind");
    table_map_free(&m);
}

/* The claims read created_at as text only when the messages carry the event's time: each claim
 * result held while its batch is in flight would otherwise carry 29 bytes a row for nothing. */
static void test_created_at_text_only_for_event_time(void **state)
{
    TableOptions o = {.layout = LAYOUT_RELAY};
    TableMap m;
    char err[256];
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    expect_sql(&m, "{o.created_at_text}", "NULL::text");
    table_map_free(&m);
    o.event_time = true;
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    expect_sql(
        &m, "{o.created_at_text}",
        "pg_catalog.to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')");
    table_map_free(&m);
}

static void test_quoting(void **state)
{
    TableOptions o = {.layout = LAYOUT_RELAY,
                      .table = "App.Out\"box",
                      .aggregate_id_column = "Key; DROP TABLE x",
                      .additional_fields = " a b:header:it's , c:header"};
    TableMap m;
    char err[256], buf[64];
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    assert_false(table_map_is_own(&m, "public"));
    assert_string_equal(table_map_display(&m, buf, sizeof(buf)), "App.Out\"box");
    expect_sql(&m, "{table} {aggregate_id} {unsent_idx}",
               "\"App\".\"Out\"\"box\" \"Key; DROP TABLE x\" \"Out\"\"box_unsent_idx\"");
    /* As string literals, for migrate's check that each index is the table's own. */
    assert_null(table_sql(&m, conn, "{retry_idx_texts}", err, sizeof(err)));
    expect_sql(&m, "{seq_idx_text} {sent_idx_text}", "'Out\"box_seq_idx' 'Out\"box_sent_at_idx'");
    expect_sql(&m, "{o.extra_headers}",
               "pg_catalog.json_build_object('it''s', o.\"a b\"::text, 'c', o.\"c\"::text)::text");
    /* A claim carries the fields as stored and builds their object after the byte budget's cut
     * (88_debezium_router part 7): the same text, from the claim's own names for them. */
    expect_sql(&m, "{o.extra_header_columns}|{extra_header_names}|0{r.extra_header_bytes}",
               ", o.\"a b\", o.\"c\"|, extra_header_1, extra_header_2|0 + "
               "coalesce(pg_catalog.pg_column_size(r.extra_header_1), 0) + "
               "coalesce(pg_catalog.pg_column_size(r.extra_header_2), 0)");
    expect_sql(&m, "{p.extra_headers_text}",
               "pg_catalog.json_build_object('it''s', p.extra_header_1::text, 'c', "
               "p.extra_header_2::text)::text");
    table_map_free(&m);
}

static void test_headers_none(void **state)
{
    TableOptions o = {.layout = LAYOUT_RELAY, .headers_column = "none"};
    TableMap m;
    char err[256] = "";
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    assert_null(m.headers);
    expect_sql(&m, "{o.headers}", "NULL::text");
    expect_sql(&m, "{o.claim_headers} {p.headers_text}", "NULL::text NULL::text");
    expect_sql(&m,
               "{o.extra_header_columns}|{extra_header_names}|{r.extra_header_bytes}|"
               "{p.extra_headers_text}",
               "|||NULL::text");
    assert_null(table_sql(&m, conn, "{headers}", err, sizeof(err)));
    assert_null(table_sql(&m, conn, "{nonsense}", err, sizeof(err)));
    assert_non_null(strstr(err, "unknown placeholder {nonsense}"));
    table_map_free(&m);
}

static void test_bad_options(void **state)
{
    char long_name[80];
    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    expect_init_error(&(TableOptions){.table = "a.b.c"}, "expected NAME or SCHEMA.NAME");
    expect_init_error(&(TableOptions){.table = ".b"}, "empty name");
    expect_init_error(&(TableOptions){.payload_column = long_name}, "longer than 63 bytes");
    expect_init_error(&(TableOptions){.additional_fields = "type"}, "expected COLUMN:header");
    expect_init_error(&(TableOptions){.additional_fields = "a:header:b:c"},
                      "expected COLUMN:header");
    expect_init_error(&(TableOptions){.additional_fields = "type:offset"}, "placement 'offset'");
    expect_init_error(&(TableOptions){.additional_fields = "a:partition, b:partition"},
                      "a second partition column");
    expect_init_error(&(TableOptions){.additional_fields = "a:partition:p"},
                      "expected COLUMN:partition (no name)");
    expect_init_error(&(TableOptions){.additional_fields = "a:envelope:payload"},
                      "is the payload's own");
    expect_init_error(&(TableOptions){.additional_fields = "a:envelope", .payload_binary = true},
                      "needs a text payload");
    expect_init_error(&(TableOptions){.additional_fields = "type:header:event_type"},
                      "set by the relay itself");
    /* Names every message would drop (route_header_reserved): refused, not accepted unsent. */
    const char *dropped[] = {"ID", "Id", "dlq.error", "DLQ.x"};
    for (size_t i = 0; i < sizeof(dropped) / sizeof(dropped[0]); i++) {
        char spec[64];
        snprintf(spec, sizeof(spec), "type:header:%s", dropped[i]);
        expect_init_error(&(TableOptions){.layout = LAYOUT_DEBEZIUM, .additional_fields = spec},
                          "set by the relay itself");
    }
    /* With CloudEvents its attributes' names too (route_cloudevents_add replaces them), in any
     * case; without it they are names like any other. */
    const char *ce[] = {"ce_type", "CE_ID", "Content-Type", "ce_time"};
    for (size_t i = 0; i < sizeof(ce) / sizeof(ce[0]); i++) {
        char spec[64];
        snprintf(spec, sizeof(spec), "type:header:%s", ce[i]);
        expect_init_error(&(TableOptions){.layout = LAYOUT_DEBEZIUM,
                                          .additional_fields = spec,
                                          .cloudevents = true},
                          "set by the relay itself");
        TableMap plain;
        char why[256] = "";
        if (!table_map_init(&plain,
                            &(TableOptions){.layout = LAYOUT_DEBEZIUM, .additional_fields = spec},
                            why, sizeof(why)))
            fail_msg("%s refused without CloudEvents: %s", spec, why);
        table_map_free(&plain);
    }
    expect_init_error(
        &(TableOptions){.layout = LAYOUT_DEBEZIUM, .additional_fields = "a:header:x, b:header:x"},
        "named twice");
    expect_init_error(&(TableOptions){.additional_fields = ":header"}, "empty name");
}

/* Debezium's other placements and the message timestamp: what the claims read for them. */
static void test_router_placements(void **state)
{
    TableOptions o = {.layout = LAYOUT_DEBEZIUM,
                      .additional_fields = "type:header:eventType, type:envelope:eventType, "
                                           "part:partition, tenant:envelope",
                      .timestamp_column = "occurred_at"};
    TableMap m;
    char err[256];
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    assert_int_equal(m.n_extra, 1);
    assert_int_equal(m.n_envelope, 2);
    assert_string_equal(m.partition, "part");
    /* As Debezium's default: a NULL payload is null in the envelope, not a tombstone. */
    expect_sql(&m, "{o.payload}",
               "pg_catalog.json_build_object('payload', o.\"payload\", 'eventType', o.\"type\", "
               "'tenant', o.\"tenant\")");
    expect_sql(&m, "{o.partition}", "o.\"part\"::text");
    expect_sql(
        &m, "{o.timestamp_ms}",
        "CASE WHEN pg_catalog.isfinite(o.\"occurred_at\") THEN pg_catalog.floor(extract(epoch FROM "
        "o.\"occurred_at\") * 1000::numeric)::bigint::text ELSE o.\"occurred_at\"::text END");
    /* A claim builds the envelope after the byte budget's cut by stored sizes, from the payload
     * and the fields as stored (88_debezium_router part 6): the row carries them unconverted. */
    expect_sql(&m, "{o.claim_payload}{o.envelope_columns}",
               "o.\"payload\", o.\"type\", o.\"tenant\"");
    expect_sql(&m, "msg_partition{envelope_names}", "msg_partition, envelope_1, envelope_2");
    expect_sql(&m, "0{r.envelope_bytes}",
               "0 + coalesce(pg_catalog.pg_column_size(r.envelope_1), 0) + "
               "coalesce(pg_catalog.pg_column_size(r.envelope_2), 0)");
    expect_sql(&m, "{p.payload_text}",
               "pg_catalog.json_build_object('payload', p.payload, 'eventType', p.envelope_1, "
               "'tenant', p.envelope_2)::text");
    expect_sql(&m, "{s.payload_hex_extra}", "0::bigint");
    table_map_free(&m);

    /* route.tombstone.on.empty.payload: a NULL or blank payload is a tombstone. */
    o.tombstone_on_empty = true;
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    /* ...tested without converting a json or jsonb payload (never blank), and a text one by its
     * first 64 characters first (a slice of its TOAST): the claim runs it on rows the byte
     * budget then leaves out (88_debezium_router part 5). */
    expect_sql(&m, "{o.payload}",
               "CASE WHEN o.\"payload\" IS NULL OR (pg_catalog.pg_typeof(o.\"payload\") <> ALL "
               "('{pg_catalog.json,pg_catalog.jsonb}'::pg_catalog.regtype[]) AND "
               "pg_catalog.substr(o.\"payload\"::text, 1, 64) !~ '[^\\x01-\\x20]' AND "
               "o.\"payload\"::text !~ '[^\\x01-\\x20]') THEN NULL ELSE "
               "pg_catalog.json_build_object('payload', o.\"payload\", 'eventType', o.\"type\", "
               "'tenant', o.\"tenant\") END");
    /* A claim tests the payload as stored, and a tombstone's envelope is not built. */
    expect_sql(&m, "{o.claim_payload}",
               "CASE WHEN o.\"payload\" IS NULL OR (pg_catalog.pg_typeof(o.\"payload\") <> ALL "
               "('{pg_catalog.json,pg_catalog.jsonb}'::pg_catalog.regtype[]) AND "
               "pg_catalog.substr(o.\"payload\"::text, 1, 64) !~ '[^\\x01-\\x20]' AND "
               "o.\"payload\"::text !~ '[^\\x01-\\x20]') THEN NULL ELSE o.\"payload\" END");
    expect_sql(&m, "{p.payload_text}",
               "CASE WHEN p.payload IS NULL THEN NULL ELSE pg_catalog.json_build_object('payload', "
               "p.payload, 'eventType', p.envelope_1, 'tenant', p.envelope_2)::text END");
    table_map_free(&m);

    TableOptions plain = {.layout = LAYOUT_RELAY, .payload_binary = true};
    assert_true(table_map_init(&m, &plain, err, sizeof(err)));
    expect_sql(&m, "{o.payload} {p.payload_text} {o.partition} {o.timestamp_ms}",
               "o.\"payload\" p.payload NULL::text NULL::text");
    /* Without envelope fields the claim carries nothing more. */
    expect_sql(&m, "{o.claim_payload}|{o.envelope_columns}|{envelope_names}|{r.envelope_bytes}",
               "o.\"payload\"|||");
    table_map_free(&m);
    /* A bytea payload is never blank to Debezium: only its NULL is a tombstone. */
    plain.tombstone_on_empty = true;
    assert_true(table_map_init(&m, &plain, err, sizeof(err)));
    expect_sql(&m, "{o.payload}",
               "CASE WHEN o.\"payload\" IS NULL THEN NULL ELSE o.\"payload\" END");
    /* The budget counts a bytea payload as the result holds it: hex, \x and two digits a byte. */
    expect_sql(&m, "{s.payload_hex_extra}",
               "coalesce(pg_catalog.octet_length(s.text) + 2, 0)::bigint");
    table_map_free(&m);
}

static void test_debezium_may_name_event_type_header(void **state)
{
    /* Without the relay's own identity headers, only id is reserved. */
    TableOptions o = {.layout = LAYOUT_DEBEZIUM, .additional_fields = "type:header:event_type"};
    TableMap m;
    char err[256];
    assert_true(table_map_init(&m, &o, err, sizeof(err)));
    assert_int_equal(m.n_extra, 1);
    table_map_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relay_layout_is_own),
        cmocka_unit_test(test_own_table_qualified),
        cmocka_unit_test(test_debezium_layout),
        cmocka_unit_test(test_created_at_text_only_for_event_time),
        cmocka_unit_test(test_quoting),
        cmocka_unit_test(test_headers_none),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_debezium_may_name_event_type_header),
        cmocka_unit_test(test_router_placements),
        cmocka_unit_test(test_debezium_placement_spelling),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
