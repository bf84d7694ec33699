/* statements: every statement a relay session sends about the outbox, in one place.
 *
 * The statements on the table are templates: table.h expands their {placeholders} to the
 * configured table and columns once a connection is up (session_sql_templates, indexed by
 * SessionSql). The fixed ones (transaction control, planner settings, the wakeup functions of
 * migrations/0007_wakeup_lock.sql) are string literals. What each statement does and why it is
 * written so is said beside it in statements.c. Nothing here runs anything. */
#ifndef OUTBOX_STATEMENTS_H
#define OUTBOX_STATEMENTS_H

/* The channel producers notify (migrations/0004, 0007) and sessions LISTEN on. */
#define WAKEUP_CHANNEL "outbox_relay"
#define SQL_LISTEN "LISTEN " WAKEUP_CHANNEL
#define SQL_BEGIN "BEGIN"
#define SQL_COMMIT "COMMIT"
#define SQL_ROLLBACK "ROLLBACK"

/* For the claim that follows, within its transaction: walk the unsent index in order instead of
 * collecting and sorting every unsent row. The planner picks the sort when the table has no
 * statistics yet (a new outbox until autovacuum first analyzes it, up to a minute after its first
 * rows); each claim then reads the whole backlog (measured: 200-675 ms instead of 1.4 ms a claim
 * at 200,000 unsent rows). Test 31 keeps it so. No JIT: the claim around locks is estimated
 * above jit_above_cost on a large backlog, and compiling it took 0.9 s a claim (measured, 200,000
 * unsent rows) to save nothing. lock_timeout: see SQL_CLAIM. */
#define CLAIM_LOCK_TIMEOUT_MS "200"
#define SQL_CLAIM_PLAN                                                                             \
    "SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true)," \
    " set_config('jit', 'off', true), set_config('lock_timeout', '" CLAIM_LOCK_TIMEOUT_MS          \
    "', true)"
/* Before the marks, in the claim's transaction: they wait as long as they need (a table lock
 * some DDL holds, say), rather than fail after the claim's lock_timeout. */
#define SQL_MARK_PLAN "SELECT set_config('lock_timeout', '0', true)"

/* Going to sleep and waking up (migrations/0007_wakeup_lock.sql): outbox_relay_sleep() answers
 * 'guard' (this session now holds the wakeup lock: producers notify), 'follow' (another session
 * holds it) or 'busy' (producers are mid-transaction: ask again shortly). A guard gives the lock
 * up with outbox_relay_wake(), which also wakes the followers to ask again (see wakeup.h). */
#define SQL_SLEEP "SELECT outbox_relay_sleep()"
#define SQL_WAKE "SELECT outbox_relay_wake()"
#define GUARD_LEFT "guard left" /* the payload of outbox_relay_wake's notification */

/* The backlog, in one pass over the unsent rows (the partial index on unsent rows keeps it off
 * the sent ones): the upkeep's gauges and `status` both read it, columns as BacklogColumn. A
 * template: {table} is expanded by table.h. */
#define SQL_BACKLOG                                                                                \
    "SELECT count(*) FILTER (WHERE dead_at IS NULL),"                                              \
    " count(*) FILTER (WHERE dead_at IS NULL AND attempts > 0),"                                   \
    " count(*) FILTER (WHERE dead_at IS NOT NULL),"                                                \
    " extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_at IS NULL))::float8"          \
    " FROM {table} WHERE sent_at IS NULL"
typedef enum {
    BACKLOG_UNSENT,       /* not sent, not dead */
    BACKLOG_RETRYING,     /* of those, failed at least once */
    BACKLOG_DEAD,         /* dead-lettered, not requeued */
    BACKLOG_OLDEST_AGE_S, /* seconds since the oldest unsent row was created; NULL: none */
} BacklogColumn;

/* The templates, by what they do (statements.c says how). */
typedef enum {
    SQL_CLAIM_HOLD, /* the claim with --on-poison hold: $1 rows, $2 lanes, $3 bytes, $4 max */
    SQL_CLAIM_SKIP, /* the same with --on-poison skip */
    SQL_CLAIM_HOLD_AROUND_LOCKS, /* the claims that go around rows others have locked */
    SQL_CLAIM_SKIP_AROUND_LOCKS,
    SQL_FIND_LOCKER,        /* which backend holds the first locked row, for the log */
    SQL_CLAIM_DEAD,         /* dead events not yet published to the dead-letter topic */
    SQL_MARK_SENT,          /* $1 ids: sent_at */
    SQL_DELETE_SENT,        /* $1 ids: deleted (--on-sent delete) */
    SQL_MARK_FAILED,        /* $1 ids, $2 errors, $3 permanent, $4 max attempts, $5/$6 backoff */
    SQL_MARK_DEAD_LETTERED, /* $1 ids published to the dead-letter topic $2 */
    SQL_MARK_DEAD_LETTER_FAILED, /* $1 ids, $2 errors */
    SESSION_SQL_COUNT
} SessionSql;

/* The claim that goes around locked rows for each plain claim. */
#define SQL_AROUND_LOCKS_OF(claim) ((claim) + (SQL_CLAIM_HOLD_AROUND_LOCKS - SQL_CLAIM_HOLD))

/* Templates for table_sql_all (table.h), indexed by SessionSql. */
extern const char *const session_sql_templates[SESSION_SQL_COUNT];

#endif
