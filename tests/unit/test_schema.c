/* Unit tests for schema.h: the numbers the embedded migrations and the C code share are the same
 * on both sides (SQL cannot include the header, so a change on one side must fail here). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "migrate.h"
#include "schema.h"

/* True when some embedded migration contains text. */
static bool migrations_contain(const char *text)
{
    for (size_t i = 0; i < migration_count; i++)
        if (strstr(migration_files[i].sql, text))
            return true;
    return false;
}

static void test_lane_mask_matches_lane_count(void **state)
{
    char mask[16];
    snprintf(mask, sizeof(mask), "%d", LANE_COUNT - 1);
    assert_string_equal(mask, LANE_MASK);
    assert_true(migrations_contain("& " LANE_MASK ")::smallint"));
}

static void test_wakeup_keys_match(void **state)
{
    assert_true(migrations_contain("pg_advisory_xact_lock_shared(" LOCK_KEY_PRODUCING ")"));
    assert_true(migrations_contain("pg_try_advisory_lock(" LOCK_KEY_WAKEUP ")"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_mask_matches_lane_count),
        cmocka_unit_test(test_wakeup_keys_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
