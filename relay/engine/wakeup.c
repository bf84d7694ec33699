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
