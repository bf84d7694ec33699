/* wakeup: the guard/follow protocol's state changes (wakeup.h) and the reading of the reply to a
 * request to sleep; the requests themselves are the driver's (session.c). */
#include "wakeup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"
#include "monotime.h"
#include "schema.h"
#include "statements.h"

/* Told busy this long in a row, a session has the waiter queue for the lock (wakeup.h). */
#define WAITER_AFTER_MS 50

bool wakeup_sleep_read(Session *s, PGresult **results, int n, const char *error)
{
    PGresult *sleep = results[n - 1];
    const char *answer = !error && PQresultStatus(sleep) == PGRES_TUPLES_OK && PQntuples(sleep) == 1
                             ? PQgetvalue(sleep, 0, 0)
                             : NULL;
    /* A producer is mid-transaction without having notified: asleep only while the waiter's
     * wait makes producers notify, and wakes it at its end (wakeup.h). */
    bool busy = answer && strcmp(answer, "busy") == 0;
    if (!busy)
        s->wake.busy_since = 0;
    else if (s->wake.busy_since == 0)
        s->wake.busy_since = monotime_now();
    if (busy && !wakeup_waiter_wait(s->relay, monotime_now() - s->wake.busy_since >=
                                                  (double)WAITER_AFTER_MS / 1000.0))
        return false;
    if (!answer && !s->wake.sleep_error_logged) {
        /* Typically migrate not run since an upgrade: sleep anyway, waking at the poll timer (or
         * on a notification some other session's guard brings about). */
        char q[512];
        log_warn("cannot take part in the wakeup; relying on the poll timer", "error=%s",
                 log_quote(error ? error : "unexpected result", q, sizeof(q)));
        s->wake.sleep_error_logged = true;
    } else if (answer && s->wake.sleep_error_logged) {
        log_info("the wakeup works again", NULL);
        s->wake.sleep_error_logged = false;
    }
    /* One final claim catches what producers committed before the guard took the lock; from then
     * on they notify. A follower notified meanwhile (its guard may have left) makes that claim a
     * wakeup instead, and asks again after it; a guard's final claim sees whatever was
     * announced. */
    s->wake.asleep = true;
    s->wake.guard = answer && strcmp(answer, "guard") == 0;
    s->wake.final_check = s->wake.guard || !s->wake.notified;
    s->wake.notified = false;
    log_debug("asleep", "as=%s session=%d", answer ? answer : "poller", s->index);
    s->wake_pending = true;
    return true;
}

void wakeup_before_sleep(Wakeup *w)
{
    w->notified = false;
}

/* A guard lets the wakeup lock go before anything else once producers notified (their rows may
 * be any session's) or it has work (producers would notify all the while); the driver sends
 * outbox_relay_wake() in a transaction of its own, as the notification that wakes its followers to
 * ask again must go out now, not with a later commit (or never, with a rollback). A guard without
 * lanes (moved away while it slept, resting, a setup fault) leaves too. */
void wakeup_leaving_guard(Wakeup *w)
{
    w->guard = w->asleep = w->notified = false;
}

bool wakeup_guard_must_leave(const Session *s)
{
    if (!s->wake.guard)
        return false;
    if (s->lanes.n_owned == 0)
        return true; /* its lanes moved away while it slept: it will not claim */
    if (s->wake.final_check)
        return false;
    return !s->wake.asleep /* work */ || (s->wake_pending && s->wake.notified);
}

void wakeup_before_claim(Wakeup *w)
{
    if (!w->final_check && !w->guard)
        w->asleep = false;
    w->final_check = false;
}

void wakeup_work_came(Wakeup *w)
{
    w->asleep = false;
}

void wakeup_connection_lost(Wakeup *w, const PgConn *pg, bool may_guard, bool may_hold_lanes,
                            int slot)
{
    w->asleep = w->guard = w->final_check = false;
    w->lost_sent = false;
    if (!may_guard && !may_hold_lanes)
        return; /* an earlier loss's ending stays due, if it is */
    /* Unknown (the server did not say which process it was): only the notification goes out, and
     * for a session that held lanes but did not guard, nothing. */
    bool known = pg_conn_backend(pg, &w->lost_pid, w->lost_start) && w->lost_pid > 0;
    if (!known)
        w->lost_start[0] = '\0';
    if (!known && !may_guard) {
        w->lost_pid = 0;
        return;
    }
    w->lost_pid = known ? w->lost_pid : -1; /* due, even with no process to end */
    w->lost_guard = may_guard;
    w->lost_slot = may_hold_lanes ? slot : -2;
}

bool wakeup_lost_guard_due(const Wakeup *w)
{
    return w->lost_pid != 0 && !w->lost_sent;
}

bool wakeup_lost_guard_reading(const Wakeup *w)
{
    return w->lost_sent;
}

/* pg_terminate_backend signals the process and returns; with a timeout (14+) it waits until the
 * process has ended, and with it its locks: the notification, sent at this statement's commit,
 * then finds the wakeup lock free, and whoever asks next becomes the guard; the look at the lanes
 * that follows finds its member slot gone, and the lanes it held free. Without the wait the
 * sessions woken could ask before the process ended and follow it again, to sleep unguarded once
 * it did. The process is named by pid and start time: a pid reused since names another process;
 * never this session's own (a pooler in front could hand the same server process out again),
 * and only while it still holds the wakeup lock or the member slot the lost session held ($4;
 * any member slot when a request to join was out, -1; none for a guard without lanes, -2):
 * behind PgBouncer (pool_mode = session) the lost client's server process outlives it, freed of
 * its locks by DISCARD ALL, and may already serve another client, which must not be ended. When
 * that client is another session of this relay, the relay knows it: the server processes of its
 * sessions that are up ($5) are never ended, whatever slot (the lowest free, so often the very
 * one the lost session held) or lock they took since. Another relay's session cannot be told
 * apart this way (docs/operations.md#wakeup-after-a-lost-connection). The notification goes out
 * only for a session that guarded
 * ($3): one that only held lanes wakes no one.
 * A role may end the processes of roles it is a member of: the relay's own login, reconnected,
 * needs no pg_signal_backend; without the right (a login changed in between) the statement fails
 * and nothing is notified (wakeup_lost_guard_read warns). */
#define SQL_LOST_GUARD_END(terminate)                                                              \
    "SELECT CASE WHEN $3::boolean THEN pg_catalog.pg_notify('" WAKEUP_CHANNEL "', '" GUARD_LEFT    \
    "') END,"                                                                                      \
    " (SELECT " terminate " FROM pg_catalog.pg_stat_activity a WHERE a.pid = $1::integer"          \
    " AND a.pid <> pg_catalog.pg_backend_pid() AND a.pid <> ALL($5::integer[])"                    \
    " AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE l.pid = a.pid"                         \
    " AND l.locktype = 'advisory' AND l.granted AND ((l.classid = 0 AND l.objid "                  \
    "= " LOCK_KEY_WAKEUP                                                                           \
    " AND l.objsubid = 1 AND l.mode = 'ExclusiveLock') OR (l.classid = " LOCK_NS_MEMBER            \
    " AND l.objsubid = 2 AND $4::integer >= -1"                                                    \
    " AND ($4::integer = -1 OR l.objid::bigint = $4::integer))))"                                  \
    " AND pg_catalog.to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') = "   \
    "$2)"
static const char SQL_LOST_GUARD_WAIT[] =
    SQL_LOST_GUARD_END("pg_catalog.pg_terminate_backend(a.pid, $6::bigint)");
static const char SQL_LOST_GUARD_NO_WAIT[] =
    SQL_LOST_GUARD_END("pg_catalog.pg_terminate_backend(a.pid)");

void wakeup_lost_guard_build(Wakeup *w, int server_version, long wait_ms, const char *spared,
                             PgQuery *q, const char *values[6], char buf[36])
{
    snprintf(buf, 12, "%d", w->lost_pid > 0 ? w->lost_pid : 0);
    values[0] = buf;
    values[1] = w->lost_start[0] ? w->lost_start : NULL; /* NULL matches no process */
    values[2] = w->lost_guard ? "t" : "f";
    snprintf(buf + 12, 12, "%d", w->lost_slot);
    values[3] = buf + 12;
    values[4] = spared ? spared : "{}";
    snprintf(buf + 24, 12, "%d", (int)(wait_ms < 1 ? 1 : wait_ms > 600000 ? 600000 : wait_ms));
    values[5] = buf + 24;
    bool wait = server_version >= 140000;
    *q =
        (PgQuery){wait ? SQL_LOST_GUARD_WAIT : SQL_LOST_GUARD_NO_WAIT, wait ? 6 : 5, values, false};
    w->lost_sent = true;
}

void wakeup_lost_guard_read(Wakeup *w, PGresult **results, int n, const char *error, int session)
{
    int pid = w->lost_pid;
    bool guard = w->lost_guard;
    w->lost_pid = 0;
    w->lost_sent = false;
    w->lost_guard = false;
    w->lost_start[0] = '\0';
    PGresult *r = results && n == 1 ? results[0] : NULL;
    if (error || !r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
        char q[512];
        log_warn(guard ? "cannot end the server process of the lost wakeup guard; sessions asleep "
                         "wake at their poll timer once it ends "
                         "(docs/operations.md#wakeup-after-a-lost-connection)"
                       : "cannot end the server process of the lost connection; its lanes wait "
                         "until the server ends it "
                         "(docs/operations.md#wakeup-after-a-lost-connection)",
                 "pid=%d error=%s session=%d", pid,
                 log_quote(error ? error : "unexpected result", q, sizeof(q)), session);
        return;
    }
    if (PQgetisnull(r, 0, 1)) {
        log_debug(guard ? "the lost wakeup guard's server process had ended; sessions asleep woken"
                        : "the lost connection's server process had ended, or holds no lanes",
                  "pid=%d session=%d", pid, session);
        return;
    }
    if (strcmp(PQgetvalue(r, 0, 1), "t") == 0) {
        log_info(guard ? "ended the server process of the lost wakeup guard; sessions asleep woken"
                       : "ended the server process of the lost connection; its lanes are free",
                 "pid=%d session=%d", pid, session);
        return;
    }
    log_warn(guard ? "the server process of the lost wakeup guard did not end in time; sessions "
                     "asleep may wake only at their poll timer once it ends"
                   : "the server process of the lost connection did not end in time; its lanes "
                     "wait until it does",
             "pid=%d session=%d", pid, session);
}

bool wakeup_notified(Wakeup *w, const char *payload)
{
    if (w->guard && strcmp(payload, GUARD_LEFT) == 0)
        return false;
    w->notified = true;
    /* A follower whose final claim is not out yet (a look at the lanes went first) may have lost
     * its guard: that claim is a wakeup, and it asks again after it, as wakeup_sleep_read has it
     * for a notification while it asked. Made final, it would sleep on with no guard, and rows
     * committed from then on would wait for its poll timer. */
    if (!w->guard)
        w->final_check = false;
    return true;
}

/* ---- the waiter (wakeup.h) ---- */

#define WAITER_MIN_MS 50L
#define WAITER_MAX_MS 1000L
#define WAITER_IDLE_S 10.0 /* no wait asked for this long: the connection closes */
#define WAITER_RETRY_S 5.0 /* after a failed wait, sessions poll this long before the next */

/* Queues for the wakeup lock exclusively, at most wait_ms; with the lock (the producers that held
 * it shared have committed) gives it up at once, a session is to guard. Either way the
 * notification at commit, after the lock is let go, wakes the sessions asleep to ask again. A
 * statement of its own (no function of a migration: a relay may run before `migrate`), every
 * name in pg_catalog, as 0009 has the functions. A statement_timeout of the relay's role or
 * database (1 s, say) that ends the wait before its lock_timeout ends it the same way
 * (query_canceled): as an error, every wait that reached the cap failed, no notification went out
 * (sessions of other relays that followed the wait slept on until their --poll-interval), and
 * this relay's sessions polled for WAITER_RETRY_S after each. */
#define SQL_WAITER                                                                                 \
    "DO $waiter$BEGIN"                                                                             \
    " PERFORM pg_catalog.set_config('lock_timeout', '%ldms', true);"                               \
    " BEGIN"                                                                                       \
    " PERFORM pg_catalog.pg_advisory_lock(" LOCK_KEY_WAKEUP "::bigint);"                           \
    " PERFORM pg_catalog.pg_advisory_unlock(" LOCK_KEY_WAKEUP "::bigint);"                         \
    " EXCEPTION WHEN lock_not_available OR query_canceled THEN NULL;"                              \
    " END;"                                                                                        \
    " PERFORM pg_catalog.pg_notify('" WAKEUP_CHANNEL "', '" GUARD_LEFT "');"                       \
    " END$waiter$"

static long waiter_cap_ms(const Relay *r)
{
    long cap = WAITER_MAX_MS;
    if (r->cfg->poll_interval_ms < cap)
        cap = r->cfg->poll_interval_ms;
    if (r->cfg->session_timeout_ms / 2 < cap) /* the connection's deadline for an answer */
        cap = r->cfg->session_timeout_ms / 2;
    return cap;
}

static void waiter_send(Relay *r);

/* Wakes the sessions of r that sleep (a follower; a guard ignores it) as a notification
 * "guard left" would: the wait they slept on may have ended without one. */
static void waiter_wake_sessions(Relay *r)
{
    for (int i = 0; i < r->n_sessions; i++)
        if (wakeup_notified(&r->sessions[i].wake, GUARD_LEFT))
            session_event(&r->sessions[i], EVENT_WAKE);
}

static void on_waiter_done(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Relay *r = arg;
    WakeupWaiter *w = &r->waiter;
    relay_enter(r);
    w->sent = false;
    ev_timer_again(r->loop, &w->idle_timer);
    if (error) {
        /* A lost connection, a cancel, a role without the right to the statement: no
         * notification came, maybe. The sessions poll again until the retry. */
        char q[512];
        if (!w->failure_logged)
            log_warn("the wakeup's waiter failed; sessions poll while producers are "
                     "mid-transaction",
                     "error=%s", log_quote(error, q, sizeof(q)));
        w->failure_logged = true;
        w->failed = true;
        w->again = w->wanted = false;
        w->wait_ms = WAITER_MIN_MS;
        ev_timer_set(&w->retry_timer, WAITER_RETRY_S, 0);
        ev_timer_start(r->loop, &w->retry_timer);
        waiter_wake_sessions(r);
        return;
    }
    if (w->failure_logged)
        log_info("the wakeup's waiter works again", NULL);
    w->failure_logged = false;
    /* Ended before its timeout: it got the lock, the long transaction is over; the next one
     * starts short again. Otherwise each wait in a row is twice as long, up to the cap. */
    long cap = waiter_cap_ms(r);
    double took_ms = (monotime_now() - w->sent_at) * 1000.0;
    if (took_ms < (double)w->wait_ms * 0.9)
        w->wait_ms = WAITER_MIN_MS < cap ? WAITER_MIN_MS : cap;
    else
        w->wait_ms = w->wait_ms * 2 < cap ? w->wait_ms * 2 : cap;
    if (w->again && !r->stopping) {
        w->again = false;
        waiter_send(r);
    }
}

static void waiter_send(Relay *r)
{
    WakeupWaiter *w = &r->waiter;
    snprintf(w->sql, sizeof(w->sql), SQL_WAITER, w->wait_ms);
    PgQuery q = {w->sql, 0, NULL, false};
    if (!pg_conn_send(w->pg, &q, 1, on_waiter_done, r))
        return; /* not up after all: on_waiter_state sends it */
    w->sent = true;
    w->wanted = false;
    w->sent_at = monotime_now();
    log_debug("waiting for producers' transactions", "lock_timeout_ms=%ld", w->wait_ms);
}

static void on_waiter_state(PgConn *pg, bool up, const char *reason, void *arg)
{
    Relay *r = arg;
    relay_enter(r);
    if (up && r->waiter.wanted && !r->waiter.sent && !r->stopping)
        waiter_send(r);
}

static void on_waiter_notify(PgConn *pg, const char *channel, const char *payload, void *arg) {}

static void on_waiter_idle(struct ev_loop *loop, ev_timer *t, int revents)
{
    Relay *r = t->data;
    WakeupWaiter *w = &r->waiter;
    if (w->sent || !w->pg)
        return;
    /* Not up yet while sessions still ask (the server refuses it: max_connections, a role's
     * connection limit): kept, its backoff growing and its failure logged once. Closed at each
     * interval, a new connection tried again at once and logged "postgres unreachable" again. */
    if (w->wanted && monotime_now() - w->asked_at < WAITER_IDLE_S)
        return;
    pg_conn_free(w->pg);
    w->pg = NULL;
    w->wanted = w->again = false;
    w->wait_ms = WAITER_MIN_MS;
    ev_timer_stop(loop, t);
}

static void on_waiter_retry(struct ev_loop *loop, ev_timer *t, int revents)
{
    Relay *r = t->data;
    r->waiter.failed = false;
}

bool wakeup_waiter_wait(Relay *r, bool start)
{
    WakeupWaiter *w = &r->waiter;
    if (r->stopping || w->failed)
        return false;
    if (w->sent) {
        w->again = true; /* the wait in flight may have ended already: one more follows */
        return true;
    }
    if (!start && !w->pg)
        return false; /* not connected for a wait that a producer's commit is likely to make moot */
    if (!w->pg) {
        w->pg = pg_conn_new_named(r->loop, r->cfg->database_url, "wakeup", on_waiter_state,
                                  on_waiter_notify, r);
        if (!w->pg)
            return false;
        /* A session got an answer from this server: it was reached. Opened for each spell of
         * busy answers and closed WAITER_IDLE_S after it, the waiter would log "postgres
         * connected" at each, a line an operator reads as a reconnect; an outage is still said. */
        pg_conn_seen_before(w->pg);
        w->wait_ms = WAITER_MIN_MS < waiter_cap_ms(r) ? WAITER_MIN_MS : waiter_cap_ms(r);
        ev_timer_again(r->loop, &w->idle_timer);
    }
    w->wanted = true;
    w->asked_at = monotime_now();
    if (pg_conn_idle(w->pg))
        waiter_send(r);
    return w->sent;
}

void wakeup_waiter_init(Relay *r)
{
    WakeupWaiter *w = &r->waiter;
    *w = (WakeupWaiter){.wait_ms = WAITER_MIN_MS};
    ev_init(&w->idle_timer, on_waiter_idle);
    w->idle_timer.repeat = WAITER_IDLE_S;
    w->idle_timer.data = r;
    ev_init(&w->retry_timer, on_waiter_retry);
    w->retry_timer.data = r;
}

void wakeup_waiter_free(Relay *r)
{
    WakeupWaiter *w = &r->waiter;
    ev_timer_stop(r->loop, &w->idle_timer);
    ev_timer_stop(r->loop, &w->retry_timer);
    if (w->pg)
        pg_conn_free(w->pg);
    w->pg = NULL;
    w->sent = false;
}
