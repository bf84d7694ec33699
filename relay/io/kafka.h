/* kafka: the librdkafka producer, wired into the libev loop.
 *
 * librdkafka signals "events ready" by writing to a non-blocking pipe whenever its main queue
 * goes from empty to non-empty (rd_kafka_queue_io_event_enable); the loop watches the pipe and
 * serves delivery reports, errors and logs on the loop thread. Nothing here blocks the loop. */
#ifndef OUTBOX_KAFKA_H
#define OUTBOX_KAFKA_H

#include <ev.h>
#include <librdkafka/rdkafka.h>
#include <stdbool.h>

#include "config.h"

typedef struct KafkaProducer KafkaProducer;

/* One delivery report: opaque is what was given to kafka_produce; err is
 * RD_KAFKA_RESP_ERR_NO_ERROR when the broker acknowledged the message (acks=all). */
typedef void (*KafkaDeliveryFn)(void *opaque, rd_kafka_resp_err_t err, void *arg);

/* Builds the producer configuration: our defaults (idempotence on, no message timeout: the relay
 * bounds a batch's wait itself, see relay.c), then cfg->brokers, then every --kafka property in
 * order. Returns NULL with one line in err when librdkafka rejects a property or a property would
 * break the ordering guarantee (idempotence or the gap-less guarantee off, a message.timeout.ms
 * shorter than the longest --delivery-timeout) or librdkafka would refuse to create the producer
 * from it (acks=1 with idempotence, say: checked by creating one that connects nowhere); the
 * line names where the property was set (config_kafka_origin). Logs a warning for a longer
 * message.timeout.ms (docs/configuration.md, "Why no message timeout"). *runtime (when not NULL)
 * is set true when the refusal is the machine's, not the configuration's: the trial producer
 * could not start a thread (a process or cgroup limit), which a restart may cure (exit 1, not 2).
 */
rd_kafka_conf_t *kafka_conf_build(const Config *cfg, bool *runtime, char *err, size_t errlen);

/* Gives conf, one database's copy of kafka_conf_build's result, the partitioner of that
 * database's layout when no `partitioner` entry of cfg->kafka (--kafka, --kafka-file, the config
 * file) names one: murmur2, the hash of Kafka's Java producer and so of Debezium's, for
 * --layout debezium, so that an aggregate taken over from Debezium goes on in the partition
 * Debezium put its earlier events in; the relay layout keeps kafka_conf_build's consistent.
 * Changes conf in place; never fails (both values are librdkafka's own). */
void kafka_conf_layout_partitioner(rd_kafka_conf_t *conf, const Config *cfg);

/* Whether every TLS file conf names (ssl.ca.location, ssl.crl.location,
 * ssl.certificate.location, ssl.key.location, ssl.keystore.location, ssl.engine.location), when
 * security.protocol is ssl or sasl_ssl, is a regular file, a directory or absent: librdkafka
 * opens them in rd_kafka_new, on the relay's event loop for a producer made while it runs, where
 * a FIFO's, a device's or a socket's open would wait (a directory fails at once, or holds the
 * CA files). False with one line in err naming the
 * property and the path. stat only (safe on the loop); kafka_conf_pin_files, which every
 * producer's creation runs, closes the window after it. kafka_conf_build checks it at start;
 * a caller that tears something down before it makes a producer on the loop pins first
 * (kafka_conf_pin_files, then kafka_producer_new_pinned), to refuse in one line before anything
 * is torn down. */
bool kafka_conf_files_ok(const rd_kafka_conf_t *conf, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* The files kafka_conf_pin_files holds open for one rd_kafka_new: fd[i] is the descriptor plus
 * one (0: none), path[i] the path it replaced (owned). A zeroed one holds nothing. */
#define KAFKA_PINS_MAX 5
typedef struct {
    int fd[KAFKA_PINS_MAX];
    char *path[KAFKA_PINS_MAX];
} KafkaPins;

/* Closes the window kafka_conf_files_ok leaves (a file swapped for a FIFO between its stat and
 * librdkafka's open): checks conf with kafka_conf_files_ok, then, with TLS, opens each of
 * ssl.ca.location, ssl.crl.location, ssl.certificate.location, ssl.key.location and
 * ssl.keystore.location that is set itself, O_NONBLOCK (never waits), and when it is a regular
 * file sets the property in conf to /proc/self/fd/N, which librdkafka's open then reopens: the
 * very file checked, not whatever the path names by then. Content and permissions are the
 * file's (nothing is copied); each call reads the paths anew, so a rotated certificate is taken.
 * A directory, or any file when /proc is not mounted, keeps its path. False with one line in
 * err (pins left empty) for a pipe, device or socket, or a file it cannot open (absent,
 * unreadable: librdkafka would refuse it too, and a FIFO made there later would wait). Call
 * kafka_pins_close once rd_kafka_new has returned (it reads the files whole and never opens them
 * again). */
bool kafka_conf_pin_files(rd_kafka_conf_t *conf, KafkaPins *pins, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Rewrites each /proc/self/fd alias of pins in text (a librdkafka error) back to its path, as
 * far as size allows (an alias that does not fit stays). Only a whole number matches: pin 3's
 * alias is not the start of pin 31's. */
void kafka_pins_text(const KafkaPins *pins, char *text, size_t size);

/* Closes the files of pins and frees their paths; pins is left empty. */
void kafka_pins_close(KafkaPins *pins);

/* What kafka_conf_build checks at start that a SIGHUP reload can change: a --delivery-timeout
 * (fresh's, or any of its databases') longer than the message.timeout.ms the running producer
 * was built with (from running's Kafka properties, which a reload never changes). Returns false
 * with one line in err naming the database (with a list) and where message.timeout.ms was set.
 * Pure: touches no network and starts no thread (safe on the loop). */
bool kafka_reload_check(const Config *running, const Config *fresh, char *err, size_t errlen);

/* Creates the producer from conf (taking ownership of it in every case) and starts serving its
 * events on loop. The log context current now (log_context(), its database's; up to 127
 * bytes) is copied and carried by its lines, librdkafka's own included.
 * Returns NULL with one line in err on failure. */
KafkaProducer *kafka_producer_new(struct ev_loop *loop, rd_kafka_conf_t *conf,
                                  KafkaDeliveryFn on_delivery, void *arg, char *err, size_t errlen);

/* As kafka_producer_new, for a conf whose TLS files the caller pinned itself
 * (kafka_conf_pin_files into pins): a caller that must tear something down before the producer
 * is made (relay_producer_ready retires the failed one) pins first, so that a file it refuses
 * means "not now", with nothing torn down. Takes ownership of conf and closes pins in every case
 * (once rd_kafka_new has returned). Returns NULL with one line in err on failure (no thread to
 * spare, a descriptor limit): what is left cannot be a refused file. */
KafkaProducer *kafka_producer_new_pinned(struct ev_loop *loop, rd_kafka_conf_t *conf,
                                         KafkaPins *pins, KafkaDeliveryFn on_delivery, void *arg,
                                         char *err, size_t errlen);

/* Waits up to timeout_ms for queued messages (their delivery reports go to kp's
 * KafkaDeliveryFn), drops what is left (their reports are still delivered, with an error), and
 * destroys the producer: off the caller's thread once every report has been served and no request
 * is out (as kafka_producer_retire; kafka_retired_wait waits for it), else here, since a request
 * may still point into the payloads the caller frees next. Blocks for up to timeout_ms + 100 ms,
 * and, in the second case, for as long as rd_kafka_destroy takes: after the loop, or (a database
 * removed by SIGHUP, timeout_ms 0, every report in) on it. */
void kafka_producer_free(KafkaProducer *kp, int timeout_ms);

/* The same, for a caller whose payloads may still be pointed to by kp's messages but need not be
 * freed at once: after(after_arg) frees them, called exactly once when nothing points into them
 * any more (kp destroyed, or every report in). Waits up to timeout_ms for queued messages (their
 * reports go to kp's KafkaDeliveryFn); when some are still left, the purge, the last flush and
 * the destroy go to a thread (kafka_retired_wait waits for it), their reports go nowhere, and
 * after runs on that thread once kp is destroyed: the caller blocks for timeout_ms at most (0 on
 * the loop). Without a thread to spare, as kafka_producer_free, then after on the caller's
 * thread. after must be safe to run on another thread. */
void kafka_producer_free_then(KafkaProducer *kp, int timeout_ms, void (*after)(void *),
                              void *after_arg);

/* Destroys kp off the loop, for a producer replaced while the loop runs (after a fatal error):
 * rd_kafka_destroy may block for as long as a broker thread takes to finish (a connection
 * attempt, a name lookup). kp is detached from the loop and from its KafkaDeliveryFn at once, so
 * no report of it reaches its owner again: call it only once every message of kp has been
 * reported. At most one producer taken here is being destroyed at a time (memory and threads
 * bounded however often the cluster fails them): returns false, kp untouched and still the
 * caller's, while the previous one is (and, once it has been at it 10 s, logs one warning naming
 * the old producer's log context); true when kp was taken (a thread destroys it; without a
 * thread to spare, it is destroyed here). Those kafka_producer_free hands over do not count. */
bool kafka_producer_retire(KafkaProducer *kp);

/* Waits up to timeout_ms (< 0: no bound) for the producers being destroyed off the loop
 * (kafka_producer_retire, kafka_producer_free) and joins their threads. Returns how many are
 * still being destroyed (0: none): their threads go on (librdkafka's cannot be cancelled), so a
 * process about to exit with some left must leave at once (_exit), without tearing down what they
 * may use. Blocks: only after the loop has stopped. */
int kafka_retired_wait(int timeout_ms);

/* Enqueues one message to partition (RD_KAFKA_PARTITION_UA: the partitioner chooses by the key)
 * with timestamp_ms as its CreateTime (0: now). The key is copied; the value is not: it must stay
 * valid until the message's delivery report has been served (or the producer freed). Headers are
 * taken over on success; on failure the caller still owns them. Returns
 * RD_KAFKA_RESP_ERR__QUEUE_FULL when the local queue is full: wait for delivery reports and try
 * again. */
rd_kafka_resp_err_t kafka_produce(KafkaProducer *kp, const char *topic, int32_t partition,
                                  int64_t timestamp_ms, const char *key, size_t key_len,
                                  const char *value, size_t value_len, rd_kafka_headers_t *hdrs,
                                  void *opaque);

/* The producer's message.max.bytes: a payload above it cannot be sent. */
long kafka_message_max_bytes(const KafkaProducer *kp);

/* Cancels every message not yet acknowledged; their delivery reports arrive with
 * RD_KAFKA_RESP_ERR__PURGE_QUEUE or __PURGE_INFLIGHT (outcome unknown: they may have been
 * written, and are sent again later). */
void kafka_purge(KafkaProducer *kp);

/* True for errors that retrying the same message cannot fix (too large, illegal topic name,
 * rejected record); false for transient ones (broker down, timeouts, leader changes), which are
 * worth retrying soon, and for the setup's (kafka_error_setup). */
bool kafka_error_permanent(rd_kafka_resp_err_t err);

/* True for errors of the setup, not of the message: not authorised (a missing or revoked ACL,
 * credentials refused) or an unknown topic (deleted, or auto-creation off). Every message to
 * that topic (or every message) meets them until an operator acts, so they must never count
 * against a row (nor dead-letter it): the engine leaves such rows unsent and retries after its
 * backoff (docs/guarantees.md#failure-modes). */
bool kafka_error_setup(rd_kafka_resp_err_t err);

/* For an error kafka_error_setup accepts: one line saying what the operator should do. */
const char *kafka_error_setup_hint(rd_kafka_resp_err_t err);

/* Serves pending events (delivery reports) now. */
void kafka_poll(KafkaProducer *kp);

/* True while some broker is reachable, as far as the last events told: a broker connection up
 * in the last statistics (only collected with --metrics-listen, see kafka_stats.h) or an
 * acknowledgement, and no "all brokers down" since. */
bool kafka_up(const KafkaProducer *kp);

/* True after a fatal producer error (idempotence state lost): the producer must be recreated
 * once its in-flight messages have been reported. Also true for NULL (no producer: its
 * recreation failed, relay.c), so that no caller produces on it. */
bool kafka_fatal(const KafkaProducer *kp);

/* The librdkafka handle (for tests: to raise an error with rd_kafka_test_fatal_error). Owned by
 * kp: valid until kp is freed or retired. */
rd_kafka_t *kafka_handle(const KafkaProducer *kp);

#endif
