/* fuzz_topic: topic templates (relay/outbox/route.c) — the template from configuration, and
 * its expansion with a row's aggregate_type and event_type (written by any outbox writer).
 *
 * Input: TEMPLATE \0 AGGREGATE_TYPE \0 EVENT_TYPE (missing parts are empty). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "route.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_ERROR + 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 3);
    memcpy(buf, data, size);
    buf[size] = buf[size + 1] = buf[size + 2] = '\0';
    const char *tmpl = buf;
    const char *agg = tmpl + strlen(tmpl) + 1;
    if (agg > buf + size)
        agg = buf + size + 1;
    const char *ev = agg + strlen(agg) + 1;
    if (ev > buf + size + 1)
        ev = buf + size + 2;

    char err[512], topic[ROUTE_TOPIC_MAX + 1];
    bool ok = route_template_check(tmpl, true, err, sizeof(err));
    (void)route_template_check(tmpl, false, err, sizeof(err));
    OutboxRow row = {.event_id = "e", .aggregate_type = agg, .aggregate_id = "k", .event_type = ev};
    if (route_topic(tmpl, &row, topic, sizeof(topic), err, sizeof(err))) {
        /* A topic the relay produces to is always legal: Kafka's characters and length. */
        size_t n = strlen(topic);
        if (n == 0 || n > ROUTE_TOPIC_MAX ||
            strspn(topic, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != n)
            abort();
        if (!ok && strchr(tmpl, '{') == NULL && strchr(tmpl, '$') == NULL)
            abort(); /* a literal template that expands must have passed the check */
    }
    free(buf);
    return 0;
}
