/* Unit tests for consumer-demo/event.c: which messages are applied, ignored or parked, and that
 * every reason is one printable line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "event.h"

#define UUID "0b3c1f5e-6a4d-4c8e-9f21-7d5e8a9b0c1d"
#define GOOD "{\"id\":\"o-1\",\"customer_id\":\"c-7\",\"amount_cents\":4200,\"currency\":\"EUR\"}"

static EventInput input(const char *id, const char *type, const char *payload)
{
    return (EventInput){.id = id,
                        .id_len = id ? strlen(id) : 0,
                        .type = type,
                        .type_len = type ? strlen(type) : 0,
                        .payload = payload,
                        .payload_len = payload ? strlen(payload) : 0};
}

static EventVerdict classify(EventInput in, OrderEvent *out, char *reason)
{
    EventVerdict v = event_parse(&in, out, reason, 256);
    for (const char *p = reason; v != EVENT_APPLY && *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            fail_msg("reason has a non-printable byte: %s", reason);
    return v;
}

static void test_order_created(void **state)
{
    OrderEvent ev;
    char reason[256];
    assert_int_equal(classify(input(UUID, "OrderCreated", GOOD), &ev, reason), EVENT_APPLY);
    assert_string_equal(ev.event_id, UUID);
    assert_string_equal(ev.order_id, "o-1");
    assert_string_equal(ev.customer_id, "c-7");
    assert_true(ev.amount_cents == 4200);
    assert_string_equal(ev.currency, "EUR");
}

static void test_extra_fields_and_upper_case_id(void **state)
{
    /* A tolerant reader: producers may add fields (the load generator adds version). */
    OrderEvent ev;
    char reason[256];
    const char *payload = "{\"id\":\"o-2\",\"customer_id\":\"c\",\"amount_cents\":1,"
                          "\"currency\":\"USD\",\"version\":1,\"status\":\"created\"}";
    assert_int_equal(
        classify(input("0B3C1F5E-6A4D-4C8E-9F21-7D5E8A9B0C1D", "OrderCreated", payload), &ev,
                 reason),
        EVENT_APPLY);
    assert_string_equal(ev.event_id, UUID); /* one spelling per event in processed_events */
}

static void test_other_event_types_are_ignored(void **state)
{
    OrderEvent ev;
    char reason[256];
    assert_int_equal(classify(input(UUID, "OrderAmended", "{}"), &ev, reason), EVENT_IGNORE);
    assert_non_null(strstr(reason, "OrderAmended"));
    assert_int_equal(classify(input(UUID, "ordercreated", GOOD), &ev, reason), EVENT_IGNORE);
    assert_int_equal(classify(input(UUID, "OrderCreatedX", GOOD), &ev, reason), EVENT_IGNORE);
}

static void test_bad_headers_are_malformed(void **state)
{
    OrderEvent ev;
    char reason[256];
    assert_int_equal(classify(input(NULL, "OrderCreated", GOOD), &ev, reason), EVENT_MALFORMED);
    assert_string_equal(reason, "no id header");
    assert_int_equal(classify(input("", "OrderCreated", GOOD), &ev, reason), EVENT_MALFORMED);
    assert_int_equal(classify(input("not-a-uuid", "OrderCreated", GOOD), &ev, reason),
                     EVENT_MALFORMED);
    assert_int_equal(classify(input(UUID "0", "OrderCreated", GOOD), &ev, reason), EVENT_MALFORMED);
    assert_int_equal(
        classify(input("0b3c1f5e06a4d-4c8e-9f21-7d5e8a9b0c1d", "OrderCreated", GOOD), &ev, reason),
        EVENT_MALFORMED);
    assert_int_equal(classify(input("\xff\xfe\n\x01", "OrderCreated", GOOD), &ev, reason),
                     EVENT_MALFORMED);
    assert_int_equal(classify(input(UUID, NULL, GOOD), &ev, reason), EVENT_MALFORMED);
    assert_string_equal(reason, "no event_type header");
}

static void test_unclear_headers_are_malformed(void **state)
{
    OrderEvent ev;
    char reason[256];
    EventInput in = input(UUID, "OrderCreated", GOOD);
    in.id_differs = true; /* two ids: which event is it? */
    assert_int_equal(classify(in, &ev, reason), EVENT_MALFORMED);
    assert_string_equal(reason, "id headers with different values");
    in = input(UUID, "OrderCreated", GOOD);
    in.type_differs = true;
    assert_int_equal(classify(in, &ev, reason), EVENT_MALFORMED);
    assert_string_equal(reason, "event_type headers with different values");
    in = input(NULL, "OrderCreated", GOOD);
    in.id_null = true;
    assert_int_equal(classify(in, &ev, reason), EVENT_MALFORMED);
    assert_string_equal(reason, "id header without a value");
    in = input(UUID, NULL, GOOD);
    in.type_null = true;
    assert_int_equal(classify(in, &ev, reason), EVENT_MALFORMED);
    assert_string_equal(reason, "event_type header without a value");
}

static void test_bad_payloads_are_malformed(void **state)
{
    static const char *const payloads[] = {
        NULL,
        "",
        "garbage",
        "[1,2]",
        "\"text\"",
        "{\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\"}",
        "{\"id\":\"\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\"}",
        "{\"id\":7,\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\"}",
        "{\"id\":\"o\\n1\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\"}",
        "{\"id\":\"o\",\"amount_cents\":1,\"currency\":\"EUR\"}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":0,\"currency\":\"EUR\"}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1.5,\"currency\":\"EUR\"}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":\"1\",\"currency\":\"EUR\"}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"eur\"}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EURO\"}",
        /* a name twice: which value counts depends on the reader, so none is applied */
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,\"amount_cents\":999,"
        "\"currency\":\"EUR\"}",
        "{\"id\":\"o\",\"id\":\"p\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\"}",
    };
    for (size_t i = 0; i < sizeof(payloads) / sizeof(payloads[0]); i++) {
        OrderEvent ev;
        char reason[256] = "";
        if (classify(input(UUID, "OrderCreated", payloads[i]), &ev, reason) != EVENT_MALFORMED)
            fail_msg("payload %s was not classified as malformed", payloads[i]);
        assert_true(strlen(reason) > 0);
    }
}

static void test_duplicate_field_reason(void **state)
{
    OrderEvent ev;
    char reason[256];
    const char *payload = "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,"
                          "\"currency\":\"EUR\",\"currency\":\"USD\"}";
    assert_int_equal(classify(input(UUID, "OrderCreated", payload), &ev, reason), EVENT_MALFORMED);
    assert_non_null(strstr(reason, "payload has a field twice"));
    assert_non_null(strstr(reason, "currency"));
}

static void test_long_text_fields(void **state)
{
    char payload[700], id[300];
    OrderEvent ev;
    char reason[256];
    memset(id, 'o', 255);
    id[255] = '\0';
    snprintf(payload, sizeof(payload),
             "{\"id\":\"%s\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\"}", id);
    assert_int_equal(classify(input(UUID, "OrderCreated", payload), &ev, reason), EVENT_APPLY);
    assert_int_equal(strlen(ev.order_id), 255);
    id[255] = 'o';
    id[256] = '\0';
    snprintf(payload, sizeof(payload),
             "{\"id\":\"%s\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\"}", id);
    assert_int_equal(classify(input(UUID, "OrderCreated", payload), &ev, reason), EVENT_MALFORMED);
}

static void test_payload_is_not_nul_terminated(void **state)
{
    /* Kafka values are byte ranges: the parser must stop at the length, not at a NUL. */
    char buf[sizeof(GOOD) + 8];
    memcpy(buf, GOOD, strlen(GOOD));
    memcpy(buf + strlen(GOOD), "garbage", 8);
    EventInput in = {.id = UUID,
                     .id_len = 36,
                     .type = "OrderCreated",
                     .type_len = 12,
                     .payload = buf,
                     .payload_len = strlen(GOOD)};
    OrderEvent ev;
    char reason[256];
    assert_int_equal(event_parse(&in, &ev, reason, sizeof(reason)), EVENT_APPLY);
}

/* OrderUpdated carries the whole order plus its version and status; both are required there,
 * optional (defaults 1 and "created") but checked on OrderCreated. */
static void test_order_updated(void **state)
{
    OrderEvent ev;
    char reason[256];
    const char *good = "{\"id\":\"o-1\",\"customer_id\":\"c\",\"amount_cents\":7,"
                       "\"currency\":\"EUR\",\"status\":\"confirmed\",\"version\":3}";
    assert_int_equal(classify(input(UUID, "OrderUpdated", good), &ev, reason), EVENT_APPLY);
    assert_true(ev.updated);
    assert_int_equal(ev.version, 3);
    assert_int_equal(ev.amount_cents, 7);
    assert_string_equal(ev.status, "confirmed");
    assert_int_equal(classify(input(UUID, "OrderCreated", GOOD), &ev, reason), EVENT_APPLY);
    assert_false(ev.updated);
    assert_int_equal(ev.version, 1);
    assert_string_equal(ev.status, "created");
    static const char *const bad_updates[] = {
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\","
        "\"status\":\"created\"}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\","
        "\"version\":2}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\","
        "\"status\":\"created\",\"version\":0}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\","
        "\"status\":\"created\",\"version\":2147483648}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\","
        "\"status\":\"created\",\"version\":\"2\"}",
        "{\"id\":\"o\",\"customer_id\":\"c\",\"amount_cents\":1,\"currency\":\"EUR\","
        "\"status\":\"\",\"version\":2}",
    };
    for (size_t i = 0; i < sizeof(bad_updates) / sizeof(bad_updates[0]); i++)
        if (classify(input(UUID, "OrderUpdated", bad_updates[i]), &ev, reason) != EVENT_MALFORMED)
            fail_msg("OrderUpdated %s was not classified as malformed", bad_updates[i]);
    /* The same version 0 on OrderCreated is checked too. */
    assert_int_equal(classify(input(UUID, "OrderCreated", bad_updates[2]), &ev, reason),
                     EVENT_MALFORMED);
}

/* The payload digest is SHA-256 of the value's raw bytes (as sha256sum and PostgreSQL's sha256()
 * give it): the same JSON spelt with other whitespace is other content, as a redelivery always
 * carries the very bytes of its first copy. */
static void test_payload_digest(void **state)
{
    OrderEvent ev;
    char reason[256];
    assert_int_equal(classify(input(UUID, "OrderCreated", GOOD), &ev, reason), EVENT_APPLY);
    assert_string_equal(ev.payload_sha256,
                        "a8b678ce230616104850289c2b9d113f046f0252652dd3835eb4fd2d5d4f34b4");
    const char *spaced = "{\"id\": \"o-1\",\"customer_id\":\"c-7\",\"amount_cents\":4200,"
                         "\"currency\":\"EUR\"}";
    assert_int_equal(classify(input(UUID, "OrderCreated", spaced), &ev, reason), EVENT_APPLY);
    assert_string_equal(ev.payload_sha256,
                        "b9b295a71e23353458462dcbee87b3a1b2a05cdf245012ae8be93b02a20c3b98");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_created),
        cmocka_unit_test(test_order_updated),
        cmocka_unit_test(test_extra_fields_and_upper_case_id),
        cmocka_unit_test(test_other_event_types_are_ignored),
        cmocka_unit_test(test_bad_headers_are_malformed),
        cmocka_unit_test(test_unclear_headers_are_malformed),
        cmocka_unit_test(test_bad_payloads_are_malformed),
        cmocka_unit_test(test_duplicate_field_reason),
        cmocka_unit_test(test_long_text_fields),
        cmocka_unit_test(test_payload_is_not_nul_terminated),
        cmocka_unit_test(test_payload_digest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
