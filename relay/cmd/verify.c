#include "verify.h"

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admin.h"
#include "db.h"
#include "kafka.h"
#include "log.h"
#include "route.h"
#include "secrets.h"
#include "statements.h"
#include "strbuf.h"
#include "table.h"

/* Messages are produced before their rows are marked, by up to the delivery timeout, and the
 * relay's clock (the messages' timestamps) may differ from the database's a little: the topics
 * are read from this much before the window. */
#define VERIFY_MARGIN_MS 60000
/* Problems of each kind named on stderr; the rest are only counted. */
#define VERIFY_SHOW 20
#define VERIFY_UNKNOWN_CHUNK 1000
/* The longest id header read whole (a text event id column may hold long ids: one cut short was
 * no row's, and its row was called missing). A longer one, which anyone who can write to the
 * topic may send, is counted unknown without a lookup: a chunk of lookups holds at most
 * VERIFY_UNKNOWN_CHUNK of these. */
#define VERIFY_ID_MAX 4096
/* An event id as shown on stderr: escaped as in the log (log_escape), since the table's writers
 * and, for unknown messages, anyone who can write to the topic chose it: a control sequence must
 * reach the operator's terminal as text. Room for a long id escaped. */
#define VERIFY_SHOWN_ID 1024
/* How long a read of the table waits for a lock on it (a migration's ALTER, a VACUUM FULL, or an
 * ALTER queued behind a long transaction, which every later reader queues behind): verify gives
 * up then (exit 1) rather than wait as long as they do, silently. */
#define VERIFY_LOCK_TIMEOUT "10s"
/* verify waits --statement-timeout for PostgreSQL to answer a statement: a server that stops
 * answering (a stopped or paused server, a proxy that lost it) acknowledges every packet, so
 * keepalives never end the wait, and verify waited for ever, silently. A statement whose work
 * grows with the window (the rows read, each chunk of lookups, which reads the table whole for an
 * event id column without an index on its text) gets a millisecond more a row of --max-rows
 * (window_answer_s). The connection has no statement_timeout (admin_connect_unbounded): a slow
 * read of a long window is no failure short of that bound. */

typedef struct Row {
    long long seq;
    char *event_id, *aggregate_type, *aggregate_id, *topic; /* owned */
    /* Its first copy (a partition of -1: none seen), and the offset of its last copy in that
     * partition (the first's while there is one): a row replayed while Kafka still held its
     * first copy has a new id, and its first copy stands where its old id was (check_rows). No
     * bool "seen" beside them: a row takes 64 bytes (56 before the last copy was kept; 72
     * with the bool), against some 230 a row at peak (98_verify_memory). */
    int32_t partition;
    int64_t offset, last_offset;
} Row;

static bool row_seen(const Row *r)
{
    return r->partition >= 0;
}

typedef struct Check {
    Row *rows;
    size_t n;
    Row **by_id; /* rows sorted by event_id, for the messages' lookups */
    char **topics;
    size_t ntopics;
    long long messages, duplicates, unknown, outside, missing, out_of_order;
    long long later_copy; /* rows whose order was judged on their last copy (check_rows) */
    long long out_later;  /* rows out of order with a later copy in place (no --after-replay) */
    /* Ids no row of the window has, looked up in the whole table a chunk at a time as the read
     * goes (look_up_unknown): memory stays bounded whatever the topics hold (--from-beginning on
     * a long retention). The connection and configuration are for those looks. */
    char *unknown_ids[VERIFY_UNKNOWN_CHUNK];
    size_t nunknown;
    bool lookup_failed; /* a look failed (logged): the read stops, verify fails */
    PGconn *conn;
    const Config *cfg;
    bool uuid_ids; /* the event id column is a uuid: SQL_VERIFY_KNOWN_UUIDS looks them up */
    /* Partitions that hold messages but, by their timestamps, none since the window began:
     * true, or a broker that cannot look offsets up by time (it answers "the end" for every
     * timestamp). Rows missing then prove nothing. */
    int untimed;
} Check;

/* Whether the partitions are read from their first offset rather than from the window's start
 * found by the messages' timestamps: asked for, or the timestamps are the events' own times
 * (--timestamp-column). Those say nothing of when a message was written (a replayed event keeps
 * its old time), so a search by time would skip messages sent inside the window and call their
 * rows missing. */
static bool reads_whole_partitions(const Config *cfg)
{
    return cfg->verify_from_beginning || cfg->timestamp_column;
}

/* The verdict: out of order is evidence whatever was read; missing rows are evidence only when
 * every partition could be positioned (or was read whole). */
typedef enum { VERDICT_OK, VERDICT_FAILED, VERDICT_INCONCLUSIVE } Verdict;

static Verdict verdict(const Config *cfg, const Check *c)
{
    if (c->out_of_order > 0)
        return VERDICT_FAILED;
    if (c->missing == 0)
        return VERDICT_OK;
    return c->untimed > 0 && !reads_whole_partitions(cfg) ? VERDICT_INCONCLUSIVE : VERDICT_FAILED;
}

static int cmp_row_id(const void *a, const void *b)
{
    return strcmp((*(Row *const *)a)->event_id, (*(Row *const *)b)->event_id);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Rows of one aggregate and topic together (by_partition: and partition of the first copy), in
 * seq order. */
static int compare_rows(const Row *x, const Row *y, bool by_partition)
{
    int c = strcmp(x->aggregate_type, y->aggregate_type);
    if (!c)
        c = strcmp(x->aggregate_id, y->aggregate_id);
    if (!c)
        c = strcmp(x->topic, y->topic);
    if (!c && by_partition)
        c = (x->partition > y->partition) - (x->partition < y->partition);
    return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}

static int cmp_row_aggregate(const void *a, const void *b)
{
    return compare_rows(*(Row *const *)a, *(Row *const *)b, false);
}

/* With --order-scope partition the rows of one aggregate may name different partitions, and
 * order holds within each only. */
static int cmp_row_aggregate_partition(const void *a, const void *b)
{
    return compare_rows(*(Row *const *)a, *(Row *const *)b, true);
}

static Row *find_row(const Check *c, const char *id)
{
    Row key = {.event_id = (char *)id}, *kp = &key;
    Row **found = bsearch(&kp, c->by_id, c->n, sizeof(*c->by_id), cmp_row_id);
    return found ? *found : NULL;
}

static long window_answer_s(const Config *cfg)
{
    return cfg->statement_timeout_s + (cfg->verify_max_rows + 1) / 1000;
}

/* Runs a statement template for cfg's table, waiting answer_s at most for its answer
 * (admin_template_within): the result (PGRES_TUPLES_OK), or NULL with the error logged ("query
 * failed"; past the bound, "PostgreSQL did not answer within N s", and the connection is left
 * mid-statement: the caller stops using it). */
static PGresult *verify_exec(PGconn *conn, const Config *cfg, const char *tmpl, int nparams,
                             const char *const *params, long answer_s)
{
    DbError e = {0};
    PGresult *res = admin_template_within(conn, &cfg->map, tmpl, nparams, params, PGRES_TUPLES_OK,
                                          answer_s, &e);
    if (!res) {
        char q[600];
        log_error("query failed", "error=%s", log_quote(e.message, q, sizeof(q)));
    }
    return res;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s ? s : "");
    if (!d) {
        perror("outbox-relay");
        exit(1);
    }
    return d;
}

/* load_rows's reading of the window, a row at a time. */
typedef struct RowsLoad {
    Check *c;
    const Config *cfg;
    size_t room;   /* of c->rows */
    bool too_many; /* a row past --max-rows came: not kept */
} RowsLoad;

/* Copies one row of SQL_VERIFY_ROWS into c->rows (grown as needed). */
static void on_window_row(PGresult *res, void *arg)
{
    RowsLoad *load = arg;
    Check *c = load->c;
    if ((long)c->n >= load->cfg->verify_max_rows) {
        load->too_many = true;
        return;
    }
    if (c->n == load->room) {
        size_t room = load->room ? load->room * 2 : 1024;
        Row *grown = realloc(c->rows, (room + 1) * sizeof(*grown));
        if (!grown) {
            perror("outbox-relay");
            exit(1);
        }
        c->rows = grown;
        load->room = room;
    }
    Row *r = &c->rows[c->n];
    memset(r, 0, sizeof(*r));
    r->partition = -1;
    r->seq = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    r->event_id = xstrdup(PQgetvalue(res, 0, 1));
    r->aggregate_type = xstrdup(PQgetvalue(res, 0, 2));
    r->aggregate_id = xstrdup(PQgetvalue(res, 0, 3));
    OutboxRow row = {.id = r->seq,
                     .event_id = r->event_id,
                     .aggregate_type = r->aggregate_type,
                     .aggregate_id = r->aggregate_id,
                     .event_type = PQgetvalue(res, 0, 4)};
    char topic[ROUTE_TOPIC_MAX + 1], why[256];
    r->topic = xstrdup(
        route_topic(load->cfg->topic_template, &row, topic, sizeof(topic), why, sizeof(why)) ? topic
                                                                                             : "");
    c->n++;
}

/* Reads the rows marked sent within the window, and the event id column's type; sets *now_ms to
 * the database's clock. A window of more than --max-rows rows is not loaded: *too_many is set
 * (and false returned), since the check holds every row of the window at once (a message's row is
 * found among them by its id, and an aggregate's order is judged over all of them) and the
 * window's size is the data's, not the configuration's. */
static bool load_rows(PGconn *conn, const Config *cfg, Check *c, long long *now_ms, bool *too_many)
{
    *too_many = false;
    PGresult *uuid =
        verify_exec(conn, cfg, SQL_VERIFY_EVENT_ID_IS_UUID, 0, NULL, cfg->statement_timeout_s);
    if (!uuid)
        return false;
    c->uuid_ids = PQntuples(uuid) == 1 && strcmp(PQgetvalue(uuid, 0, 0), "t") == 0;
    PQclear(uuid);
    char since[32];
    snprintf(since, sizeof(since), "%ld", cfg->verify_since_s);
    /* One more than the bound: a window that fills it is larger than the bound. PostgreSQL
     * stops there, so no more rows ever come. */
    char limit[32];
    snprintf(limit, sizeof(limit), "%ld", cfg->verify_max_rows + 1);
    const char *params[2] = {since, limit};
    /* Read a row at a time, each copied as it comes: read whole, the result (some 140 bytes a
     * row) and the copies coexisted, and the peak was some 370 bytes a row where the rows kept
     * take some 230 (98_verify_memory). */
    RowsLoad load = {.c = c, .cfg = cfg};
    DbError e = {0};
    bool read = admin_template_rows_within(conn, &cfg->map, SQL_VERIFY_ROWS, 2, params,
                                           window_answer_s(cfg), on_window_row, &load, &e);
    if (!read) {
        char q[600];
        log_error("query failed", "error=%s", log_quote(e.message, q, sizeof(q)));
    }
    /* Not sent after a statement left unanswered: the connection is mid-statement. */
    PGresult *clock =
        read ? verify_exec(conn, cfg, SQL_VERIFY_NOW, 0, NULL, cfg->statement_timeout_s) : NULL;
    if (!clock)
        return false;
    *now_ms = strtoll(PQgetvalue(clock, 0, 0), NULL, 10);
    PQclear(clock);
    if (load.too_many) {
        *too_many = true;
        return false;
    }
    c->by_id = calloc(c->n + 1, sizeof(*c->by_id));
    c->topics = calloc(c->n + 1, sizeof(*c->topics));
    if (!c->by_id || !c->topics) {
        perror("outbox-relay");
        exit(1);
    }
    for (size_t i = 0; i < c->n; i++) {
        c->by_id[i] = &c->rows[i];
        c->topics[i] = c->rows[i].topic;
    }
    qsort(c->by_id, c->n, sizeof(*c->by_id), cmp_row_id);
    /* The distinct topics, in place. */
    qsort(c->topics, c->n, sizeof(*c->topics), cmp_str);
    for (size_t i = 0; i < c->n; i++)
        if (c->topics[i][0] && (c->ntopics == 0 || strcmp(c->topics[c->ntopics - 1], c->topics[i])))
            c->topics[c->ntopics++] = c->topics[i];
    return true;
}

static bool look_up_unknown(Check *c);

static void note_message(Check *c, const rd_kafka_message_t *m)
{
    c->messages++;
    rd_kafka_headers_t *hdrs = NULL;
    const void *val = NULL;
    size_t size = 0;
    char id[VERIFY_ID_MAX + 1] = "";
    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        rd_kafka_header_get_last(hdrs, "id", &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR && val) {
        if (size > VERIFY_ID_MAX) {
            char shown[VERIFY_SHOWN_ID];
            snprintf(id, sizeof(id), "%.*s", (int)VERIFY_ID_MAX, (const char *)val);
            if (++c->unknown <= VERIFY_SHOW)
                fprintf(stderr,
                        "verify: unknown message: id=%s... (%zu bytes, longer than any id "
                        "verify looks up: %d)\n",
                        log_escape(id, shown, sizeof(shown)), size, VERIFY_ID_MAX);
            return;
        }
        /* A NUL inside the header: no event id holds one (PostgreSQL's text cannot), and read
         * as a C string the id was its text up to the NUL, so a message "ab\0xyz" counted as
         * event "ab"'s copy and hid that row's loss. Counted unknown, without a lookup. */
        const char *nul = memchr(val, '\0', size);
        if (nul) {
            char shown[VERIFY_SHOWN_ID];
            size_t at = (size_t)(nul - (const char *)val);
            snprintf(id, sizeof(id), "%.*s", (int)at, (const char *)val);
            if (++c->unknown <= VERIFY_SHOW)
                fprintf(stderr,
                        "verify: unknown message: id=%s\\x00... (%zu bytes, a NUL byte at %zu: "
                        "no event id holds one)\n",
                        log_escape(id, shown, sizeof(shown)), size, at);
            return;
        }
        snprintf(id, sizeof(id), "%.*s", (int)size, (const char *)val);
    }
    Row *r = id[0] ? find_row(c, id) : NULL;
    if (!r) {
        c->unknown_ids[c->nunknown++] = xstrdup(id);
        if (c->nunknown == VERIFY_UNKNOWN_CHUNK && !look_up_unknown(c))
            c->lookup_failed = true;
        return;
    }
    if (row_seen(r)) {
        c->duplicates++;
        /* The last copy in the first copy's partition: a partition is read in offset order,
         * partitions interleaved. */
        if (m->partition == r->partition)
            r->last_offset = m->offset;
        return;
    }
    r->partition = m->partition;
    r->offset = r->last_offset = m->offset;
}

rd_kafka_conf_t *verify_kafka_conf(const Config *cfg, char *err, size_t errlen)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *defaults[][3] = {{"group.id", "outbox-relay-verify", "default"},
                                 {"enable.auto.commit", "false", "default"},
                                 {"enable.partition.eof", "true", "default"},
                                 {"bootstrap.servers", cfg->brokers, "--brokers"}};
    size_t n_defaults = sizeof(defaults) / sizeof(defaults[0]);
    /* The relay's --kafka properties carry what reaching the brokers takes (TLS, SASL);
     * producer-only ones are ignored by a consumer. One librdkafka refuses (unknown, or a bad
     * value) is refused here as run refuses it: bad input, not a check that reads nothing. */
    for (size_t i = 0; i < n_defaults + cfg->kafka.len; i++) {
        bool ours = i < n_defaults;
        const char *key = ours ? defaults[i][0] : cfg->kafka.items[i - n_defaults].key;
        const char *value = ours ? defaults[i][1] : cfg->kafka.items[i - n_defaults].value;
        char why[512];
        if (!value || rd_kafka_conf_set(conf, key, value, why, sizeof(why)) == RD_KAFKA_CONF_OK)
            continue;
        if (secrets_kafka_key_sensitive(key) && *value && strstr(why, value))
            snprintf(why, sizeof(why), "invalid value (not shown: it is a secret)");
        /* Named where it was set (the flag, the --kafka-file line, the config file), as run
         * names it (config_kafka_origin). */
        char origin[1024];
        if (ours)
            snprintf(origin, sizeof(origin), "%s %s", defaults[i][2], key);
        else
            config_kafka_origin(cfg, i - n_defaults, origin, sizeof(origin));
        snprintf(err, errlen, "%s: %s", origin, why);
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    /* A TLS file that is a FIFO, a device or a socket is bad input, refused before any row is
     * read, as run refuses it: the consumer's open of it would wait for a writer, unbounded by
     * --statement-timeout. */
    if (!kafka_conf_files_ok(conf, err, errlen)) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return conf;
}

/* A consumer for the topics (conf, which it takes), assigned from start_ms to the end each
 * partition had when verify started. Returns false (logged) when Kafka cannot be read. */
static bool read_topics(const Config *cfg, rd_kafka_conf_t *conf, Check *c, long long start_ms)
{
    /* Each wait for Kafka (a topic's metadata, a partition's offsets, the next message or end of
     * partition) is bounded by --statement-timeout, as each of PostgreSQL's is: the bound an
     * operator set held for the database alone, and a silent broker kept verify 10 s a request
     * and 30 s for the messages whatever it said. At most a day: fits librdkafka's int ms. */
    int kafka_ms = (int)(cfg->statement_timeout_s * 1000);
    char errstr[512];
    /* The rows were read since verify_kafka_conf's check, for as long as that took: librdkafka
     * is handed the TLS files opened here without waiting (kafka_conf_pin_files), so that one
     * swapped for a FIFO meanwhile is refused, not waited on. */
    KafkaPins pins;
    if (!kafka_conf_pin_files(conf, &pins, errstr, sizeof(errstr))) {
        char q[600];
        rd_kafka_conf_destroy(conf);
        log_error("cannot create the Kafka consumer", "error=%s", log_quote(errstr, q, sizeof(q)));
        return false;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    kafka_pins_text(&pins, errstr, sizeof(errstr));
    kafka_pins_close(&pins); /* read whole by rd_kafka_new, never opened again */
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        log_error("cannot create the Kafka consumer", "error=%s", errstr);
        return false;
    }
    bool ok = true;
    rd_kafka_topic_partition_list_t *assign = rd_kafka_topic_partition_list_new(16);
    int64_t *ends = NULL;
    int remaining = 0, at_end = 0;
    for (size_t t = 0; ok && t < c->ntopics; t++) {
        rd_kafka_topic_t *topic = rd_kafka_topic_new(rk, c->topics[t], NULL);
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, topic, &md, kafka_ms);
        int partitions = err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 &&
                                 md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR
                             ? md->topics[0].partition_cnt
                             : 0;
        /* The topic's own error in an answer that came (not authorised to describe it, no
         * leader while it is created or elected) left it without partitions, and every row of
         * it was reported missing: a FAILED verdict, and a list `replay --missing` would publish
         * again whole, for a topic that was never read. A topic the broker does not know holds
         * none of its rows: those are missing, and the line says why. */
        rd_kafka_resp_err_t topic_err = err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1
                                            ? md->topics[0].err
                                            : RD_KAFKA_RESP_ERR_NO_ERROR;
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR ||
            (topic_err != RD_KAFKA_RESP_ERR_NO_ERROR &&
             topic_err != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)) {
            char q[300];
            log_error(
                "cannot read the topic's metadata", "topic=%s error=%s bound=\"%ld s\"",
                c->topics[t],
                log_quote(rd_kafka_err2str(err != RD_KAFKA_RESP_ERR_NO_ERROR ? err : topic_err), q,
                          sizeof(q)),
                cfg->statement_timeout_s);
            ok = false;
        } else if (topic_err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
            log_warn("the topic does not exist: its rows are missing", "topic=%s", c->topics[t]);
        }
        if (md)
            rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(topic);
        for (int p = 0; ok && p < partitions; p++) {
            int64_t low = 0, high = 0;
            err = rd_kafka_query_watermark_offsets(rk, c->topics[t], p, &low, &high, kafka_ms);
            rd_kafka_topic_partition_list_t *when = rd_kafka_topic_partition_list_new(1);
            rd_kafka_topic_partition_list_add(when, c->topics[t], p)->offset = start_ms;
            if (err == RD_KAFKA_RESP_ERR_NO_ERROR && !reads_whole_partitions(cfg))
                err = rd_kafka_offsets_for_times(rk, when, kafka_ms);
            int64_t from = when->elems[0].offset;
            rd_kafka_topic_partition_list_destroy(when);
            if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
                char q[300];
                log_error("cannot read a partition's offsets",
                          "topic=%s partition=%d error=%s bound=\"%ld s\"", c->topics[t], p,
                          log_quote(rd_kafka_err2str(err), q, sizeof(q)), cfg->statement_timeout_s);
                ok = false;
                break;
            }
            if (reads_whole_partitions(cfg))
                from = low;
            else if (from < 0 && high > low)
                at_end++;
            log_debug("partition to read", "topic=%s partition=%d from=%lld low=%lld high=%lld",
                      c->topics[t], p, (long long)from, (long long)low, (long long)high);
            if (from < 0 || from >= high)
                continue; /* nothing since the window began */
            rd_kafka_topic_partition_list_add(assign, c->topics[t], p)->offset = from;
            int64_t *grown = realloc(ends, (size_t)assign->cnt * sizeof(*grown));
            if (!grown) {
                perror("outbox-relay");
                exit(1);
            }
            ends = grown;
            ends[assign->cnt - 1] = high;
            remaining++;
        }
    }
    c->untimed = at_end;
    if (at_end > 0)
        log_warn("by their timestamps, some partitions hold nothing since the window began; "
                 "brokers that cannot look offsets up by time answer so too (--from-beginning "
                 "reads every partition whole)",
                 "partitions=%d", at_end);
    if (ok && remaining > 0 && rd_kafka_assign(rk, assign) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        log_error("cannot assign the partitions", NULL);
        ok = false;
    }
    struct timespec last, now;
    clock_gettime(CLOCK_MONOTONIC, &last);
    while (ok && remaining > 0 && !c->lookup_failed) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 1000);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (!m) {
            if ((now.tv_sec - last.tv_sec) * 1000 + (now.tv_nsec - last.tv_nsec) / 1000000 >
                kafka_ms) {
                log_error("Kafka sent nothing within --statement-timeout; giving up",
                          "bound=\"%ld s\" partitions_left=%d", cfg->statement_timeout_s,
                          remaining);
                ok = false;
            }
            continue;
        }
        last = now;
        int i = 0;
        const char *name = m->rkt ? rd_kafka_topic_name(m->rkt) : "";
        while (i < assign->cnt && (strcmp(assign->elems[i].topic, name) != 0 ||
                                   assign->elems[i].partition != m->partition))
            i++;
        if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR && i < assign->cnt && m->offset < ends[i]) {
            note_message(c, m);
            if (m->offset + 1 >= ends[i]) {
                ends[i] = -1; /* done */
                remaining--;
            }
        } else if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF && i < assign->cnt && ends[i] >= 0 &&
                   m->offset >= ends[i]) {
            ends[i] = -1;
            remaining--;
        } else if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR &&
                   m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            log_error("reading Kafka failed", "error=%s", rd_kafka_message_errstr(m));
            ok = false;
        }
        rd_kafka_message_destroy(m);
    }
    free(ends);
    rd_kafka_topic_partition_list_destroy(assign);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return ok && !c->lookup_failed;
}

/* The ids no row of the window has, gathered so far (at most a chunk): those the table has are
 * rows outside the window (sent before it), the others unknown. Counts them and lets them go. */
static bool look_up_unknown(Check *c)
{
    if (c->nunknown == 0)
        return true;
    StrBuf ids = {0};
    strbuf_array_begin(&ids);
    for (size_t i = 0; i < c->nunknown; i++)
        strbuf_array_text(&ids, c->unknown_ids[i]);
    strbuf_array_end(&ids);
    const char *params[1] = {ids.s};
    PGresult *res =
        verify_exec(c->conn, c->cfg, c->uuid_ids ? SQL_VERIFY_KNOWN_UUIDS : SQL_VERIFY_KNOWN_IDS, 1,
                    params, window_answer_s(c->cfg));
    strbuf_free(&ids);
    /* The statement returns, for each id in order, whether the table has it. */
    for (size_t i = 0; res && i < c->nunknown; i++) {
        if (strcmp(PQgetvalue(res, (int)i, 0), "t") == 0) {
            c->outside++;
        } else if (++c->unknown <= VERIFY_SHOW) {
            /* Anyone who can write to the topic chose these bytes. */
            char id[VERIFY_SHOWN_ID];
            fprintf(stderr, "verify: unknown message: id=%s (no row of the table has it)\n",
                    c->unknown_ids[i][0] ? log_escape(c->unknown_ids[i], id, sizeof(id))
                                         : "(none)");
        }
    }
    PQclear(res);
    for (size_t i = 0; i < c->nunknown; i++)
        free(c->unknown_ids[i]);
    c->nunknown = 0;
    return res != NULL;
}

/* Missing rows, and first copies out of their aggregate's order: within a topic, and with
 * --order-scope partition within a partition, as the relay keeps it. */
static void check_rows(const Config *cfg, Check *c)
{
    bool per_partition = cfg->order_scope == ORDER_PER_PARTITION;
    for (size_t i = 0; i < c->n; i++) {
        const Row *r = &c->rows[i];
        if (row_seen(r))
            continue;
        char id[VERIFY_SHOWN_ID];
        if (++c->missing <= VERIFY_SHOW)
            fprintf(stderr,
                    "verify: missing: id=%lld event_id=%s topic=%s (marked sent, no message)\n",
                    r->seq, log_escape(r->event_id, id, sizeof(id)), r->topic);
    }
    Row **order = c->by_id; /* reused: sorted by aggregate from here on */
    qsort(order, c->n, sizeof(*order),
          per_partition ? cmp_row_aggregate_partition : cmp_row_aggregate);
    /* Each row found is compared with the previous row found of its aggregate, skipping the
     * missing ones between: comparing neighbours only, a missing row hid the order of the rows
     * either side of it (1 and 3 sent as 3, 1 with 2 missing was no break).
     * A row is in order when its first copy comes after the previous row's place. Else, when
     * its last copy does, it is judged on that copy, which becomes its place: replay gives a row
     * a new id, after every row of the table, and its first copy, still in the topic, stands
     * where its old id was, before rows whose ids are now lower (the table no longer knows the
     * old id). Judged on first copies alone, a replay of events Kafka still held was reported
     * out of order; a row none of whose copies comes after the previous row's still is.
     * Only with --after-replay: the topic and the table cannot tell a replay from a real break
     * whose events were sent again (a producer's first request to a partition rejected, the
     * events behind it in the topic ahead of its retry, then cancelled and sent again in
     * order), which a consumer that drops duplicates saw out of order: by default verify must
     * not say ok of that (the line below the list names the flag). */
    const Row *prev = NULL;   /* the last row found */
    int32_t at_partition = 0; /* prev's place: the copy it was judged on */
    int64_t at_offset = 0;
    for (size_t i = 0; i < c->n; i++) {
        const Row *a = prev, *b = order[i];
        if (!row_seen(b))
            continue;
        prev = b;
        bool same = a && !strcmp(a->aggregate_type, b->aggregate_type) &&
                    !strcmp(a->aggregate_id, b->aggregate_id) && !strcmp(a->topic, b->topic) &&
                    (!per_partition || a->partition == b->partition);
        bool first_after = !same || (b->partition == at_partition && b->offset > at_offset);
        bool later_in_place = same && b->partition == at_partition && b->last_offset > at_offset;
        bool last_after = later_in_place && cfg->verify_after_replay;
        int32_t a_partition = at_partition;
        int64_t a_offset = at_offset;
        if (first_after || !last_after) {
            at_partition = b->partition;
            at_offset = b->offset;
        } else {
            at_offset = b->last_offset; /* in b->partition, at_partition already */
            c->later_copy++;
        }
        if (first_after || last_after)
            continue;
        char id_a[VERIFY_SHOWN_ID], id_b[VERIFY_SHOWN_ID];
        c->out_later += later_in_place;
        if (++c->out_of_order <= VERIFY_SHOW)
            fprintf(stderr,
                    "verify: out of order: id=%lld event_id=%s (partition %d offset %lld) "
                    "comes after id=%lld event_id=%s (partition %d offset %lld) in topic %s\n",
                    a->seq, log_escape(a->event_id, id_a, sizeof(id_a)), (int)a_partition,
                    (long long)a_offset, b->seq, log_escape(b->event_id, id_b, sizeof(id_b)),
                    (int)b->partition, (long long)b->offset, a->topic);
    }
    if (c->out_later > 0)
        fprintf(stderr,
                "verify: %lld row(s) out of order with a later copy in their place, as a replay "
                "of events Kafka still held leaves (replay gives a row a new id): if they were "
                "replayed, check with --after-replay; else a consumer saw them out of order\n",
                c->out_later);
}

/* Lower-case hex of the bytes of text. */
static json_t *json_hex(const char *text)
{
    static const char digits[] = "0123456789abcdef";
    size_t n = strlen(text);
    char *hex = malloc(2 * n + 1);
    if (!hex) {
        perror("outbox-relay");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = digits[(unsigned char)text[i] >> 4];
        hex[2 * i + 1] = digits[(unsigned char)text[i] & 15];
    }
    hex[2 * n] = '\0';
    json_t *j = json_string(hex);
    free(hex);
    return j;
}

/* Missing row r as an entry of missing_events: {id, event_id, topic}. JSON text is UTF-8, and an
 * id that is not (a SQL_ASCII database holds any bytes) made json_pack fail and the row drop out
 * of the list without a word, so `replay --missing` put back all but it. Such a row is listed
 * with the bytes in hex (event_id_hex, topic_hex) instead and no string event_id, which replay
 * refuses as a list it cannot match (a \u escape of each byte would be other bytes to the
 * server); *utf8 is then false. */
static json_t *missing_entry(const Row *r, bool *utf8)
{
    json_t *e = json_pack("{s:I, s:s, s:s}", "id", (json_int_t)r->seq, "event_id", r->event_id,
                          "topic", r->topic);
    *utf8 = e != NULL;
    if (e)
        return e;
    e = json_object();
    json_t *topic = json_string(r->topic);
    if (!e || json_object_set_new(e, "id", json_integer((json_int_t)r->seq)) ||
        json_object_set_new(e, "event_id_hex", json_hex(r->event_id)) ||
        json_object_set_new(e, topic ? "topic" : "topic_hex", topic ? topic : json_hex(r->topic))) {
        perror("outbox-relay"); /* out of memory: no list rather than a short one */
        exit(1);
    }
    return e;
}

/* Prints json_dumps of j (compact, ASCII only) and frees it; cut drops that many characters of
 * its end (an object's closing brace, for more keys to follow). */
static void print_json(json_t *j, size_t cut)
{
    /* ASCII only, as `dead --json`: U+2028 and bidi characters of an event id reach a terminal
     * as \u escapes (JSON escapes control characters itself). */
    char *text = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(j);
    if (!text) {
        perror("outbox-relay"); /* out of memory: no list rather than a short one */
        exit(1);
    }
    size_t n = strlen(text);
    fwrite(text, 1, n > cut ? n - cut : 0, stdout);
    free(text);
}

static void report(const Config *cfg, const Check *c)
{
    Verdict v = verdict(cfg, c);
    const char *const names[] = {"ok", "FAILED", "INCONCLUSIVE"};
    const char *const json_names[] = {"ok", "failed", "inconclusive"};
    if (cfg->json) {
        json_t *o = json_pack(
            "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:s, s:i}", "window_seconds",
            (json_int_t)cfg->verify_since_s, "rows", (json_int_t)c->n, "messages",
            (json_int_t)c->messages, "missing", (json_int_t)c->missing, "out_of_order",
            (json_int_t)c->out_of_order, "duplicates", (json_int_t)c->duplicates, "unknown",
            (json_int_t)c->unknown, "outside_window", (json_int_t)c->outside,
            "judged_by_later_copy", (json_int_t)c->later_copy, "ok", v == VERDICT_OK, "result",
            json_names[v], "untimed_partitions", c->untimed);
        if (!o) {
            perror("outbox-relay");
            exit(1);
        }
        /* Every missing row (not only the first VERIFY_SHOW), so that `replay --missing -` can
         * put exactly these back in line: id and event_id both, which replay matches together
         * (an id alone may name another event once the row was replayed). Printed an entry at a
         * time, as the object's last key: built whole as one JSON tree and its text, the list
         * took some 700 bytes a row on top of the rows (200,000 rows all missing: 224 MB peak
         * against 84 MB without --json), so a window of --max-rows all missing (a topic gone,
         * the wrong brokers) needed three times the memory the bound is documented to cost. */
        print_json(o, 1);
        fputs(",\"missing_events\":[", stdout);
        long long unlisted = 0, listed = 0;
        for (size_t i = 0; i < c->n; i++) {
            if (row_seen(&c->rows[i]))
                continue;
            bool utf8;
            json_t *e = missing_entry(&c->rows[i], &utf8);
            unlisted += !utf8;
            if (listed++)
                fputc(',', stdout);
            print_json(e, 0);
        }
        fputs("]}\n", stdout);
        if (unlisted)
            fprintf(stderr,
                    "verify: %lld missing event(s) have an event_id or topic that is not valid "
                    "UTF-8 (a SQL_ASCII database): missing_events lists them with event_id_hex, "
                    "which `replay --missing` refuses; replay them by id (--from-id, --to-id)\n",
                    unlisted);
        return;
    }
    printf("verify: %s: window=%lds rows=%zu messages=%lld missing=%lld out_of_order=%lld "
           "duplicates=%lld unknown=%lld outside_window=%lld\n",
           names[v], cfg->verify_since_s, c->n, c->messages, c->missing, c->out_of_order,
           c->duplicates, c->unknown, c->outside);
    /* Said, since those rows' first copies were not held to their ids' order (check_rows). */
    if (c->later_copy > 0)
        printf("verify: %lld row(s) judged by a later copy: their first copy comes before an "
               "earlier row's, as after a replay of events Kafka still held (replay gives a row a "
               "new id), and a later copy comes in the row's place\n",
               c->later_copy);
    if (v == VERDICT_INCONCLUSIVE)
        printf("verify: inconclusive: %d partition(s) could not be positioned by time (the broker "
               "may not look offsets up by timestamp), so the missing rows may be there: run "
               "again with --from-beginning\n",
               c->untimed);
}

static void check_free(Check *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->rows[i].event_id);
        free(c->rows[i].aggregate_type);
        free(c->rows[i].aggregate_id);
        free(c->rows[i].topic);
    }
    for (size_t i = 0; i < c->nunknown; i++)
        free(c->unknown_ids[i]);
    free(c->rows);
    free(c->by_id);
    free(c->topics);
}

int verify_run(const Config *cfg, rd_kafka_conf_t *conf)
{
    /* The relay's configuration, given to verify as the docs ask, deletes every row it sends:
     * the window is always empty, and "ok: rows=0" (exit 0) would pass a check that looked at
     * nothing, however much Kafka lost. */
    if (cfg->on_sent == ON_SENT_DELETE) {
        fprintf(stderr, "outbox-relay: verify: with --on-sent delete the relay deletes each row "
                        "it sends, so no row is left to check against Kafka (rows marked before "
                        "a switch to delete: run verify without --on-sent delete)\n");
        rd_kafka_conf_destroy(conf);
        return 2;
    }
    PGconn *conn = admin_connect_unbounded(cfg->database_url);
    int connect_rc = conn ? 1 : admin_connect_exit_code();
    DbError e = {0};
    PGresult *set =
        conn ? admin_script_within(
                   conn, DB_BOUND_SETTING_SQL("lock_timeout", VERIFY_LOCK_TIMEOUT, "false"),
                   cfg->statement_timeout_s, &e)
             : NULL;
    PQclear(set);
    if (conn && !set) {
        char q[600];
        log_error("cannot set the session's lock timeout", "error=%s",
                  log_quote(db_error_text(&e), q, sizeof(q)));
        PQfinish(conn);
        conn = NULL;
    }
    if (!conn) {
        rd_kafka_conf_destroy(conf);
        return connect_rc;
    }
    Check c = {.conn = conn, .cfg = cfg};
    long long now_ms = 0;
    if (cfg->timestamp_column && !cfg->verify_from_beginning)
        log_info("messages carry the events' own times (--timestamp-column), which cannot find "
                 "the window's start: reading every partition from its first offset",
                 "timestamp_column=%s", cfg->timestamp_column);
    bool too_many = false;
    bool loaded = load_rows(conn, cfg, &c, &now_ms, &too_many);
    if (!loaded)
        rd_kafka_conf_destroy(conf);
    if (too_many) {
        /* Bad input as replay's unconfirmed selection is: nothing was checked, and a narrower
         * window (or a bound the host can hold) is what the operator gives next. */
        fprintf(stderr,
                "outbox-relay: verify: the window holds more than --max-rows %ld rows (each is "
                "held in memory, about 230 bytes at peak): narrow --since or raise --max-rows\n",
                cfg->verify_max_rows);
        PQfinish(conn);
        check_free(&c);
        return 2;
    }
    bool ok = loaded &&
              read_topics(cfg, conf, &c,
                          now_ms - cfg->verify_since_s * 1000 - VERIFY_MARGIN_MS -
                              cfg->delivery_timeout_ms) &&
              look_up_unknown(&c);
    PQfinish(conn);
    int rc = 1;
    if (ok) {
        check_rows(cfg, &c);
        report(cfg, &c);
        Verdict v = verdict(cfg, &c);
        rc = v == VERDICT_OK ? 0 : v == VERDICT_FAILED ? 1 : VERIFY_INCONCLUSIVE;
    }
    check_free(&c);
    return rc;
}
