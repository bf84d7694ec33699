/* engine: the types the engine's modules share — the process (Relay) and its claim sessions
 * (Session) — and the functions they call of one another. Only the engine's own .c files
 * include it; the rest of the program sees relay.h.
 *
 * Who does what:
 *   relay.c   the process: the Kafka producer the sessions share (created, recreated after a
 *             fatal error, purged), delivery reports routed to their session, signals, shutdown;
 *   session.c one session's life: its connection, its phase (session_set_phase is the only
 *             writer, and checks each change), what it does next between batches, timers, stop;
 *   claim.c   claiming a batch (and going around rows others have locked);
 *   produce.c handing the batch to the producer and taking the delivery reports;
 *   marks.c   recording the outcome (sent, failed, dead-lettered) and committing, or row by row;
 *             the next claim rides behind the COMMIT in the same round trip when it may;
 *   wakeup.c  falling asleep and waking up: the guard/follow protocol (wakeup.h). */
#ifndef OUTBOX_ENGINE_H
#define OUTBOX_ENGINE_H

#include <ev.h>
#include <stdbool.h>

#include "backoff.h"
#include "batch.h"
#include "config.h"
#include "floor.h"
#include "kafka.h"
#include "lanes.h"
#include "pg.h"
#include "relay.h"
#include "statements.h"
#include "wakeup.h"

/* After a batch in which nothing got through for a transient reason (Kafka down, say), wait
 * before claiming again. */
#define RETRY_BASE_S 0.5
#define RETRY_CAP_S 30.0
/* Dead events published to the dead-letter topic per batch, on top of batch-size. */
#define DEAD_LETTER_LIMIT 100
/* BEGIN, planner settings, dead-letter claim, the floor's two looks, the claim, the look for a
 * locker behind a claim around locks, a setup probe's mark statement. */
#define CLAIM_MAX_QUERIES 7

typedef struct Session Session;

/* Where a session is in its cycle; exactly one request is in flight in every phase but DOWN,
 * IDLE and PRODUCING. The allowed changes are listed in session.c (phase_change_allowed). */
typedef enum {
    PHASE_DOWN,                 /* no PostgreSQL connection */
    PHASE_SETUP,                /* LISTEN in flight */
    PHASE_IDLE,                 /* no transaction open */
    PHASE_REBALANCING,          /* lane ownership queries in flight */
    PHASE_CLAIMING,             /* BEGIN + claim in flight */
    PHASE_PRODUCING,            /* rows claimed, waiting for delivery reports */
    PHASE_MARKING,              /* marks + COMMIT in flight, or a batch recorded row by row */
    PHASE_MARKING_AND_CLAIMING, /* marks + COMMIT with the next claim behind them (marks.c) */
    PHASE_ENDING, /* COMMIT or ROLLBACK of a transaction that marks nothing, or a wakeup step */
} Phase;

/* The process: one Kafka producer shared by the claim sessions, and the signals. */
struct Relay {
    struct ev_loop *loop;
    const Config *cfg;
    rd_kafka_conf_t *kconf_template; /* kept to recreate the producer after a fatal error */
    KafkaProducer *kafka;
    Session *sessions;
    int n_sessions;
    int running;          /* sessions that have not finished stopping */
    bool purging;         /* a delivery timeout purged the producer; its reports are not all in */
    ev_timer purge_timer; /* purges again while reports are missing (see relay_start_purge) */
    int logged_owned;     /* lanes of all sessions, last logged, to log only changes */
    /* The first active_sessions connected sessions claim; the others rest (connected, no lanes):
     * --min-sessions, and all of --sessions from a backlog until --session-rest-after without a
     * full claim (relay_session_resting). */
    int active_sessions;
    int full_claims;           /* claims in a row that came back full (relay_batch_claimed) */
    ev_tstamp backlog_seen_at; /* the last full claim */
    ev_timer rest_timer;       /* looks whether the sessions above --min-sessions may rest */
    bool stopping;
    int signals;
    int exit_status;
    ev_signal sigterm, sigint;
};

/* Where each statement of a claim sits among its results, -1 for one not sent: set when the
 * claim is built, read when its results come (the request is gone by then). */
typedef struct ClaimLayout {
    int dead;    /* the dead-letter claim (--dead-letter-topic) */
    int held;    /* the floor's look at failed rows it holds back (floor.h) */
    int events;  /* the claim */
    int writers; /* the floor's look at writers */
    int locker;  /* behind a claim around locks: the first locked row and its locker */
    int n;       /* statements in all, from BEGIN */
} ClaimLayout;

/* One claim session: its own PostgreSQL connection, lane membership, transaction and batch. Each
 * is a member of the lane group like a relay of its own, so sessions of one process never claim
 * rows of the same aggregate at once, and a lane moves between them only between batches. */
struct Session {
    Relay *relay;
    int index; /* 0..sessions-1, for the logs */
    struct ev_loop *loop;
    const Config *cfg;
    PgConn *pg;
    Lanes lanes;
    Phase phase; /* written by session_set_phase only */
    Batch batch;
    BatchMarks marks;
    Wakeup wake;
    char *sql[SESSION_SQL_COUNT]; /* the templates expanded for the configured table */
    int claim_stmt;               /* SQL_CLAIM_HOLD or SQL_CLAIM_SKIP */
    int claim_sent;               /* the claim statement of the claim in flight */
    long row_limit;   /* rows the next claim asks for, at most --batch-size (see claim.c) */
    long claim_limit; /* rows the claim in flight asked for */
    bool batch_from_full_claim; /* the batch held came from a full claim (relay_batch_claimed) */
    ClaimFloor floor;           /* where claims start in the unsent index (floor.h) */
    ClaimLayout claim_at;       /* the statements of the claim in flight (claim.c) */
    ev_tstamp floor_look_due;   /* the next claim that looks, at the earliest */
    /* Claims go around rows others have locked (claim.c): from a claim that ran into a lock
     * until SQL_FIND_LOCKER finds no locked row in the window any more. */
    bool around_locks;
    long busy_window;       /* rows the claims around locks look at for locked rows */
    bool locked_row_logged; /* a stall on a locked row was logged; its end is not yet */
    bool lock_wait_logged;  /* claims wait out a lock they cannot see around (logged once) */
    int failed_stmt;        /* index of SQL_MARK_FAILED in the mark pipeline, -1 if not sent */
    int chained_marks_n;    /* statements of the mark pipeline before a claim sent behind them */
    bool wake_pending;      /* there may be rows to claim */
    bool rebalance_due;     /* lane ownership should be checked before the next claim */
    bool stopped;           /* done shutting down */
    bool waiting;           /* producing paused (queue full, purge): a delivery report resumes it */
    ev_tstamp last_rows_at; /* when a claim last returned rows */
    ev_tstamp claim_sent_at, marks_sent_at; /* of the current batch, for the debug log */
    bool stopping;
    Backoff retry;
    bool claim_error_logged;
    /* The last claim or mark failed for a reason of the setup (sqlstate.h: privileges, a missing
     * table or column), which no retry of the same rows can cure: the session gives its lanes
     * up, so other relays carry every aggregate, and the relay is not ready. It probes with a
     * claim of no lanes (and the marks' statements on no rows) after each retry backoff, and
     * takes lanes again once that goes through. */
    bool setup_fault;
    char setup_error[200];     /* its error, for /readyz and the log */
    int logged_sessions;       /* live sessions of the lane group at the last rebalance */
    char last_failure[256];    /* error of the last batch that had failures, "" once one had none */
    char last_mark_error[256]; /* of the last failed recording, logged once (see marks.c) */
    int salvage_row;           /* recording row by row: the row whose outcome is being recorded */
    int salvage_unrecorded;    /* rows whose outcome could not be recorded at all */
    int mark_retries;          /* batches in a row whose marks failed for a passing reason */
    bool salvage_by_row;       /* a failed batch, once rolled back, is recorded row by row */
    ev_timer poll_timer;
    ev_timer retry_timer;
    ev_timer busy_timer; /* session_poll_soon */
    ev_timer rebalance_timer;
    ev_timer shutdown_timer;
    ev_timer delivery_timer; /* bounds a batch's wait for acknowledgements */
    unsigned long long total_sent, total_failed, total_dead, order_breaks;
};

/* ---- relay.c: the process ---- */

/* Something the process cannot go on without: every session stops, and the exit status is 1. */
void relay_fail(Relay *r);
/* Messages of all sessions not yet reported: the producer and its queue are shared. */
int relay_in_flight(const Relay *r);
/* Lanes owned by all of the relay's sessions. */
int relay_lanes_owned(const Relay *r);
/* Whether s rests: it claims nothing and gives up its lanes and member slot between batches.
 * The first active_sessions sessions with a connection claim (--min-sessions of them while
 * there is no backlog); the others rest. */
bool relay_session_resting(const Relay *r, const Session *s);
/* A claim came back; full: as many rows as it asked for, or half the byte budget. Enough full
 * claims in a row mean a backlog: the resting sessions join (each at its next step between
 * batches) and stay until --session-rest-after passes without another full claim. */
void relay_batch_claimed(Relay *r, bool full);
/* Cancels everything at the producer and repeats that until every report is in. */
void relay_start_purge(Relay *r);
/* Whether the shared producer can take a batch now. After a fatal producer error it is
 * recreated here, but only once no session holds a batch (every message of the old one has been
 * reported): until then returns false, and the caller retries later. A failed recreation stops
 * the process (relay_fail) and returns false too. */
bool relay_producer_ready(Relay *r);

/* ---- session.c: one session ---- */

/* Initialises session index of r (its timers start; the connection comes with
 * session_connect). Returns false when out of memory. session_free releases it either way. */
bool session_init(Session *s, Relay *r, int index);
void session_free(Session *s);
/* Opens the session's PostgreSQL connection; the cycle starts when it is up. */
void session_connect(Session *s);
/* Stops the session: at once between batches, else once its batch is done (bounded by the
 * shutdown timeout while it waits for acknowledgements). */
void session_stop(Session *s);
/* The only writer of s->phase: a change the cycle does not allow is a bug, logged and aborted
 * on (a relay that does not know where it is must not mark rows). */
void session_set_phase(Session *s, Phase to);
/* The phase's name, for logs and tests ("claiming"); "?" for a value out of range. */
const char *session_phase_name(Phase p);
/* Called by session_set_phase with each change before it is made, when set: the engine's unit
 * tests (tests/unit/test_engine*.c) record the phases a session goes through. NULL in the
 * relay. */
extern void (*session_phase_observer)(const Session *s, Phase from, Phase to);
/* Between batches, starts whatever comes next: a due rebalance first, then a claim when there
 * is a reason to claim and nothing stands in the way; a woken guard first leaves. Does nothing
 * unless the session is idle. */
void session_start_next_request(Session *s);
/* Whether the claim that would follow the batch being marked may be sent with its marks, in the
 * same round trip: the batch is small and got something through, nothing
 * session_start_next_request would do first is due (a rebalance, a guard's leaving, a retry's
 * wait, stopping, a larger batch to allocate) and the session has lanes. */
bool session_may_chain_claim(const Session *s);
/* Tells the relay's other sessions to re-divide the lanes at their next step between batches:
 * s joined or left the group, or saw the group change. */
void session_rebalance_others(Session *s);
/* After a request between batches: the next request, or the end if the session is stopping. */
void session_after_request(Session *s);
/* Ends the session's part: a guard gives up the wakeup lock first (bounded by a second); the
 * loop ends with the last session. */
void session_finish_stopping(Session *s);
/* A claim or the marks failed for a reason of the setup (sqlstate.h; what: "claiming rows",
 * "recording a batch"; state and error: the failed statement's): the session gives its lanes up
 * at its next step and probes after each retry backoff (engine.h, Session.setup_fault). Logged
 * once per distinct error for the relay. */
void session_setup_failed(Session *s, const char *what, const char *state, const char *error);
/* A setup probe went through: the session joins the lane group again at its next step. */
void session_setup_fixed(Session *s);
/* Claims again after --busy-poll-interval. */
void session_poll_soon(Session *s);
/* Claims again after the retry backoff (which grows with each call until reset). */
void session_schedule_retry(Session *s);
/* Ends the open transaction (sql: COMMIT or ROLLBACK) without marking anything. */
void session_end_transaction(Session *s, const char *sql);

/* ---- claim.c ---- */

/* The statements of one claim and the parameter text they point to (claim.c fills it). */
typedef struct ClaimRequest {
    char limit[24], dead_limit[24], budget[24], dead_budget[24], max_message[24], window[24];
    const char *params[5], *dead_params[4], *held_params[1], *writers_params[1];
    const char *locker_params[2];
    const char *no_rows[1]; /* "{}": the marks' statement of a setup probe */
    PgQuery queries[CLAIM_MAX_QUERIES];
    int n;
} ClaimRequest;

/* Claims the next batch of the session's lanes (BEGIN, the dead-letter claim, the claim). */
void session_claim(Session *s);
/* Fills req with the next claim's statements, to be sent by the caller while req lives (the
 * queries point into it and into the session's lanes and floor, which must not change before the
 * send); the session now counts the claim as under way (wakeup, floor looks, poll timer). Returns
 * false, with nothing changed, when the shared producer cannot take a batch now. */
bool session_claim_build(Session *s, ClaimRequest *req);
/* What a claim's statements returned (results and n as a PgResultFn gets them, from the claim's
 * BEGIN on; error: the first failure among them, or NULL): the batch starts producing, or the
 * session sleeps, polls, retries or goes around a locked row. The session's phase is CLAIMING. */
void session_claimed(Session *s, PGresult **results, int n, const char *error);
/* The claim's transaction committed with every row of its batch recorded: the claim floor may
 * rise (floor.h). */
void session_floor_committed(Session *s);

/* ---- produce.c ---- */

/* Hands the batch's next rows to the producer until it is all produced or the queue is full. */
void session_produce_more(Session *s);
/* Marks the batch once nothing is left to produce and every report is in (and drops an
 * abandoned batch once its last report is in). */
void session_check_batch_done(Session *s);
/* A delivery report for br, a row of s's batch. */
void session_record_delivery(Session *s, BatchRow *br, rd_kafka_resp_err_t err);
/* The delivery timer's callback (w->data is the session). */
void session_on_delivery_timer(struct ev_loop *loop, ev_timer *w, int revents);

/* ---- wakeup.c (wakeup.h holds the state) ---- */

/* An empty claim: ends its transaction and asks to sleep, in one round trip. */
void wakeup_go_to_sleep(Session *s);
/* A guard gives the wakeup lock up (and wakes its followers), in a transaction of its own. */
void wakeup_leave_guard(Session *s);
/* Whether a guard must give the lock up before anything else: it was notified, or has work, or
 * has no lanes left. */
bool wakeup_guard_must_leave(const Session *s);

/* ---- marks.c ---- */

/* Records the outcome of the batch (every report is in) and commits. */
void session_send_marks(Session *s);

#endif
