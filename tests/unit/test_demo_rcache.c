/* Unit tests for the demos' Redis client (lib/rcache.c) without a Redis server: URL
 * parsing, and that an unreachable Redis costs one failed call, then calls that return at once
 * (skipped) until the retry interval passed, with one outage counted; a forced call is tried
 * anyway and reports that nothing was sent. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "rcache.h"

static void test_urls(void **state)
{
    char host[64], err[256];
    int port, db;
    assert_true(rcache_parse_url("redis://127.0.0.1:6379", host, sizeof(host), &port, &db, err,
                                 sizeof(err)));
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 6379);
    assert_int_equal(db, 0);
    assert_true(rcache_parse_url("redis://cache.internal:7000/3", host, sizeof(host), &port, &db,
                                 err, sizeof(err)));
    assert_string_equal(host, "cache.internal");
    assert_int_equal(port, 7000);
    assert_int_equal(db, 3);
    assert_true(
        rcache_parse_url("redis://[::1]:6380/", host, sizeof(host), &port, &db, err, sizeof(err)));
    assert_string_equal(host, "::1");
    assert_int_equal(port, 6380);
    static const char *const bad[] = {
        "",
        "http://h:1",
        "redis://",
        "redis://h",
        "redis://h:",
        "redis://h:0",
        "redis://h:65536",
        "redis://h:12x",
        "redis://h:1/16",
        "redis://h:1/x",
        "redis://:1",
        "redis://user:pw@h:1",
        "redis://[::1:1",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        if (rcache_parse_url(bad[i], host, sizeof(host), &port, &db, err, sizeof(err)))
            fail_msg("'%s' accepted", bad[i]);
        assert_non_null(strstr(err, "--redis-url"));
        assert_null(strchr(err, '\n'));
    }
    /* A password in the URL is refused without showing it (before, the error quoted the URL as
     * given), whatever the scheme and wherever its '@' ends up. */
    static const char *const with_password[] = {
        "redis://:hunter22@h:6379", "redis://app:hunter22@h:6379/1", "rediss://:hunter22@h:6379",
        ":hunter22@h:6379",         "redis://:hun/ter22@h:6379",     "redis://:hunter22@[::1]:6379",
    };
    for (size_t i = 0; i < sizeof(with_password) / sizeof(with_password[0]); i++) {
        assert_false(
            rcache_parse_url(with_password[i], host, sizeof(host), &port, &db, err, sizeof(err)));
        if (strstr(err, "hunter") || strstr(err, "ter22"))
            fail_msg("'%s' refused showing its password: %s", with_password[i], err);
        assert_non_null(strstr(err, "***@"));
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_unreachable(void **state)
{
    char err[256];
    /* Port 1 on loopback: nothing listens, the connect is refused at once. */
    RCache *c = rcache_new("redis://127.0.0.1:1", 2, 200, err, sizeof(err));
    assert_non_null(c);
    assert_null(rcache_command(c, "GET %s", "k"));
    RCacheStats s = rcache_stats(c);
    assert_false(s.up);
    assert_int_equal(s.failures, 1);
    assert_int_equal(s.outages, 1);
    /* Within the retry interval nothing is tried: no wait, counted as skipped. */
    double t0 = now_s();
    for (int i = 0; i < 5; i++)
        assert_null(rcache_command(c, "GET %s", "k"));
    s = rcache_stats(c);
    if (now_s() - t0 < RCACHE_RETRY_MS / 1000.0) {
        assert_int_equal(s.skipped, 5);
        assert_int_equal(s.failures, 1);
    }
    assert_int_equal(s.outages, 1); /* still the same outage */
    /* Forced: tried even while resting (one more failure, not a skip); the connect was refused,
     * so the command surely did not run (sent stays false). */
    long failures = s.failures;
    bool sent = true;
    assert_null(rcache_command_ex(c, true, &sent, "GET %s", "k"));
    assert_false(sent);
    s = rcache_stats(c);
    assert_int_equal(s.failures, failures + 1);
    assert_int_equal(s.outages, 1);
    rcache_free(c);
    rcache_free(NULL);
    assert_null(rcache_new("redis://h", 1, 100, err, sizeof(err)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_urls),
        cmocka_unit_test(test_unreachable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
