/* Unit tests for lib/conndeadline.c on socket pairs: a connection still on the clock is shut down
 * at its deadline (its peer reads end-of-file), one whose request arrived (paused) is never cut,
 * a restarted one is cut again, and removing entries (also ones already cut) is safe; past the
 * room bound a new connection shuts down the oldest still on the clock, never a paused one. No
 * assertion depends on how fast the machine is: waits are bounded generously and only "cut
 * eventually" or "not cut while paused" is checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "conndeadline.h"

#define DEADLINE_S 0.2

/* True when fd reads end-of-file within ms milliseconds. */
static int eof_within(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1)
        return 0;
    char c;
    return recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

static void test_cut_pause_restart(void **state)
{
    char err[128];
    ConnDeadlines *d = conndeadline_new(DEADLINE_S, 0, err, sizeof(err));
    assert_non_null(d);
    int a[2], b[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);

    ConnDeadline *ea = conndeadline_add(d, a[0]); /* trickles: stays on the clock */
    ConnDeadline *eb = conndeadline_add(d, b[0]); /* its request arrives at once */
    assert_non_null(ea);
    assert_non_null(eb);
    conndeadline_pause(d, eb);

    assert_true(eof_within(a[1], 10000)); /* cut at its deadline */
    assert_int_equal(conndeadline_cut(d), 1);
    /* Paused: three deadlines later still open. */
    assert_false(eof_within(b[1], (int)(3 * DEADLINE_S * 1000)));
    assert_int_equal(conndeadline_cut(d), 1);

    conndeadline_restart(d, eb); /* kept alive: on the clock for the next request */
    assert_true(eof_within(b[1], 10000));
    assert_int_equal(conndeadline_cut(d), 2);

    conndeadline_remove(d, ea);
    conndeadline_remove(d, eb);
    conndeadline_remove(d, NULL);
    for (int i = 0; i < 2; i++) {
        close(a[i]);
        close(b[i]);
    }
    /* Freed with an entry still registered: it goes with the set. */
    int c[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, c), 0);
    assert_non_null(conndeadline_add(d, c[0]));
    conndeadline_free(d);
    conndeadline_free(NULL);
    close(c[0]);
    close(c[1]);
}

/* Past the room bound a new connection shuts down the oldest one still sending its request:
 * at the server's own limit libmicrohttpd stops accepting, and a probe waited behind a flood of
 * slow requests until the deadline cut them (here one no test reaches). One being handled
 * (paused) is never shut down for room, nor is the newcomer. */
static void test_room(void **state)
{
    char err[128];
    ConnDeadlines *d = conndeadline_new(600, 2, err, sizeof(err));
    assert_non_null(d);
    int a[2], b[2], c[2], e[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, c), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, e), 0);
    ConnDeadline *ea = conndeadline_add(d, a[0]); /* a slow request: the oldest */
    ConnDeadline *eb = conndeadline_add(d, b[0]); /* its request arrived: being handled */
    conndeadline_pause(d, eb);
    ConnDeadline *ec = conndeadline_add(d, c[0]); /* past the room: a makes way */
    assert_true(eof_within(a[1], 10000));
    assert_int_equal(conndeadline_evicted(d), 1);
    ConnDeadline *ee =
        conndeadline_add(d, e[0]); /* past it again: c, the oldest left on the clock */
    assert_true(eof_within(c[1], 10000));
    assert_int_equal(conndeadline_evicted(d), 2);
    assert_false(eof_within(b[1], 100));
    assert_false(eof_within(e[1], 100));
    /* A connection shut down for room stays off the clock when its response completes. */
    conndeadline_restart(d, ec);
    conndeadline_remove(d, ea);
    conndeadline_remove(d, ec);
    conndeadline_remove(d, eb); /* answered and closed */
    /* Room again (only e open): a new one shuts nothing down. */
    int g[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, g), 0);
    ConnDeadline *eg = conndeadline_add(d, g[0]);
    assert_false(eof_within(e[1], 100));
    assert_int_equal(conndeadline_evicted(d), 2);
    assert_int_equal(conndeadline_cut(d), 0);
    conndeadline_remove(d, ee);
    conndeadline_remove(d, eg);
    conndeadline_free(d);
    for (int i = 0; i < 2; i++) {
        close(a[i]);
        close(b[i]);
        close(c[i]);
        close(e[i]);
        close(g[i]);
    }
}

/* A newcomer whose request is still unread in its socket (libmicrohttpd starts its thread after
 * the add) is not the one shut down for room: with every older connection being handled (paused),
 * the next newcomer shut it down, and a probe that came with a burst was closed unread. Once no
 * newcomer can go, the watcher looks again until one can (its thread read what it sent, no whole
 * request: a slow sender), as it does for a kept-alive connection whose client pipelines
 * requests and reads no answer: at the server's own limit no newcomer comes to do it. */
static void test_room_spares_unread_request(void **state)
{
    char err[128];
    ConnDeadlines *d = conndeadline_new(600, 2, err, sizeof(err));
    assert_non_null(d);
    int a[2], b[2], p[2], n[2];
    int *all[] = {a, b, p, n};
    for (int i = 0; i < 4; i++)
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, all[i]), 0);
    ConnDeadline *ea = conndeadline_add(d, a[0]); /* both being handled */
    conndeadline_pause(d, ea);
    ConnDeadline *eb = conndeadline_add(d, b[0]);
    conndeadline_pause(d, eb);
    const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    const ssize_t len = (ssize_t)(sizeof(req) - 1);
    assert_int_equal(send(p[1], req, (size_t)len, 0), len);
    assert_int_equal(send(n[1], req, (size_t)len, 0), len);
    ConnDeadline *ep = conndeadline_add(d, p[0]); /* the probe: its request not read yet */
    ConnDeadline *en = conndeadline_add(d, n[0]); /* the next newcomer, past the room */
    assert_false(eof_within(p[1], 300));
    assert_false(eof_within(n[1], 1));
    assert_int_equal(conndeadline_evicted(d), 0);
    /* n's thread reads what it sent (as a slow sender's does): now it can go, the probe not. */
    char sink[sizeof(req)];
    assert_int_equal(recv(n[0], sink, sizeof(sink), 0), len);
    assert_true(eof_within(n[1], 10000));
    assert_int_equal(conndeadline_evicted(d), 1);
    assert_false(eof_within(p[1], 100));
    /* a answered, kept alive, its client's next requests unread in its socket: it was served,
     * so it can go (live a, b, p: one past the room). */
    assert_int_equal(send(a[1], req, (size_t)len, 0), len);
    conndeadline_restart(d, ea);
    assert_true(eof_within(a[1], 10000));
    assert_int_equal(conndeadline_evicted(d), 2);
    assert_false(eof_within(p[1], 100));
    assert_false(eof_within(b[1], 1));
    ConnDeadline *es_all[] = {ea, eb, ep, en};
    for (int i = 0; i < 4; i++)
        conndeadline_remove(d, es_all[i]);
    conndeadline_free(d);
    for (int i = 0; i < 4; i++) {
        close(all[i][0]);
        close(all[i][1]);
    }
}

/* Monotonic seconds, to tell a run of this test that was itself held up (a loaded machine). */
static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A newcomer whose request has not arrived yet (libmicrohttpd tells of a connection as it
 * accepts it, and the client sends its request after its connect returns) is not shut down for
 * room: past the room, with every older connection being handled, the add woke the watcher, which
 * found the newcomer's socket empty and shut it down, a probe closed before its request came. A
 * new connection gets 0.5 s (ROOM_YOUNG_S) before an empty socket makes it a candidate; the run
 * says nothing (skipped) when this test itself was held up that long between the add and the
 * arrival. */
static void test_room_spares_request_on_its_way(void **state)
{
    char err[128];
    ConnDeadlines *d = conndeadline_new(600, 2, err, sizeof(err));
    assert_non_null(d);
    int a[2], b[2], p[2];
    int *all[] = {a, b, p};
    for (int i = 0; i < 3; i++)
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, all[i]), 0);
    ConnDeadline *ea = conndeadline_add(d, a[0]); /* both being handled */
    conndeadline_pause(d, ea);
    ConnDeadline *eb = conndeadline_add(d, b[0]);
    conndeadline_pause(d, eb);
    double added = mono_s();
    ConnDeadline *ep = conndeadline_add(d, p[0]); /* the probe, past the room, nothing sent yet */
    int shut = eof_within(p[1], 200);
    /* Its request arrives and its thread reads the whole of it: off the clock. */
    const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    const ssize_t len = (ssize_t)(sizeof(req) - 1);
    if (!shut)
        assert_int_equal(send(p[1], req, (size_t)len, 0), len);
    char sink[sizeof(req)];
    ssize_t got = shut ? 0 : recv(p[0], sink, sizeof(sink), 0);
    conndeadline_pause(d, ep);
    double held = mono_s() - added;
    long evicted = conndeadline_evicted(d);
    conndeadline_remove(d, ea);
    conndeadline_remove(d, eb);
    conndeadline_remove(d, ep);
    conndeadline_free(d);
    for (int i = 0; i < 3; i++) {
        close(all[i][0]);
        close(all[i][1]);
    }
    if (held >= 0.4) {
        print_message("held up %.2fs between the add and the arrival: nothing to say\n", held);
        skip();
    }
    if (shut)
        fail_msg("the newcomer was shut down before its request arrived (evicted %ld)", evicted);
    assert_int_equal(got, len);
    assert_int_equal(evicted, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cut_pause_restart),
        cmocka_unit_test(test_room),
        cmocka_unit_test(test_room_spares_unread_request),
        cmocka_unit_test(test_room_spares_request_on_its_way),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
