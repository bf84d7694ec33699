/* wakeup: how an idle session falls asleep and is woken (migrations/0007_wakeup_lock.sql).
 *
 * A session whose claims come back empty (for --sleep-after) asks outbox_relay_sleep() to sleep.
 * The answer makes it the guard (it holds the wakeup lock, and producers' commits notify while it
 * does), a follower (another session guards) or busy (a producer is mid-transaction: ask again
 * shortly). Every sleeper makes one final claim after falling asleep, which catches what was
 * committed before the lock was taken. A guard leaves (outbox_relay_wake(), which wakes the
 * followers to ask again) as soon as it is notified or has work, or its lanes moved away; a
 * follower's every claim but the final one is a wakeup. The state below is the session's part
 * of that protocol; the requests (to sleep, to leave) are the driver's (session.c). */
#ifndef OUTBOX_WAKEUP_H
#define OUTBOX_WAKEUP_H

#include <stdbool.h>

typedef struct Wakeup {
    bool asleep;             /* waiting for a notification (or the poll timer) */
    bool guard;              /* asleep holding the wakeup lock: producers notify while it does */
    bool final_check;        /* asleep, and the claim that follows falling asleep is still due */
    bool notified;           /* a notification came since this session asked to sleep */
    bool sleep_error_logged; /* the wakeup functions failed (logged once until they work) */
    bool left;               /* shutting down: the guard's lock was (being) given up */
} Wakeup;

/* A claim is about to start. Any claim of a sleeping follower but the one that follows falling
 * asleep is a wakeup: it asks again before it sleeps again, as its guard may have left. A guard
 * goes on sleeping through claims its timer brings about. */
void wakeup_before_claim(Wakeup *w);

/* The session asks to sleep: notifications that came before do not count. */
void wakeup_before_sleep(Wakeup *w);

/* A guard gives the wakeup lock up (the request is the driver's): it is neither guard nor asleep
 * any more. */
void wakeup_leaving_guard(Wakeup *w);

/* A claim returned rows: the session is awake (a guard lets the lock go before its next claim). */
void wakeup_work_came(Wakeup *w);

/* The connection is gone, and with it a guard's lock. */
void wakeup_connection_lost(Wakeup *w);

/* A notification with payload came. Returns false when it must be ignored: a guard that left
 * wakes its followers, and a guard now is none of them; waking it would make it leave in turn,
 * and the sessions would hand the lock round for ever. A follower's final claim not yet out
 * becomes a wakeup: its guard may have left. */
bool wakeup_notified(Wakeup *w, const char *payload);

#endif
