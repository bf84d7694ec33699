/* session: one claim session's life (engine.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"
#include "diagnose.h"
#include "table.h"

/* The cycle's allowed phase changes, from -> to: anything else is a bug in the engine. */
static bool phase_change_allowed(Phase from, Phase to)
{
    if (to == PHASE_DOWN)
        return true; /* the connection can go at any moment */
    switch (from) {
    case PHASE_DOWN:
        return to == PHASE_SETUP;
    case PHASE_SETUP:
        return to == PHASE_IDLE;
    case PHASE_IDLE:
        return to == PHASE_IDLE || to == PHASE_REBALANCING || to == PHASE_CLAIMING ||
               to == PHASE_ENDING;
    case PHASE_REBALANCING:
        return to == PHASE_IDLE;
    case PHASE_CLAIMING: /* IDLE: the request could not be sent */
        return to == PHASE_PRODUCING || to == PHASE_ENDING || to == PHASE_IDLE;
    case PHASE_PRODUCING:
        return to == PHASE_MARKING || to == PHASE_MARKING_AND_CLAIMING;
    case PHASE_MARKING: /* MARKING again: recording row by row */
        return to == PHASE_MARKING || to == PHASE_IDLE;
    case PHASE_MARKING_AND_CLAIMING: /* CLAIMING: the marks went through, the claim's results
                                      * are here; MARKING: they failed, recording row by row;
                                      * IDLE: stopping before that started */
        return to == PHASE_CLAIMING || to == PHASE_MARKING || to == PHASE_IDLE;
    case PHASE_ENDING: /* ENDING again: a wakeup step that ends a transaction */
        return to == PHASE_ENDING || to == PHASE_IDLE;
    }
    return false;
}

const char *session_phase_name(Phase p)
{
    static const char *const names[] = {"down",     "setup",     "idle",    "rebalancing",
                                        "claiming", "producing", "marking", "marking and claiming",
                                        "ending"};
    return p <= PHASE_ENDING ? names[p] : "?";
}

void (*session_phase_observer)(const Session *s, Phase from, Phase to);

void session_set_phase(Session *s, Phase to)
{
    if (!phase_change_allowed(s->phase, to)) {
        log_error("internal error: a session changed phase in a way its cycle does not allow",
                  "from=%s to=%s session=%d", session_phase_name(s->phase), session_phase_name(to), s->index);
        abort();
    }
    if (session_phase_observer)
        session_phase_observer(s, s->phase, to);
    s->phase = to;
}

/* A session has finished shutting down; the loop ends with the last one. */
static void session_stopped(Session *s)
{
    ev_timer_stop(s->loop, &s->shutdown_timer);
    if (s->stopped)
        return;
    s->stopped = true;
    if (--s->relay->running == 0)
        ev_break(s->loop, EVBREAK_ALL);
}

/* Ends the session's part. A guard on the way out gives up the wakeup lock with a notification
 * (when the connection is there to do it, within a second): the followers it guarded must not go
 * on sleeping unguarded. Its callback comes back here, and the session is done. */
void session_finish_stopping(Session *s)
{
    ev_timer_stop(s->loop, &s->shutdown_timer);
    if (!s->wake.left && s->wake.guard && pg_conn_idle(s->pg)) {
        s->wake.left = true;
        ev_timer_set(&s->shutdown_timer, 1.0, 0);
        ev_timer_start(s->loop, &s->shutdown_timer);
        wakeup_leave_guard(s);
        return;
    }
    session_stopped(s);
}

/* After a request between batches: on with the cycle, or out if the session is stopping. */
void session_after_request(Session *s)
{
    if (s->stopping)
        session_finish_stopping(s);
    else
        session_start_next_request(s);
}

/* Claims again after --busy-poll-interval: an awake session with nothing to do, or one that
 * producers kept from going to sleep. */
void session_poll_soon(Session *s)
{
    /* A claim a notification brought about can come back empty while the timer is still armed,
     * and libev forbids changing an active timer. */
    ev_timer_stop(s->loop, &s->busy_timer);
    ev_timer_set(&s->busy_timer, (double)s->cfg->busy_poll_interval_ms / 1000.0, 0);
    ev_timer_start(s->loop, &s->busy_timer);
}

void session_schedule_retry(Session *s)
{
    double delay = backoff_next(&s->retry);
    ev_timer_stop(s->loop, &s->retry_timer);
    ev_timer_set(&s->retry_timer, delay, 0);
    ev_timer_start(s->loop, &s->retry_timer);
}

/* ---- ending a transaction ----------------------------------------------------------------- */

static void on_ended(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Session *s = arg;
    if (!results)
        return; /* connection lost: on_pg_state has taken over */
    if (error) {
        char q[512];
        log_warn("ending transaction failed", "error=%s", log_quote(error, q, sizeof(q)));
    }
    session_set_phase(s, PHASE_IDLE);
    batch_clear(&s->batch);
    session_after_request(s);
}

/* Ends the open transaction without marking anything. */
void session_end_transaction(Session *s, const char *sql)
{
    PgQuery q = {sql, 0, NULL, false};
    session_set_phase(s, PHASE_ENDING);
    if (!pg_conn_send(s->pg, &q, 1, on_ended, s))
        pg_conn_reset(s->pg, "connection busy while ending a transaction");
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

static void on_rebalanced(Lanes *lanes, bool ok, void *arg)
{
    Session *s = arg;
    session_set_phase(s, PHASE_IDLE);
    s->rebalance_due = false;
    log_lanes_owned(s->relay, lanes->live_sessions);
    bool membership_changed = lanes->live_sessions != s->logged_sessions;
    s->logged_sessions = lanes->live_sessions;
    if (lanes->gained) {
        s->wake_pending = true; /* new lanes may hold a backlog */
        floor_reset(&s->floor); /* anywhere in the table */
    }
    if (s->stopping) {
        session_finish_stopping(s);
        return;
    }
    session_start_next_request(s);
    if (membership_changed)
        session_rebalance_others(s);
}

void session_rebalance_others(Session *s)
{
    /* The other sessions of this relay re-divide now rather than at their next interval, so a
     * session that joins or leaves (or a relay that starts or stops) moves lanes within a
     * batch. */
    Relay *r = s->relay;
    for (int i = 0; i < r->n_sessions; i++) {
        Session *other = &r->sessions[i];
        if (other != s && !other->stopping && !relay_session_resting(r, other)) {
            other->rebalance_due = true;
            session_start_next_request(other);
        }
    }
}

static void on_left_group(Lanes *lanes, bool ok, void *arg)
{
    Session *s = arg;
    session_set_phase(s, PHASE_IDLE);
    s->logged_sessions = 0;
    floor_reset(&s->floor); /* its lanes may come back with other rows */
    /* Not logged as lanes owned: the other sessions take its lanes over at once, and log the
     * relay's total if it changed. */
    log_debug("session rests", "session=%d", s->index);
    session_rebalance_others(s); /* they take its lanes over */
    session_after_request(s);
}

/* A resting session (relay_session_resting) gives its lanes and member slot up, then waits: a
 * guard lets the wakeup lock go first (it has no lanes left to claim for). */
static void session_rest(Session *s)
{
    s->rebalance_due = false; /* no member, nothing to re-divide */
    if (s->lanes.slot >= 0) {
        session_set_phase(s, PHASE_REBALANCING);
        if (!lanes_leave(&s->lanes, s->pg, on_left_group, s))
            session_set_phase(s, PHASE_IDLE);
        return;
    }
    if (wakeup_guard_must_leave(s))
        wakeup_leave_guard(s);
}

/* What an operator does about a setup fault, by its SQLSTATE. */
static const char *setup_hint(const char *state)
{
    if (state && strcmp(state, "42501") == 0)
        return "grant the relay's role its privileges: run `outbox-relay migrate` as the table's "
               "owner, or GRANT SELECT, UPDATE (and DELETE with --on-sent delete) on the table";
    if (state &&
        (strcmp(state, "42P01") == 0 || strcmp(state, "42703") == 0 || strcmp(state, "3F000") == 0))
        return "the outbox table, a column or its schema is missing: run `outbox-relay migrate`, "
               "or check --table and the column options";
    return "fix the database or the relay's configuration; the relay checks again after each "
           "retry backoff";
}

void session_setup_failed(Session *s, const char *what, const char *state, const char *error)
{
    char q[512], w[64], h[300];
    const char *text = error ? error : "unknown error";
    bool said = false; /* one line per distinct error for the whole relay */
    for (int i = 0; i < s->relay->n_sessions; i++) {
        const Session *other = &s->relay->sessions[i];
        said = said || (other->setup_fault && strcmp(other->setup_error, text) == 0);
    }
    LogLevel level = said ? LOG_DEBUG : LOG_ERROR;
    log_write(level,
              "the relay cannot work with this database as it is set up: the session gives its "
              "lanes up and the relay is not ready until it is fixed",
              "what=%s sqlstate=%s error=%s hint=%s session=%d", log_quote(what, w, sizeof(w)),
              state ? state : "", log_quote(text, q, sizeof(q)),
              log_quote(setup_hint(state), h, sizeof(h)), s->index);
    s->setup_fault = true;
    snprintf(s->setup_error, sizeof(s->setup_error), "%s", text);
}

void session_setup_fixed(Session *s)
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

/* A session whose setup failed gives its lanes and member slot up (the other relays take them
 * over), then probes after each retry backoff with a claim of no lanes (session_claim_build). */
static void session_probe_setup(Session *s)
{
    if (s->lanes.slot >= 0 || s->lanes.n_owned > 0) {
        session_set_phase(s, PHASE_REBALANCING);
        if (!lanes_leave(&s->lanes, s->pg, on_left_group, s))
            session_set_phase(s, PHASE_IDLE);
        return;
    }
    if (wakeup_guard_must_leave(s)) {
        wakeup_leave_guard(s);
        return;
    }
    if (s->wake_pending && !ev_is_active(&s->retry_timer))
        session_claim(s);
}

/* Does whatever comes next between batches: a due rebalance first, then a claim when there is a
 * reason to claim (wake_pending) and nothing stands in the way; a woken guard first leaves. */
void session_start_next_request(Session *s)
{
    if (s->phase != PHASE_IDLE || s->stopping || s->batch.n > 0 || !pg_conn_idle(s->pg))
        return;
    if (s->setup_fault) {
        session_probe_setup(s);
        return;
    }
    if (relay_session_resting(s->relay, s)) {
        session_rest(s);
        return;
    }
    if (s->rebalance_due) {
        session_set_phase(s, PHASE_REBALANCING);
        if (!lanes_rebalance(&s->lanes, s->pg, on_rebalanced, s))
            session_set_phase(s, PHASE_IDLE);
        return;
    }
    if (wakeup_guard_must_leave(s)) {
        wakeup_leave_guard(s);
        return;
    }
    if (s->wake_pending && s->lanes.n_owned > 0 && !ev_is_active(&s->retry_timer))
        session_claim(s);
}

bool session_may_chain_claim(const Session *s)
{
    const Batch *b = &s->batch;
    /* Only behind a batch that got something through (else the retry backoff may be due) and a
     * small one (a quarter of --batch-size and of --batch-bytes at most): its result is still
     * held when the next claim's arrives, and a full batch means a backlog, where a round trip
     * per batch is little and memory stays at one batch per session. */
    bool small = b->n <= s->cfg->batch_size / 4 && b->bytes <= (size_t)s->cfg->batch_bytes / 4;
    /* A --batch-size grown by SIGHUP needs a larger batch, allocated only between batches. */
    bool batch_fits = s->cfg->batch_size + DEAD_LETTER_LIMIT <= b->capacity;
    return b->acked > 0 && small && !s->setup_fault && !s->stopping && !s->relay->stopping &&
           !s->rebalance_due && !relay_session_resting(s->relay, s) && s->lanes.n_owned > 0 &&
           !ev_is_active(&s->retry_timer) && !wakeup_guard_must_leave(s) && batch_fits;
}

/* ---- events ------------------------------------------------------------------------------- */

/* The claim floor needs {seq} drawn in order (SQL_FLOOR_CHECK, floor.h); said once per process
 * when the table does not allow it, or the check itself failed. */
static void learn_floor_allowed(Session *s, PGresult *check)
{
    char why[512], q[600];
    bool allowed = check && diagnose_floor(check, &s->cfg->map, why, sizeof(why));
    s->floor.enabled = s->cfg->claim_floor && allowed;
    static bool said;
    if (s->cfg->claim_floor && !allowed && !said) {
        log_warn("claims read the unsent index from its start (README, \"Dead rows and old "
                 "snapshots\")",
                 "column=%s cause=%s", s->cfg->map.seq, log_quote(why, q, sizeof(q)));
        said = true;
    }
}

static void on_listening(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Session *s = arg;
    if (!results)
        return;
    learn_floor_allowed(s, n == 2 ? results[1] : NULL);
    if (error && n == 2 && PQresultStatus(results[0]) == PGRES_COMMAND_OK)
        error = NULL; /* only the floor's check failed: said above */
    if (error) {
        char q[512];
        log_warn("LISTEN failed; relying on the poll timer", "error=%s",
                 log_quote(error, q, sizeof(q)));
    }
    session_set_phase(s, PHASE_IDLE);
    if (s->stopping) {
        session_finish_stopping(s);
        return;
    }
    s->wake_pending = true;
    s->rebalance_due = true;
    session_start_next_request(s);
}

static void on_pg_state(PgConn *pg, bool up, const char *reason, void *arg)
{
    Session *s = arg;
    if (up && s->stopped)
        return; /* done: the other sessions are finishing, this one stays out of the group */
    if (up && !s->sql[0]) {
        /* Quoting follows the connection's encoding, so the statements are written now. */
        char err[256];
        if (!table_sql_all(&s->cfg->map, pg_conn_libpq(pg), session_sql_templates, s->sql,
                           SESSION_SQL_COUNT, err, sizeof(err))) {
            log_error("cannot write the relay's statements", "error=%s", err);
            relay_fail(s->relay);
            return;
        }
    }
    if (up) {
        PgQuery q[2] = {{SQL_LISTEN, 0, NULL, false}, {s->sql[SQL_FLOOR_CHECK], 0, NULL, false}};
        floor_reset(&s->floor); /* a new connection: start from the table's start */
        session_set_phase(s, PHASE_SETUP);
        if (!pg_conn_send(pg, q, 2, on_listening, s))
            session_set_phase(s, PHASE_DOWN);
        return;
    }
    /* The session is gone, and with it the open transaction and every lane this relay owned:
     * other relays take the lanes over. Rows already handed to Kafka are sent again by whoever
     * claims them next; consumers drop the duplicates. */
    Batch *b = &s->batch;
    bool was_marking = s->phase == PHASE_MARKING || s->phase == PHASE_MARKING_AND_CLAIMING;
    session_set_phase(s, PHASE_DOWN);
    lanes_reset(&s->lanes);
    /* A guard's lock went with the session. */
    wakeup_connection_lost(&s->wake);
    /* Its lanes are free: the other sessions take them (a resting one may now claim in its
     * place, relay_session_resting) rather than at their next rebalance. */
    session_rebalance_others(s);
    if (b->n > 0) {
        /* While marking, the answer lost may have been that of a COMMIT that went through (and
         * of a claim behind it, which the server rolled back): the log must not say more. */
        log_warn(was_marking ? "batch abandoned with the connection while being recorded; its "
                               "rows will be sent again unless its COMMIT got through"
                             : "batch abandoned with the connection; its rows will be sent again",
                 "rows=%d in_flight=%d session=%d", b->n, b->in_flight, s->index);
        /* The delivery timer keeps running: the session claims nothing until every message of
         * the abandoned batch is reported, and with message.timeout.ms=0 a message to a broker
         * that stays down is reported only when the timer purges it (issue 21). */
        b->abandoned = true;
        b->next = b->n;
        session_check_batch_done(s);
    }
    if (s->stopping)
        session_finish_stopping(s);
}

static void on_notify(PgConn *pg, const char *channel, const char *payload, void *arg)
{
    Session *s = arg;
    if (!wakeup_notified(&s->wake, payload))
        return;
    s->wake_pending = true;
    session_start_next_request(s);
}

/* The poll, busy and retry timers: there may be rows to claim. */
static void on_wake_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Session *s = w->data;
    s->wake_pending = true;
    session_start_next_request(s);
}

static void on_rebalance_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Session *s = w->data;
    s->rebalance_due = true;
    session_start_next_request(s);
}

static void on_shutdown_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Session *s = w->data;
    Batch *b = &s->batch;
    if (s->wake.left) {
        session_stopped(s); /* giving up the wakeup lock took too long */
        return;
    }
    log_warn("shutdown timeout: marking what was acknowledged, the rest will be re-sent",
             "in_flight=%d session=%d", b->in_flight, s->index);
    if (s->phase == PHASE_PRODUCING && !b->abandoned) {
        /* Reports that arrive from now on are ignored: those rows stay unsent. The producer
         * still holds their messages, whose payloads point into the claim results: those live
         * until the producer is gone (relay_free frees it before the sessions). */
        for (int i = 0; i < b->n; i++)
            if (b->rows[i].state == ROW_QUEUED)
                b->rows[i].state = ROW_PENDING;
        b->in_flight = 0;
        batch_retire(b);
        session_send_marks(s);
    } else {
        session_finish_stopping(s);
    }
}

/* Stops one session: at once between batches, else once its batch is done (bounded by the
 * shutdown timeout while waiting for acknowledgements). */
void session_stop(Session *s)
{
    if (s->stopping)
        return;
    s->stopping = true;
    ev_timer_stop(s->loop, &s->poll_timer);
    ev_timer_stop(s->loop, &s->retry_timer);
    ev_timer_stop(s->loop, &s->rebalance_timer);
    switch (s->phase) {
    case PHASE_DOWN:
    case PHASE_IDLE:
        session_finish_stopping(s);
        break;
    case PHASE_PRODUCING:
        ev_timer_set(&s->shutdown_timer, (double)s->cfg->shutdown_timeout_ms / 1000.0, 0);
        ev_timer_start(s->loop, &s->shutdown_timer);
        session_produce_more(s); /* stops producing, marks at once if nothing is in flight */
        break;
    default:
        break; /* the request in flight finishes the cycle and sees `stopping` */
    }
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
    timer_init(s, &s->busy_timer, on_wake_timer);
    timer_init(s, &s->delivery_timer, session_on_delivery_timer);
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
    ev_timer_stop(s->loop, &s->busy_timer);
    ev_timer_stop(s->loop, &s->rebalance_timer);
    ev_timer_stop(s->loop, &s->shutdown_timer);
    ev_timer_stop(s->loop, &s->delivery_timer);
    pg_conn_free(s->pg);
    batch_free(&s->batch);
    batch_marks_free(&s->marks);
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
