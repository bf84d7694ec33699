/* consumer: consumer-demo's Kafka consumer group member and its processing loop.
 *
 * For each message: classify it (event.h), then apply it (store_apply), park it (store_park) or
 * skip it, and only after that database commit store the message's offset for librdkafka's
 * auto-commit (enable.auto.offset.store=false). A crash before the commit redelivers the
 * message, and the processed_events dedupe absorbs the second copy. Database outages are waited
 * out with backoff on the same message, so nothing is skipped; a message the database keeps
 * rejecting for another reason is parked after a few tries, so no partition ever stops. */
#ifndef CONSUMER_CONSUMER_H
#define CONSUMER_CONSUMER_H

#include <signal.h>

#include "opts.h"

typedef struct ConsumerConfig {
    const char *conninfo;
    const char *brokers;
    const char *topic;
    const char *group;
    const OptList *kafka;    /* extra librdkafka consumer properties */
    const char *health_file; /* touched while the loop is healthy; NULL for none */
    long stats_interval_s;   /* how often counters are logged when they changed */
} ConsumerConfig;

/* Checks the Kafka configuration without connecting: returns false with one line in err when
 * librdkafka rejects a property or the topic name is not a legal Kafka topic. */
bool consumer_check(const ConsumerConfig *cfg, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Consumes until *stop becomes non-zero (set it from a signal handler), then closes the consumer
 * (committing the stored offsets) and logs the totals. Returns the exit status. */
int consumer_run(const ConsumerConfig *cfg, volatile sig_atomic_t *stop);

#endif
