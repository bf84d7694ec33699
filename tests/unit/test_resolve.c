/* Unit tests for resolve (relay/io/resolve.h): which hosts the relay looks up off the loop, a
 * lookup reported on the loop, a lookup given up on before it ends (no call, nothing leaked: the
 * sanitizers' leak check runs at exit; its answer is kept as a late one, which the next test's
 * first request may take), requests sharing one lookup, and a lookup given up on one loop (the
 * registry's start-up probe's, destroyed since) taken over by another. Names come from /etc/hosts
 * (localhost), so no nameserver is asked; a name ending in ".held" is looked up as localhost,
 * once the test lets it go (getaddrinfo below: a nameserver that has not answered yet). */
#include <dlfcn.h>
#include <netdb.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "resolve.h"

#include "fake_resolver.h"

static void test_needed(void **state)
{
    assert_true(resolve_needed("localhost"));
    assert_true(resolve_needed("db.example.com"));
    assert_true(resolve_needed("10.0.0.1.example")); /* a name that starts like an address */
    assert_false(resolve_needed(NULL));
    assert_false(resolve_needed(""));
    assert_false(resolve_needed("127.0.0.1"));
    assert_false(resolve_needed("::1"));
    assert_false(resolve_needed("fe80::1"));
    assert_false(resolve_needed("/var/run/postgresql"));
    assert_false(resolve_needed("@abstract"));
}

typedef struct {
    int calls, n;
    char addrs[256], error[160];
} Seen;

static void on_done(void *arg, const char *addrs, int n, const char *error)
{
    Seen *s = arg;
    s->calls++;
    s->n = n;
    if (addrs)
        snprintf(s->addrs, sizeof(s->addrs), "%s", addrs);
    if (error)
        snprintf(s->error, sizeof(s->error), "%s", error);
}

/* Runs the loop until the lookup has reported (at most ~10 s). */
static void run_until_called(struct ev_loop *loop, const Seen *s)
{
    for (int i = 0; i < 1000 && s->calls == 0; i++)
        ev_run(loop, EVRUN_ONCE | EVRUN_NOWAIT), usleep(10000);
}

static void test_lookup_reports_on_the_loop(void **state)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    Seen s = {0};
    char err[200];
    Resolve *r = resolve_start(loop, "localhost", on_done, &s, err, sizeof(err));
    assert_non_null(r);
    assert_int_equal(s.calls, 0); /* never from inside resolve_start */
    run_until_called(loop, &s);
    assert_int_equal(s.calls, 1);
    assert_true(s.n >= 1);
    assert_non_null(strstr(s.addrs, "127.0.0.1"));
    ev_loop_destroy(loop);
}

static void test_cancelled_lookup_is_not_reported(void **state)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    Seen s = {0};
    char err[200];
    Resolve *r = resolve_start(loop, "localhost", on_done, &s, err, sizeof(err));
    assert_non_null(r);
    resolve_cancel(r);
    /* Whether the thread had finished or not, nothing is called, now or later. */
    for (int i = 0; i < 20; i++)
        ev_run(loop, EVRUN_ONCE | EVRUN_NOWAIT), usleep(10000);
    assert_int_equal(s.calls, 0);
    resolve_cancel(NULL);
    ev_loop_destroy(loop);
}

/* Requests for a name while its lookup runs wait on that one: each hears the answer once, and
 * one given up on meanwhile is not called. */
static void test_requests_share_a_lookup(void **state)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    Seen a = {0}, b = {0}, c = {0};
    char err[200];
    Resolve *ra = resolve_start(loop, "localhost", on_done, &a, err, sizeof(err));
    Resolve *rb = resolve_start(loop, "localhost", on_done, &b, err, sizeof(err));
    Resolve *rc = resolve_start(loop, "localhost", on_done, &c, err, sizeof(err));
    assert_non_null(ra);
    assert_non_null(rb);
    assert_non_null(rc);
    resolve_cancel(rb);
    run_until_called(loop, &a);
    run_until_called(loop, &c);
    assert_int_equal(a.calls, 1);
    assert_int_equal(b.calls, 0);
    assert_int_equal(c.calls, 1);
    assert_string_equal(a.addrs, c.addrs);
    ev_loop_destroy(loop);
}

/* A lookup every waiter gave up on, on a loop destroyed since (the registry's start-up probe's),
 * is taken over by a request for the name on another loop: no second lookup, its answer reported
 * once on the new loop, the old loop's watcher never signalled (the sanitizers would see a use of
 * the destroyed loop). */
static void test_orphan_taken_over_by_another_loop(void **state)
{
    struct ev_loop *probe = ev_loop_new(EVFLAG_AUTO), *loop = ev_loop_new(EVFLAG_AUTO);
    Seen p = {0}, s = {0};
    char err[200];
    Resolve *rp = resolve_start(probe, "registry.held", on_done, &p, err, sizeof(err));
    assert_non_null(rp);
    for (int i = 0; i < 500 && held_count() == 0; i++)
        usleep(10000);
    assert_int_equal(held_count(), 1);
    resolve_cancel(rp);
    ev_loop_destroy(probe);
    Resolve *r = resolve_start(loop, "registry.held", on_done, &s, err, sizeof(err));
    assert_non_null(r);
    held_release();
    run_until_called(loop, &s);
    assert_int_equal(s.calls, 1);
    assert_non_null(strstr(s.addrs, "127.0.0.1"));
    assert_int_equal(p.calls, 0);
    assert_int_equal(held_count(), 1); /* one thread served both loops */
    ev_loop_destroy(loop);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_needed),
        cmocka_unit_test(test_lookup_reports_on_the_loop),
        cmocka_unit_test(test_cancelled_lookup_is_not_reported),
        cmocka_unit_test(test_requests_share_a_lookup),
        cmocka_unit_test(test_orphan_taken_over_by_another_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
