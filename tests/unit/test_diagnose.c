/* Unit tests for diagnose.c: identifiers quoted as quote_ident quotes them, and the statements the
 * claim floor's diagnosis suggests written with them (a result built without a server). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "diagnose.h"

static void expect_ident(const char *name, const char *expected)
{
    char buf[DIAGNOSE_IDENT_MAX];
    assert_string_equal(diagnose_quote_ident(name, buf, sizeof(buf)), expected);
}

static void test_quote_ident(void **state)
{
    /* As SELECT quote_ident(...) answers on PostgreSQL 15. */
    expect_ident("outbox", "outbox");
    expect_ident("_x9", "_x9");
    expect_ident("name", "name");       /* an unreserved keyword is a name as it is */
    expect_ident("order", "\"order\""); /* reserved */
    expect_ident("user", "\"user\"");
    expect_ident("all", "\"all\""); /* the first and the last of the list */
    expect_ident("xmltable", "\"xmltable\"");
    expect_ident("orders", "orders");
    expect_ident("Outbox Events", "\"Outbox Events\"");
    expect_ident("my-app", "\"my-app\"");
    expect_ident("9lives", "\"9lives\"");
    expect_ident("a$b", "\"a$b\"");
    expect_ident("Out\"box", "\"Out\"\"box\"");
    expect_ident("", "\"\"");
    expect_ident("café", "\"café\"");
    /* The longest name a TableMap holds, all quotes, fits. */
    char name[64], expected[DIAGNOSE_IDENT_MAX];
    memset(name, '"', 63);
    name[63] = '\0';
    memset(expected, '"', 128);
    expected[128] = '\0';
    expect_ident(name, expected);
    /* A buffer too small is cut, never overrun. */
    char small[6];
    assert_string_equal(diagnose_quote_ident("a\"bcd", small, sizeof(small)), "\"a\"\"\"");
    assert_string_equal(diagnose_quote_ident("Ab", small, 1), "");
}

static void test_quote_table(void **state)
{
    char err[256], buf[DIAGNOSE_TABLE_MAX];
    TableMap m;
    TableOptions plain = {.layout = LAYOUT_RELAY};
    assert_true(table_map_init(&m, &plain, err, sizeof(err)));
    assert_string_equal(diagnose_quote_table(&m, NULL, buf, sizeof(buf)), "outbox");
    /* Unqualified, the table is in --schema (the relay's pinned search_path). */
    assert_string_equal(diagnose_quote_table(&m, "app", buf, sizeof(buf)), "app.outbox");
    table_map_free(&m);
    TableOptions odd = {.layout = LAYOUT_RELAY, .table = "my-app.Outbox Events"};
    assert_true(table_map_init(&m, &odd, err, sizeof(err)));
    assert_string_equal(diagnose_quote_table(&m, "app", buf, sizeof(buf)),
                        "\"my-app\".\"Outbox Events\"");
    table_map_free(&m);
}

/* One row of diagnose_floor_sql's shape; NULL values are SQL NULLs. */
static PGresult *floor_result(const char *const values[])
{
    PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    PGresAttDesc attrs[11];
    memset(attrs, 0, sizeof(attrs));
    for (int i = 0; i < 11; i++) {
        attrs[i].name = (char *)"c";
        attrs[i].typid = 25;
        attrs[i].typlen = -1;
        attrs[i].atttypmod = -1;
    }
    assert_true(PQsetResultAttrs(res, 11, attrs));
    for (int i = 0; i < 11; i++)
        assert_true(
            PQsetvalue(res, 0, i, (char *)values[i], values[i] ? (int)strlen(values[i]) : -1));
    return res;
}

static void expect_floor(const TableOptions *o, const char *const values[], const char *fragment)
{
    TableMap m;
    char err[256], why[1024];
    assert_true(table_map_init(&m, o, err, sizeof(err)));
    PGresult *res = floor_result(values);
    assert_false(diagnose_floor(res, &m, why, sizeof(why)));
    if (!strstr(why, fragment))
        fail_msg("expected \"%s\" in \"%s\"", fragment, why);
    PQclear(res);
    table_map_free(&m);
}

static void test_floor_statements_quoted(void **state)
{
    TableOptions o = {
        .layout = LAYOUT_RELAY, .table = "my-app.Outbox Events", .seq_column = "order"};
    /* table, relkind, column, identity, sequence, cache, cycle, privilege, user, grantee, and the
     * table schema-qualified as the server writes it */
    const char *by_default[] = {"t",
                                "r",
                                "t",
                                "d",
                                "\"my-app\".\"Outbox Events_order_seq\"",
                                "1",
                                "f",
                                "t",
                                "app",
                                "outbox_relay",
                                "\"my-app\".\"Outbox Events\""};
    expect_floor(&o, by_default,
                 "ALTER TABLE \"my-app\".\"Outbox Events\" ALTER COLUMN \"order\" SET GENERATED "
                 "ALWAYS");
    const char *no_identity[] = {"t",
                                 "r",
                                 "t",
                                 "",
                                 NULL,
                                 NULL,
                                 NULL,
                                 NULL,
                                 "app",
                                 "outbox_relay",
                                 "\"my-app\".\"Outbox Events\""};
    expect_floor(&o, no_identity,
                 "ALTER TABLE \"my-app\".\"Outbox Events\" ALTER COLUMN \"order\" ADD GENERATED "
                 "ALWAYS AS IDENTITY");
    const char *no_column[] = {"t",
                               "r",
                               "f",
                               NULL,
                               NULL,
                               NULL,
                               NULL,
                               NULL,
                               "app",
                               "outbox_relay",
                               "\"my-app\".\"Outbox Events\""};
    expect_floor(&o, no_column, "has no column \"order\" (seq-column)");
    /* No table: named as configured, quoted. */
    const char *no_table[] = {"f",  NULL, NULL,  NULL,           NULL, NULL,
                              NULL, NULL, "app", "outbox_relay", NULL};
    expect_floor(&o, no_table, "the outbox table \"my-app\".\"Outbox Events\" does not exist");
    /* An unqualified --table: the statement names the schema it is in (the relay's search_path,
     * pinned to --schema, is not psql's); plain names stay unquoted. */
    TableOptions plain = {.layout = LAYOUT_RELAY};
    const char *in_app[] = {"t",         "r", "t", "d",   "app.outbox_id_seq",
                            "1",         "f", "t", "app", "outbox_relay",
                            "app.outbox"};
    expect_floor(&plain, in_app, "ALTER TABLE app.outbox ALTER COLUMN id SET GENERATED ALWAYS");
}

/* No SELECT on the sequence: a member of outbox_relay is told the GRANT to outbox_relay or to run
 * migrate again; a role that is not a member, the GRANT to itself or membership, never migrate
 * again (what migrate grants goes to outbox_relay and did not reach it). */
static void test_floor_privilege_advice(void **state)
{
    TableOptions plain = {.layout = LAYOUT_RELAY};
    const char *member[] = {"t",
                            "r",
                            "t",
                            "a",
                            "public.outbox_id_seq",
                            "1",
                            "f",
                            "f",
                            "app",
                            "outbox_relay",
                            "public.outbox"};
    expect_floor(&plain, member,
                 "GRANT SELECT ON SEQUENCE public.outbox_id_seq TO outbox_relay (or run "
                 "`outbox-relay migrate` again");
    const char *other[] = {"t",
                           "r",
                           "t",
                           "a",
                           "public.outbox_id_seq",
                           "1",
                           "f",
                           "f",
                           "Other Role",
                           "\"Other Role\"",
                           "public.outbox"};
    expect_floor(&plain, other,
                 "GRANT SELECT ON SEQUENCE public.outbox_id_seq TO \"Other Role\" (or make it a "
                 "member of outbox_relay, to which `outbox-relay migrate` grants it: GRANT "
                 "outbox_relay TO \"Other Role\")");
    TableMap m;
    char err[256], why[1024];
    assert_true(table_map_init(&m, &plain, err, sizeof(err)));
    PGresult *res = floor_result(other);
    assert_false(diagnose_floor(res, &m, why, sizeof(why)));
    if (strstr(why, "migrate` again"))
        fail_msg("\"%s\" advises migrate again, which does not reach the role", why);
    PQclear(res);
    table_map_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quote_ident),
        cmocka_unit_test(test_quote_table),
        cmocka_unit_test(test_floor_statements_quoted),
        cmocka_unit_test(test_floor_privilege_advice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
