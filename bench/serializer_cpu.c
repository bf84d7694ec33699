/* bench/serializer_cpu.c: CPU time and instructions of the Avro encoding (relay/io/serializer.c,
 * serializer_encode_schema) per row, on the seed's payload (bench/seed.sql, row 1 as jsonb
 * prints it) against the schema bench/bench.sh's avro drain registers ("seed"), and on two
 * variants of it: "union" (the same payload, its fields in unions with null) and "defaults" (the
 * same payload, the schema adding six defaulted fields the payload lacks). Not built by make: it
 * exists to compare two versions of serializer.c in one program, as bench/route_headers_cpu.c
 * does route.c; only serializer.c differs, every other object is the current one. The schema is
 * parsed once, before the clock starts (as the relay caches it); each encode's value is freed.
 *
 *   W=$PWD; OLD=$(mktemp -d); make -j2 all
 *   git show 71a1696:relay/io/serializer.c >$OLD/serializer.c
 *   git show 71a1696:relay/io/serializer.h >$OLD/serializer.h
 *   ar rcs $OLD/rest.a $(find bin/obj/lib bin/obj/relay -name '*.o' | grep -v -e serializer.o \
 *        -e relay/main.o -e rcache -e conndeadline -e sha256) bin/obj/migrations_gen.o
 *   INC=$(for d in lib relay relay/outbox relay/io relay/engine relay/service relay/cmd bin/gen; \
 *        do echo -I$W/$d; done)
 *   for v in old new; do d=$W/relay/io; def=; [ $v = old ] && d=$OLD && def=-DOLD_API
 *     cc -O2 -g -std=c11 -D_GNU_SOURCE $def -I$d $INC -I/usr/include/postgresql \
 *        bench/serializer_cpu.c $d/serializer.c $OLD/rest.a -o /tmp/serializer_cpu.$v \
 *        $(pkg-config --libs libpq rdkafka libcurl jansson avro-c) -lev -lm -pthread; done
 *   for i in 1 2 3 4 5 6; do for v in old new; do /tmp/serializer_cpu.$v seed 200000; done; done
 *   valgrind --tool=callgrind /tmp/serializer_cpu.$v seed 20000   (instructions: less a run of
 *        N = 0; or perf stat -e instructions:u where the machine has the counter)
 *
 * (OLD_API: before the Avro bound, serializer_encode_schema had no max_len.) */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serializer.h"

#define ORDER_HEAD                                                                                 \
    "{\"type\": \"record\", \"name\": \"Order\", \"namespace\": \"bench\", \"fields\": ["
#define ITEMS                                                                                      \
    "{\"type\": \"array\", \"items\": {\"type\": \"record\", \"name\": \"Item\", \"fields\": ["    \
    "{\"name\": \"sku\", \"type\": \"string\"}, {\"name\": \"qty\", \"type\": \"int\"},"           \
    "{\"name\": \"price_cents\", \"type\": \"long\"}]}}"

/* bench/bench.sh's avro drain schema, as it registers it. */
static const char *seed_schema = ORDER_HEAD
    "{\"name\": \"order_id\", \"type\": \"string\"}, {\"name\": \"seq\", \"type\": \"long\"},"
    "{\"name\": \"status\", \"type\": \"string\"}, {\"name\": \"customer_id\", \"type\": "
    "\"string\"},"
    "{\"name\": \"amount_cents\", \"type\": \"long\"}, {\"name\": \"currency\", \"type\": "
    "\"string\"},"
    "{\"name\": \"items\", \"type\": " ITEMS "},"
    "{\"name\": \"note\", \"type\": \"string\"}]}";

/* Every field a union with null (the form a schema evolved for optional fields takes). */
static const char *union_schema =
    ORDER_HEAD "{\"name\": \"order_id\", \"type\": [\"null\", \"string\"]},"
               "{\"name\": \"seq\", \"type\": [\"null\", \"long\"]},"
               "{\"name\": \"status\", \"type\": [\"null\", \"string\"]},"
               "{\"name\": \"customer_id\", \"type\": [\"null\", \"string\"]},"
               "{\"name\": \"amount_cents\", \"type\": [\"null\", \"int\", \"long\"]},"
               "{\"name\": \"currency\", \"type\": [\"null\", \"string\"]},"
               "{\"name\": \"items\", \"type\": [\"null\", " ITEMS "]},"
               "{\"name\": \"note\", \"type\": [\"null\", \"string\"]}]}";

/* The seed schema and six fields the payload lacks, each filled from its default. */
static const char *defaults_schema = ORDER_HEAD
    "{\"name\": \"order_id\", \"type\": \"string\"}, {\"name\": \"seq\", \"type\": \"long\"},"
    "{\"name\": \"status\", \"type\": \"string\"}, {\"name\": \"customer_id\", \"type\": "
    "\"string\"},"
    "{\"name\": \"amount_cents\", \"type\": \"long\"}, {\"name\": \"currency\", \"type\": "
    "\"string\"},"
    "{\"name\": \"items\", \"type\": " ITEMS "},"
    "{\"name\": \"note\", \"type\": \"string\"},"
    "{\"name\": \"region\", \"type\": \"string\", \"default\": \"eu-west\"},"
    "{\"name\": \"channel\", \"type\": [\"null\", \"string\"], \"default\": null},"
    "{\"name\": \"priority\", \"type\": \"int\", \"default\": 0},"
    "{\"name\": \"tags\", \"type\": {\"type\": \"array\", \"items\": \"string\"}, "
    "\"default\": []},"
    "{\"name\": \"gift\", \"type\": \"boolean\", \"default\": false},"
    "{\"name\": \"tax\", \"type\": {\"type\": \"bytes\", \"logicalType\": \"decimal\", "
    "\"precision\": 9, \"scale\": 2}, \"default\": \"\\u0001\"}]}";

/* bench/seed.sql's row 1 as PostgreSQL prints the jsonb (keys by length, then bytes). */
static const char *payload =
    "{\"seq\": 0, \"note\": \"fe293afa3537cfbd868639b72f9fddc1\", \"items\": [{\"qty\": 2, "
    "\"sku\": \"SKU-00001\", \"price_cents\": 13}], \"status\": \"paid\", \"currency\": \"EUR\", "
    "\"order_id\": \"order-0001\", \"customer_id\": \"cust-07919\", \"amount_cents\": 37}";

static SerializerOutcome encode(RegistrySchema *rs, char **out, size_t *len, char *err)
{
#ifdef OLD_API
    return serializer_encode_schema(VALUE_AVRO, rs, rs->subject, payload, strlen(payload), out, len,
                                    err, 256);
#else
    return serializer_encode_schema(VALUE_AVRO, rs, rs->subject, payload, strlen(payload), 1000000,
                                    out, len, err, 256);
#endif
}

int main(int argc, char **argv)
{
    const char *which = argc > 1 ? argv[1] : "seed";
    long n = argc > 2 ? atol(argv[2]) : 200000;
    const char *text = !strcmp(which, "union")      ? union_schema
                       : !strcmp(which, "defaults") ? defaults_schema
                       : !strcmp(which, "seed")     ? seed_schema
                                                    : NULL;
    if (!text) {
        fprintf(stderr, "usage: %s seed|union|defaults [N]\n", argv[0]);
        return 2;
    }
    RegistrySchema rs = {
        .id = 1, .type = REGISTRY_AVRO, .subject = "outbox.event.order-value", .text = text};
    char *out = NULL, err[256] = "";
    size_t len = 0;
    /* The first encode parses the schema (once per relay): outside the clock. */
    if (encode(&rs, &out, &len, err) != SERIALIZER_OK) {
        fprintf(stderr, "encode: %s\n", err);
        return 1;
    }
    free(out);
    size_t first = len;
    struct timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    for (long i = 0; i < n; i++) {
        if (encode(&rs, &out, &len, err) != SERIALIZER_OK || len != first) {
            fprintf(stderr, "encode: %s\n", err);
            return 1;
        }
        free(out);
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    printf("%s: %zu bytes, %.3f us per row\n", which, first,
           n ? ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 1e3 /
                   (double)n
             : 0.0);
    serializer_schema_release(&rs);
    return 0;
}
