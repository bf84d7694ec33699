/* Unit tests for schema.h: the numbers the embedded migrations and the C code share are the same
 * on both sides (SQL cannot include the header, so a change on one side must fail here). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
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

/* Each bookkeeping column as a migration defines it: "name definition", spaces collapsed. */
static void test_bookkeeping_columns_match(void **state)
{
    /* The migrations align their column lists with runs of spaces: compare without them. */
    size_t total = 0;
    for (size_t i = 0; i < migration_count; i++)
        total += strlen(migration_files[i].sql) + 1;
    char *all = calloc(total + 1, 1);
    assert_non_null(all);
    char *w = all;
    for (size_t i = 0; i < migration_count; i++) {
        for (const char *r = migration_files[i].sql; *r; r++)
            if (*r != ' ' || (w > all && w[-1] != ' '))
                *w++ = *r;
        *w++ = '\n';
    }
#define CHECK_COLUMN(name, definition)                                                             \
    if (!strstr(all, name " " definition))                                                         \
        fail_msg("no migration defines %s %s", name, definition);
    SCHEMA_BOOKKEEPING_COLUMNS(CHECK_COLUMN)
#undef CHECK_COLUMN
    free(all);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_mask_matches_lane_count),
        cmocka_unit_test(test_wakeup_keys_match),
        cmocka_unit_test(test_bookkeeping_columns_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
