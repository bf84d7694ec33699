/* Unit tests for sqlstate.c: which failures are a row's own, which pass, which need an operator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sqlstate.h"

/* Data and constraints refused, and a trigger's RAISE: only these may count against a row. */
static void test_row_faults(void **state)
{
    const char *row[] = {"22001", "22P02", "23505", "23503", "23514", "54000", "P0001", "P0004"};
    for (size_t i = 0; i < sizeof(row) / sizeof(row[0]); i++)
        assert_int_equal(sqlstate_fault(row[i]), SQLSTATE_FAULT_ROW);
}

/* The failures that pass by themselves, among them the consumer's and the relay's usual ones: a
 * failover's read-only window, deadlocks and serialization failures, a cancelled statement, a
 * lock timeout, resources, a shutdown, a broken connection (no state at all). */
static void test_transient_faults(void **state)
{
    const char *transient[] = {"08006", "0A000", "25006", "25P02", "40001",
                               "40P01", "53300", "53100", "55P03", "55006",
                               "57014", "57P01", "57P03", "58030", "XX000"};
    for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
        assert_int_equal(sqlstate_fault(transient[i]), SQLSTATE_FAULT_TRANSIENT);
    assert_int_equal(sqlstate_fault(NULL), SQLSTATE_FAULT_TRANSIENT);
    assert_int_equal(sqlstate_fault(""), SQLSTATE_FAULT_TRANSIENT);
}

/* Privileges, missing objects, authentication and anything unknown: never the row's. */
static void test_setup_faults(void **state)
{
    const char *setup[] = {"42501", "42P01", "42703", "42883", "28P01",
                           "3D000", "3F000", "39P01", "ZZ999"};
    for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++)
        assert_int_equal(sqlstate_fault(setup[i]), SQLSTATE_FAULT_SETUP);
}

static void test_names(void **state)
{
    assert_string_equal(sqlstate_fault_name(SQLSTATE_FAULT_ROW), "row");
    assert_string_equal(sqlstate_fault_name(SQLSTATE_FAULT_TRANSIENT), "transient");
    assert_string_equal(sqlstate_fault_name(SQLSTATE_FAULT_SETUP), "setup");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_faults),
        cmocka_unit_test(test_transient_faults),
        cmocka_unit_test(test_setup_faults),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
