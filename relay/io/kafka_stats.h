/* kafka_stats: what the relay reads from librdkafka's statistics (statistics.interval.ms).
 *
 * librdkafka has no broker-state callback; its periodic statistics JSON lists every broker
 * connection with its state, which tells whether Kafka is reachable even while the relay has
 * nothing to send (an idle producer keeps one connection up for metadata). */
#ifndef OUTBOX_KAFKA_STATS_H
#define OUTBOX_KAFKA_STATS_H

#include <stddef.h>

/* The interval the relay asks for when its readiness endpoint needs it (--metrics-listen). */
#define KAFKA_STATS_INTERVAL_MS "5000"

/* 1 when some broker connection in the statistics JSON is in state "UP", 0 when none is, -1
 * when the text is not statistics JSON. */
int kafka_stats_brokers_up(const char *json, size_t len);

#endif
