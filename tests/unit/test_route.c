/* Unit tests for route.c: topic templates, topic names and message headers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ctype.h>

#include "route.h"

#define DEFAULT_TEMPLATE "outbox.event.{aggregate_type}"

static OutboxRow make_row(const char *aggregate_type, const char *event_type, const char *headers)
{
    OutboxRow row = {
        .id = 42,
        .event_id = "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01",
        .aggregate_type = aggregate_type,
        .aggregate_id = "order-17",
        .event_type = event_type,
        .payload = "{\"total\":3}",
        .payload_len = 11,
        .headers = headers,
    };
    return row;
}

static void assert_err_line(const char *err, const char *needle)
{
    assert_true(strlen(err) > 0);
    assert_null(strchr(err, '\n'));
    if (needle && !strstr(err, needle))
        fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
}

/* ---- route_template_check -------------------------------------------------------------- */

static void test_template_default_ok(void **state)
{
    char err[256] = "";
    assert_true(route_template_check(DEFAULT_TEMPLATE, true, err, sizeof(err)));
    assert_string_equal(err, "");
}

static void test_template_placeholders_ok(void **state)
{
    char err[256] = "";
    assert_true(route_template_check("{event_type}", true, err, sizeof(err)));
    assert_true(route_template_check("{aggregate_type}", true, err, sizeof(err)));
    assert_true(
        route_template_check("app_1.{aggregate_type}-{event_type}.v2", true, err, sizeof(err)));
    assert_true(route_template_check("fixed-topic", true, err, sizeof(err)));
}

/* Issue 21: {event_type} spreads an aggregate over topics, so it needs --order-scope topic. */
static void test_template_event_type_needs_topic_scope(void **state)
{
    char err[512] = "";
    assert_false(route_template_check("ev.{event_type}", false, err, sizeof(err)));
    assert_non_null(strstr(err, "--order-scope topic"));
    assert_false(route_template_check("e.{aggregate_type}.{event_type}", false, err, sizeof(err)));
    assert_true(route_template_check("e.{aggregate_type}", false, err, sizeof(err)));
    assert_true(route_template_check("outbox.event.${routedByValue}", false, err, sizeof(err)));
    assert_true(route_template_check("ev.{event_type}", true, err, sizeof(err)));
}

static void test_template_unknown_placeholder(void **state)
{
    char err[256] = "";
    assert_false(route_template_check("{nope}", true, err, sizeof(err)));
    assert_err_line(err, "{nope}");
    assert_err_line(err, "placeholder");

    err[0] = '\0';
    assert_false(route_template_check("outbox.{aggregate_type", true, err, sizeof(err)));
    assert_err_line(err, "placeholder");

    err[0] = '\0';
    assert_false(route_template_check("outbox.{Event_Type}", true, err, sizeof(err)));
    assert_err_line(err, "placeholder");
}

static void test_template_illegal_literal(void **state)
{
    char err[256] = "";
    assert_false(route_template_check("bad topic!", true, err, sizeof(err)));
    assert_err_line(err, "bad topic!");
    assert_err_line(err, "[a-zA-Z0-9._-]");

    err[0] = '\0';
    assert_false(route_template_check("a/{event_type}", true, err, sizeof(err)));
    assert_err_line(err, NULL);

    err[0] = '\0';
    assert_false(route_template_check("", true, err, sizeof(err)));
    assert_err_line(err, "empty");
}

/* Issue 46 item 8: a template that can expand to the dead-letter topic's name lets a writer put
 * events among the dead letters. */
static void test_template_reaches_dead_letter_topic(void **state)
{
    char err[512] = "";
    assert_false(route_dead_letter_check("{aggregate_type}", "dlq", err, sizeof(err)));
    assert_non_null(strstr(err, "dead-letter topic 'dlq'"));
    assert_null(strchr(err, '\n'));
    assert_false(
        route_dead_letter_check("events.{aggregate_type}", "events.dead", err, sizeof(err)));
    assert_false(route_dead_letter_check("${routedByValue}.out", "dlq.out", err, sizeof(err)));
    assert_false(
        route_dead_letter_check("a{event_type}b{aggregate_type}c", "ab.c", err, sizeof(err)));
    assert_false(route_dead_letter_check("fixed", "fixed", err, sizeof(err)));
    assert_true(route_dead_letter_check(DEFAULT_TEMPLATE, "dlq", err, sizeof(err)));
    assert_true(
        route_dead_letter_check("events.{aggregate_type}", "dead.events", err, sizeof(err)));
    assert_true(route_dead_letter_check("fixed", "fixed2", err, sizeof(err)));
    assert_true(route_dead_letter_check("{aggregate_type}", NULL, err, sizeof(err)));
}

static void test_template_length(void **state)
{
    char tmpl[300], err[256] = "";
    memset(tmpl, 'a', 249);
    tmpl[249] = '\0';
    assert_true(route_template_check(tmpl, true, err, sizeof(err)));
    tmpl[249] = 'a';
    tmpl[250] = '\0';
    assert_false(route_template_check(tmpl, true, err, sizeof(err)));
    assert_err_line(err, "249");
    memset(tmpl, 'a', 299);
    tmpl[299] = '\0';
    err[0] = '\0';
    assert_false(route_template_check(tmpl, true, err, sizeof(err)));
    assert_err_line(err, "249");
}

/* The template is echoed in the error; a newline in it must not break the one-line error. */
static void test_template_error_is_one_line(void **state)
{
    char err[256] = "";
    assert_false(route_template_check("a\nb", true, err, sizeof(err)));
    assert_err_line(err, "[a-zA-Z0-9._-]");
}

/* ---- route_topic ----------------------------------------------------------------------- */

static void test_topic_default_template(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated", NULL);
    char out[ROUTE_TOPIC_MAX + 1], err[256] = "";
    assert_true(route_topic(DEFAULT_TEMPLATE, &row, out, sizeof(out), err, sizeof(err)));
    assert_string_equal(out, "outbox.event.Order");
}

static void test_topic_both_placeholders(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated", NULL);
    char out[ROUTE_TOPIC_MAX + 1], err[256] = "";
    assert_true(route_topic("app.{aggregate_type}.{event_type}.{aggregate_type}-v1", &row, out,
                            sizeof(out), err, sizeof(err)));
    assert_string_equal(out, "app.Order.OrderCreated.Order-v1");

    assert_true(route_topic("{event_type}", &row, out, sizeof(out), err, sizeof(err)));
    assert_string_equal(out, "OrderCreated");

    assert_true(route_topic("fixed_topic", &row, out, sizeof(out), err, sizeof(err)));
    assert_string_equal(out, "fixed_topic");
}

static void test_topic_illegal_characters(void **state)
{
    const char *bad[] = {"my order", "a/b", "Bestellung\xc3\xa4", "x:y", "a\tb", "a\nb", "a*"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        OutboxRow row = make_row(bad[i], "Created", NULL);
        char out[ROUTE_TOPIC_MAX + 1], err[256] = "";
        if (route_topic(DEFAULT_TEMPLATE, &row, out, sizeof(out), err, sizeof(err)))
            fail_msg("aggregate_type \"%s\" accepted as topic \"%s\"", bad[i], out);
        assert_true(strlen(err) > 0);
        assert_non_null(strstr(err, "outside [a-zA-Z0-9._-]"));
    }
}

static void test_topic_illegal_in_event_type(void **state)
{
    OutboxRow row = make_row("Order", "order created", NULL);
    char out[ROUTE_TOPIC_MAX + 1], err[256] = "";
    assert_false(
        route_topic("{aggregate_type}.{event_type}", &row, out, sizeof(out), err, sizeof(err)));
    assert_err_line(err, "offset 11");
}

static void test_topic_empty(void **state)
{
    OutboxRow row = make_row("Order", "", NULL);
    char out[ROUTE_TOPIC_MAX + 1], err[256] = "";
    assert_false(route_topic("{event_type}", &row, out, sizeof(out), err, sizeof(err)));
    assert_err_line(err, "empty");

    row = make_row("", "", NULL);
    err[0] = '\0';
    assert_false(
        route_topic("{aggregate_type}{event_type}", &row, out, sizeof(out), err, sizeof(err)));
    assert_err_line(err, "empty");
}

static void test_topic_dot_names(void **state)
{
    const char *bad[] = {".", ".."};
    for (size_t i = 0; i < 2; i++) {
        OutboxRow row = make_row(bad[i], "E", NULL);
        char out[ROUTE_TOPIC_MAX + 1], err[256] = "";
        assert_false(route_topic("{aggregate_type}", &row, out, sizeof(out), err, sizeof(err)));
        assert_err_line(err, "not allowed");
    }
    /* "..." is a legal (if odd) topic name */
    OutboxRow row = make_row("...", "E", NULL);
    char out[ROUTE_TOPIC_MAX + 1], err[256] = "";
    assert_true(route_topic("{aggregate_type}", &row, out, sizeof(out), err, sizeof(err)));
    assert_string_equal(out, "...");
}

static void test_topic_length_limit(void **state)
{
    char agg[400];
    char out[ROUTE_TOPIC_MAX + 1], err[256];

    /* exactly 249 characters through a placeholder alone */
    memset(agg, 'A', 249);
    agg[249] = '\0';
    OutboxRow row = make_row(agg, "E", NULL);
    assert_true(route_topic("{aggregate_type}", &row, out, sizeof(out), err, sizeof(err)));
    assert_int_equal(strlen(out), 249);
    assert_string_equal(out, agg);

    /* exactly 249 with the default prefix ("outbox.event." is 13 characters) */
    agg[236] = '\0';
    row = make_row(agg, "E", NULL);
    assert_true(route_topic(DEFAULT_TEMPLATE, &row, out, sizeof(out), err, sizeof(err)));
    assert_int_equal(strlen(out), 249);
    assert_memory_equal(out, "outbox.event.AAA", 16);

    /* 250 */
    memset(agg, 'A', 237);
    agg[237] = '\0';
    row = make_row(agg, "E", NULL);
    err[0] = '\0';
    assert_false(route_topic(DEFAULT_TEMPLATE, &row, out, sizeof(out), err, sizeof(err)));
    assert_err_line(err, "longer than 249");

    /* far over: the expansion itself must stop without overrunning */
    memset(agg, 'A', 399);
    agg[399] = '\0';
    row = make_row(agg, "E", NULL);
    err[0] = '\0';
    assert_false(
        route_topic("{aggregate_type}.{event_type}", &row, out, sizeof(out), err, sizeof(err)));
    assert_err_line(err, "longer than 249");
}

static void test_topic_small_out_buffer(void **state)
{
    OutboxRow row = make_row("Order", "E", NULL);
    char out[8], err[256] = "";
    assert_false(route_topic(DEFAULT_TEMPLATE, &row, out, sizeof(out), err, sizeof(err)));
    assert_err_line(err, NULL);
    assert_true(route_topic("{aggregate_type}", &row, out, sizeof(out), err, sizeof(err)));
    assert_string_equal(out, "Order");
}

/* ---- route_headers --------------------------------------------------------------------- */

/* Header idx must be name with value (NULL for a null value). */
static void assert_header(const rd_kafka_headers_t *hdrs, size_t idx, const char *name,
                          const char *value)
{
    const char *got_name = NULL;
    const void *got_value = NULL;
    size_t got_size = 12345;
    assert_int_equal(rd_kafka_header_get_all(hdrs, idx, &got_name, &got_value, &got_size),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
    assert_string_equal(got_name, name);
    if (!value) {
        assert_null(got_value);
        assert_int_equal(got_size, 0);
        return;
    }
    assert_non_null(got_value);
    if (got_size != strlen(value) || memcmp(got_value, value, got_size) != 0)
        fail_msg("header %zu (%s) is \"%.*s\", expected \"%s\"", idx, name, (int)got_size,
                 (const char *)got_value, value);
}

static void assert_last(const rd_kafka_headers_t *hdrs, const char *name, const char *value)
{
    const void *got_value = NULL;
    size_t got_size = 0;
    assert_int_equal(rd_kafka_header_get_last(hdrs, name, &got_value, &got_size),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
    assert_int_equal(got_size, strlen(value));
    assert_memory_equal(got_value, value, got_size);
}

static void test_headers_null_column(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated", NULL);
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
    assert_non_null(hdrs);
    assert_int_equal(rd_kafka_header_cnt(hdrs), 3);
    assert_header(hdrs, 0, "id", "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01");
    assert_header(hdrs, 1, "event_type", "OrderCreated");
    assert_header(hdrs, 2, "aggregate_type", "Order");
    assert_last(hdrs, "id", "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01");
    rd_kafka_headers_destroy(hdrs);
}

static void test_headers_empty_object(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated", "{}");
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
    assert_non_null(hdrs);
    assert_int_equal(rd_kafka_header_cnt(hdrs), 3);
    assert_header(hdrs, 0, "id", "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01");
    rd_kafka_headers_destroy(hdrs);
}

static void test_headers_order_and_values(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated",
                             "{\"traceparent\": \"00-abc-01\", \"tenant\": \"t1\","
                             " \"utf8\": \"caf\\u00e9\"}");
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
    assert_non_null(hdrs);
    assert_int_equal(rd_kafka_header_cnt(hdrs), 6);
    assert_header(hdrs, 0, "traceparent", "00-abc-01");
    assert_header(hdrs, 1, "tenant", "t1");
    assert_header(hdrs, 2, "utf8", "caf\xc3\xa9");
    assert_header(hdrs, 3, "id", "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01");
    assert_header(hdrs, 4, "event_type", "OrderCreated");
    assert_header(hdrs, 5, "aggregate_type", "Order");
    assert_last(hdrs, "tenant", "t1");
    assert_last(hdrs, "aggregate_type", "Order");
    rd_kafka_headers_destroy(hdrs);
}

/* Reserved names are compared ignoring case, and the relay's dlq. prefix is reserved too: a
 * row cannot put an `ID`, `Event_Type` or `dlq.error` beside (or before) the relay's own. */
static void test_headers_reserved_dropped(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated",
                             "{\"id\": \"spoof\", \"a\": \"1\", \"event_type\": \"spoof\","
                             " \"aggregate_type\": {\"x\": 1}, \"ID\": \"spoof\","
                             " \"Event_Type\": \"spoof\", \"AGGREGATE_TYPE\": \"spoof\","
                             " \"dlq.error\": \"spoof\", \"DLQ.Attempts\": \"spoof\","
                             " \"dlq\": \"kept\", \"idx\": \"kept\"}");
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
    assert_non_null(hdrs);
    assert_int_equal(rd_kafka_header_cnt(hdrs), 6);
    assert_header(hdrs, 0, "a", "1");
    assert_header(hdrs, 1, "dlq", "kept");
    assert_header(hdrs, 2, "idx", "kept");
    assert_header(hdrs, 3, "id", "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01");
    assert_header(hdrs, 4, "event_type", "OrderCreated");
    assert_header(hdrs, 5, "aggregate_type", "Order");
    /* no trace of the spoofed values under any name */
    for (size_t i = 0; i < rd_kafka_header_cnt(hdrs); i++) {
        const char *name;
        const void *value;
        size_t size;
        assert_int_equal(rd_kafka_header_get_all(hdrs, i, &name, &value, &size), 0);
        assert_false(size == 5 && memcmp(value, "spoof", 5) == 0);
    }
    rd_kafka_headers_destroy(hdrs);
}

static void test_header_reserved_names(void **state)
{
    assert_true(route_header_reserved("id", false));
    assert_true(route_header_reserved("Id", false));
    assert_true(route_header_reserved("dlq.original_topic", false));
    assert_true(route_header_reserved("Dlq.X", false));
    assert_false(route_header_reserved("event_type", false)); /* Debezium style: the row's own */
    assert_true(route_header_reserved("EVENT_TYPE", true));
    assert_false(route_header_reserved("dlq", true));
    assert_false(route_header_reserved("ids", true));
}

/* Issue 46: names a consumer reads as a reserved one although the bytes differ. Java's
 * equalsIgnoreCase matches U+0130 (İ) and U+0131 (ı) to i, U+212A (Kelvin sign) to k and U+017F
 * (long s) to s; invisible and format characters (zero-width space, soft hyphen, bidi marks) and
 * confusable letters from other scripts (Cyrillic е, Greek ο, fullwidth forms) make a name that
 * looks the same to a person. Since the row's headers come before the relay's, a consumer taking
 * the first match would read the row's value: all of these are dropped. */
static void test_header_reserved_unicode(void **state)
{
    const char *reserved[] = {
        "\xc4\xb0"
        "d", /* İd */
        "\xc4\xb1"
        "d",              /* ıd */
        "i\xc4\x8f",      /* iď: any non-ASCII letter in a reserved shape */
        "id\xe2\x80\x8b", /* id + zero-width space */
        "\xe2\x80\x8bid", /* zero-width space + id */
        "i\xc2\xad"
        "d", /* i, soft hyphen, d */
        "i\xcc\x87"
        "d",                        /* i + combining dot above + d */
        "id\xe2\x80\x8e",           /* id + left-to-right mark */
        "\xef\xbd\x89\xef\xbd\x84", /* fullwidth ｉｄ */
        "aggregate_typ\xd0\xb5",    /* Cyrillic е */
        "ev\xd0\xb5nt_type",        /* Cyrillic е */
        "event_typ\xce\xb5",        /* Greek ε */
        "dlq\xe2\x80\xa4x",         /* one dot leader for the '.' */
        "\xd4\x81lq.error",         /* Cyrillic ԁ */
        "id\xef\xbb\xbf",           /* id + BOM */
        "\xf0\x9d\x90\xa2"
        "d", /* mathematical bold i + d */
    };
    for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
        if (!route_header_reserved(reserved[i], true))
            fail_msg("header name \"%s\" (#%zu) not treated as reserved", reserved[i], i);
    /* ordinary names, ASCII or not, stay the row's own */
    assert_false(route_header_reserved("caf\xc3\xa9", true));
    assert_false(route_header_reserved("\xc3\xa9v\xc3\xa9nement", true));
    assert_false(route_header_reserved("\xe6\x97\xa5\xe6\x9c\xac", true));
    assert_false(route_header_reserved("traceparent", true));
    assert_false(route_header_reserved("idd", true));
}

/* Names no legitimate producer writes — control characters, invisible or bidi formatting, invalid
 * UTF-8 — are dropped whatever they spell: they exist to look like something else. */
static void test_header_names_with_invisible_characters(void **state)
{
    const char *bad[] = {
        "trace\xe2\x80\x8bparent", "tenant\xe2\x80\xae", "a\x1b[31m", "a\nb", "x\xff",
        "tenant\xc2\x85"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (!route_header_reserved(bad[i], false))
            fail_msg("header name #%zu with an invisible or control character kept", i);
}

/* End to end: none of the forged names reaches the message; the relay's id comes first among
 * the names a Java consumer matches to "id". */
static void test_headers_unicode_spoof_dropped(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated",
                             "{\"\\u0130d\": \"spoof\", \"\\u0131d\": \"spoof\","
                             " \"id\\u200b\": \"spoof\", \"aggregate_typ\\u0435\": \"spoof\","
                             " \"tenant\": \"t1\"}");
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
    assert_non_null(hdrs);
    assert_int_equal(rd_kafka_header_cnt(hdrs), 4);
    assert_header(hdrs, 0, "tenant", "t1");
    assert_header(hdrs, 1, "id", "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01");
    rd_kafka_headers_destroy(hdrs);
}

/* headers_json N: a JSON object of N entries "hI": "v". The caller frees it. */
static char *headers_json(int n)
{
    char *s = malloc((size_t)n * 16 + 3);
    size_t o = 0;
    s[o++] = '{';
    for (int i = 0; i < n; i++)
        o += (size_t)sprintf(s + o, "%s\"h%d\":\"v\"", i ? "," : "", i);
    s[o++] = '}';
    s[o] = '\0';
    return s;
}

static void test_headers_count_limit(void **state)
{
    char *at_limit = headers_json(ROUTE_HEADERS_MAX);
    OutboxRow row = make_row("Order", "OrderCreated", at_limit);
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
    assert_non_null(hdrs);
    assert_int_equal(rd_kafka_header_cnt(hdrs), ROUTE_HEADERS_MAX + 3);
    rd_kafka_headers_destroy(hdrs);
    free(at_limit);

    char *many = headers_json(10000);
    row = make_row("Order", "OrderCreated", many);
    assert_null(route_headers(&row, true, err, sizeof(err)));
    assert_string_equal(err, "headers: 10000 entries, more than the limit of 100");
    free(many);

    /* the limit holds for the row's headers and its additional fields together */
    char *half = headers_json(60);
    row = make_row("Order", "OrderCreated", half);
    row.extra_headers = half;
    assert_null(route_headers(&row, true, err, sizeof(err)));
    assert_string_equal(err, "headers: 120 entries, more than the limit of 100");
    free(half);
}

static void test_headers_bytes_limit(void **state)
{
    size_t n = ROUTE_HEADERS_MAX_BYTES + 10;
    char *json = malloc(n + 16);
    strcpy(json, "{\"big\":\"");
    memset(json + 8, 'x', n);
    strcpy(json + 8 + n, "\"}");
    OutboxRow row = make_row("Order", "OrderCreated", json);
    char err[256] = "";
    assert_null(route_headers(&row, true, err, sizeof(err)));
    assert_string_equal(err, "headers: more than the limit of 65536 bytes (names and values)");
    /* the dead-letter headers still carry the identity and the error */
    rd_kafka_headers_t *dlq = route_dead_letter_headers(&row, true, err, 1, "outbox.event.Order");
    assert_non_null(dlq);
    assert_last(dlq, "id", "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01");
    assert_last(dlq, "dlq.error", err);
    rd_kafka_headers_destroy(dlq);
    free(json);
}

/* route.c reads the usual headers column (a flat object of plain ASCII strings) without jansson,
 * and hands every other text to jansson: each pair below is the same object, once in the flat
 * shape and once with an escape (\u0031 is "1") that only jansson reads; the headers must be the
 * same, entry by entry. The texts jansson rejects must be rejected whatever the flat reader
 * made of their start. */
static void assert_same_headers(const char *flat, const char *escaped)
{
    char err[256] = "";
    OutboxRow a = make_row("Order", "OrderCreated", flat);
    OutboxRow b = make_row("Order", "OrderCreated", escaped);
    rd_kafka_headers_t *ha = route_headers(&a, true, err, sizeof(err));
    rd_kafka_headers_t *hb = route_headers(&b, true, err, sizeof(err));
    assert_non_null(ha);
    assert_non_null(hb);
    assert_int_equal(rd_kafka_header_cnt(ha), rd_kafka_header_cnt(hb));
    for (size_t i = 0; i < rd_kafka_header_cnt(ha); i++) {
        const char *na, *nb;
        const void *va, *vb;
        size_t sa, sb;
        assert_int_equal(rd_kafka_header_get_all(ha, i, &na, &va, &sa), 0);
        assert_int_equal(rd_kafka_header_get_all(hb, i, &nb, &vb, &sb), 0);
        assert_string_equal(na, nb);
        assert_int_equal(sa, sb);
        assert_memory_equal(va, vb, sa);
    }
    rd_kafka_headers_destroy(ha);
    rd_kafka_headers_destroy(hb);
}

static void test_headers_flat_same_as_jansson(void **state)
{
    assert_same_headers("{\"traceparent\": \"00-abc-01\"}",
                        "{\"traceparent\": \"00-abc-0\\u0031\"}");
    assert_same_headers(
        " {\n\t\"a\" : \"1\" ,\r\"ID\":\"x\", \"dlq.x\": \"y\", \"\": \"e\", \"s\": \"\"} ",
        "{\"a\":\"\\u0031\",\"ID\":\"x\",\"dlq.x\":\"y\",\"\":\"e\",\"s\":\"\"}");
    assert_same_headers("{}", " { } ");
    /* a name twice: jansson keeps the last value in the first one's place */
    assert_same_headers("{\"a\":\"0\",\"b\":\"2\",\"a\":\"1\"}", "{\"a\":\"\\u0031\",\"b\":\"2\"}");
    char err[256];
    static const char *const bad[] = {"{\"a\":\"b\"} x",
                                      "{\"a\":\"b\",}",
                                      "{\"a\":\"b\"",
                                      "{\"a\" \"b\"}",
                                      "[\"a\"]",
                                      "{\"a\":\"b\" \"c\":\"d\"}",
                                      ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        OutboxRow row = make_row("Order", "OrderCreated", bad[i]);
        err[0] = '\0';
        rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
        if (hdrs)
            fail_msg("headers column '%s' was taken", bad[i]);
        assert_err_line(err, "headers column is not a JSON object");
    }
    /* the count limit holds across the two objects when the second one is read flat */
    char *many = headers_json(90), *flat = headers_json(16);
    OutboxRow row = make_row("Order", "OrderCreated", many);
    row.extra_headers = flat;
    assert_null(route_headers(&row, true, err, sizeof(err)));
    assert_string_equal(err, "headers: 106 entries, more than the limit of 100");
    free(many);
    free(flat);
}

static void test_headers_non_string_values(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated",
                             "{\"n\": 42, \"neg\": -7, \"f\": 1.5, \"t\": true, \"fl\": false,"
                             " \"obj\": {\"a\": 1, \"b\": [1, 2, \"x y\"]}, \"arr\": [ ],"
                             " \"none\": null, \"s\": \"\"}");
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
    assert_non_null(hdrs);
    assert_int_equal(rd_kafka_header_cnt(hdrs), 12);
    assert_header(hdrs, 0, "n", "42");
    assert_header(hdrs, 1, "neg", "-7");
    assert_header(hdrs, 2, "f", "1.5");
    assert_header(hdrs, 3, "t", "true");
    assert_header(hdrs, 4, "fl", "false");
    assert_header(hdrs, 5, "obj", "{\"a\":1,\"b\":[1,2,\"x y\"]}");
    assert_header(hdrs, 6, "arr", "[]");
    assert_header(hdrs, 7, "none", NULL);
    assert_header(hdrs, 8, "s", "");
    assert_header(hdrs, 9, "id", "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01");
    rd_kafka_headers_destroy(hdrs);
}

/* From this review: a number in a header value was jansson's double printed back (0.1 became
 * "0.10000000000000001", 3.14159 "3.1415899999999999", inside objects and arrays too), and an
 * integer beyond a long long (which jsonb takes) failed the row as "too big integer". The value
 * is now the column's own text, compact. */
static void test_headers_numbers_as_written(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated",
                             "{\"r\": 0.1, \"pi\": 3.14159, \"big\": 12345678901234567890,"
                             " \"o\": {\"x\": [1.1, 2], \"s\": \"a, b: \\\"c\\\" }\"},"
                             " \"n\": \"\\u00e9\", \"r\": 2.50}");
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
    if (!hdrs)
        fail_msg("refused: %s", err);
    assert_int_equal(rd_kafka_header_cnt(hdrs), 8);
    /* a name twice: the last value, in the first one's place (as jansson keeps it) */
    assert_header(hdrs, 0, "r", "2.50");
    assert_header(hdrs, 1, "pi", "3.14159");
    assert_header(hdrs, 2, "big", "12345678901234567890");
    assert_header(hdrs, 3, "o", "{\"x\":[1.1,2],\"s\":\"a, b: \\\"c\\\" }\"}");
    assert_header(hdrs, 4, "n", "\xc3\xa9");
    rd_kafka_headers_destroy(hdrs);
}

/* From this review: a real beyond a double (1e400, 1E+999: jsonb and json take both) failed the
 * row as "headers column is not a JSON object: real number overflow", though the header is the
 * column's text and the column a JSON object; only integers beyond a long long were let through.
 * Any number is now sent as written, and text that is not JSON is still refused. */
static void test_headers_numbers_beyond_a_double(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated",
                             "{\"x\": 1e400, \"b\": [1E+999, {\"c\": -0.5e-999}],"
                             " \"i\": 12345678901234567890, \"s\": \"1e400\"}");
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, false, err, sizeof(err));
    if (!hdrs)
        fail_msg("refused: %s", err);
    assert_int_equal(rd_kafka_header_cnt(hdrs), 5);
    assert_header(hdrs, 1, "x", "1e400"); /* after id (the Debezium layout's order) */
    assert_header(hdrs, 2, "b", "[1E+999,{\"c\":-0.5e-999}]");
    assert_header(hdrs, 3, "i", "12345678901234567890");
    assert_header(hdrs, 4, "s", "1e400");
    rd_kafka_headers_destroy(hdrs);
    /* Not JSON beside a number too large: refused as before, whatever jansson found first. */
    const char *bad[] = {"{\"x\": 1e400, \"y\": -}", "{\"x\": 1e400x}", "{\"x\": 1e400, \"y\": 01}",
                         "{\"x\": 1e400, \"y\": 1.}", "{\"x\": 1e400, \"y\": 2e}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        row = make_row("Order", "OrderCreated", bad[i]);
        hdrs = route_headers(&row, false, err, sizeof(err));
        if (hdrs) {
            rd_kafka_headers_destroy(hdrs);
            fail_msg("headers column '%s' accepted", bad[i]);
        }
        assert_err_line(err, "headers column is not a JSON object");
    }
}

static void test_headers_not_an_object(void **state)
{
    const char *bad[] = {"[1, 2]", "\"text\"", "42", "null", "{", "", "{\"a\": 1} trailing"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        OutboxRow row = make_row("Order", "OrderCreated", bad[i]);
        char err[256] = "";
        rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
        if (hdrs) {
            rd_kafka_headers_destroy(hdrs);
            fail_msg("headers column '%s' accepted", bad[i]);
        }
        assert_err_line(err, "headers column is not a JSON object");
    }
}

/* Debezium style: no event_type/aggregate_type headers; id first, as Debezium's Outbox Event
 * Router adds it; the additional fields after the row's headers; only id stays reserved. */
static void test_headers_debezium_style(void **state)
{
    OutboxRow row = make_row("Order", "OrderCreated", "{\"event_type\": \"mine\", \"id\": \"x\"}");
    row.extra_headers = "{\"eventType\": \"OrderCreated\", \"tenant\": null, \"n\": 7}";
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, false, err, sizeof(err));
    assert_non_null(hdrs);
    assert_int_equal(rd_kafka_header_cnt(hdrs), 5);
    assert_header(hdrs, 0, "id", "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01");
    assert_header(hdrs, 1, "event_type", "mine");
    assert_header(hdrs, 2, "eventType", "OrderCreated");
    assert_header(hdrs, 3, "tenant", NULL);
    assert_header(hdrs, 4, "n", "7");
    rd_kafka_headers_destroy(hdrs);
}

/* CloudEvents: every header of a ce_ name the row brings, in any letter case, is replaced by the
 * relay's own, however many decoys come first (a cap of 64 once let a forged ce_type through
 * behind 64 variants of ce_specversion). */
static void test_cloudevents_decoys_replaced(void **state)
{
    char headers[8192] = "{";
    size_t len = 1;
    for (int i = 1; i <= 90; i++) { /* 90 letter-case variants, ROUTE_HEADERS_MAX in all */
        char name[] = "ce_specversion";
        for (int bit = 0; bit < 7; bit++)
            if (i & (1 << bit))
                name[3 + bit] = (char)toupper((unsigned char)name[3 + bit]);
        len += (size_t)snprintf(headers + len, sizeof(headers) - len, "\"%s\": \"x%d\", ", name, i);
    }
    snprintf(headers + len, sizeof(headers) - len,
             "\"ce_type\": \"forged.type\", \"CE_SOURCE\": \"forged\", \"keep\": \"me\"}");
    OutboxRow row = make_row("Order", "OrderCreated", headers);
    char err[256] = "";
    rd_kafka_headers_t *hdrs = route_headers(&row, true, err, sizeof(err));
    assert_non_null(hdrs);
    assert_true(route_cloudevents_add(hdrs, &row, "/relay", "application/json"));
    const char *name;
    const void *value;
    size_t size;
    int ce = 0;
    for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == 0; i++) {
        if (strncasecmp(name, "ce_", 3) == 0)
            ce++;
        if (strcmp(name, "ce_type") == 0)
            assert_memory_equal(value, "OrderCreated", size);
        if (strcmp(name, "ce_source") == 0)
            assert_memory_equal(value, "/relay", size);
    }
    assert_int_equal(ce, 5); /* specversion, id, source, type, subject (no created_at here) */
    assert_last(hdrs, "keep", "me");
    assert_last(hdrs, "ce_specversion", "1.0");
    rd_kafka_headers_destroy(hdrs);
}

static void test_topic_routed_by_value(void **state)
{
    OutboxRow row = make_row("order", "OrderCreated", NULL);
    char topic[ROUTE_TOPIC_MAX + 1], err[256] = "";
    assert_true(route_template_check("outbox.event.${routedByValue}", true, err, sizeof(err)));
    assert_true(
        route_topic("outbox.event.${routedByValue}", &row, topic, sizeof(topic), err, sizeof(err)));
    assert_string_equal(topic, "outbox.event.order");
    assert_false(route_template_check("outbox.${other}", true, err, sizeof(err)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template_default_ok),
        cmocka_unit_test(test_header_reserved_names),
        cmocka_unit_test(test_template_reaches_dead_letter_topic),
        cmocka_unit_test(test_header_reserved_unicode),
        cmocka_unit_test(test_header_names_with_invisible_characters),
        cmocka_unit_test(test_headers_unicode_spoof_dropped),
        cmocka_unit_test(test_headers_count_limit),
        cmocka_unit_test(test_headers_bytes_limit),
        cmocka_unit_test(test_template_placeholders_ok),
        cmocka_unit_test(test_template_event_type_needs_topic_scope),
        cmocka_unit_test(test_template_unknown_placeholder),
        cmocka_unit_test(test_template_illegal_literal),
        cmocka_unit_test(test_template_length),
        cmocka_unit_test(test_template_error_is_one_line),
        cmocka_unit_test(test_topic_default_template),
        cmocka_unit_test(test_topic_both_placeholders),
        cmocka_unit_test(test_topic_illegal_characters),
        cmocka_unit_test(test_topic_illegal_in_event_type),
        cmocka_unit_test(test_topic_empty),
        cmocka_unit_test(test_topic_dot_names),
        cmocka_unit_test(test_topic_length_limit),
        cmocka_unit_test(test_topic_small_out_buffer),
        cmocka_unit_test(test_headers_null_column),
        cmocka_unit_test(test_headers_empty_object),
        cmocka_unit_test(test_headers_order_and_values),
        cmocka_unit_test(test_headers_reserved_dropped),
        cmocka_unit_test(test_headers_non_string_values),
        cmocka_unit_test(test_headers_flat_same_as_jansson),
        cmocka_unit_test(test_headers_numbers_beyond_a_double),
        cmocka_unit_test(test_headers_not_an_object),
        cmocka_unit_test(test_headers_numbers_as_written),
        cmocka_unit_test(test_headers_debezium_style),
        cmocka_unit_test(test_topic_routed_by_value),
        cmocka_unit_test(test_cloudevents_decoys_replaced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
