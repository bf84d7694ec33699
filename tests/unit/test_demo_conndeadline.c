/* Unit tests for lib/conndeadline.c on socket pairs: a connection still on the clock is shut down
 * at its deadline (its peer reads end-of-file), one whose request arrived (paused) is never cut,
 * a restarted one is cut again, and removing entries (also ones already cut) is safe. No
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
    ConnDeadlines *d = conndeadline_new(DEADLINE_S, err, sizeof(err));
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cut_pause_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
