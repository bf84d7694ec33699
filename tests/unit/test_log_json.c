/* Unit tests for log_json.c: logfmt lines as log_write builds them, turned into JSON objects
 * (--log-format json, issue 44), checked by parsing the result back with jansson. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "log_json.h"

static json_t *convert(const char *line)
{
    char out[2048];
    size_t n = log_json_line(line, out, sizeof(out));
    assert_int_equal(n, strlen(out));
    assert_null(strchr(out, '\n'));
    json_error_t e;
    json_t *o = json_loads(out, 0, &e);
    if (!o)
        fail_msg("not JSON: %s (%s)", out, e.text);
    return o;
}

static void test_fields(void **state)
{
    json_t *o = convert("2026-11-26T23:00:00.123Z level=warn msg=\"claims read \\\"x\\\"\" "
                        "rows=12 table=outbox error=\"a\\nb\\x01\" neg=-3 zero=0 lead=007 "
                        "big=12345678901234567");
    assert_string_equal(json_string_value(json_object_get(o, "ts")), "2026-11-26T23:00:00.123Z");
    assert_string_equal(json_string_value(json_object_get(o, "level")), "warn");
    assert_string_equal(json_string_value(json_object_get(o, "msg")), "claims read \"x\"");
    assert_int_equal(json_integer_value(json_object_get(o, "rows")), 12);
    assert_string_equal(json_string_value(json_object_get(o, "table")), "outbox");
    assert_string_equal(json_string_value(json_object_get(o, "error")), "a\nb\x01");
    assert_int_equal(json_integer_value(json_object_get(o, "neg")), -3);
    assert_int_equal(json_integer_value(json_object_get(o, "zero")), 0);
    assert_string_equal(json_string_value(json_object_get(o, "lead")), "007");
    assert_string_equal(json_string_value(json_object_get(o, "big")), "12345678901234567");
    json_decref(o);
}

/* What log_quote writes round-trips: the JSON value is the original text. */
static void test_quoted_round_trip(void **state)
{
    /* U+2028 and U+E0001 (a tag character): log_quote writes them as \u2028 and \U000e0001. */
    const char *values[] = {
        "plain", "with space",          "quote \" and \\ backslash", "tab\tnew\nline", "\x7f del",
        "",      "line\xe2\x80\xa8sep", "tag\xf3\xa0\x80\x81x",      "literal \\u2028"};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        char q[256], line[512];
        snprintf(line, sizeof(line), "T level=info msg=\"m\" v=%s",
                 log_quote(values[i], q, sizeof(q)));
        json_t *o = convert(line);
        assert_string_equal(json_string_value(json_object_get(o, "v")), values[i]);
        json_decref(o);
    }
}

/* A value holding bytes that are not UTF-8 (Latin-1 text, a character cut in two): log_quote
 * writes each as \xNN, and the JSON line must still be UTF-8, or a parser rejects it (jansson
 * does, like the collectors). Before, the byte was copied back raw. */
static void test_invalid_utf8(void **state)
{
    const char *values[] = {"caf\xe9", "cut \xe2\x80", "\xff\xfe", "over\xc0\xaflong"};
    const char *expected[] = {"caf\xef\xbf\xbd", "cut \xef\xbf\xbd\xef\xbf\xbd",
                              "\xef\xbf\xbd\xef\xbf\xbd", "over\xef\xbf\xbd\xef\xbf\xbdlong"};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        char q[256], line[512];
        snprintf(line, sizeof(line), "T level=info msg=\"m\" v=%s",
                 log_quote(values[i], q, sizeof(q)));
        json_t *o = convert(line);
        assert_string_equal(json_string_value(json_object_get(o, "v")), expected[i]);
        json_decref(o);
    }
}

/* A line longer than the buffer is cut, never overrun, and still one JSON object: the fields
 * that fit whole, then "cut":true. (Before, the object was cut mid-value, and a collector drops
 * a line it cannot parse.) */
static void test_cut(void **state)
{
    char out[64];
    size_t n =
        log_json_line("T level=info msg=\"a long message that does not fit\"", out, sizeof(out));
    assert_true(n < sizeof(out));
    assert_int_equal(strlen(out), n);
    json_error_t e;
    json_t *o = json_loads(out, 0, &e);
    if (!o)
        fail_msg("not JSON: %s (%s)", out, e.text);
    assert_string_equal(json_string_value(json_object_get(o, "level")), "info");
    assert_null(json_object_get(o, "msg"));
    assert_true(json_is_true(json_object_get(o, "cut")));
    json_decref(o);

    /* Bare words grow most (a two-byte "f " is ,"f":true): every size from the smallest. */
    char line[600] = "2026-11-26T23:00:00.123Z level=info msg=\"m\"";
    for (int i = 0; i < 100; i++)
        strcat(line, i % 2 ? " f" : " k=\"\\x01\"");
    for (size_t len = 64; len < 1400; len++) {
        char *buf = malloc(len);
        n = log_json_line(line, buf, len);
        assert_true(n < len);
        o = json_loads(buf, 0, &e);
        if (!o)
            fail_msg("%zu bytes: not JSON: %s (%s)", len, buf, e.text);
        json_decref(o);
        free(buf);
    }
    /* No timestamp at all (no space in a long line): still JSON. */
    memset(line, 'x', sizeof(line) - 1);
    line[sizeof(line) - 1] = '\0';
    n = log_json_line(line, out, sizeof(out));
    o = json_loads(out, 0, &e);
    if (!o)
        fail_msg("not JSON: %s (%s)", out, e.text);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_quoted_round_trip),
        cmocka_unit_test(test_cut),
        cmocka_unit_test(test_invalid_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
