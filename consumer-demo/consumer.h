/* consumer: consumer-demo's Kafka consumer group member and its processing loop.
 *
 * For each message: classify it (event.h), then apply it (store_apply), park it (store_park) or
 * skip it, and only after that database commit store the message's offset for librdkafka's
 * auto-commit (enable.auto.offset.store=false). A crash before the commit redelivers the
 * message, and the processed_events dedupe absorbs the second copy. Database failures are told
 * apart by whose fault they are (sqlstate.h): anything not the message's own (a lost connection,
 * a read-only failover window, a deadlock, a cancelled statement, a lock timeout, resources, a
 * missing privilege) is an outage, waited out with backoff on the same message without limit, so
 * nothing valid is skipped or parked; a message the database refuses for its data (22, 23, P0) is
 * parked after a few tries, so no partition ever stops. processed_events rows expire after
 * dedupe_ttl_s and are swept (a redelivery older than that is applied again, and the shipments
 * upsert, versioned, makes that a no-op). A message whose id was applied with another payload
 * (a producer reused the id: store.h's conflict) is counted and logged, not applied, and its
 * offset committed: the first copy stays the truth.
 *
 * With Redis (redis_url), an event id is written there, with its applied payload's digest, only
 * after the transaction that recorded it in processed_events committed; an event whose id is
 * found there with its own payload's digest is skipped without a transaction (any other digest
 * goes to processed_events, so Redis never hides a conflict). Setting the id before processing, as
 * a naive sketch does, would lose the event when processing then fails (the redelivery finds the id
 * and skips it). Redis unavailable, slow or flushed only means more events go through the
 * processed_events check. */
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
    const char *redis_url;   /* the Redis fast path (see below), or NULL */
    long redis_timeout_ms;   /* bound on each Redis call */
    long redis_ttl_s;        /* how long a processed event id is remembered in Redis */
    long dedupe_ttl_s;       /* how long processed_events keeps an event id (expires_at) */
    long sweep_interval_s;   /* how often expired processed_events rows are deleted */
} ConsumerConfig;

/* Checks the Kafka configuration without connecting: returns false with one line in err when
 * librdkafka rejects a property or the topic name is not a legal Kafka topic. */
bool consumer_check(const ConsumerConfig *cfg, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Consumes until *stop becomes non-zero (set it from a signal handler), then closes the consumer
 * (committing the stored offsets) and logs the totals. Returns the exit status. */
int consumer_run(const ConsumerConfig *cfg, volatile sig_atomic_t *stop);

#endif
