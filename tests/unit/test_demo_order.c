/* Unit tests for producer-demo/order.c: what POST /orders accepts, the status of each kind of
 * bad body (400 = not a JSON object, 422 = a field is wrong), currencies, and the JSON form. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "order.h"
#include "utf8.h"

/* Parses body and returns the status (0 = valid); err and out are left for the caller. */
static int parse(const char *body, OrderInput *out, char *err)
{
    return order_parse(body, strlen(body), out, err, 256);
}

static void test_valid_order(void **state)
{
    OrderInput in;
    char err[256];
    assert_int_equal(parse("{\"customer_id\": \"c-7\", \"amount_cents\": 4200, "
                           "\"currency\": \"EUR\"}",
                           &in, err),
                     0);
    assert_string_equal(in.customer_id, "c-7");
    assert_true(in.amount_cents == 4200);
    assert_string_equal(in.currency, "EUR");
}

static void test_field_order_and_utf8_do_not_matter(void **state)
{
    OrderInput in;
    char err[256];
    assert_int_equal(parse("{\"currency\":\"JPY\",\"amount_cents\":1,"
                           "\"customer_id\":\"\xd0\x9a\xd0\xbb\xd0\xb8\xd0\xb5\xd0\xbd\xd1\x82\"}",
                           &in, err),
                     0);
    assert_string_equal(in.customer_id, "\xd0\x9a\xd0\xbb\xd0\xb8\xd0\xb5\xd0\xbd\xd1\x82");
    assert_true(in.amount_cents == 1);
}

static void test_not_a_json_object_is_400(void **state)
{
    static const char *const bodies[] = {
        "",
        "nope",
        "{",
        "[]",
        "\"text\"",
        "42",
        "null",
        "{\"customer_id\": }",
        "{} trailing",
        "{\"customer_id\":\"a\",\"customer_id\":\"b\",\"amount_cents\":1,"
        "\"currency\":\"EUR\"}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        OrderInput in;
        char err[256] = "";
        assert_int_equal(parse(bodies[i], &in, err), 400);
        assert_true(strlen(err) > 0);
        assert_null(strchr(err, '\n'));
    }
}

static void test_bad_fields_are_422(void **state)
{
    static const struct {
        const char *body;
        const char *reason;
    } cases[] = {
        {"{\"amount_cents\":1,\"currency\":\"EUR\"}", "missing field \"customer_id\""},
        {"{\"customer_id\":\"c\",\"currency\":\"EUR\"}", "missing field \"amount_cents\""},
        {"{\"customer_id\":\"c\",\"amount_cents\":1}", "missing field \"currency\""},
        {"{\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\",\"note\":1}",
         "unknown field \"note\""},
        {"{\"customer_id\":7,\"amount_cents\":1,\"currency\":\"EUR\"}", "customer_id must be"},
        {"{\"customer_id\":\"\",\"amount_cents\":1,\"currency\":\"EUR\"}", "customer_id must be"},
        {"{\"customer_id\":\"a\\nb\",\"amount_cents\":1,\"currency\":\"EUR\"}",
         "customer_id must not contain control"},
        {"{\"customer_id\":\"c\",\"amount_cents\":0,\"currency\":\"EUR\"}",
         "amount_cents must be greater than 0"},
        {"{\"customer_id\":\"c\",\"amount_cents\":-5,\"currency\":\"EUR\"}",
         "amount_cents must be greater than 0"},
        {"{\"customer_id\":\"c\",\"amount_cents\":1.5,\"currency\":\"EUR\"}",
         "amount_cents must be an integer"},
        {"{\"customer_id\":\"c\",\"amount_cents\":100.0,\"currency\":\"EUR\"}",
         "amount_cents must be an integer"},
        {"{\"customer_id\":\"c\",\"amount_cents\":\"100\",\"currency\":\"EUR\"}",
         "amount_cents must be an integer"},
        {"{\"customer_id\":\"c\",\"amount_cents\":true,\"currency\":\"EUR\"}",
         "amount_cents must be an integer"},
        {"{\"customer_id\":\"c\",\"amount_cents\":null,\"currency\":\"EUR\"}",
         "amount_cents must be an integer"},
        {"{\"customer_id\":\"c\",\"amount_cents\":99999999999999999999,\"currency\":\"EUR\"}",
         "out of range"},
        {"{\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"XYZ\"}", "ISO 4217"},
        {"{\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"eur\"}", "ISO 4217"},
        {"{\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EURO\"}", "ISO 4217"},
        {"{\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"XAU\"}", "ISO 4217"},
        {"{\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":1}", "currency must be a string"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        OrderInput in;
        char err[256] = "";
        int status = parse(cases[i].body, &in, err);
        if (status != 422 || !strstr(err, cases[i].reason))
            fail_msg("%s: got %d '%s', expected 422 '%s'", cases[i].body, status, err,
                     cases[i].reason);
    }
}

static void test_customer_id_length_limit(void **state)
{
    char body[600], id[300];
    OrderInput in;
    char err[256];
    memset(id, 'x', 255);
    id[255] = '\0';
    snprintf(body, sizeof(body), "{\"customer_id\":\"%s\",\"amount_cents\":1,\"currency\":\"EUR\"}",
             id);
    assert_int_equal(parse(body, &in, err), 0);
    assert_int_equal(strlen(in.customer_id), 255);
    id[255] = 'x';
    id[256] = '\0';
    snprintf(body, sizeof(body), "{\"customer_id\":\"%s\",\"amount_cents\":1,\"currency\":\"EUR\"}",
             id);
    assert_int_equal(parse(body, &in, err), 422);
}

static void test_errors_never_span_lines(void **state)
{
    /* jansson quotes the offending input in its messages; a newline there must not survive. */
    OrderInput in;
    char err[256];
    assert_int_equal(parse("{\"a\n\x01\": ", &in, err), 400);
    for (const char *p = err; *p; p++)
        assert_true((unsigned char)*p >= 0x20);
}

/* True when s is valid UTF-8 throughout. */
static bool is_utf8(const char *s)
{
    while (*s) {
        int32_t cp;
        s += utf8_decode(s, &cp);
        if (cp < 0)
            return false;
    }
    return true;
}

static void test_long_field_names_are_cut_between_characters(void **state)
{
    /* "a" and 40 two-byte characters (81 bytes): the message quotes at most 64 bytes of a name,
     * and before the fix cut the 32nd character in half (invalid UTF-8, which the problem
     * document could then not carry). */
    char name[128] = "a", body[256];
    for (int i = 0; i < 40; i++)
        strcat(name, "\xc3\xa9");
    OrderInput in;
    OrderPatch patch;
    char err[256];
    snprintf(body, sizeof(body), "{\"%s\": 1}", name);
    assert_int_equal(parse(body, &in, err), 422);
    assert_true(is_utf8(err));
    /* The longest whole-character prefix within 64 bytes: "a" and 31 of them (63 bytes). */
    char want[128];
    snprintf(want, sizeof(want), "unknown field \"%.63s\"", name);
    assert_string_equal(err, want);
    assert_int_equal(order_patch_parse(body, strlen(body), &patch, err, sizeof(err)), 422);
    assert_true(is_utf8(err));
    snprintf(want, sizeof(want), "field \"%.63s\" cannot be changed", name);
    assert_string_equal(err, want);
    /* A name of exactly 64 bytes is quoted whole. */
    snprintf(body, sizeof(body), "{\"%.64s\": 1}", name + 1);
    assert_int_equal(parse(body, &in, err), 422);
    snprintf(want, sizeof(want), "unknown field \"%.64s\"", name + 1);
    assert_string_equal(err, want);
}

static void test_currency_list(void **state)
{
    static const char *const known[] = {"AED", "CHF", "EUR", "GBP", "JPY", "USD", "ZWG"};
    static const char *const unknown[] = {"", "EU", "eur", "XXX", "XTS", "XAU", "ABC", "ZZZ"};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        assert_true(order_currency_known(known[i]));
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++)
        assert_false(order_currency_known(unknown[i]));
}

static void test_json_form(void **state)
{
    char *json = order_json("5d0b4bf1-9ad2-44c2-b06b-570989fcd6fc", "c \"7\"", 4200, "EUR",
                            "created", 3, "2026-11-21T02:04:04.356111Z");
    assert_non_null(json);
    assert_string_equal(json, "{\"id\":\"5d0b4bf1-9ad2-44c2-b06b-570989fcd6fc\","
                              "\"customer_id\":\"c \\\"7\\\"\",\"amount_cents\":4200,"
                              "\"currency\":\"EUR\",\"status\":\"created\",\"version\":3,"
                              "\"created_at\":\"2026-11-21T02:04:04.356111Z\"}");
    free(json);
}

static void test_patch_parse(void **state)
{
    OrderPatch p;
    char err[200];
#define PATCH(text) order_patch_parse(text, strlen(text), &p, err, sizeof(err))
    assert_int_equal(PATCH("{\"amount_cents\":250}"), 0);
    assert_true(p.has_amount && !p.has_status);
    assert_int_equal(p.amount_cents, 250);
    assert_int_equal(PATCH("{\"status\":\"confirmed\",\"amount_cents\":1}"), 0);
    assert_true(p.has_amount && p.has_status);
    assert_string_equal(p.status, "confirmed");
    assert_int_equal(PATCH("{}"), 422);
    assert_int_equal(PATCH("[]"), 400);
    assert_int_equal(PATCH("{\"amount_cents\":"), 400);
    assert_int_equal(PATCH("{\"amount_cents\":0}"), 422);
    assert_int_equal(PATCH("{\"amount_cents\":1.5}"), 422);
    assert_int_equal(PATCH("{\"amount_cents\":null}"), 422);
    assert_int_equal(PATCH("{\"amount_cents\":99999999999999999999999}"), 422);
    assert_int_equal(PATCH("{\"status\":\"shipped\"}"), 422);
    assert_int_equal(PATCH("{\"status\":1}"), 422);
    assert_int_equal(PATCH("{\"currency\":\"EUR\"}"), 422);
    assert_int_equal(PATCH("{\"status\":\"created\",\"status\":\"cancelled\"}"), 400);
#undef PATCH
}

static void test_patch_allowed(void **state)
{
    char err[200];
    OrderPatch amount = {.has_amount = true, .amount_cents = 5};
    OrderPatch confirm = {.has_status = true, .status = "confirmed"};
    OrderPatch cancel = {.has_status = true, .status = "cancelled"};
    OrderPatch reopen = {.has_status = true, .status = "created"};
    assert_true(order_patch_allowed("created", &amount, err, sizeof(err)));
    assert_true(order_patch_allowed("created", &confirm, err, sizeof(err)));
    assert_true(order_patch_allowed("created", &cancel, err, sizeof(err)));
    assert_true(order_patch_allowed("confirmed", &confirm, err, sizeof(err)));
    assert_true(order_patch_allowed("confirmed", &cancel, err, sizeof(err)));
    assert_false(order_patch_allowed("confirmed", &reopen, err, sizeof(err)));
    assert_false(order_patch_allowed("cancelled", &amount, err, sizeof(err)));
    assert_false(order_patch_allowed("cancelled", &cancel, err, sizeof(err)));
    assert_false(order_patch_allowed("lost", &amount, err, sizeof(err)));
}

/* Whether value parses and matches an order at version. */
static bool if_match(const char *value, long long version)
{
    OrderIfMatch m;
    return order_if_match_parse(value, &m) && order_if_match_matches(&m, version);
}

static bool if_match_valid(const char *value)
{
    OrderIfMatch m;
    return order_if_match_parse(value, &m);
}

static void test_if_match(void **state)
{
    /* one strong tag: matches its version only */
    assert_true(if_match("\"1\"", 1));
    assert_true(if_match(" \"42\" ", 42));
    assert_false(if_match("\"42\"", 41));
    assert_true(if_match("\"2147483647\"", 2147483647LL));
    /* RFC 9110 section 13.1.1: "*" matches any current version */
    assert_true(if_match("*", 1));
    assert_true(if_match(" * ", 77));
    /* a list matches when any of its tags does */
    assert_true(if_match("\"1\", \"2\"", 2));
    assert_true(if_match("\"1\",\"2\"", 1));
    assert_true(if_match("\"x\" ,\t\"7\"", 7));
    assert_false(if_match("\"1\", \"2\"", 3));
    assert_true(if_match(", \"5\",, ", 5)); /* empty list elements are skipped (5.6.1) */
    /* strong comparison: weak tags and other spellings are valid but never match */
    assert_true(if_match_valid("W/\"1\""));
    assert_false(if_match("W/\"1\"", 1));
    assert_true(if_match("W/\"1\", \"1\"", 1));
    assert_false(if_match("\"01\"", 1));
    assert_true(if_match_valid("\"0\""));
    assert_false(if_match("\"\"", 1));
    assert_false(if_match("\"2147483648\"", 1));
    /* not * and not a list of entity tags: 400 */
    assert_false(if_match_valid(""));
    assert_false(if_match_valid(" , "));
    assert_false(if_match_valid("1"));
    assert_false(if_match_valid("\"1"));
    assert_false(if_match_valid("\"1\" \"2\""));
    assert_false(if_match_valid("*, \"1\""));
    assert_false(if_match_valid("\"1\", *"));
    assert_false(if_match_valid("w/\"1\""));
    assert_false(if_match_valid("\"a b\""));
    assert_false(if_match_valid("\"1\"x"));
    OrderIfMatch weak, strong;
    assert_true(order_if_match_parse("\"2\", W/\"3\"", &weak) && weak.weak);
    assert_true(order_if_match_parse("\"2\", \"3\"", &strong) && !strong.weak);
}

/* The fingerprint's form of an If-Match value. */
static const char *canon(const char *value)
{
    static char out[64];
    OrderIfMatch m;
    assert_true(order_if_match_parse(value, &m));
    assert_true(order_if_match_canon(&m, out, strlen(value) + 1));
    return out;
}

static void test_if_match_canon(void **state)
{
    assert_string_equal(canon("\"3\""), "3"); /* as fingerprints stored before lists */
    assert_string_equal(canon("  \"3\"\t"), "3");
    assert_string_equal(canon("*"), "*");
    assert_string_equal(canon("\"*\""), "\"*\"");
    assert_string_equal(canon("W/\"3\""), "W/\"3\"");
    assert_string_equal(canon("\"3\" , \"4\""), "\"3\",\"4\"");
    assert_string_equal(canon(",\"3\",,\"4\","), "\"3\",\"4\"");
    assert_string_equal(canon("\"\""), "\"\"");
    OrderIfMatch m;
    char small[3];
    assert_true(order_if_match_parse("\"3\"", &m));
    assert_false(order_if_match_canon(&m, small, sizeof(small)));
}

static void test_order_id_valid(void **state)
{
    assert_true(order_id_valid("5d0b4bf1-9ad2-44c2-b06b-570989fcd6fc"));
    assert_true(order_id_valid("5D0B4BF1-9AD2-44C2-B06B-570989FCD6FC"));
    assert_false(order_id_valid(""));
    assert_false(order_id_valid("5d0b4bf1-9ad2-44c2-b06b-570989fcd6f"));
    assert_false(order_id_valid("5d0b4bf1-9ad2-44c2-b06b-570989fcd6fc0"));
    assert_false(order_id_valid("5d0b4bf1x9ad2-44c2-b06b-570989fcd6fc"));
    assert_false(order_id_valid("5d0b4bf1-9ad2-44c2-b06b-570989fcd6fg"));
    assert_false(order_id_valid("' OR 1=1 --"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_order),
        cmocka_unit_test(test_field_order_and_utf8_do_not_matter),
        cmocka_unit_test(test_not_a_json_object_is_400),
        cmocka_unit_test(test_bad_fields_are_422),
        cmocka_unit_test(test_customer_id_length_limit),
        cmocka_unit_test(test_errors_never_span_lines),
        cmocka_unit_test(test_long_field_names_are_cut_between_characters),
        cmocka_unit_test(test_currency_list),
        cmocka_unit_test(test_json_form),
        cmocka_unit_test(test_order_id_valid),
        cmocka_unit_test(test_patch_parse),
        cmocka_unit_test(test_patch_allowed),
        cmocka_unit_test(test_if_match),
        cmocka_unit_test(test_if_match_canon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
