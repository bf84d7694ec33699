/* Unit tests for message: the partition and timestamp an outbox row gives its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "message.h"

static const TableMap map = {.partition = "part", .timestamp = "occurred_at"};

/* Neither column: librdkafka's defaults (partition by key, timestamp now). */
static void test_defaults(void **state)
{
    OutboxRow row = {0};
    MessageParts parts;
    char err[256];
    assert_true(message_parts(&row, &map, &parts, err, sizeof(err)));
    assert_int_equal(parts.partition, MESSAGE_PARTITION_ANY);
    assert_int_equal(parts.timestamp_ms, 0);
}

static void test_values(void **state)
{
    OutboxRow row = {.partition = "2", .timestamp_ms = "1764201600123"};
    MessageParts parts;
    char err[256];
    assert_true(message_parts(&row, &map, &parts, err, sizeof(err)));
    assert_int_equal(parts.partition, 2);
    assert_int_equal(parts.timestamp_ms, 1764201600123LL);
}

static void expect_fault(const char *partition, const char *ts, const char *fragment)
{
    OutboxRow row = {.partition = partition, .timestamp_ms = ts};
    MessageParts parts;
    char err[256] = "";
    assert_false(message_parts(&row, &map, &parts, err, sizeof(err)));
    if (!strstr(err, fragment))
        fail_msg("error \"%s\" lacks \"%s\"", err, fragment);
}

/* A value that is no partition or timestamp is the row's fault, said with the column's name. */
static void test_faults(void **state)
{
    expect_fault("-1", NULL, "partition column part: '-1'");
    expect_fault("x", NULL, "not a partition number");
    expect_fault("2147483648", NULL, "not a partition number");
    expect_fault("1.5", NULL, "not a partition number");
    expect_fault(NULL, "-5", "timestamp column occurred_at");
    expect_fault(NULL, "", "timestamp column occurred_at");
    /* From this review: strtoll took leading white space and a sign, so a text column's " 3"
     * or "+3" was partition 3; the text of an integer has neither. */
    expect_fault(" 3", NULL, "not a partition number");
    expect_fault("+3", NULL, "not a partition number");
    expect_fault("\t3", NULL, "not a partition number");
    expect_fault(NULL, " 1764201600123", "timestamp column occurred_at");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
