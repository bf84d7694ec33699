/* Unit tests for consumer-demo's Kafka configuration check (consumer_check): --kafka may set
 * librdkafka properties, but none that the at-least-once contract depends on, nor the brokers,
 * under whichever of their names librdkafka accepts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "consumer.h"

/* consumer_check with one --kafka KEY=VALUE (key NULL: none); err receives the refusal. */
static bool check_with(const char *key, const char *value, char *err, size_t errlen)
{
    OptPair pair = {(char *)key, (char *)value};
    OptList list = {&pair, key ? 1 : 0};
    ConsumerConfig cfg = {.conninfo = "dbname=x",
                          .brokers = "127.0.0.1:9092",
                          .topic = "outbox.event.order",
                          .group = "shipping",
                          .kafka = &list};
    err[0] = '\0';
    return consumer_check(&cfg, err, errlen);
}

static void test_ordinary_properties_pass(void **state)
{
    char err[600];
    assert_true(check_with(NULL, NULL, err, sizeof(err)));
    assert_true(check_with("session.timeout.ms", "6000", err, sizeof(err)));
    assert_true(check_with("auto.commit.interval.ms", "1000", err, sizeof(err)));
    assert_true(check_with("client.id", "shipping-1", err, sizeof(err)));
}

static void test_locked_properties_are_refused(void **state)
{
    static const struct {
        const char *key, *value;
    } cases[] = {
        {"enable.auto.offset.store", "true"},
        {"enable.auto.commit", "false"},
        {"group.id", "someone-else"},
        {"bootstrap.servers", "10.0.0.1:9092"},
        /* librdkafka's own name for bootstrap.servers, which it is an alias of: before the fix
         * only the alias was compared, so this replaced --brokers. */
        {"metadata.broker.list", "10.0.0.1:9092"},
        {"metadata.broker.list", "127.0.0.1:9092"}, /* the same value: still not ours to set */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[600];
        if (check_with(cases[i].key, cases[i].value, err, sizeof(err)))
            fail_msg("--kafka %s=%s was accepted", cases[i].key, cases[i].value);
        if (!strstr(err, cases[i].key) || !strstr(err, "cannot be changed"))
            fail_msg("--kafka %s=%s: unexpected error '%s'", cases[i].key, cases[i].value, err);
    }
}

static void test_unknown_property_is_refused(void **state)
{
    char err[600];
    assert_false(check_with("no.such.property", "1", err, sizeof(err)));
    assert_non_null(strstr(err, "no.such.property"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ordinary_properties_pass),
        cmocka_unit_test(test_locked_properties_are_refused),
        cmocka_unit_test(test_unknown_property_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
