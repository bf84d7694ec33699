#include "relay.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backoff.h"
#include "batch.h"
#include "kafka.h"
#include "lanes.h"
#include "log.h"
#include "metrics.h"
#include "pg.h"
#include "route.h"
#include "table.h"

#define WAKEUP_CHANNEL "outbox_relay"
/* After a batch in which nothing got through for a transient reason (Kafka down, say), wait
 * before claiming again. */
#define RETRY_BASE_S 0.5
#define RETRY_CAP_S 30.0
/* Dead events published to the dead-letter topic per batch, on top of batch-size. */
#define DEAD_LETTER_LIMIT 100

static const char *const SQL_LISTEN = "LISTEN " WAKEUP_CHANNEL;
static const char *const SQL_BEGIN = "BEGIN";
static const char *const SQL_COMMIT = "COMMIT";
static const char *const SQL_ROLLBACK = "ROLLBACK";
/* For the claim that follows, within its transaction: walk the unsent index in order instead of
 * collecting and sorting every unsent row. The planner picks the sort when the table has no
 * statistics yet (a new outbox until autovacuum first analyzes it, up to a minute after its first
 * rows); each claim then reads the whole backlog (measured: 200-675 ms instead of 1.4 ms a claim
 * at 200,000 unsent rows). Test 31 keeps it so. */
static const char *const SQL_CLAIM_PLAN =
    "SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true)";

/* The statements on the outbox table are templates: relay/table.h expands the {placeholders} to
 * the configured table and columns when the connection is up.
 *
 * The claim: unsent rows of the lanes this relay owns ($2), in seq order, that are not waiting for
 * a retry and whose aggregate has no earlier row that is waiting (or, with the hold policy, dead):
 * an aggregate's events never overtake one another. The held-back set comes from the small
 * partial index on failed rows, so it costs nothing while nothing fails. Its columns are
 * TABLE_ROW_COLUMNS (relay/table.h). */
/* clang-format would split the macro calls inside the string concatenations. */
/* clang-format off */
#define SQL_CLAIM(blocked_condition)                                                               \
    "WITH blocked AS ("                                                                            \
    " SELECT o.{aggregate_type} AS agg_type, o.{aggregate_id} AS agg_id,"                          \
    " min(o.{seq}) AS first_seq"                                                                   \
    " FROM {table} o WHERE o.sent_at IS NULL AND o.attempts > 0 AND o.lane = ANY($2::smallint[])"  \
    " AND " blocked_condition " GROUP BY 1, 2)"                                                    \
    " SELECT" TABLE_ROW_COLUMNS("NULL::text") " FROM {table} o"                                    \
    " WHERE o.sent_at IS NULL AND o.dead_at IS NULL AND o.lane = ANY($2::smallint[])"              \
    " AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())"                               \
    " AND NOT EXISTS (SELECT 1 FROM blocked b WHERE b.agg_type = o.{aggregate_type}"               \
    " AND b.agg_id = o.{aggregate_id} AND b.first_seq < o.{seq})"                                  \
    " ORDER BY o.{seq} LIMIT $1 FOR UPDATE OF o SKIP LOCKED"

/* Dead events not yet published to the dead-letter topic. */
#define SQL_CLAIM_DEAD_LETTER                                                                      \
    "SELECT" TABLE_ROW_COLUMNS("o.last_error") " FROM {table} o"                                   \
    " WHERE o.dead_at IS NOT NULL AND o.sent_at IS NULL AND o.dead_letter_topic IS NULL"           \
    " AND o.lane = ANY($2::smallint[])"                                                            \
    " AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())"                               \
    " ORDER BY o.{seq} LIMIT $1 FOR UPDATE SKIP LOCKED"
/* clang-format on */

enum {
    SQL_CLAIM_HOLD,
    SQL_CLAIM_SKIP,
    SQL_CLAIM_DEAD,
    SQL_MARK_SENT,
    SQL_MARK_FAILED,
    SQL_MARK_DEAD_LETTERED,
    SQL_MARK_DEAD_LETTER_FAILED,
    SQL_COUNT
};
static const char *const sql_templates[SQL_COUNT] = {
    [SQL_CLAIM_HOLD] = SQL_CLAIM("(o.next_attempt_at > now() OR o.dead_at IS NOT NULL)"),
    [SQL_CLAIM_SKIP] = SQL_CLAIM("o.next_attempt_at > now() AND o.dead_at IS NULL"),
    [SQL_CLAIM_DEAD] = SQL_CLAIM_DEAD_LETTER,
    [SQL_MARK_SENT] =
        "UPDATE {table} SET sent_at = clock_timestamp() WHERE {seq} = ANY($1::bigint[])",
    /* Times are clock_timestamp(), not now(): now() is when the claim transaction began, and a
     * retry wait counted from there could already be over when the failure is recorded. Every
     * failure counts an attempt and waits before the next one: transient failures 1 s doubling to
     * 30 s, rejections --retry-backoff doubling to --retry-backoff-max, both with jitter. The
     * max-attempts-th rejection dead-letters the event. SET expressions see the old row. */
    [SQL_MARK_FAILED] =
        "UPDATE {table} AS o SET attempts = o.attempts + 1,"
        " rejections = o.rejections + f.permanent::int, last_error = f.error,"
        " dead_at = CASE WHEN f.permanent AND o.rejections + 1 >= $4::int"
        " THEN clock_timestamp() END,"
        " next_attempt_at = CASE WHEN f.permanent AND o.rejections + 1 >= $4::int THEN NULL"
        " ELSE clock_timestamp() + make_interval(secs => (0.5 + random() / 2) * CASE WHEN"
        " f.permanent THEN least($5::float8 * 2 ^ least(o.rejections, 30), $6::float8)"
        " ELSE least(2 ^ least(o.attempts - o.rejections, 30), 30) END) END"
        " FROM unnest($1::bigint[], $2::text[], $3::bool[]) AS f(id, error, permanent)"
        " WHERE o.{seq} = f.id RETURNING o.{seq}, o.{event_id}, o.{aggregate_type},"
        " o.{aggregate_id}, o.dead_at IS NOT NULL",
    [SQL_MARK_DEAD_LETTERED] =
        "UPDATE {table} SET dead_letter_topic = $2 WHERE {seq} = ANY($1::bigint[])",
    [SQL_MARK_DEAD_LETTER_FAILED] =
        "UPDATE {table} AS o SET last_error = 'dead-letter publish failed: ' || f.error,"
        " next_attempt_at = clock_timestamp() + interval '30 seconds'"
        " FROM unnest($1::bigint[], $2::text[]) AS f(id, error) WHERE o.{seq} = f.id",
};

/* Going to sleep (see migrations/0004_wakeup_when_asleep.sql): set this relay's sleeping flag,
 * but only with the wakeup lock taken without waiting, i.e. while no producer that read the flag
 * before is still uncommitted. No row back means the lock was busy: check again shortly. */
#define WAKEUP_LOCK_NS "1331849731"
static const char *const SQL_SLEEP =
    "INSERT INTO outbox_wakeup_state (slot, sleeping) SELECT $1::int, true"
    " WHERE pg_try_advisory_xact_lock(" WAKEUP_LOCK_NS ")"
    " ON CONFLICT (slot) DO UPDATE SET sleeping = true RETURNING slot";
static const char *const SQL_LEAVE = "DELETE FROM outbox_wakeup_state WHERE slot = $1::int";
static const char *const SQL_AWAKE =
    "UPDATE outbox_wakeup_state SET sleeping = false WHERE slot = $1::int AND sleeping";
/* Rows of relays that are gone (their member slot lock is not held) would keep producers
 * notifying for nothing. */
static const char *const SQL_FORGET_GONE_SLEEPERS =
    "DELETE FROM outbox_wakeup_state w WHERE NOT EXISTS (SELECT 1 FROM pg_locks l"
    " WHERE l.locktype = 'advisory' AND l.classid = " LANES_MEMBER_LOCK_NS "::oid"
    " AND l.objid = w.slot::oid AND l.objsubid = 2 AND l.granted"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))";

typedef enum {
    PHASE_DOWN,        /* no PostgreSQL connection */
    PHASE_SETUP,       /* LISTEN in flight */
    PHASE_IDLE,        /* no transaction open */
    PHASE_REBALANCING, /* lane ownership queries in flight */
    PHASE_CLAIMING,    /* BEGIN + claim in flight */
    PHASE_PRODUCING,   /* rows claimed, waiting for delivery reports */
    PHASE_MARKING,     /* marks + COMMIT in flight */
    PHASE_ENDING,      /* COMMIT or ROLLBACK of a transaction that marks nothing */
} Phase;

struct Relay {
    struct ev_loop *loop;
    const Config *cfg;
    rd_kafka_conf_t *kconf_template; /* kept to recreate the producer after a fatal error */
    KafkaProducer *kafka;
    PgConn *pg;
    Lanes lanes;
    Phase phase;
    Batch batch;
    BatchMarks marks;
    char *sql[SQL_COUNT];   /* the templates expanded for the configured table */
    int claim_stmt;         /* SQL_CLAIM_HOLD or SQL_CLAIM_SKIP */
    int failed_stmt;        /* index of SQL_MARK_FAILED in the mark pipeline, -1 if not sent */
    int awake_stmt;         /* index of SQL_AWAKE in the mark pipeline, -1 if not sent */
    bool wake_pending;      /* there may be rows to claim */
    bool rebalance_due;     /* lane ownership should be checked before the next claim */
    bool asleep;            /* this relay's sleeping flag is set: producers notify it */
    bool forget_gone_due;   /* membership changed: clean up sleeping flags of gone relays */
    char slot_text[16];     /* member slot as a query parameter */
    bool left;              /* shutting down: the sleeping flag row was (being) removed */
    ev_tstamp last_rows_at; /* when a claim last returned rows */
    ev_tstamp claim_sent_at, marks_sent_at; /* of the current batch, for the debug log */
    bool stopping;
    int signals;
    int exit_status;
    Backoff retry;
    bool claim_error_logged;
    int logged_owned;       /* lane count last logged, to log only changes */
    int logged_members;     /* member count at the last rebalance */
    char last_failure[256]; /* error of the last batch that had failures, "" once one had none */
    ev_timer poll_timer;
    ev_timer retry_timer;
    ev_timer busy_timer; /* re-check soon when producers kept us from going to sleep */
    ev_timer rebalance_timer;
    ev_timer shutdown_timer;
    ev_timer delivery_timer; /* bounds a batch's wait for acknowledgements */
    ev_signal sigterm, sigint;
    unsigned long long total_sent, total_failed, total_dead, order_breaks;
};

static void step(Relay *r);
static void go_to_sleep(Relay *r);
static void send_marks(Relay *r);

static void on_left(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Relay *r = arg;
    ev_timer_stop(r->loop, &r->shutdown_timer);
    ev_break(r->loop, EVBREAK_ALL);
}

/* Ends the loop. On the way out, the relay removes its sleeping flag (when the connection is
 * there to do it, within a second): a flag left set would make producers notify for nobody. */
static void stop_loop(Relay *r)
{
    ev_timer_stop(r->loop, &r->shutdown_timer);
    if (!r->left && r->slot_text[0] && pg_conn_idle(r->pg)) {
        const char *params[1] = {r->slot_text};
        PgQuery q = {SQL_LEAVE, 1, params};
        r->left = true;
        if (pg_conn_send(r->pg, &q, 1, on_left, r)) {
            ev_timer_set(&r->shutdown_timer, 1.0, 0);
            ev_timer_start(r->loop, &r->shutdown_timer);
            return;
        }
    }
    ev_break(r->loop, EVBREAK_ALL);
}

static void schedule_retry(Relay *r)
{
    double delay = backoff_next(&r->retry);
    ev_timer_stop(r->loop, &r->retry_timer);
    ev_timer_set(&r->retry_timer, delay, 0);
    ev_timer_start(r->loop, &r->retry_timer);
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
        step(r);
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

/* Logs every event the last mark dead-lettered (rows of SQL_MARK_FAILED's RETURNING). */
static void log_dead_lettered(Relay *r, PGresult *res)
{
    for (int i = 0; res && i < PQntuples(res); i++) {
        if (strcmp(PQgetvalue(res, i, 4), "t") != 0)
            continue;
        r->total_dead++;
        metrics_dead_lettered();
        char q[300];
        log_warn(r->cfg->on_poison == POISON_HOLD
                     ? "event dead-lettered; later events of its aggregate are held until it is "
                       "requeued"
                     : "event dead-lettered; later events of its aggregate go on without it",
                 "id=%s event_id=%s aggregate_type=%s aggregate_id=%s", PQgetvalue(res, i, 0),
                 PQgetvalue(res, i, 1), log_quote(PQgetvalue(res, i, 2), q, 150),
                 log_quote(PQgetvalue(res, i, 3), q + 150, 150));
    }
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
    if (r->failed_stmt >= 0 && r->failed_stmt < n)
        log_dead_lettered(r, results[r->failed_stmt]);

    bool transient_failure = false;
    for (int i = 0; i < b->n; i++)
        if (b->rows[i].state == ROW_FAILED && !b->rows[i].permanent)
            transient_failure = true;
    r->total_sent += (unsigned long long)b->acked;
    r->total_failed += (unsigned long long)b->failed;
    metrics_batch_committed();
    ev_now_update(r->loop);
    log_debug("batch committed",
              "rows=%d sent=%d failed=%d claim_ms=%.2f deliver_ms=%.2f mark_ms=%.2f", b->n,
              b->acked, b->failed, (b->claimed_at - r->claim_sent_at) * 1e3,
              (r->marks_sent_at - b->claimed_at) * 1e3, (ev_now(r->loop) - r->marks_sent_at) * 1e3);
    if (r->awake_stmt >= 0)
        r->asleep = false;
    bool nothing_through = b->acked == 0 && transient_failure;
    batch_clear(b);
    r->phase = PHASE_IDLE;

    if (r->stopping) {
        stop_loop(r);
        return;
    }
    if (nothing_through) {
        schedule_retry(r);
        return;
    }
    backoff_reset(&r->retry);
    /* Claim again at once: producers do not notify an awake relay, so only an empty claim may
     * end the cycle (and then the relay goes to sleep, see go_to_sleep). */
    r->wake_pending = true;
    step(r);
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
              "failed=%d sent=%d first_id=%lld first_event_id=%s permanent=%s error=%s", b->failed,
              b->acked, first_failed->row.id, first_failed->row.event_id,
              first_failed->permanent ? "true" : "false", log_quote(error, q, sizeof(q)));
    snprintf(r->last_failure, sizeof(r->last_failure), "%s", error);
}

static void send_marks(Relay *r)
{
    Batch *b = &r->batch;
    BatchMarks *m = &r->marks;
    ev_timer_stop(r->loop, &r->delivery_timer);
    log_batch_failures(r, batch_marks(b, m));
    r->order_breaks += (unsigned long long)batch_order_breaks(b);

    char max_attempts[24], backoff[32], backoff_max[32];
    snprintf(max_attempts, sizeof(max_attempts), "%ld", r->cfg->max_attempts);
    snprintf(backoff, sizeof(backoff), "%.3f", (double)r->cfg->retry_backoff_ms / 1000.0);
    snprintf(backoff_max, sizeof(backoff_max), "%.3f",
             (double)r->cfg->retry_backoff_max_ms / 1000.0);
    const char *sent[1] = {m->sent.s};
    const char *failed[6] = {
        m->failed_ids.s, m->failed_errors.s, m->failed_permanent.s, max_attempts,
        backoff,         backoff_max};
    const char *dl_sent[2] = {m->dl_sent.s, r->cfg->dead_letter_topic};
    const char *dl_failed[2] = {m->dl_failed_ids.s, m->dl_failed_errors.s};

    const char *awake[1] = {r->slot_text};
    PgQuery queries[6];
    int nq = 0;
    r->failed_stmt = -1;
    r->awake_stmt = -1;
    if (r->asleep) {
        r->awake_stmt = nq;
        queries[nq++] = (PgQuery){SQL_AWAKE, 1, awake};
    }
    if (!strbuf_array_empty(&m->sent))
        queries[nq++] = (PgQuery){r->sql[SQL_MARK_SENT], 1, sent};
    if (!strbuf_array_empty(&m->failed_ids)) {
        r->failed_stmt = nq;
        queries[nq++] = (PgQuery){r->sql[SQL_MARK_FAILED], 6, failed};
    }
    if (!strbuf_array_empty(&m->dl_sent))
        queries[nq++] = (PgQuery){r->sql[SQL_MARK_DEAD_LETTERED], 2, dl_sent};
    if (!strbuf_array_empty(&m->dl_failed_ids))
        queries[nq++] = (PgQuery){r->sql[SQL_MARK_DEAD_LETTER_FAILED], 2, dl_failed};
    queries[nq++] = (PgQuery){SQL_COMMIT, 0, NULL};
    r->phase = PHASE_MARKING;
    ev_now_update(r->loop);
    r->marks_sent_at = ev_now(r->loop);
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
            step(r);
        }
        return;
    }
    if (r->phase == PHASE_PRODUCING && b->next >= b->n && b->in_flight == 0)
        send_marks(r);
}

/* Produces a dead event to the dead-letter topic, with why it died in the headers. A payload too
 * large for Kafka (a common reason to die) is left out rather than failing again. */
static rd_kafka_resp_err_t produce_dead_letter(Relay *r, BatchRow *br)
{
    const OutboxRow *row = &br->row;
    char topic[ROUTE_TOPIC_MAX + 1], why[256];
    if (!route_topic(r->cfg->topic_template, row, topic, sizeof(topic), why, sizeof(why)))
        topic[0] = '\0';
    rd_kafka_headers_t *hdrs = route_dead_letter_headers(row, r->cfg->map.identity_headers,
                                                         br->last_error, br->attempts, topic);
    rd_kafka_resp_err_t err =
        kafka_produce(r->kafka, r->cfg->dead_letter_topic, row->aggregate_id,
                      strlen(row->aggregate_id), row->payload, row->payload_len, hdrs, br);
    if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        rd_kafka_header_add(hdrs, "dlq.payload_omitted", -1, "true", -1);
        err = kafka_produce(r->kafka, r->cfg->dead_letter_topic, row->aggregate_id,
                            strlen(row->aggregate_id), NULL, 0, hdrs, br);
    }
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        rd_kafka_headers_destroy(hdrs);
    return err;
}

/* Produces one event row. Returns the producer's answer; failures that happen before the
 * producer (topic, headers) are recorded here and reported as NO_ERROR with the row FAILED. */
static rd_kafka_resp_err_t produce_event(Relay *r, BatchRow *br)
{
    const OutboxRow *row = &br->row;
    char topic[ROUTE_TOPIC_MAX + 1], why[512];
    if (!route_topic(r->cfg->topic_template, row, topic, sizeof(topic), why, sizeof(why))) {
        batch_fail(&r->batch, br, why, true);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    rd_kafka_headers_t *hdrs = route_headers(row, r->cfg->map.identity_headers, why, sizeof(why));
    if (!hdrs) {
        batch_fail(&r->batch, br, why, true);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    rd_kafka_resp_err_t err =
        kafka_produce(r->kafka, topic, row->aggregate_id, strlen(row->aggregate_id), row->payload,
                      row->payload_len, hdrs, br);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        rd_kafka_headers_destroy(hdrs);
    if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        /* librdkafka's text says "Broker:" but no broker saw it: say what actually happened. */
        snprintf(why, sizeof(why),
                 "payload too large: %zu bytes, over the producer's message.max.bytes (not sent)",
                 row->payload_len);
        batch_fail(&r->batch, br, why, true);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    return err;
}

static void produce_more(Relay *r)
{
    Batch *b = &r->batch;
    while (b->next < b->n && !r->stopping && !b->timed_out) {
        BatchRow *br = &b->rows[b->next];
        if (!br->dead_letter && batch_is_held(b, &br->row)) {
            b->next++; /* an earlier event of its aggregate failed: it waits for the retry */
            continue;
        }
        rd_kafka_resp_err_t err =
            br->dead_letter ? produce_dead_letter(r, br) : produce_event(r, br);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && b->in_flight > 0)
            break; /* backpressure: on_delivery resumes once reports free room */
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
            batch_fail(b, br, rd_kafka_err2str(err), kafka_error_permanent(err));
        else if (br->state == ROW_PENDING) {
            br->state = ROW_QUEUED;
            b->in_flight++;
        }
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
    b->in_flight--;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        br->state = ROW_ACKED;
        b->acked++;
        metrics_row_acked(r->cfg->topic_template, b, br, ev_now(r->loop));
    } else if (b->timed_out && (err == RD_KAFKA_RESP_ERR__PURGE_QUEUE ||
                                err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)) {
        char why[128];
        snprintf(why, sizeof(why), "not acknowledged within the delivery timeout (%ld ms)",
                 r->cfg->delivery_timeout_ms);
        batch_fail(b, br, why, false);
    } else {
        batch_fail(b, br, rd_kafka_err2str(err), kafka_error_permanent(err));
    }
    if (r->phase == PHASE_PRODUCING && b->next < b->n)
        produce_more(r);
    else
        maybe_finish_batch(r);
}

/* ---- claiming ----------------------------------------------------------------------------- */

static void on_sleep_attempt(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Relay *r = arg;
    if (!results)
        return;
    r->phase = PHASE_IDLE;
    PGresult *sleep = results[n - 1];
    if (error || PQresultStatus(sleep) != PGRES_TUPLES_OK) {
        char q[512];
        log_warn("could not set the sleeping flag; polling instead", "error=%s",
                 log_quote(error ? error : "unexpected result", q, sizeof(q)));
        schedule_retry(r);
    } else if (PQntuples(sleep) == 1) {
        /* Flag set: one final claim catches what producers committed before they could see it;
         * from then on they notify. */
        r->asleep = true;
        r->forget_gone_due = false;
        r->wake_pending = true;
    } else {
        /* A producer is mid-transaction after reading the flag: look again very soon. */
        ev_timer_set(&r->busy_timer, (double)r->cfg->busy_poll_interval_ms / 1000.0, 0);
        ev_timer_start(r->loop, &r->busy_timer);
    }
    if (r->stopping)
        stop_loop(r);
    else
        step(r);
}

/* An empty claim: end its transaction and try to go to sleep, in one round trip. */
static void go_to_sleep(Relay *r)
{
    const char *params[1] = {r->slot_text};
    PgQuery queries[3] = {{SQL_COMMIT, 0, NULL}};
    int nq = 1;
    if (r->forget_gone_due)
        queries[nq++] = (PgQuery){SQL_FORGET_GONE_SLEEPERS, 0, NULL};
    queries[nq++] = (PgQuery){SQL_SLEEP, 1, params};
    r->phase = PHASE_ENDING;
    if (!pg_conn_send(r->pg, queries, nq, on_sleep_attempt, r))
        pg_conn_reset(r->pg, "connection busy while going to sleep");
}

static void on_claimed(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Relay *r = arg;
    char q[512];
    if (!results)
        return;
    if (error || n < 3) {
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

    /* BEGIN, [dead-letter claim], planner settings, claim: see claim() */
    int events_at = n - 1, dead_at = n > 3 ? 1 : -1;
    int events = PQntuples(results[events_at]);
    int dead = dead_at > 0 ? PQntuples(results[dead_at]) : 0;
    if (events + dead == 0 && !r->stopping && !r->asleep) {
        if (ev_now(r->loop) - r->last_rows_at >= (double)r->cfg->sleep_after_ms / 1000.0) {
            go_to_sleep(r);
            return;
        }
        /* Work came recently: stay awake and poll, so a steady stream never pays for NOTIFY. */
        ev_timer_set(&r->busy_timer, (double)r->cfg->busy_poll_interval_ms / 1000.0, 0);
        ev_timer_start(r->loop, &r->busy_timer);
        end_transaction(r, SQL_COMMIT);
        return;
    }
    if (events + dead > 0)
        r->last_rows_at = ev_now(r->loop);
    if (events + dead == 0 || r->stopping) {
        end_transaction(r, SQL_COMMIT); /* asleep already: that was the final check */
        return;
    }
    /* The batch keeps the results: its rows point into them. */
    batch_load(&r->batch, results[events_at], dead_at > 0 ? results[dead_at] : NULL);
    r->batch.claimed_at = ev_now(r->loop);
    results[events_at] = NULL;
    if (dead_at > 0)
        results[dead_at] = NULL;
    log_debug("claimed batch", "rows=%d dead_letter=%d first_id=%lld", events, dead,
              r->batch.rows[0].row.id);
    r->phase = PHASE_PRODUCING;
    ev_timer_set(&r->delivery_timer, (double)r->cfg->delivery_timeout_ms / 1000.0, 0);
    ev_timer_start(r->loop, &r->delivery_timer);
    produce_more(r);
}

static void claim(Relay *r)
{
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
        log_info("kafka producer recreated", NULL);
    }
    r->wake_pending = false;
    ev_timer_again(r->loop, &r->poll_timer);

    char limit[24], dead_limit[24];
    long batch_size = r->cfg->batch_size; /* may have grown on SIGHUP: make room between batches */
    if (!batch_reserve(&r->batch, (int)batch_size + DEAD_LETTER_LIMIT))
        batch_size = r->batch.capacity - DEAD_LETTER_LIMIT;
    snprintf(limit, sizeof(limit), "%ld", batch_size);
    snprintf(dead_limit, sizeof(dead_limit), "%d", DEAD_LETTER_LIMIT);
    const char *params[2] = {limit, r->lanes.owned_array.s};
    const char *dead_params[2] = {dead_limit, r->lanes.owned_array.s};
    /* The dead-letter claim comes before the planner settings: it is planned as usual. */
    PgQuery queries[4] = {{SQL_BEGIN, 0, NULL}};
    int nq = 1;
    if (r->cfg->dead_letter_topic)
        queries[nq++] = (PgQuery){r->sql[SQL_CLAIM_DEAD], 2, dead_params};
    queries[nq++] = (PgQuery){SQL_CLAIM_PLAN, 0, NULL};
    queries[nq++] = (PgQuery){r->sql[r->claim_stmt], 2, params};
    r->phase = PHASE_CLAIMING;
    r->claim_sent_at = ev_now(r->loop);
    if (!pg_conn_send(r->pg, queries, nq, on_claimed, r))
        r->phase = PHASE_IDLE;
}

static void on_rebalanced(Lanes *lanes, bool ok, void *arg)
{
    Relay *r = arg;
    r->phase = PHASE_IDLE;
    r->rebalance_due = false;
    if (lanes->n_owned != r->logged_owned)
        log_info("lanes owned", "lanes=%d of=%d members=%d slot=%d", lanes->n_owned, LANE_COUNT,
                 lanes->members, lanes->slot);
    r->logged_owned = lanes->n_owned;
    if (lanes->members != r->logged_members)
        r->forget_gone_due = true;
    r->logged_members = lanes->members;
    snprintf(r->slot_text, sizeof(r->slot_text), "%d", lanes->slot);
    if (lanes->gained)
        r->wake_pending = true; /* new lanes may hold a backlog */
    if (r->stopping)
        stop_loop(r);
    else
        step(r);
}

/* Does whatever comes next between batches: a due rebalance first, then a claim when there is a
 * reason to claim (wake_pending) and nothing stands in the way. */
static void step(Relay *r)
{
    if (r->phase != PHASE_IDLE || r->stopping || r->batch.n > 0 || !pg_conn_idle(r->pg))
        return;
    if (r->rebalance_due) {
        r->phase = PHASE_REBALANCING;
        if (!lanes_rebalance(&r->lanes, r->pg, on_rebalanced, r))
            r->phase = PHASE_IDLE;
        return;
    }
    if (r->wake_pending && r->lanes.n_owned > 0 && !ev_is_active(&r->retry_timer))
        claim(r);
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
    r->rebalance_due = true;
    step(r);
}

static void on_pg_state(PgConn *pg, bool up, const char *reason, void *arg)
{
    Relay *r = arg;
    if (up && !r->sql[0]) {
        /* Quoting follows the connection's encoding, so the statements are written now. */
        char err[256];
        if (!table_sql_all(&r->cfg->map, pg_conn_libpq(pg), sql_templates, r->sql, SQL_COUNT, err,
                           sizeof(err))) {
            log_error("cannot write the relay's statements", "error=%s", err);
            r->exit_status = 1;
            stop_loop(r);
            return;
        }
    }
    if (up) {
        PgQuery q = {SQL_LISTEN, 0, NULL};
        r->phase = PHASE_SETUP;
        if (!pg_conn_send(pg, &q, 1, on_listening, r))
            r->phase = PHASE_DOWN;
        return;
    }
    /* The session is gone, and with it the open transaction and every lane this relay owned:
     * other relays take the lanes over. Rows already handed to Kafka are sent again by whoever
     * claims them next; consumers drop the duplicates. */
    Batch *b = &r->batch;
    r->phase = PHASE_DOWN;
    lanes_reset(&r->lanes);
    /* The flag row may still say sleeping under the old slot; the next sleep cleans it up. */
    r->asleep = false;
    r->forget_gone_due = true;
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
    step(r);
}

/* The poll, busy and retry timers: there may be rows to claim. */
static void on_wake_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    r->wake_pending = true;
    step(r);
}

static void on_rebalance_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    r->rebalance_due = true;
    step(r);
}

static void on_shutdown_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    Batch *b = &r->batch;
    if (r->left) {
        ev_break(loop, EVBREAK_ALL); /* removing the sleeping flag took too long */
        return;
    }
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
    /* Like log_batch_failures: loud once per streak of failing batches, then debug. */
    log_write(r->last_failure[0] ? LOG_DEBUG : LOG_WARN,
              "delivery timeout: cancelling the rest of the batch, it will be retried",
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
    ev_timer_stop(loop, &r->rebalance_timer);
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

static void timer_init(Relay *r, ev_timer *t, void (*cb)(struct ev_loop *, ev_timer *, int))
{
    ev_init(t, cb);
    t->data = r;
}

Relay *relay_new(struct ev_loop *loop, const Config *cfg, rd_kafka_conf_t *kconf, char *err,
                 size_t errlen)
{
    Relay *r = calloc(1, sizeof(*r));
    if (!r || !batch_init(&r->batch, (int)cfg->batch_size + DEAD_LETTER_LIMIT)) {
        if (r)
            batch_free(&r->batch);
        free(r);
        rd_kafka_conf_destroy(kconf);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->loop = loop;
    r->cfg = cfg;
    r->claim_stmt = cfg->on_poison == POISON_HOLD ? SQL_CLAIM_HOLD : SQL_CLAIM_SKIP;
    r->kconf_template = rd_kafka_conf_dup(kconf);
    r->kafka = kafka_producer_new(loop, kconf, on_delivery, r, err, errlen);
    if (!r->kafka) {
        rd_kafka_conf_destroy(r->kconf_template);
        batch_free(&r->batch);
        free(r);
        return NULL;
    }
    lanes_init(&r->lanes);
    r->logged_owned = -1;
    r->forget_gone_due = true; /* flags left by relays that crashed before this one started */
    backoff_init(&r->retry, RETRY_BASE_S, RETRY_CAP_S, 0);
    timer_init(r, &r->poll_timer, on_wake_timer);
    r->poll_timer.repeat = (double)cfg->poll_interval_ms / 1000.0;
    ev_timer_again(loop, &r->poll_timer);
    timer_init(r, &r->rebalance_timer, on_rebalance_timer);
    r->rebalance_timer.repeat = (double)cfg->rebalance_interval_ms / 1000.0;
    ev_timer_again(loop, &r->rebalance_timer);
    timer_init(r, &r->retry_timer, on_wake_timer);
    timer_init(r, &r->busy_timer, on_wake_timer);
    timer_init(r, &r->delivery_timer, on_delivery_timer);
    timer_init(r, &r->shutdown_timer, on_shutdown_timer);
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
    log_info("stopped", "sent=%llu failed_attempts=%llu dead_lettered=%llu order_breaks=%llu",
             r->total_sent, r->total_failed, r->total_dead, r->order_breaks);
    return r->exit_status;
}

void relay_status(const Relay *r, RelayStatus *out)
{
    out->postgres_up = r->pg && pg_conn_up(r->pg);
    out->kafka_up = r->kafka && kafka_up(r->kafka);
    out->stopping = r->stopping;
    out->lanes_owned = r->lanes.n_owned;
    out->members = r->lanes.members;
}

void relay_free(Relay *r)
{
    if (!r)
        return;
    ev_timer_stop(r->loop, &r->poll_timer);
    ev_timer_stop(r->loop, &r->retry_timer);
    ev_timer_stop(r->loop, &r->busy_timer);
    ev_timer_stop(r->loop, &r->rebalance_timer);
    ev_timer_stop(r->loop, &r->shutdown_timer);
    ev_timer_stop(r->loop, &r->delivery_timer);
    ev_signal_stop(r->loop, &r->sigterm);
    ev_signal_stop(r->loop, &r->sigint);
    /* The producer goes first: its last delivery reports still point into the batch. */
    kafka_producer_free(r->kafka, 1000);
    pg_conn_free(r->pg);
    batch_free(&r->batch);
    batch_marks_free(&r->marks);
    lanes_free(&r->lanes);
    rd_kafka_conf_destroy(r->kconf_template);
    for (int i = 0; i < SQL_COUNT; i++)
        free(r->sql[i]);
    free(r);
}
