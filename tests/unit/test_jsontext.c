/* Unit tests for jsontext.c, the scanner of JSON text jansson has accepted (the headers column's
 * offsets in relay/outbox/route.c, the serializer's walk in relay/io/serializer.c): where each
 * token ends, and that no text, however cut, is read at or past its end (each text is copied
 * into a buffer of exactly its length, so ASan sees such a read). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "jsontext.h"

typedef const char *(*ScanFn)(const char *p, const char *end);

/* Runs scan over text (without its NUL, in a buffer of exactly its length); the offset it
 * returns. */
static size_t scan(ScanFn fn, const char *text)
{
    size_t len = strlen(text);
    char *buf = malloc(len ? len : 1);
    assert_non_null(buf);
    memcpy(buf, text, len);
    const char *at = fn(buf, buf + len);
    assert_true(at >= buf && at <= buf + len);
    size_t offset = (size_t)(at - buf);
    free(buf);
    return offset;
}

static const char *ws(const char *p, const char *end)
{
    return jsontext_ws(p, end);
}

static void test_ws(void **state)
{
    assert_int_equal(scan(ws, " \t\r\n x"), 5);
    assert_int_equal(scan(ws, "x "), 0);
    assert_int_equal(scan(ws, "  "), 2); /* stops at the end */
    assert_int_equal(scan(ws, ""), 0);
}

static void test_string(void **state)
{
    assert_int_equal(scan(jsontext_string, "\"ab\": 1"), 4);
    assert_int_equal(scan(jsontext_string, "\"a\\\"b\" "), 6);   /* an escaped quote */
    assert_int_equal(scan(jsontext_string, "\"a\\\\\"b\""), 5);  /* an escaped backslash */
    assert_int_equal(scan(jsontext_string, "\"\\u00e9}\"]"), 9); /* brackets inside */
    assert_int_equal(scan(jsontext_string, "\"\""), 2);
}

static void test_value(void **state)
{
    assert_int_equal(scan(jsontext_value, "12.5e-3, 4"), 7);
    assert_int_equal(scan(jsontext_value, "-0}"), 2);
    assert_int_equal(scan(jsontext_value, "true]"), 4);
    assert_int_equal(scan(jsontext_value, "null\n"), 4);
    assert_int_equal(scan(jsontext_value, "12345678901234567890"), 20); /* to the end */
    assert_int_equal(scan(jsontext_value, "\"x,y\" ,"), 5);
    assert_int_equal(scan(jsontext_value, "{\"a\": [\"}\", {\"b\": \"]\\\"\"}], \"c\": 1} ,"), 34);
    assert_int_equal(scan(jsontext_value, "[[], {}, [[1]]]]"), 15);
    assert_int_equal(scan(jsontext_value, "{}"), 2);
}

/* Nesting as deep as a payload may go costs no stack: iterative. */
static void test_deep_nesting(void **state)
{
    size_t depth = 1000000;
    char *text = malloc(2 * depth + 3);
    assert_non_null(text);
    memset(text, '[', depth);
    memset(text + depth, ']', depth);
    strcpy(text + 2 * depth, " ,");
    assert_int_equal(scan(jsontext_value, text), 2 * depth);
    free(text);
}

/* Text cut anywhere (never well-formed JSON, which jansson refuses) is not read past its end:
 * each function stops at it. */
static void test_cut_text_stays_inside(void **state)
{
    assert_int_equal(scan(jsontext_string, "\"abc"), 4);
    assert_int_equal(scan(jsontext_string, "\"ab\\"), 4); /* cut after a backslash */
    assert_int_equal(scan(jsontext_string, "\""), 1);
    assert_int_equal(scan(jsontext_value, "{\"a\": [1, \"b"), 12);
    assert_int_equal(scan(jsontext_value, "[[["), 3);
    assert_int_equal(scan(jsontext_value, "[\"\\"), 3);
    assert_int_equal(scan(jsontext_value, "123"), 3);
    assert_int_equal(scan(jsontext_value, ""), 0);
    assert_int_equal(scan(jsontext_string, ""), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ws),
        cmocka_unit_test(test_string),
        cmocka_unit_test(test_value),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_cut_text_stays_inside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
