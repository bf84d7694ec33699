/* Unit tests for db.c's start-up check of a connection string: a string that does not parse is
 * refused with libpq's reason, but never with the text it quotes from the string (issue 46: a
 * --database-url-file pointed at a token file printed the token). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "db.h"

static void test_check_conninfo_hides_input(void **state)
{
    char err[512];
    assert_false(db_check_conninfo("ghp_16C7e42F292c6912E7710c838347Ae178B4a", err, sizeof(err)));
    assert_non_null(strstr(err, "database URL: invalid connection string: "));
    assert_non_null(strstr(err, "missing \"=\"")); /* what was expected stays */
    assert_null(strstr(err, "16C7e42F"));
    assert_false(db_check_conninfo("host=h s3cr3tkey=v", err, sizeof(err)));
    assert_null(strstr(err, "s3cr3tkey"));
    assert_false(db_check_conninfo("host=h ab", err, sizeof(err)));
    assert_null(strstr(err, "\"ab\""));
    assert_true(db_check_conninfo("postgresql://u@localhost/x", err, sizeof(err)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_conninfo_hides_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
