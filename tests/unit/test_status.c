/* Unit tests for status.c's list of the relays' pids, by which `status` looks up each session's
 * application name and user. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"
#include "strbuf.h"

/* A result shaped like SQL_RELAYS's first two columns (slot, pid), n rows of 7-digit pids. */
static PGresult *relays_of(int n)
{
    PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    PGresAttDesc attrs[2] = {
        {.name = "objid", .format = 0, .typid = 23, .typlen = 4, .atttypmod = -1},
        {.name = "pid", .format = 0, .typid = 23, .typlen = 4, .atttypmod = -1}};
    assert_non_null(res);
    assert_true(PQsetResultAttrs(res, 2, attrs));
    for (int i = 0; i < n; i++) {
        char slot[16], pid[16];
        snprintf(slot, sizeof(slot), "%d", i);
        snprintf(pid, sizeof(pid), "%d", 4190000 + i);
        assert_true(PQsetvalue(res, i, 0, slot, (int)strlen(slot)));
        assert_true(PQsetvalue(res, i, 1, pid, (int)strlen(pid)));
    }
    return res;
}

static void test_pid_array_holds_every_session(void **state)
{
    /* Past ~250 sessions a 2048-byte buffer was full: the rest were left out, and status showed
     * "-" for their application and user. */
    for (int n = 0; n <= 1000; n += 250) {
        PGresult *relays = relays_of(n);
        StrBuf got = {0}, want = {0};
        status_pid_array(relays, &got);
        strbuf_array_begin(&want);
        for (int i = 0; i < n; i++)
            strbuf_array_int(&want, 4190000 + i);
        strbuf_array_end(&want);
        assert_non_null(got.s);
        assert_string_equal(got.s, want.s);
        strbuf_free(&got);
        strbuf_free(&want);
        PQclear(relays);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pid_array_holds_every_session),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
