#include "consumer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backoff.h"
#include "db.h"
#include "event.h"
#include "log.h"
#include "rcache.h"
#include "sqlstate.h"
#include "store.h"

#define POLL_MS 200
/* Refusals of one message by the database that are the message's own fault (SQLSTATE 22, 23, P0:
 * sqlstate.h) before it is parked. Anything else is an outage, waited out without limit. */
#define MAX_REJECTIONS 5
/* The processed_events sweep: rows per DELETE, and how long one round may hold up messages
 * before it yields to them (it goes on at the next poll, so it keeps up with any rate the
 * database can delete at). */
#define SWEEP_BATCH 5000
#define SWEEP_SLICE_S 0.5
#define TOPIC_MAX 249
/* How long leaving the group and destroying the client may take on SIGTERM: together under
 * docker's default stop grace period (10 s). */
#define CLOSE_TIMEOUT_S 4.0
#define DESTROY_TIMEOUT_S 2.0
/* How many event ids whose conflict was logged at warn are remembered (the latest ones), so a
 * producer that reuses one id for message after message fills the log with one warning, not one
 * per message; a bound on memory, not on what is counted. */
#define CONFLICTS_WARNED 256

extern const char consumer_schema_sql[]; /* schema.sql, embedded by tools/embed-text.sh */

typedef struct Counters {
    long applied, duplicates, ignored, parked;
    long stale;      /* recorded, but older than (or the same version as) the shipment's state */
    long redis_hits; /* duplicates skipped on Redis's word alone (also counted in duplicates) */
    long conflicts;  /* an applied event's id with another payload: skipped, not applied */
    long unparked;   /* neither applied nor parked: parked_messages refused even its position */
} Counters;

typedef struct Consumer {
    const ConsumerConfig *cfg;
    volatile sig_atomic_t *stop;
    rd_kafka_t *rk;
    PGconn *db;
    bool db_down;      /* an outage is logged once, at its start and its end */
    bool db_conn_lost; /* the outage began with a lost or refused connection */
    double next_sweep; /* monotonic time of the next processed_events sweep round */
    char ns[160];      /* the database's identity, scoping Redis keys (see redis_namespace) */
    Backoff backoff;
    Counters n, logged;
    double last_stats, last_health;
    rd_kafka_resp_err_t last_kafka_err;
    RCache *redis;
    char warned[CONFLICTS_WARNED][37]; /* ids whose conflict was logged at warn, a ring */
    size_t warned_next;
} Consumer;

/* The Redis key of a processed event: scoped by the database (an empty or restored-elsewhere
 * database replaying the topic must not find its events "processed" by another one) and by
 * consumer group, since another service reading the same event must still process it. */
static void done_key(const Consumer *c, const OrderEvent *ev, char *out, size_t outlen)
{
    snprintf(out, outlen, "consumer-demo:done:%s:%s:%s", c->ns, c->cfg->group, ev->event_id);
}

/* True when Redis says ev was processed with this very payload: its transaction committed, and
 * the entry holds ev's payload digest. Any doubt is false, and the processed_events transaction
 * decides then: not found, Redis unavailable, or another digest (a conflict, which only
 * PostgreSQL may call one, or an entry "1" written before digests were kept). So skipping on
 * Redis's word never hides a conflict. */
static bool redis_seen(Consumer *c, const OrderEvent *ev)
{
    if (!c->redis)
        return false;
    char key[400];
    done_key(c, ev, key, sizeof(key));
    redisReply *r = rcache_command(c->redis, "GET %s", key);
    bool seen = r && r->type == REDIS_REPLY_STRING && r->len == 64 &&
                memcmp(r->str, ev->payload_sha256, 64) == 0;
    if (r)
        freeReplyObject(r);
    return seen;
}

/* Remembers ev as processed, its applied payload's digest (64 hex characters) as the value. Only
 * called after its transaction committed (or found it already recorded): a key written earlier
 * could outlive a failed transaction and hide the event. */
static void redis_remember(Consumer *c, const OrderEvent *ev, const char *digest)
{
    if (!c->redis)
        return;
    char key[400];
    done_key(c, ev, key, sizeof(key));
    redisReply *r = rcache_command(c->redis, "SET %s %s PX %lld", key, digest,
                                   (long long)c->cfg->redis_ttl_s * 1000);
    if (r)
        freeReplyObject(r);
}

/* Counts and logs a conflict: ev's id was applied earlier with the payload whose digest is
 * applied. At warn the first time for an id (among the last CONFLICTS_WARNED), at debug after. */
static void conflict(Consumer *c, const OrderEvent *ev, const MessagePos *pos, const char *applied)
{
    c->n.conflicts++;
    bool warned = false;
    for (size_t i = 0; i < CONFLICTS_WARNED && !warned; i++)
        warned = strcmp(c->warned[i], ev->event_id) == 0;
    if (!warned) {
        memcpy(c->warned[c->warned_next], ev->event_id, sizeof(c->warned[0]));
        c->warned_next = (c->warned_next + 1) % CONFLICTS_WARNED;
    }
    log_write(warned ? LOG_DEBUG : LOG_WARN, "conflicting event skipped",
              "event_id=%s partition=%d offset=%lld applied_sha256=%.8s message_sha256=%.8s",
              ev->event_id, (int)pos->partition, (long long)pos->offset, applied,
              ev->payload_sha256);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sleeps up to seconds, waking early when asked to stop. */
static void nap(const Consumer *c, double seconds)
{
    double until = now_s() + seconds;
    while (!*c->stop && now_s() < until) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static bool topic_legal(const char *t)
{
    size_t n = strlen(t);
    return n > 0 && n <= TOPIC_MAX &&
           strspn(t, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

static void kafka_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    char q[600];
    (void)rk;
    log_write(level <= 4 ? LOG_WARN : LOG_DEBUG, "kafka", "facility=%s message=%s", fac,
              log_quote(buf, q, sizeof(q)));
}

/* Properties that the at-least-once contract depends on cannot be overridden (nor the brokers,
 * which have an option of their own). librdkafka knows some properties under a second name
 * (bootstrap.servers is an alias of metadata.broker.list): build_conf refuses both names, and
 * then checks that no --kafka override changed a locked property's value under any name. */
static const char *const locked_props[] = {"enable.auto.offset.store", "enable.auto.commit",
                                           "group.id", "bootstrap.servers", "metadata.broker.list"};
#define LOCKED_N (sizeof(locked_props) / sizeof(locked_props[0]))

/* The value of property name in conf ("" when unset), malloc'd; NULL when out of memory. */
static char *conf_value(const rd_kafka_conf_t *conf, const char *name)
{
    size_t len = 0;
    if (rd_kafka_conf_get(conf, name, NULL, &len) != RD_KAFKA_CONF_OK)
        len = 0;
    size_t size = len + 1;
    char *v = calloc(1, size);
    if (v && len > 0 && rd_kafka_conf_get(conf, name, v, &size) != RD_KAFKA_CONF_OK)
        v[0] = '\0';
    return v;
}

/* Whether the locked properties still have the values in was (from conf_value); else the first
 * one that changed into *changed. */
static bool locked_unchanged(const rd_kafka_conf_t *conf, char *const *was, const char **changed)
{
    for (size_t j = 0; j < LOCKED_N; j++) {
        char *now = conf_value(conf, locked_props[j]);
        bool same = now && was[j] && strcmp(now, was[j]) == 0;
        free(now);
        if (!same) {
            *changed = locked_props[j];
            return false;
        }
    }
    return true;
}

static rd_kafka_conf_t *build_conf(const ConsumerConfig *cfg, char *err, size_t errlen)
{
    char errstr[512];
    char *locked[LOCKED_N] = {NULL}; /* their values before the overrides */
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *defaults[][2] = {
        {"bootstrap.servers", cfg->brokers},
        {"group.id", cfg->group},
        {"client.id", "consumer-demo"},
        /* Auto-commit commits only what we stored, and we store after the database commit. */
        {"enable.auto.commit", "true"},
        {"enable.auto.offset.store", "false"},
        {"auto.offset.reset", "earliest"},
    };
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
        if (rd_kafka_conf_set(conf, defaults[i][0], defaults[i][1], errstr, sizeof(errstr)) !=
            RD_KAFKA_CONF_OK) {
            snprintf(err, errlen, "kafka %s: %s", defaults[i][0], errstr);
            goto failed;
        }
    }
    for (size_t j = 0; j < LOCKED_N; j++)
        locked[j] = conf_value(conf, locked_props[j]);
    for (size_t i = 0; cfg->kafka && i < cfg->kafka->len; i++) {
        const char *key = cfg->kafka->items[i].key;
        for (size_t j = 0; j < LOCKED_N; j++) {
            if (strcmp(key, locked_props[j]) == 0) {
                snprintf(err, errlen,
                         "--kafka %s cannot be changed (use the option for it, or "
                         "it would break at-least-once processing)",
                         key);
                goto failed;
            }
        }
        if (rd_kafka_conf_set(conf, key, cfg->kafka->items[i].value, errstr, sizeof(errstr)) !=
            RD_KAFKA_CONF_OK) {
            snprintf(err, errlen, "--kafka %s: %s", key, errstr);
            goto failed;
        }
        const char *changed;
        if (!locked_unchanged(conf, locked, &changed)) {
            snprintf(err, errlen,
                     "--kafka %s cannot be changed: it sets %s (use the option for it, or it "
                     "would break at-least-once processing)",
                     key, changed);
            goto failed;
        }
    }
    rd_kafka_conf_set_log_cb(conf, kafka_log);
    for (size_t j = 0; j < LOCKED_N; j++)
        free(locked[j]);
    return conf;
failed:
    log_one_line(err);
    for (size_t j = 0; j < LOCKED_N; j++)
        free(locked[j]);
    rd_kafka_conf_destroy(conf);
    return NULL;
}

bool consumer_check(const ConsumerConfig *cfg, char *err, size_t errlen)
{
    if (!topic_legal(cfg->topic)) {
        snprintf(err, errlen, "--topic: '%.100s' is not a Kafka topic name ([a-zA-Z0-9._-], 1-249)",
                 cfg->topic);
        log_one_line(err);
        return false;
    }
    rd_kafka_conf_t *conf = build_conf(cfg, err, errlen);
    if (!conf)
        return false;
    rd_kafka_conf_destroy(conf);
    return true;
}

/* The fault of a failed statement: a lost connection (no SQLSTATE) is transient. */
static SqlstateFault fault_of(const DbError *e)
{
    return e->conn_lost ? SQLSTATE_FAULT_TRANSIENT : sqlstate_fault(e->sqlstate);
}

/* Errors after which the session itself is no use: the server is read-only (a demoted primary:
 * with target_session_attrs=read-write the reconnect finds the new one), shutting down (57P01-3),
 * or the connection broke (08). Other errors leave a session that can run the next try. */
static bool session_spoilt(const DbError *e)
{
    return e->conn_lost || strcmp(e->sqlstate, "25006") == 0 ||
           strncmp(e->sqlstate, "57P", 3) == 0 || strncmp(e->sqlstate, "08", 2) == 0;
}

/* Connects when needed. A failure starts (or continues) an outage, logged once. */
static bool ensure_db(Consumer *c)
{
    if (c->db && PQstatus(c->db) == CONNECTION_OK)
        return true;
    PQfinish(c->db);
    char err[300], q[400];
    c->db = db_connect(c->cfg->conninfo, "consumer-demo", err, sizeof(err));
    DbError e;
    if (c->db && !store_prepare_session(c->db, &e)) {
        snprintf(err, sizeof(err), "%s", db_error_text(&e));
        PQfinish(c->db);
        c->db = NULL;
    }
    if (!c->db) {
        if (!c->db_down)
            log_warn("postgres unreachable", "error=%s", log_quote(err, q, sizeof(q)));
        c->db_down = c->db_conn_lost = true;
        return false;
    }
    return true;
}

/* A statement failed for a reason that is not the message's (sqlstate.h: transient or the
 * setup's): an outage, logged once at its start; the caller retries with backoff, without limit.
 * A spoilt session is dropped so that the next try reconnects. */
static void db_outage(Consumer *c, const DbError *e, const char *step)
{
    char q[400];
    bool lost = session_spoilt(e);
    if (!c->db_down) {
        if (lost)
            log_warn("postgres connection lost", "step=%s fault=%s error=%s", step,
                     sqlstate_fault_name(fault_of(e)), log_quote(db_error_text(e), q, sizeof(q)));
        else
            log_warn("postgres unavailable, retrying", "step=%s fault=%s error=%s", step,
                     sqlstate_fault_name(fault_of(e)), log_quote(db_error_text(e), q, sizeof(q)));
        c->db_conn_lost = lost;
    }
    c->db_down = true;
    if (lost) {
        PQfinish(c->db);
        c->db = NULL;
    }
}

/* A statement succeeded (or the database answered for the message itself): the end of an
 * outage, logged once. */
static void db_ok(Consumer *c)
{
    if (c->db_down)
        log_info(c->db_conn_lost ? "postgres reconnected" : "postgres available again", NULL);
    c->db_down = c->db_conn_lost = false;
}

/* The message's headers as a JSON array of [name, value] pairs, for parked_messages. Values that
 * are not UTF-8 text, or hold a NUL byte, are kept as "\x" + hex, like PostgreSQL's bytea output:
 * jansson would write a NUL as \u0000, which jsonb refuses (22P05), and the message would be
 * parked by its position only (park_once). */
static char *headers_json(const rd_kafka_message_t *msg)
{
    json_t *arr = json_array();
    rd_kafka_headers_t *hdrs = NULL;
    if (rd_kafka_message_headers(msg, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char *name;
        const void *val;
        size_t size;
        for (size_t i = 0;
             rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
             i++) {
            json_t *v = !val                      ? json_null()
                        : memchr(val, '\0', size) ? NULL
                                                  : json_stringn(val, size);
            if (!v) {
                char *hex = malloc(2 * size + 3);
                if (hex) {
                    strcpy(hex, "\\x");
                    for (size_t k = 0; k < size; k++)
                        snprintf(hex + 2 + 2 * k, 3, "%02x", ((const unsigned char *)val)[k]);
                    v = json_string(hex);
                    free(hex);
                }
            }
            json_t *n = json_string(name);
            json_array_append_new(arr,
                                  json_pack("[oo]", n ? n : json_string("?"), v ? v : json_null()));
        }
    }
    char *text = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    return text;
}

static MessagePos position(const rd_kafka_message_t *msg)
{
    return (MessagePos){rd_kafka_topic_name(msg->rkt), msg->partition, msg->offset};
}

/* The outcome of one try to park a message. */
typedef enum {
    PARK_DONE,    /* recorded in parked_messages (whole, or by its position only) */
    PARK_SKIPPED, /* refused for its own data twice: logged at error and counted, not recorded */
    PARK_FAILED   /* an outage, or asked to stop while it waited: try again later */
} ParkOutcome;

/* One INSERT into parked_messages. False with e filled when it was not recorded; a SIGTERM while
 * it waited closes the connection (still busy with it: the transaction ends uncommitted, and the
 * message's offset is not stored). */
static bool park_insert(Consumer *c, const ParkedMessage *m, DbError *e)
{
    bool stopped;
    bool done = store_park(c->db, m, c->stop, &stopped, e);
    if (stopped) {
        PQfinish(c->db);
        c->db = NULL;
    }
    return done && !stopped;
}

/* Tries once to park msg. A park refused for the row's own data (SQLSTATE 22, 23, P0: an
 * operator's CHECK constraint or trigger on parked_messages, a column narrowed below the value)
 * is deterministic: retried, it was refused again without limit and held up its partition, out
 * of sight (the loop waits here, so even the health file went stale). It is tried once more with
 * the position only (key, headers and payload left out, a short reason naming the refusal); if
 * that is refused too, the message is skipped: logged at error with its Kafka position (read it
 * back from there), counted as unparked, and its offset committed. An outage is logged by
 * db_outage and retried by the caller. */
static ParkOutcome park_once(Consumer *c, const rd_kafka_message_t *msg, const char *reason)
{
    if (!ensure_db(c))
        return PARK_FAILED;
    DbError e = {0};
    char *hjson = headers_json(msg);
    ParkedMessage m = {position(msg),        msg->key, msg->key_len, msg->payload, msg->len,
                       hjson ? hjson : "[]", reason};
    bool done = park_insert(c, &m, &e);
    free(hjson);
    char qr[400], qe[400];
    if (!done && c->db && fault_of(&e) == SQLSTATE_FAULT_ROW) {
        char whole_error[400], short_reason[80];
        snprintf(whole_error, sizeof(whole_error), "%s", db_error_text(&e));
        snprintf(short_reason, sizeof(short_reason), "not parked whole: SQLSTATE %s", e.sqlstate);
        log_error("cannot park a message whole, parking its position only",
                  "topic=%s partition=%d offset=%lld error=%s", m.pos.topic, (int)m.pos.partition,
                  (long long)m.pos.offset, log_quote(whole_error, qe, sizeof(qe)));
        ParkedMessage bare = {m.pos, NULL, 0, NULL, 0, "[]", short_reason};
        e = (DbError){0};
        done = park_insert(c, &bare, &e);
        if (!done && c->db && fault_of(&e) == SQLSTATE_FAULT_ROW) {
            db_ok(c); /* it answered: the refusal is about this message */
            backoff_reset(&c->backoff);
            c->n.unparked++;
            log_error("message skipped, parking refused",
                      "topic=%s partition=%d offset=%lld reason=%s error=%s", m.pos.topic,
                      (int)m.pos.partition, (long long)m.pos.offset,
                      log_quote(reason, qr, sizeof(qr)),
                      log_quote(db_error_text(&e), qe, sizeof(qe)));
            return PARK_SKIPPED;
        }
    }
    if (done) {
        db_ok(c);
        backoff_reset(&c->backoff);
        c->n.parked++;
        log_warn("message parked", "topic=%s partition=%d offset=%lld reason=%s", m.pos.topic,
                 (int)m.pos.partition, (long long)m.pos.offset, log_quote(reason, qr, sizeof(qr)));
        return PARK_DONE;
    }
    if (c->db) /* not stopped: an outage */
        db_outage(c, &e, "park");
    return PARK_FAILED;
}

/* Parks a message that cannot be parsed, waiting out outages. False when asked to stop first. */
static bool park(Consumer *c, const rd_kafka_message_t *msg, const char *reason)
{
    while (!*c->stop) {
        if (park_once(c, msg, reason) != PARK_FAILED)
            return true;
        nap(c, backoff_next(&c->backoff));
    }
    return false;
}

/* Applies an OrderCreated or OrderUpdated event. Every failure that is not the message's fault
 * (a lost connection, read-only, a deadlock or serialization failure, a cancelled statement, a
 * lock timeout, resources, the setup: sqlstate.h) is an outage: retried on this message with
 * backoff and without limit, so a valid event is never parked for the database's trouble. After
 * MAX_REJECTIONS refusals that are the message's own (22, 23, P0) it is parked instead (or
 * skipped when parking is refused too: park_once); a park cut short by an outage goes back to
 * trying the apply. False when asked to stop first, also in the middle
 * of a statement that waits (store_apply looks at the flag while it waits). */
static bool apply(Consumer *c, const rd_kafka_message_t *msg, const OrderEvent *ev)
{
    MessagePos pos = position(msg);
    int rejections = 0;
    char q[400];
    while (!*c->stop) {
        if (!ensure_db(c)) {
            nap(c, backoff_next(&c->backoff));
            continue;
        }
        DbError e;
        char applied[65];
        StoreResult r = store_apply(c->db, ev, &pos, c->cfg->dedupe_ttl_s, c->stop, applied, &e);
        if (r == STORE_STOPPED) {
            /* A SIGTERM while a statement waited (for a row lock, say): closing the connection
             * ends the transaction uncommitted. */
            PQfinish(c->db);
            c->db = NULL;
            break;
        }
        if (r == STORE_CONFLICT) {
            db_ok(c);
            backoff_reset(&c->backoff);
            /* Not applied, and its offset is committed all the same: the first copy stays the
             * truth, and retrying could never change the answer. Redis keeps the applied
             * copy's digest, so its redeliveries are still skipped there. */
            conflict(c, ev, &pos, applied);
            redis_remember(c, ev, applied);
            return true;
        }
        if (r != STORE_FAILED) {
            db_ok(c);
            backoff_reset(&c->backoff);
            if (r == STORE_APPLIED)
                c->n.applied++;
            else if (r == STORE_STALE)
                c->n.stale++;
            else
                c->n.duplicates++;
            log_debug(r == STORE_APPLIED ? "event applied"
                      : r == STORE_STALE ? "stale event skipped"
                                         : "duplicate event skipped",
                      "event_id=%s order_id=%s version=%lld partition=%d offset=%lld", ev->event_id,
                      log_quote(ev->order_id, q, sizeof(q)), ev->version, (int)pos.partition,
                      (long long)pos.offset);
            /* Committed (or committed earlier): from now on Redis may answer for it. */
            redis_remember(c, ev, ev->payload_sha256);
            return true;
        }
        if (fault_of(&e) != SQLSTATE_FAULT_ROW) {
            db_outage(c, &e, "apply");
            nap(c, backoff_next(&c->backoff));
            continue;
        }
        db_ok(c); /* it answered: the refusal is about this message */
        log_warn("database rejected an event", "event_id=%s attempt=%d error=%s", ev->event_id,
                 rejections + 1, log_quote(db_error_text(&e), q, sizeof(q)));
        if (++rejections >= MAX_REJECTIONS) {
            char reason[400];
            snprintf(reason, sizeof(reason), "database rejected it: %s", db_error_text(&e));
            for (char *p = reason; *p; p++)
                if ((unsigned char)*p >= 0x7f)
                    *p = '?';
            if (park_once(c, msg, reason) != PARK_FAILED)
                return true;
            /* Not parked (an outage began): the apply may well work now; the refusals are
             * counted afresh. */
            rejections = 0;
        }
        nap(c, backoff_next(&c->backoff));
    }
    /* Asked to stop before the event was applied: its offset is not stored, so the group's next
     * member gets it again. */
    log_info("apply abandoned at shutdown, the event will be delivered again",
             "event_id=%s partition=%d offset=%lld", ev->event_id, (int)pos.partition,
             (long long)pos.offset);
    return false;
}

/* Reads every header called name: the last value into value and len (NULL when the last has
 * none: *null), and whether two of them differ (*differs), so that a message with two ids is
 * not taken for the event its last id names. */
static void read_header(const rd_kafka_headers_t *hdrs, const char *name, const char **value,
                        size_t *len, bool *null, bool *differs)
{
    const void *v;
    size_t n;
    *value = NULL;
    *len = 0;
    *null = *differs = false;
    for (size_t i = 0; rd_kafka_header_get(hdrs, i, name, &v, &n) == RD_KAFKA_RESP_ERR_NO_ERROR;
         i++) {
        if (i > 0 && (!v != !*value || (v && (n != *len || memcmp(v, *value, n) != 0))))
            *differs = true;
        *value = v;
        *len = v ? n : 0;
    }
    *null = *value == NULL &&
            rd_kafka_header_get_last(hdrs, name, &v, &n) == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* Handles one message. True when it is dealt with for good (applied, duplicate, conflict,
 * ignored or parked), i.e. its offset may be committed. */
static bool process(Consumer *c, const rd_kafka_message_t *msg)
{
    EventInput in = {.payload = msg->payload, .payload_len = msg->len};
    rd_kafka_headers_t *hdrs = NULL;
    if (rd_kafka_message_headers(msg, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        read_header(hdrs, "id", &in.id, &in.id_len, &in.id_null, &in.id_differs);
        read_header(hdrs, "event_type", &in.type, &in.type_len, &in.type_null, &in.type_differs);
    }
    OrderEvent ev;
    char reason[256];
    switch (event_parse(&in, &ev, reason, sizeof(reason))) {
    case EVENT_APPLY:
        if (redis_seen(c, &ev)) {
            c->n.duplicates++;
            c->n.redis_hits++;
            log_debug("duplicate event skipped (redis)", "event_id=%s partition=%d offset=%lld",
                      ev.event_id, (int)msg->partition, (long long)msg->offset);
            return true;
        }
        return apply(c, msg, &ev);
    case EVENT_IGNORE:
        c->n.ignored++;
        log_debug("event ignored", "partition=%d offset=%lld reason=%s", (int)msg->partition,
                  (long long)msg->offset, reason);
        return true;
    case EVENT_MALFORMED:
        return park(c, msg, reason);
    }
    return false;
}

/* Marks msg as consumed: auto-commit picks the stored offset (msg + 1) up. */
static void store_offset(Consumer *c, const rd_kafka_message_t *msg)
{
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, rd_kafka_topic_name(msg->rkt), msg->partition)->offset =
        msg->offset + 1;
    rd_kafka_resp_err_t err = rd_kafka_offsets_store(c->rk, list);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
        err = list->elems[0].err;
    if (err)
        /* The partition was revoked meanwhile: its next owner redelivers, dedupe absorbs it. */
        log_debug("offset not stored", "partition=%d offset=%lld error=%s", (int)msg->partition,
                  (long long)msg->offset, rd_kafka_err2str(err));
    rd_kafka_topic_partition_list_destroy(list);
}

static void log_counts(const char *msg, const Counters *n)
{
    /* Newer counters last: readers of the older fields' order keep working. */
    log_info(msg,
             "applied=%ld duplicates=%ld ignored=%ld parked=%ld stale=%ld redis_hits=%ld "
             "conflicts=%ld unparked=%ld",
             n->applied, n->duplicates, n->ignored, n->parked, n->stale, n->redis_hits,
             n->conflicts, n->unparked);
}

static void sweep(Consumer *c);

/* Periodic chores: progress counters, the health file and the processed_events sweep. */
static void tick(Consumer *c)
{
    sweep(c);
    double now = now_s();
    if (now - c->last_stats >= (double)c->cfg->stats_interval_s &&
        memcmp(&c->n, &c->logged, sizeof(c->n)) != 0) {
        log_counts("consumer progress", &c->n);
        c->logged = c->n;
        c->last_stats = now;
    }
    if (c->cfg->health_file && now - c->last_health >= 1.0) {
        /* Touched only from this loop: a stale file means the loop is stuck or the database
         * unreachable (then the loop waits inside apply and does not come here). */
        int fd = open(c->cfg->health_file, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            futimens(fd, NULL);
            close(fd);
        }
        c->last_health = now;
    }
}

static void kafka_error(Consumer *c, const rd_kafka_message_t *msg)
{
    /* Repeats of the same error (e.g. the topic does not exist yet) are logged once. */
    if (msg->err != c->last_kafka_err) {
        char q[400];
        log_warn("kafka consumer error", "error=%s",
                 log_quote(rd_kafka_message_errstr(msg), q, sizeof(q)));
    }
    c->last_kafka_err = msg->err;
}

/* Scopes Redis keys by the database (db_identity): two databases never share processed ids in
 * Redis; a database restored from a base backup of this one (same identity) still does, which
 * docs/demos.md states. False with e filled on failure. */
static bool redis_namespace(Consumer *c, DbError *e)
{
    if (!db_identity(c->db, c->ns, sizeof(c->ns), e))
        return false;
    /* The name may hold ':' or spaces: keep the key's fields apart. */
    for (char *p = c->ns; *p; p++)
        if (*p == ':' || (unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7f)
            *p = '_';
    return true;
}

/* Connects to PostgreSQL and applies the schema, waiting out outages (PostgreSQL starting, a
 * read-only window); a refusal by the setup (privileges, say) ends the run with an error. */
static bool prepare_db(Consumer *c)
{
    char q[400];
    while (!*c->stop) {
        DbError e = {0};
        if (ensure_db(c) && db_apply_schema(c->db, "consumer-demo", consumer_schema_sql, &e) &&
            (!c->redis || redis_namespace(c, &e))) {
            db_ok(c);
            return true;
        }
        if (c->db && !e.conn_lost && fault_of(&e) != SQLSTATE_FAULT_TRANSIENT) {
            log_error("cannot apply the schema", "error=%s",
                      log_quote(db_error_text(&e), q, sizeof(q)));
            return false;
        }
        if (c->db)
            db_outage(c, &e, "schema");
        nap(c, backoff_next(&c->backoff));
    }
    return false;
}

/* One round of the processed_events sweep (seed 003's TTL): rows whose expires_at passed are
 * deleted in batches of SWEEP_BATCH, oldest first, for at most SWEEP_SLICE_S; a round cut short
 * continues at the next poll, so the sweep keeps pace with any insert rate the database can
 * delete at, and never holds messages up for longer than one slice. Failures are left to the
 * next round (an outage shows in the apply path). */
static void sweep(Consumer *c)
{
    double now = now_s();
    if (now < c->next_sweep || !c->db || PQstatus(c->db) != CONNECTION_OK || c->db_down)
        return;
    long total = 0;
    bool more = true;
    while (more && !*c->stop && now_s() - now < SWEEP_SLICE_S) {
        DbError e;
        bool stopped;
        long n = store_sweep(c->db, SWEEP_BATCH, c->stop, &stopped, &e);
        if (n < 0) {
            char q[400];
            if (!stopped)
                log_warn("processed_events sweep failed", "error=%s",
                         log_quote(db_error_text(&e), q, sizeof(q)));
            if (stopped || session_spoilt(&e)) {
                PQfinish(c->db); /* stopped: still busy with the DELETE */
                c->db = NULL;
            }
            more = false;
            break;
        }
        total += n;
        more = n == SWEEP_BATCH;
    }
    if (total > 0)
        log_info("expired processed events deleted", "rows=%ld more=%s", total,
                 more ? "true" : "false");
    c->next_sweep = more ? now : now + (double)c->cfg->sweep_interval_s;
}

/* The client's own destruction, on a thread of its own so that close_consumer can stop waiting
 * for it: it joins librdkafka's broker threads, and one that is resolving a broker's name that
 * no longer exists (a stopped container: Docker's DNS asks upstream servers that may never
 * answer) holds it for as long as the resolver takes. */
static struct {
    rd_kafka_t *rk;
    int flags;
    atomic_bool done;
} destroy_job;

static void *destroy_thread(void *arg)
{
    (void)arg;
    rd_kafka_destroy_flags(destroy_job.rk, destroy_job.flags);
    atomic_store(&destroy_job.done, true);
    return NULL;
}

/* Leaves the group, commits the offsets stored so far and destroys rk, in at most
 * CLOSE_TIMEOUT_S + DESTROY_TIMEOUT_S. rd_kafka_consumer_close() and rd_kafka_destroy() have no
 * time limit: with Kafka gone they wait for the coordinator and for name lookups (over 10 s
 * seen), so a container manager's SIGTERM would end in SIGKILL. Closing through a queue lets us
 * give up; offsets not committed are redelivered to the next member and dropped as duplicates,
 * which at-least-once processing allows. A destruction still running at the limit is left to
 * the process's exit. */
static void close_consumer(rd_kafka_t *rk)
{
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_error_t *error = rd_kafka_consumer_close_queue(rk, q);
    if (error) {
        log_warn("consumer close", "error=%s", rd_kafka_error_string(error));
        rd_kafka_error_destroy(error);
    } else {
        double deadline = now_s() + CLOSE_TIMEOUT_S;
        while (!rd_kafka_consumer_closed(rk) && now_s() < deadline) {
            /* No rebalance callback is set, so these are only errors and logs: drop them. */
            rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 100);
            if (ev)
                rd_kafka_event_destroy(ev);
        }
    }
    bool closed = rd_kafka_consumer_closed(rk);
    if (!closed)
        log_warn("consumer close timed out, leaving without committing the last offsets",
                 "timeout_s=%.0f", CLOSE_TIMEOUT_S);
    rd_kafka_queue_destroy(q);

    destroy_job.rk = rk;
    destroy_job.flags = closed ? 0 : RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE;
    atomic_store(&destroy_job.done, false);
    pthread_t t;
    if (pthread_create(&t, NULL, destroy_thread, NULL) != 0) {
        destroy_thread(NULL); /* no thread to spare: wait for it here */
        return;
    }
    double deadline = now_s() + DESTROY_TIMEOUT_S;
    while (!atomic_load(&destroy_job.done) && now_s() < deadline) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (atomic_load(&destroy_job.done)) {
        pthread_join(t, NULL);
    } else {
        log_warn("kafka client still shutting down, exiting without it", "timeout_s=%.0f",
                 DESTROY_TIMEOUT_S);
        pthread_detach(t);
    }
}

int consumer_run(const ConsumerConfig *cfg, volatile sig_atomic_t *stop)
{
    Consumer c = {.cfg = cfg, .stop = stop};
    char err[600];
    int rc = 1;
    backoff_init(&c.backoff, 0.2, 10.0, 0);
    if (cfg->redis_url) {
        /* One loop, one context. */
        c.redis = rcache_new(cfg->redis_url, 1, (int)cfg->redis_timeout_ms, err, sizeof(err));
        if (!c.redis) {
            log_error("cannot set up redis", "error=%s", err);
            goto out;
        }
    }
    if (!prepare_db(&c)) {
        rc = *stop ? 0 : 1;
        goto out;
    }

    rd_kafka_conf_t *conf = build_conf(cfg, err, sizeof(err));
    if (!conf) {
        log_error("kafka configuration rejected", "error=%s", err);
        goto out;
    }
    c.rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (!c.rk) {
        rd_kafka_conf_destroy(conf);
        log_error("cannot create the kafka consumer", "error=%s", err);
        goto out;
    }
    /* Errors and rebalances arrive through rd_kafka_consumer_poll, on this thread. */
    rd_kafka_poll_set_consumer(c.rk);
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, cfg->topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t kerr = rd_kafka_subscribe(c.rk, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (kerr) {
        log_error("cannot subscribe", "topic=%s error=%s", cfg->topic, rd_kafka_err2str(kerr));
        goto close;
    }
    char qb[300], qg[300];
    log_info("consumer-demo running", "topic=%s group=%s brokers=%s redis=%s", cfg->topic,
             log_quote(cfg->group, qg, sizeof(qg)), log_quote(cfg->brokers, qb, sizeof(qb)),
             c.redis ? "on" : "off");

    c.last_stats = now_s();
    c.next_sweep = c.last_stats + 1.0; /* soon after start: a backlog from downtime goes first */
    rc = 0;
    while (!*stop) {
        rd_kafka_message_t *msg = rd_kafka_consumer_poll(c.rk, POLL_MS);
        tick(&c);
        if (!msg)
            continue;
        if (msg->err) {
            kafka_error(&c, msg);
            if (msg->err == RD_KAFKA_RESP_ERR__FATAL) {
                rd_kafka_fatal_error(c.rk, err, sizeof(err));
                log_error("kafka fatal error", "error=%s", log_quote(err, qb, sizeof(qb)));
                rc = 1;
                *stop = 1;
            }
        } else {
            c.last_kafka_err = RD_KAFKA_RESP_ERR_NO_ERROR;
            if (process(&c, msg))
                store_offset(&c, msg);
        }
        rd_kafka_message_destroy(msg);
    }
    log_info("shutting down", NULL);
close:
    close_consumer(c.rk);
out:
    log_counts("consumer stopped", &c.n);
    if (c.redis) {
        RCacheStats st = rcache_stats(c.redis);
        log_info("redis totals", "calls=%ld failures=%ld skipped=%ld outages=%ld", st.calls,
                 st.failures, st.skipped, st.outages);
    }
    rcache_free(c.redis);
    PQfinish(c.db);
    return rc;
}
