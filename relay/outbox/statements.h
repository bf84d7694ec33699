/* statements: every statement a relay session sends about the outbox, in one place.
 *
 * The statements on the table are templates: table.h expands their {placeholders} to the
 * configured table and columns once a connection is up (session_sql_templates, indexed by
 * SessionSql). The fixed ones (transaction control, planner settings, the wakeup functions of
 * migrations/0007_wakeup_lock.sql) are string literals. What each statement does and why it is
 * written so is said beside it in statements.c. Nothing here runs anything. */
#ifndef OUTBOX_STATEMENTS_H
#define OUTBOX_STATEMENTS_H

#include "schema.h"

/* The to_char format (a quoted literal) of a time given AT TIME ZONE 'UTC' as text that reads
 * back the same whatever the reading session's DateStyle and TimeZone: ISO 8601 with its Z and
 * microseconds. The server's default text does not (a zone abbreviation such as IST reads back
 * as another zone's). Retention's cursor, replay's bounds and the event-time header use it. */
#define SQL_ISO_UTC "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'"

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
/* And this statement's snapshot, taken before the claim's, for the claim's recheck
 * (SQL_CLAIM_RECHECK_HOLD, statements.c): what committed after it. */
#define CLAIM_SNAPSHOT_SETTING "outbox_relay.claim_snapshot"
#define SQL_CLAIM_PLAN                                                                             \
    "SELECT pg_catalog.set_config('enable_sort', 'off', true), "                                   \
    "pg_catalog.set_config('enable_bitmapscan', 'off', true),"                                     \
    " pg_catalog.set_config('jit', 'off', true), pg_catalog.set_config('lock_timeout', "           \
    "'" CLAIM_LOCK_TIMEOUT_MS "', true), pg_catalog.set_config('" CLAIM_SNAPSHOT_SETTING "',"      \
    " pg_catalog.pg_current_snapshot()::text, true)"
/* Before the marks, in the claim's transaction: they wait as long as they need (a table lock
 * some DDL holds, say), rather than fail after the claim's lock_timeout. And they find their rows
 * by the primary key: a batch of 1,000 ids costs the planner more than a sequential scan of a
 * table it believes small (a new one, or one whose dead versions an old snapshot keeps), and that
 * scan read every version each mark (measured: 50 ms and more a mark in the old-snapshot bench). */
#define SQL_MARK_PLAN                                                                              \
    "SELECT pg_catalog.set_config('lock_timeout', '0', true), "                                    \
    "pg_catalog.set_config('enable_seqscan', 'off', true)"
/* In a transaction that records failures (attempts, dead-lettering, dead-letter publications):
 * where the relay's session does not wait for the flush (relay/io/pg.c), this commit waits for
 * PostgreSQL's own flush (synchronous_commit local), still not for a standby. A lost sent mark
 * only sends a row again; a failure lost in a crash could let an event past --max-attempts, or
 * bring back one already published to the dead-letter topic. Not waiting for a standby keeps a
 * standby's outage from holding the session: a backend waiting for one does not notice its
 * client leave, and would keep the lanes' locks until the standby answers. A setting the URL,
 * role or database gave the relay is kept. Failures are rare: the flush costs nothing in a
 * steady flow. */
#define SQL_FAILURES_DURABLE_SETTING                                                               \
    "pg_catalog.set_config('synchronous_commit', CASE "                                            \
    "pg_catalog.current_setting('synchronous_commit')"                                             \
    " WHEN 'off' THEN 'local' ELSE pg_catalog.current_setting('synchronous_commit') END, true)"
#define SQL_MARK_PLAN_FAILURES SQL_MARK_PLAN ", " SQL_FAILURES_DURABLE_SETTING
#define SQL_FAILURES_DURABLE "SELECT " SQL_FAILURES_DURABLE_SETTING

/* Going to sleep and waking up (migrations/0007_wakeup_lock.sql): outbox_relay_sleep() answers
 * 'guard' (this session now holds the wakeup lock: producers notify), 'follow' (another session
 * holds it) or 'busy' (producers are mid-transaction: ask again shortly). A guard gives the lock
 * up with outbox_relay_wake(), which also wakes the followers to ask again (see wakeup.h). */
#define SQL_SLEEP "SELECT outbox_relay_sleep()"
#define SQL_WAKE "SELECT outbox_relay_wake()"
#define GUARD_LEFT "guard left" /* the payload of outbox_relay_wake's notification */

/* The backlog, in one pass over the unsent rows (the partial index on unsent rows keeps it off
 * the sent ones): the upkeep's gauges and `status` both read it, columns as BacklogColumn. A
 * template: {table} is expanded by table.h. The oldest age leaves out rows created at infinity
 * or -infinity (their age is no time): PostgreSQL 15 cannot subtract them from now(), and one
 * such row failed the whole count, `status` (exit 1) and every backlog gauge with it. */
#define SQL_BACKLOG                                                                                \
    "SELECT pg_catalog.count(*) FILTER (WHERE dead_at IS NULL),"                                   \
    " pg_catalog.count(*) FILTER (WHERE dead_at IS NULL AND attempts > 0),"                        \
    " pg_catalog.count(*) FILTER (WHERE dead_at IS NOT NULL),"                                     \
    " extract(epoch FROM pg_catalog.now() - pg_catalog.min(created_at) FILTER (WHERE dead_at IS "  \
    "NULL AND pg_catalog.isfinite(created_at)))::float8,"                                          \
    " pg_catalog.count(*) FILTER (WHERE dead_at IS NOT NULL AND dead_letter_topic IS NULL"         \
    " AND next_attempt_at IS NOT NULL)"                                                            \
    " FROM {table} WHERE sent_at IS NULL"
typedef enum {
    BACKLOG_UNSENT,       /* not sent, not dead */
    BACKLOG_RETRYING,     /* of those, failed at least once */
    BACKLOG_DEAD,         /* dead-lettered, not requeued */
    BACKLOG_OLDEST_AGE_S, /* seconds since the oldest unsent row was created; NULL: none */
    /* Of the dead-lettered, those whose copy to the dead-letter topic failed (or whose record of
     * it the row refused) and is not recorded as published: SQL_MARK_DEAD_LETTER_FAILED alone
     * sets a dead row's retry time (death clears it, so does requeue), and it keeps last_error
     * as the death reason, so once the log line has rotated away this count is what still tells
     * them from the dead rows whose copy the dead-letter topic's consumers have. */
    BACKLOG_DEAD_LETTER_FAILED,
} BacklogColumn;

/* The templates, by what they do (statements.c says how). */
typedef enum {
    SQL_CLAIM_HOLD, /* the claim with --on-poison hold: $1 rows, $2 lanes, $3 bytes, $4 max,
                     * $5 the claim floor and what it was computed against (floor_param),
                     * $6 aggregate types left out (text[]) */
    SQL_CLAIM_SKIP, /* the same with --on-poison skip */
    SQL_CLAIM_HOLD_AROUND_LOCKS, /* the claims that go around rows others have locked among the
                                  * first $5 unsent rows (instead of the floor) */
    SQL_CLAIM_SKIP_AROUND_LOCKS,
    SQL_FIND_LOCKER,        /* the first row locked by another backend among the next $1, and
                             * that backend ($2 lanes) */
    SQL_CLAIM_DEAD,         /* dead events not yet published to the dead-letter topic */
    SQL_FLOOR_HELD_HOLD,    /* the lowest row holding its aggregate back ($1 lanes, hold); the
                             * sequence's last value */
    SQL_FLOOR_HELD_SKIP,    /* the same with --on-poison skip */
    SQL_FLOOR_WRITERS,      /* $1 writers listed before: all ended? and the writers now */
    SQL_FLOOR_CHECK,        /* whether, and else why not, the claim floor can be on */
    SQL_MARK_SENT,          /* $1 ids: sent_at */
    SQL_DELETE_SENT,        /* $1 ids: deleted (--on-sent delete) */
    SQL_MARK_FAILED,        /* $1 ids, $2 errors, $3 permanent, $4 max attempts, $5/$6 backoff */
    SQL_MARK_DEAD_LETTERED, /* $1 ids published to the dead-letter topic $2 */
    SQL_MARK_DEAD_LETTER_FAILED, /* $1 ids */
    SQL_CLAIM_RECHECK_HOLD,      /* after the claim: failed rows of the lanes $1 that hold their
                                  * aggregate back and were recorded since the claim began (at
                                  * most $2) */
    SQL_CLAIM_RECHECK_SKIP,      /* the same with --on-poison skip */
    SESSION_SQL_COUNT
} SessionSql;

/* The claim that goes around locked rows for each plain claim. */
#define SQL_AROUND_LOCKS_OF(claim) ((claim) + (SQL_CLAIM_HOLD_AROUND_LOCKS - SQL_CLAIM_HOLD))

/* Templates for table_sql_all (table.h), indexed by SessionSql. */
extern const char *const session_sql_templates[SESSION_SQL_COUNT];

/* ---- the lane group (lanes.h): advisory locks with the keys of schema.h ---- */

/* A free member slot, taken: $1 the slot count. */
#define SQL_LANES_JOIN                                                                             \
    "SELECT s FROM pg_catalog.generate_series(0, $1::int - 1) AS s"                                \
    " WHERE pg_catalog.pg_try_advisory_lock(" LOCK_NS_MEMBER ", s) LIMIT 1"
/* Gives the member slot $1 up (a session that rests). */
#define SQL_LANES_LEAVE "SELECT pg_catalog.pg_advisory_unlock(" LOCK_NS_MEMBER ", $1::int)"
/* The member slots of live sessions, of all relays on this database, and each one's mark (lanes.h,
 * LaneMark): 1 away, 2 trying, from the mark lock its session holds (key: the slot, plus
 * LANE_MAX_MEMBERS for trying), 0 none. pg_locks is read once (MATERIALIZED): each read copies
 * the server's whole lock table under every lock-manager partition lock (FLOOR_WRITERS says so
 * too), and a look runs per session every --rebalance-interval. */
#define SQL_LANES_MEMBERS                                                                          \
    "WITH l AS MATERIALIZED (SELECT objid, classid, pid FROM pg_locks"                             \
    " WHERE locktype = 'advisory' AND classid IN (" LOCK_NS_MEMBER "::oid, " LOCK_NS_AWAY "::oid)" \
    " AND objsubid = 2 AND granted AND database = (SELECT oid FROM pg_database WHERE datname = "   \
    "pg_catalog.current_database()))"                                                              \
    " SELECT m.objid::int, COALESCE((SELECT pg_catalog.min(CASE WHEN a.objid = m.objid THEN 1"     \
    " ELSE 2 END) FROM l a WHERE a.classid = " LOCK_NS_AWAY "::oid"                                \
    " AND a.objid::int IN (m.objid::int, m.objid::int + 1024) AND a.pid = m.pid), 0) AS mark"      \
    " FROM l m WHERE m.classid = " LOCK_NS_MEMBER "::oid ORDER BY 1"
/* Fails as the lane group's statements above and below would (42501, naming the function) when
 * the role may not execute the advisory lock functions they call (EXECUTE revoked from PUBLIC, a
 * hardening step), and takes and gives up no lock: each is called only where
 * has_function_privilege says it is refused. The setup probe sends it (claim.c): a probe that
 * passed without it said the setup was fixed, and the session joined, failed and said the fault
 * again after every retry backoff. */
#define SQL_LANES_CALLABLE                                                                         \
    "SELECT CASE WHEN NOT pg_catalog.has_function_privilege("                                      \
    "'pg_catalog.pg_try_advisory_lock(integer, integer)', 'EXECUTE')"                              \
    " THEN pg_catalog.pg_try_advisory_lock(" LOCK_NS_MEMBER ", -1)"                                \
    " WHEN NOT pg_catalog.has_function_privilege("                                                 \
    "'pg_catalog.pg_advisory_unlock(integer, integer)', 'EXECUTE')"                                \
    " THEN pg_catalog.pg_advisory_unlock(" LOCK_NS_MEMBER ", -1) ELSE true END"
/* The session takes, or gives up, the mark lock $1 (its slot, plus 1024 for trying). Taking it
 * answers whether it was taken and, when not, the pid of the session holding it (NULL if it let
 * go meanwhile): a squatter (SQL_LANE_SQUATTERS, "stray-marks") the relay's own log names
 * (lanes.c on_members). pg_locks is read only on a refusal: the try is made first (FROM). */
#define SQL_LANES_MARK                                                                             \
    "SELECT m.t, CASE WHEN NOT m.t THEN (SELECT k.pid FROM pg_locks k"                             \
    " WHERE k.locktype = 'advisory' AND k.classid = " LOCK_NS_AWAY "::oid"                         \
    " AND k.objid::int = $1::int AND k.objsubid = 2 AND k.granted"                                 \
    " AND k.database = (SELECT oid FROM pg_database WHERE datname = "                              \
    "pg_catalog.current_database()) LIMIT 1) END"                                                  \
    " FROM (SELECT pg_catalog.pg_try_advisory_lock(" LOCK_NS_AWAY ", $1::int) AS t) m"
#define SQL_LANES_UNMARK "SELECT pg_catalog.pg_advisory_unlock(" LOCK_NS_AWAY ", $1::int)"
/* Of the lanes $1, those this session could lock now. */
#define SQL_LOCK_LANES                                                                             \
    "SELECT l FROM pg_catalog.unnest($1::int[]) AS l WHERE "                                       \
    "pg_catalog.pg_try_advisory_lock(" LOCK_NS_LANE ", l)"
/* Gives the lanes $1 up. */
#define SQL_UNLOCK_LANES                                                                           \
    "SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_advisory_unlock(" LOCK_NS_LANE ", l))" \
    " FROM pg_catalog.unnest($1::int[]) AS l"

/* Sessions holding the lane group's locks that cannot be a relay's (advisory locks need no
 * privilege: any login can take them). A relay session holds exactly one member slot, takes
 * lanes only after its slot and gives them up before it, and holds mark locks (lanes.h) only at
 * its own slot or slot + 1024, given up before the slot: a holder of lanes without a slot, of
 * several slots, or of a mark lock of another slot than its own is not a relay
 * ("lanes-without-slot", "several-slots", "stray-marks"). Stray marks stall unseen otherwise: a
 * relay that cannot reach Kafka whose mark lock another session holds cannot mark itself away
 * (SQL_LANES_MARK answers false) and keeps its lanes, whose rows time out while other relays
 * reach Kafka. A slot without lanes ("slot-without-lanes") can be a relay's for as long as a
 * batch waits for Kafka: joining; away from Kafka (its lanes left to a relay that takes them
 * only between batches); with many members rendezvous hashing leaves some with none; or
 * strangers hold its lanes. It counts only while some lane has no owner (a slot that keeps a
 * lane from being claimed), only when still there at the next look (squatters.h), and only
 * for a session whose role is neither the caller's nor one that may UPDATE the table (a relay's
 * role may: it records sent rows and failures). status and check run as an operator's role
 * named relays away from Kafka, and check told to terminate them; so did each relay's upkeep
 * for relays logging in as different roles (one login per host, each a member of
 * outbox_relay), which also made the relay delivering unready. Whoever may UPDATE the table can
 * lose its events without any lock: the test excuses no neighbour outside that trust (a login
 * holding one slot and one lane to pass for a relay excuses nothing else of its role). A table
 * that does not exist ({table_text}, NULL) excuses no one.
 * A prepared transaction ("prepared-transaction") keeps the transaction-level advisory locks it
 * took with no session at all (pg_locks: a NULL pid) until someone commits or rolls it back:
 * never a relay (a relay prepares nothing), one row for each (grouped by its virtual transaction
 * too, or all of them would be one row with no pid), and no session to end. It is named from
 * pg_prepared_xacts (gid, owner, age), found by the xids its virtual transaction holds locks on
 * (the transactionid rows k reads beside the advisory ones): the virtual transaction's text is
 * no xid (PostgreSQL 15 shows a dummy backend's, 3/3 for xid 726).
 * Columns: pid (NULL for a prepared transaction), what, lanes, slots, role (a prepared
 * transaction's owner), application, client address (the address NULL unless the caller's role
 * may see that session; pg_stat_activity shows any session's role and application to any role,
 * and the role test reads its usesysid: a NULL, not excused, only once it ended), then for a
 * prepared transaction its gid, its age in seconds (both NULL if it ended between the reads) and
 * its xid (the relay's key for it), NULL otherwise. The types compared are the built-in operators'
 * own (bigint with integer, oid with oid): no look-alike of the schema is called (docs/security.md,
 * search_path). A table template (table_sql: {table_text}). pg_locks is read once (MATERIALIZED, as
 * SQL_LANES_MEMBERS says why). */
#define SQUAT_LANES "pg_catalog.count(*) FILTER (WHERE l.classid = " LOCK_NS_LANE "::oid)"
#define SQUAT_SLOTS "pg_catalog.count(*) FILTER (WHERE l.classid = " LOCK_NS_MEMBER "::oid)"
#define SQUAT_STRAY_MARKS                                                                          \
    "pg_catalog.count(*) FILTER (WHERE l.classid = " LOCK_NS_AWAY "::oid AND NOT EXISTS ("         \
    "SELECT FROM k m WHERE m.pid = l.pid AND m.classid = " LOCK_NS_MEMBER "::oid"                  \
    " AND l.objid::int IN (m.objid::int, m.objid::int + 1024)))"
#define SQUAT_DB "(SELECT oid FROM pg_database WHERE datname = pg_catalog.current_database())"
#define SQL_LANE_SQUATTERS                                                                         \
    "WITH k AS MATERIALIZED (SELECT pid, CASE WHEN pid IS NULL THEN virtualtransaction END AS vx," \
    " classid, objid, transactionid AS xid FROM pg_locks"                                          \
    " WHERE (locktype = 'advisory' AND objsubid = 2 AND granted AND classid IN (" LOCK_NS_MEMBER   \
    "::oid, " LOCK_NS_LANE "::oid, " LOCK_NS_AWAY "::oid) AND database = " SQUAT_DB ")"            \
    " OR (locktype = 'transactionid' AND pid IS NULL AND granted)),"                               \
    " p AS MATERIALIZED (SELECT l.pid, l.vx, " SQUAT_STRAY_MARKS " AS stray, " SQUAT_LANES         \
    " AS lanes, " SQUAT_SLOTS " AS slots FROM k l WHERE l.xid IS NULL GROUP BY l.pid, l.vx)"       \
    " SELECT p.pid, CASE WHEN p.vx IS NOT NULL THEN 'prepared-transaction'"                        \
    " WHEN p.stray > 0 THEN 'stray-marks'"                                                         \
    " WHEN p.slots = 0 THEN 'lanes-without-slot'"                                                  \
    " WHEN p.slots > 1 THEN 'several-slots' ELSE 'slot-without-lanes' END,"                        \
    " p.lanes, p.slots, COALESCE(a.usename::text, x.owner::text), a.application_name,"             \
    " pg_catalog.host(a.client_addr), x.gid,"                                                      \
    " pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.now() - x.prepared))::bigint,"     \
    " x.transaction::text"                                                                         \
    " FROM p LEFT JOIN pg_stat_activity a ON a.pid = p.pid"                                        \
    " LEFT JOIN pg_prepared_xacts x ON p.vx IS NOT NULL"                                           \
    " AND EXISTS (SELECT FROM k t WHERE t.vx = p.vx AND t.xid = x.transaction)"                    \
    " WHERE p.vx IS NOT NULL OR p.slots <> 1 OR p.stray > 0"                                       \
    " OR (p.lanes = 0 AND a.usename IS DISTINCT FROM CURRENT_USER"                                 \
    " AND (SELECT pg_catalog.count(*) FROM k o WHERE o.classid = " LOCK_NS_LANE "::oid) < 64"      \
    " AND pg_catalog.has_any_column_privilege(a.usesysid,"                                         \
    " pg_catalog.to_regclass({table_text})::pg_catalog.oid, 'UPDATE') IS NOT TRUE)"                \
    " ORDER BY 1, 8"

/* ---- status (relay/cmd/status.c) ---- */

/* Uses the index on sent_at (migrations/0005). */
#define SQL_THROUGHPUT                                                                             \
    "SELECT pg_catalog.count(*) FROM {table} WHERE sent_at > pg_catalog.now() - interval '60 "     \
    "seconds'"
/* A relay session is alive while it holds a member-slot lock (see lanes.h); its lanes are the
 * lane locks of the same session (a relay runs --sessions of them). pg_stat_activity shows the
 * client address and start time only for sessions the role may see (its own, or all with
 * pg_read_all_stats): NULL otherwise. The last column is the session's mark, as
 * SQL_LANES_MEMBERS reads it (0 none, 1 away, 2 trying: its relay's Kafka). */
#define SQL_RELAYS                                                                                 \
    "SELECT m.objid::int, m.pid,"                                                                  \
    " (SELECT pg_catalog.count(*) FROM pg_locks l WHERE l.locktype = 'advisory'"                   \
    "  AND l.classid = " LOCK_NS_LANE "::oid AND l.objsubid = 2 AND l.granted"                     \
    "  AND l.pid = m.pid AND l.database = m.database),"                                            \
    " pg_catalog.host(a.client_addr), a.client_port,"                                              \
    " pg_catalog.to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),"   \
    " COALESCE((SELECT pg_catalog.min(CASE WHEN k.objid = m.objid THEN 1 ELSE 2 END)"              \
    "  FROM pg_locks k WHERE k.locktype = 'advisory' AND k.classid = " LOCK_NS_AWAY "::oid"        \
    "  AND k.objid::int IN (m.objid::int, m.objid::int + 1024) AND k.objsubid = 2 AND k.granted"   \
    "  AND k.pid = m.pid AND k.database = m.database), 0)"                                         \
    " FROM pg_locks m LEFT JOIN pg_stat_activity a ON a.pid = m.pid"                               \
    " WHERE m.locktype = 'advisory' AND m.classid = " LOCK_NS_MEMBER "::oid"                       \
    " AND m.objsubid = 2 AND m.granted"                                                            \
    " AND m.database = (SELECT oid FROM pg_database WHERE datname = "                              \
    "pg_catalog.current_database())"                                                               \
    " ORDER BY 1"

/* ---- dead, requeue, purge-dead (relay/cmd/admin.c) ---- */

/* Statement templates for the configured table (relay/outbox/table.h). An event is named by its
 * order column ({seq}: id in the relay's own table), which is what --id takes.
 *
 * dead, requeue and purge-dead go a batch at a time in {seq} order, each batch a statement and a
 * transaction of its own: a statement stays far within the commands' statement_timeout and holds
 * its row locks briefly, and the listing's memory is one batch, however many rows died. $1: one
 * event's {seq} (NULL: all); $2: the last {seq} of the batch before (NULL at first); $3: the rows
 * of a batch (ADMIN_DEAD_BATCH); $4 (SQL_DEAD_ROWS_COUNTED, below): the snapshot purge-dead --all's
 * confirmation counted at (SQL_DEAD_COUNT; NULL: none), so that the purge deletes only the events
 * dead in it, not one that died while the question waited. Bounds by id and dead_at did not: a
 * death's dead_at is its transaction's start, so an event whose dying transaction (a relay's batch)
 * began before the latest death counted and committed after the count was within both, and deleted
 * unasked. A row's xmin tells which transaction wrote its version, and the snapshot which of them
 * had committed: the version is taken when its xmin is visible in the snapshot. xmin is 32 bits,
 * pg_visible_in_snapshot takes a full id: it is the one with the same low 32 bits nearest to this
 * statement's own snapshot's xmax, within 2^31 either side. Most versions the statement sees were
 * written below that xmax; but a row the purge waits for (another session's lock) and that a
 * transaction begun after the statement changes meanwhile is read again in its new version
 * (PostgreSQL's recheck of FOR UPDATE), whose xmin is at or above the xmax: taken as the id below
 * (2^32 less), as it was, in a cluster past its first 2^32 transactions (epoch 1 and on) that id
 * was visible in the count's snapshot and the changed row was deleted (83_dead_terminal part 6).
 * A frozen row older than 2^31 transactions stands for some other id: visible or left, never a
 * row the count did not see. A counted event whose row
 * changed since (a relay recorded its copy to the dead-letter topic, published or failed) has a
 * new version and is left: the purge then says fewer than counted (admin.c). A death written in
 * a savepoint has the savepoint's id, which a snapshot does not list among the running ones: one
 * still open at the count and committed after it is taken (the relay writes none). */
/* A scalar subquery: evaluated once a statement (an InitPlan), not twice a row. */
#define DEAD_XMAX_FULL                                                                             \
    "(SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint)"
#define DEAD_XMIN_FULL                                                                             \
    "((" DEAD_XMAX_FULL " - ((" DEAD_XMAX_FULL " - xmin::text::bigint + 2147483648) % 4294967296"  \
    " + 4294967296) % 4294967296 + 2147483648)::text::pg_catalog.xid8)"
#define SQL_DEAD_ROWS_WHERE(more)                                                                  \
    " FROM {table} WHERE dead_at IS NOT NULL AND sent_at IS NULL"                                  \
    " AND ($1::bigint IS NULL OR {seq} = $1::bigint)"                                              \
    " AND ($2::bigint IS NULL OR {seq} > $2::bigint)" more " ORDER BY {seq} LIMIT $3::bigint"
/* dead and requeue: $1 to $3 (they read any relation with the columns, a view too: no xmin). */
#define SQL_DEAD_ROWS SQL_DEAD_ROWS_WHERE("")
/* The confirmation's count and purge-dead: $4 too. */
#define SQL_DEAD_ROWS_COUNTED                                                                      \
    SQL_DEAD_ROWS_WHERE(" AND ($4::pg_catalog.pg_snapshot IS NULL OR"                              \
                        " pg_catalog.pg_visible_in_snapshot(" DEAD_XMIN_FULL                       \
                        ", $4::pg_catalog.pg_snapshot))")
/* Why a copy is parked (a retry time of 'infinity', SQL_DEAD below): the relay parks it for this
 * reason alone, said in the row's copy failure (produce.c, copy_unfit) and by outbox-relay dead
 * (admin.c), long after the error line that said it may have rotated away. */
#define DEAD_COPY_PARKED_WHY "too large for the dead-letter topic even without its payload"
/* The state of a dead event's copy to the dead-letter topic (DeadCopy's words) is read from what
 * the relay records: dead_letter_topic once published (SQL_MARK_DEAD_LETTERED), a retry time when
 * a publication failed (SQL_MARK_DEAD_LETTER_FAILED; 'infinity' when parked as too large for the
 * topic even without its payload), neither before the first try (death clears the retry time; no
 * copy is tried without --dead-letter-topic). last_error stays the death's reason, so these
 * columns are what tells the states apart once the relay's log line has rotated away. */
#define SQL_DEAD                                                                                   \
    "SELECT {seq}, {event_id}, {aggregate_type}, {aggregate_id}, {event_type}, attempts,"          \
    " rejections, pg_catalog.to_char(dead_at AT TIME ZONE 'UTC', "                                 \
    "'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),"                                                           \
    " coalesce(dead_letter_topic, ''), coalesce(last_error, ''),"                                  \
    " CASE WHEN dead_letter_topic IS NOT NULL THEN 'published' WHEN next_attempt_at IS NULL"       \
    " THEN 'pending' WHEN next_attempt_at = 'infinity' THEN 'parked' ELSE 'retrying' END,"         \
    " CASE WHEN dead_letter_topic IS NULL AND next_attempt_at < 'infinity' THEN"                   \
    " pg_catalog.to_char(next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"    \
    " ELSE '' END" SQL_DEAD_ROWS
/* How many dead events there are, up to $3 (purge-dead --all's confirmation: $1, $2, $4 NULL),
 * and the statement's snapshot, which the count read: the purge's $4 (SQL_DEAD_ROWS_COUNTED). */
#define SQL_DEAD_COUNT                                                                             \
    "SELECT pg_catalog.count(*), pg_catalog.pg_current_snapshot()::text"                           \
    " FROM (SELECT {seq} AS seq" SQL_DEAD_ROWS_COUNTED ") d"
/* The batch's rows (SQL_DEAD_ROWS or SQL_DEAD_ROWS_COUNTED), locked (b); the change (c) returns
 * their count and the last {seq}. */
#define SQL_DEAD_BATCH(rows) "WITH b AS (SELECT {seq} AS seq" rows " FOR UPDATE)"
#define SQL_DEAD_CHANGED " SELECT pg_catalog.count(*), pg_catalog.max(seq) FROM c"
#define SQL_REQUEUE                                                                                \
    SQL_DEAD_BATCH(SQL_DEAD_ROWS)                                                                  \
    ", c AS (UPDATE {table} o SET dead_at = NULL, rejections = 0,"                                 \
    " next_attempt_at = NULL, dead_letter_topic = NULL FROM b WHERE o.{seq} = b.seq"               \
    " RETURNING b.seq)" SQL_DEAD_CHANGED
/* Deleting a dead event gives up on it for good; like requeue it touches dead rows only. */
#define SQL_PURGE_DEAD                                                                             \
    SQL_DEAD_BATCH(SQL_DEAD_ROWS_COUNTED)                                                          \
    ", c AS (DELETE FROM {table} o USING b WHERE o.{seq} = b.seq RETURNING "                       \
    "b.seq)" SQL_DEAD_CHANGED

/* ---- upkeep (relay/service/upkeep.c): its own connection ---- */

/* The oldest snapshot holding back vacuum: a session's xmin or transaction id, the older (a long
 * or forgotten transaction, a standby's hot_standby_feedback through its walsender: a READ
 * COMMITTED writer idle in its transaction has no xmin between statements, but its id holds
 * vacuum back as well, and read by xmin alone a producer's forgotten BEGIN was never named), a
 * replication slot's xmin, or a prepared transaction; and whether the holder of kind $1, id $2
 * and start $3 (the one upkeep last logged, '' for none) holds one still: the oldest by xids may
 * be another while it does, and saying that it no longer held was false. The start (last column:
 * a session's xact_start, a prepared transaction's prepare time, as exact epoch text; '' for a
 * slot or a walsender, which have none) tells a holder's next transaction from the one logged:
 * by kind and id alone, a backend logged that ended its transaction and began another while a
 * younger holder was the oldest still "held", and its new transaction, once past --horizon-warn
 * and the oldest again, was never logged. Then the next transaction id (64
 * bits, the snapshot's xmax), by which upkeep dates a slot's xmin: PostgreSQL keeps no start for a
 * slot's snapshot (note_horizon), nor for a walsender's, in no transaction (secs NULL: a standby's
 * feedback without a slot, which, timed from the walsender's backend_start, held as long as the
 * standby was connected); last, the holder's xmin (32 bits), placed against that id, not against
 * age(), which counts from the next id to be assigned: past transactions still in flight, so that
 * xmax - age fell before a slot whose xmin was past every commit. Ties go by kind and id, so that
 * one holder answers each look. A lazy VACUUM's session (an autovacuum worker, or a VACUUM
 * statement: pg_stat_progress_vacuum) is no holder: PostgreSQL's horizon skips a process in
 * VACUUM, yet its snapshot, older than any taken since it began, was the oldest by xids, named
 * for as long as it ran (an autovacuum of a large table: minutes to hours) in the place of a
 * holder behind it. Rows of other roles' sessions show only to a role with pg_read_all_stats
 * (docs/operations.md#dead-rows-and-old-snapshots). After the holder's start, the server's
 * identity: its system identifier, and its current WAL file's name, whose first 8 digits are its
 * timeline ('' on a standby, where pg_walfile_name fails): a promoted standby (a new timeline) is
 * another server even once its next transaction id has passed the old server's last. */
#define SQL_HORIZON                                                                                \
    "WITH h AS ("                                                                                  \
    " SELECT 'session' AS kind, a.pid::text AS who, coalesce(a.application_name, '') AS app,"      \
    " coalesce(a.state, '') AS state,"                                                             \
    " extract(epoch FROM pg_catalog.now() - a.xact_start)::float8 AS secs,"                        \
    " pg_catalog.age(x.x)::bigint AS xids, x.x::text::bigint AS xmin,"                             \
    " coalesce(extract(epoch FROM a.xact_start)::text, '') AS start"                               \
    " FROM pg_stat_activity a CROSS JOIN LATERAL (SELECT CASE WHEN a.backend_xmin IS NULL"         \
    " OR pg_catalog.age(a.backend_xid) > pg_catalog.age(a.backend_xmin) THEN a.backend_xid"        \
    " ELSE a.backend_xmin END AS x) x"                                                             \
    " WHERE x.x IS NOT NULL AND a.pid <> pg_catalog.pg_backend_pid() AND NOT EXISTS (SELECT"       \
    " FROM pg_catalog.pg_stat_progress_vacuum v WHERE v.pid = a.pid)"                              \
    " UNION ALL SELECT 'replication slot', s.slot_name::text, '', CASE WHEN s.active THEN "        \
    "'active'"                                                                                     \
    " ELSE 'inactive' END, NULL, pg_catalog.age(s.xmin)::bigint, s.xmin::text::bigint, ''"         \
    " FROM pg_replication_slots s WHERE s.xmin IS NOT NULL"                                        \
    " UNION ALL SELECT 'prepared transaction', p.gid, '', 'prepared',"                             \
    " extract(epoch FROM pg_catalog.now() - p.prepared)::float8, "                                 \
    "pg_catalog.age(p.transaction)::bigint, p.transaction::text::bigint,"                          \
    " extract(epoch FROM p.prepared)::text"                                                        \
    " FROM pg_prepared_xacts p)"                                                                   \
    " SELECT kind, who, app, state, secs, xids,"                                                   \
    " EXISTS (SELECT 1 FROM h l WHERE l.kind = $1::text AND l.who = $2::text"                      \
    " AND l.start = $3::text),"                                                                    \
    " pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint, xmin, start,"   \
    " (SELECT c.system_identifier::text FROM pg_catalog.pg_control_system() c),"                   \
    " CASE WHEN pg_catalog.pg_is_in_recovery() THEN '' ELSE"                                       \
    " pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()) END"                             \
    " FROM h"                                                                                      \
    " ORDER BY xids DESC, kind, who LIMIT 1"

/* Sent rows older than $1 seconds, at most `batch` (a number, as text) of them per statement,
 * the oldest first from $2 on (a timestamptz: '-infinity' at a sweep's start, then the last
 * batch's newest sent_at, which the statement returns with its count, in UTC to the microsecond,
 * ISO 8601: NULL for an infinite one). Sent rows only
 * (dead-lettered rows have no sent_at and stay until requeued or purged). Rows another relay is
 * deleting right now are skipped, not waited for. A template.
 *
 * Why so: as `DELETE ... WHERE {seq} IN (SELECT ... LIMIT n)` the planner made the IN a hash
 * join over a sequential scan of the whole table, and each batch's SELECT began again at the
 * oldest row, walking every version the sweep had deleted so far (an old snapshot keeps them):
 * each batch cost the table, and a sweep grew with the square of the rows it deleted (test 81
 * part 5: 20,000 rows deleted beside 60,000 unsent read 1.4 million rows by sequential scans and
 * 233,000 sent_at index entries). In sent_at order from the last batch's end, the index of
 * migrations/0005 reads each row once; ids as an array find their rows by the primary key (the
 * planner does not know the array's size). Ties at $2 are read again: a few dead entries for the
 * relay's marks (clock_timestamp(), one a row), but rows marked by one statement's now() share
 * one sent_at, and a sweep through k of them reads k * k / 2,000 (docs/debezium.md marks an
 * adopted table's rows with clock_timestamp() for that). Rows skipped as locked wait for the
 * next sweep. Measured, an old snapshot held, runs interleaved:
 * 300,000 old sent rows beside 300,000 dead-lettered ones took 7.8-10.5 s a sweep, now 1.7-2.0;
 * 600,000 beside 400,000 took 58 s, now 7-9.
 * The newest sent_at is returned in a form that reads back the same whatever the session's
 * DateStyle and TimeZone: as the server's default text, 'SQL' style in India's time read "IST"
 * back as Israel's, three and a half hours later, and each sweep ended after its first batch
 * (test 81 part 6). */
/* Before SQL_RETENTION, in its pipeline (one implicit transaction, so these last for it alone):
 * walk the sent_at index in order instead of collecting and sorting every old row. On a table
 * without statistics (autovacuum off for it, or just after pg_upgrade, which does not carry them
 * over) the planner's estimate of the old rows is a fixed 0.5 % of the table, and its cheapest
 * plan was a bitmap scan of all of them and a sort, every batch: a sweep grew with the square of
 * the rows it deleted (test 81 part 8: 20,000 rows, 630,000 index entries read). */
#define SQL_RETENTION_PLAN                                                                         \
    "SELECT pg_catalog.set_config('enable_sort', 'off', true),"                                    \
    " pg_catalog.set_config('enable_bitmapscan', 'off', true)"
#define SQL_RETENTION(batch)                                                                       \
    "WITH d AS (DELETE FROM {table} WHERE {seq} = ANY(ARRAY(SELECT {seq} FROM {table}"             \
    " WHERE sent_at < pg_catalog.now() - pg_catalog.make_interval(secs => $1::float8)"             \
    " AND sent_at >= $2::timestamptz ORDER BY sent_at"                                             \
    " LIMIT " batch " FOR UPDATE SKIP LOCKED)) RETURNING sent_at)"                                 \
    " SELECT pg_catalog.count(*), pg_catalog.to_char(pg_catalog.max(sent_at)::timestamptz"         \
    " AT TIME ZONE 'UTC', " SQL_ISO_UTC ") FROM d"

/* Whether retention keeps up (upkeep.c, the gauge outbox_retention_overdue_seconds): the age in
 * seconds of the oldest sent row (database clock; no row: none). One entry of the sent_at index
 * (Limit, Index Only Scan, whatever the table's size or statistics), plus the entries of rows
 * deleted that an old snapshot keeps, as the sweep's own batches walk them. Epochs apart, not
 * now() - sent_at: PostgreSQL 15 cannot subtract an infinite timestamp, and one row sent at
 * -infinity (held locked) or at infinity (the only sent row once retention deleted the rest: a
 * quiet spell, a Kafka outage) failed the read for good, and with it every backlog gauge of the
 * refresh (upkeep.c). Its age is then Infinity (overdue: retention cannot delete it) or
 * -Infinity (not due). */
#define SQL_RETENTION_OLDEST                                                                       \
    "SELECT (extract(epoch FROM pg_catalog.now()) OPERATOR(pg_catalog.-) extract(epoch FROM "      \
    "sent_at))::float8 FROM {table} WHERE sent_at IS NOT NULL ORDER BY sent_at LIMIT 1"

/* ---- verify (relay/cmd/verify.c) ---- */

/* The rows marked sent in the last $1 seconds, in order: seq, event id, aggregate, event type; at
 * most $2 of them (verify asks for one more than --max-rows, and refuses a window that fills it:
 * the result is bounded whatever the window holds). */
#define SQL_VERIFY_ROWS                                                                            \
    "SELECT {seq}, {event_id}::text, coalesce({aggregate_type}::text, ''),"                        \
    " coalesce({aggregate_id}::text, ''), coalesce({event_type}::text, '') FROM {table}"           \
    " WHERE sent_at >= pg_catalog.now() - pg_catalog.make_interval(secs => $1::float8) ORDER BY "  \
    "{seq} LIMIT $2::int8"
/* The database's clock, in milliseconds since the epoch. */
#define SQL_VERIFY_NOW "SELECT (extract(epoch FROM pg_catalog.now()) * 1000::numeric)::bigint"
/* For each event id of the array $1, in order, whether a row of the table has it. Through the
 * index on the column when it holds text (the cast is then none); for a uuid column, see
 * SQL_VERIFY_KNOWN_UUIDS. */
#define SQL_VERIFY_KNOWN_IDS                                                                       \
    "SELECT EXISTS (SELECT 1 FROM {table} o WHERE o.{event_id}::text = x.id)"                      \
    " FROM pg_catalog.unnest($1::text[]) WITH ORDINALITY AS x(id, n) ORDER BY x.n"
/* Whether the event id column is a uuid (the relay's own table: migrations/0001). The oids are
 * compared as oids: oid = regclass would be an exact match for a look-alike operator on the
 * search_path (docs/security.md). */
#define SQL_VERIFY_EVENT_ID_IS_UUID                                                                \
    "SELECT a.atttypid = 'pg_catalog.uuid'::pg_catalog.regtype::pg_catalog.oid"                    \
    " FROM pg_catalog.pg_attribute a"                                                              \
    " WHERE a.attrelid = {table_text}::pg_catalog.regclass::pg_catalog.oid"                        \
    " AND a.attname = {event_id_text} AND NOT a.attisdropped"
/* SQL_VERIFY_KNOWN_IDS for a uuid column, through its unique index: compared as text, each id
 * was a scan of the whole table (0.2 s a lookup at a million rows, and every message before the
 * window is looked up). An id in the canonical text form, the only one uuid::text gives and so
 * the only one a row's message carries, is compared as a uuid; any other is no row's, as the text
 * comparison found too (CASE: the cast is never tried on it). */
#define SQL_VERIFY_KNOWN_UUIDS                                                                     \
    "SELECT CASE WHEN x.id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'"     \
    " THEN EXISTS (SELECT 1 FROM {table} o WHERE o.{event_id} = x.id::pg_catalog.uuid)"            \
    " ELSE false END"                                                                              \
    " FROM pg_catalog.unnest($1::text[]) WITH ORDINALITY AS x(id, n) ORDER BY x.n"

#endif
