#include "relay.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backoff.h"
#include "batch.h"
#include "kafka.h"
#include "lanes.h"
#include "log.h"
#include "metrics.h"
#include "pg.h"
#include "route.h"
#include "table.h"

#define WAKEUP_CHANNEL "outbox_relay"
/* After a batch in which nothing got through for a transient reason (Kafka down, say), wait
 * before claiming again. */
#define RETRY_BASE_S 0.5
#define RETRY_CAP_S 30.0
/* Dead events published to the dead-letter topic per batch, on top of batch-size. */
#define DEAD_LETTER_LIMIT 100

static const char *const SQL_LISTEN = "LISTEN " WAKEUP_CHANNEL;
static const char *const SQL_BEGIN = "BEGIN";
static const char *const SQL_COMMIT = "COMMIT";
static const char *const SQL_ROLLBACK = "ROLLBACK";
/* For the claim that follows, within its transaction: walk the unsent index in order instead of
 * collecting and sorting every unsent row. The planner picks the sort when the table has no
 * statistics yet (a new outbox until autovacuum first analyzes it, up to a minute after its first
 * rows); each claim then reads the whole backlog (measured: 200-675 ms instead of 1.4 ms a claim
 * at 200,000 unsent rows). Test 31 keeps it so. No JIT: the claim around locks is estimated
 * above jit_above_cost on a large backlog, and compiling it took 0.9 s a claim (measured, 200,000
 * unsent rows) to save nothing. lock_timeout: see SQL_CLAIM. */
#define CLAIM_LOCK_TIMEOUT_MS "200"
static const char *const SQL_CLAIM_PLAN =
    "SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true),"
    " set_config('jit', 'off', true), set_config('lock_timeout', '" CLAIM_LOCK_TIMEOUT_MS
    "', true)";
/* Before the marks, in the claim's transaction: they wait as long as they need (a table lock
 * some DDL holds, say), rather than fail after the claim's lock_timeout. */
static const char *const SQL_MARK_PLAN = "SELECT set_config('lock_timeout', '0', true)";
/* After a claim hit a row locked by someone else, claims go around locked rows for this long
 * before a plain claim tries again (see on_claim_locked). */
#define AROUND_LOCKS_S 5.0

/* The statements on the outbox table are templates: relay/table.h expands the {placeholders} to
 * the configured table and columns when the connection is up.
 *
 * The claim: unsent rows of the lanes this relay owns ($2), in seq order, that are not waiting for
 * a retry and whose aggregate has no earlier row that is waiting (or, with the hold policy, dead):
 * an aggregate's events never overtake one another. Aggregates are compared as the lanes hash
 * them, NULL as '' (adopted tables may allow NULL ids, and NULL = NULL would hold nothing back).
 * The held-back set comes from the small partial index on failed rows, so it costs nothing while
 * nothing fails. Its columns are CLAIM_COLUMNS (below).  */
/* clang-format would split the macro calls inside the string concatenations. */
/* clang-format off */
#define SQL_BLOCKED(blocked_condition)                                                             \
    "WITH blocked AS ("                                                                            \
    " SELECT coalesce(o.{aggregate_type}::text, '') AS agg_type,"                                 \
    " coalesce(o.{aggregate_id}::text, '') AS agg_id,"                                             \
    " min(o.{seq}) AS first_seq"                                                                   \
    " FROM {table} o WHERE o.sent_at IS NULL AND o.attempts > 0 AND o.lane = ANY($2::smallint[])"  \
    " AND " blocked_condition " GROUP BY 1, 2)"
#define SQL_CLAIMABLE                                                                              \
    " o.sent_at IS NULL AND o.dead_at IS NULL AND o.lane = ANY($2::smallint[])"                    \
    " AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())"                               \
    " AND NOT EXISTS (SELECT 1 FROM blocked b"                                                     \
    " WHERE b.agg_type = coalesce(o.{aggregate_type}::text, '')"                                   \
    " AND b.agg_id = coalesce(o.{aggregate_id}::text, '') AND b.first_seq < o.{seq})"

/* The plain claim locks the rows in order and waits for a row someone else has locked, at most
 * CLAIM_LOCK_TIMEOUT_MS. It does not skip locked rows: lanes already keep other relays (and the
 * other sessions) off this session's rows, so a locked row is someone else's — an operator's open
 * UPDATE, a report's FOR SHARE, a foreign key check — and skipping it would publish the later
 * events of its aggregate first (issue 15). A claim that runs into the timeout fails with 55P03
 * and the session claims around locked rows for a while (SQL_CLAIM_AROUND_LOCKS). */
#define SQL_CLAIM(blocked_condition)                                                               \
    SQL_BLOCKED(blocked_condition)                                                                 \
    " SELECT" CLAIM_COLUMNS("NULL::text") " FROM {table} o WHERE" SQL_CLAIMABLE                \
    " ORDER BY o.{seq} LIMIT $1 FOR UPDATE OF o"

/* Around locked rows: the aggregates with a row locked by a running transaction among the next
 * rows (busy: a row's xmax is its locker's transaction id while one transaction holds it, and
 * that transaction holds a lock on its own id in pg_locks) are left out from that row on, before
 * the LIMIT, so a locked aggregate with a long tail cannot fill the batch and stall the others.
 * The claim still waits for (and times out on) a lock it did not see coming — one several
 * transactions share (xmax is then a multixact) or one taken meanwhile — rather than skip it:
 * that keeps order, at the cost of another round in this mode. It returns the rows as locked,
 * rechecked by PostgreSQL like any FOR UPDATE. It runs at 0.5-0.7 times the plain claim's rate
 * (pgbench, 1,000-row claims over 200,000 unsent rows), hence only after a lock was met. */
#define BUSY_SCAN_FACTOR "4" /* rows looked at for locks, per row of the batch */
#define SQL_CLAIM_AROUND_LOCKS(blocked_condition)                                                  \
    SQL_BLOCKED(blocked_condition) ","                                                             \
    " busy AS MATERIALIZED (SELECT h.agg_type, h.agg_id, min(h.seq) AS first_seq"                  \
    " FROM (SELECT o.{seq} AS seq, o.xmax, coalesce(o.{aggregate_type}::text, '') AS agg_type,"    \
    " coalesce(o.{aggregate_id}::text, '') AS agg_id FROM {table} o"                               \
    " WHERE o.sent_at IS NULL AND o.dead_at IS NULL AND o.lane = ANY($2::smallint[])"              \
    " ORDER BY o.{seq} LIMIT $1 * " BUSY_SCAN_FACTOR ") h"                                         \
    " JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = h.xmax"                \
    " AND l.granted AND l.pid <> pg_backend_pid() GROUP BY 1, 2)"                                  \
    " SELECT" CLAIM_COLUMNS("NULL::text") " FROM {table} o WHERE" SQL_CLAIMABLE                    \
    " AND NOT EXISTS (SELECT 1 FROM busy k"                                                        \
    " WHERE k.agg_type = coalesce(o.{aggregate_type}::text, '')"                                   \
    " AND k.agg_id = coalesce(o.{aggregate_id}::text, '') AND k.first_seq <= o.{seq})"             \
    " ORDER BY o.{seq} LIMIT $1 FOR UPDATE OF o"

/* The rows of a claim (rows_query returns CLAIM_COLUMNS in seq order) up to the byte budget: the
 * first row always, then rows while the payload bytes so far stay within $3 (--batch-bytes).
 * Rows left out stay locked but untouched until the commit, and come first in the next claim. A
 * payload over $4 (the producer's message.max.bytes) cannot be sent: it is not returned (NULL)
 * and costs nothing of the budget; its size comes as the last column, which the relay reads to
 * fail the row (issue 16: memory bounded by configuration, not by the data).
 * Converting a payload to text is what costs (measured: 1,000 claimed rows of 500 KB took over a
 * minute a claim when all were converted to find the 16 that fit), so rows_query hands the
 * payloads over as stored, p drops the rows that start beyond the budget by their stored size
 * (pg_column_size: no detoasting), and only the rest is converted (s, kept apart by OFFSET 0 so
 * the conversion is not repeated in w) and cut exactly by its text size (w). */
#define CLAIM_COLUMNS(last_error) TABLE_ROW_COLUMNS_PAYLOAD("o.{payload}", last_error)
#define ROW_NAMES                                                                                  \
    "seq, event_id, aggregate_type, aggregate_id, event_type, payload, headers, attempts,"         \
    " last_error, age, extra_headers"
#define SQL_WITHIN_BUDGET(rows_query)                                                              \
    "SELECT w.seq, w.event_id, w.aggregate_type, w.aggregate_id, w.event_type,"                    \
    " CASE WHEN w.bytes > $4::bigint THEN NULL ELSE w.text END, w.headers, w.attempts,"            \
    " w.last_error, w.age, w.extra_headers, w.bytes"                                               \
    " FROM (SELECT s.*, octet_length(s.text)::bigint AS bytes,"                                    \
    " sum(CASE WHEN octet_length(s.text) > $4::bigint THEN 0"                                      \
    " ELSE coalesce(octet_length(s.text), 0) END) OVER (ORDER BY s.seq) AS held"                   \
    " FROM (SELECT p.*, p.payload::text AS text"                                                   \
    " FROM (SELECT r.*, row_number() OVER (ORDER BY r.seq) AS n,"                                  \
    " coalesce(sum(pg_column_size(r.payload)) OVER (ORDER BY r.seq"                                \
    " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before"                             \
    " FROM (" rows_query ") AS r(" ROW_NAMES ")) p"                                                \
    " WHERE p.n = 1 OR p.before < $3::bigint OFFSET 0) s) w"                                       \
    " WHERE w.n = 1 OR w.held <= $3::bigint ORDER BY w.seq"

/* Which transaction holds the first locked row among the next claimable ones, for the log: a
 * row's xmax is the locker's transaction id while a single transaction locks or updates it. */
#define SQL_LOCKED_BY                                                                              \
    "SELECT o.{seq}, l.pid FROM (SELECT o.{seq}, o.xmax FROM {table} o"                            \
    " WHERE o.sent_at IS NULL AND o.dead_at IS NULL AND o.lane = ANY($2::smallint[])"              \
    " ORDER BY o.{seq} LIMIT $1) o JOIN pg_locks l ON l.locktype = 'transactionid'"                \
    " AND l.transactionid = o.xmax AND l.granted AND l.pid <> pg_backend_pid()"                    \
    " ORDER BY o.{seq} LIMIT 1"

/* Dead events not yet published to the dead-letter topic. */
#define SQL_CLAIM_DEAD_LETTER                                                                      \
    "SELECT" CLAIM_COLUMNS("o.last_error") " FROM {table} o"                                   \
    " WHERE o.dead_at IS NOT NULL AND o.sent_at IS NULL AND o.dead_letter_topic IS NULL"           \
    " AND o.lane = ANY($2::smallint[])"                                                            \
    " AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())"                               \
    " ORDER BY o.{seq} LIMIT $1 FOR UPDATE SKIP LOCKED"
/* clang-format on */

/* What holds an aggregate's later events back: a failed event waiting for its retry, and with
 * --on-poison hold a dead one. */
#define HOLD_BLOCKS "(o.next_attempt_at > now() OR o.dead_at IS NOT NULL)"
#define SKIP_BLOCKS "o.next_attempt_at > now() AND o.dead_at IS NULL"

enum {
    SQL_CLAIM_HOLD,
    SQL_CLAIM_SKIP,
    SQL_CLAIM_HOLD_AROUND_LOCKS,
    SQL_CLAIM_SKIP_AROUND_LOCKS,
    SQL_FIND_LOCKER,
    SQL_CLAIM_DEAD,
    SQL_MARK_SENT,
    SQL_DELETE_SENT,
    SQL_MARK_FAILED,
    SQL_MARK_DEAD_LETTERED,
    SQL_MARK_DEAD_LETTER_FAILED,
    SQL_COUNT
};
static const char *const sql_templates[SQL_COUNT] = {
    [SQL_CLAIM_HOLD] = SQL_WITHIN_BUDGET(SQL_CLAIM(HOLD_BLOCKS)),
    [SQL_CLAIM_SKIP] = SQL_WITHIN_BUDGET(SQL_CLAIM(SKIP_BLOCKS)),
    [SQL_CLAIM_HOLD_AROUND_LOCKS] = SQL_WITHIN_BUDGET(SQL_CLAIM_AROUND_LOCKS(HOLD_BLOCKS)),
    [SQL_CLAIM_SKIP_AROUND_LOCKS] = SQL_WITHIN_BUDGET(SQL_CLAIM_AROUND_LOCKS(SKIP_BLOCKS)),
    [SQL_FIND_LOCKER] = SQL_LOCKED_BY,
    [SQL_CLAIM_DEAD] = SQL_WITHIN_BUDGET(SQL_CLAIM_DEAD_LETTER),
    [SQL_MARK_SENT] =
        "UPDATE {table} SET sent_at = clock_timestamp() WHERE {seq} = ANY($1::bigint[])",
    /* --on-sent delete: no new row version and no sent_at index entry to write, which is most
     * of what marking costs (README, "Marking or deleting sent rows"). */
    [SQL_DELETE_SENT] = "DELETE FROM {table} WHERE {seq} = ANY($1::bigint[])",
    /* Times are clock_timestamp(), not now(): now() is when the claim transaction began, and a
     * retry wait counted from there could already be over when the failure is recorded. Every
     * failure counts an attempt and waits before the next one: transient failures 1 s doubling to
     * 30 s, rejections --retry-backoff doubling to --retry-backoff-max, both with jitter. The
     * max-attempts-th rejection dead-letters the event. SET expressions see the old row. */
    [SQL_MARK_FAILED] =
        "UPDATE {table} AS o SET attempts = o.attempts + 1,"
        " rejections = o.rejections + f.permanent::int, last_error = f.error,"
        " dead_at = CASE WHEN f.permanent AND o.rejections + 1 >= $4::int"
        " THEN clock_timestamp() END,"
        " next_attempt_at = CASE WHEN f.permanent AND o.rejections + 1 >= $4::int THEN NULL"
        " ELSE clock_timestamp() + make_interval(secs => (0.5 + random() / 2) * CASE WHEN"
        " f.permanent THEN least($5::float8 * 2 ^ least(o.rejections, 30), $6::float8)"
        " ELSE least(2 ^ least(o.attempts - o.rejections, 30), 30) END) END"
        " FROM unnest($1::bigint[], $2::text[], $3::bool[]) AS f(id, error, permanent)"
        " WHERE o.{seq} = f.id RETURNING o.{seq}, o.{event_id}, o.{aggregate_type},"
        " o.{aggregate_id}, o.dead_at IS NOT NULL",
    [SQL_MARK_DEAD_LETTERED] =
        "UPDATE {table} SET dead_letter_topic = $2 WHERE {seq} = ANY($1::bigint[])",
    [SQL_MARK_DEAD_LETTER_FAILED] =
        "UPDATE {table} AS o SET last_error = 'dead-letter publish failed: ' || f.error,"
        " next_attempt_at = clock_timestamp() + interval '30 seconds'"
        " FROM unnest($1::bigint[], $2::text[]) AS f(id, error) WHERE o.{seq} = f.id",
};

/* Going to sleep and waking up (migrations/0007_wakeup_lock.sql): outbox_relay_sleep() answers
 * 'guard' (this session now holds the wakeup lock: producers notify), 'follow' (another session
 * holds it) or 'busy' (producers are mid-transaction: ask again shortly). A guard gives the lock
 * up with outbox_relay_wake(), which also wakes the followers to ask again (see leave_guard). */
static const char *const SQL_SLEEP = "SELECT outbox_relay_sleep()";
static const char *const SQL_WAKE = "SELECT outbox_relay_wake()";
#define GUARD_LEFT "guard left" /* the payload of outbox_relay_wake's notification */

typedef struct Member Member;

typedef enum {
    PHASE_DOWN,        /* no PostgreSQL connection */
    PHASE_SETUP,       /* LISTEN in flight */
    PHASE_IDLE,        /* no transaction open */
    PHASE_REBALANCING, /* lane ownership queries in flight */
    PHASE_CLAIMING,    /* BEGIN + claim in flight */
    PHASE_PRODUCING,   /* rows claimed, waiting for delivery reports */
    PHASE_MARKING,     /* marks + COMMIT in flight */
    PHASE_ENDING, /* COMMIT or ROLLBACK of a transaction that marks nothing, or a wakeup step */
} Phase;

/* The process: one Kafka producer shared by the claim sessions (members), and the signals. */
struct Relay {
    struct ev_loop *loop;
    const Config *cfg;
    rd_kafka_conf_t *kconf_template; /* kept to recreate the producer after a fatal error */
    KafkaProducer *kafka;
    Member *members;
    int n_members;
    int running;          /* members that have not finished stopping */
    bool purging;         /* a delivery timeout purged the producer; its reports are not all in */
    ev_timer purge_timer; /* purges again while reports are missing (see start_purge) */
    int logged_owned;     /* lanes of all members, last logged, to log only changes */
    bool stopping;
    int signals;
    int exit_status;
    ev_signal sigterm, sigint;
};

/* One claim session: its own PostgreSQL connection, lane membership, transaction and batch. Each
 * is a member of the lane group like a relay of its own, so sessions of one process never claim
 * rows of the same aggregate at once, and a lane moves between them only between batches. */
struct Member {
    Relay *relay;
    int index; /* 0..sessions-1, for the logs */
    struct ev_loop *loop;
    const Config *cfg;
    PgConn *pg;
    Lanes lanes;
    Phase phase;
    Batch batch;
    BatchMarks marks;
    char *sql[SQL_COUNT]; /* the templates expanded for the configured table */
    int claim_stmt;       /* SQL_CLAIM_HOLD or SQL_CLAIM_SKIP */
    int claim_sent;       /* the claim statement of the claim in flight */
    long row_limit;       /* rows the next claim asks for, at most --batch-size (adapt_row_limit) */
    ev_tstamp around_locks_until; /* claims go around locked rows until then */
    bool locked_row_logged;       /* a stall on a locked row was logged; its end is not yet */
    int failed_stmt;    /* index of SQL_MARK_FAILED in the mark pipeline, -1 if not sent */
    bool wake_pending;  /* there may be rows to claim */
    bool rebalance_due; /* lane ownership should be checked before the next claim */
    bool asleep;        /* waiting for a notification (or the poll timer) */
    bool guard;         /* asleep holding the wakeup lock: producers notify while it does */
    bool final_check;   /* asleep, and the claim that follows falling asleep is still due */
    bool notified;      /* a notification came since this session asked to sleep */
    bool sleep_error_logged;
    bool left;              /* shutting down: the guard's lock was (being) given up */
    bool stopped;           /* done shutting down */
    bool waiting;           /* producing paused (queue full, purge): a delivery report resumes it */
    ev_tstamp last_rows_at; /* when a claim last returned rows */
    ev_tstamp claim_sent_at, marks_sent_at; /* of the current batch, for the debug log */
    bool stopping;
    Backoff retry;
    bool claim_error_logged;
    int logged_members;        /* member count at the last rebalance */
    char last_failure[256];    /* error of the last batch that had failures, "" once one had none */
    char last_mark_error[256]; /* of the last failed recording, logged once (see on_marked) */
    int salvage_row;           /* recording row by row: the row whose outcome is being recorded */
    int salvage_unrecorded;    /* rows whose outcome could not be recorded at all */
    ev_timer poll_timer;
    ev_timer retry_timer;
    ev_timer busy_timer; /* poll_soon */
    ev_timer rebalance_timer;
    ev_timer shutdown_timer;
    ev_timer delivery_timer; /* bounds a batch's wait for acknowledgements */
    unsigned long long total_sent, total_failed, total_dead, order_breaks;
};

static void step(Member *m);
static void leave_guard(Member *m);
static void go_to_sleep(Member *m);
static void send_marks(Member *m);
static void relay_stop(Relay *r);

/* A member has finished shutting down; the loop ends with the last one. */
static void member_done(Member *m)
{
    ev_timer_stop(m->loop, &m->shutdown_timer);
    if (m->stopped)
        return;
    m->stopped = true;
    if (--m->relay->running == 0)
        ev_break(m->loop, EVBREAK_ALL);
}

/* Something the process cannot go on without: every member stops, and the exit status is 1. */
static void relay_fail(Member *m)
{
    m->relay->exit_status = 1;
    relay_stop(m->relay);
}

/* Ends the member's part. A guard on the way out gives up the wakeup lock with a notification
 * (when the connection is there to do it, within a second): the followers it guarded must not go
 * on sleeping unguarded. Its callback comes back here, and the member is done. */
static void stop_loop(Member *m)
{
    ev_timer_stop(m->loop, &m->shutdown_timer);
    if (!m->left && m->guard && pg_conn_idle(m->pg)) {
        m->left = true;
        ev_timer_set(&m->shutdown_timer, 1.0, 0);
        ev_timer_start(m->loop, &m->shutdown_timer);
        leave_guard(m);
        return;
    }
    member_done(m);
}

/* After a request between batches: on with the cycle, or out if the member is stopping. */
static void carry_on(Member *m)
{
    if (m->stopping)
        stop_loop(m);
    else
        step(m);
}

/* Claims again after --busy-poll-interval: an awake session with nothing to do, or one that
 * producers kept from going to sleep. */
static void poll_soon(Member *m)
{
    /* A claim a notification brought about can come back empty while the timer is still armed,
     * and libev forbids changing an active timer. */
    ev_timer_stop(m->loop, &m->busy_timer);
    ev_timer_set(&m->busy_timer, (double)m->cfg->busy_poll_interval_ms / 1000.0, 0);
    ev_timer_start(m->loop, &m->busy_timer);
}

static void schedule_retry(Member *m)
{
    double delay = backoff_next(&m->retry);
    ev_timer_stop(m->loop, &m->retry_timer);
    ev_timer_set(&m->retry_timer, delay, 0);
    ev_timer_start(m->loop, &m->retry_timer);
}

/* ---- ending a transaction ----------------------------------------------------------------- */

static void on_ended(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Member *m = arg;
    if (!results)
        return; /* connection lost: on_pg_state has taken over */
    if (error) {
        char q[512];
        log_warn("ending transaction failed", "error=%s", log_quote(error, q, sizeof(q)));
    }
    m->phase = PHASE_IDLE;
    batch_clear(&m->batch);
    carry_on(m);
}

/* Ends the open transaction without marking anything. */
static void end_transaction(Member *m, const char *sql)
{
    PgQuery q = {sql, 0, NULL, false};
    m->phase = PHASE_ENDING;
    if (!pg_conn_send(m->pg, &q, 1, on_ended, m))
        pg_conn_reset(m->pg, "connection busy while ending a transaction");
}

/* ---- marking ------------------------------------------------------------------------------ */

/* Logs every event the last mark dead-lettered (rows of SQL_MARK_FAILED's RETURNING). */
static void log_dead_lettered(Member *m, PGresult *res)
{
    for (int i = 0; res && i < PQntuples(res); i++) {
        if (strcmp(PQgetvalue(res, i, 4), "t") != 0)
            continue;
        m->total_dead++;
        metrics_dead_lettered();
        char q[300];
        log_warn(m->cfg->on_poison == POISON_HOLD
                     ? "event dead-lettered; later events of its aggregate are held until it is "
                       "requeued"
                     : "event dead-lettered; later events of its aggregate go on without it",
                 "id=%s event_id=%s aggregate_type=%s aggregate_id=%s", PQgetvalue(res, i, 0),
                 PQgetvalue(res, i, 1), log_quote(PQgetvalue(res, i, 2), q, 150),
                 log_quote(PQgetvalue(res, i, 3), q + 150, 150));
    }
}

/* The batch's outcome is recorded (or given up): on with the next batch, after the retry backoff
 * when nothing got through or something could not be recorded. */
static void finish_batch(Member *m, bool retry)
{
    Batch *b = &m->batch;
    m->total_sent += (unsigned long long)b->acked;
    m->total_failed += (unsigned long long)b->failed;
    metrics_batch_committed();
    batch_clear(b);
    m->phase = PHASE_IDLE;
    if (m->stopping) {
        stop_loop(m);
        return;
    }
    if (retry) {
        schedule_retry(m);
        return;
    }
    backoff_reset(&m->retry);
    /* Claim again at once: producers do not notify an awake relay, so only an empty claim may
     * end the cycle (and then the relay goes to sleep, see go_to_sleep). */
    m->wake_pending = true;
    step(m);
}

static void send_mark_statements(Member *m, bool commit, PgResultFn cb);

/* A failure to record an outcome is logged once per distinct error, then at debug level: a
 * table that refuses a mark (a trigger, a constraint) would otherwise log every batch. */
static void log_mark_error(Member *m, const char *what, const BatchRow *br, const char *error)
{
    char q[512];
    LogLevel level = strcmp(error, m->last_mark_error) == 0 ? LOG_DEBUG : LOG_ERROR;
    if (br)
        log_write(level, what, "error=%s id=%lld rows=%d session=%d",
                  log_quote(error, q, sizeof(q)), br->row.id, m->batch.n, m->index);
    else
        log_write(level, what, "error=%s rows=%d session=%d", log_quote(error, q, sizeof(q)),
                  m->batch.n, m->index);
    snprintf(m->last_mark_error, sizeof(m->last_mark_error), "%s", error);
}

/* ---- recording row by row ------------------------------------------------------------------
 *
 * When the statements that record a batch fail, its transaction is gone, and replaying the
 * batch would publish its delivered rows again and fail the same way, for ever, holding every
 * later row of its lanes back (issue 21). Instead each row's outcome is recorded in a statement
 * (and so a transaction) of its own: the rows that take their mark are done, and a row that
 * refuses its sent mark is failed as a rejection instead, so that it is dead-lettered after
 * --max-attempts rather than published for ever. Without the claim's transaction the rows are
 * no longer locked, but they stay this session's: their lanes move only between batches. */

static void record_next_row(Member *m);

/* Whether a failed statement failed because of the row itself — data it could not take
 * (class 22), a constraint (23), a trigger's or rule's RAISE (P0), an object or privilege problem
 * of the table (42) — rather than something passing (a deadlock, a timeout, a lock, resources,
 * a shutdown), after which the row is left to be re-sent instead of being counted against it. */
static bool refused_by_the_row(PGresult **results, int n)
{
    for (int i = 0; i < n; i++) {
        if (results[i] && PQresultStatus(results[i]) == PGRES_FATAL_ERROR) {
            const char *state = PQresultErrorField(results[i], PG_DIAG_SQLSTATE);
            return state && (strncmp(state, "22", 2) == 0 || strncmp(state, "23", 2) == 0 ||
                             strncmp(state, "P0", 2) == 0 || strncmp(state, "42", 2) == 0);
        }
    }
    return false;
}

static void on_row_recorded(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Member *m = arg;
    Batch *b = &m->batch;
    if (!results)
        return; /* connection lost: the batch is abandoned (on_pg_state) */
    BatchRow *br = &b->rows[m->salvage_row];
    if (error) {
        log_mark_error(m, "recording a row's outcome failed", br, error);
        if (br->state == ROW_ACKED && refused_by_the_row(results, n)) {
            char why[512];
            snprintf(why, sizeof(why), "delivered, but marking it sent failed: %s", error);
            b->acked--;
            batch_fail(b, br, why, true);
            record_next_row(m); /* the same row, now as a failure */
            return;
        }
        m->salvage_unrecorded++; /* claimed and published again after the retry backoff */
    } else if (br->state == ROW_FAILED && !br->dead_letter && n > 0) {
        log_dead_lettered(m, results[0]);
    }
    m->salvage_row++;
    record_next_row(m);
}

static void record_next_row(Member *m)
{
    Batch *b = &m->batch;
    if (m->stopping) {
        /* Shutting down: what is not recorded yet is sent again later (duplicates, no loss). */
        finish_batch(m, true);
        return;
    }
    while (m->salvage_row < b->n && !batch_row_recorded(&b->rows[m->salvage_row]))
        m->salvage_row++;
    if (m->salvage_row < b->n) {
        batch_marks_range(b, m->salvage_row, m->salvage_row + 1, &m->marks);
        send_mark_statements(m, false, on_row_recorded);
        return;
    }
    log_write(m->salvage_unrecorded ? LOG_ERROR : LOG_INFO, "batch recorded row by row",
              "rows=%d sent=%d failed=%d unrecorded=%d session=%d", b->n, b->acked, b->failed,
              m->salvage_unrecorded, m->index);
    finish_batch(m, m->salvage_unrecorded > 0 || b->acked == 0);
}

static void on_rolled_back_to_salvage(PgConn *pg, PGresult **results, int n, const char *error,
                                      void *arg)
{
    Member *m = arg;
    if (!results)
        return;
    if (error) {
        /* The failed transaction may still be open: only a new session surely ends it. */
        pg_conn_reset(pg, "rolling back a failed batch failed");
        return;
    }
    m->salvage_row = 0;
    m->salvage_unrecorded = 0;
    record_next_row(m);
}

static void on_marked(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Member *m = arg;
    Batch *b = &m->batch;
    if (!results)
        return; /* connection lost before COMMIT was confirmed: the rows will be re-sent */
    if (error) {
        log_mark_error(m, "recording the batch failed; recording its rows one by one", NULL, error);
        PgQuery q = {SQL_ROLLBACK, 0, NULL, false};
        if (!pg_conn_send(m->pg, &q, 1, on_rolled_back_to_salvage, m))
            pg_conn_reset(m->pg, "connection busy while rolling back");
        return;
    }
    if (m->failed_stmt >= 0 && m->failed_stmt < n)
        log_dead_lettered(m, results[m->failed_stmt]);

    bool transient_failure = false;
    for (int i = 0; i < b->n; i++)
        if (b->rows[i].state == ROW_FAILED && !b->rows[i].permanent)
            transient_failure = true;
    ev_now_update(m->loop);
    log_debug("batch committed",
              "rows=%d sent=%d failed=%d claim_ms=%.2f deliver_ms=%.2f mark_ms=%.2f session=%d",
              b->n, b->acked, b->failed, (b->claimed_at - m->claim_sent_at) * 1e3,
              (m->marks_sent_at - b->claimed_at) * 1e3, (ev_now(m->loop) - m->marks_sent_at) * 1e3,
              m->index);
    finish_batch(m, b->acked == 0 && transient_failure);
}

/* One line per batch with failures, and only when the failure is new: an outage that fails
 * batch after batch with the same error logs once, then at debug level until it clears. */
static void log_batch_failures(Member *m, const BatchRow *first_failed)
{
    Batch *b = &m->batch;
    char q[512];
    if (!first_failed) {
        if (m->last_failure[0])
            log_info("deliveries succeed again", "sent=%d", b->acked);
        m->last_failure[0] = '\0';
        return;
    }
    const char *error = first_failed->error ? first_failed->error : "unknown error";
    LogLevel level = strcmp(error, m->last_failure) == 0 ? LOG_DEBUG : LOG_WARN;
    log_write(level, "events not delivered; they will be retried",
              "failed=%d sent=%d first_id=%lld first_event_id=%s permanent=%s error=%s session=%d",
              b->failed, b->acked, first_failed->row.id, first_failed->row.event_id,
              first_failed->permanent ? "true" : "false", log_quote(error, q, sizeof(q)), m->index);
    snprintf(m->last_failure, sizeof(m->last_failure), "%s", error);
}

/* Sends the statements that record what m->marks holds (filled by batch_marks_range), then
 * COMMIT when commit is set; without it, each statement is a transaction of its own. */
static void send_mark_statements(Member *m, bool commit, PgResultFn cb)
{
    BatchMarks *marks = &m->marks;
    char max_attempts[24], backoff[32], backoff_max[32];
    snprintf(max_attempts, sizeof(max_attempts), "%ld", m->cfg->max_attempts);
    snprintf(backoff, sizeof(backoff), "%.3f", (double)m->cfg->retry_backoff_ms / 1000.0);
    snprintf(backoff_max, sizeof(backoff_max), "%.3f",
             (double)m->cfg->retry_backoff_max_ms / 1000.0);
    const char *sent[1] = {marks->sent.s};
    const char *failed[6] = {marks->failed_ids.s,
                             marks->failed_errors.s,
                             marks->failed_permanent.s,
                             max_attempts,
                             backoff,
                             backoff_max};
    const char *dl_sent[2] = {marks->dl_sent.s, m->cfg->dead_letter_topic};
    const char *dl_failed[2] = {marks->dl_failed_ids.s, marks->dl_failed_errors.s};

    PgQuery queries[6];
    int nq = 0;
    m->failed_stmt = -1;
    if (commit) /* the claim's lock_timeout is not for the marks (see SQL_CLAIM_PLAN) */
        queries[nq++] = (PgQuery){SQL_MARK_PLAN, 0, NULL, true};
    if (!strbuf_array_empty(&marks->sent))
        queries[nq++] =
            (PgQuery){m->sql[m->cfg->on_sent == ON_SENT_DELETE ? SQL_DELETE_SENT : SQL_MARK_SENT],
                      1, sent, true};
    if (!strbuf_array_empty(&marks->failed_ids)) {
        m->failed_stmt = nq;
        queries[nq++] = (PgQuery){m->sql[SQL_MARK_FAILED], 6, failed, false};
    }
    if (!strbuf_array_empty(&marks->dl_sent))
        queries[nq++] = (PgQuery){m->sql[SQL_MARK_DEAD_LETTERED], 2, dl_sent, false};
    if (!strbuf_array_empty(&marks->dl_failed_ids))
        queries[nq++] = (PgQuery){m->sql[SQL_MARK_DEAD_LETTER_FAILED], 2, dl_failed, false};
    if (commit)
        queries[nq++] = (PgQuery){SQL_COMMIT, 0, NULL, false};
    m->phase = PHASE_MARKING;
    if (!pg_conn_send(m->pg, queries, nq, cb, m))
        pg_conn_reset(m->pg, "connection busy while marking");
}

static void send_marks(Member *m)
{
    Batch *b = &m->batch;
    ev_timer_stop(m->loop, &m->delivery_timer);
    log_batch_failures(m, batch_marks(b, &m->marks));
    m->order_breaks += (unsigned long long)batch_order_breaks(
        b, m->cfg->order_scope == ORDER_PER_TOPIC ? m->cfg->topic_template : NULL);
    ev_now_update(m->loop);
    m->marks_sent_at = ev_now(m->loop);
    send_mark_statements(m, true, on_marked);
}

/* ---- producing ---------------------------------------------------------------------------- */

/* Marks the batch once nothing is left to produce and every report is in. */
static void maybe_finish_batch(Member *m)
{
    Batch *b = &m->batch;
    if (b->abandoned) {
        if (b->in_flight == 0) {
            ev_timer_stop(m->loop, &m->delivery_timer); /* it ran on for the abandoned batch */
            batch_clear(b);
            m->wake_pending = true;
            step(m);
        }
        return;
    }
    if (m->phase == PHASE_PRODUCING && b->next >= b->n && b->in_flight == 0)
        send_marks(m);
}

/* Produces a dead event to the dead-letter topic, with why it died in the headers. A payload too
 * large for Kafka (a common reason to die) is left out rather than failing again. */
static rd_kafka_resp_err_t produce_dead_letter(Member *m, BatchRow *br)
{
    const OutboxRow *row = &br->row;
    char topic[ROUTE_TOPIC_MAX + 1], why[256];
    if (!route_topic(m->cfg->topic_template, row, topic, sizeof(topic), why, sizeof(why)))
        topic[0] = '\0';
    rd_kafka_headers_t *hdrs = route_dead_letter_headers(row, m->cfg->map.identity_headers,
                                                         br->last_error, br->attempts, topic);
    rd_kafka_resp_err_t err =
        br->payload_omitted
            ? RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE
            : kafka_produce(m->relay->kafka, m->cfg->dead_letter_topic, row->aggregate_id,
                            strlen(row->aggregate_id), row->payload, row->payload_len, hdrs, br);
    if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        rd_kafka_header_add(hdrs, "dlq.payload_omitted", -1, "true", -1);
        err = kafka_produce(m->relay->kafka, m->cfg->dead_letter_topic, row->aggregate_id,
                            strlen(row->aggregate_id), NULL, 0, hdrs, br);
    }
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        rd_kafka_headers_destroy(hdrs);
    return err;
}

/* Produces one event row. Returns the producer's answer; failures that happen before the
 * producer (topic, headers) are recorded here and reported as NO_ERROR with the row FAILED. */
/* The failure of a payload too large for the producer (detected by the claim, or by librdkafka). */
static void fail_too_large(Member *m, BatchRow *br, size_t bytes)
{
    char why[160];
    /* librdkafka's text says "Broker:" but no broker saw it: say what actually happened. */
    snprintf(why, sizeof(why),
             "payload too large: %zu bytes, over the producer's message.max.bytes (not sent)",
             bytes);
    batch_fail(&m->batch, br, why, true);
}

static rd_kafka_resp_err_t produce_event(Member *m, BatchRow *br)
{
    const OutboxRow *row = &br->row;
    char topic[ROUTE_TOPIC_MAX + 1], why[512];
    if (br->payload_omitted) {
        fail_too_large(m, br, br->payload_bytes);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    if (!route_topic(m->cfg->topic_template, row, topic, sizeof(topic), why, sizeof(why))) {
        batch_fail(&m->batch, br, why, true);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    rd_kafka_headers_t *hdrs = br->headers; /* from prepare_headers, or built here */
    br->headers = NULL;
    if (!hdrs)
        hdrs = route_headers(row, m->cfg->map.identity_headers, why, sizeof(why));
    if (!hdrs) {
        batch_fail(&m->batch, br, why, true);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    rd_kafka_resp_err_t err =
        kafka_produce(m->relay->kafka, topic, row->aggregate_id, strlen(row->aggregate_id),
                      row->payload, row->payload_len, hdrs, br);
    if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
        br->headers = hdrs; /* kept for the retry (produce_more, once reports free room) */
    else if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        rd_kafka_headers_destroy(hdrs);
    if (err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
        fail_too_large(m, br, row->payload_len);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
    }
    return err;
}

/* Messages of all sessions not yet reported: the producer and its queue are shared. */
static int relay_in_flight(const Relay *r)
{
    int n = 0;
    for (int i = 0; i < r->n_members; i++)
        n += r->members[i].batch.in_flight;
    return n;
}

/* Builds the headers of the event rows not produced yet, before producing any of them, so that
 * the produce loop hands the batch to librdkafka in one quick burst: its broker threads wake on a
 * partition's first queued message and send what is queued by then, so a slower loop makes more,
 * smaller produce requests. Measured on 100,000-row drains: about 8 % more events/s, and a third
 * less CPU for the (mock) broker, which gets fewer requests. A row whose headers cannot be built is
 * left to the loop, which fails it in order (failing it here would hold its aggregate back before
 * its earlier rows were produced). */
static void prepare_headers(Member *m)
{
    Batch *b = &m->batch;
    char why[512];
    for (; b->prepared < b->n; b->prepared++) {
        BatchRow *br = &b->rows[b->prepared];
        if (!br->dead_letter && br->state == ROW_PENDING)
            br->headers = route_headers(&br->row, m->cfg->map.identity_headers, why, sizeof(why));
    }
}

static void produce_more(Member *m)
{
    Batch *b = &m->batch;
    Relay *r = m->relay;
    m->waiting = false;
    /* Nothing new goes to the producer while a purge is under way: the purge is not
     * instantaneous, and a message of this batch caught by it while later ones get through
     * would leave a gap in its aggregate's order. (Nothing in the loop changes these.) */
    bool may_produce = !m->stopping && !b->timed_out && !r->purging;
    if (may_produce)
        prepare_headers(m);
    while (may_produce && b->next < b->n) {
        BatchRow *br = &b->rows[b->next];
        if (!br->dead_letter && batch_is_held(b, &br->row)) {
            b->next++; /* an earlier event of its aggregate failed: it waits for the retry */
            continue;
        }
        rd_kafka_resp_err_t err =
            br->dead_letter ? produce_dead_letter(m, br) : produce_event(m, br);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && relay_in_flight(r) > 0) {
            m->waiting = true; /* backpressure: a report of any session frees room */
            break;
        }
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
            batch_fail(b, br, rd_kafka_err2str(err), kafka_error_permanent(err));
        else if (br->state == ROW_PENDING) {
            br->state = ROW_QUEUED;
            b->in_flight++;
        }
        b->next++;
    }
    if (m->stopping || b->timed_out)
        b->next = b->n; /* rows not produced yet stay unsent, with no attempt counted */
    else if (r->purging && b->next < b->n)
        m->waiting = true;
    maybe_finish_batch(m);
}

/* The member whose batch holds the row a delivery report is about. */
static Member *member_of_row(Relay *r, const BatchRow *br)
{
    for (int i = 0; i < r->n_members; i++) {
        const Batch *b = &r->members[i].batch;
        if (br >= b->rows && br < b->rows + b->capacity)
            return &r->members[i];
    }
    return NULL;
}

static void record_delivery(Member *m, BatchRow *br, rd_kafka_resp_err_t err)
{
    Batch *b = &m->batch;
    if (br->state != ROW_QUEUED)
        return; /* reported after shutdown gave up on it */
    b->in_flight--;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        br->state = ROW_ACKED;
        b->acked++;
        metrics_row_acked(m->cfg->topic_template, b, br, ev_now(m->loop));
    } else if (b->timed_out && (err == RD_KAFKA_RESP_ERR__PURGE_QUEUE ||
                                err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)) {
        char why[128];
        snprintf(why, sizeof(why), "not acknowledged within the delivery timeout (%ld ms)",
                 m->cfg->delivery_timeout_ms);
        batch_fail(b, br, why, false);
    } else {
        batch_fail(b, br, rd_kafka_err2str(err), kafka_error_permanent(err));
    }
    if (m->phase == PHASE_PRODUCING && b->next < b->n)
        produce_more(m);
    else
        maybe_finish_batch(m);
}

static void on_delivery(void *opaque, rd_kafka_resp_err_t err, void *arg)
{
    Relay *r = arg;
    Member *m = member_of_row(r, opaque);
    if (m)
        record_delivery(m, opaque, err);
    if (r->purging && relay_in_flight(r) == 0) {
        r->purging = false;
        ev_timer_stop(r->loop, &r->purge_timer);
    }
    for (int i = 0; i < r->n_members && !r->purging; i++) {
        Member *other = &r->members[i];
        if (other->waiting && other->phase == PHASE_PRODUCING)
            produce_more(other);
    }
}

/* ---- claiming ----------------------------------------------------------------------------- */

static void on_sleep_attempt(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Member *m = arg;
    if (!results)
        return;
    m->phase = PHASE_IDLE;
    PGresult *sleep = results[n - 1];
    const char *answer = !error && PQresultStatus(sleep) == PGRES_TUPLES_OK && PQntuples(sleep) == 1
                             ? PQgetvalue(sleep, 0, 0)
                             : NULL;
    if (answer && strcmp(answer, "busy") == 0) {
        /* A producer is mid-transaction without having notified: look again very soon. */
        poll_soon(m);
    } else {
        if (!answer && !m->sleep_error_logged) {
            /* Typically migrate not run since an upgrade: sleep anyway, waking at the poll timer
             * (or on a notification some other session's guard brings about). */
            char q[512];
            log_warn("cannot take part in the wakeup; relying on the poll timer", "error=%s",
                     log_quote(error ? error : "unexpected result", q, sizeof(q)));
            m->sleep_error_logged = true;
        } else if (answer && m->sleep_error_logged) {
            log_info("the wakeup works again", NULL);
            m->sleep_error_logged = false;
        }
        /* One final claim catches what producers committed before the guard took the lock; from
         * then on they notify. A follower notified meanwhile (its guard may have left) makes that
         * claim a wakeup instead, and asks again after it; a guard's final claim sees whatever
         * was announced. */
        m->asleep = true;
        m->guard = answer && strcmp(answer, "guard") == 0;
        m->final_check = m->guard || !m->notified;
        m->notified = false;
        log_debug("asleep", "as=%s session=%d", answer ? answer : "poller", m->index);
        m->wake_pending = true;
    }
    carry_on(m);
}

/* An empty claim: end its transaction and try to go to sleep, in one round trip. */
static void go_to_sleep(Member *m)
{
    PgQuery queries[2] = {{SQL_COMMIT, 0, NULL, false}, {SQL_SLEEP, 0, NULL, false}};
    m->notified = false;
    m->phase = PHASE_ENDING;
    if (!pg_conn_send(m->pg, queries, 2, on_sleep_attempt, m))
        pg_conn_reset(m->pg, "connection busy while going to sleep");
}

/* True when a statement of the request failed with lock_not_available (the claim's
 * lock_timeout). */
static bool is_lock_timeout(PGresult **results, int n)
{
    for (int i = 0; i < n; i++) {
        if (results[i] && PQresultStatus(results[i]) == PGRES_FATAL_ERROR) {
            const char *state = PQresultErrorField(results[i], PG_DIAG_SQLSTATE);
            return state && strcmp(state, "55P03") == 0;
        }
    }
    return false;
}

static void on_locker_found(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Member *m = arg;
    if (!results)
        return;
    PGresult *found = n == 5 && !error ? results[3] : NULL;
    bool known = found && PQntuples(found) == 1;
    if (!m->locked_row_logged) {
        if (known)
            log_warn("a row of this session's lanes is locked by another transaction; its "
                     "aggregate waits, the others go on",
                     "id=%s blocking_pid=%s lock_timeout_ms=%s session=%d", PQgetvalue(found, 0, 0),
                     PQgetvalue(found, 0, 1), CLAIM_LOCK_TIMEOUT_MS, m->index);
        else
            log_warn("claims wait for a lock held by another transaction (on the table, or on a "
                     "row several transactions share); retrying with backoff",
                     "lock_timeout_ms=%s session=%d", CLAIM_LOCK_TIMEOUT_MS, m->index);
        m->locked_row_logged = true;
    }
    m->wake_pending = true;
    if (!known)
        schedule_retry(m); /* nothing to go around: claiming again at once would only wait again */
    if (error) {
        end_transaction(m, SQL_ROLLBACK); /* the look-up itself timed out */
        return;
    }
    m->phase = PHASE_IDLE;
    carry_on(m);
}

/* The plain claim met a row locked by someone else (SQL_CLAIM): roll back, claim around locked
 * rows for AROUND_LOCKS_S, and find out for the log who holds the lock. */
static void on_claim_locked(Member *m)
{
    char limit[24];
    snprintf(limit, sizeof(limit), "%ld", m->cfg->batch_size);
    const char *params[2] = {limit, m->lanes.owned_array.s};
    /* In a transaction of its own with the claim's lock_timeout: a lock on the whole table would
     * hold the look-up up too. */
    PgQuery queries[5] = {{SQL_ROLLBACK, 0, NULL, false},
                          {SQL_BEGIN, 0, NULL, false},
                          {SQL_CLAIM_PLAN, 0, NULL, true},
                          {m->sql[SQL_FIND_LOCKER], 2, params, false},
                          {SQL_COMMIT, 0, NULL, false}};
    m->around_locks_until = ev_now(m->loop) + AROUND_LOCKS_S;
    m->phase = PHASE_ENDING;
    if (!pg_conn_send(m->pg, queries, 5, on_locker_found, m))
        pg_conn_reset(m->pg, "connection busy while rolling back a claim");
}

/* The claim converts each row it takes to text before it can cut the batch at --batch-bytes, and
 * that conversion is what large payloads cost (about 10 ms for 500 KB of JSON): claiming 1,000
 * such rows to keep 16 took seconds. So while batches fill half the byte budget or more, the
 * next claim asks for twice the rows that fitted, and the limit grows back (doubling) once they
 * no longer do. An empty claim counts as one that did not fill it. */
static void adapt_row_limit(Member *m, int rows)
{
    long batch_size = m->cfg->batch_size;
    long limit = m->row_limit > 0 ? m->row_limit : batch_size;
    if (rows > 0 && m->batch.payload_bytes >= (size_t)m->cfg->batch_bytes / 2)
        limit = 2L * rows;
    else
        limit = 2L * limit;
    m->row_limit = limit < batch_size ? limit : batch_size;
}

static void on_claimed(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Member *m = arg;
    char q[512];
    if (!results)
        return;
    if (error && is_lock_timeout(results, n)) {
        on_claim_locked(m);
        return;
    }
    if (error || n < 3) {
        /* Typically a missing table (migrate not run) or missing privileges: say so once, then
         * keep retrying with backoff so the relay recovers when it is fixed. */
        if (!m->claim_error_logged)
            log_error("claiming rows failed; retrying", "error=%s",
                      log_quote(error ? error : "short result", q, sizeof(q)));
        m->claim_error_logged = true;
        end_transaction(m, SQL_ROLLBACK);
        schedule_retry(m);
        return;
    }
    if (m->claim_error_logged)
        log_info("claiming rows works again", NULL);
    m->claim_error_logged = false;
    if (m->locked_row_logged && m->claim_sent == m->claim_stmt) {
        log_info("no locked row holds claims up any more", "session=%d", m->index);
        m->locked_row_logged = false;
    }

    /* BEGIN, [dead-letter claim], planner settings, claim: see claim() */
    int events_at = n - 1, dead_at = n > 3 ? 1 : -1;
    int events = PQntuples(results[events_at]);
    int dead = dead_at > 0 ? PQntuples(results[dead_at]) : 0;
    if (events + dead == 0)
        adapt_row_limit(m, 0);
    if (events + dead == 0 && !m->stopping && !m->asleep) {
        if (ev_now(m->loop) - m->last_rows_at >= (double)m->cfg->sleep_after_ms / 1000.0) {
            go_to_sleep(m);
            return;
        }
        /* Work came recently: stay awake and poll, so a steady stream never pays for NOTIFY. */
        poll_soon(m);
        end_transaction(m, SQL_COMMIT);
        return;
    }
    if (events + dead > 0) {
        m->last_rows_at = ev_now(m->loop);
        m->asleep = false; /* work: awake (a guard lets the lock go before its next claim) */
    }
    if (events + dead == 0 || m->stopping) {
        end_transaction(m, SQL_COMMIT); /* asleep already: that was the final check */
        return;
    }
    if (kafka_fatal(m->relay->kafka)) {
        /* The producer failed while this claim was under way: produce nothing on it. The rows go
         * back untouched, and the retry recreates the producer once every session is done. */
        end_transaction(m, SQL_ROLLBACK);
        schedule_retry(m);
        return;
    }
    /* The batch keeps the results: its rows point into them. */
    batch_load(&m->batch, results[events_at], dead_at > 0 ? results[dead_at] : NULL);
    m->batch.claimed_at = ev_now(m->loop);
    adapt_row_limit(m, events);
    results[events_at] = NULL;
    if (dead_at > 0)
        results[dead_at] = NULL;
    log_debug("claimed batch", "rows=%d dead_letter=%d first_id=%lld bytes=%zu session=%d", events,
              dead, m->batch.rows[0].row.id, m->batch.payload_bytes, m->index);
    m->phase = PHASE_PRODUCING;
    ev_timer_stop(m->loop, &m->delivery_timer); /* libev: never set an active timer */
    ev_timer_set(&m->delivery_timer, (double)m->cfg->delivery_timeout_ms / 1000.0, 0);
    ev_timer_start(m->loop, &m->delivery_timer);
    produce_more(m);
}

static void claim(Member *m)
{
    Relay *r = m->relay;
    if (kafka_fatal(r->kafka)) {
        /* The producer is shared: recreate it only once every member's batch is done, so every
         * message of the old one has been reported. */
        for (int i = 0; i < r->n_members; i++) {
            if (r->members[i].batch.n > 0) {
                schedule_retry(m);
                return;
            }
        }
        char err[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_dup(r->kconf_template);
        kafka_producer_free(r->kafka, 0);
        r->kafka = kafka_producer_new(m->loop, conf, on_delivery, r, err, sizeof(err));
        if (!r->kafka) {
            log_error("cannot recreate the Kafka producer", "error=%s", err);
            relay_fail(m);
            return;
        }
        log_info("kafka producer recreated", NULL);
    }
    m->wake_pending = false;
    ev_timer_again(m->loop, &m->poll_timer);

    char limit[24], dead_limit[24], budget[24], max_message[24];
    long batch_size = m->cfg->batch_size; /* may have grown on SIGHUP: make room between batches */
    if (!batch_reserve(&m->batch, (int)batch_size + DEAD_LETTER_LIMIT))
        batch_size = m->batch.capacity - DEAD_LETTER_LIMIT;
    if (m->row_limit > 0 && m->row_limit < batch_size)
        batch_size = m->row_limit;
    snprintf(limit, sizeof(limit), "%ld", batch_size);
    snprintf(dead_limit, sizeof(dead_limit), "%d", DEAD_LETTER_LIMIT);
    snprintf(budget, sizeof(budget), "%ld", m->cfg->batch_bytes);
    snprintf(max_message, sizeof(max_message), "%ld", kafka_message_max_bytes(r->kafka));
    const char *params[4] = {limit, m->lanes.owned_array.s, budget, max_message};
    const char *dead_params[4] = {dead_limit, m->lanes.owned_array.s, budget, max_message};
    /* Any claim of a sleeping follower but the one that follows falling asleep is a wakeup: it
     * asks again before it sleeps again, as its guard may have left. A guard goes on sleeping
     * through claims its timer brings about; it leaves when notified or given work (see step). */
    if (!m->final_check && !m->guard)
        m->asleep = false;
    m->final_check = false;
    /* The dead-letter claim comes before the planner settings: it is planned as usual. */
    PgQuery queries[4] = {{SQL_BEGIN, 0, NULL, false}};
    int nq = 1;
    if (m->cfg->dead_letter_topic)
        queries[nq++] = (PgQuery){m->sql[SQL_CLAIM_DEAD], 4, dead_params, true};
    queries[nq++] = (PgQuery){SQL_CLAIM_PLAN, 0, NULL, true};
    m->claim_sent = ev_now(m->loop) < m->around_locks_until
                        ? m->claim_stmt + (SQL_CLAIM_HOLD_AROUND_LOCKS - SQL_CLAIM_HOLD)
                        : m->claim_stmt;
    queries[nq++] = (PgQuery){m->sql[m->claim_sent], 4, params, true};
    m->phase = PHASE_CLAIMING;
    m->claim_sent_at = ev_now(m->loop);
    if (!pg_conn_send(m->pg, queries, nq, on_claimed, m))
        m->phase = PHASE_IDLE;
}

/* Lanes owned by all of the relay's sessions. */
static int relay_lanes_owned(const Relay *r)
{
    int owned = 0;
    for (int i = 0; i < r->n_members; i++)
        owned += r->members[i].lanes.n_owned;
    return owned;
}

static void on_rebalanced(Lanes *lanes, bool ok, void *arg)
{
    Member *m = arg;
    m->phase = PHASE_IDLE;
    m->rebalance_due = false;
    Relay *r = m->relay;
    int owned = relay_lanes_owned(r);
    if (owned != r->logged_owned)
        log_info("lanes owned", "lanes=%d of=%d sessions=%d members=%d", owned, LANE_COUNT,
                 r->n_members, lanes->members);
    r->logged_owned = owned;
    bool membership_changed = lanes->members != m->logged_members;
    m->logged_members = lanes->members;
    if (lanes->gained)
        m->wake_pending = true; /* new lanes may hold a backlog */
    if (m->stopping) {
        stop_loop(m);
        return;
    }
    step(m);
    if (membership_changed) {
        /* The other sessions of this relay re-divide now rather than at their next interval, so
         * a session that joins (or a relay that starts or stops) moves lanes within a batch. */
        for (int i = 0; i < r->n_members; i++) {
            if (&r->members[i] != m && !r->members[i].stopping) {
                r->members[i].rebalance_due = true;
                step(&r->members[i]);
            }
        }
    }
}

static void on_guard_left(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Member *m = arg;
    if (!results)
        return;
    if (error) {
        /* The lock may still be held: only closing the session surely frees it. */
        char q[512];
        log_warn("giving up the wakeup lock failed; reconnecting", "error=%s",
                 log_quote(error, q, sizeof(q)));
        pg_conn_reset(pg, "giving up the wakeup lock failed");
        return;
    }
    m->phase = PHASE_IDLE;
    carry_on(m);
}

/* A guard lets the wakeup lock go before anything else once producers notified (their rows may
 * be any session's) or it has work (producers would notify all the while): in a transaction of
 * its own, as the notification that wakes its followers to ask again must go out now, not with a
 * later commit (or never, with a rollback). A guard without lanes (moved away while it slept)
 * leaves too. */
static void leave_guard(Member *m)
{
    PgQuery q = {SQL_WAKE, 0, NULL, false};
    m->guard = m->asleep = m->notified = false;
    m->phase = PHASE_ENDING;
    if (!pg_conn_send(m->pg, &q, 1, on_guard_left, m))
        m->phase = PHASE_IDLE;
}

static bool guard_must_leave(const Member *m)
{
    if (!m->guard)
        return false;
    if (m->lanes.n_owned == 0)
        return true; /* its lanes moved away while it slept: it will not claim */
    if (m->final_check)
        return false;
    return !m->asleep /* work */ || (m->wake_pending && m->notified);
}

/* Does whatever comes next between batches: a due rebalance first, then a claim when there is a
 * reason to claim (wake_pending) and nothing stands in the way; a woken guard first leaves. */
static void step(Member *m)
{
    if (m->phase != PHASE_IDLE || m->stopping || m->batch.n > 0 || !pg_conn_idle(m->pg))
        return;
    if (m->rebalance_due) {
        m->phase = PHASE_REBALANCING;
        if (!lanes_rebalance(&m->lanes, m->pg, on_rebalanced, m))
            m->phase = PHASE_IDLE;
        return;
    }
    if (guard_must_leave(m)) {
        leave_guard(m);
        return;
    }
    if (m->wake_pending && m->lanes.n_owned > 0 && !ev_is_active(&m->retry_timer))
        claim(m);
}

/* ---- events ------------------------------------------------------------------------------- */

static void on_listening(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Member *m = arg;
    if (!results)
        return;
    if (error) {
        char q[512];
        log_warn("LISTEN failed; relying on the poll timer", "error=%s",
                 log_quote(error, q, sizeof(q)));
    }
    m->phase = PHASE_IDLE;
    if (m->stopping) {
        stop_loop(m);
        return;
    }
    m->wake_pending = true;
    m->rebalance_due = true;
    step(m);
}

static void on_pg_state(PgConn *pg, bool up, const char *reason, void *arg)
{
    Member *m = arg;
    if (up && m->stopped)
        return; /* done: the other sessions are finishing, this one stays out of the group */
    if (up && !m->sql[0]) {
        /* Quoting follows the connection's encoding, so the statements are written now. */
        char err[256];
        if (!table_sql_all(&m->cfg->map, pg_conn_libpq(pg), sql_templates, m->sql, SQL_COUNT, err,
                           sizeof(err))) {
            log_error("cannot write the relay's statements", "error=%s", err);
            relay_fail(m);
            return;
        }
    }
    if (up) {
        PgQuery q = {SQL_LISTEN, 0, NULL, false};
        m->phase = PHASE_SETUP;
        if (!pg_conn_send(pg, &q, 1, on_listening, m))
            m->phase = PHASE_DOWN;
        return;
    }
    /* The session is gone, and with it the open transaction and every lane this relay owned:
     * other relays take the lanes over. Rows already handed to Kafka are sent again by whoever
     * claims them next; consumers drop the duplicates. */
    Batch *b = &m->batch;
    m->phase = PHASE_DOWN;
    lanes_reset(&m->lanes);
    /* A guard's lock went with the session. */
    m->asleep = m->guard = m->final_check = false;
    if (b->n > 0) {
        log_warn("batch abandoned with the connection; its rows will be sent again",
                 "rows=%d in_flight=%d session=%d", b->n, b->in_flight, m->index);
        /* The delivery timer keeps running: the session claims nothing until every message of
         * the abandoned batch is reported, and with message.timeout.ms=0 a message to a broker
         * that stays down is reported only when the timer purges it (issue 21). */
        b->abandoned = true;
        b->next = b->n;
        maybe_finish_batch(m);
    }
    if (m->stopping)
        stop_loop(m);
}

static void on_notify(PgConn *pg, const char *channel, const char *payload, void *arg)
{
    Member *m = arg;
    /* A guard that left wakes its followers; the guard now is none of them. Waking it would
     * make it leave in turn, and the sessions would hand the lock round for ever. */
    if (m->guard && strcmp(payload, GUARD_LEFT) == 0)
        return;
    m->notified = true;
    m->wake_pending = true;
    step(m);
}

/* The poll, busy and retry timers: there may be rows to claim. */
static void on_wake_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Member *m = w->data;
    m->wake_pending = true;
    step(m);
}

static void on_rebalance_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Member *m = w->data;
    m->rebalance_due = true;
    step(m);
}

static void on_shutdown_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Member *m = w->data;
    Batch *b = &m->batch;
    if (m->left) {
        member_done(m); /* giving up the wakeup lock took too long */
        return;
    }
    log_warn("shutdown timeout: marking what was acknowledged, the rest will be re-sent",
             "in_flight=%d session=%d", b->in_flight, m->index);
    if (m->phase == PHASE_PRODUCING && !b->abandoned) {
        /* Reports that arrive from now on are ignored: those rows stay unsent. The producer
         * still holds their messages, whose payloads point into the claim results: those live
         * until the producer is gone (relay_free frees it before the members). */
        for (int i = 0; i < b->n; i++)
            if (b->rows[i].state == ROW_QUEUED)
                b->rows[i].state = ROW_PENDING;
        b->in_flight = 0;
        batch_retire(b);
        send_marks(m);
    } else {
        stop_loop(m);
    }
}

/* A purge reaches only the messages queued or in flight at that moment: one inside a request
 * that was partly written when the purge came is left alone, and when its connection then fails
 * librdkafka puts it back in the partition queue, where (message.timeout.ms=0) nothing ever
 * reports it, and every session would wait on `purging` for ever. So the purge is repeated every
 * second until every report is in. */
#define PURGE_REPEAT_S 1.0

static void on_purge_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    if (r->purging && r->kafka)
        kafka_purge(r->kafka);
    else
        ev_timer_stop(loop, w);
}

static void start_purge(Relay *r)
{
    r->purging = true;
    kafka_purge(r->kafka);
    ev_timer_again(r->loop, &r->purge_timer);
}

static void on_delivery_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Member *m = w->data;
    Batch *b = &m->batch;
    if (b->n == 0)
        return;
    if (b->in_flight == 0) {
        /* Nothing of this batch is at the producer: it waits for room (queue full) or for
         * another session's purge. Its rest stays unsent, with no attempt counted. */
        b->timed_out = true;
        if (m->phase == PHASE_PRODUCING)
            produce_more(m);
        return;
    }
    /* Like log_batch_failures: loud once per streak of failing batches, then debug. */
    log_write(m->last_failure[0] ? LOG_DEBUG : LOG_WARN,
              "delivery timeout: cancelling the rest of the batch, it will be retried",
              "in_flight=%d acked=%d timeout_ms=%ld session=%d", b->in_flight, b->acked,
              m->cfg->delivery_timeout_ms, m->index);
    /* The purge cancels what every member has in flight: each counts it as its own timeout, so
     * what reached the broker stays a prefix of each batch per partition. */
    Relay *r = m->relay;
    for (int i = 0; i < r->n_members; i++)
        if (r->members[i].batch.in_flight > 0)
            r->members[i].batch.timed_out = true;
    start_purge(r);
}

/* Stops one member: at once between batches, else once its batch is done (bounded by the
 * shutdown timeout while waiting for acknowledgements). */
static void member_stop(Member *m)
{
    if (m->stopping)
        return;
    m->stopping = true;
    ev_timer_stop(m->loop, &m->poll_timer);
    ev_timer_stop(m->loop, &m->retry_timer);
    ev_timer_stop(m->loop, &m->rebalance_timer);
    switch (m->phase) {
    case PHASE_DOWN:
    case PHASE_IDLE:
        stop_loop(m);
        break;
    case PHASE_PRODUCING:
        ev_timer_set(&m->shutdown_timer, (double)m->cfg->shutdown_timeout_ms / 1000.0, 0);
        ev_timer_start(m->loop, &m->shutdown_timer);
        produce_more(m); /* stops producing, marks at once if nothing is in flight */
        break;
    default:
        break; /* the request in flight finishes the cycle and sees `stopping` */
    }
}

static void relay_stop(Relay *r)
{
    r->stopping = true;
    for (int i = 0; i < r->n_members; i++)
        member_stop(&r->members[i]);
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    Relay *r = w->data;
    if (++r->signals > 1) {
        /* Second signal: leave now; the server rolls back the open transactions. */
        static const char msg[] = "level=warn msg=\"second signal, exiting immediately\"\n";
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)ignored;
        _exit(128 + w->signum);
    }
    log_info("shutting down", "signal=%s in_flight=%d", strsignal(w->signum), relay_in_flight(r));
    relay_stop(r);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static void timer_init(Member *m, ev_timer *t, void (*cb)(struct ev_loop *, ev_timer *, int))
{
    ev_init(t, cb);
    t->data = m;
}

static bool member_init(Member *m, Relay *r, int index)
{
    const Config *cfg = r->cfg;
    m->relay = r;
    m->index = index;
    m->loop = r->loop;
    m->cfg = cfg;
    if (!batch_init(&m->batch, (int)cfg->batch_size + DEAD_LETTER_LIMIT))
        return false;
    m->claim_stmt = cfg->on_poison == POISON_HOLD ? SQL_CLAIM_HOLD : SQL_CLAIM_SKIP;
    _Static_assert(SQL_CLAIM_HOLD_AROUND_LOCKS - SQL_CLAIM_HOLD ==
                       SQL_CLAIM_SKIP_AROUND_LOCKS - SQL_CLAIM_SKIP,
                   "claim_statement pairs each claim with its around-locks form");
    lanes_init(&m->lanes);
    backoff_init(&m->retry, RETRY_BASE_S, RETRY_CAP_S, 0);
    timer_init(m, &m->poll_timer, on_wake_timer);
    m->poll_timer.repeat = (double)cfg->poll_interval_ms / 1000.0;
    ev_timer_again(m->loop, &m->poll_timer);
    timer_init(m, &m->rebalance_timer, on_rebalance_timer);
    m->rebalance_timer.repeat = (double)cfg->rebalance_interval_ms / 1000.0;
    ev_timer_again(m->loop, &m->rebalance_timer);
    timer_init(m, &m->retry_timer, on_wake_timer);
    timer_init(m, &m->busy_timer, on_wake_timer);
    timer_init(m, &m->delivery_timer, on_delivery_timer);
    timer_init(m, &m->shutdown_timer, on_shutdown_timer);
    m->phase = PHASE_DOWN;
    return true;
}

static void member_free(Member *m)
{
    if (!m->relay)
        return; /* never initialised */
    ev_timer_stop(m->loop, &m->poll_timer);
    ev_timer_stop(m->loop, &m->retry_timer);
    ev_timer_stop(m->loop, &m->busy_timer);
    ev_timer_stop(m->loop, &m->rebalance_timer);
    ev_timer_stop(m->loop, &m->shutdown_timer);
    ev_timer_stop(m->loop, &m->delivery_timer);
    pg_conn_free(m->pg);
    batch_free(&m->batch);
    batch_marks_free(&m->marks);
    lanes_free(&m->lanes);
    for (int i = 0; i < SQL_COUNT; i++)
        free(m->sql[i]);
}

Relay *relay_new(struct ev_loop *loop, const Config *cfg, rd_kafka_conf_t *kconf, char *err,
                 size_t errlen)
{
    Relay *r = calloc(1, sizeof(*r));
    if (r) {
        r->loop = loop;
        r->cfg = cfg;
        r->n_members = (int)cfg->sessions;
        r->logged_owned = -1;
        r->members = calloc((size_t)r->n_members, sizeof(Member));
    }
    bool ok = r && r->members;
    for (int i = 0; ok && i < r->n_members; i++)
        ok = member_init(&r->members[i], r, i);
    if (!ok) {
        relay_free(r);
        rd_kafka_conf_destroy(kconf);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->kconf_template = rd_kafka_conf_dup(kconf);
    r->kafka = kafka_producer_new(loop, kconf, on_delivery, r, err, errlen);
    if (!r->kafka) {
        relay_free(r);
        return NULL;
    }
    ev_init(&r->purge_timer, on_purge_timer);
    r->purge_timer.repeat = PURGE_REPEAT_S;
    r->purge_timer.data = r;
    ev_signal_init(&r->sigterm, on_signal, SIGTERM);
    r->sigterm.data = r;
    ev_signal_start(loop, &r->sigterm);
    ev_signal_init(&r->sigint, on_signal, SIGINT);
    r->sigint.data = r;
    ev_signal_start(loop, &r->sigint);
    return r;
}

int relay_run(Relay *r)
{
    r->running = r->n_members;
    for (int i = 0; i < r->n_members; i++) {
        Member *m = &r->members[i];
        char name[24];
        snprintf(name, sizeof(name), "session-%d", i);
        m->pg = pg_conn_new_named(r->loop, r->cfg->database_url, name, on_pg_state, on_notify, m);
    }
    ev_run(r->loop, 0);
    unsigned long long sent = 0, failed = 0, dead = 0, breaks = 0;
    for (int i = 0; i < r->n_members; i++) {
        sent += r->members[i].total_sent;
        failed += r->members[i].total_failed;
        dead += r->members[i].total_dead;
        breaks += r->members[i].order_breaks;
    }
    log_info("stopped", "sent=%llu failed_attempts=%llu dead_lettered=%llu order_breaks=%llu", sent,
             failed, dead, breaks);
    return r->exit_status;
}

void relay_status(const Relay *r, RelayStatus *out)
{
    memset(out, 0, sizeof(*out));
    out->postgres_up = true;
    out->kafka_up = r->kafka && kafka_up(r->kafka);
    out->stopping = r->stopping;
    out->lanes_owned = relay_lanes_owned(r);
    for (int i = 0; i < r->n_members; i++) {
        const Member *m = &r->members[i];
        out->postgres_up = out->postgres_up && m->pg && pg_conn_up(m->pg);
        if (m->lanes.members > out->members)
            out->members = m->lanes.members;
    }
}

void relay_free(Relay *r)
{
    if (!r)
        return;
    ev_signal_stop(r->loop, &r->sigterm);
    ev_signal_stop(r->loop, &r->sigint);
    ev_timer_stop(r->loop, &r->purge_timer);
    /* The producer goes first: its last delivery reports still point into the batches. */
    kafka_producer_free(r->kafka, 1000);
    for (int i = 0; r->members && i < r->n_members; i++)
        member_free(&r->members[i]);
    free(r->members);
    if (r->kconf_template)
        rd_kafka_conf_destroy(r->kconf_template);
    free(r);
}
