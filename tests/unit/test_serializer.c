/* Unit tests for serializer: Confluent's wire format and the Avro and JSON Schema encodings, by
 * a schema at hand (no registry). The Avro bytes are checked against the specification's binary
 * encoding, worked out by hand: zigzag varints, length-prefixed strings, union branch indexes,
 * array blocks. tests/it/delivery/98_schema_registry.sh checks the same with Confluent's own
 * client. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serializer.h"

static const char *order_schema =
    "{\"type\": \"record\", \"name\": \"Order\", \"fields\": ["
    " {\"name\": \"id\", \"type\": \"string\"}, {\"name\": \"n\", \"type\": \"long\"},"
    " {\"name\": \"note\", \"type\": [\"null\", \"string\"]},"
    " {\"name\": \"st\", \"type\": {\"type\": \"enum\", \"name\": \"S\", \"symbols\": [\"A\", "
    "\"B\"]}},"
    " {\"name\": \"q\", \"type\": {\"type\": \"array\", \"items\": \"int\"}}]}";

static SerializerOutcome encode(ValueFormat f, RegistrySchema *rs, const char *payload, char **out,
                                size_t *len, char *err)
{
    return serializer_encode_schema(f, rs, "t-value", payload, strlen(payload), out, len, err, 256);
}

static void test_avro_bytes(void **state)
{
    RegistrySchema rs = {
        .id = 258, .type = REGISTRY_AVRO, .subject = "t-value", .text = order_schema};
    char *out = NULL, err[256] = "";
    size_t len = 0;
    assert_int_equal(
        encode(VALUE_AVRO, &rs,
               "{\"id\": \"ab\", \"n\": -2, \"note\": \"x\", \"st\": \"B\", \"q\": [1, 64],"
               " \"extra\": true}",
               &out, &len, err),
        SERIALIZER_OK);
    /* 0, id 258 big-endian; "ab" (len 2 -> 04); -2 -> 03; union branch 1 -> 02, "x" -> 02 78;
     * enum 1 -> 02; array block of 2 -> 04, 1 -> 02, 64 -> 80 01, end 00. */
    const unsigned char want[] = {0,    0,    0,   1,    2,    0x04, 'a',  'b',  0x03,
                                  0x02, 0x02, 'x', 0x02, 0x04, 0x02, 0x80, 0x01, 0x00};
    assert_int_equal(len, sizeof(want));
    assert_memory_equal(out, want, sizeof(want));
    free(out);
    /* A missing nullable field is null (branch 0); the value is reused row after row. */
    assert_int_equal(encode(VALUE_AVRO, &rs, "{\"id\": \"\", \"n\": 0, \"st\": \"A\", \"q\": []}",
                            &out, &len, err),
                     SERIALIZER_OK);
    const unsigned char want2[] = {0, 0, 0, 1, 2, 0x00, 0x00, 0x00, 0x00, 0x00};
    assert_int_equal(len, sizeof(want2));
    assert_memory_equal(out, want2, sizeof(want2));
    free(out);
    serializer_schema_release(&rs);
}

static void expect_fault(ValueFormat f, RegistrySchema *rs, const char *payload,
                         const char *fragment)
{
    char *out = NULL, err[256] = "";
    size_t len;
    assert_int_equal(encode(f, rs, payload, &out, &len, err), SERIALIZER_ROW_FAULT);
    assert_null(out);
    if (!strstr(err, fragment))
        fail_msg("error \"%s\" lacks \"%s\"", err, fragment);
}

/* A payload that does not fit is the row's fault, said with the field and the schema id. */
static void test_avro_faults(void **state)
{
    RegistrySchema rs = {
        .id = 7, .type = REGISTRY_AVRO, .subject = "t-value", .text = order_schema};
    expect_fault(VALUE_AVRO, &rs, "{\"id\": \"a\", \"n\": \"1\", \"st\": \"A\", \"q\": []}",
                 "schema id 7 (subject t-value): field n: expected long, got string");
    expect_fault(VALUE_AVRO, &rs, "{\"id\": \"a\", \"n\": 1, \"st\": \"C\", \"q\": []}",
                 "field st: 'C' is not a symbol");
    expect_fault(VALUE_AVRO, &rs, "{\"id\": \"a\", \"n\": 1, \"st\": \"A\", \"q\": [1, 2.5]}",
                 "field q[1]: expected int, got number");
    expect_fault(VALUE_AVRO, &rs, "{\"n\": 1, \"st\": \"A\", \"q\": []}", "field id: missing");
    expect_fault(VALUE_AVRO, &rs,
                 "{\"id\": \"a\", \"n\": 1, \"note\": 5, \"st\": \"A\", \"q\": []}",
                 "field note: integer fits no branch");
    expect_fault(VALUE_AVRO, &rs, "not json", "payload is not JSON (schema id 7)");
    serializer_schema_release(&rs);
}

/* A schema of the wrong kind, or one avro-c cannot parse, fails its rows for the schema's sake. */
static void test_unusable_schema(void **state)
{
    char *out = NULL, err[256] = "";
    size_t len;
    RegistrySchema json = {.id = 1, .type = REGISTRY_JSON, .subject = "s", .text = "{}"};
    assert_int_equal(encode(VALUE_AVRO, &json, "{}", &out, &len, err), SERIALIZER_RETRY_LATER);
    assert_non_null(strstr(err, "holds a JSON schema, not AVRO"));
    serializer_schema_release(&json);
    RegistrySchema bad = {.id = 2, .type = REGISTRY_AVRO, .subject = "s", .text = "{\"type\": 1}"};
    assert_int_equal(encode(VALUE_AVRO, &bad, "{}", &out, &len, err), SERIALIZER_RETRY_LATER);
    assert_non_null(strstr(err, "schema id 2: avro:"));
    serializer_schema_release(&bad);
}

static void test_json_schema(void **state)
{
    RegistrySchema rs = {
        .id = 3,
        .type = REGISTRY_JSON,
        .subject = "t-value",
        .text = "{\"type\": \"object\", \"required\": [\"a\"], \"additionalProperties\": false,"
                " \"properties\": {\"a\": {\"type\": \"integer\"},"
                " \"b\": {\"type\": \"array\", \"items\": {\"enum\": [\"x\", \"y\"]}}}}"};
    char *out = NULL, err[256] = "";
    size_t len;
    const char *payload = "{\"a\": 1, \"b\": [\"x\"]}";
    assert_int_equal(encode(VALUE_JSON_SCHEMA, &rs, payload, &out, &len, err), SERIALIZER_OK);
    /* The JSON goes as it is, after the wire header. */
    assert_int_equal(len, 5 + strlen(payload));
    assert_memory_equal(out, "\0\0\0\0\3", 5);
    assert_memory_equal(out + 5, payload, strlen(payload));
    free(out);
    expect_fault(VALUE_JSON_SCHEMA, &rs, "{\"b\": []}", "field a: required, missing");
    expect_fault(VALUE_JSON_SCHEMA, &rs, "{\"a\": \"1\"}", "field a: expected integer, got string");
    expect_fault(VALUE_JSON_SCHEMA, &rs, "{\"a\": 1, \"c\": 0}", "field c: not allowed");
    expect_fault(VALUE_JSON_SCHEMA, &rs, "{\"a\": 1, \"b\": [\"z\"]}",
                 "field b[0]: not one of its enum's values");
    serializer_schema_release(&rs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_avro_bytes),
        cmocka_unit_test(test_avro_faults),
        cmocka_unit_test(test_unusable_schema),
        cmocka_unit_test(test_json_schema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
