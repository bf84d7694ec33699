#!/usr/bin/env python3
"""java_partition.py PARTITIONS: reads consume's JSON lines and prints, for each message,
"KEY PARTITION WANT": the partition it is in and the one Kafka's Java producer (Kafka Connect's,
hence Debezium's) gives its key, toPositive(murmur2(key bytes)) % PARTITIONS, as Kafka's
Utils.murmur2 and BuiltInPartitioner.partitionForKey compute it. Written from the algorithm,
not from librdkafka, so a test can tell whether the relay places keys as Debezium did."""
import json
import sys


def murmur2(data):
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ len(data)) & 0xFFFFFFFF
    whole = len(data) // 4
    for i in range(whole):
        k = int.from_bytes(data[i * 4:i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = data[whole * 4:]
    if len(rest) >= 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if len(rest) >= 1:
        h ^= rest[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def main():
    partitions = int(sys.argv[1])
    for line in sys.stdin:
        msg = json.loads(line)
        want = (murmur2(msg["key"].encode()) & 0x7FFFFFFF) % partitions
        print(msg["key"], msg["partition"], want)


if __name__ == "__main__":
    main()
