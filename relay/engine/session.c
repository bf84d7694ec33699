/* session: the driver of one claim session's cycle (engine.h). session_step is the only function
 * that moves a session; everything that happens to it arrives there as an event. Reading this file
 * from `cycle` (the phases and their changes) to session_step (what each event does in each phase)
 * and next_step (what a session between batches does next) is reading the whole cycle. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"
#include "secrets.h"
#include "monotime.h"
#include "diagnose.h"
#include "sqlstate.h"
#include "table.h"

/* ---- the cycle ---------------------------------------------------------------------------- */

/* Every phase change the cycle makes, with what makes it: the driver's table, checked by
 * session_set_phase on each change and drawn in docs/session-cycle.md (tools/gen-cycle.sh writes
 * the drawing from these lines; `make test` checks they agree). Any phase may also go DOWN: the
 * connection can go at any moment. One row per line, in this form, for the drawing's sake. */
static const struct {
    Phase from, to;
    const char *when;
} cycle[] = {
    {PHASE_DOWN, PHASE_SETUP, "connected: LISTEN"},
    {PHASE_SETUP, PHASE_SETUP, "the floor's check failed: LISTEN again, alone"},
    {PHASE_SETUP, PHASE_IDLE, "listening (or the floor's check done again)"},
    {PHASE_IDLE, PHASE_REBALANCING, "lanes to look at"},
    {PHASE_IDLE, PHASE_SETUP, "the floor's check, failed before, due again: alone"},
    {PHASE_REBALANCING, PHASE_IDLE, "lanes divided"},
    {PHASE_IDLE, PHASE_LEAVING_LANES, "resting, or a setup fault"},
    {PHASE_LEAVING_LANES, PHASE_IDLE, "lanes given up"},
    {PHASE_IDLE, PHASE_LEAVING_GUARD, "a guard notified, with work or no lanes, stopping, or lost"},
    {PHASE_LEAVING_GUARD, PHASE_IDLE, "wakeup lock given up (or a lost process ended)"},
    {PHASE_IDLE, PHASE_CLAIMING, "rows may wait: claim (or probe the setup)"},
    {PHASE_CLAIMING, PHASE_IDLE, "the claim could not be sent"},
    {PHASE_CLAIMING, PHASE_PRODUCING, "rows claimed"},
    {PHASE_CLAIMING, PHASE_ENDING, "nothing to produce: COMMIT or ROLLBACK"},
    {PHASE_CLAIMING, PHASE_GOING_TO_SLEEP, "empty and quiet: COMMIT and sleep"},
    {PHASE_ENDING, PHASE_IDLE, "transaction ended"},
    {PHASE_GOING_TO_SLEEP, PHASE_IDLE, "asleep, or a producer is busy"},
    {PHASE_PRODUCING, PHASE_MARKING, "every report in: marks + COMMIT"},
    {PHASE_PRODUCING, PHASE_MARKING_AND_CLAIMING, "every report in, small batch: + next claim"},
    {PHASE_MARKING, PHASE_IDLE, "batch recorded"},
    {PHASE_MARKING, PHASE_ROLLING_BACK, "marks failed"},
    {PHASE_MARKING_AND_CLAIMING, PHASE_CLAIMING, "batch recorded: read the claim behind it"},
    {PHASE_MARKING_AND_CLAIMING, PHASE_ROLLING_BACK, "marks failed"},
    {PHASE_ROLLING_BACK, PHASE_RECORDING_ROW, "a row refused: record row by row"},
    {PHASE_ROLLING_BACK, PHASE_IDLE, "not the rows' fault: retry the batch"},
    {PHASE_RECORDING_ROW, PHASE_RECORDING_ROW, "next row"},
    {PHASE_RECORDING_ROW, PHASE_IDLE, "every row recorded, or stopping"},
};

static bool phase_change_allowed(Phase from, Phase to)
{
    if (to == PHASE_DOWN)
        return true;
    for (size_t i = 0; i < sizeof(cycle) / sizeof(cycle[0]); i++)
        if (cycle[i].from == from && cycle[i].to == to)
            return true;
    return false;
}

const char *session_phase_name(Phase p)
{
    static const char *const names[PHASE_COUNT] = {
        [PHASE_DOWN] = "down",
        [PHASE_SETUP] = "setup",
        [PHASE_IDLE] = "idle",
        [PHASE_REBALANCING] = "rebalancing",
        [PHASE_LEAVING_LANES] = "leaving lanes",
        [PHASE_LEAVING_GUARD] = "leaving guard",
        [PHASE_CLAIMING] = "claiming",
        [PHASE_PRODUCING] = "producing",
        [PHASE_MARKING] = "marking",
        [PHASE_MARKING_AND_CLAIMING] = "marking and claiming",
        [PHASE_ROLLING_BACK] = "rolling back",
        [PHASE_RECORDING_ROW] = "recording row",
        [PHASE_ENDING] = "ending",
        [PHASE_GOING_TO_SLEEP] = "going to sleep",
    };
    return p >= 0 && p < PHASE_COUNT ? names[p] : "?";
}

void (*session_phase_observer)(const Session *s, Phase from, Phase to);

void session_set_phase(Session *s, Phase to)
{
    if (!phase_change_allowed(s->phase, to)) {
        log_error("internal error: a session changed phase in a way its cycle does not allow",
                  "from=%s to=%s session=%d", session_phase_name(s->phase), session_phase_name(to),
                  s->index);
        abort();
    }
    if (session_phase_observer)
        session_phase_observer(s, s->phase, to);
    s->phase = to;
}

/* ---- timers ------------------------------------------------------------------------------- */

/* Claims again after --busy-poll-interval: an awake session with nothing to do, or one that
 * producers kept from going to sleep. */
static void poll_soon(Session *s)
{
    /* A claim a notification brought about can come back empty while the timer is still armed,
     * and libev forbids changing an active timer. */
    ev_timer_stop(s->loop, &s->busy_timer);
    ev_timer_set(&s->busy_timer, (double)s->cfg->busy_poll_interval_ms / 1000.0, 0);
    ev_timer_start(s->loop, &s->busy_timer);
}

/* Claims again after the retry backoff (which grows with each call until reset). */
static void schedule_retry(Session *s)
{
    double delay = backoff_next(&s->retry);
    ev_timer_stop(s->loop, &s->retry_timer);
    ev_timer_set(&s->retry_timer, delay, 0);
    ev_timer_start(s->loop, &s->retry_timer);
}

/* The retry backoff is running: no claim before it ends. */
static bool retry_waits(const Session *s)
{
    return ev_is_active(&s->retry_timer);
}

static void start_timer(Session *s, ev_timer *t, double seconds)
{
    ev_timer_stop(s->loop, t); /* libev: never set an active timer */
    ev_timer_set(t, seconds, 0);
    ev_timer_start(s->loop, t);
}

/* The hold (TopicHold) paces its probes: with types held and no probe due, the timer runs (the
 * hold backoff, growing with each probe); with none held it is stopped. */
static void pace_hold(Session *s)
{
    if (s->hold.n == 0)
        ev_timer_stop(s->loop, &s->hold_timer);
    else if (!ev_is_active(&s->hold_timer) && !s->hold.probe_due)
        start_timer(s, &s->hold_timer, backoff_next(&s->hold.backoff));
}

/* ---- setup faults ------------------------------------------------------------------------- */

/* What an operator does about a setup fault, by its SQLSTATE, into buf. migrate gives DELETE only
 * with a role's first grants (a REVOKE DELETE stays revoked), so for it only the GRANT helps. */
static const char *setup_hint(const Session *s, const char *state, char *buf, size_t buflen)
{
    if (state && strcmp(state, "42501") == 0) {
        char table[DIAGNOSE_TABLE_MAX];
        diagnose_quote_table(&s->cfg->map, s->cfg->schema, table, sizeof(table));
        bool deletes = s->cfg->on_sent == ON_SENT_DELETE || s->cfg->retention_s > 0;
        snprintf(buf, buflen,
                 "grant the relay's role its privileges: `outbox-relay check`, run as the relay's "
                 "login, names each one missing with its GRANT; `outbox-relay migrate`, as the "
                 "table's owner, gives outbox_relay all but DELETE again%s%s%s",
                 deletes ? ", and only GRANT DELETE ON " : "", deletes ? table : "",
                 deletes ? " TO outbox_relay gives DELETE back" : "");
        return buf;
    }
    if (state &&
        (strcmp(state, "42P01") == 0 || strcmp(state, "42703") == 0 || strcmp(state, "3F000") == 0))
        return "the outbox table, a column or its schema is missing: run `outbox-relay migrate`, "
               "or check --table and the column options";
    return "fix the database or the relay's configuration; the relay checks again after each "
           "retry backoff";
}

void session_setup_failed(Session *s, const char *what, const char *state, const char *error)
{
    char q[512], w[64], hint[600], h[800];
    const char *text = error ? error : "unknown error";
    /* What /readyz and STATUS= show: scrubbed whole, then cut (a secret straddling the cut
     * would leave a fragment the scrub no longer matches). */
    char shown[sizeof(s->setup_error)];
    char *whole = strdup(text);
    if (whole)
        secrets_scrub(whole);
    snprintf(shown, sizeof(shown), "%s", whole ? whole : "(out of memory)");
    free(whole);
    bool said = false; /* one line per distinct error for the whole relay */
    for (int i = 0; i < s->relay->n_sessions; i++) {
        const Session *other = &s->relay->sessions[i];
        said = said || (other->setup_fault && strcmp(other->setup_error, shown) == 0);
    }
    LogLevel level = said ? LOG_DEBUG : LOG_ERROR;
    log_write(level,
              "the relay cannot work with this database as it is set up: the session gives its "
              "lanes up and the relay is not ready until it is fixed",
              "what=%s sqlstate=%s error=%s hint=%s session=%d", log_quote(what, w, sizeof(w)),
              state ? state : "", log_quote(text, q, sizeof(q)),
              log_quote(setup_hint(s, state, hint, sizeof(hint)), h, sizeof(h)), s->index);
    s->setup_fault = true;
    memcpy(s->setup_error, shown, sizeof(shown));
}

/* A setup probe went through: the session joins the lane group again at its next step. */
static void setup_fixed(Session *s)
{
    log_info("the setup is fixed: the session takes lanes again", "session=%d", s->index);
    s->setup_fault = false;
    s->setup_error[0] = '\0';
    /* The backoff is not reset: a probe on no rows can pass where real rows still fail (a row
     * trigger touching a table the role may not use), and each such round claims and publishes
     * the batch again. It resets with the first batch recorded. */
    s->rebalance_due = true;
    s->wake_pending = true;
}

/* The claim floor needs {seq} drawn in order (SQL_FLOOR_CHECK, floor.h); said once per database
 * (its relay) when the table does not allow it, or the check itself failed: each database has
 * its own table and grants. Once per episode: a check that passes ends it, so the floor off again
 * later (a grant revoked, a reconnect whose check fails) is said again. */
static void learn_floor_allowed(Session *s, PGresult *check)
{
    char why[512], q[600];
    bool allowed = check && diagnose_floor(check, &s->cfg->map, why, sizeof(why));
    bool again = s->floor_check_due > 0;
    s->floor.enabled = s->cfg->claim_floor && allowed;
    /* Off, it stayed off until the session reconnected, however soon the grant or the sequence
     * was fixed: the check is asked again, alone, every FLOOR_CHECK_AGAIN_S (next_step). */
    s->floor_check_due = s->cfg->claim_floor && !allowed ? monotime_now() + FLOOR_CHECK_AGAIN_S : 0;
    if (allowed)
        s->relay->floor_off_said = false;
    if (again && s->floor.enabled)
        log_info("the claim floor's check passes now; claims start after the rows already sent",
                 "session=%d", s->index);
    if (s->cfg->claim_floor && !allowed && !s->relay->floor_off_said) {
        log_warn("claims read the unsent index from its start "
                 "(docs/operations.md#dead-rows-and-old-snapshots)",
                 "column=%s cause=%s", s->cfg->map.seq, log_quote(why, q, sizeof(q)));
        s->relay->floor_off_said = true;
    }
}

/* The relay's lanes, in all, when they changed. */
static void log_lanes_owned(Relay *r, int live_sessions)
{
    int owned = relay_lanes_owned(r);
    if (owned != r->logged_owned)
        log_info("lanes owned", "lanes=%d of=%d sessions=%d live_sessions=%d", owned, LANE_COUNT,
                 r->active_sessions, live_sessions);
    r->logged_owned = owned;
}

/* ---- sending: every request of the cycle goes out here ------------------------------------ */

static void on_reply(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    if (!results)
        return; /* connection lost: EVENT_DISCONNECTED follows (pg.h) */
    SessionEvent ev = {.kind = EVENT_REPLY, .results = results, .n = n, .error = error};
    session_step(arg, &ev);
}

static void on_lanes_reply(Lanes *lanes, bool ok, void *arg)
{
    SessionEvent ev = {.kind = EVENT_LANES_REPLY, .ok = ok};
    session_step(arg, &ev);
}

/* Sends a request of phase `to` (entered first); a connection that cannot take it (busy: a bug)
 * is reset, which ends the phase as the loss of a connection does. */
static void send_request(Session *s, Phase to, const PgQuery *queries, int n, const char *what)
{
    /* The shutdown timeout bounds the wait for the producer's reports (begin_stopping). What
     * follows them (the marks and COMMIT of what was acknowledged, and a rollback if they fail)
     * has the bound every request has (--session-timeout): left running, the timer would end
     * the process mid-mark, and acknowledged events would go out again. */
    if (s->phase == PHASE_PRODUCING)
        ev_timer_stop(s->loop, &s->shutdown_timer);
    session_set_phase(s, to);
    if (!pg_conn_send(s->pg, queries, n, on_reply, s))
        pg_conn_reset(s->pg, what);
}

/* Ends the open transaction (sql: COMMIT or ROLLBACK) without marking anything. */
static void end_transaction(Session *s, const char *sql)
{
    PgQuery q = {sql, 0, NULL, false};
    send_request(s, PHASE_ENDING, &q, 1, "connection busy while ending a transaction");
}

static void send_claim(Session *s)
{
    ClaimRequest req;
    s->producer_wait = !claim_build(s, &req);
    if (s->producer_wait) {
        /* The last of the other sessions' batches wakes it (relay_batch_done); the backoff is
         * a bound should none. */
        if (!s->relay->stopping)
            schedule_retry(s);
        return;
    }
    s->claim_sent_at = monotime_now();
    session_set_phase(s, PHASE_CLAIMING);
    if (!pg_conn_send(s->pg, req.queries, req.n, on_reply, s))
        session_set_phase(s, PHASE_IDLE);
}

/* A guard gives the wakeup lock up (and wakes its followers), in a transaction of its own; or,
 * after a reconnect, a lost guard's or lane holder's server process is ended (and a guard's
 * followers woken: wakeup.h). */
static void send_leave_guard(Session *s)
{
    PgQuery q = {SQL_WAKE, 0, NULL, false};
    const char *values[6];
    char buf[36];
    StrBuf spared = {0};
    if (wakeup_lost_guard_due(&s->wake)) {
        /* Half the round trip's deadline (the session timeout) at most: the answer comes. */
        long wait_ms =
            s->cfg->session_timeout_ms / 2 < 5000 ? s->cfg->session_timeout_ms / 2 : 5000;
        /* Behind a pooler the lost process may serve another session of this relay by now:
         * never that one (wakeup.h). A session down still names its lost process: left out. */
        strbuf_array_begin(&spared);
        for (int i = 0; i < s->relay->n_sessions; i++) {
            const Session *other = &s->relay->sessions[i];
            int pid;
            char start[PG_BACKEND_START_LEN];
            if (other != s && other->phase != PHASE_DOWN && pg_conn_backend(other->pg, &pid, start))
                strbuf_array_int(&spared, pid);
        }
        strbuf_array_end(&spared);
        wakeup_lost_guard_build(&s->wake, PQserverVersion(pg_conn_libpq(s->pg)), wait_ms, spared.s,
                                &q, values, buf);
    }
    wakeup_leaving_guard(&s->wake);
    session_set_phase(s, PHASE_LEAVING_GUARD);
    if (!pg_conn_send(s->pg, &q, 1, on_reply, s))
        session_set_phase(s, PHASE_IDLE);
    strbuf_free(&spared);
}

/* Whether the claim after the batch being marked may ride behind its COMMIT, in the same round
 * trip: only behind a batch that got something through (else the retry backoff may be due) and a
 * small one (a quarter of --batch-size and of --batch-bytes at most: its result is still held when
 * the next claim's arrives, and a full batch means a backlog, where a round trip per batch is
 * little and memory stays at one batch per session), with room for the batch (a --batch-size
 * grown by SIGHUP is allocated only between batches), and when next_step would claim at once
 * after the COMMIT. */
static bool may_chain_claim(const Session *s);

/* Every report is in: the marks and COMMIT, with the next claim behind them when it may ride
 * along (it saves the session a round trip per batch, which is what a row committed while the
 * session was busy waits for; the server runs it after the COMMIT, so it sees this batch's
 * marks). */
static void send_marks(Session *s)
{
    ev_timer_stop(s->loop, &s->delivery_timer);
    marks_prepare(s);
    MarkRequest req;
    ClaimRequest next;
    bool chain = may_chain_claim(s) && claim_build(s, &next);
    if (chain)
        s->claim_sent_at = s->marks_sent_at;
    marks_build(s, true, chain ? &next : NULL, &req);
    send_request(s, chain ? PHASE_MARKING_AND_CLAIMING : PHASE_MARKING, req.queries, req.n,
                 "connection busy while marking");
}

static void batch_finished(Session *s, bool retry, bool committed);

/* Recording row by row: the next row's marks, or the batch is done. */
static void send_next_row(Session *s)
{
    MarkRequest req;
    if (marks_next_row(s, &req)) {
        send_request(s, PHASE_RECORDING_ROW, req.queries, req.n, "connection busy while marking");
        return;
    }
    batch_finished(s, marks_row_by_row_retry(s), true);
}

/* ---- what comes next between batches ------------------------------------------------------ */

typedef enum {
    NEXT_WAIT,        /* nothing to do until an event */
    NEXT_STOP,        /* stopping: finish (a guard gives its lock up first) */
    NEXT_LEAVE_LANES, /* resting or a setup fault: give the lanes and member slot up */
    NEXT_REBALANCE,   /* look at lane ownership */
    NEXT_LEAVE_GUARD, /* a guard notified or with work gives the wakeup lock up */
    NEXT_CHECK_FLOOR, /* the floor's check, failed before, asked again before a claim */
    NEXT_CLAIM,       /* claim the next batch */
    NEXT_PROBE,       /* a setup fault's claim of no lanes, after each retry backoff */
} NextStep;

/* The one answer to "what does the session do next between batches" (wake: whether there may
 * be rows to claim; the caller checks the session is between batches). Resting sessions and
 * those with a setup fault hold no lanes; a due rebalance comes first, then a guard's leaving,
 * then a claim when there may be rows and no backoff runs. */
static NextStep next_step(const Session *s, bool wake)
{
    if (s->stopping)
        return NEXT_STOP;
    if (wakeup_lost_guard_due(&s->wake))
        return NEXT_LEAVE_GUARD; /* before a look at the lanes: its process may hold some */
    if (s->setup_fault) {
        if (s->lanes.slot >= 0 || s->lanes.n_owned > 0)
            return NEXT_LEAVE_LANES;
        if (wakeup_guard_must_leave(s))
            return NEXT_LEAVE_GUARD;
        return wake && !retry_waits(s) ? NEXT_PROBE : NEXT_WAIT;
    }
    if (relay_session_resting(s->relay, s)) {
        if (s->lanes.slot >= 0)
            return NEXT_LEAVE_LANES;
        return wakeup_guard_must_leave(s) ? NEXT_LEAVE_GUARD : NEXT_WAIT;
    }
    if (s->rebalance_due)
        return NEXT_REBALANCE;
    if (wakeup_guard_must_leave(s))
        return NEXT_LEAVE_GUARD;
    if (!wake || s->lanes.n_owned == 0 || retry_waits(s))
        return NEXT_WAIT;
    if (s->floor_check_due > 0 && monotime_now() >= s->floor_check_due)
        return NEXT_CHECK_FLOOR;
    return NEXT_CLAIM;
}

static bool may_chain_claim(const Session *s)
{
    const Batch *b = &s->batch;
    bool small = b->n <= s->cfg->batch_size / 4 && b->bytes <= (size_t)s->cfg->batch_bytes / 4;
    bool batch_fits = s->cfg->batch_size + DEAD_LETTER_LIMIT <= b->capacity;
    /* Not after a Kafka setup fault: the next claim waits for the retry backoff. */
    return b->acked > 0 && b->setup_faults == 0 && small && batch_fits && !s->relay->stopping &&
           next_step(s, true) == NEXT_CLAIM;
}

/* A session has finished shutting down; the loop ends with the last one (of the last database). */
static void stopped(Session *s)
{
    ev_timer_stop(s->loop, &s->shutdown_timer);
    if (s->stopped)
        return;
    s->stopped = true;
    if (relay_session_stopped(s->relay)) /* with several databases, the others go on */
        ev_break(s->loop, EVBREAK_ALL);
}

/* Ends the session's part. A guard on the way out gives up the wakeup lock with a notification
 * (when the connection is there to do it, within a second): the followers it guarded must not go
 * on sleeping unguarded. So does a session whose lost process's ending is still due (SIGTERM
 * right after a reconnect): that process would keep its lanes from the other relays (and a lost
 * guard's followers asleep) until the server ended it. Its reply comes back to the driver, and
 * the session is done. */
static void finish_stopping(Session *s)
{
    ev_timer_stop(s->loop, &s->shutdown_timer);
    bool leave = s->wake.guard || wakeup_lost_guard_due(&s->wake);
    if (!s->wake.left && leave && s->phase == PHASE_IDLE && pg_conn_idle(s->pg)) {
        s->wake.left = true;
        start_timer(s, &s->shutdown_timer, 1.0);
        send_leave_guard(s);
        return;
    }
    stopped(s);
}

/* Starts what next_step says, for a session between batches. */
static void start_next(Session *s)
{
    if (s->stopped)
        return;
    if (s->stopping) { /* at once between batches, with or without a connection */
        if (s->phase == PHASE_IDLE || s->phase == PHASE_DOWN)
            finish_stopping(s);
        return;
    }
    if (s->phase != PHASE_IDLE || !pg_conn_idle(s->pg))
        return; /* a request is out */
    if (s->batch.n > 0) {
        /* A batch is out (perhaps abandoned, its reports not all in). A lost process's ending
         * does not wait for it: until then that process keeps its lanes from every session, of
         * this relay or another, for as long as the reports take (up to --delivery-timeout). */
        if (s->batch.abandoned && wakeup_lost_guard_due(&s->wake))
            send_leave_guard(s);
        return;
    }
    switch (next_step(s, s->wake_pending)) {
    case NEXT_WAIT:
    case NEXT_STOP: /* handled above */
        return;
    case NEXT_LEAVE_LANES:
        s->rebalance_due = false; /* no member, nothing to re-divide */
        session_set_phase(s, PHASE_LEAVING_LANES);
        if (!lanes_leave(&s->lanes, s->pg, on_lanes_reply, s))
            session_set_phase(s, PHASE_IDLE);
        return;
    case NEXT_REBALANCE:
        /* Cleared as the look goes out, not when its answer comes: a change of the group
         * while it is out (a session resting, one joining) describes a group its answer may
         * not have seen, and sets the flag again for another look before the next claim. */
        s->rebalance_due = false;
        session_set_phase(s, PHASE_REBALANCING);
        if (!lanes_rebalance(&s->lanes, s->pg, relay_lane_mark(s->relay), on_lanes_reply, s)) {
            s->rebalance_due = true;
            session_set_phase(s, PHASE_IDLE);
        }
        return;
    case NEXT_LEAVE_GUARD:
        send_leave_guard(s);
        return;
    case NEXT_CHECK_FLOOR: {
        /* Alone: in a pipeline, its failure would abort the statements that share it. */
        PgQuery q = {s->sql[SQL_FLOOR_CHECK], 0, NULL, false};
        s->floor_rechecking = true;
        send_request(s, PHASE_SETUP, &q, 1, "connection busy while checking the floor");
        return;
    }
    case NEXT_CLAIM:
    case NEXT_PROBE:
        send_claim(s);
        return;
    }
}

/* Tells the relay's other sessions to re-divide the lanes at their next step between batches: s
 * joined or left the group, or saw the group change, so lanes move within a batch rather than at
 * the others' next interval. */
static void rebalance_others(Session *s)
{
    Relay *r = s->relay;
    for (int i = 0; i < r->n_sessions; i++) {
        Session *other = &r->sessions[i];
        if (other != s && !other->stopping && !relay_session_resting(r, other))
            session_event(other, EVENT_REBALANCE_DUE);
    }
}

/* s can claim again (its connection is up, its setup fault fixed, its abandoned batch let go):
 * the sessions after it that it pushes out of the first active_sessions that can claim rest from
 * now on (relay_session_resting), and give their lanes up between batches. Told now, as
 * on_rest_timer tells them: one asleep would keep its lanes until its next event (a notification,
 * the poll or rebalance timer) while s joins and takes only its share. */
static void rest_others(Session *s)
{
    Relay *r = s->relay;
    for (int i = s->index + 1; i < r->n_sessions; i++)
        if (relay_session_resting(r, &r->sessions[i]))
            session_event(&r->sessions[i], EVENT_LOOK);
}

/* ---- replies: what each phase's request came back with ------------------------------------ */

/* The reply to LISTEN and the floor's check (connected), or to LISTEN sent again alone. Both went
 * in one pipeline, which PostgreSQL runs as one implicit transaction: when the check fails (a role
 * without USAGE on the table's schema: "permission denied for schema"), the LISTEN that went
 * through rolls back with it, though its own result says COMMAND_OK, and the session would go on
 * deaf; it could even become the wakeup guard, whose producers' notifications no one hears. So
 * LISTEN is sent again, on its own. */
static void listening(Session *s, PGresult **results, int n, const char *error)
{
    if (s->floor_rechecking) { /* the floor's check asked again (NEXT_CHECK_FLOOR) */
        s->floor_rechecking = false;
        learn_floor_allowed(s, n == 1 ? results[0] : NULL);
        session_set_phase(s, PHASE_IDLE); /* the claim it came before is still due */
        return;
    }
    if (n == 2 && PQresultStatus(results[1]) == PGRES_PIPELINE_ABORTED) {
        /* LISTEN itself failed (said below), so the floor's check never ran: nothing is known of
         * the floor, and reading the skipped check as a failed one blamed the floor with an
         * empty cause. Off until its check, asked alone before the first claim, says. */
        s->floor.enabled = false;
        s->floor_check_due = s->cfg->claim_floor ? monotime_now() : 0;
    } else if (n == 2) {
        learn_floor_allowed(s, results[1]);
        if (error && PQresultStatus(results[0]) == PGRES_COMMAND_OK) {
            /* Only the floor's check failed (said above): the LISTEN was rolled back with it. */
            PgQuery q = {SQL_LISTEN, 0, NULL, false};
            send_request(s, PHASE_SETUP, &q, 1, "connection busy while listening");
            return;
        }
    }
    s->listening = !error;
    if (error) {
        char q[512];
        log_warn("LISTEN failed; the session polls every --poll-interval and never sleeps",
                 "error=%s session=%d", log_quote(error, q, sizeof(q)), s->index);
    }
    session_set_phase(s, PHASE_IDLE);
    s->wake_pending = true;
    s->rebalance_due = true;
}

static void lanes_divided(Session *s)
{
    Lanes *lanes = &s->lanes;
    bool leaving = s->phase == PHASE_LEAVING_LANES;
    session_set_phase(s, PHASE_IDLE);
    if (leaving) {
        s->seen_members = 0;
        floor_reset(&s->floor); /* its lanes may come back with other rows */
        marks_hold_clear(s);    /* and so may the hold's types (rows kept apart are the relay's) */
        pace_hold(s);
        /* A Kafka setup fault goes with the lanes too: resting, the session claims nothing
         * that could clear it, and /readyz would name it after the session that took its lanes
         * over delivered their rows. That session meets the fault again if it lasts. */
        s->kafka_fault[0] = '\0';
        /* Not logged as lanes owned: the other sessions take its lanes over at once, and log
         * the relay's total if it changed. */
        log_debug("session rests", "session=%d", s->index);
        rebalance_others(s);
        /* Called back while it was leaving (a backlog: relay_batch_claimed skips members): it
         * joins again at once rather than at its next interval. */
        if (!s->setup_fault && !relay_session_resting(s->relay, s))
            s->rebalance_due = true;
        return;
    }
    log_lanes_owned(s->relay, lanes->live_sessions);
    bool membership_changed = lanes->members != s->seen_members;
    s->seen_members = lanes->members;
    if (lanes->gained) {
        s->wake_pending = true; /* new lanes may hold a backlog */
        floor_reset(&s->floor); /* anywhere in the table */
    }
    if (membership_changed)
        rebalance_others(s);
}

static void claimed(Session *s, PGresult **results, int n, const char *error)
{
    unsigned restarts = s->floor.restarts;
    bool floor_on = s->floor.enabled;
    ClaimOutcome outcome = claim_read(s, results, n, error);
    pace_hold(s); /* a probe that found nothing ended the hold */
    /* The floor's look in this claim restarted the floor (a reset table or sequence) or turned
     * it off: the claim itself still read from the old floor, above rows drawn below it, which
     * were committed before and bring no notification. Claim again at once from the table's
     * start; a session asleep (its final claim done) would otherwise leave them to the poll. */
    if (s->floor.restarts != restarts || (floor_on && !s->floor.enabled))
        s->wake_pending = true;
    switch (outcome) {
    case CLAIM_BATCH:
        session_set_phase(s, PHASE_PRODUCING);
        start_timer(s, &s->delivery_timer, (double)s->cfg->delivery_timeout_ms / 1000.0);
        produce_more(s);
        return;
    case CLAIM_EMPTY_SLEEP: {
        if (!s->listening) {
            /* Deaf (its LISTEN failed): asleep, no notification would wake it, and as the
             * wakeup guard it would leave every producer's notification unheard. It polls:
             * the poll timer (--poll-interval, rearmed by each claim) brings its next claim. */
            end_transaction(s, SQL_COMMIT);
            return;
        }
        PgQuery q[2] = {{SQL_COMMIT, 0, NULL, false}, {SQL_SLEEP, 0, NULL, false}};
        wakeup_before_sleep(&s->wake);
        send_request(s, PHASE_GOING_TO_SLEEP, q, 2, "connection busy while going to sleep");
        return;
    }
    case CLAIM_EMPTY_POLL:
        poll_soon(s);
        end_transaction(s, SQL_COMMIT);
        return;
    case CLAIM_NOTHING:
        end_transaction(s, SQL_COMMIT);
        return;
    case CLAIM_LOCKED:
        s->wake_pending = true;
        end_transaction(s, SQL_ROLLBACK);
        return;
    case CLAIM_LOCKED_WAIT:
    case CLAIM_FAILED:
    case CLAIM_PRODUCER_FAILED:
        /* A producer failed under the claim is recreated by a claim once no batch is out: the
         * last of the other sessions' batches done wakes the session then (relay_batch_done),
         * whatever its backoff. With none out, the backoff stands: a producer that fails at its
         * own start (an InitProducerId refused) would otherwise be recreated in a loop. */
        s->producer_wait = outcome == CLAIM_PRODUCER_FAILED;
        s->wake_pending = true;
        schedule_retry(s);
        end_transaction(s, SQL_ROLLBACK);
        return;
    case CLAIM_PROBE_PASSED:
        setup_fixed(s);
        end_transaction(s, SQL_COMMIT);
        /* It may claim again: a session above it that claimed in its place rests now. */
        rest_others(s);
        return;
    }
}

/* The batch's outcome is recorded (or given up): on with the next batch, after the retry backoff
 * when nothing got through or something could not be recorded. Producers do not notify an awake
 * relay, so only an empty claim may end the cycle (then the session goes to sleep). */
static void batch_finished(Session *s, bool retry, bool committed)
{
    marks_batch_done(s, retry, committed);
    session_set_phase(s, PHASE_IDLE);
    pace_hold(s);
    if (s->stopping)
        return;
    if (retry)
        schedule_retry(s);
    else
        s->wake_pending = true;
}

static void marked(Session *s, const SessionEvent *ev)
{
    bool chained = s->phase == PHASE_MARKING_AND_CLAIMING;
    MarksOutcome outcome = marks_read(s, ev->results, ev->n, ev->error, chained);
    if (outcome == MARKS_FAILED) {
        /* The transaction is aborted: end it first; marks_rolled_back says what follows. */
        PgQuery q = {SQL_ROLLBACK, 0, NULL, false};
        send_request(s, PHASE_ROLLING_BACK, &q, 1, "connection busy while rolling back");
        return;
    }
    if (!chained) {
        batch_finished(s, outcome == MARKS_RECORDED_RETRY, true);
        return;
    }
    marks_batch_done(s, false, true);
    session_set_phase(s, PHASE_CLAIMING);
    int marks_n = s->chained_marks_n;
    bool claim_failed = pg_first_failed(ev->results + marks_n, ev->n - marks_n) < ev->n - marks_n;
    claimed(s, ev->results + marks_n, ev->n - marks_n, claim_failed ? ev->error : NULL);
}

static void rolled_back(Session *s, const char *error)
{
    if (error) {
        /* The failed transaction may still be open: only a new session surely ends it. */
        pg_conn_reset(s->pg, "rolling back a failed batch failed");
        return;
    }
    if (marks_rolled_back(s) && !s->stopping) {
        send_next_row(s);
        return;
    }
    /* Rolled back: nothing of it is recorded, and its rows go out again. A setup fault gives
     * its lanes up now (next_step), not later. */
    batch_finished(s, true, false);
}

static void row_recorded(Session *s, const SessionEvent *ev)
{
    marks_row_read(s, ev->results, ev->n, ev->error);
    if (s->stopping) {
        /* Shutting down: what is not recorded yet is sent again later (duplicates, no loss). */
        marks_row_by_row_cut_short(s, false);
        batch_finished(s, true, true); /* counts the rows recorded so far */
        return;
    }
    send_next_row(s);
}

static void replied(Session *s, const SessionEvent *ev)
{
    char q[512];
    switch (s->phase) {
    case PHASE_SETUP:
        listening(s, ev->results, ev->n, ev->error);
        return;
    case PHASE_CLAIMING:
        claimed(s, ev->results, ev->n, ev->error);
        return;
    case PHASE_MARKING:
    case PHASE_MARKING_AND_CLAIMING:
        marked(s, ev);
        return;
    case PHASE_ROLLING_BACK:
        rolled_back(s, ev->error);
        return;
    case PHASE_RECORDING_ROW:
        row_recorded(s, ev);
        return;
    case PHASE_ENDING:
        if (ev->error)
            log_warn("ending transaction failed", "error=%s", log_quote(ev->error, q, sizeof(q)));
        session_set_phase(s, PHASE_IDLE);
        batch_clear(&s->batch);
        return;
    case PHASE_GOING_TO_SLEEP:
        session_set_phase(s, PHASE_IDLE);
        if (!wakeup_sleep_read(s, ev->results, ev->n, ev->error))
            poll_soon(s); /* a producer is mid-transaction without having notified */
        return;
    case PHASE_LEAVING_GUARD:
        if (wakeup_lost_guard_reading(&s->wake)) {
            bool held_lanes = s->wake.lost_slot >= -1;
            wakeup_lost_guard_read(&s->wake, ev->results, ev->n, ev->error, s->index);
            session_set_phase(s, PHASE_IDLE);
            /* Its slot gone, the other sessions take its lanes now, not at their next interval:
             * this one joins only once its abandoned batch, if any, is let go. */
            if (held_lanes)
                rebalance_others(s);
            return;
        }
        if (ev->error) {
            /* The lock may still be held: only closing the session surely frees it. */
            log_warn("giving up the wakeup lock failed; reconnecting", "error=%s",
                     log_quote(ev->error, q, sizeof(q)));
            pg_conn_reset(s->pg, "giving up the wakeup lock failed");
            return;
        }
        session_set_phase(s, PHASE_IDLE);
        return;
    case PHASE_DOWN:
    case PHASE_IDLE:
    case PHASE_REBALANCING:
    case PHASE_LEAVING_LANES:
    case PHASE_PRODUCING:
        break;
    }
    log_error("internal error: a reply came with no request of the session's in flight",
              "phase=%s session=%d", session_phase_name(s->phase), s->index);
    abort();
}

/* ---- the connection ----------------------------------------------------------------------- */

static void connected(Session *s)
{
    if (s->stopped)
        return; /* done: the other sessions are finishing, this one stays out of the group */
    if (!s->sql[0]) {
        /* Quoting follows the connection's encoding, so the statements are written now. */
        char err[256];
        if (!table_sql_all(&s->cfg->map, pg_conn_libpq(s->pg), session_sql_templates, s->sql,
                           SESSION_SQL_COUNT, err, sizeof(err))) {
            log_error("cannot write the relay's statements", "error=%s", err);
            relay_fail(s->relay);
            return;
        }
    }
    PgQuery q[2] = {{SQL_LISTEN, 0, NULL, false}, {s->sql[SQL_FLOOR_CHECK], 0, NULL, false}};
    floor_reset(&s->floor); /* a new connection: start from the table's start */
    s->listening = false;   /* until its LISTEN is known to hold (listening) */
    s->floor_rechecking = false;
    session_set_phase(s, PHASE_SETUP);
    if (!pg_conn_send(s->pg, q, 2, on_reply, s)) {
        session_set_phase(s, PHASE_DOWN);
        return;
    }
    rest_others(s);
}

/* The session is gone, and with it the open transaction and every lane this relay owned: other
 * relays take the lanes over. Rows already handed to Kafka are sent again by whoever claims them
 * next; consumers drop the duplicates. */
static void disconnected(Session *s)
{
    Batch *b = &s->batch;
    bool was_marking = s->phase == PHASE_MARKING || s->phase == PHASE_MARKING_AND_CLAIMING;
    bool was_recording_rows = s->phase == PHASE_RECORDING_ROW;
    /* A request to sleep or to leave whose answer was lost may have taken or kept the lock. */
    bool may_guard = s->wake.guard || s->phase == PHASE_GOING_TO_SLEEP ||
                     (s->phase == PHASE_LEAVING_GUARD && !wakeup_lost_guard_reading(&s->wake));
    /* A member (perhaps with lanes), or a request to join out whose slot is unknown (-1). */
    bool may_hold_lanes = s->lanes.slot >= 0 || s->lanes.n_owned > 0 ||
                          s->phase == PHASE_REBALANCING || s->phase == PHASE_LEAVING_LANES;
    int lost_slot = s->lanes.slot;
    session_set_phase(s, PHASE_DOWN);
    s->listening = false;
    lanes_reset(&s->lanes);
    /* The lanes may come back with other rows, or go to another relay: the hold starts again
     * from what the next batches meet. */
    marks_hold_clear(s); /* (rows kept apart are the relay's: Unrecordable, engine.h) */
    pace_hold(s);
    /* Its join after the reconnect changes the group as its first did, whatever the members it
     * saw before: the others must re-divide then (lanes_divided), not at their next interval,
     * while they hold its lanes. */
    s->seen_members = 0;
    /* Its process is ended after the reconnect, before the first look at the lanes: else the
     * session joins with another slot while that process keeps its slot and lanes, and their rows
     * wait until the server ends it (up to --session-timeout). */
    wakeup_connection_lost(&s->wake, s->pg, may_guard, may_hold_lanes, lost_slot);
    /* Its lanes are free: the other sessions take them (a resting one may now claim in its
     * place, relay_session_resting) rather than at their next rebalance. */
    rebalance_others(s);
    if (b->n > 0 && !b->abandoned) {
        /* While marking, the answer lost may have been that of a COMMIT that went through (and
         * of a claim behind it, which the server rolled back): the log must not say more. Rows
         * recorded one by one are in already, each in a transaction of its own. */
        if (was_recording_rows)
            marks_row_by_row_cut_short(s, true);
        else
            log_warn(was_marking ? "batch abandoned with the connection while being recorded; "
                                   "its rows will be sent again unless its COMMIT got through"
                                 : "batch abandoned with the connection; its rows will be sent "
                                   "again",
                     "rows=%d in_flight=%d session=%d", b->n, b->in_flight, s->index);
        /* The delivery timer keeps running: the session claims nothing until every message of
         * the abandoned batch is reported, and with message.timeout.ms=0 a message to a broker
         * that stays down is reported only when the timer purges it. */
        b->abandoned = true;
        b->next = b->n;
    }
}

/* ---- the driver --------------------------------------------------------------------------- */

static void begin_stopping(Session *s)
{
    if (s->stopping)
        return;
    s->stopping = true;
    ev_timer_stop(s->loop, &s->poll_timer);
    ev_timer_stop(s->loop, &s->retry_timer);
    ev_timer_stop(s->loop, &s->hold_timer);
    ev_timer_stop(s->loop, &s->rebalance_timer);
    /* A batch at the producer is waited for, within the shutdown timeout; any other request in
     * flight finishes its step and the session stops after it (next_step). */
    if (s->phase == PHASE_PRODUCING)
        start_timer(s, &s->shutdown_timer, (double)s->cfg->shutdown_timeout_ms / 1000.0);
}

static void shutdown_timeout(Session *s)
{
    if (s->wake.left) {
        stopped(s); /* giving up the wakeup lock took too long */
        return;
    }
    log_warn("shutdown timeout: marking what was acknowledged, the rest will be re-sent",
             "in_flight=%d session=%d", s->batch.in_flight, s->index);
    if (s->phase == PHASE_PRODUCING && !s->batch.abandoned)
        produce_give_up_waiting(s); /* the batch is marked below, as it is */
    else
        finish_stopping(s);
}

/* The deferred work after each event, in one stated order: an abandoned batch is let go once its
 * last report is in; a batch being produced gets more rows to the producer (when the event may
 * have made room) and its marks once every report is in; a session between batches starts what
 * next_step says. */
static void advance(Session *s, bool produce)
{
    Batch *b = &s->batch;
    if (b->abandoned && b->in_flight == 0) {
        ev_timer_stop(s->loop, &s->delivery_timer); /* it ran on for the abandoned batch */
        batch_clear(b);
        s->wake_pending = true;
        relay_batch_done(s->relay);
        /* It may claim again (relay_session_resting): a session above it that claimed in its
         * place meanwhile rests now. */
        rest_others(s);
    }
    if (s->phase == PHASE_PRODUCING) {
        if (produce && (b->next < b->n || b->timed_out || s->stopping))
            produce_more(s);
        if (produce_finished(s))
            send_marks(s);
        return;
    }
    start_next(s);
}

void session_step(Session *s, const SessionEvent *ev)
{
    relay_enter(s->relay); /* its database's log context and metrics (several in one process) */
    bool produce = false;  /* the event may let more of the batch go to the producer */
    switch (ev->kind) {
    case EVENT_CONNECTED:
        connected(s);
        break;
    case EVENT_DISCONNECTED:
        disconnected(s);
        break;
    case EVENT_REPLY:
        replied(s, ev);
        break;
    case EVENT_LANES_REPLY:
        if (ev->ok) {
            lanes_divided(s);
            break;
        }
        /* A fault of the setup (the role may not read pg_locks or pg_database, or call the
         * advisory lock functions: a REVOKE ... FROM PUBLIC) fails every look again: handled as
         * a transient failure, the session reconnected and looked again for as long as it
         * lasted (measured, two sessions: 14 failed looks, each a warning, and 4 reconnects in
         * 10 s), and never said what to fix. As a claim's setup fault: said once with its hint,
         * no lanes, not ready, probed after each retry backoff (the probe reads the group as a
         * look does, claim.c). */
        if (sqlstate_fault(s->lanes.error_state) == SQLSTATE_FAULT_SETUP) {
            session_setup_failed(s, "dividing the lanes", s->lanes.error_state, s->lanes.error);
            schedule_retry(s);
        }
        /* Which lanes it holds is uncertain: a new connection holds none. */
        pg_conn_reset(s->pg, "lane rebalance failed");
        break;
    case EVENT_WAKE:
        s->wake_pending = true;
        break;
    case EVENT_REBALANCE_DUE:
        s->rebalance_due = true;
        break;
    case EVENT_LOOK:
        break;
    case EVENT_REPORT:
        produce_record_report(s, ev->row, ev->err);
        produce = true;
        break;
    case EVENT_PRODUCER_ROOM:
        produce = true;
        break;
    case EVENT_DELIVERY_TIMEOUT:
        produce_delivery_timeout(s);
        produce = true;
        break;
    case EVENT_STOP:
        begin_stopping(s);
        produce = true; /* stops producing; marks at once if nothing is in flight */
        break;
    case EVENT_SHUTDOWN_TIMEOUT:
        shutdown_timeout(s);
        break;
    }
    advance(s, produce);
}

void session_event(Session *s, SessionEventKind kind)
{
    SessionEvent ev = {.kind = kind};
    session_step(s, &ev);
}

/* ---- events from the connection and the timers -------------------------------------------- */

static void on_pg_state(PgConn *pg, bool up, const char *reason, void *arg)
{
    session_event(arg, up ? EVENT_CONNECTED : EVENT_DISCONNECTED);
}

static void on_notify(PgConn *pg, const char *channel, const char *payload, void *arg)
{
    Session *s = arg;
    if (wakeup_notified(&s->wake, payload))
        session_event(s, EVENT_WAKE);
}

/* The poll, busy and retry timers: there may be rows to claim. */
static void on_wake_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    session_event(w->data, EVENT_WAKE);
}

/* The hold backoff is over: the next claim is the probe, which claims the held types too. */
static void on_hold_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Session *s = w->data;
    if (s->hold.n == 0)
        return;
    s->hold.probe_due = true;
    session_event(s, EVENT_WAKE);
}

static void on_rebalance_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Session *s = w->data;
    /* A look out now is this interval's: with looks as slow as the interval (a remote or loaded
     * server, --rebalance-interval 100) a tick would put another behind each, and the session
     * would never claim again. A change of the group arrives through rebalance_others and
     * relay_batch_claimed, and still brings another look. */
    if (s->phase == PHASE_REBALANCING)
        return;
    session_event(s, EVENT_REBALANCE_DUE);
}

static void on_delivery_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    session_event(w->data, EVENT_DELIVERY_TIMEOUT);
}

static void on_shutdown_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    session_event(w->data, EVENT_SHUTDOWN_TIMEOUT);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static void timer_init(Session *s, ev_timer *t, void (*cb)(struct ev_loop *, ev_timer *, int))
{
    ev_init(t, cb);
    t->data = s;
}

bool session_init(Session *s, Relay *r, int index)
{
    const Config *cfg = r->cfg;
    s->relay = r;
    s->index = index;
    s->loop = r->loop;
    s->cfg = cfg;
    if (!batch_init(&s->batch, (int)cfg->batch_size + DEAD_LETTER_LIMIT))
        return false;
    s->batch.owner = s; /* delivery reports find their session through their row */
    s->claim_stmt = cfg->on_poison == POISON_HOLD ? SQL_CLAIM_HOLD : SQL_CLAIM_SKIP;
    lanes_init(&s->lanes);
    backoff_init(&s->retry, RETRY_BASE_S, RETRY_CAP_S, 0);
    timer_init(s, &s->poll_timer, on_wake_timer);
    s->poll_timer.repeat = (double)cfg->poll_interval_ms / 1000.0;
    ev_timer_again(s->loop, &s->poll_timer);
    timer_init(s, &s->rebalance_timer, on_rebalance_timer);
    s->rebalance_timer.repeat = (double)cfg->rebalance_interval_ms / 1000.0;
    ev_timer_again(s->loop, &s->rebalance_timer);
    timer_init(s, &s->retry_timer, on_wake_timer);
    timer_init(s, &s->hold_timer, on_hold_timer);
    backoff_init(&s->hold.backoff, RETRY_BASE_S, RETRY_CAP_S, 0);
    timer_init(s, &s->busy_timer, on_wake_timer);
    timer_init(s, &s->delivery_timer, on_delivery_timer);
    timer_init(s, &s->shutdown_timer, on_shutdown_timer);
    session_set_phase(s, PHASE_DOWN);
    return true;
}

void session_free(Session *s)
{
    if (!s->relay)
        return; /* never initialised */
    ev_timer_stop(s->loop, &s->poll_timer);
    ev_timer_stop(s->loop, &s->retry_timer);
    ev_timer_stop(s->loop, &s->hold_timer);
    ev_timer_stop(s->loop, &s->busy_timer);
    ev_timer_stop(s->loop, &s->rebalance_timer);
    ev_timer_stop(s->loop, &s->shutdown_timer);
    ev_timer_stop(s->loop, &s->delivery_timer);
    pg_conn_free(s->pg);
    batch_free(&s->batch);
    batch_marks_free(&s->marks);
    strbuf_free(&s->hold.param);
    lanes_free(&s->lanes);
    floor_free(&s->floor);
    for (int i = 0; i < SESSION_SQL_COUNT; i++)
        free(s->sql[i]);
}

void session_connect(Session *s)
{
    char name[24];
    snprintf(name, sizeof(name), "session-%d", s->index);
    s->pg = pg_conn_new_named(s->loop, s->cfg->database_url, name, on_pg_state, on_notify, s);
}
