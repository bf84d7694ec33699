/* wakeup: how an idle session falls asleep and is woken (migrations/0007_wakeup_lock.sql).
 *
 * A session whose claims come back empty (for --sleep-after) asks outbox_relay_sleep() to sleep.
 * The answer makes it the guard (it holds the wakeup lock, and producers' commits notify while it
 * does), a follower (another session guards) or busy (a producer is mid-transaction: ask again
 * shortly). Every sleeper makes one final claim after falling asleep, which catches what was
 * committed before the lock was taken. A guard leaves (outbox_relay_wake(), which wakes the
 * followers to ask again) as soon as it is notified or has work, or its lanes moved away; a
 * follower's every claim but the final one is a wakeup. The state below is the session's part
 * of that protocol; the requests (to sleep, to leave) are the driver's (session.c).
 *
 * Busy, the session would have to poll: producers that hold the lock shared do not notify, and
 * neither do those that take it after them, as nobody holds it exclusively; a long transaction
 * kept every session asking as fast as it could (2,402 requests to sleep in 10 s with 4 sessions).
 * So a relay told busy queues for the lock instead, on a connection of its own without lanes, the
 * waiter (WakeupWaiter): while a request for the lock waits, PostgreSQL grants no shared request
 * that would have to wait behind it, so every producer's try fails and it notifies, as while a
 * guard sleeps, and the session sleeps like a follower. The wait is bounded (a lock_timeout of
 * 50 ms doubling up to 1 s, at most --poll-interval) and ends with a notification "guard left",
 * whether it got the lock (the producers that held it committed: it gives the lock up at once)
 * or not: the sessions asleep wake, claim and ask again. A producer that took the lock before the
 * wait began, and commits while it lasts, does not notify: its rows go at the wait's end, not at
 * once (the latency a wait costs; while the wait is queued, every other producer notifies).
 * Most producers' transactions end within a few polls: the waiter connects only once a session
 * has been told busy for WAITER_AFTER_MS in a row (wakeup.c), and closes after WAITER_IDLE_S
 * (waiter.c) without a wait. */
#ifndef OUTBOX_WAKEUP_H
#define OUTBOX_WAKEUP_H

#include <ev.h>
#include <libpq-fe.h>
#include <stdbool.h>

#include "pg.h"

typedef struct Wakeup {
    bool asleep;             /* waiting for a notification (or the poll timer) */
    bool guard;              /* asleep holding the wakeup lock: producers notify while it does */
    bool final_check;        /* asleep, and the claim that follows falling asleep is still due */
    bool notified;           /* a notification came since this session asked to sleep */
    bool sleep_error_logged; /* the wakeup functions failed (logged once until they work) */
    bool left;               /* shutting down: the guard's lock was (being) given up */
    double busy_since;       /* monotime of the first "busy" of those in a row; 0: none */
    /* The server process of a connection lost while it held (or may have held) the wakeup lock
     * or lanes: ended (and, for a guard, its followers woken) after the reconnect
     * (wakeup_lost_guard_*). 0: none due. */
    int lost_pid;
    char lost_start[PG_BACKEND_START_LEN];
    bool lost_guard; /* it held (or may have held) the wakeup lock: notify */
    int lost_slot;   /* its member slot; -1: unknown (a request to join was out); -2: none */
    bool lost_sent;  /* that request is out: the reply to PHASE_LEAVING_GUARD is its */
} Wakeup;

/* The relay's waiter (see above; one per relay, in Relay). */
typedef struct WakeupWaiter {
    PgConn *pg;           /* NULL until a session was told busy, and after idle_timer closed it */
    bool sent;            /* a wait is in flight: queued on the server, producers notify */
    bool again;           /* a session fell asleep on the wait in flight: another follows it */
    bool wanted;          /* a session was told busy while the connection was not up */
    bool failed;          /* the last wait failed: sessions poll until retry_timer ends */
    bool failure_logged;  /* a failure was logged (once until a wait succeeds) */
    long wait_ms;         /* the lock_timeout of the next wait */
    double sent_at;       /* monotime the wait in flight was sent */
    double asked_at;      /* monotime a session last asked for a wait (keeps a connecting one) */
    ev_timer idle_timer;  /* closes the connection once no wait was asked for a while */
    ev_timer retry_timer; /* after a failed wait: no wait before it ends */
    char sql[640];        /* the wait in flight, which must outlive the send */
} WakeupWaiter;

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

/* The connection is gone. may_guard: the session held the wakeup lock, or a request that takes
 * or gives it up was out (its answer lost). may_hold_lanes: it held a member slot (slot, its
 * number, or -1 when a request to join was out and which one is unknown) and perhaps lanes. The
 * locks go with the server process, but that process can outlive the connection (a network cut
 * the server has not noticed yet) and keep them until it ends, up to --session-timeout later:
 * then the wakeup lock goes free without a notification, and sessions asleep would wait for their
 * poll timer; and the member slot and lanes stay its, so the lanes' rows wait, while the
 * reconnected session joins again with another slot. So the process (pg_conn_backend of pg, just
 * lost) is remembered, to be ended after the reconnect (wakeup_lost_guard_due). */
void wakeup_connection_lost(Wakeup *w, const PgConn *pg, bool may_guard, bool may_hold_lanes,
                            int slot);

/* After a reconnect, before anything else: a lost guard's (or lane holder's) process is to be
 * ended and, for a guard, the sessions asleep woken (wakeup_lost_guard_build, then
 * wakeup_lost_guard_read). */
bool wakeup_lost_guard_due(const Wakeup *w);

/* The request, into q (one statement) with its parameters in values (6 of them, pointing into w,
 * buf, spared and constants, which must outlive the send): in one transaction, end the lost
 * process when it still runs, is none of spared (an int[] literal: the server processes of this
 * relay's sessions that are up, which a pooler may have handed the lost process to; NULL: none)
 * and still holds the wakeup lock or the lost session's member slot
 * (pg_terminate_backend of exactly that pid and start, waiting up to wait_ms for it to end on
 * PostgreSQL 14 and later, whose pg_terminate_backend can wait: server_version as
 * PQserverVersion) and, for a lost guard, notify GUARD_LEFT, which makes the sessions asleep ask
 * again: one becomes the guard, now that the lock is free. Marks the request as sent
 * (wakeup_lost_guard_reading). */
void wakeup_lost_guard_build(Wakeup *w, int server_version, long wait_ms, const char *spared,
                             PgQuery *q, const char *values[6], char buf[36]);

/* The reply to PHASE_LEAVING_GUARD is that request's. */
bool wakeup_lost_guard_reading(const Wakeup *w);

/* Reads its answer (error: the request failed) and logs what came of it: ended (info), already
 * gone or holding none of the locks (debug), still running after wait_ms or not ended at all (one
 * warning: sessions asleep then wake at their poll timer, and its lanes are taken, once it ends,
 * as before). The ending is no longer due either
 * way: it is tried once per loss. */
void wakeup_lost_guard_read(Wakeup *w, PGresult **results, int n, const char *error, int session);

/* A notification with payload came. Returns false when it must be ignored: a guard that left
 * wakes its followers, and a guard now is none of them; waking it would make it leave in turn,
 * and the sessions would hand the lock round for ever. A follower's final claim not yet out
 * becomes a wakeup: its guard may have left. */
bool wakeup_notified(Wakeup *w, const char *payload);

#endif
