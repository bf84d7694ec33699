/* engine: the types the engine's modules share — the process (Relay) and its claim sessions
 * (Session) — and the functions they call of one another. Only the engine's own .c files
 * include it; the rest of the program sees relay.h.
 *
 * Who does what:
 *   session.c the driver: session_step is the one function that moves a session. It owns the
 *             phase (session_set_phase, checked against the cycle's table), sends every request,
 *             routes every reply, report and timer to the module of the phase, and decides what
 *             comes next (next_step: one predicate for "what now", chained claims included);
 *   relay.c   the process: the Kafka producer the sessions share (created, recreated after a
 *             fatal error, purged), delivery reports routed to their session's driver, signals,
 *             shutdown;
 *   claim.c   builds a claim (and a claim around rows others have locked) and reads its reply;
 *   produce.c hands the batch to the producer and records the delivery reports;
 *   marks.c   builds the marks (sent, failed, dead-lettered; or row by row) and reads their reply;
 *   wakeup.c  the guard/follow protocol's state (wakeup.h) and the reply to a request to sleep.
 * claim, produce, marks and wakeup never send, never change the phase and never decide what comes
 * next: they build requests and say what a reply means (tools/check-driver.sh checks it). */
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
#include "metrics.h"
#include "pg.h"
#include "serializer.h"
#include "relay.h"
#include "statements.h"
#include "wakeup.h"

/* After a batch in which nothing got through for a transient reason (Kafka down, say), wait
 * before claiming again. */
#define RETRY_BASE_S 0.5
#define RETRY_CAP_S 30.0
/* Aggregate types a session holds out of its claims while Kafka refuses their topic (TopicHold),
 * and the longest type it holds: past either, the session falls back to claiming everything
 * after its retry backoff, as before the hold existed. */
#define HOLD_TYPES_MAX 16
#define HOLD_TYPE_MAX 256
/* Dead events published to the dead-letter topic per batch, on top of batch-size. */
#define DEAD_LETTER_LIMIT 100
/* How often a session whose claim floor is off for its check (failed, or the table unfit) or
 * turned off by a look asks the check again: one small query. */
#define FLOOR_CHECK_AGAIN_S 60.0
/* BEGIN, planner settings, dead-letter claim, the floor's two looks, the claim, its recheck, the
 * look for a locker behind a claim around locks; a setup probe has no floor's looks nor recheck,
 * and its mark statement, lane group's look and check of the lock functions (claim.c) take their
 * places (8 with the dead-letter claim and the look for a locker). */
#define CLAIM_MAX_QUERIES 8
/* The most rows the claim's recheck returns (claim.c): aggregates some other transaction held
 * back while the claim ran. More, and the session holds the whole batch back. */
#define CLAIM_RECHECK_MAX 1000

typedef struct Session Session;

/* Rows whose outcome the table refuses to record at all: marked sent, or failed, the row's own
 * trigger or constraint raises (a CHECK on attempts, a last_error column too narrow, a trigger
 * refusing UPDATEs); a dead event's copy alike (marked dead-lettered, or its publication
 * failed). Such a row stays unsent, and every claim would take it, publish it again
 * and fail to record it again, for ever, each time at the pace of the retry backoff with every
 * other row of the batch recorded one by one. So the relay keeps the rows apart (marks.c): its
 * sessions leave each out of their batches (unsent, not published, its aggregate held for the
 * batch) for UNRECORDABLE_WAIT_S, doubling with each refusal up to UNRECORDABLE_WAIT_MAX_S, then
 * try it once more (one publication an hour at most: consumers drop the duplicate), and forget
 * it once its outcome is recorded. One list for all sessions of the relay (of one database), kept
 * across their reconnects and rests: the row's lane may move to any of them, and a list of each
 * session's own, forgotten with its lanes, published the row again at every reconnect or rest
 * (each time with its error line), with no bound on how often. Row ids are the table's, so an
 * entry stays right wherever the lane goes; one whose row no claim of this relay has met for
 * UNRECORDABLE_STALE_S (its lane went to another relay, the row was purged) makes room for a new
 * one. Bounded: past UNRECORDABLE_MAX rows a further one goes out again after each retry
 * backoff, as before. A restart starts with an empty list: one more publication per row. */
#define UNRECORDABLE_MAX 64
#define UNRECORDABLE_WAIT_S 30.0
#define UNRECORDABLE_WAIT_MAX_S 3600.0
#define UNRECORDABLE_STALE_S 600.0
typedef struct Unrecordable {
    int n;
    long long ids[UNRECORDABLE_MAX];
    double wait[UNRECORDABLE_MAX]; /* seconds it was left out after its last refusal */
    double due[UNRECORDABLE_MAX];  /* monotonic time from which it is produced again */
    double met[UNRECORDABLE_MAX];  /* monotonic time a claim of the relay last took it */
    bool full_logged;              /* a row that did not fit was said (once until one fits) */
} Unrecordable;

/* Rows the broker refused as too large (MESSAGE_TOO_LARGE) in a produce request they shared with
 * other messages of the relay (produce.c). Kafka applies a topic's max.message.bytes to a whole
 * record batch and refuses the whole request; librdkafka 2.0.2 does not split it, so a small
 * event refused that way is not at fault. Each stays unsent with no attempt counted and is
 * produced again alone (nothing else of the relay in flight until its report): refused alone,
 * it is too large itself and is rejected as before. A dead event's copy to the dead-letter topic
 * is judged the same way, but refused alone (with its payload) it goes again alone without its
 * payload (bare), as one too large for the producer always did, while claims meet it (a bare
 * mark not met for ISOLATE_STALE_S is dropped: its payload is tried again); refused alone and
 * bare, it is parked (produce.c, copy_unfit). A set of ids with a
 * fixed cap: an id a claim has not met for ISOLATE_STALE_S (its lane moved, the row was
 * dead-lettered, requeued or deleted) is dropped at the next refusal, which makes room and lets an
 * episode end; past ISOLATE_MAX a refused row counts a transient failure instead (an attempt, no
 * rejection, never dead-lettered for it), but a copy's bare mark takes the place of the entry
 * met longest ago that has none (produce.c, isolate_again). A restart starts with an empty set:
 * such a row is refused with others once more. The set is forgotten when a claim finds the table
 * replaced (TRUNCATE ... RESTART IDENTITY), as the rows kept apart are: a new row under an old id
 * must not inherit a bare mark, its copy's payload never refused. */
#define ISOLATE_MAX 64
#define ISOLATE_STALE_S 600.0
typedef struct Isolate {
    int n;
    long long ids[ISOLATE_MAX];
    double met[ISOLATE_MAX]; /* monotonic time it was refused or last met by produce_more */
    bool bare[ISOLATE_MAX];  /* a dead event's copy refused alone: its payload is left out */
    bool warned; /* the episode's warning was said; until the set is empty (or only stale) */
} Isolate;

/* The aggregate types whose events a session leaves out of its claims because Kafka refused
 * their topic for a fault of the setup (kafka_error_setup: an ACL revoked, a topic deleted), so
 * that one refused topic does not slow the others down to one batch per retry backoff. Held by
 * aggregate type, not by topic: the claim cannot compute a row's topic, and an aggregate (type,
 * id) held whole keeps its events in order; with {event_type} in --topic-template, a type some
 * of whose topics still work is held whole too (conservative). Rows of a held type stay unsent
 * with no attempt counted, and are claimed again by the probe: after each hold backoff (0.5 s
 * doubling to RETRY_CAP_S) one claim leaves nothing out; its batch keeps held the types Kafka
 * refused again and lets the others go. Bounded (HOLD_TYPES_MAX types of at most HOLD_TYPE_MAX
 * bytes, UTF-8: the claim compares them in a text[] literal): past the bound, or when a claim
 * that left a type out returns its rows all the same, the hold is dropped and the session waits
 * its retry backoff after each batch Kafka refused, claiming everything (the pace before the
 * hold), so a refused type never loops at once. Cleared with the lanes
 * (a reconnect, resting, a setup fault of the database). marks.c keeps it, claim.c reads it. */
typedef struct TopicHold {
    int n;                                            /* types held */
    char types[HOLD_TYPES_MAX][HOLD_TYPE_MAX];        /* as the claim compares them: NULL as "" */
    char topics[HOLD_TYPES_MAX][ROUTE_TOPIC_MAX + 1]; /* the topic refused for each, for the log */
    StrBuf param;    /* the claim's $6: the types as a text[] literal ("{}" when none) */
    Backoff backoff; /* between probes; reset when the hold is empty */
    bool probe_due;  /* the next claim is the probe (set by the hold timer, session.c), until
                      * the probe's batch is recorded or it finds nothing */
    bool probing;    /* the claim in flight, and the batch held, come from the probe */
    bool left_out;   /* the claim in flight left held types out: an empty one does not mean
                      * nothing is left (the floor may pass their rows: floor.h says why) */
    bool overflowed; /* the last batch's refusals did not fit: the retry backoff applies */
} TopicHold;

/* Where a session is in its cycle. In every phase but DOWN, IDLE and PRODUCING exactly one request
 * is in flight, and the phase names it: the reply is read by the code of that phase alone. The
 * allowed changes are the driver's table (session.c, `cycle`), drawn in docs/session-cycle.md. */
typedef enum {
    PHASE_DOWN,                 /* no PostgreSQL connection */
    PHASE_SETUP,                /* LISTEN (and the floor's check) in flight */
    PHASE_IDLE,                 /* no transaction open, no request in flight */
    PHASE_REBALANCING,          /* lane ownership queries in flight (lanes.c) */
    PHASE_LEAVING_LANES,        /* giving the lanes and member slot up (resting, setup fault) */
    PHASE_LEAVING_GUARD,        /* a guard gives the wakeup lock up (wakeup.h) */
    PHASE_CLAIMING,             /* BEGIN + claim in flight */
    PHASE_PRODUCING,            /* rows claimed, waiting for delivery reports */
    PHASE_MARKING,              /* marks + COMMIT in flight */
    PHASE_MARKING_AND_CLAIMING, /* marks + COMMIT with the next claim behind them */
    PHASE_ROLLING_BACK,         /* ROLLBACK of marks that failed */
    PHASE_RECORDING_ROW,        /* one row's outcome in flight (a batch recorded row by row) */
    PHASE_ENDING,               /* COMMIT or ROLLBACK of a claim that produces nothing */
    PHASE_GOING_TO_SLEEP,       /* COMMIT of an empty claim + the request to sleep */
} Phase;
#define PHASE_COUNT (PHASE_GOING_TO_SLEEP + 1)

/* What moves a session: everything that happens to it is one of these, handed to session_step. */
typedef enum {
    EVENT_CONNECTED,        /* its PostgreSQL connection is up */
    EVENT_DISCONNECTED,     /* its connection is gone, with the open transaction and lanes */
    EVENT_REPLY,            /* the reply to the phase's request (results, n, error) */
    EVENT_LANES_REPLY,      /* the lane group's reply (REBALANCING, LEAVING_LANES) */
    EVENT_WAKE,             /* there may be rows: a notification, the poll or retry timer */
    EVENT_REBALANCE_DUE,    /* lane ownership should be looked at before the next claim */
    EVENT_LOOK,             /* the relay changed something the next step depends on */
    EVENT_REPORT,           /* a delivery report for row of its batch (row, err) */
    EVENT_PRODUCER_ROOM,    /* another session's report freed room in the producer's queue */
    EVENT_DELIVERY_TIMEOUT, /* the batch's wait for acknowledgements is over */
    EVENT_STOP,             /* the relay stops */
    EVENT_SHUTDOWN_TIMEOUT, /* the bound on stopping is over */
} SessionEventKind;

typedef struct SessionEvent {
    SessionEventKind kind;
    PGresult **results; /* EVENT_REPLY: as a PgResultFn gets them (the callee may take some) */
    int n;
    const char *error;
    bool ok;       /* EVENT_LANES_REPLY: false when a query failed (logged) */
    BatchRow *row; /* EVENT_REPORT */
    rd_kafka_resp_err_t err;
} SessionEvent;

/* The process: one Kafka producer shared by the claim sessions, and the signals. */
struct Relay {
    struct ev_loop *loop;
    const Config *cfg;
    /* With several databases in one process: "database=NAME" for its log lines, and its metrics
     * registry; relay_enter makes them current when the relay's work starts. */
    char log_context[80];
    MetricsDb *metrics;
    RelayStoppedFn on_stopped; /* NULL: the loop ends when the relay has stopped */
    void *on_stopped_arg;
    rd_kafka_conf_t *kconf_template; /* kept to recreate the producer after a fatal error */
    KafkaProducer *kafka;
    /* Recreations of the producer in a row with no acknowledgement between them space out
     * (relay_producer_ready): one that fails at its own start would otherwise be recreated by
     * every claim. No recreation before recreate_after (monotime; 0: at once). */
    Backoff recreate;
    ev_tstamp recreate_after;
    /* Why the last recreation was not tried (a TLS file refused), as logged at error level:
     * the same again is said at debug level only; "" once a recreation is tried. */
    char recreate_refused[160];
    bool in_report; /* on_delivery is serving a report of r->kafka (inside its rd_kafka_poll) */
    Serializer *serializer; /* --value-format avro/json-schema; NULL: values as they are */
    Session *sessions;
    int n_sessions;
    int running;          /* sessions that have not finished stopping */
    bool purging;         /* a delivery timeout purged the producer; its reports are not all in */
    ev_timer purge_timer; /* purges again while reports are missing (see relay_start_purge) */
    ev_timer room_timer;  /* resumes waiting sessions once a report has freed its room */
    /* Kafka cut off from this relay alone (relay_kafka_timed_out): delivery timeouts in a row
     * with no acknowledgement between them, and whether the relay asks the lane group to give
     * its lanes to members that reach Kafka (kafka_away, lanes.h). A relay away with no lanes
     * tries again after away_backoff (away_timer): it takes its share back, and one more timeout
     * (away_trial) sends it away again, for longer. */
    int kafka_timeouts;
    bool kafka_away, away_trial;
    Backoff away_backoff;
    ev_timer away_timer;
    int logged_owned;    /* lanes of all sessions, last logged, to log only changes */
    bool floor_off_said; /* why the claim floor is off was logged (once an episode) */
    /* The first active_sessions sessions that can claim do; the others rest (no lanes):
     * --min-sessions, and all of --sessions from a backlog until --session-rest-after without a
     * full claim (relay_session_resting). */
    int active_sessions;
    int full_claims;           /* claims in a row that came back full (relay_batch_claimed) */
    ev_tstamp backlog_seen_at; /* the last full claim */
    ev_timer rest_timer;       /* looks whether the sessions above --min-sessions may rest */
    Unrecordable unrecordable; /* rows whose outcome the table refuses to record (marks.c) */
    Isolate isolate;           /* rows to produce alone (produce.c) */
    /* Messages handed to the producer so far (produce.c): a row refused as too large was alone
     * in its request when nothing was in flight as it went out and nothing went out after it. */
    unsigned long long produced;
    WakeupWaiter waiter; /* queues for the wakeup lock while producers hold it (wakeup.h) */
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
    int recheck; /* after the claim: aggregates held back since it began (SQL_CLAIM_RECHECK_HOLD) */
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
    /* LISTEN took effect on this connection (session.c, listening). Without it nothing wakes
     * the session, nor could it guard the wakeup lock for the others: it never sleeps, and
     * polls every --poll-interval instead. */
    bool listening;
    char *sql[SESSION_SQL_COUNT]; /* the templates expanded for the configured table */
    int claim_stmt;               /* SQL_CLAIM_HOLD or SQL_CLAIM_SKIP */
    int claim_sent;               /* the claim statement of the claim in flight */
    long row_limit;   /* rows the next claim asks for, at most --batch-size (see claim.c) */
    long claim_limit; /* rows the claim in flight asked for */
    bool batch_from_full_claim; /* the batch held came from a full claim (relay_batch_claimed) */
    ClaimFloor floor;           /* where claims start in the unsent index (floor.h) */
    ClaimLayout claim_at;       /* the statements of the claim in flight (claim.c) */
    ev_tstamp floor_look_due;   /* the next claim that looks, at the earliest */
    /* The floor is off for want of its check (learn_floor_allowed, session.c: the check failed
     * or found the table unfit) or a later look turned it off (claim.c): the check is asked
     * again, alone, before the first claim from then on (0: not due). */
    ev_tstamp floor_check_due;
    bool floor_rechecking; /* that check is the request in flight (PHASE_SETUP) */
    /* Claims go around rows others have locked (claim.c): from a claim that ran into a lock
     * until SQL_FIND_LOCKER finds no locked row in the window any more. */
    bool around_locks;
    long busy_window;       /* rows the claims around locks look at for locked rows */
    bool locked_row_logged; /* a stall on a locked row was logged; its end is not yet */
    bool lock_wait_logged;  /* claims wait out a lock they cannot see around (logged once) */
    int held_whole_claims;  /* claims in a row whose recheck held every row (claim.c) */
    int failed_stmt;        /* index of SQL_MARK_FAILED in the mark pipeline, -1 if not sent */
    int chained_marks_n;    /* statements of the mark pipeline before a claim sent behind them */
    bool wake_pending;      /* there may be rows to claim */
    bool rebalance_due;     /* lane ownership should be checked before the next claim */
    bool stopped;           /* done shutting down */
    bool waiting;           /* producing paused (queue full, purge): a delivery report resumes it */
    /* Paused on a row to produce alone (Isolate) until nothing else of the relay is in flight;
     * the other sessions produce nothing meanwhile (the lower index goes first). */
    bool isolate_wait;
    ev_tstamp last_rows_at;                 /* when a claim last returned rows */
    ev_tstamp claim_sent_at, marks_sent_at; /* of the current batch, for the debug log */
    bool stopping;
    Backoff retry;
    /* Its claim waits for the other sessions' batches, the producer having failed: the last one
     * done wakes it (relay_batch_done), unless it is a setup fault's probe, which keeps its retry
     * backoff; for a claim the backoff is only the fallback. */
    bool producer_wait;
    bool claim_error_logged;
    /* The last claim or mark failed for a reason of the setup (sqlstate.h: privileges, a missing
     * table or column), which no retry of the same rows can cure: the session gives its lanes
     * up, so other relays carry every aggregate, and the relay is not ready. It probes with a
     * claim of no lanes (and the marks' statements on no rows) after each retry backoff, and
     * takes lanes again once that goes through. */
    bool setup_fault;
    char setup_error[200]; /* its error, for /readyz and the log */
    /* Kafka refused the last batch's events for a fault of the setup (kafka_error_setup: not
     * authorised, unknown topic): its error and topic, for /readyz (the relay is not ready) and
     * to log it once; "" once a batch delivered without one (marks.c, note_kafka_fault) or a claim
     * found nothing left to send (marks_nothing_unsent), and not while a type is held; also
     * when the session gives its lanes up (session.c, lanes_divided: resting, it claims nothing
     * that would clear it). The rows stay unsent, no attempt counted, and their aggregate types
     * are held (hold). */
    char kafka_fault[200];
    TopicHold hold;         /* aggregate types left out of the claims while Kafka refuses them */
    ev_timer hold_timer;    /* the hold backoff: when it fires the next claim probes (session.c) */
    uint64_t seen_members;  /* the lane group's members at its last look (lanes.members) */
    char last_failure[256]; /* error of the last batch that had failures (marks.c,
                             * log_batch_failures), "" once one delivered with none */
    char last_dead_failure[256]; /* the same for dead-letter publications alone: reported even
                                  * while events fail too (log_batch_failures) */
    char last_mark_error[256];   /* of the last failed recording, logged once (see marks.c) */
    int salvage_row;             /* recording row by row: the row whose outcome is being recorded */
    int salvage_unrecorded;      /* rows whose outcome could not be recorded at all */
    int salvage_sent, salvage_failed; /* rows recorded as sent or failed, one by one so far */
    /* Of those, dead events' copies to the dead-letter topic (no event sent, no attempt failed:
     * the "stopped" totals count them apart). */
    int salvage_copies_sent, salvage_copies_failed;
    int salvage_refused; /* rows delivered whose sent mark the table refused */
    int mark_retries;    /* batches in a row whose marks failed for a passing reason */
    bool salvage_by_row; /* the batch, its marks rolled back, is recorded row by row (until done) */
    ev_timer poll_timer;
    ev_timer retry_timer;
    ev_timer busy_timer; /* poll_soon (session.c) */
    ev_timer rebalance_timer;
    ev_timer shutdown_timer;
    ev_timer delivery_timer; /* bounds a batch's wait for acknowledgements */
    /* The "stopped" totals: events sent, failed attempts of events, events dead-lettered, dead
     * events' copies published to the dead-letter topic, order breaks. */
    unsigned long long total_sent, total_failed, total_dead, total_copies, order_breaks;
};

/* ---- relay.c: the process ---- */

/* A session has finished stopping (session.c): with the last one the relay is done. Returns true
 * when the loop is to end then (one database); with several, relay_set_stopped_hook's function
 * is called instead and false returned (the others go on). */
bool relay_session_stopped(Relay *r);
/* How many relays the process has now (at least 1): one per database it serves
 * (docs/operations.md#many-databases). Read by the claims to space their looks at pg_locks. */
int relays_in_process(void);
/* Something the process cannot go on without: every session stops, and the exit status is 1. */
void relay_fail(Relay *r);
/* Messages of all sessions not yet reported: the producer and its queue are shared. */
int relay_in_flight(const Relay *r);
/* A row met a full queue while a report was being served (r->in_report) with nothing else of
 * the relay's in flight: librdkafka counts the reported message in its queue until the report
 * returns, and no report is left to resume the waiting sessions. They are resumed on the loop's
 * next iteration, once the report has freed the room (at most one such wake is pending). */
void relay_room_after_report(Relay *r);
/* Lanes owned by all of the relay's sessions. */
int relay_lanes_owned(const Relay *r);
/* Whether s rests: it claims nothing and gives up its lanes and member slot between batches.
 * The first active_sessions sessions that can claim (connected, no setup fault, no abandoned
 * batch still out) claim (--min-sessions of them while there is no backlog); the others rest.
 * A session that can claim again tells those above it (session.c, rest_others). */
bool relay_session_resting(const Relay *r, const Session *s);
/* A claim came back; full: as many rows as it asked for, or half the byte budget. Enough full
 * claims in a row mean a backlog: the resting sessions join (each at its next step between
 * batches) and stay until --session-rest-after passes without another full claim. */
void relay_batch_claimed(Relay *r, bool full);
/* Cancels everything at the producer and repeats that until every report is in. */
void relay_start_purge(Relay *r);

/* A delivery timeout cancelled messages in flight: one more in the streak with nothing
 * acknowledged. After --kafka-away-after of them (one on a trial) the relay is away: each session
 * asks the group, at its next look, to give its lanes to members that reach Kafka (none:
 * it keeps them). */
void relay_kafka_timed_out(Relay *r);

/* What the relay's sessions say of its Kafka to the lane group: away, trying again, or none. */
LaneMark relay_lane_mark(const Relay *r);
/* Whether the shared producer can take a batch now. After a fatal producer error it is
 * recreated here, but only once no session holds a batch (every message of the old one has been
 * reported): until then returns false, and the caller retries later. A failed recreation stops
 * the process (relay_fail) and returns false too. */
bool relay_producer_ready(Relay *r);
/* A session's batch is done (recorded, or abandoned and every report in): after a fatal producer
 * error the last one wakes the sessions whose claims waited for it (Session.producer_wait). */
void relay_batch_done(Relay *r);

/* ---- session.c: the driver ---- */

/* Initialises session index of r (its timers start; the connection comes with
 * session_connect). Returns false when out of memory. session_free releases it either way. */
bool session_init(Session *s, Relay *r, int index);
void session_free(Session *s);
/* Opens the session's PostgreSQL connection; the cycle starts when it is up. */
void session_connect(Session *s);
/* The driver: the one function that moves a session. It takes what happened (ev), lets the
 * module of the session's phase read it, and decides what the session does next — the whole
 * cycle is its table of phases (session.c). Everything else reaches a session through it: the
 * relay (reports, stop, nudges), the connection's callbacks and the timers. */
void session_step(Session *s, const SessionEvent *ev);
/* session_step with an event that carries nothing but its kind. */
void session_event(Session *s, SessionEventKind kind);
/* The only writer of s->phase (the driver calls it): a change the cycle's table does not allow is
 * a bug, logged and aborted on (a relay that does not know where it is must not mark rows). */
void session_set_phase(Session *s, Phase to);
/* The phase's name, for logs and tests ("claiming"); "?" for a value out of range. */
const char *session_phase_name(Phase p);
/* Called by session_set_phase with each change before it is made, when set: the engine's unit
 * tests (tests/unit/test_engine*.c) record the phases a session goes through. NULL in the
 * relay. */
extern void (*session_phase_observer)(const Session *s, Phase from, Phase to);
/* A claim or the marks failed for a reason of the setup (sqlstate.h; what: "claiming rows",
 * "recording a batch"; state and error: the failed statement's): the session gives its lanes up
 * at its next step and probes after each retry backoff (engine.h, Session.setup_fault). Logged
 * once per distinct error for the relay. State only: the driver acts on it. */
void session_setup_failed(Session *s, const char *what, const char *state, const char *error);

/* ---- claim.c: builds a claim, reads its reply ---- */

/* The statements of one claim and the parameter text they point to (claim.c fills it). */
typedef struct ClaimRequest {
    char limit[24], dead_limit[24], budget[24], dead_budget[24], max_message[24], window[24];
    char recheck_limit[24];
    const char *params[6], *dead_params[4], *held_params[2], *writers_params[1];
    const char *locker_params[2], *recheck_params[2];
    const char *no_rows[1]; /* "{}": the marks' statement of a setup probe */
    PgQuery queries[CLAIM_MAX_QUERIES];
    int n;
} ClaimRequest;

/* What a claim's reply means for the session (claim_read). */
typedef enum {
    CLAIM_BATCH,           /* rows were claimed: the batch is loaded, produce it */
    CLAIM_EMPTY_SLEEP,     /* nothing, and no rows for --sleep-after: COMMIT and ask to sleep */
    CLAIM_EMPTY_POLL,      /* nothing, but rows came recently: COMMIT, claim after the busy poll */
    CLAIM_NOTHING,         /* nothing to produce (asleep's final check, stopping): COMMIT */
    CLAIM_LOCKED,          /* ran into a lock: ROLLBACK, claim around locks at once */
    CLAIM_LOCKED_WAIT,     /* ran into a lock the widest window cannot see: ROLLBACK, retry */
    CLAIM_FAILED,          /* failed (logged; a setup fault noted): ROLLBACK, retry */
    CLAIM_PRODUCER_FAILED, /* the producer failed meanwhile: ROLLBACK, retry recreates it */
    CLAIM_PROBE_PASSED,    /* a setup fault's probe went through: COMMIT, take lanes again */
} ClaimOutcome;

/* Fills req with the next claim's statements, to be sent by the caller while req lives (the
 * queries point into it and into the session's lanes and floor, which must not change before the
 * send); the session now counts the claim as under way (wakeup, floor looks, poll timer). Returns
 * false, with nothing changed, when the shared producer cannot take a batch now. */
bool claim_build(Session *s, ClaimRequest *req);
/* Reads what a claim's statements returned (results and n as a PgResultFn gets them, from the
 * claim's BEGIN on; error: the first failure among them, or NULL): learns the floor, the lockers
 * and the row limit, loads the batch (taking the results its rows point into: they are set to
 * NULL) and says what it means. Sends nothing. */
ClaimOutcome claim_read(Session *s, PGresult **results, int n, const char *error);
/* The claim's transaction committed with every row of its batch recorded: the claim floor may
 * rise (floor.h). */
void claim_floor_committed(Session *s);

/* ---- produce.c: hands the batch to the producer, takes its reports ---- */

/* Hands the batch's next rows to the producer until it is all produced or the queue is full
 * (s->waiting: a report of any session frees room); when stopping or timed out, the rows not
 * produced yet are left unsent. */
void produce_more(Session *s);
/* Whether nothing is left to produce and every report is in: the batch can be marked. */
bool produce_finished(const Session *s);
/* Records a delivery report for br, a row of s's batch (ignored for a row given up on). */
void produce_record_report(Session *s, BatchRow *br, rd_kafka_resp_err_t err);
/* The batch's delivery timeout: with messages at the producer, purges it (every session's
 * messages count as timed out); with none, the rest of the batch is left unsent. */
void produce_delivery_timeout(Session *s);
/* Stopping took too long: the reports still missing are ignored, their rows stay unsent. */
void produce_give_up_waiting(Session *s);
/* Forgets the relay's rows to produce alone (Isolate) and their bare marks: a claim found the
 * table replaced or its order column's sequence set back, so their ids may name other rows now.
 * Called before that claim's rows are produced; a row alone in flight keeps its report's path. */
void produce_isolate_forget_all(Relay *r);

/* ---- wakeup.c and waiter.c (wakeup.h holds the state) ---- */

/* Reads the reply of COMMIT + the request to sleep: false when a producer is mid-transaction
 * (poll again soon), true when the session is asleep (as guard or follower; one final claim is
 * due). */
bool wakeup_sleep_read(Session *s, PGresult **results, int n, const char *error);
/* Whether a guard must give the lock up before anything else: it was notified, or has work, or
 * has no lanes left. */
bool wakeup_guard_must_leave(const Session *s);
/* A session of r was told busy (wakeup.h): true when the waiter's wait is in flight, whose end
 * (a notification) wakes the session, which may then sleep as a follower; false when it must
 * poll as before (no wait in flight, the waiter connecting or failed a moment ago, r stopping).
 * start: the session has been busy long enough to start a wait when none is in flight, and to
 * connect first if need be; without it, a wait starts only on a connection already made. */
bool wakeup_waiter_wait(Relay *r, bool start);
/* Sets up r's waiter (no connection yet) / closes it and stops its timers (the wait in flight,
 * if any, ends on the server within its lock_timeout and notifies). */
void wakeup_waiter_init(Relay *r);
void wakeup_waiter_free(Relay *r);
/* relay.c: the waiter's wait failed, so maybe without the notification its end sends: wakes the
 * sessions of r asleep on it (a follower; a guard ignores it) as a "guard left" would. */
void relay_waiter_failed(Relay *r);

/* ---- marks.c: builds the marks, reads their reply ---- */

/* The statements that record a batch's outcome and the parameter text they point to. */
typedef struct MarkRequest {
    char max_attempts[24], backoff[32], backoff_max[32];
    const char *sent[1], *failed[6], *dl_sent[2], *dl_failed[2];
    PgQuery queries[PG_MAX_QUERIES];
    int n;
} MarkRequest;

/* What the marks' reply means (marks_read). */
typedef enum {
    MARKS_RECORDED,       /* committed: on with the next claim */
    MARKS_RECORDED_RETRY, /* committed, but nothing got through for a passing reason: back off */
    MARKS_FAILED,         /* not recorded: ROLLBACK, then row by row (s->salvage_by_row) or retry */
} MarksOutcome;

/* Every report is in: logs the batch's failures and fills s->marks with its outcome. */
void marks_prepare(Session *s);
/* A claim found nothing to send for s: the rows a Kafka setup fault left unsent are gone
 * (requeued, deleted, or delivered by another relay), so the fault no longer holds /readyz. */
void marks_nothing_unsent(Session *s);
/* The hold (TopicHold) lets go of every type: the session lost its lanes (reconnect, resting,
 * a setup fault of the database) or a probe found nothing left to send. */
void marks_hold_clear(Session *s);
/* Fills req with the statements that record s->marks, then COMMIT when commit is set (without
 * it the request is one implicit transaction); next, when not NULL, is a claim sent after the
 * COMMIT in the same pipeline (its statements are copied). req must outlive the send. */
void marks_build(Session *s, bool commit, const ClaimRequest *next, MarkRequest *req);
/* Reads the marks' reply (chained: with a claim behind them, whose results follow the first
 * s->chained_marks_n and are not touched). */
MarksOutcome marks_read(Session *s, PGresult **results, int n, const char *error, bool chained);
/* The failed marks' transaction is rolled back: true when the rows are to be recorded one by one
 * (marks_next_row from the first), false when the batch is sent again after the backoff. */
bool marks_rolled_back(Session *s);
/* Recording row by row: fills req for the next row whose outcome is to be recorded and returns
 * true; false (and logs the batch's summary) once none is left. */
bool marks_next_row(Session *s, MarkRequest *req);
/* Whether br is a row whose outcome the table refused to record (the relay's Unrecordable) and
 * whose wait is not over: it is then left unsent, not produced. Notes that a claim met the row
 * (Unrecordable.met), whatever the answer. */
bool marks_skip_unrecordable(const Session *s, const BatchRow *br);
/* Forgets every row the relay keeps apart: the session's claim found the table replaced or its
 * order column's sequence set back (TRUNCATE ... RESTART IDENTITY), so their ids may now name
 * other, healthy rows, which would be left out with their aggregates for up to an hour. */
void marks_unrecordable_forget_all(Session *s);
/* Reads the reply of one row's marks. */
void marks_row_read(Session *s, PGresult **results, int n, const char *error);
/* Whether a batch recorded row by row waits for the retry backoff before the next claim. */
bool marks_row_by_row_retry(const Session *s);
/* Recording row by row ends before its last row: the relay stops (lost false), or the connection
 * went (lost true; the row in flight with it, its outcome unknown). Logs what was recorded; the
 * rest goes out again. Lost, the batch is abandoned and never done, so its recorded rows are
 * counted here; stopping, marks_batch_done counts them. */
void marks_row_by_row_cut_short(Session *s, bool lost);
/* The batch's outcome is recorded (or given up): lets go of it, and counts it (sent and failed
 * rows, outbox_batches_total) when committed, not when rolled back (its rows go out again and
 * are counted then); without retry the retry backoff starts again from its base. */
void marks_batch_done(Session *s, bool retry, bool committed);

#endif
