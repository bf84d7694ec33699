/* fuzz_serializer: a payload (whatever an application wrote into the outbox) encoded by Schema
 * Registry schemas (serializer_encode_schema): Avro, through avro-c's value interface reused row
 * after row, and JSON Schema. No input may crash it, leak, or give an outcome other than OK or a
 * row fault; an OK value carries Confluent's 5-byte header, and an Avro value encoded again under a
 * small bound (6 to 261 bytes, from the input's length) is refused or within it.
 *
 * Input: the payload bytes, as the claim hands them over (not NUL-terminated). The Avro schema
 * nests records but is not recursive: avro-c 1.11 leaks a recursive schema's reference cycle
 * when it is freed, which LeakSanitizer would report at every exit. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "serializer.h"

static RegistrySchema avro = {
    .id = 1,
    .type = REGISTRY_AVRO,
    .subject = "t-value",
    .text =
        "{\"type\": \"record\", \"name\": \"R\", \"fields\": ["
        "{\"name\": \"s\", \"type\": \"string\"}, {\"name\": \"i\", \"type\": \"int\"},"
        "{\"name\": \"l\", \"type\": [\"null\", \"long\", \"string\"]},"
        "{\"name\": \"d\", \"type\": \"double\", \"default\": 0.5},"
        " {\"name\": \"b\", \"type\": \"boolean\"},"
        "{\"name\": \"e\", \"type\": {\"type\": \"enum\", \"name\": \"E\", \"symbols\": [\"X\"]}},"
        "{\"name\": \"f\", \"type\": {\"type\": \"fixed\", \"name\": \"F\", \"size\": 2}},"
        "{\"name\": \"m\", \"type\": {\"type\": \"map\", \"values\": {\"type\": \"record\","
        " \"name\": \"N\", \"fields\": [{\"name\": \"x\", \"type\": [\"null\", \"int\"]}]}}},"
        "{\"name\": \"a\", \"type\": {\"type\": \"array\", \"items\": [\"null\", \"N\"]}},"
        "{\"name\": \"g\", \"type\": [\"null\", {\"type\": \"bytes\", \"logicalType\": \"decimal\","
        " \"precision\": 30, \"scale\": 4}, \"bytes\", \"string\"]},"
        "{\"name\": \"u\", \"type\": [\"null\", \"string\", {\"type\": \"map\", \"values\":"
        " [\"null\", \"long\", \"N\"]}, {\"type\": \"record\", \"name\": \"W\", \"fields\":"
        " [{\"name\": \"string\", \"type\": \"string\"}]}]}]}"};
static RegistrySchema json = {
    .id = 2,
    .type = REGISTRY_JSON,
    .subject = "t-value",
    .text = "{\"type\": \"object\", \"required\": [\"a\"], \"additionalProperties\": false,"
            " \"properties\": {\"a\": {\"type\": [\"integer\", \"null\"]},"
            " \"b\": {\"type\": \"array\", \"items\": {\"enum\": [\"x\", 1]}},"
            " \"c\": {\"const\": {\"k\": [1]}}}}"};

/* The parsed schemas live across inputs (as in the relay, for its life); freed at exit so that
 * LeakSanitizer's look then sees only what an input leaked. */
static void release(void)
{
    serializer_schema_release(&avro);
    serializer_schema_release(&json);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_ERROR + 1);
    atexit(release);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *payload = malloc(size ? size : 1); /* exactly its length: ASan sees a read past it */
    memcpy(payload, data, size);
    RegistrySchema *schemas[] = {&avro, &json};
    ValueFormat formats[] = {VALUE_AVRO, VALUE_JSON_SCHEMA};
    for (int i = 0; i < 2; i++) {
        char *out = NULL, err[512];
        size_t len = 0;
        SerializerOutcome o = serializer_encode_schema(formats[i], schemas[i], "t-value", payload,
                                                       size, 1000000, &out, &len, err, sizeof(err));
        if (o != SERIALIZER_OK && o != SERIALIZER_ROW_FAULT)
            abort();
        if (o == SERIALIZER_OK && (len < 5 || out[0] != 0 || out[4] != (char)schemas[i]->id))
            abort();
        free(out);
    }
    /* The bound on an Avro value (the producer's message.max.bytes in the relay), small enough to
     * be reached: a value is refused as the row's fault, or fits it. */
    char *out = NULL, err[512];
    size_t len = 0, max_len = 6 + size % 256;
    SerializerOutcome o = serializer_encode_schema(VALUE_AVRO, &avro, "t-value", payload, size,
                                                   max_len, &out, &len, err, sizeof(err));
    if ((o != SERIALIZER_OK && o != SERIALIZER_ROW_FAULT) || (o == SERIALIZER_OK && len > max_len))
        abort();
    free(out);
    free(payload);
    return 0;
}
