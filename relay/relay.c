#include "relay.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backoff.h"
#include "kafka.h"
#include "log.h"
#include "pg.h"
#include "route.h"

#define WAKEUP_CHANNEL "outbox_relay"
/* After a batch in which every row failed (Kafka down, say), wait before claiming again. */
#define RETRY_BASE_S 0.5
#define RETRY_CAP_S 30.0

static const char *const SQL_LISTEN = "LISTEN " WAKEUP_CHANNEL;
static const char *const SQL_BEGIN = "BEGIN";
static const char *const SQL_COMMIT = "COMMIT";
static const char *const SQL_ROLLBACK = "ROLLBACK";
static const char *const SQL_CLAIM =
    "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload::text, headers::text"
    " FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED";
static const char *const SQL_MARK_SENT =
    "UPDATE outbox SET sent_at = now() WHERE id = ANY($1::bigint[])";
static const char *const SQL_MARK_FAILED =
    "UPDATE outbox AS o SET attempts = o.attempts + 1, last_error = f.error"
    " FROM unnest($1::bigint[], $2::text[]) AS f(id, error) WHERE o.id = f.id";

typedef enum {
    PHASE_DOWN,      /* no PostgreSQL connection */
    PHASE_SETUP,     /* LISTEN in flight */
    PHASE_IDLE,      /* no transaction open */
    PHASE_CLAIMING,  /* BEGIN + claim in flight */
    PHASE_PRODUCING, /* rows claimed, waiting for delivery reports */
    PHASE_MARKING,   /* marks + COMMIT in flight */
    PHASE_ENDING,    /* COMMIT or ROLLBACK of a transaction that marks nothing */
} Phase;

typedef enum { ROW_PENDING, ROW_QUEUED, ROW_ACKED, ROW_FAILED } RowState;

typedef struct BatchRow {
    OutboxRow row;
    RowState state;
    char *error; /* why it failed; owned */
} BatchRow;

typedef struct Batch {
    PGresult *claim; /* owns the rows' strings */
    BatchRow *rows;  /* capacity batch_size, reused */
    int n;
    int next;      /* next row to produce */
    int in_flight; /* produced, delivery report not yet in */
    int acked, failed;
    bool abandoned; /* the transaction is gone; drop once every report is in */
    bool timed_out; /* the delivery timeout cancelled what was left */
} Batch;

/* Growing text buffer for the array parameters of the mark statements. */
typedef struct Text {
    char *s;
    size_t len, cap;
} Text;

struct Relay {
    struct ev_loop *loop;
    const Config *cfg;
    rd_kafka_conf_t *kconf_template; /* kept to recreate the producer after a fatal error */
    KafkaProducer *kafka;
    PgConn *pg;
    Phase phase;
    Batch batch;
    bool wake_pending; /* a wakeup arrived while busy: claim again after this batch */
    bool stopping;
    int signals;
    int exit_status;
    Backoff retry;
    bool claim_error_logged;
    char last_failure[256]; /* error of the last batch that had failures, "" once one had none */
    Text ids, fail_ids, fail_errors;
    ev_timer poll_timer;
    ev_timer retry_timer;
    ev_timer shutdown_timer;
    ev_timer delivery_timer; /* bounds a batch's wait for acknowledgements */
    ev_signal sigterm, sigint;
    unsigned long long total_sent, total_failed;
};

static void try_claim(Relay *r);
static void send_marks(Relay *r);

/* ---- small helpers ---------------------------------------------------------------------- */

static void text_reset(Text *t)
{
    t->len = 0;
    if (t->s)
        t->s[0] = '\0';
}

static void text_append(Text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (t->len + n + 1 > cap)
            cap *= 2;
        char *grown = realloc(t->s, cap);
        if (!grown) {
            log_error("out of memory", NULL);
            abort();
        }
        t->s = grown;
        t->cap = cap;
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = '\0';
}

static void text_puts(Text *t, const char *s)
{
    text_append(t, s, strlen(s));
}

/* Appends s as one element of a PostgreSQL array literal: "..." with " and \ escaped. */
static void text_array_elem(Text *t, const char *s)
{
    text_append(t, t->len > 1 ? ",\"" : "\"", t->len > 1 ? 2 : 1);
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\')
            text_append(t, "\\", 1);
        text_append(t, p, 1);
    }
    text_append(t, "\"", 1);
}

static void batch_clear(Batch *b)
{
    for (int i = 0; i < b->n; i++) {
        free(b->rows[i].error);
        b->rows[i].error = NULL;
    }
    PQclear(b->claim);
    b->claim = NULL;
    b->n = b->next = b->in_flight = b->acked = b->failed = 0;
    b->abandoned = false;
    b->timed_out = false;
}

static void row_failed(Batch *b, BatchRow *br, const char *why)
{
    br->state = ROW_FAILED;
    free(br->error);
    br->error = strdup(why);
    b->failed++;
}

static void stop_loop(Relay *r)
{
    ev_timer_stop(r->loop, &r->shutdown_timer);
    ev_break(r->loop, EVBREAK_ALL);
}

/* ---- ending a transaction ----------------------------------------------------------------- */

static void on_ended(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Relay *r = arg;
    if (!results)
        return; /* connection lost: on_pg_state has taken over */
    if (error) {
        char q[512];
        log_warn("ending transaction failed", "error=%s", log_quote(error, q, sizeof(q)));
    }
    r->phase = PHASE_IDLE;
    batch_clear(&r->batch);
    if (r->stopping)
        stop_loop(r);
    else
        try_claim(r);
}

/* Ends the open transaction without marking anything. */
static void end_transaction(Relay *r, const char *sql)
{
    PgQuery q = {sql, 0, NULL};
    r->phase = PHASE_ENDING;
    if (!pg_conn_send(r->pg, &q, 1, on_ended, r))
        pg_conn_reset(r->pg, "connection busy while ending a transaction");
}

/* ---- marking ------------------------------------------------------------------------------ */

static void schedule_retry(Relay *r)
{
    double delay = backoff_next(&r->retry);
    ev_timer_stop(r->loop, &r->retry_timer);
    ev_timer_set(&r->retry_timer, delay, 0);
    ev_timer_start(r->loop, &r->retry_timer);
}

static void on_marked(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Relay *r = arg;
    Batch *b = &r->batch;
    char q[512];
    if (!results)
        return; /* connection lost before COMMIT was confirmed: the rows will be re-sent */
    if (error) {
        log_error("marking rows failed; they will be sent again", "error=%s rows=%d",
                  log_quote(error, q, sizeof(q)), b->n);
        end_transaction(r, SQL_ROLLBACK);
        schedule_retry(r);
        return;
    }

    r->total_sent += (unsigned long long)b->acked;
    r->total_failed += (unsigned long long)b->failed;
    log_debug("batch committed", "rows=%d sent=%d failed=%d", b->n, b->acked, b->failed);
    bool full = b->n == (int)r->cfg->batch_size;
    bool all_failed = b->acked == 0 && b->failed > 0;
    batch_clear(b);
    r->phase = PHASE_IDLE;

    if (r->stopping) {
        stop_loop(r);
        return;
    }
    if (all_failed) {
        schedule_retry(r);
        return;
    }
    backoff_reset(&r->retry);
    if (full)
        r->wake_pending = true; /* more rows are likely waiting: claim again at once */
    try_claim(r);
}

/* One line per batch with failures, and only when the failure is new: an outage that fails
 * batch after batch with the same error logs once, then at debug level until it clears. */
static void log_batch_failures(Relay *r, const BatchRow *first_failed)
{
    Batch *b = &r->batch;
    char q[512];
    if (!first_failed) {
        if (r->last_failure[0])
            log_info("deliveries succeed again", "sent=%d", b->acked);
        r->last_failure[0] = '\0';
        return;
    }
    const char *error = first_failed->error ? first_failed->error : "unknown error";
    LogLevel level = strcmp(error, r->last_failure) == 0 ? LOG_DEBUG : LOG_WARN;
    log_write(level, "events not delivered; they will be retried",
              "failed=%d sent=%d first_id=%lld first_event_id=%s error=%s", b->failed, b->acked,
              first_failed->row.id, first_failed->row.event_id, log_quote(error, q, sizeof(q)));
    snprintf(r->last_failure, sizeof(r->last_failure), "%s", error);
}

static void send_marks(Relay *r)
{
    Batch *b = &r->batch;
    ev_timer_stop(r->loop, &r->delivery_timer);
    text_reset(&r->ids);
    text_reset(&r->fail_ids);
    text_reset(&r->fail_errors);
    text_puts(&r->ids, "{");
    text_puts(&r->fail_ids, "{");
    text_puts(&r->fail_errors, "{");
    char num[32];
    const BatchRow *first_failed = NULL;
    for (int i = 0; i < b->n; i++) {
        BatchRow *br = &b->rows[i];
        Text *ids = br->state == ROW_ACKED    ? &r->ids
                    : br->state == ROW_FAILED ? &r->fail_ids
                                              : NULL;
        if (!ids)
            continue; /* never produced or never acknowledged: stays unsent */
        snprintf(num, sizeof(num), "%s%lld", ids->len > 1 ? "," : "", br->row.id);
        text_puts(ids, num);
        if (br->state == ROW_FAILED) {
            text_array_elem(&r->fail_errors, br->error ? br->error : "unknown error");
            if (!first_failed)
                first_failed = br;
        }
    }
    text_puts(&r->ids, "}");
    text_puts(&r->fail_ids, "}");
    text_puts(&r->fail_errors, "}");
    log_batch_failures(r, first_failed);

    const char *sent_params[1] = {r->ids.s};
    const char *fail_params[2] = {r->fail_ids.s, r->fail_errors.s};
    PgQuery queries[3];
    int nq = 0;
    if (r->ids.len > 2)
        queries[nq++] = (PgQuery){SQL_MARK_SENT, 1, sent_params};
    if (r->fail_ids.len > 2)
        queries[nq++] = (PgQuery){SQL_MARK_FAILED, 2, fail_params};
    queries[nq++] = (PgQuery){SQL_COMMIT, 0, NULL};
    r->phase = PHASE_MARKING;
    if (!pg_conn_send(r->pg, queries, nq, on_marked, r))
        pg_conn_reset(r->pg, "connection busy while marking");
}

/* ---- producing ---------------------------------------------------------------------------- */

/* Marks the batch once nothing is left to produce and every report is in. */
static void maybe_finish_batch(Relay *r)
{
    Batch *b = &r->batch;
    if (b->abandoned) {
        if (b->in_flight == 0) {
            batch_clear(b);
            r->wake_pending = true;
            try_claim(r);
        }
        return;
    }
    if (r->phase == PHASE_PRODUCING && b->next >= b->n && b->in_flight == 0)
        send_marks(r);
}

static void produce_more(Relay *r)
{
    Batch *b = &r->batch;
    char topic[ROUTE_TOPIC_MAX + 1];
    char why[512];
    while (b->next < b->n && !r->stopping) {
        BatchRow *br = &b->rows[b->next];
        const OutboxRow *row = &br->row;
        if (!route_topic(r->cfg->topic_template, row, topic, sizeof(topic), why, sizeof(why))) {
            row_failed(b, br, why);
            b->next++;
            continue;
        }
        rd_kafka_headers_t *hdrs = route_headers(row, why, sizeof(why));
        if (!hdrs) {
            row_failed(b, br, why);
            b->next++;
            continue;
        }
        rd_kafka_resp_err_t err =
            kafka_produce(r->kafka, topic, row->aggregate_id, strlen(row->aggregate_id),
                          row->payload, row->payload_len, hdrs, br);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && b->in_flight > 0) {
            /* Backpressure: resume from on_delivery once reports free room. */
            rd_kafka_headers_destroy(hdrs);
            break;
        }
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            rd_kafka_headers_destroy(hdrs);
            row_failed(b, br, rd_kafka_err2str(err));
            b->next++;
            continue;
        }
        br->state = ROW_QUEUED;
        b->in_flight++;
        b->next++;
    }
    if (r->stopping || b->timed_out)
        b->next = b->n; /* rows not produced yet stay unsent, with no attempt counted */
    maybe_finish_batch(r);
}

static void on_delivery(void *opaque, rd_kafka_resp_err_t err, void *arg)
{
    Relay *r = arg;
    Batch *b = &r->batch;
    BatchRow *br = opaque;
    if (br->state != ROW_QUEUED)
        return; /* reported after shutdown gave up on it */
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        br->state = ROW_ACKED;
        b->acked++;
    } else if (err == RD_KAFKA_RESP_ERR__PURGE_QUEUE || err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT) {
        char why[128];
        snprintf(why, sizeof(why), "not acknowledged within the delivery timeout (%ld ms)",
                 r->cfg->delivery_timeout_ms);
        row_failed(b, br, why);
    } else {
        row_failed(b, br, rd_kafka_err2str(err));
    }
    b->in_flight--;
    if (r->phase == PHASE_PRODUCING && b->next < b->n)
        produce_more(r);
    else
        maybe_finish_batch(r);
}

/* ---- claiming ----------------------------------------------------------------------------- */

static void load_rows(Batch *b, PGresult *res)
{
    b->claim = res;
    b->n = PQntuples(res);
    for (int i = 0; i < b->n; i++) {
        BatchRow *br = &b->rows[i];
        OutboxRow *row = &br->row;
        row->id = strtoll(PQgetvalue(res, i, 0), NULL, 10);
        row->event_id = PQgetvalue(res, i, 1);
        row->aggregate_type = PQgetvalue(res, i, 2);
        row->aggregate_id = PQgetvalue(res, i, 3);
        row->event_type = PQgetvalue(res, i, 4);
        row->payload = PQgetisnull(res, i, 5) ? NULL : PQgetvalue(res, i, 5);
        row->payload_len = row->payload ? (size_t)PQgetlength(res, i, 5) : 0;
        row->headers = PQgetisnull(res, i, 6) ? NULL : PQgetvalue(res, i, 6);
        br->state = ROW_PENDING;
        br->error = NULL;
    }
}

static void on_claimed(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Relay *r = arg;
    char q[512];
    if (!results)
        return;
    if (error || n < 2) {
        /* Typically a missing table (migrate not run) or missing privileges: say so once, then
         * keep retrying with backoff so the relay recovers when it is fixed. */
        if (!r->claim_error_logged)
            log_error("claiming rows failed; retrying", "error=%s",
                      log_quote(error ? error : "short result", q, sizeof(q)));
        r->claim_error_logged = true;
        end_transaction(r, SQL_ROLLBACK);
        schedule_retry(r);
        return;
    }
    if (r->claim_error_logged)
        log_info("claiming rows works again", NULL);
    r->claim_error_logged = false;

    PGresult *res = results[1];
    if (PQntuples(res) == 0 || r->stopping) {
        end_transaction(r, SQL_COMMIT);
        return;
    }
    results[1] = NULL; /* the batch keeps it: rows point into it */
    load_rows(&r->batch, res);
    log_debug("claimed batch", "rows=%d first_id=%lld", r->batch.n, r->batch.rows[0].row.id);
    r->phase = PHASE_PRODUCING;
    ev_timer_set(&r->delivery_timer, (double)r->cfg->delivery_timeout_ms / 1000.0, 0);
    ev_timer_start(r->loop, &r->delivery_timer);
    produce_more(r);
}

/* Claims a batch when there is a reason to (wake_pending) and nothing stands in the way. */
static void try_claim(Relay *r)
{
    if (!r->wake_pending || r->phase != PHASE_IDLE || r->stopping || r->batch.n > 0 ||
        ev_is_active(&r->retry_timer) || !pg_conn_idle(r->pg))
        return;
    if (kafka_fatal(r->kafka)) {
        /* Every message of the old producer has been reported (the batch is empty). */
        char err[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_dup(r->kconf_template);
        kafka_producer_free(r->kafka, 0);
        r->kafka = kafka_producer_new(r->loop, conf, on_delivery, r, err, sizeof(err));
        if (!r->kafka) {
            log_error("cannot recreate the Kafka producer", "error=%s", err);
            r->exit_status = 1;
            stop_loop(r);
            return;
        }
    }
    r->wake_pending = false;
    ev_timer_again(r->loop, &r->poll_timer);

    char limit[24];
    snprintf(limit, sizeof(limit), "%ld", r->cfg->batch_size);
    const char *params[1] = {limit};
    PgQuery queries[2] = {{SQL_BEGIN, 0, NULL}, {SQL_CLAIM, 1, params}};
    r->phase = PHASE_CLAIMING;
    if (!pg_conn_send(r->pg, queries, 2, on_claimed, r))
        r->phase = PHASE_IDLE;
}

/* ---- events ------------------------------------------------------------------------------- */

static void on_listening(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Relay *r = arg;
    if (!results)
        return;
    if (error) {
        char q[512];
        log_warn("LISTEN failed; relying on the poll timer", "error=%s",
                 log_quote(error, q, sizeof(q)));
    }
    r->phase = PHASE_IDLE;
    if (r->stopping) {
        stop_loop(r);
        return;
    }
    r->wake_pending = true;
    try_claim(r);
}

static void on_pg_state(PgConn *pg, bool up, const char *reason, void *arg)
{
    Relay *r = arg;
    if (up) {
        PgQuery q = {SQL_LISTEN, 0, NULL};
        r->phase = PHASE_SETUP;
        if (!pg_conn_send(pg, &q, 1, on_listening, r))
            r->phase = PHASE_DOWN;
        return;
    }
    /* The transaction, if any, is rolled back by the server. Rows already handed to Kafka will be
     * claimed and sent again after the reconnect; consumers drop the duplicates. */
    Batch *b = &r->batch;
    r->phase = PHASE_DOWN;
    if (b->n > 0) {
        log_warn("batch abandoned with the connection; its rows will be sent again",
                 "rows=%d in_flight=%d", b->n, b->in_flight);
        b->abandoned = true;
        b->next = b->n;
        maybe_finish_batch(r);
    }
    if (r->stopping)
        stop_loop(r);
}

static void on_notify(PgConn *pg, const char *channel, void *arg)
{
    Relay *r = arg;
    r->wake_pending = true;
    try_claim(r);
}

static void on_poll_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    r->wake_pending = true;
    try_claim(r);
}

static void on_retry_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    r->wake_pending = true;
    try_claim(r);
}

static void on_shutdown_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    Batch *b = &r->batch;
    log_warn("shutdown timeout: marking what was acknowledged, the rest will be re-sent",
             "in_flight=%d", b->in_flight);
    if (r->phase == PHASE_PRODUCING && !b->abandoned) {
        /* Reports that arrive from now on are ignored: those rows stay unsent. */
        for (int i = 0; i < b->n; i++)
            if (b->rows[i].state == ROW_QUEUED)
                b->rows[i].state = ROW_PENDING;
        b->in_flight = 0;
        send_marks(r);
    } else {
        stop_loop(r);
    }
}

static void on_delivery_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    Batch *b = &r->batch;
    if (b->n == 0 || b->in_flight == 0)
        return;
    log_warn("delivery timeout: cancelling the rest of the batch, it will be retried",
             "in_flight=%d acked=%d timeout_ms=%ld", b->in_flight, b->acked,
             r->cfg->delivery_timeout_ms);
    b->timed_out = true;
    kafka_purge(r->kafka);
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    Relay *r = w->data;
    if (++r->signals > 1) {
        /* Second signal: leave now; the server rolls back the open transaction. */
        static const char msg[] = "level=warn msg=\"second signal, exiting immediately\"\n";
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)ignored;
        _exit(128 + w->signum);
    }
    log_info("shutting down", "signal=%s in_flight=%d", strsignal(w->signum), r->batch.in_flight);
    r->stopping = true;
    ev_timer_stop(loop, &r->poll_timer);
    ev_timer_stop(loop, &r->retry_timer);
    switch (r->phase) {
    case PHASE_DOWN:
    case PHASE_IDLE:
        stop_loop(r);
        break;
    case PHASE_PRODUCING:
        ev_timer_set(&r->shutdown_timer, (double)r->cfg->shutdown_timeout_ms / 1000.0, 0);
        ev_timer_start(loop, &r->shutdown_timer);
        produce_more(r); /* stops producing, marks at once if nothing is in flight */
        break;
    default:
        break; /* the request in flight finishes the cycle and sees `stopping` */
    }
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

Relay *relay_new(struct ev_loop *loop, const Config *cfg, rd_kafka_conf_t *kconf, char *err,
                 size_t errlen)
{
    Relay *r = calloc(1, sizeof(*r));
    if (!r) {
        rd_kafka_conf_destroy(kconf);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->loop = loop;
    r->cfg = cfg;
    r->batch.rows = calloc((size_t)cfg->batch_size, sizeof(BatchRow));
    r->kconf_template = rd_kafka_conf_dup(kconf);
    r->kafka = kafka_producer_new(loop, kconf, on_delivery, r, err, errlen);
    if (!r->kafka || !r->batch.rows) {
        if (!r->batch.rows)
            snprintf(err, errlen, "out of memory");
        kafka_producer_free(r->kafka, 0);
        rd_kafka_conf_destroy(r->kconf_template);
        free(r->batch.rows);
        free(r);
        return NULL;
    }
    backoff_init(&r->retry, RETRY_BASE_S, RETRY_CAP_S, 0);
    double poll_s = (double)cfg->poll_interval_ms / 1000.0;
    ev_init(&r->poll_timer, on_poll_timer);
    r->poll_timer.repeat = poll_s;
    r->poll_timer.data = r;
    ev_timer_again(loop, &r->poll_timer);
    ev_init(&r->retry_timer, on_retry_timer);
    r->retry_timer.data = r;
    ev_init(&r->delivery_timer, on_delivery_timer);
    r->delivery_timer.data = r;
    ev_init(&r->shutdown_timer, on_shutdown_timer);
    r->shutdown_timer.data = r;
    ev_signal_init(&r->sigterm, on_signal, SIGTERM);
    r->sigterm.data = r;
    ev_signal_start(loop, &r->sigterm);
    ev_signal_init(&r->sigint, on_signal, SIGINT);
    r->sigint.data = r;
    ev_signal_start(loop, &r->sigint);
    r->phase = PHASE_DOWN;
    return r;
}

int relay_run(Relay *r)
{
    r->pg = pg_conn_new(r->loop, r->cfg->database_url, on_pg_state, on_notify, r);
    ev_run(r->loop, 0);
    log_info("stopped", "sent=%llu failed_attempts=%llu", r->total_sent, r->total_failed);
    return r->exit_status;
}

void relay_free(Relay *r)
{
    if (!r)
        return;
    ev_timer_stop(r->loop, &r->poll_timer);
    ev_timer_stop(r->loop, &r->retry_timer);
    ev_timer_stop(r->loop, &r->shutdown_timer);
    ev_timer_stop(r->loop, &r->delivery_timer);
    ev_signal_stop(r->loop, &r->sigterm);
    ev_signal_stop(r->loop, &r->sigint);
    /* The producer goes first: its last delivery reports still point into the batch. */
    kafka_producer_free(r->kafka, 1000);
    pg_conn_free(r->pg);
    batch_clear(&r->batch);
    free(r->batch.rows);
    rd_kafka_conf_destroy(r->kconf_template);
    free(r->ids.s);
    free(r->fail_ids.s);
    free(r->fail_errors.s);
    free(r);
}
