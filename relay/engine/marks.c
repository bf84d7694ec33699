/* marks: recording a batch's outcome and committing, or, when that fails, row by row. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"
#include "monotime.h"
#include "metrics.h"
#include "sqlstate.h"

static void record_next_row(Session *s);
static void send_mark_statements(Session *s, bool commit, const ClaimRequest *next, PgResultFn cb);

/* ---- marking ------------------------------------------------------------------------------ */

/* Logs every event the last mark dead-lettered (rows of SQL_MARK_FAILED's RETURNING). */
static void log_dead_lettered(Session *s, PGresult *res)
{
    for (int i = 0; res && i < PQntuples(res); i++) {
        if (strcmp(PQgetvalue(res, i, 4), "t") != 0)
            continue;
        s->total_dead++;
        metrics_dead_lettered();
        char q[450]; /* event ids of adopted tables are text anyone writing the outbox chooses */
        log_warn(s->cfg->on_poison == POISON_HOLD
                     ? "event dead-lettered; later events of its aggregate are held until it is "
                       "requeued"
                     : "event dead-lettered; later events of its aggregate go on without it",
                 "id=%s event_id=%s aggregate_type=%s aggregate_id=%s", PQgetvalue(res, i, 0),
                 log_quote(PQgetvalue(res, i, 1), q + 300, 150),
                 log_quote(PQgetvalue(res, i, 2), q, 150),
                 log_quote(PQgetvalue(res, i, 3), q + 150, 150));
    }
}

/* Counts the batch whose outcome is recorded (or given up) and lets go of it. */
static void count_and_clear_batch(Session *s)
{
    Batch *b = &s->batch;
    s->total_sent += (unsigned long long)b->acked;
    s->total_failed += (unsigned long long)b->failed;
    metrics_batch_committed();
    batch_clear(b);
}

/* The batch's outcome is recorded (or given up): on with the next batch, after the retry backoff
 * when nothing got through or something could not be recorded. */
static void finish_batch(Session *s, bool retry)
{
    count_and_clear_batch(s);
    session_set_phase(s, PHASE_IDLE);
    if (s->stopping) {
        session_finish_stopping(s);
        return;
    }
    if (retry) {
        session_schedule_retry(s);
        return;
    }
    backoff_reset(&s->retry);
    s->mark_retries = 0;
    /* Claim again at once: producers do not notify an awake relay, so only an empty claim may
     * end the cycle (and then the relay goes to sleep, see wakeup_go_to_sleep). */
    s->wake_pending = true;
    session_start_next_request(s);
}

/* A failure to record an outcome is logged once per distinct error, then at debug level: a
 * table that refuses a mark (a trigger, a constraint) would otherwise log every batch. */
static void log_mark_error(Session *s, const char *what, const BatchRow *br, const char *error)
{
    char q[512];
    LogLevel level = strcmp(error, s->last_mark_error) == 0 ? LOG_DEBUG : LOG_ERROR;
    if (br)
        log_write(level, what, "error=%s id=%lld rows=%d session=%d",
                  log_quote(error, q, sizeof(q)), br->row.id, s->batch.n, s->index);
    else
        log_write(level, what, "error=%s rows=%d session=%d", log_quote(error, q, sizeof(q)),
                  s->batch.n, s->index);
    snprintf(s->last_mark_error, sizeof(s->last_mark_error), "%s", error);
}

/* Whether a failed statement failed because of the row itself — data it could not take
 * (class 22), a constraint (23), a trigger's or rule's RAISE (P0): sqlstate.h — rather than
 * something passing (a deadlock, a timeout, resources, a shutdown) or the setup (privileges, a
 * missing object), after which the row is left to be re-sent instead of being counted against
 * it: a revoked grant must never dead-letter events that were delivered. */
static bool refused_by_the_row(PGresult **results, int n)
{
    return sqlstate_fault(pg_failed_sqlstate(results, n)) == SQLSTATE_FAULT_ROW;
}

static void on_row_recorded(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Session *s = arg;
    Batch *b = &s->batch;
    if (!results)
        return; /* connection lost: the batch is abandoned (on_pg_state) */
    BatchRow *br = &b->rows[s->salvage_row];
    if (error) {
        log_mark_error(s, "recording a row's outcome failed", br, error);
        if (br->state == ROW_ACKED && refused_by_the_row(results, n)) {
            char why[512];
            snprintf(why, sizeof(why), "delivered, but marking it sent failed: %s", error);
            b->acked--;
            batch_fail(b, br, why, true);
            record_next_row(s); /* the same row, now as a failure */
            return;
        }
        const char *state = pg_failed_sqlstate(results, n);
        if (sqlstate_fault(state) == SQLSTATE_FAULT_SETUP)
            session_setup_failed(s, "recording a row", state, error);
        s->salvage_unrecorded++; /* claimed and published again after the retry backoff */
    } else if (br->state == ROW_FAILED && !br->dead_letter && s->failed_stmt >= 0 &&
               s->failed_stmt < n) {
        log_dead_lettered(s, results[s->failed_stmt]);
    }
    s->salvage_row++;
    record_next_row(s);
}

static void record_next_row(Session *s)
{
    Batch *b = &s->batch;
    if (s->stopping) {
        /* Shutting down: what is not recorded yet is sent again later (duplicates, no loss). */
        finish_batch(s, true);
        return;
    }
    while (s->salvage_row < b->n && !batch_row_recorded(&b->rows[s->salvage_row]))
        s->salvage_row++;
    if (s->salvage_row < b->n) {
        batch_marks_range(b, s->salvage_row, s->salvage_row + 1, &s->marks);
        send_mark_statements(s, false, NULL, on_row_recorded);
        return;
    }
    log_write(s->salvage_unrecorded ? LOG_ERROR : LOG_INFO, "batch recorded row by row",
              "rows=%d sent=%d failed=%d unrecorded=%d session=%d", b->n, b->acked, b->failed,
              s->salvage_unrecorded, s->index);
    finish_batch(s, s->salvage_unrecorded > 0 || b->acked == 0);
}

/* The failed marks' transaction is rolled back: the rows are recorded one by one
 * (s->salvage_by_row), or the batch is sent again after the retry backoff (salvage_batch). */
static void on_rolled_back(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Session *s = arg;
    if (!results)
        return;
    if (error) {
        /* The failed transaction may still be open: only a new session surely ends it. */
        pg_conn_reset(pg, "rolling back a failed batch failed");
        return;
    }
    floor_abandon(&s->floor); /* the floor waits for a batch committed whole */
    if (s->salvage_by_row) {
        s->salvage_row = 0;
        s->salvage_unrecorded = 0;
        record_next_row(s);
        return;
    }
    finish_batch(s, true);
    if (s->setup_fault)
        session_start_next_request(s); /* gives its lanes up now, not after the backoff */
}

/* The marks failed (their transaction is aborted, COMMIT did not run; state and error: the
 * failed statement's). When a row refused them (sqlstate.h), roll back, then record the rows one
 * by one, so that one refused row does not keep the others from being recorded. Anything else
 * would fail every row alike, and is no row's fault: roll back and send the batch again after
 * the retry backoff (the consumers drop the duplicates), counting nothing against its rows; a
 * fault of the setup also takes the session out of the lane group until it is fixed. */
static void salvage_batch(Session *s, const char *state, const char *error)
{
    PgQuery q = {SQL_ROLLBACK, 0, NULL, false};
    SqlstateFault fault = sqlstate_fault(state);
    /* A passing failure that comes back batch after batch may be one row's after all (a
     * corrupt row, marks over a statement_timeout only with a large batch): from the third in
     * a row, the rows are recorded one by one, so the others get through. */
    if (fault == SQLSTATE_FAULT_TRANSIENT && ++s->mark_retries > 2)
        fault = SQLSTATE_FAULT_ROW;
    if (fault == SQLSTATE_FAULT_ROW)
        log_mark_error(s, "recording the batch failed; recording its rows one by one", NULL, error);
    else if (fault == SQLSTATE_FAULT_SETUP)
        session_setup_failed(s, "recording a batch", state, error);
    else
        log_mark_error(s, "recording the batch failed; it is sent again after the retry backoff",
                       NULL, error);
    s->salvage_by_row = fault == SQLSTATE_FAULT_ROW;
    if (!pg_conn_send(s->pg, &q, 1, on_rolled_back, s))
        pg_conn_reset(s->pg, "connection busy while rolling back");
}

/* The marks and COMMIT succeeded (results: theirs, n of them). Returns whether the next claim
 * should wait for the retry backoff (nothing got through, for a reason that may pass). */
static bool batch_recorded(Session *s, PGresult **results, int n)
{
    Batch *b = &s->batch;
    if (s->failed_stmt >= 0 && s->failed_stmt < n)
        log_dead_lettered(s, results[s->failed_stmt]);
    bool transient_failure = false, all_recorded = true;
    for (int i = 0; i < b->n; i++) {
        if (b->rows[i].state == ROW_FAILED && !b->rows[i].permanent)
            transient_failure = true;
        all_recorded = all_recorded && batch_row_recorded(&b->rows[i]);
    }
    if (all_recorded)
        session_floor_committed(s);
    else
        floor_abandon(&s->floor);
    log_debug("batch committed",
              "rows=%d sent=%d failed=%d claim_ms=%.2f deliver_ms=%.2f mark_ms=%.2f session=%d",
              b->n, b->acked, b->failed, (b->claimed_at - b->claim_sent_at) * 1e3,
              (s->marks_sent_at - b->claimed_at) * 1e3, (monotime_now() - s->marks_sent_at) * 1e3,
              s->index);
    return b->acked == 0 && transient_failure;
}

static void on_marked(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Session *s = arg;
    if (!results)
        return; /* connection lost before COMMIT was confirmed: the rows will be re-sent */
    if (error) {
        salvage_batch(s, pg_failed_sqlstate(results, n), error);
        return;
    }
    finish_batch(s, batch_recorded(s, results, n));
}

/* The marks, COMMIT and the next claim, in one round trip (see session_send_marks): the first
 * s->chained_marks_n results are the marks', the rest the claim's. */
static void on_marked_and_claimed(PgConn *pg, PGresult **results, int n, const char *error,
                                  void *arg)
{
    Session *s = arg;
    if (!results)
        return; /* connection lost: as in on_marked; the claim's transaction went with it */
    int marks_n = s->chained_marks_n;
    int marks_got = n < marks_n ? n : marks_n;
    if (pg_first_failed(results, marks_got) < marks_n) { /* the claim did not run */
        salvage_batch(s, pg_failed_sqlstate(results, marks_got), error ? error : "short result");
        return;
    }
    /* finish_batch, but the next claim is already here. Only a batch that got something through
     * is chained, so no retry backoff is due. */
    batch_recorded(s, results, marks_n);
    count_and_clear_batch(s);
    backoff_reset(&s->retry);
    s->mark_retries = 0;
    session_set_phase(s, PHASE_CLAIMING);
    bool claim_failed = pg_first_failed(results + marks_n, n - marks_n) < n - marks_n;
    session_claimed(s, results + marks_n, n - marks_n, claim_failed ? error : NULL);
}

/* One line per batch with failures, and only when the failure is new: an outage that fails
 * batch after batch with the same error logs once, then at debug level until it clears. */
static void log_batch_failures(Session *s, const BatchRow *first_failed)
{
    Batch *b = &s->batch;
    char q[512];
    if (!first_failed) {
        if (s->last_failure[0])
            log_info("deliveries succeed again", "sent=%d", b->acked);
        s->last_failure[0] = '\0';
        return;
    }
    const char *error = first_failed->error ? first_failed->error : "unknown error";
    char eid[160];
    LogLevel level = strcmp(error, s->last_failure) == 0 ? LOG_DEBUG : LOG_WARN;
    log_write(level, "events not delivered; they will be retried",
              "failed=%d sent=%d first_id=%lld first_event_id=%s permanent=%s error=%s session=%d",
              b->failed, b->acked, first_failed->row.id,
              log_quote(first_failed->row.event_id, eid, sizeof(eid)),
              first_failed->permanent ? "true" : "false", log_quote(error, q, sizeof(q)), s->index);
    snprintf(s->last_failure, sizeof(s->last_failure), "%s", error);
}

/* Sends the statements that record what s->marks holds (filled by batch_marks_range), then
 * COMMIT when commit is set; without it, the request is one implicit transaction (one Sync). next,
 * when not NULL, is a claim sent after the COMMIT in the same pipeline. */
static void send_mark_statements(Session *s, bool commit, const ClaimRequest *next, PgResultFn cb)
{
    BatchMarks *marks = &s->marks;
    char max_attempts[24], backoff[32], backoff_max[32];
    snprintf(max_attempts, sizeof(max_attempts), "%ld", s->cfg->max_attempts);
    snprintf(backoff, sizeof(backoff), "%.3f", (double)s->cfg->retry_backoff_ms / 1000.0);
    snprintf(backoff_max, sizeof(backoff_max), "%.3f",
             (double)s->cfg->retry_backoff_max_ms / 1000.0);
    const char *sent[1] = {marks->sent.s};
    const char *failed[6] = {marks->failed_ids.s,
                             marks->failed_errors.s,
                             marks->failed_permanent.s,
                             max_attempts,
                             backoff,
                             backoff_max};
    const char *dl_sent[2] = {marks->dl_sent.s, s->cfg->dead_letter_topic};
    const char *dl_failed[2] = {marks->dl_failed_ids.s, marks->dl_failed_errors.s};

    PgQuery queries[PG_MAX_QUERIES];
    int nq = 0;
    s->failed_stmt = -1;
    bool records_failures = !strbuf_array_empty(&marks->failed_ids) ||
                            !strbuf_array_empty(&marks->dl_sent) ||
                            !strbuf_array_empty(&marks->dl_failed_ids);
    if (commit) /* the claim's lock_timeout is not for the marks (see SQL_CLAIM_PLAN) */
        queries[nq++] =
            (PgQuery){records_failures ? SQL_MARK_PLAN_FAILURES : SQL_MARK_PLAN, 0, NULL,
                      !records_failures}; /* rare: not worth a prepared statement's slot */
    else if (records_failures)
        queries[nq++] = (PgQuery){SQL_FAILURES_DURABLE, 0, NULL, false};
    if (!strbuf_array_empty(&marks->sent))
        queries[nq++] =
            (PgQuery){s->sql[s->cfg->on_sent == ON_SENT_DELETE ? SQL_DELETE_SENT : SQL_MARK_SENT],
                      1, sent, true};
    if (!strbuf_array_empty(&marks->failed_ids)) {
        s->failed_stmt = nq;
        queries[nq++] = (PgQuery){s->sql[SQL_MARK_FAILED], 6, failed, false};
    }
    if (!strbuf_array_empty(&marks->dl_sent))
        queries[nq++] = (PgQuery){s->sql[SQL_MARK_DEAD_LETTERED], 2, dl_sent, false};
    if (!strbuf_array_empty(&marks->dl_failed_ids))
        queries[nq++] = (PgQuery){s->sql[SQL_MARK_DEAD_LETTER_FAILED], 2, dl_failed, false};
    if (commit)
        queries[nq++] = (PgQuery){SQL_COMMIT, 0, NULL, false};
    s->chained_marks_n = nq;
    for (int i = 0; next && i < next->n; i++)
        queries[nq++] = next->queries[i];
    session_set_phase(s, next ? PHASE_MARKING_AND_CLAIMING : PHASE_MARKING);
    if (!pg_conn_send(s->pg, queries, nq, cb, s))
        pg_conn_reset(s->pg, "connection busy while marking");
}

void session_send_marks(Session *s)
{
    Batch *b = &s->batch;
    ev_timer_stop(s->loop, &s->delivery_timer);
    log_batch_failures(s, batch_marks(b, &s->marks));
    s->order_breaks += (unsigned long long)batch_order_breaks(
        b, s->cfg->order_scope == ORDER_PER_TOPIC ? s->cfg->topic_template : NULL);
    s->marks_sent_at = monotime_now();
    /* A batch that got something through is followed at once by the next claim (finish_batch):
     * sent behind the COMMIT in the same pipeline, it saves the session a round trip per batch,
     * which is what a row committed while the session was busy waits for. The server runs it after
     * the COMMIT, so it sees this batch's marks; the decisions session_start_next_request would
     * take after the COMMIT are taken now (session_may_chain_claim). */
    ClaimRequest next;
    if (session_may_chain_claim(s) && session_claim_build(s, &next)) {
        s->claim_sent_at = s->marks_sent_at;
        send_mark_statements(s, true, &next, on_marked_and_claimed);
        return;
    }
    send_mark_statements(s, true, NULL, on_marked);
}
