/* claim: BEGIN and the claim of a batch, and the claims around rows others have locked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"
#include "monotime.h"
#include "metrics.h"
#include "sqlstate.h"

/* How often a session's claims look at what the floor needs (see claim_build), in a process that
 * serves one database; with several, relays_in_process() times this. */
#define FLOOR_LOOK_INTERVAL_S 0.02

/* The rows the claims around locks look at for locked rows (SQL_CLAIM_AROUND_LOCKS): at first
 * four times the rows asked for, at least BUSY_WINDOW_MIN, doubled each time the claim still ran
 * into a lock, up to BUSY_WINDOW_MAX (then a lock it cannot see, on the table or shared by several
 * transactions, is waited out with the retry backoff). */
#define BUSY_WINDOW_MIN 1000L
#define BUSY_WINDOW_MAX (1L << 24)

/* A claim ran into a row or table lock someone else holds (lock_not_available after the claim's
 * lock_timeout): the next claim goes around locked rows at once, with a wider window each time
 * this happens again, until the window is as wide as it gets; from then on after the retry
 * backoff (CLAIM_LOCKED_WAIT), so no lock can make the session spin. */
static ClaimOutcome claim_locked(Session *s)
{
    bool wider = true;
    if (!s->around_locks) {
        s->around_locks = true;
        s->busy_window =
            4 * s->claim_limit > BUSY_WINDOW_MIN ? 4 * s->claim_limit : BUSY_WINDOW_MIN;
    } else if (s->busy_window < BUSY_WINDOW_MAX) {
        s->busy_window *= 2;
    } else {
        wider = false;
    }
    if (!wider && !s->lock_wait_logged) {
        log_warn("claims wait for a lock held by another transaction (on the table, or on a row "
                 "several transactions share); retrying with backoff",
                 "lock_timeout_ms=%s session=%d", CLAIM_LOCK_TIMEOUT_MS, s->index);
        s->lock_wait_logged = true;
    }
    return wider ? CLAIM_LOCKED : CLAIM_LOCKED_WAIT;
}

/* What SQL_FIND_LOCKER found behind a claim around locks: the first locked row and its locker
 * (logged once per stall), or none, and then the locks are gone and the next claim is a plain
 * one again. */
static void learn_lockers(Session *s, const PGresult *found)
{
    if (PQntuples(found) > 0) {
        if (!s->locked_row_logged)
            log_warn("a row of this session's lanes is locked by another transaction; its "
                     "aggregate waits, the others go on",
                     "id=%s blocking_pid=%s lock_timeout_ms=%s session=%d", PQgetvalue(found, 0, 0),
                     PQgetvalue(found, 0, 1), CLAIM_LOCK_TIMEOUT_MS, s->index);
        s->locked_row_logged = true;
        return;
    }
    if (s->locked_row_logged || s->lock_wait_logged)
        log_info("no locked row holds claims up any more", "session=%d", s->index);
    s->locked_row_logged = s->lock_wait_logged = false;
    s->around_locks = false;
}

/* The claim converts each row it takes to text before it can cut the batch at --batch-bytes, and
 * that conversion is what large payloads cost (about 10 ms for 500 KB of JSON): claiming 1,000
 * such rows to keep 16 took seconds. So while batches fill half the byte budget or more, the
 * next claim asks for twice the rows that fitted, and the limit grows back (doubling) once they
 * no longer do. An empty claim counts as one that did not fill it. */
static void adapt_row_limit(Session *s, int rows)
{
    long batch_size = s->cfg->batch_size;
    long limit = s->row_limit > 0 ? s->row_limit : batch_size;
    if (rows > 0 && s->batch.bytes >= (size_t)s->cfg->batch_bytes / 2)
        limit = 2L * rows;
    else
        limit = 2L * limit;
    s->row_limit = limit < batch_size ? limit : batch_size;
}

/* A relfilenode or oid from SQL_FLOOR_HELD's column `col`; 0 (nothing to compare) when NULL or
 * absent. */
static unsigned relfilenode(const PGresult *held, int col)
{
    if (PQnfields(held) <= col || PQgetisnull(held, 0, col))
        return 0;
    return (unsigned)strtoul(PQgetvalue(held, 0, col), NULL, 10);
}

/* Reads what the floor's statements around the claim found (floor.h). */
static void learn_floor(Session *s, const PGresult *held, const PGresult *claimed,
                        const PGresult *writers)
{
    int rows = PQntuples(claimed);
    FloorClaim c = {
        /* A claim that left held types out moves it too: the probe reads their rows from where
         * the hold began, and their release takes the floor back there (floor.h). */
        .plain = s->claim_sent == s->claim_stmt,
        .rows = rows,
        .last_seq = rows > 0 ? strtoll(PQgetvalue(claimed, rows - 1, 0), NULL, 10) : 0,
        .held = PQgetisnull(held, 0, 0) ? -1 : strtoll(PQgetvalue(held, 0, 0), NULL, 10),
        .writers_ended = strcmp(PQgetvalue(writers, 0, 0), "t") == 0,
        .writers = PQgetvalue(writers, 0, 1),
        .seq_last = PQgetisnull(held, 0, 1) ? -1 : strtoll(PQgetvalue(held, 0, 1), NULL, 10),
        /* NULL (the column has no sequence any more) counts as out of order: the floor goes off */
        .seq_in_order = PQnfields(held) > 2 && strcmp(PQgetvalue(held, 0, 2), "t") == 0,
        .table_node = relfilenode(held, 3),
        .seq_node = relfilenode(held, 4),
        .seq_oid = relfilenode(held, 5),
    };
    unsigned restarts = s->floor.restarts;
    if (!floor_after_claim(&s->floor, &c))
        log_warn("out of memory for the claim floor; it stays where it is", "session=%d", s->index);
    if (!s->floor.enabled) {
        /* Asked again, as a check failed at connect is: undone (ALTER SEQUENCE ... NO CYCLE
         * CACHE 1), the floor is on again within a minute, not only when the session next
         * reconnects, which a healthy connection may never do. */
        s->floor_check_due = monotime_now() + FLOOR_CHECK_AGAIN_S;
        log_warn("the order column's sequence no longer hands out its values in order (a cache "
                 "or a cycle given while the relay runs); the claim floor is off until its check "
                 "passes again (asked every minute), claims read the unsent index from its start",
                 "column=%s session=%d", s->cfg->map.seq, s->index);
    } else if (s->floor.restarts != restarts) {
        log_info("the table was truncated or the order column's sequence set back; the claim "
                 "floor starts again from the table's start",
                 "sequence_last=%lld table_relfilenode=%u sequence_relfilenode=%u session=%d",
                 c.seq_last, c.table_node, c.seq_node, s->index);
        /* The relay's rows kept apart and rows to produce alone outlive reconnects (marks.c,
         * produce.c); new rows may now carry their ids. Forgotten before this claim's rows are
         * produced. */
        marks_unrecordable_forget_all(s);
        produce_isolate_forget_all(s->relay);
    }
}

void claim_floor_committed(Session *s)
{
    if (floor_commit(&s->floor))
        log_debug("claim floor moved", "floor=%lld session=%d", s->floor.floor, s->index);
}

/* The row of the recheck's answer (n rows) that holds row back, or -1. */
static int rechecked_holder(const PGresult *found, int n, const OutboxRow *row)
{
    for (int k = 0; k < n; k++)
        if (strcmp(row->aggregate_type, PQgetvalue(found, k, 0)) == 0 &&
            strcmp(row->aggregate_id, PQgetvalue(found, k, 1)) == 0 &&
            row->id > strtoll(PQgetvalue(found, k, 2), NULL, 10))
            return k;
    return -1;
}

/* What the claim's recheck found (SQL_CLAIM_RECHECK_HOLD: an aggregate, and the first of its rows
 * that another transaction made wait or dead-lettered while the claim ran, each of which the claim
 * saw as claimable or not at all): the claimed rows of that aggregate after that row are not
 * published in this batch. Its whole aggregate is held (batch_hold), also the rows before that
 * one, which go in the next claim: a rare event, not worth a finer hold. They stay unsent and
 * untouched, so the batch moves no floor; the next claim sees the row and holds them back
 * itself. A full answer (CLAIM_RECHECK_MAX) whose last row is surely new (its 4th column; those
 * come first) may have left surely new ones out: then every aggregate of the batch is held. One
 * whose last row is only possibly new (an xmin after the snapshot's oldest running transaction,
 * statements.c) has them all, and holds what it names. Logged once per claim that holds
 * anything back. A batch held whole (no dead event to copy either) publishes nothing: its
 * marks then ask for the retry backoff (marks.c, nothing_got_through), or a recheck that holds
 * every batch (a full answer of surely new rows, each time) would have the session claim again
 * at once, batch after batch, with nothing to bound the rate; said once per run of such
 * batches (note_held_whole). */
static void hold_rechecked(Session *s, const PGresult *found)
{
    int n =
        PQresultStatus(found) == PGRES_TUPLES_OK && PQnfields(found) >= 3 ? PQntuples(found) : 0;
    if (n == 0)
        return;
    Batch *b = &s->batch;
    bool all = n >= CLAIM_RECHECK_MAX &&
               (PQnfields(found) < 4 || strcmp(PQgetvalue(found, n - 1, 3), "t") == 0);
    int held = 0;
    const char *first = "";
    for (int i = 0; i < b->n; i++) {
        BatchRow *br = &b->rows[i];
        int k = br->dead_letter ? -1 : all ? 0 : rechecked_holder(found, n, &br->row);
        if (k < 0)
            continue;
        if (!*first)
            first = PQgetvalue(found, k, 2);
        if (!batch_is_held(b, &br->row))
            held++;
        batch_hold(b, &br->row);
    }
    if (held > 0)
        log_info("events of this claim wait: an earlier event of their aggregate was made to wait "
                 "or dead-lettered by another transaction while the claim ran",
                 "id=%s aggregates=%d all=%s session=%d", all ? "" : first, held,
                 all ? "yes" : "no", s->index);
    b->held_whole = true;
    for (int i = 0; i < b->n && b->held_whole; i++)
        b->held_whole = !b->rows[i].dead_letter && batch_is_held(b, &b->rows[i].row);
}

/* Counts the claims in a row whose batch the recheck held whole (hold_rechecked), and says when
 * such a run begins (warn: the session claims at the pace of the retry backoff meanwhile) and
 * when a claim that holds less, or finds nothing, ends it. */
static void note_held_whole(Session *s, bool whole)
{
    if (whole && s->held_whole_claims++ == 0)
        log_warn("every event of a claim waits: the recheck held all of their aggregates; the "
                 "session claims again after the retry backoff",
                 "rows=%d session=%d", s->batch.n, s->index);
    if (!whole && s->held_whole_claims > 0) {
        log_info("claims publish events again after claims whose events all waited",
                 "claims=%d session=%d", s->held_whole_claims, s->index);
        s->held_whole_claims = 0;
    }
}

ClaimOutcome claim_read(Session *s, PGresult **results, int n, const char *error)
{
    char q[512];
    floor_abandon(&s->floor); /* whatever an earlier claim allowed; learn_floor says anew */
    metrics_claim_done(monotime_now() - s->claim_sent_at);
    const char *state = error ? pg_failed_sqlstate(results, n) : NULL;
    if (state && strcmp(state, "55P03") == 0) /* lock_not_available: the claim's lock_timeout */
        return claim_locked(s);
    const ClaimLayout *at = &s->claim_at;
    int failed = error ? pg_first_failed(results, n) : n;
    if (error && s->floor.enabled && (failed == at->held || failed == at->writers) &&
        sqlstate_fault(state) == SQLSTATE_FAULT_SETUP) {
        /* The floor's own look failed for want of a privilege or an object (its SELECT on the
         * sequence revoked, an identity re-created with a new sequence and no grant): the floor
         * is an optimisation, so the session goes on without it until its check, asked again
         * every FLOOR_CHECK_AGAIN_S (and at each connection), passes, rather than give its lanes
         * up as for a broken setup. Its probe has no floor: it would pass, the session take its
         * lanes again and fail again, and deliver nothing. */
        floor_reset(&s->floor);
        s->floor.enabled = false;
        s->floor_check_due = monotime_now() + FLOOR_CHECK_AGAIN_S;
        log_warn("the claim floor's look failed; the floor is off until its check passes again "
                 "(asked every minute), claims read the unsent index from its start",
                 "error=%s session=%d", log_quote(error, q, sizeof(q)), s->index);
        return CLAIM_FAILED;
    }
    if (error || n < at->n) {
        if (sqlstate_fault(state) == SQLSTATE_FAULT_SETUP) {
            /* A missing table or column (migrate not run), missing privileges: no retry cures
             * it, so the session gives its lanes up to the relays that can claim them. */
            session_setup_failed(s, "claiming rows", state, error);
        } else if (!s->claim_error_logged) {
            log_error("claiming rows failed; retrying", "error=%s session=%d",
                      log_quote(error ? error : "short result", q, sizeof(q)), s->index);
            s->claim_error_logged = true;
        }
        return CLAIM_FAILED;
    }
    if (s->claim_error_logged)
        log_info("claiming rows works again", "session=%d", s->index);
    s->claim_error_logged = false;
    if (s->setup_fault) /* the probe (a claim of no lanes, the marks' statements on no rows) */
        return CLAIM_PROBE_PASSED;
    if (at->locker >= 0)
        learn_lockers(s, results[at->locker]);

    int events = PQntuples(results[at->events]);
    int dead = at->dead >= 0 ? PQntuples(results[at->dead]) : 0;
    if (at->held >= 0) /* a claim without the floor's looks moves nothing */
        learn_floor(s, results[at->held], results[at->events], results[at->writers]);
    if (events + dead == 0) {
        /* Nothing left that a Kafka setup fault refused, unless the claim left such rows out. */
        if (!s->hold.left_out) {
            if (s->hold.n > 0) { /* the probe: the held types have nothing left to send */
                log_info("no events left of the aggregate types held while Kafka refused their "
                         "topic; the hold ends",
                         "types=%d session=%d", s->hold.n, s->index);
                marks_hold_clear(s);
            }
            marks_nothing_unsent(s);
            /* The claim went through and left nothing out: nothing is claimable now, and
             * whatever made earlier claims fail let this one through, as a batch recorded
             * would say (failed rows not yet due are paced by their own next_attempt_at). Kept, the
             * grown backoff (up to RETRY_CAP_S) was what a passing failure met hours later on a
             * quiet outbox. (A setup fault's probe returned above: it keeps its backoff,
             * setup_fixed.) */
            backoff_reset(&s->retry);
        }
        adapt_row_limit(s, 0);
        note_held_whole(s, false);
        relay_batch_claimed(s->relay, false); /* caught up */
        claim_floor_committed(s); /* nothing claimed: nothing that a commit must record first */
        if (s->stopping || s->wake.asleep)
            return CLAIM_NOTHING; /* asleep already: that was the final check */
        /* Work came recently: stay awake and poll, so a steady stream never pays for NOTIFY. */
        bool quiet = monotime_now() - s->last_rows_at >= (double)s->cfg->sleep_after_ms / 1000.0;
        return quiet ? CLAIM_EMPTY_SLEEP : CLAIM_EMPTY_POLL;
    }
    s->last_rows_at = monotime_now();
    wakeup_work_came(&s->wake);
    if (s->stopping)
        return CLAIM_NOTHING; /* the rows go back untouched */
    if (kafka_fatal(s->relay->kafka)) {
        /* The producer failed while this claim was under way: produce nothing on it. The rows go
         * back untouched, and the retry recreates the producer once every session is done. */
        floor_abandon(&s->floor);
        return CLAIM_PRODUCER_FAILED;
    }
    /* The batch keeps the results: its rows point into them. */
    batch_load(&s->batch, results[at->events], at->dead >= 0 ? results[at->dead] : NULL);
    if (at->recheck >= 0)
        hold_rechecked(s, results[at->recheck]);
    note_held_whole(s, s->batch.held_whole);
    s->batch.claimed_at = monotime_now();
    s->batch.claim_sent_at = s->claim_sent_at;
    /* A full batch (as many rows as asked for, or half the byte budget: adapt_row_limit's
     * measure) means rows are waiting; enough in a row bring the resting sessions in. */
    s->batch_from_full_claim =
        events >= s->claim_limit || s->batch.bytes >= (size_t)s->cfg->batch_bytes / 2;
    relay_batch_claimed(s->relay, s->batch_from_full_claim);
    adapt_row_limit(s, events);
    results[at->events] = NULL;
    if (at->dead >= 0)
        results[at->dead] = NULL;
    log_debug("claimed batch", "rows=%d dead_letter=%d first_id=%lld bytes=%zu session=%d", events,
              dead, s->batch.rows[0].row.id, s->batch.bytes, s->index);
    return CLAIM_BATCH;
}

bool claim_build(Session *s, ClaimRequest *req)
{
    if (!relay_producer_ready(s->relay))
        return false;
    s->wake_pending = false;
    ev_timer_again(s->loop, &s->poll_timer);

    long batch_size = s->cfg->batch_size; /* may have grown on SIGHUP: make room between batches */
    if (!batch_reserve(&s->batch, (int)batch_size + DEAD_LETTER_LIMIT))
        batch_size = s->batch.capacity - DEAD_LETTER_LIMIT;
    if (s->row_limit > 0 && s->row_limit < batch_size)
        batch_size = s->row_limit;
    s->claim_limit = batch_size;
    snprintf(req->limit, sizeof(req->limit), "%ld", batch_size);
    snprintf(req->dead_limit, sizeof(req->dead_limit), "%d", DEAD_LETTER_LIMIT);
    /* One byte budget for the session, whichever claim loads the rows: with a dead-letter topic
     * its claim (usually empty) has a quarter of it, the claim of events the rest. */
    long dead_budget = s->cfg->dead_letter_topic ? s->cfg->batch_bytes / 4 : 0;
    snprintf(req->budget, sizeof(req->budget), "%ld", s->cfg->batch_bytes - dead_budget);
    snprintf(req->dead_budget, sizeof(req->dead_budget), "%ld", dead_budget);
    snprintf(req->max_message, sizeof(req->max_message), "%ld",
             kafka_message_max_bytes(s->relay->kafka));
    req->params[0] = req->limit;
    req->params[1] = s->lanes.owned_array.s;
    req->params[2] = req->budget;
    req->params[3] = req->max_message;
    /* The aggregate types Kafka refuses are left out (TopicHold), but for the probe after each
     * hold backoff, which claims them too, from below their rows (the floor may have passed
     * them since the hold began). */
    s->hold.probing = s->hold.n > 0 && s->hold.probe_due;
    s->hold.left_out = s->hold.n > 0 && !s->hold.probing;
    req->params[4] = s->hold.probing ? floor_hold_param(&s->floor) : floor_param(&s->floor);
    req->params[5] = s->hold.left_out && s->hold.param.s ? s->hold.param.s : "{}";
    req->dead_params[0] = req->dead_limit;
    req->dead_params[1] = s->lanes.owned_array.s;
    req->dead_params[2] = req->dead_budget;
    req->dead_params[3] = req->max_message;
    req->held_params[0] = s->lanes.owned_array.s;
    req->held_params[1] =
        req->params[5]; /* a held type's failed rows hold the floor back no more */
    req->writers_params[0] = floor_writers_param(&s->floor);
    req->no_rows[0] = "{}";
    /* Any claim of a sleeping follower but the one that follows falling asleep is a wakeup: it
     * asks again before it sleeps again, as its guard may have left. A guard goes on sleeping
     * through claims its timer brings about; it leaves when notified or given work (see
     * next_step in session.c). */
    wakeup_before_claim(&s->wake);
    /* The planner settings first: the look-ups of failed rows (the dead-letter claim, the
     * floor's, the claim's) rely on them to read the retry index (statements.c). */
    PgQuery *queries = req->queries;
    ClaimLayout at = {.dead = -1, .held = -1, .writers = -1, .locker = -1, .recheck = -1};
    int nq = 0;
    queries[nq++] = (PgQuery){SQL_BEGIN, 0, NULL, false};
    queries[nq++] = (PgQuery){SQL_CLAIM_PLAN, 0, NULL, true};
    if (s->cfg->dead_letter_topic) {
        at.dead = nq;
        queries[nq++] = (PgQuery){s->sql[SQL_CLAIM_DEAD], 4, req->dead_params, true};
    }
    /* The floor's look at failed rows comes before the claim, its look at writers after it:
     * floor.h says why the order matters. At most every FLOOR_LOOK_INTERVAL_S: an awake session
     * polls every --busy-poll-interval, and reading pg_locks each time would cost more than a
     * floor a few claims behind. A read of pg_locks copies the lock table of the whole server
     * under all its lock-manager partition locks, so it costs in proportion to every
     * database's locks (each relay holds its 64 lanes'), and stalls lock traffic in all of them
     * while it runs: a process serving N databases has each look N times less often, keeping
     * its looks per second those of one database (measured with bench/multidb.sh: 50 databases
     * at 200 events/s, p50 commit-to-sent 986 ms with a look every 20 ms each, 60 ms without). */
    bool floor_looking = s->floor.enabled && !s->setup_fault && !s->around_locks &&
                         monotime_now() >= s->floor_look_due;
    if (floor_looking) {
        s->floor_look_due = monotime_now() + FLOOR_LOOK_INTERVAL_S * relays_in_process();
        at.held = nq;
        queries[nq++] = (PgQuery){
            s->sql[s->claim_stmt == SQL_CLAIM_HOLD ? SQL_FLOOR_HELD_HOLD : SQL_FLOOR_HELD_SKIP], 2,
            req->held_params, true};
    }
    s->claim_sent = s->around_locks ? SQL_AROUND_LOCKS_OF(s->claim_stmt) : s->claim_stmt;
    /* Only the claim in order starts at the floor; the one around locks looks at a window of
     * rows from the start of the unsent index (it lasts while the locks do). */
    if (s->around_locks) {
        snprintf(req->window, sizeof(req->window), "%ld", s->busy_window);
        req->params[4] = req->window;
        req->locker_params[0] = req->window;
        req->locker_params[1] = s->lanes.owned_array.s;
    }
    at.events = nq;
    queries[nq++] = (PgQuery){s->sql[s->claim_sent], 6, req->params, true};
    if (!s->setup_fault) { /* a probe claims no lanes: nothing to recheck */
        snprintf(req->recheck_limit, sizeof(req->recheck_limit), "%d", CLAIM_RECHECK_MAX);
        req->recheck_params[0] = s->lanes.owned_array.s;
        req->recheck_params[1] = req->recheck_limit;
        at.recheck = nq;
        queries[nq++] = (PgQuery){s->sql[s->claim_stmt == SQL_CLAIM_HOLD ? SQL_CLAIM_RECHECK_HOLD
                                                                         : SQL_CLAIM_RECHECK_SKIP],
                                  2, req->recheck_params, true};
    }
    if (s->around_locks) {
        at.locker = nq;
        queries[nq++] = (PgQuery){s->sql[SQL_FIND_LOCKER], 2, req->locker_params, true};
    }
    if (floor_looking) {
        at.writers = nq;
        queries[nq++] = (PgQuery){s->sql[SQL_FLOOR_WRITERS], 1, req->writers_params, true};
    }
    if (s->setup_fault) {
        /* The probe of a session whose setup failed (it has no lanes, so the claim takes
         * nothing): the statement that records sent rows, on none, needs the privilege the
         * marks need (DELETE with --on-sent delete); the claim's FOR UPDATE needs UPDATE. */
        queries[nq++] =
            (PgQuery){s->sql[s->cfg->on_sent == ON_SENT_DELETE ? SQL_DELETE_SENT : SQL_MARK_SENT],
                      1, req->no_rows, true};
        /* And the lane group's look (pg_locks, pg_database), which a role may be refused: a
         * probe that passed without it would have the session join, fail its look and give its
         * lanes up again after every retry backoff (session.c, EVENT_LANES_REPLY). */
        queries[nq++] = (PgQuery){SQL_LANES_MEMBERS, 0, NULL, true};
        /* And the advisory lock functions the join and the lanes' locks call, for the same
         * reason: EXECUTE may be revoked from PUBLIC as SELECT on pg_locks may. */
        queries[nq++] = (PgQuery){SQL_LANES_CALLABLE, 0, NULL, true};
    }
    at.n = req->n = nq;
    s->claim_at = at;
    return true;
}
