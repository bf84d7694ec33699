/* bench/route_headers_cpu.c: CPU time of route_headers (relay/outbox/route.c) per row, on the
 * seed's headers column (bench/seed.sql: one W3C traceparent), headers built and destroyed as the
 * relay does per message. Not built by make: it exists to compare two versions of route.c in
 * one program, on a machine whose load makes whole drains too noisy to show a 1 µs change.
 *
 *   W=$PWD; for v in old new; do
 *     cc -O2 -std=c11 -D_GNU_SOURCE -I/usr/include/postgresql -I$W/lib -I$W/relay \
 *        -I$W/relay/outbox bench/route_headers_cpu.c route_$v.c $W/lib/jsontext.c $W/lib/utf8.c \
 *        $W/lib/log.c $W/lib/log_json.c $W/lib/secrets.c -o /tmp/route_headers_cpu.$v \
 *        -lrdkafka -ljansson -lpq; done
 *   /tmp/route_headers_cpu.old 1000000; /tmp/route_headers_cpu.new 1000000
 *
 * (route_old.c: `git show main:relay/outbox/route.c`, route_new.c: the file changed.) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "route.h"

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    OutboxRow row = {
        .id = 1,
        .event_id = "0b5c6a8e-6d0e-4d39-9a4c-2f6d1d7c9e01",
        .aggregate_type = "order",
        .aggregate_id = "agg-17",
        .event_type = "OrderCreated",
        .payload = "{}",
        .payload_len = 2,
        .headers = "{\"traceparent\": \"00-3b1f0e4c0b6f4d1e9a7c2d5e8f0a1b2c-9a7c2d5e8f0a1b2c-01\"}",
    };
    char err[256];
    struct timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    for (long i = 0; i < n; i++) {
        rd_kafka_headers_t *h = route_headers(&row, false, err, sizeof(err));
        if (!h) {
            fprintf(stderr, "route_headers: %s\n", err);
            return 1;
        }
        rd_kafka_headers_destroy(h);
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    printf("%.3f us per row\n",
           ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 1e3 /
               (double)n);
    return 0;
}
