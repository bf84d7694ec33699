/* Unit tests for strbuf.c: array literals, and that a text element is always well-formed UTF-8
 * (issue 21: an error text cut inside a character made the server reject the failure marks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "strbuf.h"

/* The literal of a one-element text array holding s. */
static char *one_text(StrBuf *b, const char *s)
{
    strbuf_array_begin(b);
    strbuf_array_text(b, s);
    strbuf_array_end(b);
    return b->s;
}

static void test_ints_and_empty(void **state)
{
    StrBuf b = {0};
    strbuf_array_begin(&b);
    assert_true(strbuf_array_empty(&b));
    strbuf_array_begin(&b);
    strbuf_array_int(&b, 1);
    strbuf_array_int(&b, -20);
    strbuf_array_end(&b);
    assert_string_equal(b.s, "{1,-20}");
    assert_false(strbuf_array_empty(&b));
    strbuf_free(&b);
}

static void test_text_quoting_and_null(void **state)
{
    StrBuf b = {0};
    strbuf_array_begin(&b);
    strbuf_array_text(&b, "a\"b\\c");
    strbuf_array_text(&b, NULL);
    strbuf_array_end(&b);
    assert_string_equal(b.s, "{\"a\\\"b\\\\c\",NULL}");
    strbuf_free(&b);
}

static void test_valid_utf8_kept(void **state)
{
    StrBuf b = {0};
    /* é (2 bytes), € (3 bytes), 😀 (4 bytes), Cyrillic */
    assert_string_equal(one_text(&b, "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xd0\xb4"),
                        "{\"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xd0\xb4\"}");
    strbuf_free(&b);
}

static void test_cut_character_replaced(void **state)
{
    StrBuf b = {0};
    /* "topic name 'aaé" cut after the first byte of é: the tail byte becomes U+FFFD. */
    assert_string_equal(one_text(&b, "aa\xc3"), "{\"aa\xef\xbf\xbd\"}");
    strbuf_reset(&b);
    /* a 4-byte character cut after 3 bytes: each of its bytes is replaced */
    assert_string_equal(one_text(&b, "x\xf0\x9f\x98"),
                        "{\"x\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"}");
    strbuf_free(&b);
}

static void test_malformed_bytes_replaced(void **state)
{
    StrBuf b = {0};
    /* Latin-1 é, a lone continuation byte, an overlong '/', a UTF-16 surrogate, above U+10FFFF */
    const char *bad[] = {"\xe9", "\x80", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        strbuf_reset(&b);
        const char *out = one_text(&b, bad[i]);
        size_t replaced = strlen(bad[i]);
        assert_int_equal(strlen(out), 4 + 3 * replaced); /* {"..."} around the U+FFFDs */
        for (size_t k = 0; k < replaced; k++)
            assert_memory_equal(out + 2 + 3 * k, "\xef\xbf\xbd", 3);
    }
    strbuf_free(&b);
}

/* A length that wraps len + n + 1 past SIZE_MAX is out of memory (abort, with the message),
 * never a copy off the end of the buffer (before: the wrapped size looked small enough). */
static void test_append_size_overflow(void **state)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        StrBuf b = {0};
        strbuf_puts(&b, "abcd");
        strbuf_append(&b, "x", SIZE_MAX - 4);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ints_and_empty),
        cmocka_unit_test(test_text_quoting_and_null),
        cmocka_unit_test(test_valid_utf8_kept),
        cmocka_unit_test(test_cut_character_replaced),
        cmocka_unit_test(test_malformed_bytes_replaced),
        cmocka_unit_test(test_append_size_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
