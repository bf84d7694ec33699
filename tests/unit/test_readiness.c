/* Unit tests for readiness.c: the reasons /readyz, systemd's STATUS= and each database of a list
 * give, and that a setup fault's text reaches them scrubbed of secrets and on one line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "readiness.h"
#include "secrets.h"

static int reset(void **state)
{
    secrets_clear();
    return 0;
}

static RelayStatus working(void)
{
    return (RelayStatus){.postgres_up = true, .kafka_up = true, .registry_up = true};
}

static void test_ready(void **state)
{
    RelayStatus st = working();
    StrBuf why = {0};
    assert_true(readiness_judge(&st, 0, &why));
    assert_null(why.s);
    assert_false(readiness_judge(&st, 2, &why));
    assert_string_equal(why.s, " sessions that are not relays hold lane locks;");
    strbuf_free(&why);
}

static void test_reasons(void **state)
{
    RelayStatus st = {.stopping = true};
    StrBuf why = {0};
    assert_false(readiness_judge(&st, 0, &why));
    assert_string_equal(why.s, " postgres unreachable; kafka unreachable; schema registry "
                               "unavailable; shutting down;");
    strbuf_free(&why);
}

/* A relay away from Kafka (delivery timeouts in a row while other relays deliver) holds no
 * lanes by design: not ready, and /readyz says why, though a broker connection may be up. One
 * trying again holds its share and is ready (it may have no rows to try with for long). Away
 * with lanes (no member reaches Kafka: it keeps them) says so, not that they went to others. */
static void test_kafka_away(void **state)
{
    RelayStatus st = working();
    st.kafka_away = 1;
    StrBuf why = {0};
    assert_false(readiness_judge(&st, 0, &why));
    assert_string_equal(why.s, " kafka away: deliveries time out from this relay, its lanes go to "
                               "relays that reach kafka;");
    strbuf_free(&why);
    st.lanes_owned = 32; /* no member reaches Kafka: it keeps its lanes, and says so */
    assert_false(readiness_judge(&st, 0, &why));
    assert_string_equal(why.s, " kafka away: deliveries time out from this relay, and no relay "
                               "of its outbox reaches kafka: it keeps its lanes;");
    strbuf_free(&why);
    st.kafka_away = 2;
    assert_true(readiness_judge(&st, 0, &why));
    assert_null(why.s);
}

/* libpq echoes a connection string it cannot use, password and all; a server's message may
 * carry a value of the configuration too. */
static void test_setup_error_scrubbed(void **state)
{
    secrets_add_conninfo("postgres://relay:s3cr3t-pw@db/app");
    RelayStatus st = working();
    snprintf(st.setup_error, sizeof(st.setup_error),
             "permission denied for table outbox (as relay:s3cr3t-pw@db)");
    StrBuf why = {0};
    assert_false(readiness_judge(&st, 0, &why));
    assert_null(strstr(why.s, "s3cr3t-pw"));
    assert_string_equal(why.s, " claims fail until the setup is fixed: permission denied for "
                               "table outbox (as relay:***@db);");
    strbuf_free(&why);
}

/* A server's message may span lines, or hold a control character a writer of the table chose:
 * the body of /readyz and STATUS= stay one line. */
static void test_setup_error_one_line(void **state)
{
    RelayStatus st = working();
    snprintf(st.setup_error, sizeof(st.setup_error), "line one\nline two\x1b[2J");
    StrBuf why = {0};
    assert_false(readiness_judge(&st, 0, &why));
    assert_string_equal(why.s,
                        " claims fail until the setup is fixed: line one\\nline two\\x1b[2J;");
    strbuf_free(&why);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_ready, reset),
        cmocka_unit_test_setup(test_reasons, reset),
        cmocka_unit_test_setup(test_kafka_away, reset),
        cmocka_unit_test_setup(test_setup_error_scrubbed, reset),
        cmocka_unit_test_setup(test_setup_error_one_line, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
