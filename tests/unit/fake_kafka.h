/* fake_kafka: a stand-in for relay/io/kafka.c (the KafkaProducer interface of kafka.h) for the
 * engine's unit tests: kafka_produce queues each message (a copy of its topic, key and value,
 * and the opaque the engine gave), and the test delivers its report (acknowledged, failed,
 * purged) through the same KafkaDeliveryFn that relay.c registered with kafka_producer_new, from
 * the test's own call (as kafka.c does from the loop, never from inside kafka_produce).
 *
 * kafka_purge does not report at once (librdkafka reports purged messages later, on the loop):
 * it marks every unreported message purged, and fake_kafka_deliver_purged reports them with
 * RD_KAFKA_RESP_ERR__PURGE_QUEUE. kafka_producer_free reports what is left the same way, as
 * kafka.c's flush-then-purge does. */
#ifndef OUTBOX_FAKE_KAFKA_H
#define OUTBOX_FAKE_KAFKA_H

#include <stdbool.h>

#include "kafka.h"

typedef struct FakeMessage {
    char *topic, *key, *value;
    const char *payload; /* the caller's value, which librdkafka does not copy */
    size_t payload_len;
    void *opaque;
    bool reported;
    bool purged; /* caught by a kafka_purge, its report not delivered yet */
} FakeMessage;

/* The producer last created (kafka_producer_new), or NULL after it was freed. */
KafkaProducer *fake_kafka_current(void);
/* Messages produced since the producer was created, in order (reported ones included). */
int fake_kafka_count(void);
const FakeMessage *fake_kafka_at(int i);
/* Messages not reported yet. */
int fake_kafka_unreported(void);
/* Delivers message i's report (i: its index in the order produced) with err. */
void fake_kafka_report(int i, rd_kafka_resp_err_t err);
/* Reports every unreported message with err, in order. */
void fake_kafka_report_all(rd_kafka_resp_err_t err);
/* kafka_purge calls so far. */
int fake_kafka_purges(void);
/* Reports every message a purge caught (RD_KAFKA_RESP_ERR__PURGE_QUEUE). */
void fake_kafka_deliver_purged(void);
/* From now on, kafka_produce refuses messages with this key with err (NO_ERROR: accept all);
 * a key ending in '*' refuses every key that starts with what comes before it. */
void fake_kafka_refuse_key(const char *key, rd_kafka_resp_err_t err);
/* Sets what kafka_fatal answers. */
void fake_kafka_set_fatal(bool fatal);
/* From now on, kafka_produce answers QUEUE_FULL while messages are queued (0: no limit). As
 * librdkafka, a message counts until its delivery report has returned, not only until it is
 * served. */
void fake_kafka_set_queue_limit(int messages);
/* Producers destroyed on the caller's thread (kafka_producer_free), and handed to be destroyed
 * off the loop (kafka_producer_retire, which aborts if one of its messages is unreported). */
int fake_kafka_freed(void);
int fake_kafka_retired(void);
/* Producers handed, with the caller's payloads, to be destroyed off the caller's thread
 * (kafka_producer_free_then with messages unreported): the fake keeps each until
 * fake_kafka_destroy_handed_off, the thread's part, which reads every unreported message's
 * payload where the caller left it (freed too early, ASan says so), destroys the producer, and
 * only then frees the payloads (the caller's after). */
int fake_kafka_handed_off(void);
void fake_kafka_destroy_handed_off(void);
/* While busy, kafka_producer_retire refuses (another old producer is still being destroyed). */
void fake_kafka_set_retire_busy(bool busy);
/* While refused, kafka_conf_files_ok answers false (a TLS file swapped for a FIFO, say). */
void fake_kafka_set_files_refused(bool refused);
/* While refused, kafka_conf_pin_files answers false though kafka_conf_files_ok passes (a file
 * swapped for a FIFO between kafka.c's stat and its open); kafka_producer_new pins, as kafka.c's
 * does, so it fails too. */
void fake_kafka_set_pin_refused(bool refused);

#endif
