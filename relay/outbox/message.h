/* message: the parts of a Kafka message an outbox row decides besides its topic, key, value and
 * headers — the partition and the timestamp (Debezium's partition placement and
 * table.field.event.timestamp).
 *
 * Pure functions over an OutboxRow; nothing here allocates. */
#ifndef OUTBOX_MESSAGE_H
#define OUTBOX_MESSAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "table.h"

/* Kafka's partition numbers are int32; librdkafka's "let the partitioner choose" is -1. */
#define MESSAGE_PARTITION_ANY (-1)

typedef struct MessageParts {
    int32_t partition;    /* MESSAGE_PARTITION_ANY: by the key, as without a partition column */
    int64_t timestamp_ms; /* 0: the producer's clock (librdkafka's default) */
} MessageParts;

/* Reads the partition and timestamp of row (the claim's text of the partition and timestamp
 * columns). A NULL column means the default. Returns false with one line in err, naming the
 * column, when the partition is not an integer in 0..2147483647 or the timestamp is negative or
 * not an integer: the row's own fault, which retrying cannot fix. */
bool message_parts(const OutboxRow *row, const TableMap *map, MessageParts *out, char *err,
                   size_t errlen) __attribute__((warn_unused_result));

#endif
