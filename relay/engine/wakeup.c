/* wakeup: the guard/follow protocol's state changes (wakeup.h) and the reading of the reply to a
 * request to sleep; the requests themselves are the driver's (session.c). */
#include "wakeup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"

bool wakeup_sleep_read(Session *s, PGresult **results, int n, const char *error)
{
    PGresult *sleep = results[n - 1];
    const char *answer = !error && PQresultStatus(sleep) == PGRES_TUPLES_OK && PQntuples(sleep) == 1
                             ? PQgetvalue(sleep, 0, 0)
                             : NULL;
    if (answer && strcmp(answer, "busy") == 0)
        return false; /* a producer is mid-transaction without having notified */
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

void wakeup_connection_lost(Wakeup *w)
{
    w->asleep = w->guard = w->final_check = false;
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
