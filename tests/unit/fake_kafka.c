/* fake_kafka: the KafkaProducer interface of kafka.h without librdkafka's producer, for the
 * engine's unit tests (fake_kafka.h). librdkafka is still linked, for its configuration, headers
 * and error names. */
#include "fake_kafka.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MESSAGES 256

struct KafkaProducer {
    KafkaDeliveryFn on_delivery;
    void *arg;
    bool fatal;
    int purges;
    int n;
    FakeMessage messages[MAX_MESSAGES];
    char refused_key[64];
    rd_kafka_resp_err_t refused_err;
    int queue_limit;
};

static KafkaProducer *current;
/* kafka_producer_free and kafka_producer_retire calls (fake_kafka_freed, fake_kafka_retired). */
static int freed, retired;
static bool retire_busy;
static bool files_refused;
/* While set, kafka_conf_pin_files refuses after kafka_conf_files_ok passed. */
static bool pin_refused;
/* The delivery report being served (kafka.c serves them inside rd_kafka_poll, on the producer's
 * own queue): the producer may not be freed from inside one, as kafka_poll goes on polling it. */
static const KafkaProducer *reporting;

KafkaProducer *fake_kafka_current(void)
{
    return current;
}

int fake_kafka_count(void)
{
    return current ? current->n : 0;
}

const FakeMessage *fake_kafka_at(int i)
{
    return current && i >= 0 && i < current->n ? &current->messages[i] : NULL;
}

int fake_kafka_unreported(void)
{
    int n = 0;
    for (int i = 0; current && i < current->n; i++)
        n += !current->messages[i].reported;
    return n;
}

void fake_kafka_report(int i, rd_kafka_resp_err_t err)
{
    FakeMessage *m = &current->messages[i];
    if (m->reported) {
        fprintf(stderr, "fake_kafka: message %d reported twice\n", i);
        abort();
    }
    m->reported = true;
    m->purged = false;
    const KafkaProducer *was = reporting;
    reporting = current;
    current->on_delivery(m->opaque, err, current->arg);
    reporting = was;
}

void fake_kafka_report_all(rd_kafka_resp_err_t err)
{
    for (int i = 0; current && i < current->n; i++)
        if (!current->messages[i].reported)
            fake_kafka_report(i, err);
}

int fake_kafka_purges(void)
{
    return current ? current->purges : 0;
}

void fake_kafka_deliver_purged(void)
{
    for (int i = 0; current && i < current->n; i++)
        if (!current->messages[i].reported && current->messages[i].purged)
            fake_kafka_report(i, RD_KAFKA_RESP_ERR__PURGE_QUEUE);
}

void fake_kafka_refuse_key(const char *key, rd_kafka_resp_err_t err)
{
    snprintf(current->refused_key, sizeof(current->refused_key), "%s", key);
    current->refused_err = err;
}

void fake_kafka_set_fatal(bool fatal)
{
    current->fatal = fatal;
}

void fake_kafka_set_queue_limit(int messages)
{
    current->queue_limit = messages;
}

/* Messages in kp's queue: not reported, or being reported (librdkafka destroys a message once
 * its report callback has returned). */
static int queued(const KafkaProducer *kp)
{
    int n = reporting == kp ? 1 : 0;
    for (int i = 0; i < kp->n; i++)
        n += !kp->messages[i].reported;
    return n;
}

/* ---- kafka.h ---- */

rd_kafka_conf_t *kafka_conf_build(const Config *cfg, bool *runtime, char *err, size_t errlen)
{
    if (runtime)
        *runtime = false;
    (void)cfg;
    (void)err;
    (void)errlen;
    return rd_kafka_conf_new();
}

void kafka_conf_layout_partitioner(rd_kafka_conf_t *conf, const Config *cfg)
{
    (void)conf;
    (void)cfg;
}

void fake_kafka_set_files_refused(bool refused)
{
    files_refused = refused;
}

bool kafka_conf_files_ok(const rd_kafka_conf_t *conf, char *err, size_t errlen)
{
    (void)conf;
    if (files_refused)
        snprintf(err, errlen, "kafka ssl.ca.location /fake: not a regular file");
    return !files_refused;
}

void fake_kafka_set_pin_refused(bool refused)
{
    pin_refused = refused;
}

/* Nothing to open here: refused as kafka_conf_files_ok is (kafka.c checks it first), or, while
 * pin_refused, after a check that passed, as kafka.c's open finds a FIFO swapped in since. */
bool kafka_conf_pin_files(rd_kafka_conf_t *conf, KafkaPins *pins, char *err, size_t errlen)
{
    memset(pins, 0, sizeof(*pins));
    if (!kafka_conf_files_ok(conf, err, errlen))
        return false;
    if (pin_refused)
        snprintf(err, errlen, "kafka ssl.ca.location /fake: not a regular file (pinned)");
    return !pin_refused;
}

void kafka_pins_text(const KafkaPins *pins, char *text, size_t size)
{
    (void)pins, (void)text, (void)size;
}

void kafka_pins_close(KafkaPins *pins)
{
    memset(pins, 0, sizeof(*pins));
}

bool kafka_reload_check(const Config *running, const Config *fresh, char *err, size_t errlen)
{
    (void)running;
    (void)fresh;
    (void)err;
    (void)errlen;
    return true;
}

/* As kafka.c: the files pinned, then kafka_producer_new_pinned. */
KafkaProducer *kafka_producer_new(struct ev_loop *loop, rd_kafka_conf_t *conf,
                                  KafkaDeliveryFn on_delivery, void *arg, char *err, size_t errlen)
{
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
    (void)loop;
    kafka_pins_close(pins);
    rd_kafka_conf_destroy(conf); /* kafka.h: taken over in every case */
    KafkaProducer *kp = calloc(1, sizeof(*kp));
    if (!kp) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    kp->on_delivery = on_delivery;
    kp->arg = arg;
    current = kp;
    return kp;
}

void kafka_producer_free(KafkaProducer *kp, int timeout_ms)
{
    if (!kp)
        return;
    if (kp == reporting) {
        fprintf(stderr, "fake_kafka: producer freed inside its own delivery report\n");
        abort();
    }
    /* kafka.c flushes, then purges what is left: its reports are still delivered. */
    for (int i = 0; i < kp->n; i++) {
        FakeMessage *m = &kp->messages[i];
        if (!m->reported) {
            m->reported = true;
            kp->on_delivery(m->opaque, RD_KAFKA_RESP_ERR__PURGE_QUEUE, kp->arg);
        }
        free(m->topic);
        free(m->key);
        free(m->value);
    }
    if (current == kp)
        current = NULL;
    free(kp);
    freed++;
}

/* A producer handed off with its payloads (kafka_producer_free_then), not destroyed yet. */
static struct {
    KafkaProducer *kp;
    void (*after)(void *);
    void *arg;
} handing[4];
static int n_handing, handed_off;

void kafka_producer_free_then(KafkaProducer *kp, int timeout_ms, void (*after)(void *),
                              void *after_arg)
{
    int left = 0;
    for (int i = 0; kp && i < kp->n; i++)
        left += !kp->messages[i].reported;
    if (!left || n_handing == 4) {
        kafka_producer_free(kp, timeout_ms);
        if (after)
            after(after_arg);
        return;
    }
    /* kafka.c: the flush served none (the fake's reports come only from the test); the rest is
     * the thread's, whose reports reach no one. */
    if (current == kp)
        current = NULL;
    handing[n_handing].kp = kp;
    handing[n_handing].after = after;
    handing[n_handing].arg = after_arg;
    n_handing++;
    handed_off++;
}

int fake_kafka_handed_off(void)
{
    return handed_off;
}

void fake_kafka_destroy_handed_off(void)
{
    for (int h = 0; h < n_handing; h++) {
        KafkaProducer *kp = handing[h].kp;
        for (int i = 0; i < kp->n; i++) {
            FakeMessage *m = &kp->messages[i];
            if (!m->reported && m->payload && memcmp(m->payload, m->value, m->payload_len) != 0) {
                fprintf(stderr, "fake_kafka: a payload changed under its message %d\n", i);
                abort();
            }
            free(m->topic);
            free(m->key);
            free(m->value);
        }
        free(kp);
        if (handing[h].after)
            handing[h].after(handing[h].arg);
    }
    n_handing = 0;
}

int fake_kafka_freed(void)
{
    return freed;
}

int fake_kafka_retired(void)
{
    return retired;
}

void fake_kafka_set_retire_busy(bool busy)
{
    retire_busy = busy;
}

bool kafka_producer_retire(KafkaProducer *kp)
{
    if (!kp)
        return true;
    if (retire_busy)
        return false;
    if (kp == reporting) {
        fprintf(stderr, "fake_kafka: producer retired inside its own delivery report\n");
        abort();
    }
    /* kafka.h: its reports go nowhere from now on, so every one must be in already. */
    for (int i = 0; i < kp->n; i++)
        if (!kp->messages[i].reported) {
            fprintf(stderr, "fake_kafka: producer retired with message %d unreported\n", i);
            abort();
        }
    freed--; /* not freed on the loop: kafka_producer_free below is the thread's part */
    kafka_producer_free(kp, 0);
    retired++;
    return true;
}

int kafka_retired_wait(int timeout_ms)
{
    (void)timeout_ms;
    return 0;
}

static char *copy(const char *s, size_t len)
{
    char *c = malloc(len + 1);
    if (c) {
        if (len)
            memcpy(c, s, len);
        c[len] = '\0';
    }
    return c;
}

rd_kafka_resp_err_t kafka_produce(KafkaProducer *kp, const char *topic, int32_t partition,
                                  int64_t timestamp_ms, const char *key, size_t key_len,
                                  const char *value, size_t value_len, rd_kafka_headers_t *hdrs,
                                  void *opaque)
{
    (void)partition; /* the fake keeps no partitions; the router's tests read them (test 87) */
    (void)timestamp_ms;
    size_t refused_len = strlen(kp->refused_key);
    bool prefix = refused_len > 0 && kp->refused_key[refused_len - 1] == '*';
    if (prefix)
        refused_len--;
    if (kp->refused_err && (prefix ? key_len >= refused_len : refused_len == key_len) &&
        memcmp(kp->refused_key, key, refused_len) == 0)
        return kp->refused_err; /* the caller keeps its headers */
    if (kp->n == MAX_MESSAGES || (kp->queue_limit > 0 && queued(kp) >= kp->queue_limit))
        return RD_KAFKA_RESP_ERR__QUEUE_FULL;
    FakeMessage *m = &kp->messages[kp->n++];
    *m = (FakeMessage){.topic = strdup(topic),
                       .key = copy(key, key_len),
                       .value = copy(value ? value : "", value ? value_len : 0),
                       .payload = value,
                       .payload_len = value ? value_len : 0,
                       .opaque = opaque};
    rd_kafka_headers_destroy(hdrs); /* taken over on success */
    return RD_KAFKA_RESP_ERR_NO_ERROR;
}

long kafka_message_max_bytes(const KafkaProducer *kp)
{
    return 1000000;
}

void kafka_purge(KafkaProducer *kp)
{
    kp->purges++;
    for (int i = 0; i < kp->n; i++)
        if (!kp->messages[i].reported)
            kp->messages[i].purged = true;
}

void kafka_poll(KafkaProducer *kp)
{
    (void)kp;
}

bool kafka_up(const KafkaProducer *kp)
{
    return true;
}

bool kafka_fatal(const KafkaProducer *kp)
{
    return !kp || kp->fatal; /* as kafka.c: no producer is no producer to use */
}
