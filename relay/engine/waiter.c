/* waiter: the relay's connection without lanes that queues for the wakeup lock while producers
 * hold it shared (wakeup.h: why, and what it costs). It sends on its own connection, no session's
 * (tools/check-driver.sh allows it that), and hands what a wait's end means for the sessions to
 * relay.c (relay_waiter_failed), which hands them the events. */
#include <stdio.h>

#include "engine.h"
#include "log.h"
#include "monotime.h"
#include "schema.h"
#include "statements.h"
#include "wakeup.h"

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
 * this relay's sessions polled for WAITER_RETRY_S after each. The connection check
 * (client_connection_check_interval, pg.c: --session-timeout / 3, at least 1 s) is off for the
 * statement: bounded by its lock_timeout and holding no lanes, it has nothing to give up early,
 * and its notification is what the sessions asleep on it wait for, other relays' too. With the
 * check on, a relay killed mid-wait had its wait ended by "connection to client lost" whenever
 * the check came due before the wait's end, and nothing was notified: 4 kills of 4 with
 * --session-timeout 3 s, the check then every second, as long as the longest wait
 * (tests/it/delivery/33_wakeup.sh part 10); a longer timeout made it rarer, not impossible.
 * pg_settings has the setting on PostgreSQL 14 and later only. */
#define SQL_WAITER                                                                                 \
    "DO $waiter$BEGIN"                                                                             \
    " PERFORM pg_catalog.set_config('lock_timeout', '%ldms', true);"                               \
    " PERFORM pg_catalog.set_config(name, '0', true) FROM pg_catalog.pg_settings"                  \
    " WHERE name = 'client_connection_check_interval';"                                            \
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
        relay_waiter_failed(r); /* the wait the sessions slept on may have sent nothing */
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
