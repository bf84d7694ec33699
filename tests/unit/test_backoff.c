/* Unit tests for backoff.c: exponential growth, jitter bounds, cap, reset and seeding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backoff.h"

#define assert_between(x, lo, hi)                                                                  \
    do {                                                                                           \
        double v_ = (x), lo_ = (lo), hi_ = (hi);                                                   \
        if (!(v_ >= lo_ && v_ <= hi_))                                                             \
            fail_msg("%s = %.17g is not in [%.17g, %.17g]", #x, v_, lo_, hi_);                     \
    } while (0)

/* What init sets shows in what next() returns: the first delay lies in [base/2, base], the
 * cap holds, a re-init forgets earlier failures, and the seed fixes the sequence. */
static void test_init(void **state)
{
    Backoff b, same;
    backoff_init(&b, 0.5, 30.0, 7);
    assert_between(backoff_next(&b), 0.25, 0.5);
    assert_between(backoff_next(&b), 0.5, 1.0);
    for (int i = 0; i < 20; i++)
        backoff_next(&b);
    assert_between(backoff_next(&b), 15.0, 30.0);
    backoff_init(&b, 0.5, 30.0, 7);
    backoff_init(&same, 0.5, 30.0, 7);
    double first = backoff_next(&b);
    assert_between(first, 0.25, 0.5);
    assert_true(first == backoff_next(&same));
}

static void test_seed_zero_picks_nonzero_state(void **state)
{
    Backoff b;
    backoff_init(&b, 1.0, 8.0, 0);
    assert_true(b.rng != 0);
    assert_between(backoff_next(&b), 0.5, 1.0);
    assert_between(backoff_next(&b), 1.0, 2.0);
}

static void test_exponential_within_jitter_bounds(void **state)
{
    Backoff b;
    backoff_init(&b, 0.1, 1000.0, 42);
    double nominal = 0.1;
    for (unsigned n = 0; n < 13; n++) { /* 0.1 * 2^12 = 409.6 < cap */
        double d = backoff_next(&b);
        assert_between(d, nominal / 2, nominal);
        assert_int_equal(b.failures, n + 1);
        nominal *= 2;
    }
}

static void test_grows(void **state)
{
    /* Two steps on, the smallest possible delay (2d) exceeds the largest possible one (d). */
    Backoff b;
    backoff_init(&b, 0.25, 1e6, 99);
    double d[16];
    for (int i = 0; i < 16; i++)
        d[i] = backoff_next(&b);
    for (int i = 0; i + 2 < 16; i++)
        assert_true(d[i + 2] > d[i]);
    assert_true(d[15] > 1000 * d[0]);
}

static void test_never_exceeds_cap(void **state)
{
    Backoff b;
    backoff_init(&b, 1.0, 10.0, 12345);
    for (int i = 0; i < 200; i++) {
        double d = backoff_next(&b);
        assert_between(d, 0, 10.0);
        if (i >= 4) /* nominal 16 > cap: capped at 10, so at least 5 */
            assert_between(d, 5.0, 10.0);
    }
    /* the failure count saturates instead of overflowing the exponent */
    assert_true(b.failures <= 64);
}

static void test_cap_below_base(void **state)
{
    Backoff b;
    backoff_init(&b, 5.0, 2.0, 3);
    for (int i = 0; i < 10; i++)
        assert_between(backoff_next(&b), 1.0, 2.0);
}

static void test_cap_not_power_of_two_multiple(void **state)
{
    /* base 1, cap 3: nominal 1, 2, then 3 (not 4) forever */
    Backoff b;
    backoff_init(&b, 1.0, 3.0, 77);
    assert_between(backoff_next(&b), 0.5, 1.0);
    assert_between(backoff_next(&b), 1.0, 2.0);
    for (int i = 0; i < 50; i++)
        assert_between(backoff_next(&b), 1.5, 3.0);
}

static void test_reset_starts_over(void **state)
{
    Backoff b;
    backoff_init(&b, 2.0, 600.0, 5);
    for (int i = 0; i < 6; i++)
        (void)backoff_next(&b);
    assert_int_equal(b.failures, 6);
    backoff_reset(&b);
    assert_int_equal(b.failures, 0);
    assert_between(backoff_next(&b), 1.0, 2.0);
    assert_between(backoff_next(&b), 2.0, 4.0);
    assert_between(backoff_next(&b), 4.0, 8.0);
    /* base and cap survive the reset */
    assert_true(b.base_s == 2.0);
    assert_true(b.cap_s == 600.0);
}

static void test_same_seed_same_sequence(void **state)
{
    Backoff a, b;
    backoff_init(&a, 0.1, 60.0, 0xdeadbeef);
    backoff_init(&b, 0.1, 60.0, 0xdeadbeef);
    for (int i = 0; i < 40; i++) {
        double x = backoff_next(&a), y = backoff_next(&b);
        if (x != y)
            fail_msg("step %d: %.17g != %.17g", i, x, y);
        if (i == 20) {
            backoff_reset(&a);
            backoff_reset(&b);
        }
    }
}

static void test_different_seeds_differ(void **state)
{
    Backoff a, b;
    backoff_init(&a, 1.0, 1e9, 1);
    backoff_init(&b, 1.0, 1e9, 2);
    int differ = 0;
    for (int i = 0; i < 20; i++)
        if (backoff_next(&a) != backoff_next(&b))
            differ++;
    assert_true(differ >= 18);
}

static void test_jitter_spreads(void **state)
{
    /* Many draws at the same failure count cover most of [d/2, d]. */
    Backoff b;
    backoff_init(&b, 8.0, 100.0, 2024);
    double lo = 1e9, hi = 0, sum = 0;
    for (int i = 0; i < 1000; i++) {
        backoff_reset(&b);
        double d = backoff_next(&b);
        assert_between(d, 4.0, 8.0);
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
        sum += d;
    }
    assert_true(lo < 4.2);
    assert_true(hi > 7.8);
    assert_between(sum / 1000, 5.7, 6.3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_seed_zero_picks_nonzero_state),
        cmocka_unit_test(test_exponential_within_jitter_bounds),
        cmocka_unit_test(test_grows),
        cmocka_unit_test(test_never_exceeds_cap),
        cmocka_unit_test(test_cap_below_base),
        cmocka_unit_test(test_cap_not_power_of_two_multiple),
        cmocka_unit_test(test_reset_starts_over),
        cmocka_unit_test(test_same_seed_same_sequence),
        cmocka_unit_test(test_different_seeds_differ),
        cmocka_unit_test(test_jitter_spreads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
