/* Unit tests for the pure parts of producer-demo: Idempotency-Key header values (bare and
 * Structured Field string forms, length and character limits) and --listen addresses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include <libpq-fe.h>
#include <stdlib.h>

#include "addr.h"
#include "idem.h"
#include "server.h"

static void expect_key(const char *header, const char *key)
{
    char out[IDEM_KEY_MAX + 1], err[256] = "";
    if (!idem_key_parse(header, out, err, sizeof(err)))
        fail_msg("'%s' rejected: %s", header, err);
    assert_string_equal(out, key);
}

static void expect_reject(const char *header, const char *reason)
{
    char out[IDEM_KEY_MAX + 1], err[256] = "";
    if (idem_key_parse(header, out, err, sizeof(err)))
        fail_msg("'%s' accepted as '%s'", header, out);
    if (!strstr(err, reason))
        fail_msg("'%s': error '%s' does not mention '%s'", header, err, reason);
}

static void test_bare_keys(void **state)
{
    expect_key("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324");
    expect_key("a", "a");
    expect_key("!~{}[]/\\'", "!~{}[]/\\'");
    expect_key("  padded\t", "padded");
}

static void test_sf_string_keys(void **state)
{
    /* The draft's form: the quotes are syntax, so "abc" and abc name the same key. */
    expect_key("\"8e03978e-40d5\"", "8e03978e-40d5");
    expect_key("\"a\\\"b\\\\c\"", "a\"b\\c");
    expect_reject("\"abc", "no closing quote");
    expect_reject("\"ab\"c", "after its closing quote");
    expect_reject("\"a\\nb\"", "invalid escape");
    expect_reject("\"a b\"", "visible ASCII");
    expect_reject("\"\"", "must not be empty");
}

static void test_empty_and_invisible(void **state)
{
    expect_reject("", "must not be empty");
    expect_reject("   ", "must not be empty");
    expect_reject("a b", "visible ASCII");
    expect_reject("tab\tinside", "visible ASCII");
    expect_reject("caf\xc3\xa9", "visible ASCII");
    expect_reject("bell\x07", "visible ASCII");
    expect_reject("del\x7f", "visible ASCII");
}

static void test_length_limit(void **state)
{
    char key[402];
    memset(key, 'k', sizeof(key));
    key[255] = '\0';
    expect_key(key, key);
    char quoted[sizeof(key) + 2];
    snprintf(quoted, sizeof(quoted), "\"%s\"", key);
    expect_key(quoted, key);
    key[255] = 'k';
    key[256] = '\0';
    expect_reject(key, "at most 255");
    key[256] = 'k';
    key[400] = '\0';
    expect_reject(key, "at most 255");
}

static void expect_listen(const char *text, const char *host, unsigned port)
{
    char h[256], err[256] = "";
    unsigned p = 99999;
    if (!addr_parse_host_port("--listen", text, h, sizeof(h), &p, err, sizeof(err)))
        fail_msg("'%s' rejected: %s", text, err);
    assert_string_equal(h, host);
    assert_int_equal(p, port);
}

static void expect_listen_error(const char *text)
{
    char h[256], err[256] = "";
    unsigned p;
    if (addr_parse_host_port("--listen", text, h, sizeof(h), &p, err, sizeof(err)))
        fail_msg("'%s' accepted", text);
    assert_true(strncmp(err, "--listen: ", 10) == 0);
}

/* The fingerprint must equal PostgreSQL's sha256() of the same bytes (checked against Python's
 * hashlib), across block boundaries and for long bodies. */
static void test_fingerprint(void **state)
{
    char hex[65], body[1001];
    IdemRequest r = {"POST /orders", "k", "POST", "/orders", "{\"x\":1}", 7, 60};
    idem_fingerprint(&r, hex);
    assert_string_equal(hex, "34e5cb55f701dbee344c35f19979314d058a7e6b8487fbd4dc3e8c8a529939b3");
    memset(body, 'a', 1000);
    r = (IdemRequest){"PATCH /orders/{id}", "k", "PATCH", "/orders/1", body, 1000, 60};
    idem_fingerprint(&r, hex);
    assert_string_equal(hex, "a6c41c2769c626c1a1740139384a18766f318c3fe26ffd823cd95357333e9228");
    memset(body, 'b', 57);
    r = (IdemRequest){"GET", "k", "GET", "/", body, 57, 60};
    idem_fingerprint(&r, hex);
    assert_string_equal(hex, "287bb2a66de42b26ca749b7bd6967ae3e10290fe1a0efc7d80732bee7ce97dab");
}

/* strdup for this test program (it takes the place of libc's in every module linked here):
 * when strdup_fail_at is n > 0, the n-th call from then on fails as out of memory would. */
static int strdup_fail_at;

char *strdup(const char *s)
{
    if (strdup_fail_at > 0 && --strdup_fail_at == 0)
        return NULL;
    size_t n = strlen(s) + 1;
    char *out = malloc(n);
    if (out)
        memcpy(out, s, n);
    return out;
}

/* A SELECT_STORED row built by hand: matches, 201, body, Location, no ETag, 5000 ms left. */
static PGresult *stored_row(void)
{
    PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    assert_non_null(res);
    PGresAttDesc cols[6];
    const char *names[6] = {"m", "status", "body", "location", "etag", "left"};
    for (int i = 0; i < 6; i++)
        cols[i] =
            (PGresAttDesc){.name = (char *)names[i], .typid = 25, .typlen = -1, .atttypmod = -1};
    assert_int_equal(PQsetResultAttrs(res, 6, cols), 1);
    const char *vals[6] = {"t", "201", "{\"id\":7}", "/orders/7", NULL, "5000"};
    for (int i = 0; i < 6; i++)
        assert_int_equal(
            PQsetvalue(res, 0, i, (char *)vals[i], vals[i] ? (int)strlen(vals[i]) : -1), 1);
    return res;
}

/* A stored response whose copy fails (out of memory) is a failure (500), never a replay of an
 * empty body or of the body without its Location: the old code replayed "201" with nothing. */
static void test_stored_copy_out_of_memory(void **state)
{
    PGresult *res = stored_row();
    IdemStored st;
    DbError e = {0};
    assert_int_equal(idem_stored_read(res, &st, &e), IDEM_REPLAY);
    assert_int_equal(st.status, 201);
    assert_string_equal(st.body, "{\"id\":7}");
    assert_string_equal(st.location, "/orders/7");
    assert_null(st.etag);
    assert_int_equal(st.left_ms, 5000);
    idem_stored_free(&st);
    for (int n = 1; n <= 2; n++) { /* the body's copy, then the Location's */
        e = (DbError){0};
        strdup_fail_at = n;
        IdemOutcome out = idem_stored_read(res, &st, &e);
        strdup_fail_at = 0;
        if (out != IDEM_FAILED)
            fail_msg("copy %d failed: outcome %d (body %s), not IDEM_FAILED", n, (int)out,
                     st.body ? st.body : "(none)");
        assert_non_null(strstr(e.message, "out of memory"));
        assert_null(st.body);
        assert_null(st.location);
    }
    PQclear(res);
}

static void test_listen(void **state)
{
    expect_listen("127.0.0.1:8080", "127.0.0.1", 8080);
    expect_listen("0.0.0.0:0", "0.0.0.0", 0);
    expect_listen_error(":8080"); /* every interface is written 0.0.0.0 or [::] (addr.h) */
    expect_listen("localhost:65535", "localhost", 65535);
    expect_listen("[::1]:80", "::1", 80);
    expect_listen("[::]:8080", "::", 8080);
    expect_listen_error("8080");
    expect_listen_error("host:");
    expect_listen_error("host:65536");
    expect_listen_error("host:-1");
    expect_listen_error("host:80x");
    expect_listen_error("::1:80");
    expect_listen_error("[::1]80");
    expect_listen_error("[::1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bare_keys),      cmocka_unit_test(test_stored_copy_out_of_memory),
        cmocka_unit_test(test_sf_string_keys), cmocka_unit_test(test_empty_and_invisible),
        cmocka_unit_test(test_length_limit),   cmocka_unit_test(test_listen),
        cmocka_unit_test(test_fingerprint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
