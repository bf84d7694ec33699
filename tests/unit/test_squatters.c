/* Unit tests for squatters.c: the two-look rule both the relay's upkeep and status/check apply to
 * SQL_LANE_SQUATTERS' rows (a slot holder without lanes counts only when the look before found it
 * so too; every other row at once), over results built in memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "squatters.h"

/* A look of n rows: pids[i] holding what[i] (the first two of the look's columns). */
static PGresult *look(int n, const int *pids, const char *const *what)
{
    PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    PGresAttDesc attrs[2] = {
        {.name = "pid", .typid = 23, .typlen = 4, .atttypmod = -1},
        {.name = "what", .typid = 25, .typlen = -1, .atttypmod = -1},
    };
    assert_non_null(res);
    assert_true(PQsetResultAttrs(res, 2, attrs));
    for (int i = 0; i < n; i++) {
        char pid[16];
        snprintf(pid, sizeof(pid), "%d", pids[i]);
        assert_true(PQsetvalue(res, i, 0, pid, (int)strlen(pid)));
        assert_true(PQsetvalue(res, i, 1, (char *)what[i], (int)strlen(what[i])));
    }
    return res;
}

/* At a first look (no look before): every row but a slot without lanes counts, and only the
 * latter is remembered. */
static void test_first_look(void **state)
{
    const int pids[] = {11, 12, 13, 14};
    const char *what[] = {"lanes-without-slot", "slot-without-lanes", "several-slots",
                          "stray-marks"};
    PGresult *r = look(4, pids, what);
    SquatSeen now = {0};
    assert_true(squat_counts(r, 0, NULL, &now));
    assert_false(squat_counts(r, 1, NULL, &now));
    assert_true(squat_counts(r, 2, NULL, &now));
    assert_true(squat_counts(r, 3, NULL, &now));
    assert_int_equal(now.n, 1);
    assert_int_equal(now.pids[0], 12);
    PQclear(r);
}

/* At the next look a slot without lanes counts only for a pid the look before found so: a relay
 * joining has taken its lanes by then, a new holder waits for the look after. */
static void test_second_look(void **state)
{
    const int pids1[] = {20, 21};
    const char *what1[] = {"slot-without-lanes", "slot-without-lanes"};
    PGresult *r1 = look(2, pids1, what1);
    SquatSeen before = {0};
    assert_false(squat_counts(r1, 0, NULL, &before));
    assert_false(squat_counts(r1, 1, NULL, &before));
    PQclear(r1);

    const int pids2[] = {20, 22, 21};
    const char *what2[] = {"slot-without-lanes", "slot-without-lanes", "several-slots"};
    PGresult *r2 = look(3, pids2, what2);
    SquatSeen now = {0};
    assert_true(squat_counts(r2, 0, &before, &now));  /* still so: counts */
    assert_false(squat_counts(r2, 1, &before, &now)); /* new: waits */
    assert_true(squat_counts(r2, 2, &before, &now));  /* another kind: at once */
    assert_int_equal(now.n, 2);
    assert_int_equal(now.pids[0], 20);
    assert_int_equal(now.pids[1], 22);

    /* A look that found none (zeroed) confirms nothing. */
    SquatSeen none = {0}, again = {0};
    assert_false(squat_counts(r2, 0, &none, &again));
    PQclear(r2);
}

/* Past SQUAT_SEEN_MAX holders a look remembers no more (memory bounded by the constant), and a
 * holder the look before remembered still counts. */
static void test_bounded(void **state)
{
    int n = SQUAT_SEEN_MAX + 8;
    int *pids = calloc((size_t)n, sizeof(int));
    const char **what = calloc((size_t)n, sizeof(char *));
    assert_non_null(pids);
    assert_non_null(what);
    for (int i = 0; i < n; i++) {
        pids[i] = 1000 + i;
        what[i] = "slot-without-lanes";
    }
    PGresult *r = look(n, pids, what);
    SquatSeen before = {.pids = {1000 + n - 1}, .n = 1};
    SquatSeen *now = calloc(1, sizeof(*now));
    assert_non_null(now);
    int counted = 0;
    for (int i = 0; i < n; i++)
        counted += squat_counts(r, i, &before, now);
    assert_int_equal(counted, 1); /* the last row, unremembered now, remembered before */
    assert_int_equal(now->n, SQUAT_SEEN_MAX);
    assert_int_equal(now->pids[SQUAT_SEEN_MAX - 1], 1000 + SQUAT_SEEN_MAX - 1);
    free(now);
    PQclear(r);
    free(what);
    free(pids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_look),
        cmocka_unit_test(test_second_look),
        cmocka_unit_test(test_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
