/* marks: recording a batch's outcome and committing, or, when that fails, row by row. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"
#include "monotime.h"
#include "metrics.h"
#include "sqlstate.h"
#include "utf8.h"

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

/* Counts what a batch recorded in the totals of "stopped" and the batch in outbox_batches_total
 * ("claim transactions that delivered or recorded rows"): a batch recorded row by row of which no
 * row could be recorded is none. sent and failed are the rows recorded as sent or failed;
 * copies_sent and copies_failed those of them that were dead events' copies to the dead-letter
 * topic, counted apart: sent= counts events delivered and failed_attempts= attempts counted
 * against events, and a copy is neither (its event was dead-lettered, dead_lettered=, when its
 * last attempt failed; a copy that fails is not in failed_attempts=, nor in the row's attempts
 * column: SQL_MARK_DEAD_LETTER_FAILED). */
static void count_recorded(Session *s, int sent, int failed, int copies_sent, int copies_failed,
                           bool by_row)
{
    s->total_sent += (unsigned long long)(sent - copies_sent);
    s->total_failed += (unsigned long long)(failed - copies_failed);
    s->total_copies += (unsigned long long)copies_sent;
    if (!by_row || sent + failed > 0)
        metrics_batch_committed();
}

/* Counts the rows of b that are dead events' copies acknowledged and failed. */
static void count_copies(const Batch *b, int *sent, int *failed)
{
    *sent = *failed = 0;
    for (int i = 0; i < b->n; i++) {
        if (!b->rows[i].dead_letter)
            continue;
        *sent += b->rows[i].state == ROW_ACKED;
        *failed += b->rows[i].state == ROW_FAILED;
    }
}

void marks_batch_done(Session *s, bool retry, bool committed)
{
    Batch *b = &s->batch;
    if (committed) {
        /* Recorded row by row, only the rows whose record went through count: the others (a
         * record that failed for a passing reason, the rows left when stopping) go out again
         * and count then. */
        if (s->salvage_by_row) {
            count_recorded(s, s->salvage_sent, s->salvage_failed, s->salvage_copies_sent,
                           s->salvage_copies_failed, true);
        } else {
            int copies_sent, copies_failed;
            count_copies(b, &copies_sent, &copies_failed);
            count_recorded(s, b->acked, b->failed, copies_sent, copies_failed, false);
        }
    }
    batch_clear(b);
    if (!retry) {
        backoff_reset(&s->retry);
        s->mark_retries = 0;
    }
    relay_batch_done(s->relay);
}

void marks_row_by_row_cut_short(Session *s, bool lost)
{
    const Batch *b = &s->batch;
    log_warn(lost ? "connection lost while recording a batch row by row; the rows not recorded "
                    "will be sent again"
                  : "stopping while recording a batch row by row; the rows not recorded will be "
                    "sent again",
             "rows=%d sent=%d failed=%d not_recorded=%d session=%d", b->n, s->salvage_sent,
             s->salvage_failed, b->n - s->salvage_sent - s->salvage_failed, s->index);
    if (lost) { /* the batch is abandoned, never done: its recorded rows count now */
        count_recorded(s, s->salvage_sent, s->salvage_failed, s->salvage_copies_sent,
                       s->salvage_copies_failed, true);
        s->salvage_sent = s->salvage_failed = 0;
        s->salvage_copies_sent = s->salvage_copies_failed = 0;
    }
}

/* A failure to record an outcome is logged once per distinct error, then at debug level: a
 * table that refuses a mark (a trigger, a constraint) would otherwise log every batch. */
static void log_mark_error(Session *s, const char *what, const BatchRow *br, const char *error)
{
    char q[512], seen[sizeof(s->last_mark_error)];
    /* Compared as it is kept: an error longer than the copy would never equal it, and would be
     * logged at error level batch after batch. */
    snprintf(seen, sizeof(seen), "%s", error);
    LogLevel level = strcmp(seen, s->last_mark_error) == 0 ? LOG_DEBUG : LOG_ERROR;
    if (br)
        log_write(level, what, "error=%s id=%lld rows=%d session=%d",
                  log_quote(error, q, sizeof(q)), br->row.id, s->batch.n, s->index);
    else
        log_write(level, what, "error=%s rows=%d session=%d", log_quote(error, q, sizeof(q)),
                  s->batch.n, s->index);
    snprintf(s->last_mark_error, sizeof(s->last_mark_error), "%s", seen);
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

static int unrecordable_find(const Unrecordable *u, long long id)
{
    for (int i = 0; i < u->n; i++)
        if (u->ids[i] == id)
            return i;
    return -1;
}

bool marks_skip_unrecordable(const Session *s, const BatchRow *br)
{
    Unrecordable *u = &s->relay->unrecordable;
    if (u->n == 0)
        return false;
    int at = unrecordable_find(u, br->row.id);
    if (at < 0)
        return false;
    double now = monotime_now();
    u->met[at] = now;
    return now < u->due[at];
}

void marks_unrecordable_forget_all(Session *s)
{
    Unrecordable *u = &s->relay->unrecordable;
    if (u->n == 0)
        return;
    log_info("the rows kept apart are forgotten: the table was replaced or its order column's "
             "sequence set back, so their ids may name other rows now",
             "rows=%d session=%d", u->n, s->index);
    u->n = 0;
    u->full_logged = false;
}

/* Drops entry at (the last takes its place). */
static void unrecordable_drop(Unrecordable *u, int at)
{
    u->n--;
    u->ids[at] = u->ids[u->n];
    u->wait[at] = u->wait[u->n];
    u->due[at] = u->due[u->n];
    u->met[at] = u->met[u->n];
    u->full_logged = false;
}

/* The row's outcome was recorded after all (the trigger fixed, say): it is no longer kept apart. */
static void unrecordable_forget(Session *s, long long id)
{
    Unrecordable *u = &s->relay->unrecordable;
    int at = u->n > 0 ? unrecordable_find(u, id) : -1;
    if (at < 0)
        return;
    log_info("a row whose outcome the table refused is recorded now", "id=%lld session=%d", id,
             s->index);
    unrecordable_drop(u, at);
}

/* Room for one more entry when the list is full: the entry no claim of the relay has met for
 * the longest, if that is over UNRECORDABLE_STALE_S (its row is no longer the relay's to claim).
 * Returns whether there is room. */
static bool unrecordable_room(Unrecordable *u)
{
    if (u->n < UNRECORDABLE_MAX)
        return true;
    int oldest = 0;
    for (int i = 1; i < u->n; i++)
        if (u->met[i] < u->met[oldest])
            oldest = i;
    if (monotime_now() - u->met[oldest] < UNRECORDABLE_STALE_S)
        return false;
    unrecordable_drop(u, oldest);
    return true;
}

/* The table refused the row's failure mark too (its own fault: a trigger, a constraint): the
 * row is kept apart (Unrecordable, engine.h) rather than published again after each retry
 * backoff for ever. Said once per row at error level, with what happens to it. */
static void unrecordable_note(Session *s, const BatchRow *br, const char *error)
{
    Unrecordable *u = &s->relay->unrecordable;
    char q[512];
    int at = unrecordable_find(u, br->row.id);
    if (at >= 0) { /* tried again after its wait, refused again */
        u->wait[at] =
            u->wait[at] * 2 < UNRECORDABLE_WAIT_MAX_S ? u->wait[at] * 2 : UNRECORDABLE_WAIT_MAX_S;
        u->due[at] = monotime_now() + u->wait[at];
        log_debug("the table still refuses to record a row's outcome",
                  "id=%lld wait_s=%.0f session=%d", br->row.id, u->wait[at], s->index);
        return;
    }
    if (!unrecordable_room(u)) {
        if (!u->full_logged)
            log_error("the table refuses to record the outcome of more rows than a relay keeps "
                      "apart; this one is published again after each retry backoff until its "
                      "outcome can be recorded",
                      "id=%lld max=%d error=%s session=%d", br->row.id, UNRECORDABLE_MAX,
                      log_quote(error, q, sizeof(q)), s->index);
        u->full_logged = true;
        return;
    }
    u->ids[u->n] = br->row.id;
    u->wait[u->n] = UNRECORDABLE_WAIT_S;
    u->due[u->n] = monotime_now() + UNRECORDABLE_WAIT_S;
    u->met[u->n] = monotime_now();
    u->n++;
    log_error("the table refuses to record a row's outcome, even as a failure (a trigger or "
              "constraint of the row); it stays unsent and is left out of the batches, its "
              "aggregate waiting, then tried again after 30 s doubling to an hour: fix the "
              "trigger or constraint, or purge the row",
              "id=%lld error=%s session=%d", br->row.id, log_quote(error, q, sizeof(q)), s->index);
}

void marks_row_read(Session *s, PGresult **results, int n, const char *error)
{
    Batch *b = &s->batch;
    BatchRow *br = &b->rows[s->salvage_row];
    if (error) {
        log_mark_error(s, "recording a row's outcome failed", br, error);
        if (br->state == ROW_ACKED && refused_by_the_row(results, n)) {
            char why[512];
            snprintf(why, sizeof(why), "delivered, but marking it sent failed: %s", error);
            b->acked--;
            batch_fail(b, br, why, true);
            s->salvage_refused++;
            return; /* the same row next, now as a failure */
        }
        const char *state = pg_failed_sqlstate(results, n);
        if (sqlstate_fault(state) == SQLSTATE_FAULT_SETUP)
            session_setup_failed(s, "recording a row", state, error);
        else if (br->state == ROW_FAILED && refused_by_the_row(results, n))
            unrecordable_note(s, br, error);
        s->salvage_unrecorded++; /* claimed again after the retry backoff */
    } else if (br->state == ROW_ACKED) {
        s->salvage_sent++;
        s->salvage_copies_sent += br->dead_letter;
        unrecordable_forget(s, br->row.id);
    } else {
        s->salvage_failed++;
        s->salvage_copies_failed += br->dead_letter;
        unrecordable_forget(s, br->row.id);
        if (!br->dead_letter && s->failed_stmt >= 0 && s->failed_stmt < n)
            log_dead_lettered(s, results[s->failed_stmt]);
    }
    s->salvage_row++;
}

bool marks_next_row(Session *s, MarkRequest *req)
{
    Batch *b = &s->batch;
    while (s->salvage_row < b->n && !batch_row_recorded(&b->rows[s->salvage_row]))
        s->salvage_row++;
    if (s->salvage_row < b->n) {
        batch_marks_range(b, s->salvage_row, s->salvage_row + 1, &s->marks);
        marks_build(s, false, NULL, req);
        return true;
    }
    log_write(s->salvage_unrecorded ? LOG_ERROR : LOG_INFO, "batch recorded row by row",
              "rows=%d sent=%d failed=%d unrecorded=%d session=%d", b->n, s->salvage_sent,
              s->salvage_failed, s->salvage_unrecorded, s->index);
    return false;
}

/* Whether nothing of s's batch got through to Kafka for a reason that may pass (Kafka down, a
 * timeout), or Kafka refused some of it for a fault of the setup (not authorised, unknown topic:
 * those rows stay unsent and would be claimed and refused again at once) that the hold could not
 * take in (TopicHold: too many types): the next claim waits for the retry backoff then. Refused
 * types the hold took in are left out of the next claims instead, and the others go on at once.
 * Rows Kafka refused for good (too large, an illegal topic name) are recorded as such, and the
 * rows behind them go on at once. */
static bool nothing_got_through(const Session *s)
{
    const Batch *b = &s->batch;
    if (b->setup_faults > 0 && s->hold.overflowed)
        return true;
    if (b->acked > 0)
        return false;
    /* The claim's recheck held every row (claim.c): the next claim would be the same one. */
    if (b->held_whole)
        return true;
    /* The producer failed (recreated after the backoff), or rows were kept apart (Unrecordable)
     * and nothing else went: no hot loop on them. */
    if (b->cancelled > 0)
        return true;
    for (int i = 0; i < b->n; i++)
        if (b->rows[i].state == ROW_FAILED && !b->rows[i].permanent)
            return true;
    return false;
}

bool marks_row_by_row_retry(const Session *s)
{
    /* Rows delivered whose sent mark the table refused are failures for good too, but a table
     * that refuses every one (a trigger) is more like the setup than the rows: without a pause
     * each batch would be published, refused and recorded again at full speed. */
    bool none_marked_sent = s->salvage_sent == 0 && s->salvage_refused > 0;
    return s->salvage_unrecorded > 0 || nothing_got_through(s) || none_marked_sent;
}

bool marks_rolled_back(Session *s)
{
    floor_abandon(&s->floor); /* the floor waits for a batch committed whole */
    if (s->salvage_by_row) {
        s->salvage_row = 0;
        s->salvage_unrecorded = s->salvage_sent = s->salvage_failed = s->salvage_refused = 0;
        s->salvage_copies_sent = s->salvage_copies_failed = 0;
    }
    return s->salvage_by_row;
}

/* The marks failed (their transaction is aborted, COMMIT did not run; state and error: the
 * failed statement's): decides what follows the ROLLBACK. When a row refused them (sqlstate.h),
 * the rows are recorded one by one, so that one refused row does not keep the others from being
 * recorded. Anything else would fail every row alike, and is no row's fault: the batch is sent
 * again after the retry backoff (the consumers drop the duplicates), counting nothing against its
 * rows; a fault of the setup also takes the session out of the lane group until it is fixed. */
static void salvage_batch(Session *s, const char *state, const char *error)
{
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
}

/* The marks and COMMIT succeeded (results: theirs, n of them). Returns whether the next claim
 * should wait for the retry backoff (nothing got through, for a reason that may pass). */
static bool batch_recorded(Session *s, PGresult **results, int n)
{
    Batch *b = &s->batch;
    /* The marks went through: the run of batches whose marks failed is over, also when nothing
     * got through to Kafka (the retry backoff then runs on, but a later passing failure of the
     * marks is the first of a new run, not the third, which would record its batch row by row). */
    s->mark_retries = 0;
    if (s->failed_stmt >= 0 && s->failed_stmt < n)
        log_dead_lettered(s, results[s->failed_stmt]);
    bool all_recorded = true;
    for (int i = 0; i < b->n; i++) {
        all_recorded = all_recorded && batch_row_recorded(&b->rows[i]);
        if (s->relay->unrecordable.n > 0 && batch_row_recorded(&b->rows[i]))
            unrecordable_forget(s, b->rows[i].row.id);
    }
    if (all_recorded)
        claim_floor_committed(s);
    else
        floor_abandon(&s->floor);
    log_debug("batch committed",
              "rows=%d sent=%d failed=%d claim_ms=%.2f deliver_ms=%.2f mark_ms=%.2f session=%d",
              b->n, b->acked, b->failed, (b->claimed_at - b->claim_sent_at) * 1e3,
              (s->marks_sent_at - b->claimed_at) * 1e3, (monotime_now() - s->marks_sent_at) * 1e3,
              s->index);
    return nothing_got_through(s);
}

MarksOutcome marks_read(Session *s, PGresult **results, int n, const char *error, bool chained)
{
    if (chained) {
        /* The first s->chained_marks_n results are the marks', the rest the claim's. */
        int marks_n = s->chained_marks_n;
        int marks_got = n < marks_n ? n : marks_n;
        if (pg_first_failed(results, marks_got) < marks_n) { /* the claim did not run */
            salvage_batch(s, pg_failed_sqlstate(results, marks_got),
                          error ? error : "short result");
            return MARKS_FAILED;
        }
        /* Only a batch that got something through is chained: no retry backoff is due. */
        batch_recorded(s, results, marks_n);
        return MARKS_RECORDED;
    }
    if (error) {
        salvage_batch(s, pg_failed_sqlstate(results, n), error);
        return MARKS_FAILED;
    }
    return batch_recorded(s, results, n) ? MARKS_RECORDED_RETRY : MARKS_RECORDED;
}

/* One line for failed, the batch's first failure of its kind (an event, or a dead event's
 * copy to the dead-letter topic), at warn level when key differs from *last (then kept there),
 * else at debug level. The key is compared as it is kept: cut to the copy's size, or a long error
 * would never equal it and log at warn level batch after batch. */
static void log_failure(Session *s, const BatchRow *failed, bool dead, char *last, size_t lastlen)
{
    const Batch *b = &s->batch;
    char q[512], eid[160], key[sizeof(s->last_failure)];
    const char *error = failed->error ? failed->error : "unknown error";
    snprintf(key, sizeof(key) < lastlen ? sizeof(key) : lastlen, "%s%s",
             dead ? "dead-letter publish failed: " : "", error);
    LogLevel level = strcmp(key, last) == 0 ? LOG_DEBUG : LOG_WARN;
    log_write(level,
              dead ? "dead events not published to the dead-letter topic; they will be retried"
                   : "events not delivered; they will be retried",
              "failed=%d sent=%d first_id=%lld first_event_id=%s permanent=%s error=%s session=%d",
              b->failed, b->acked, failed->row.id,
              log_quote(failed->row.event_id, eid, sizeof(eid)),
              failed->permanent ? "true" : "false", log_quote(error, q, sizeof(q)), s->index);
    snprintf(last, lastlen, "%s", key);
}

/* One line per batch with failures, and only when the failure is new: an outage that fails
 * batch after batch with the same error logs once, then at debug level until it clears. A dead
 * event that could not be published to the dead-letter topic is said too (its own line, with a
 * streak of its own, so that it is said even while events fail: nothing else tells an operator
 * that the dead-letter topic is missing or refused). The end of a streak is said only by a batch
 * that got something through: one that delivered nothing and failed nothing (cut short by a
 * stop, or by its delivery timeout before anything reached the producer) is no news either way. */
static void log_batch_failures(Session *s, const BatchRow *first_failed)
{
    Batch *b = &s->batch;
    const BatchRow *dead_failed = NULL;
    for (int i = 0; !dead_failed && i < b->n; i++) /* a parked copy had its own line (produce.c) */
        if (b->rows[i].state == ROW_FAILED && b->rows[i].dead_letter && !b->rows[i].parked)
            dead_failed = &b->rows[i];
    if (!first_failed && !dead_failed) {
        if (b->acked == 0)
            return;
        if (s->last_failure[0])
            log_info("deliveries succeed again", "sent=%d", b->acked);
        s->last_failure[0] = '\0';
        s->last_dead_failure[0] = '\0';
        return;
    }
    if (first_failed)
        log_failure(s, first_failed, false, s->last_failure, sizeof(s->last_failure));
    if (dead_failed) {
        log_failure(s, dead_failed, true, s->last_dead_failure, sizeof(s->last_dead_failure));
        /* Alone, it is the streak's failure too: its end is said as an event failure's is. */
        if (!first_failed)
            snprintf(s->last_failure, sizeof(s->last_failure), "%s", s->last_dead_failure);
    }
}

void marks_build(Session *s, bool commit, const ClaimRequest *next, MarkRequest *req)
{
    BatchMarks *marks = &s->marks;
    snprintf(req->max_attempts, sizeof(req->max_attempts), "%ld", s->cfg->max_attempts);
    snprintf(req->backoff, sizeof(req->backoff), "%.3f", (double)s->cfg->retry_backoff_ms / 1000.0);
    snprintf(req->backoff_max, sizeof(req->backoff_max), "%.3f",
             (double)s->cfg->retry_backoff_max_ms / 1000.0);
    req->sent[0] = marks->sent.s;
    req->failed[0] = marks->failed_ids.s;
    req->failed[1] = marks->failed_errors.s;
    req->failed[2] = marks->failed_permanent.s;
    req->failed[3] = req->max_attempts;
    req->failed[4] = req->backoff;
    req->failed[5] = req->backoff_max;
    req->dl_sent[0] = marks->dl_sent.s;
    req->dl_sent[1] = s->cfg->dead_letter_topic;
    req->dl_failed[0] = marks->dl_failed_ids.s;
    req->dl_failed[1] = marks->dl_failed_parked.s;

    PgQuery *queries = req->queries;
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
                      1, req->sent, true};
    if (!strbuf_array_empty(&marks->failed_ids)) {
        s->failed_stmt = nq;
        queries[nq++] = (PgQuery){s->sql[SQL_MARK_FAILED], 6, req->failed, false};
    }
    if (!strbuf_array_empty(&marks->dl_sent))
        queries[nq++] = (PgQuery){s->sql[SQL_MARK_DEAD_LETTERED], 2, req->dl_sent, false};
    if (!strbuf_array_empty(&marks->dl_failed_ids))
        queries[nq++] = (PgQuery){s->sql[SQL_MARK_DEAD_LETTER_FAILED], 2, req->dl_failed, false};
    if (commit)
        queries[nq++] = (PgQuery){SQL_COMMIT, 0, NULL, false};
    s->chained_marks_n = nq;
    for (int i = 0; next && i < next->n; i++)
        queries[nq++] = next->queries[i];
    req->n = nq;
}

/* A Kafka setup fault (batch_unsent) is logged at error level once per distinct error and topic
 * for the whole relay, with what to do, and kept for /readyz until a batch delivers without one
 * or a claim finds nothing left (marks_nothing_unsent).
 * Like a setup fault of the database (session_setup_failed), it never counts against a row. */
static void note_kafka_fault(Session *s)
{
    const Batch *b = &s->batch;
    if (b->setup_faults == 0) {
        /* Not while types are held: their topics' refusal may well go on. */
        if (b->acked > 0 && s->kafka_fault[0] && s->hold.n == 0) {
            log_info("Kafka accepts the events again", "sent=%d session=%d", b->acked, s->index);
            s->kafka_fault[0] = '\0';
        }
        return;
    }
    char shown[sizeof(s->kafka_fault)], q[300], t[300], h[300];
    const char *error = rd_kafka_err2str(b->setup_err);
    /* Bounded to fit the copy (a long topic name is cut), so it compares as it is kept. */
    snprintf(shown, sizeof(shown), "kafka: %.40s (topic %.140s)", error,
             b->setup_topic[0] ? b->setup_topic : "unknown");
    bool said = false;
    for (int i = 0; i < s->relay->n_sessions; i++)
        said = said || strcmp(s->relay->sessions[i].kafka_fault, shown) == 0;
    log_write(said ? LOG_DEBUG : LOG_ERROR,
              "Kafka refuses events for a fault of the setup: they stay unsent, no attempt "
              "counted, and are retried after the backoff; the relay is not ready until it is "
              "fixed",
              "error=%s topic=%s rows=%d sent=%d hint=%s session=%d",
              log_quote(error, q, sizeof(q)), log_quote(b->setup_topic, t, sizeof(t)),
              b->setup_faults, b->acked,
              log_quote(kafka_error_setup_hint(b->setup_err), h, sizeof(h)), s->index);
    memcpy(s->kafka_fault, shown, sizeof(shown));
}

/* The aggregate type of a row as the claim compares it (NULL as ""). */
static const char *type_of(const BatchRow *br)
{
    return br->row.aggregate_type ? br->row.aggregate_type : "";
}

static int hold_find(const TopicHold *h, const char *type)
{
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->types[i], type) == 0)
            return i;
    return -1;
}

/* Writes the claim's parameter anew from the types held. */
static void hold_write_param(TopicHold *h)
{
    strbuf_array_begin(&h->param);
    for (int i = 0; i < h->n; i++)
        strbuf_array_text(&h->param, h->types[i]);
    strbuf_array_end(&h->param);
}

void marks_hold_clear(Session *s)
{
    TopicHold *h = &s->hold;
    h->n = 0;
    h->probe_due = h->probing = h->left_out = false;
    backoff_reset(&h->backoff);
    floor_hold_release(&s->floor, true); /* their rows may be below the floor: back to them */
    hold_write_param(h);
}

/* Whether another session holds type already (then s logs its own hold at debug level). */
static bool held_elsewhere(const Session *s, const char *type)
{
    for (int i = 0; i < s->relay->n_sessions; i++) {
        const Session *other = &s->relay->sessions[i];
        if (other != s && hold_find(&other->hold, type) >= 0)
            return true;
    }
    return false;
}

/* After a batch: the types Kafka refused in it are held (TopicHold), up to the bound. After the
 * probe's batch the held types Kafka took events of again are let go, and so are those of which
 * it had no row while it was not full (nothing of them was left to claim); the others stay. Sets
 * h->overflowed when a refused type did not fit: the hold is dropped then, and the session backs
 * off after each refused batch (nothing_got_through). */
static void hold_note_batch(Session *s)
{
    TopicHold *h = &s->hold;
    const Batch *b = &s->batch;
    bool probe = h->probing, left_out = h->left_out;
    h->probing = h->left_out = false;
    h->overflowed = false;
    if (probe)
        h->probe_due = false;
    bool changed = false;
    for (int i = 0; probe && i < h->n;) {
        bool acked = false, refused = false;
        for (int r = 0; r < b->n; r++) {
            const BatchRow *br = &b->rows[r];
            if (br->dead_letter || strcmp(type_of(br), h->types[i]) != 0)
                continue;
            acked = acked || br->state == ROW_ACKED;
            refused = refused || br->setup_fault;
        }
        if (refused || (!acked && s->batch_from_full_claim)) {
            i++;
            continue;
        }
        char t[HOLD_TYPE_MAX * 2], q[ROUTE_TOPIC_MAX * 2];
        log_info(acked ? "Kafka accepts the events of a held aggregate type again; its hold ends"
                       : "no events left of a held aggregate type; its hold ends",
                 "aggregate_type=%s topic=%s session=%d", log_quote(h->types[i], t, sizeof(t)),
                 log_quote(h->topics[i], q, sizeof(q)), s->index);
        h->n--;
        memmove(h->types[i], h->types[i + 1], sizeof(h->types[0]) * (size_t)(h->n - i));
        memmove(h->topics[i], h->topics[i + 1], sizeof(h->topics[0]) * (size_t)(h->n - i));
        changed = true;
        /* The rest of its rows may lie below the floor (the claims that left it out moved it):
         * the floor goes back to where the hold began, so they come next, in order. */
        floor_hold_release(&s->floor, h->n == 0);
    }
    int left_out_n = left_out ? h->n : 0; /* the types the claim left out come first */
    for (int r = 0; r < b->n && b->setup_faults > 0; r++) {
        const BatchRow *br = &b->rows[r];
        if (!br->setup_fault)
            continue;
        const char *type = type_of(br);
        char t[HOLD_TYPE_MAX * 2], q[ROUTE_TOPIC_MAX * 2];
        int at = hold_find(h, type);
        if (at >= 0) {
            if (at >= left_out_n)
                continue; /* held by the probe or by this batch: refused again, still held */
            /* The claim was to leave the type out and returned its rows: without the retry
             * backoff the session would claim them again at once, batch after batch. */
            log_warn("a held aggregate type's events came back in a claim that leaves it out; "
                     "the session claims every type after its retry backoff until the refusals "
                     "end",
                     "aggregate_type=%s session=%d", log_quote(type, t, sizeof(t)), s->index);
            marks_hold_clear(s);
            h->overflowed = true;
            return;
        }
        /* The claim compares the name in a text[] literal, which writes each byte that is not
         * UTF-8 (a SQL_ASCII or LATIN1 database holds any) as U+FFFD: such a name would match
         * no row, and its rows would come back in every claim. */
        if (h->n == HOLD_TYPES_MAX || strlen(type) >= HOLD_TYPE_MAX || !utf8_valid(type)) {
            log_warn("Kafka refuses more aggregate types than a session holds apart (or one with "
                     "a name too long to hold, or not UTF-8); the session claims every type "
                     "after its retry backoff until the refusals end",
                     "held=%d max=%d aggregate_type=%s session=%d", h->n, HOLD_TYPES_MAX,
                     log_quote(type, t, sizeof(t)), s->index);
            marks_hold_clear(s);
            h->overflowed = true;
            return;
        }
        snprintf(h->types[h->n], sizeof(h->types[0]), "%s", type);
        snprintf(h->topics[h->n], sizeof(h->topics[0]), "%s", br->topic ? br->topic : "");
        log_write(held_elsewhere(s, type) ? LOG_DEBUG : LOG_WARN,
                  "events of an aggregate type whose topic Kafka refuses are held out of the "
                  "claims; the other types go on, the held ones are tried again after a backoff",
                  "aggregate_type=%s topic=%s held=%d session=%d", log_quote(type, t, sizeof(t)),
                  log_quote(h->topics[h->n], q, sizeof(q)), h->n + 1, s->index);
        h->n++;
        floor_hold_begin(&s->floor); /* before this batch's commit: the floor is below its rows */
        changed = true;
    }
    if (changed) {
        hold_write_param(h);
        if (h->n == 0)
            backoff_reset(&h->backoff);
    }
}

void marks_nothing_unsent(Session *s)
{
    /* The refused rows were claimed again after the backoff while they were there: an empty
     * claim means none is left for this session, so nothing is being refused now. Without it, an
     * operator who requeued or deleted them left the relay not ready for ever. */
    if (!s->kafka_fault[0])
        return;
    log_info("no events left that Kafka refused for a fault of the setup", "session=%d", s->index);
    s->kafka_fault[0] = '\0';
}

void marks_prepare(Session *s)
{
    Batch *b = &s->batch;
    s->salvage_by_row = false; /* set again should these marks fail (salvage_batch) */
    hold_note_batch(s);
    note_kafka_fault(s);
    log_batch_failures(s, batch_marks(b, &s->marks));
    /* Order is promised per aggregate, or within each topic (--order-scope topic), or within
     * each topic and partition (--order-scope partition): only a break of that promise is one. */
    s->order_breaks += (unsigned long long)batch_order_breaks(
        b, s->cfg->order_scope != ORDER_PER_AGGREGATE ? s->cfg->topic_template : NULL,
        s->cfg->order_scope == ORDER_PER_PARTITION);
    s->marks_sent_at = monotime_now();
}
