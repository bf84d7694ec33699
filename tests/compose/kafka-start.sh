#!/bin/sh
# The test Kafka container's command: one mock broker on kafka:9092, advertised at this
# container's address (see mock-listen.c), topics auto-created with 4 partitions. The health
# check waits for /tmp/kafka.ready, written once the broker printed its bootstrap list.
set -e
ip=$(hostname -i | awk '{ print $1 }')
rm -f /tmp/kafka.ready
MOCK_ADVERTISE_IP=$ip MOCK_FIRST_PORT=9092 LD_PRELOAD=/usr/local/bin/mock-listen.so \
    mock-broker --brokers 1 >/tmp/kafka.bootstrap &
pid=$!
trap 'kill -TERM $pid; wait $pid; exit 0' TERM INT
i=0
until [ -s /tmp/kafka.bootstrap ]; do
    kill -0 $pid 2>/dev/null || { echo "kafka-start: mock-broker exited" >&2; exit 1; }
    i=$((i + 1))
    [ $i -le 100 ] || { echo "kafka-start: no bootstrap list after 10 s" >&2; exit 1; }
    sleep 0.1
done
echo "kafka-start: mock broker $(cat /tmp/kafka.bootstrap) (advertised address $ip)"
touch /tmp/kafka.ready
wait $pid
