#include "message.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* A decimal integer in [min, max], the whole text; false otherwise. strtoll alone would take
 * leading white space and a '+' (" 3", "+3" from a text column): such a value is not the
 * integer's text, so it is refused as its trailing garbage is. */
static bool parse_int(const char *text, long long min, long long max, long long *out)
{
    if (!((*text >= '0' && *text <= '9') || (*text == '-' && text[1] >= '0' && text[1] <= '9')))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max)
        return false;
    *out = v;
    return true;
}

bool message_parts(const OutboxRow *row, const TableMap *map, MessageParts *out, char *err,
                   size_t errlen)
{
    out->partition = MESSAGE_PARTITION_ANY;
    out->timestamp_ms = 0;
    long long v;
    if (row->partition) {
        if (!parse_int(row->partition, 0, INT32_MAX, &v)) {
            snprintf(err, errlen, "partition column %s: '%.40s' is not a partition number (0-%d)",
                     map->partition ? map->partition : "?", row->partition, INT32_MAX);
            return false;
        }
        out->partition = (int32_t)v;
    }
    if (row->timestamp_ms) {
        /* Kafka's CreateTime is ms since the epoch; a time before 1970 has no such value. */
        if (!parse_int(row->timestamp_ms, 0, INT64_MAX, &v)) {
            snprintf(err, errlen, "timestamp column %s: '%.40s' ms is not a Kafka timestamp",
                     map->timestamp ? map->timestamp : "?", row->timestamp_ms);
            return false;
        }
        out->timestamp_ms = v;
    }
    return true;
}
