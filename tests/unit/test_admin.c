/* Unit tests for admin.c's wait arithmetic: each poll() toward a statement's deadline. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <limits.h>
#include <math.h>

#include "admin.h"

static void test_poll_ms_far_deadline_is_bounded(void **state)
{
    (void)state;
    /* replay's batch bound at its largest: --statement-timeout 1d, plus ten times a summary
     * that took its whole bound (ten days): 101 days. Cast to int, 8.7e9 ms became negative, and
     * poll() waited for ever. */
    double far[] = {24.9 * 86400, 101.0 * 86400, 1e12, INFINITY};
    for (size_t i = 0; i < sizeof(far) / sizeof(far[0]); i++) {
        int ms = admin_poll_ms(far[i]);
        assert_true(ms > 0);
        assert_int_equal(ms, ADMIN_POLL_MAX_MS);
    }
}

static void test_poll_ms_near_deadline(void **state)
{
    (void)state;
    assert_int_equal(admin_poll_ms(2.5), 2501);
    assert_int_equal(admin_poll_ms(0.0004), 1);
    /* Reached, passed, or not a number: one more look without waiting long. */
    assert_int_equal(admin_poll_ms(0), 1);
    assert_int_equal(admin_poll_ms(-5), 1);
    assert_int_equal(admin_poll_ms(NAN), 1);
    /* Just under the cap: as asked. */
    assert_int_equal(admin_poll_ms(3599.0), 3599001);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poll_ms_far_deadline_is_bounded),
        cmocka_unit_test(test_poll_ms_near_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
