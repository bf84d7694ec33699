/* Unit test for producer-demo/pool.c: the pool's copy of its connection string (the password in
 * it) is zeroed when the pool is freed. This binary replaces free() with one that, while armed,
 * counts blocks freed holding the whole string, then hands each to the sanitizer's free. No
 * connection is made: pool_new connects nothing, pool_free closes only what was opened. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <string.h>

#include "pool.h"

static const char URL[] = "postgresql://u:pool-marker-R4vK@127.0.0.1:1/db";
static bool armed;
static size_t left; /* blocks freed holding URL whole while armed */

/* The sanitizer's free, which this one stands in front of (libasan names it so; without it, the
 * next free in line). */
extern void __interceptor_free(void *p) __attribute__((weak));

void free(void *p)
{
    static void (*real_free)(void *);
    if (!real_free)
        real_free =
            __interceptor_free ? __interceptor_free : (void (*)(void *))dlsym(RTLD_NEXT, "free");
    if (p && armed) {
        armed = false; /* malloc_usable_size and strcmp must not recurse into this */
        if (malloc_usable_size(p) > strlen(URL) && strcmp(p, URL) == 0)
            left++;
        armed = true;
    }
    real_free(p);
}

static void test_pool_conninfo_is_wiped(void **state)
{
    (void)state;
    left = 0;
    armed = true;
    DbPool *p = pool_new(URL, "SET statement_timeout = 1000", 2, "requests");
    assert_non_null(p);
    pool_free(p);
    armed = false;
    assert_int_equal(left, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_conninfo_is_wiped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
