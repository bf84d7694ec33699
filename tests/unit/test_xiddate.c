/* Unit tests for xiddate.c: dating a transaction id from (time, next transaction id) samples kept
 * in bounded memory, as the vacuum horizon look dates a replication slot's xmin. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "xiddate.h"

#define assert_between(x, lo, hi)                                                                  \
    do {                                                                                           \
        double v_ = (x), lo_ = (lo), hi_ = (hi);                                                   \
        if (!(v_ >= lo_ && v_ <= hi_))                                                             \
            fail_msg("%s = %.17g is not in [%.17g, %.17g]", #x, v_, lo_, hi_);                     \
    } while (0)

/* A look every 5 s, the next transaction id 1000 + 10 per second (time in seconds from 0). */
static void look(XidDates *d, double t)
{
    xiddate_sample(d, 1000 + (long long)(10 * t), t);
}

/* Before any transaction passed it, an id holds nothing; once one has, it is dated by the first
 * look that saw it, and an id older than the first look by that look (a lower bound). */
static void test_dates_from_first_look_past(void **state)
{
    (void)state;
    XidDates d;
    xiddate_init(&d);
    assert_true(xiddate_held(&d, 5, 0) == 0.0);
    xiddate_sample(&d, 100, 10);
    assert_true(xiddate_held(&d, 100, 12) == 0.0); /* the next id: nothing past it */
    assert_true(xiddate_held(&d, 5, 12) == 2.0);   /* before the first look: from it */
    xiddate_sample(&d, 100, 15);                   /* no transaction since: no sample */
    xiddate_sample(&d, 110, 20);
    assert_true(xiddate_held(&d, 100, 30) == 10.0);
    assert_true(xiddate_held(&d, 100, 40) == 20.0);
}

/* A relay that has looked for a day dates an id first passed an hour, or six, ago (a slot's
 * xmin that moved on to one almost as old, overlapping queries on a standby) within a quarter
 * of its age. Thinned as "the first and every other after", each sample but the first was gone
 * after six thinnings: the samples reached back 16 minutes and then to the first look, and
 * such an id was dated 16 minutes ago (held_seconds never past it, --horizon-warn 30m never
 * logged), or, before the second sample, a day ago. */
static void test_reaches_back_with_relative_precision(void **state)
{
    (void)state;
    XidDates d;
    xiddate_init(&d);
    double t = 0;
    for (; t <= 86400; t += 5)
        look(&d, t);
    t -= 5;
    static const double ages[] = {60, 600, 3600, 6 * 3600, 20 * 3600};
    for (size_t i = 0; i < sizeof(ages) / sizeof(ages[0]); i++) {
        XidDates c = d; /* a fresh date each (none cached) */
        long long xid = 1000 + (long long)(10 * (t - ages[i])) - 1;
        assert_between(xiddate_held(&c, xid, t), 0.75 * ages[i], ages[i] + 5);
    }
    assert_true(xiddate_held(&d, 999, t) == t); /* before the first look: from it */
}

/* An id dated once keeps its date while the samples thin: its held time only grows. */
static void test_dated_id_never_younger(void **state)
{
    (void)state;
    XidDates d;
    xiddate_init(&d);
    look(&d, 0);
    look(&d, 5);
    double last = 0;
    for (double t = 10; t <= 3600; t += 5) {
        look(&d, t);
        double held = xiddate_held(&d, 1010, t);
        assert_true(held >= last);
        last = held;
    }
    assert_true(last == 3600 - 5);
}

/* The next transaction id went backwards: the upkeep now looks at another server (a failover to
 * a standby that lagged, a restore), whose ids the samples never saw pass. They are dropped, and
 * dating starts over from this look, the first of that server: a slot made there after the
 * failover is held from when it is first seen past, not from when the old server passed its id.
 * Kept, the samples were never added to until the new server passed the old one's last id, and
 * such a slot's xmin was dated by the old server's first sample past it: 900 s at once (a week's
 * relay: a week), the held gauge's alert and --horizon-warn's line with it. */
static void test_next_xid_backwards_starts_over(void **state)
{
    (void)state;
    XidDates d;
    xiddate_init(&d);
    for (double t = 0; t <= 1000; t += 5)
        look(&d, t);                               /* ids 1000 to 11000 */
    assert_false(xiddate_sample(&d, 11000, 1005)); /* no transaction since: no reset */
    /* A standby promoted at id 2500 (it had replayed the old server's first 150 s). */
    bool reset = xiddate_sample(&d, 2500, 1010);
    assert_true(xiddate_held(&d, 2400, 1010) == 0.0); /* first seen past now */
    assert_false(xiddate_sample(&d, 2600, 1015));
    assert_true(xiddate_held(&d, 2400, 1020) == 10.0);
    assert_true(xiddate_held(&d, 2550, 1020) == 5.0);
    assert_true(reset); /* said once, */
    assert_int_equal(d.n, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dates_from_first_look_past),
        cmocka_unit_test(test_reaches_back_with_relative_precision),
        cmocka_unit_test(test_dated_id_never_younger),
        cmocka_unit_test(test_next_xid_backwards_starts_over),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
