#include "kafka.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kafka_stats.h"
#include "log.h"
#include "monotime.h"
#include "secrets.h"
#include "sigmask.h"

struct KafkaProducer {
    struct ev_loop *loop;
    rd_kafka_t *rk;
    int pipe_fds[2];
    ev_io io;
    KafkaDeliveryFn on_delivery;
    void *arg;
    bool up;
    bool down_logged;
    bool fatal;
    /* The fatal error was a broker's rejection (not a local one, such as the gap-less check
     * tripping on the relay's own purge at a delivery timeout, which cancels every message of
     * the partition behind the purged ones too). */
    bool fatal_from_broker;
    /* The partition of the last message a broker rejected (the request that can make the
     * producer fail), and whether a message of it in flight when the producer failed has been
     * reported cancelled (logged once per producer). */
    char rejected_topic[256]; /* by name: the message's topic handle may be gone by the purge */
    int32_t rejected_partition;
    bool fatal_in_flight_logged;
    char last_topic[256]; /* the topic of the last message produced */
    /* The log context current when the producer was made (its database's, when a process
     * serves several): made current again as its reports and errors are served on the loop, and
     * by librdkafka's threads. A copy: a retired producer (kafka_producer_retire) may log from
     * its own thread after its relay, and the relay's context string, are gone. */
    char log_context_buf[128];
    const char *log_context; /* log_context_buf, or NULL: none */
    /* Set by kafka_producer_retire before its thread starts: from then on its error and stats
     * callbacks (served by that thread's flush, in its database's log context) say nothing about
     * reachability or recreation, which would read as the live producer's state. */
    atomic_bool retired;
};

/* Sets key to value; on failure, one line in err that starts with origin (where the property
 * was set, and its name) and never shows a secret value. */
static bool conf_set_from(rd_kafka_conf_t *conf, const char *key, const char *value,
                          const char *origin, char *err, size_t errlen)
{
    char why[512];
    if (rd_kafka_conf_set(conf, key, value, why, sizeof(why)) == RD_KAFKA_CONF_OK)
        return true;
    if (secrets_kafka_key_sensitive(key) && *value && strstr(why, value))
        snprintf(why, sizeof(why), "invalid value (not shown: it is a secret)");
    snprintf(err, errlen, "%s: %s", origin, why);
    return false;
}

static bool conf_set(rd_kafka_conf_t *conf, const char *key, const char *value, const char *source,
                     char *err, size_t errlen)
{
    char origin[300];
    snprintf(origin, sizeof(origin), "%s %s", source, key);
    return conf_set_from(conf, key, value, origin, err, errlen);
}

/* The properties whose final values kafka_conf_build checks. */
enum {
    W_IDEMPOTENCE,
    W_GAPLESS,
    W_TIMEOUT,
    W_PARTITIONER,
    W_TRANSACTIONAL_ID,
    W_QUEUE_KBYTES,
    W_MESSAGE_MAX_BYTES,
    W_REPORT_ONLY_ERROR,
    W_TEST_MOCK,
    W_N
};
static const char *const watched[W_N] = {
    "enable.idempotence", "enable.gapless.guarantee",   "message.timeout.ms",
    "partitioner",        "transactional.id",           "queue.buffering.max.kbytes",
    "message.max.bytes",  "delivery.report.only.error", "test.mock.num.brokers"};

/* The value of key in conf as text ("" if librdkafka has none). */
static void conf_value(const rd_kafka_conf_t *conf, const char *key, char *out, size_t outlen)
{
    size_t size = outlen;
    if (rd_kafka_conf_get(conf, key, out, &size) != RD_KAFKA_CONF_OK)
        out[0] = '\0';
}

/* Where a watched property's final value came from: entry i of cfg->kafka, or (i < 0) the
 * relay's default or librdkafka's. */
static void watched_origin(const Config *cfg, long i, const char *key, char *out, size_t outlen)
{
    if (i >= 0)
        config_kafka_origin(cfg, (size_t)i, out, outlen);
    else
        snprintf(out, outlen, "default %s", key);
}

/* The longest --delivery-timeout of the process (each database may set its own): the producer
 * is the process's. */
static long max_delivery_timeout_ms(const Config *cfg)
{
    long ms = cfg->n_dbs ? 0 : cfg->delivery_timeout_ms;
    for (int i = 0; i < cfg->n_dbs; i++)
        if (cfg->dbs[i].delivery_timeout_ms > ms)
            ms = cfg->dbs[i].delivery_timeout_ms;
    return ms;
}

/* The trial producer's lines are dropped: the real producer logs the same warnings again, with
 * its database named (the trial runs before any database's log context is set, and its start and
 * teardown lines are noise). */
static void on_trial_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    (void)level;
    (void)fac;
    (void)buf;
}

/* Whether rd_kafka_new accepts conf (left as it is); why says why not. librdkafka checks some
 * combinations only there (acks, max.in.flight.requests.per.connection or retries against
 * idempotence, the TLS files), so run would otherwise refuse them only after check said the
 * configuration is valid. The trial producer has no bootstrap server, so it connects nowhere. */
static bool producer_accepts(const rd_kafka_conf_t *conf, bool *no_resource, char *why,
                             size_t whylen)
{
    rd_kafka_conf_t *trial = rd_kafka_conf_dup(conf);
    char ignored[128];
    rd_kafka_conf_set(trial, "bootstrap.servers", "", ignored, sizeof(ignored));
    rd_kafka_conf_set_log_cb(trial, on_trial_log);
    KafkaPins pins;
    if (!kafka_conf_pin_files(trial, &pins, why, whylen)) {
        if (no_resource)
            *no_resource = false;
        rd_kafka_conf_destroy(trial);
        return false;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, trial, why, whylen);
    kafka_pins_text(&pins, why, whylen);
    kafka_pins_close(&pins);
    if (!rk) {
        /* Not the configuration's fault: no thread to spare (a process or cgroup limit). */
        if (no_resource)
            *no_resource = rd_kafka_last_error() == RD_KAFKA_RESP_ERR__CRIT_SYS_RESOURCE;
        rd_kafka_conf_destroy(trial);
        return false;
    }
    rd_kafka_destroy(rk);
    return true;
}

/* conf (base, then every entry of cfg->kafka) is one rd_kafka_new refuses: one line in err that
 * names the entry after which it stays refused (the last entry k such that base with entries
 * 0..k-1 is accepted), as a property librdkafka rejects outright is named. */
static void producer_refusal(const Config *cfg, const rd_kafka_conf_t *base, const char *why,
                             char *err, size_t errlen)
{
    char scratch[512];
    for (size_t k = cfg->kafka.len; k-- > 0;) {
        rd_kafka_conf_t *prefix = rd_kafka_conf_dup(base);
        for (size_t j = 0; j < k; j++)
            rd_kafka_conf_set(prefix, cfg->kafka.items[j].key, cfg->kafka.items[j].value, scratch,
                              sizeof(scratch));
        bool accepted = producer_accepts(prefix, NULL, scratch, sizeof(scratch));
        rd_kafka_conf_destroy(prefix);
        if (accepted) {
            const OptPair *p = &cfg->kafka.items[k];
            char origin[1024];
            config_kafka_origin(cfg, k, origin, sizeof(origin));
            bool hide = secrets_kafka_key_sensitive(p->key) && *p->value && strstr(why, p->value);
            snprintf(err, errlen, "%s: librdkafka refuses the producer: %s", origin,
                     hide ? "invalid value (not shown: it is a secret)" : why);
            return;
        }
    }
    snprintf(err, errlen, "invalid Kafka configuration: %s", why);
}

/* The files librdkafka 2.0.2 opens in rd_kafka_new, for TLS (rd_kafka_ssl_ctx_init): on the
 * caller's thread, and for a producer made while the relay runs (a database a reload adds, a
 * recreation after a fatal error) that is the event loop. */
static const char *const tls_file_props[] = {
    "ssl.ca.location",  "ssl.crl.location",      "ssl.certificate.location",
    "ssl.key.location", "ssl.keystore.location", "ssl.engine.location",
};

/* Why a TLS file librdkafka opens is refused (kafka_conf_files_ok, kafka_conf_pin_files): said
 * by run (start-up, a reload, a producer's recreation) and by check and verify, so true of each:
 * the event loop is run's, --statement-timeout the commands' bound. */
#define KAFKA_NOT_REGULAR                                                                          \
    "not a regular file or a directory (librdkafka opens it whenever a client is made, and a "     \
    "pipe's, device's or socket's open could wait without end: on the running relay's event "      \
    "loop, or past a command's --statement-timeout)"

bool kafka_conf_files_ok(const rd_kafka_conf_t *conf, char *err, size_t errlen)
{
    char proto[32] = "";
    size_t len = sizeof(proto);
    if (rd_kafka_conf_get(conf, "security.protocol", proto, &len) != RD_KAFKA_CONF_OK ||
        (strcasecmp(proto, "ssl") != 0 && strcasecmp(proto, "sasl_ssl") != 0))
        return true; /* no TLS: librdkafka opens none of them */
    for (size_t i = 0; i < sizeof(tls_file_props) / sizeof(tls_file_props[0]); i++) {
        char path[4096] = "";
        len = sizeof(path);
        if (rd_kafka_conf_get(conf, tls_file_props[i], path, &len) != RD_KAFKA_CONF_OK ||
            !path[0] || strcmp(path, "probe") == 0) /* probe: the system's CA paths */
            continue;
        /* stat, not open: nothing is read and a device is not opened. Absent: librdkafka's own
         * error says so. A directory neither waits in its open nor in its read: the CA location
         * may be one (OpenSSL looks certificates up in it by hash), and in another's place
         * librdkafka fails the producer at once with its own error. Only a FIFO, a device or a
         * socket can stop the loop. */
        struct stat st;
        if (stat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))
            continue;
        snprintf(err, errlen, "kafka %s %s: " KAFKA_NOT_REGULAR, tls_file_props[i], path);
        return false;
    }
    return true;
}

/* The files of tls_file_props that librdkafka 2.0.2 reads whole in rd_kafka_ssl_ctx_init and never
 * opens again: the engine is a library (dlopen) and stays a path. */
static const char *const pinned_props[KAFKA_PINS_MAX] = {
    "ssl.ca.location",  "ssl.crl.location",      "ssl.certificate.location",
    "ssl.key.location", "ssl.keystore.location",
};

bool kafka_conf_pin_files(rd_kafka_conf_t *conf, KafkaPins *pins, char *err, size_t errlen)
{
    memset(pins, 0, sizeof(*pins));
    if (!kafka_conf_files_ok(conf, err, errlen))
        return false;
    char proto[32] = "";
    size_t len = sizeof(proto);
    if (rd_kafka_conf_get(conf, "security.protocol", proto, &len) != RD_KAFKA_CONF_OK ||
        (strcasecmp(proto, "ssl") != 0 && strcasecmp(proto, "sasl_ssl") != 0))
        return true;
    for (size_t i = 0; i < KAFKA_PINS_MAX; i++) {
        char path[4096] = "";
        len = sizeof(path);
        if (rd_kafka_conf_get(conf, pinned_props[i], path, &len) != RD_KAFKA_CONF_OK || !path[0] ||
            strcmp(path, "probe") == 0)
            continue;
        /* O_NONBLOCK: a FIFO swapped in since the check above opens at once (and is refused
         * below) instead of waiting for a writer; O_NOCTTY: a terminal does not become ours. */
        int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) {
            /* Refused here, not left to librdkafka: a FIFO made at the path after this failed
             * open would be opened by it, waiting. Its own error would refuse the same. */
            snprintf(err, errlen, "kafka %s %s: %s", pinned_props[i], path, strerror(errno));
            kafka_pins_close(pins);
            return false;
        }
        struct stat st, via;
        char alias[64];
        snprintf(alias, sizeof(alias), "/proc/self/fd/%d", fd);
        bool known = fstat(fd, &st) == 0;
        if (known && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
            close(fd);
            snprintf(err, errlen, "kafka %s %s: " KAFKA_NOT_REGULAR, pinned_props[i], path);
            kafka_pins_close(pins);
            return false;
        }
        if (!known || S_ISDIR(st.st_mode) || stat(alias, &via) != 0 || via.st_dev != st.st_dev ||
            via.st_ino != st.st_ino) {
            /* A directory (the CA's, whose entries the broker threads look up later, not the
             * loop) keeps its path, as does a file when /proc is not mounted. */
            close(fd);
            continue;
        }
        char set_err[256];
        if (!(pins->path[i] = strdup(path)) ||
            rd_kafka_conf_set(conf, pinned_props[i], alias, set_err, sizeof(set_err)) !=
                RD_KAFKA_CONF_OK) {
            close(fd);
            snprintf(err, errlen, "kafka %s %s: %s", pinned_props[i], path,
                     pins->path[i] ? set_err : strerror(ENOMEM));
            free(pins->path[i]);
            pins->path[i] = NULL;
            kafka_pins_close(pins);
            return false;
        }
        pins->fd[i] = fd + 1; /* 0: none (a zeroed KafkaPins holds nothing) */
    }
    return true;
}

void kafka_pins_text(const KafkaPins *pins, char *text, size_t size)
{
    /* One pass, as db_pins_text: an alias counts only where its number ends ("/proc/self/fd/3"
     * is not the start of "/proc/self/fd/31", another pin's when 3 was free and 4 to 30 were
     * not), and a path written in is not searched again. */
    char *out = size ? malloc(size) : NULL;
    if (!out)
        return; /* the aliases stay */
    size_t o = 0;
    for (const char *t = text; *t && o + 1 < size;) {
        int hit = -1;
        char alias[64];
        size_t alen = 0;
        for (int i = 0; i < KAFKA_PINS_MAX && hit < 0; i++) {
            if (!pins->fd[i])
                continue;
            alen = (size_t)snprintf(alias, sizeof(alias), "/proc/self/fd/%d", pins->fd[i] - 1);
            if (strncmp(t, alias, alen) == 0 && !isdigit((unsigned char)t[alen]))
                hit = i;
        }
        size_t plen = hit < 0 ? 0 : strlen(pins->path[hit]);
        if (hit < 0 || o + plen + 1 > size) { /* not an alias, or no room: kept as it is */
            out[o++] = *t++;
            continue;
        }
        memcpy(out + o, pins->path[hit], plen);
        o += plen;
        t += alen;
    }
    out[o] = '\0';
    memcpy(text, out, o + 1);
    free(out);
}

void kafka_pins_close(KafkaPins *pins)
{
    for (size_t i = 0; i < KAFKA_PINS_MAX; i++) {
        if (pins->fd[i])
            close(pins->fd[i] - 1);
        free(pins->path[i]);
        pins->fd[i] = 0;
        pins->path[i] = NULL;
    }
}

void kafka_conf_layout_partitioner(rd_kafka_conf_t *conf, const Config *cfg)
{
    for (size_t i = 0; i < cfg->kafka.len; i++)
        if (strcmp(cfg->kafka.items[i].key, "partitioner") == 0)
            return; /* the operator's choice, checked by kafka_conf_build */
    /* The relay sends every key, never a NULL one, so murmur2 and murmur2_random place alike; an
     * empty aggregate id goes to one partition, in order, as with consistent. */
    char ignored[256];
    rd_kafka_conf_set(conf, "partitioner",
                      cfg->layout == LAYOUT_DEBEZIUM ? "murmur2" : "consistent", ignored,
                      sizeof(ignored));
}

rd_kafka_conf_t *kafka_conf_build(const Config *cfg, bool *runtime, char *err, size_t errlen)
{
    if (runtime)
        *runtime = false;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    /* Idempotence gives acks=all, at most 5 requests in flight and no reordering or duplicates
     * within a partition: the per-aggregate order rests on it. It does not cover messages that
     * time out: librdkafka may then bump the epoch and go on with later messages of the same
     * partition, leaving a gap that a retry would fill out of order. So messages never time out
     * here (0 = no limit); the relay bounds each batch's wait itself and then cancels the whole
     * remainder of the batch at once (kafka_purge), which cannot leave such a gap. */
    bool ok = conf_set(conf, "enable.idempotence", "true", "default", err, errlen) &&
              conf_set(conf, "message.timeout.ms", "0", "default", err, errlen) &&
              /* A broker rejecting one batch while later batches of the partition are in
               * flight would otherwise let those later messages through past the gap; with
               * this, librdkafka fails them all (a fatal error, after which the relay recreates
               * the producer and retries in order). */
              conf_set(conf, "enable.gapless.guarantee", "true", "default", err, errlen) &&
              /* An aggregate stays in one partition only if its key picks the partition.
               * librdkafka's default, consistent_random, places an empty key (an aggregate id
               * '') at random, message by message; consistent is the same CRC32 of the key for
               * every other key, so no aggregate moves. */
              conf_set(conf, "partitioner", "consistent", "default", err, errlen) &&
              conf_set(conf, "client.id", "outbox-relay", "default", err, errlen) &&
              /* The relay hands Kafka whole batches at once, so waiting for more messages only
               * adds latency: measured, linger.ms=0 took p50 commit-to-consumer from 12.6 to
               * 2.9 ms at 1,000 events/s with the same drain rate (docs/benchmarks.md). */
              conf_set(conf, "linger.ms", "0", "default", err, errlen) &&
              /* Requests point at the payloads instead of copying them (librdkafka copies those
               * under 64 KB by default): they live in the claim results until every report is
               * in, and a request still being written is never purged before it is sent (its
               * messages are reported after it). Measured: about 0.3 MB less peak RSS. */
              conf_set(conf, "message.copy.max.bytes", "0", "default", err, errlen) &&
              /* Broker states for the readiness endpoint (see kafka_stats.h). */
              (!cfg->metrics_listen || conf_set(conf, "statistics.interval.ms",
                                                KAFKA_STATS_INTERVAL_MS, "default", err, errlen)) &&
              (!cfg->brokers ||
               conf_set(conf, "bootstrap.servers", cfg->brokers, "--brokers", err, errlen));
    /* The checks below read the final values, as librdkafka will use them, whatever spelling
     * set them (an alias such as delivery.timeout.ms, "1" or "TRUE" for true); the entry that
     * last changed each one is the one an error names. */
    rd_kafka_conf_t *base = ok ? rd_kafka_conf_dup(conf) : NULL;
    char value[W_N][64];
    long setter[W_N];
    for (int w = 0; w < W_N; w++) {
        conf_value(conf, watched[w], value[w], sizeof(value[w]));
        setter[w] = -1;
    }
    for (size_t i = 0; ok && i < cfg->kafka.len; i++) {
        const OptPair *p = &cfg->kafka.items[i];
        char origin[1024];
        config_kafka_origin(cfg, i, origin, sizeof(origin));
        if (strcmp(p->key, "dr_msg_cb") == 0 || strcmp(p->key, "dr_cb") == 0 ||
            strcmp(p->key, "opaque") == 0) {
            snprintf(err, errlen, "%s: cannot be set from configuration", origin);
            ok = false;
        } else {
            ok = conf_set_from(conf, p->key, p->value, origin, err, errlen);
        }
        for (int w = 0; ok && w < W_N; w++) {
            char now[64];
            conf_value(conf, watched[w], now, sizeof(now));
            if (strcmp(now, value[w]) != 0) {
                snprintf(value[w], sizeof(value[w]), "%s", now);
                setter[w] = (long)i;
            }
        }
    }
    char origin[1024];
    if (ok && strcmp(value[W_IDEMPOTENCE], "true") != 0) {
        watched_origin(cfg, setter[W_IDEMPOTENCE], watched[W_IDEMPOTENCE], origin, sizeof(origin));
        snprintf(err, errlen, "%s=%s: must stay true, per-aggregate order depends on it", origin,
                 value[W_IDEMPOTENCE]);
        ok = false;
    }
    /* Without the gap-less guarantee, librdkafka 2.0.2 answers a broker's permanent rejection
     * of one request (a record too large for the topic, a timestamp out of its range) by
     * bumping the epoch and sending the partition's later messages on (rd_kafka_handle_Produce_
     * error): the later events of the rejected one's aggregates are then in the topic before
     * its retry, or its dead-lettering, which breaks the documented order, not just weakens it. */
    if (ok && strcmp(value[W_GAPLESS], "true") != 0) {
        watched_origin(cfg, setter[W_GAPLESS], watched[W_GAPLESS], origin, sizeof(origin));
        snprintf(err, errlen,
                 "%s=%s: must stay true: without it, a message the broker rejects lets the later "
                 "messages of its partition through ahead of its retry (per-aggregate order)",
                 origin, value[W_GAPLESS]);
        ok = false;
    }
    /* The relay always passes the aggregate id as the key, never a NULL one, so only these two
     * spread one aggregate's events over several partitions (murmur2_random and fnv1a_random
     * randomise NULL keys alone). */
    const char *scatters = strcmp(value[W_PARTITIONER], "random") == 0 ? "every event"
                           : strcmp(value[W_PARTITIONER], "consistent_random") == 0
                               ? "the events of an empty aggregate id"
                               : NULL;
    if (ok && scatters) {
        watched_origin(cfg, setter[W_PARTITIONER], watched[W_PARTITIONER], origin, sizeof(origin));
        snprintf(err, errlen,
                 "%s=%s: places %s in a partition at random, which breaks per-aggregate order; "
                 "use consistent (the relay's default), murmur2 or fnv1a",
                 origin, value[W_PARTITIONER], scatters);
        ok = false;
    }
    /* A transactional producer refuses every message produced outside a transaction
     * (RD_KAFKA_RESP_ERR__STATE), and the relay begins none: it would run, fail every batch as
     * a transient error and retry it for ever, publishing nothing. */
    if (ok && value[W_TRANSACTIONAL_ID][0]) {
        watched_origin(cfg, setter[W_TRANSACTIONAL_ID], watched[W_TRANSACTIONAL_ID], origin,
                       sizeof(origin));
        snprintf(err, errlen,
                 "%s: the relay does not use transactions, and a transactional producer refuses "
                 "every message sent outside one; leave it unset",
                 origin);
        ok = false;
    }
    /* With delivery.report.only.error librdkafka reports failed messages only (and destroys the
     * others on its own thread): the relay, which marks a row sent on its success report alone,
     * would see no acknowledgement, time every batch out and publish it again, each
     * --delivery-timeout for ever, marking nothing. */
    if (ok && strcmp(value[W_REPORT_ONLY_ERROR], "true") == 0) {
        watched_origin(cfg, setter[W_REPORT_ONLY_ERROR], watched[W_REPORT_ONLY_ERROR], origin,
                       sizeof(origin));
        snprintf(err, errlen,
                 "%s=%s: the relay marks a row sent only when Kafka reports its delivery, and "
                 "with it no success is reported: every batch would be sent again for ever; "
                 "leave it false",
                 origin, value[W_REPORT_ONLY_ERROR]);
        ok = false;
    }
    /* test.mock.num.brokers, a librdkafka test property, replaces bootstrap.servers with a
     * cluster inside the relay's own process: every message is acknowledged and every row marked
     * sent, and the events are gone when the process ends. Nothing the relay promises holds. */
    if (ok && strcmp(value[W_TEST_MOCK], "0") != 0 && value[W_TEST_MOCK][0]) {
        watched_origin(cfg, setter[W_TEST_MOCK], watched[W_TEST_MOCK], origin, sizeof(origin));
        snprintf(err, errlen,
                 "%s=%s: librdkafka would publish to a mock cluster inside the relay's own "
                 "process, mark every row sent and lose every event at exit; leave it unset",
                 origin, value[W_TEST_MOCK]);
        ok = false;
    }
    /* A message timeout shorter than --delivery-timeout fails messages one at a time (queued
     * ones during any broker outage longer than it), and librdkafka sends the later messages of
     * the partition on: order breaks in ordinary outages, so it is refused. One at least as long
     * never fires first (the batch's delivery timer starts at the claim, before any of its
     * messages is produced, and then cancels them all at once) but leaves order resting on the
     * two staying so: warned. */
    long timeout_ms = strtol(value[W_TIMEOUT], NULL, 10);
    long delivery_ms = max_delivery_timeout_ms(cfg);
    if (ok && timeout_ms > 0) {
        watched_origin(cfg, setter[W_TIMEOUT], watched[W_TIMEOUT], origin, sizeof(origin));
        if (timeout_ms < delivery_ms) {
            snprintf(err, errlen,
                     "%s=%ld: must be 0 (no limit, the relay's default) or at least "
                     "--delivery-timeout (%ld ms): a message that times out alone lets the later "
                     "messages of its partition through ahead of its retry (per-aggregate order)",
                     origin, timeout_ms, delivery_ms);
            ok = false;
        } else {
            char q[1100];
            log_warn("message.timeout.ms is set: --delivery-timeout cancels each batch first, but "
                     "per-aggregate order breaks if --delivery-timeout is ever raised to it; "
                     "leave it unset",
                     "origin=%s message_timeout_ms=%ld delivery_timeout_ms=%ld",
                     log_quote(origin, q, sizeof(q)), timeout_ms, delivery_ms);
        }
    }
    /* A message larger than the producer's whole queue is refused with QUEUE_FULL for ever,
     * which the relay can only read as a full queue: its row would retry without end. */
    long long qkb = strtoll(value[W_QUEUE_KBYTES], NULL, 10);
    long long mmb = strtoll(value[W_MESSAGE_MAX_BYTES], NULL, 10);
    if (ok && qkb * 1024 < mmb) {
        int w = setter[W_MESSAGE_MAX_BYTES] > setter[W_QUEUE_KBYTES] ? W_MESSAGE_MAX_BYTES
                                                                     : W_QUEUE_KBYTES;
        watched_origin(cfg, setter[w], watched[w], origin, sizeof(origin));
        snprintf(err, errlen,
                 "%s: the producer's queue must hold one message of message.max.bytes (%lld "
                 "bytes), queue.buffering.max.kbytes is %lld; raise it, or lower "
                 "message.max.bytes",
                 origin, mmb, qkb);
        ok = false;
    }
    /* Before the trial producer, which would open them. */
    ok = ok && kafka_conf_files_ok(conf, err, errlen);
    char why[512];
    bool no_resource = false;
    if (ok && !producer_accepts(conf, &no_resource, why, sizeof(why))) {
        if (no_resource)
            snprintf(err, errlen, "cannot create the producer: %s", why);
        else
            producer_refusal(cfg, base, why, err, errlen);
        if (runtime)
            *runtime = no_resource;
        ok = false;
    }
    if (base)
        rd_kafka_conf_destroy(base);
    if (!ok) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return conf;
}

bool kafka_reload_check(const Config *running, const Config *fresh, char *err, size_t errlen)
{
    /* The running producer's message.timeout.ms, as kafka_conf_build's checks read it: the
     * relay's default, then running's entries in order (the ones it started with: --kafka and
     * the files are restart-only). Setting properties on a bare conf connects nowhere and starts
     * nothing, so this is safe on the loop; entries that fail to set failed nothing at start
     * either (kafka_conf_build refused them) and are skipped. */
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char ignored[256], value[64];
    long setter = -1;
    rd_kafka_conf_set(conf, "message.timeout.ms", "0", ignored, sizeof(ignored));
    conf_value(conf, "message.timeout.ms", value, sizeof(value));
    for (size_t i = 0; i < running->kafka.len; i++) {
        const OptPair *p = &running->kafka.items[i];
        if (rd_kafka_conf_set(conf, p->key, p->value, ignored, sizeof(ignored)) != RD_KAFKA_CONF_OK)
            continue;
        char now[64];
        conf_value(conf, "message.timeout.ms", now, sizeof(now));
        if (strcmp(now, value) != 0) {
            snprintf(value, sizeof(value), "%s", now);
            setter = (long)i;
        }
    }
    rd_kafka_conf_destroy(conf);
    long timeout_ms = strtol(value, NULL, 10);
    if (timeout_ms <= 0)
        return true;
    /* Each database's own --delivery-timeout is checked, so that the line names the entry. */
    const Config *over = NULL;
    if (!fresh->n_dbs && fresh->delivery_timeout_ms > timeout_ms)
        over = fresh;
    for (int i = 0; !over && i < fresh->n_dbs; i++)
        if (fresh->dbs[i].delivery_timeout_ms > timeout_ms)
            over = &fresh->dbs[i];
    if (!over)
        return true;
    char origin[1024], entry[160] = "";
    watched_origin(running, setter, "message.timeout.ms", origin, sizeof(origin));
    if (over->database_name)
        snprintf(entry, sizeof(entry), "database %s: ", over->database_name);
    snprintf(
        err, errlen,
        "%s--delivery-timeout (%ld ms) is longer than the running producer's %s=%ld: a message "
        "that times out alone lets the later messages of its partition through ahead of its "
        "retry (per-aggregate order); keep it at most %ld ms, or change message.timeout.ms "
        "and restart",
        entry, over->delivery_timeout_ms, origin, timeout_ms, timeout_ms);
    return false;
}

static void mark_up(KafkaProducer *kp)
{
    if (kp->up || atomic_load(&kp->retired))
        return;
    kp->up = true;
    if (kp->down_logged)
        log_info("kafka reachable again", NULL);
    kp->down_logged = false;
}

static void on_delivery_report(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
    KafkaProducer *kp = opaque;
    if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
        mark_up(kp);
    if (msg->err > 0) { /* a broker's answer, not one of librdkafka's own (negative) */
        snprintf(kp->rejected_topic, sizeof(kp->rejected_topic), "%s",
                 rd_kafka_topic_name(msg->rkt));
        kp->rejected_partition = msg->partition;
    }
    if (kp->fatal_from_broker && msg->err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT &&
        kp->rejected_topic[0] && strcmp(rd_kafka_topic_name(msg->rkt), kp->rejected_topic) == 0 &&
        msg->partition == kp->rejected_partition && !kp->fatal_in_flight_logged) {
        /* After the fatal error librdkafka 2.0.2 may still send a request it had built behind
         * the rejected one; the purge reports it failed, but a broker with no record of this
         * producer on the partition (its first request there was the rejected one) keeps it,
         * ahead of the failed events' retry (docs/guarantees.md, "In Kafka"). The relay cannot
         * tell whether it was kept: say so rather than stay silent. Only for the rejected
         * partition: on the others the purge cancels a tail behind acknowledged messages. */
        char key[128], q[300];
        snprintf(key, sizeof(key), "%.*s", msg->key_len < sizeof(key) ? (int)msg->key_len : 127,
                 msg->key ? (const char *)msg->key : "");
        log_warn("events in flight when the producer failed were cancelled; the broker may have "
                 "kept them ahead of earlier failed events of their aggregates (order may be "
                 "broken for those aggregates)",
                 "key=%s", log_quote(key, q, sizeof(q)));
        kp->fatal_in_flight_logged = true;
    }
    /* NULL once retired: its reports reach nothing of the relay's (kafka_producer_retire). */
    if (kp->on_delivery)
        kp->on_delivery(msg->_private, msg->err, kp->arg);
}

/* Served by rd_kafka_poll, i.e. on the loop thread like the delivery reports. */
static int on_stats(rd_kafka_t *rk, char *json, size_t json_len, void *opaque)
{
    KafkaProducer *kp = opaque;
    if (atomic_load(&kp->retired))
        return 0; /* its brokers are not the live producer's news */
    int up = kafka_stats_brokers_up(json, json_len);
    if (up > 0)
        mark_up(kp);
    else if (up == 0)
        kp->up = false;
    return 0; /* librdkafka frees json */
}

static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    KafkaProducer *kp = opaque;
    char q[512];
    if (atomic_load(&kp->retired)) {
        /* Already replaced (or its database removed): nothing is recreated, and whether its
         * brokers answer is not the live producer's state. */
        log_debug("old kafka producer (being destroyed) error", "code=%s error=%s",
                  rd_kafka_err2name((rd_kafka_resp_err_t)err), log_quote(reason, q, sizeof(q)));
        return;
    }
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char why[512];
        rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, why, sizeof(why));
        log_error("kafka producer fatal error, recreating the producer", "error=%s code=%s",
                  log_quote(why, q, sizeof(q)), rd_kafka_err2name(orig));
        kp->fatal = true;
        /* A broker's rejection: its own code, or (enable.gapless.guarantee) librdkafka's
         * __GAPLESS_GUARANTEE, which 2.0.2 raises for any permanent rejection of a message
         * (rd_kafka_handle_Produce_error). The warning below also needs the rejected message's
         * own report (a broker code), so a fatal error of librdkafka's alone never says it. */
        kp->fatal_from_broker = orig > 0 || orig == RD_KAFKA_RESP_ERR__GAPLESS_GUARANTEE;
        /* The producer sends nothing more, but librdkafka 2.0.2 may leave a message it still
         * holds unreported (seen: one message for 30 s, until the delivery timeout, with two
         * sessions' batches in flight). Purging reports everything left at once, as failures the
         * relay retries in order, so the producer is recreated within a batch. */
        kafka_purge(kp);
        return;
    }
    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
        kp->up = false;
        if (!kp->down_logged)
            log_warn("kafka unreachable", "error=%s", log_quote(reason, q, sizeof(q)));
        kp->down_logged = true;
        return;
    }
    /* Transport errors to single brokers repeat on every retry; they are only worth a debug
     * line, the all-brokers-down state above is what an operator needs. */
    log_debug("kafka error", "code=%s error=%s", rd_kafka_err2name((rd_kafka_resp_err_t)err),
              log_quote(reason, q, sizeof(q)));
}

/* Called on librdkafka's own threads (and now and then on the loop's, inside a librdkafka call).
 * The log context is per thread, so theirs is empty: the producer's (its database's, when a
 * process serves several) is set around the line and the thread's own put back, which leaves
 * the loop thread's context as it was when the call comes from there. The producer is reached
 * through rk's opaque, which rd_kafka_new took from the conf before any thread started; the
 * context string outlives the producer (kafka_producer_new's contract). */
static void on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    char q[512];
    /* Configuration warnings matter once at start-up (except the one about a property we set on
     * purpose); the rest repeats what on_error reports. */
    bool confwarn = strcmp(fac, "CONFWARN") == 0 && !strstr(buf, "enable.gapless.guarantee");
    LogLevel lvl = confwarn ? LOG_WARN : LOG_DEBUG;
    const KafkaProducer *kp = rk ? rd_kafka_opaque(rk) : NULL;
    const char *was = log_context();
    if (kp)
        log_set_context(kp->log_context);
    log_write(lvl, "librdkafka", "facility=%s text=%s", fac, log_quote(buf, q, sizeof(q)));
    log_set_context(was);
}

void kafka_poll(KafkaProducer *kp)
{
    while (rd_kafka_poll(kp->rk, 0) > 0)
        ;
}

static void on_pipe(struct ev_loop *loop, ev_io *w, int revents)
{
    KafkaProducer *kp = w->data;
    log_set_context(kp->log_context);
    char buf[64];
    /* Drain the wake-up bytes first: librdkafka writes again only after the queue is polled. */
    while (read(kp->pipe_fds[0], buf, sizeof(buf)) > 0)
        ;
    kafka_poll(kp);
}

KafkaProducer *kafka_producer_new(struct ev_loop *loop, rd_kafka_conf_t *conf,
                                  KafkaDeliveryFn on_delivery, void *arg, char *err, size_t errlen)
{
    /* librdkafka reads the TLS files in rd_kafka_new, here on the loop: it is handed
     * /proc/self/fd aliases of files opened without waiting and found regular, so that a file
     * swapped for a FIFO after any check cannot be what it opens (kafka_conf_pin_files). */
    KafkaPins pins;
    if (!kafka_conf_pin_files(conf, &pins, err, errlen)) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return kafka_producer_new_pinned(loop, conf, &pins, on_delivery, arg, err, errlen);
}

KafkaProducer *kafka_producer_new_pinned(struct ev_loop *loop, rd_kafka_conf_t *conf,
                                         KafkaPins *pins, KafkaDeliveryFn on_delivery, void *arg,
                                         char *err, size_t errlen)
{
    KafkaProducer *kp = calloc(1, sizeof(*kp));
    if (!kp || pipe2(kp->pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
        snprintf(err, errlen, "cannot create the producer: %s", strerror(errno));
        free(kp);
        kafka_pins_close(pins);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    kp->loop = loop;
    if (log_context()) {
        snprintf(kp->log_context_buf, sizeof(kp->log_context_buf), "%s", log_context());
        kp->log_context = kp->log_context_buf;
    }
    kp->on_delivery = on_delivery;
    kp->arg = arg;
    rd_kafka_conf_set_opaque(conf, kp);
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery_report);
    rd_kafka_conf_set_error_cb(conf, on_error);
    rd_kafka_conf_set_log_cb(conf, on_log);
    rd_kafka_conf_set_stats_cb(conf, on_stats);

    /* The conf names the pinned files' /proc/self/fd aliases; a librdkafka error naming one is
     * given its path back. */
    char why[512];
    kp->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof(why));
    kafka_pins_text(pins, why, sizeof(why));
    kafka_pins_close(pins);
    if (!kp->rk) {
        /* The configuration passed kafka_conf_build's trial: most likely no thread to spare. */
        snprintf(err, errlen, "%s: %s",
                 rd_kafka_last_error() == RD_KAFKA_RESP_ERR__CRIT_SYS_RESOURCE
                     ? "cannot create the producer"
                     : "invalid Kafka configuration",
                 why);
        rd_kafka_conf_destroy(conf);
        close(kp->pipe_fds[0]);
        close(kp->pipe_fds[1]);
        free(kp);
        return NULL;
    }
    rd_kafka_queue_t *main_q = rd_kafka_queue_get_main(kp->rk);
    rd_kafka_queue_io_event_enable(main_q, kp->pipe_fds[1], "1", 1);
    rd_kafka_queue_destroy(main_q);

    ev_io_init(&kp->io, on_pipe, kp->pipe_fds[0], EV_READ);
    kp->io.data = kp;
    ev_io_start(loop, &kp->io);
    /* librdkafka writes the wake-up byte only when its queue goes from empty to non-empty:
     * events queued between rd_kafka_new and the line above (brokers refusing connections, say)
     * would never wake us. Wake the loop once so they are served. */
    ssize_t ignored = write(kp->pipe_fds[1], "1", 1);
    (void)ignored;
    return kp;
}

/* Producers being destroyed off the loop, each by a thread of its own (retire_main): those
 * kafka_producer_retire took, and those kafka_producer_free handed over once every report of
 * theirs had been served. A list, not one slot: with one slot, a database removed by SIGHUP
 * while another old producer was still being destroyed had its producer destroyed on the loop
 * (relay_free_within's fallback), stalling every database for as long as rd_kafka_destroy took;
 * and at exit the second of two databases' producers was destroyed inline, unbounded. Only the
 * loop's thread (after the loop, the main thread) adds, joins and reads the list; each thread
 * sets its own done flag as it ends. */
typedef struct Retiring {
    pthread_t thread;
    KafkaProducer *kp;
    atomic_bool done;
    bool replacement; /* taken by kafka_producer_retire: counts for its one at a time */
    /* Called on the thread once the producer is destroyed (kafka_producer_free_then): frees the
     * caller's payloads its messages pointed into. NULL: none. */
    void (*after)(void *);
    void *after_arg;
    double since;
    char context[128]; /* its producer's log context, for the warning of a slow destroy */
    struct Retiring *next;
} Retiring;
static Retiring *retiring;
static int n_retiring;
/* Whether a recreation kept waiting for the retirement under way has been said (once each). */
static bool retire_slow_logged;

/* A recreation that has waited this long for the previous destroy is said (a destroy stuck in
 * rd_kafka_destroy, a broker thread in a name lookup that never returns, holds up every later
 * recreation, every database's). Nothing kills the thread: librdkafka's cannot be cancelled. */
#define RETIRE_SLOW_S 10.0

/* Bound on the retired producer's last flush: its messages are purged first, so only reports
 * still on their way are waited for. */
#define RETIRE_FLUSH_MS 5000

/* Threads destroying producers at once, at most. A producer is replaced only once the previous
 * replaced one is gone (kafka_producer_retire), and otherwise one goes per database removed or
 * stopped, so a process within its limit of databases (100, draining ones included) never
 * reaches this; past it a producer is destroyed on the caller's thread, as before: the memory
 * and threads of producers stuck in their destroy stay bounded whatever happens. */
#define RETIRING_MAX 256

/* Destroys kp on the caller's thread (blocks for as long as rd_kafka_destroy takes). */
static void destroy_here(KafkaProducer *kp)
{
    rd_kafka_destroy(kp->rk);
    close(kp->pipe_fds[0]);
    close(kp->pipe_fds[1]);
    free(kp);
}

static void *retire_main(void *arg)
{
    Retiring *r = arg;
    KafkaProducer *kp = r->kp;
    log_set_context(kp->log_context);
    rd_kafka_purge(kp->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    /* Serves what is left to on_delivery_report, which passes it to no one now. */
    rd_kafka_flush(kp->rk, RETIRE_FLUSH_MS);
    /* May take long (broker threads finishing a connection attempt, a name lookup): the reason
     * this runs here and not on the loop. */
    destroy_here(kp);
    if (r->after)
        r->after(r->after_arg); /* nothing points into them any more */
    atomic_store(&r->done, true);
    return NULL;
}

/* Joins the threads that have ended (or, with wait, waits for each until deadline, a
 * monotime_now() time). Returns how many are left. */
static int retire_reap(bool wait, double deadline)
{
    for (Retiring **at = &retiring; *at;) {
        Retiring *r = *at;
        while (wait && !atomic_load(&r->done) && monotime_now() < deadline) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (!atomic_load(&r->done)) {
            at = &r->next;
            continue;
        }
        pthread_join(r->thread, NULL);
        *at = r->next;
        n_retiring--;
        free(r);
    }
    return n_retiring;
}

/* A replaced producer still being destroyed (kafka_producer_retire's one at a time), or NULL. */
static const Retiring *replacement_retiring(void)
{
    for (const Retiring *r = retiring; r; r = r->next)
        if (r->replacement)
            return r;
    return NULL;
}

/* Detaches kp from the loop and its owner and starts its thread. false, kp untouched, when no
 * thread can be had (the list full, or pthread_create failing: said, since the caller then
 * destroys it on its own thread). */
static bool retire_start(KafkaProducer *kp, bool replacement, void (*after)(void *),
                         void *after_arg)
{
    Retiring *r = n_retiring < RETIRING_MAX ? calloc(1, sizeof(*r)) : NULL;
    if (!r) {
        log_warn("cannot destroy the old Kafka producer off the event loop; destroying it inline",
                 "error=\"%s\" being_destroyed=%d",
                 n_retiring < RETIRING_MAX ? "out of memory" : "too many being destroyed",
                 n_retiring);
        return false;
    }
    /* From here on nothing of the relay's is reached: the loop no longer polls it, and its
     * reports (all of them in already, see the contract) go nowhere. */
    ev_io_stop(kp->loop, &kp->io);
    kp->on_delivery = NULL;
    kp->arg = NULL;
    atomic_store(&kp->retired, true);
    r->kp = kp;
    r->replacement = replacement;
    r->after = after;
    r->after_arg = after_arg;
    r->since = monotime_now();
    /* Copied before the thread starts: it frees kp. */
    snprintf(r->context, sizeof(r->context), "%s", kp->log_context ? kp->log_context : "");
    /* It takes none of the process's signals (sigmask.h): they are the loop's. */
    sigset_t old;
    sigmask_block_async(&old);
    int rc = pthread_create(&r->thread, NULL, retire_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        log_warn("cannot destroy the old Kafka producer off the event loop; destroying it inline",
                 "error=\"%s\"", strerror(rc));
        free(r);
        return false;
    }
    r->next = retiring;
    retiring = r;
    n_retiring++;
    if (replacement)
        retire_slow_logged = false;
    return true;
}

void kafka_producer_free(KafkaProducer *kp, int timeout_ms)
{
    kafka_producer_free_then(kp, timeout_ms, NULL, NULL);
}

void kafka_producer_free_then(KafkaProducer *kp, int timeout_ms, void (*after)(void *),
                              void *after_arg)
{
    if (!kp) {
        if (after)
            after(after_arg);
        return;
    }
    ev_io_stop(kp->loop, &kp->io);
    bool left = rd_kafka_flush(kp->rk, timeout_ms) != RD_KAFKA_RESP_ERR_NO_ERROR;
    if (left)
        log_warn("kafka messages still queued at shutdown; they stay unmarked and will be re-sent",
                 "count=%d", rd_kafka_outq_len(kp->rk));
    /* Messages are left, and the caller's payloads they point into can wait for the destroy
     * (after): the purge, the last flush and the destroy all go to a thread, which frees the
     * payloads once the producer is gone. Nothing blocks the caller, which may be the loop (a
     * database removed by SIGHUP whose batch was given up). */
    if (left && after && retire_start(kp, false, after, after_arg))
        return;
    if (left) {
        rd_kafka_purge(kp->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(kp->rk, 100);
    }
    /* Every report served and no request out (the queue length counts both): nothing of the
     * caller's is pointed to any more, so the destroy, which may wait for a broker thread in a
     * name lookup, goes to a thread (retire_main flushes and purges nothing then). Otherwise a
     * request may still point into the caller's payloads: destroyed here, before the caller
     * frees them. */
    if (rd_kafka_outq_len(kp->rk) == 0 && retire_start(kp, false, NULL, NULL)) {
        if (after)
            after(after_arg);
        return;
    }
    destroy_here(kp);
    if (after)
        after(after_arg);
}

bool kafka_producer_retire(KafkaProducer *kp)
{
    if (!kp)
        return true;
    (void)retire_reap(false, 0);
    const Retiring *busy = replacement_retiring();
    if (busy) {
        /* The previous one is still being destroyed: the caller tries later. */
        double waited = monotime_now() - busy->since;
        if (!retire_slow_logged && waited >= RETIRE_SLOW_S) {
            char q[300];
            log_warn("the previous Kafka producer is still being destroyed; every producer "
                     "recreation waits for it",
                     "seconds=%.0f old_producer=%s", waited,
                     log_quote(busy->context[0] ? busy->context : "-", q, sizeof(q)));
            retire_slow_logged = true;
        }
        return false;
    }
    if (!retire_start(kp, true, NULL, NULL)) {
        /* No thread to spare: here, on the loop, as before (said by retire_start). */
        ev_io_stop(kp->loop, &kp->io);
        kp->on_delivery = NULL;
        kp->arg = NULL;
        atomic_store(&kp->retired, true);
        rd_kafka_purge(kp->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(kp->rk, 0);
        destroy_here(kp);
    }
    return true;
}

int kafka_retired_wait(int timeout_ms)
{
    double deadline = monotime_now() + (timeout_ms < 0 ? 1e9 : timeout_ms / 1000.0);
    return retire_reap(true, deadline);
}

rd_kafka_resp_err_t kafka_produce(KafkaProducer *kp, const char *topic, int32_t partition,
                                  int64_t timestamp_ms, const char *key, size_t key_len,
                                  const char *value, size_t value_len, rd_kafka_headers_t *hdrs,
                                  void *opaque)
{
    if (strcmp(topic, kp->last_topic) != 0) {
        /* librdkafka 2.0 asks for a topic's partitions right away only when the topic is opened
         * this way; a topic first seen by producev waits for its 1 s metadata scan, which held
         * up every relay's first batch by a second. */
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(kp->rk, topic, NULL);
        if (rkt)
            rd_kafka_topic_destroy(rkt);
        snprintf(kp->last_topic, sizeof(kp->last_topic), "%s", topic);
    }
    /* No copy of the value (flags 0): the batch keeps its rows until every report is in, and a
     * second copy of each in-flight payload was the largest heap item after the claim results. */
    return rd_kafka_producev(kp->rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
                             RD_KAFKA_V_TIMESTAMP(timestamp_ms), RD_KAFKA_V_KEY(key, key_len),
                             RD_KAFKA_V_VALUE((void *)value, value_len), RD_KAFKA_V_HEADERS(hdrs),
                             RD_KAFKA_V_MSGFLAGS(0), RD_KAFKA_V_OPAQUE(opaque), RD_KAFKA_V_END);
}

long kafka_message_max_bytes(const KafkaProducer *kp)
{
    char value[32];
    size_t size = sizeof(value);
    if (rd_kafka_conf_get(rd_kafka_conf(kp->rk), "message.max.bytes", value, &size) !=
        RD_KAFKA_CONF_OK)
        return 1000000; /* librdkafka's default */
    return strtol(value, NULL, 10);
}

void kafka_purge(KafkaProducer *kp)
{
    rd_kafka_purge(kp->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT |
                               RD_KAFKA_PURGE_F_NON_BLOCKING);
}

bool kafka_up(const KafkaProducer *kp)
{
    return kp->up;
}

rd_kafka_t *kafka_handle(const KafkaProducer *kp)
{
    return kp->rk;
}

bool kafka_fatal(const KafkaProducer *kp)
{
    return !kp || kp->fatal;
}
