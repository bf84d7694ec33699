/* fuzz_headers: a row's headers (relay/outbox/route.c): the JSON of its headers column and of its
 * additional fields, written by any outbox writer, into Kafka headers and dead-letter headers.
 *
 * Input: HEADERS_JSON \0 EXTRA_HEADERS_JSON (the second part optional). Checks that reserved
 * names never pass, whatever their case, and that the bounds hold. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "route.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_ERROR + 1);
    return 0;
}

static void check(rd_kafka_headers_t *hdrs, bool identity, bool dlq)
{
    size_t n = rd_kafka_header_cnt(hdrs);
    size_t ids = 0, dlqs = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name;
        const void *value;
        size_t len;
        if (rd_kafka_header_get_all(hdrs, i, &name, &value, &len) != RD_KAFKA_RESP_ERR_NO_ERROR)
            abort();
        if (strcasecmp(name, "id") == 0)
            ids++;
        if (strncasecmp(name, "dlq.", 4) == 0)
            dlqs++;
        if (identity && strcasecmp(name, "event_type") == 0 &&
            (len != 1 || memcmp(value, "T", 1) != 0))
            abort();
    }
    if (ids != 1 || (!dlq && dlqs != 0) || (dlq && dlqs != 3))
        abort();
    if (n > ROUTE_HEADERS_MAX + 3 + (dlq ? 3 : 0))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 2);
    memcpy(buf, data, size);
    buf[size] = buf[size + 1] = '\0';
    const char *extra = buf + strlen(buf) + 1;
    OutboxRow row = {.event_id = "E",
                     .aggregate_type = "A",
                     .aggregate_id = "K",
                     .event_type = "T",
                     .payload = "{}",
                     .payload_len = 2,
                     .headers = buf,
                     .extra_headers = extra <= buf + size && *extra ? extra : NULL};
    char err[256];
    for (int identity = 0; identity < 2; identity++) {
        rd_kafka_headers_t *h = route_headers(&row, identity, err, sizeof(err));
        if (h) {
            check(h, identity, false);
            rd_kafka_headers_destroy(h);
        }
        h = route_dead_letter_headers(&row, identity, "error", 3, "topic");
        check(h, identity, true);
        rd_kafka_headers_destroy(h);
    }
    free(buf);
    return 0;
}
