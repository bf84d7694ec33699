/* Unit test for producer-demo/pool.c: the pool's copy of its connection string (the password in
 * it) is zeroed when the pool is freed. This binary replaces free() with counting_free.h's, which
 * counts the blocks freed holding the whole string, then hands each to the sanitizer's free. No
 * connection is made: pool_new connects nothing, pool_free closes only what was opened. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "counting_free.h"
#include "pool.h"

static const char URL[] = "postgresql://u:pool-marker-R4vK@127.0.0.1:1/db";

static void test_pool_conninfo_is_wiped(void **state)
{
    (void)state;
    free_alone = URL; /* the blocks freed holding URL whole */
    freed_alone = 0;
    free_armed = true;
    DbPool *p = pool_new(URL, "SET statement_timeout = 1000", 2, "requests");
    assert_non_null(p);
    pool_free(p);
    free_armed = false;
    assert_int_equal(freed_alone, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_conninfo_is_wiped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
