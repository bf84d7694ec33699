#include "statements.h"

#include "diagnose.h"
#include "table.h"

/* The statements on the outbox table are templates: relay/outbox/table.h expands the {placeholders}
 * to the configured table and columns when the connection is up.
 *
 * The claim: unsent rows of the lanes this relay owns ($2), in seq order, that are not waiting for
 * a retry and whose aggregate has no earlier row that is waiting (or, with the hold policy, dead):
 * an aggregate's events never overtake one another. Aggregates are compared as the lanes hash
 * them, NULL as '' (adopted tables may allow NULL ids, and NULL = NULL would hold nothing back).
 * The held-back set comes from the small partial index on failed rows, so it costs nothing while
 * nothing fails. Rows of the aggregate types in $6 are left out whole (the session's hold while
 * Kafka refuses their topic, engine.h TopicHold; '{}' holds none): a filter on the rows the
 * index scan returns, which changes no index the claim reads. Its columns are CLAIM_COLUMNS
 * (below).  */
/* clang-format would split the macro calls inside the string concatenations. */
/* clang-format off */
/* The failed rows (attempts > 0, unsent) that match condition, read from the small retry index
 * whatever the table's statistics say. Both partial indexes cover such rows, and on a fresh or
 * stale table the planner costs them alike; but below the last claimed row the unsent index holds
 * every version sent or deleted since vacuum last ran, which an old snapshot elsewhere keeps
 * (measured: 35 ms and 3,200 pages a look after 200,000 rows were sent under an open REPEATABLE
 * READ transaction, against 0.07 ms and 2 pages on the retry index). Only the retry index returns
 * the rows in this ORDER BY; under the claim's planner settings (SQL_CLAIM_PLAN: no sort) every
 * other plan costs a sort it may not do. 31_stale_statistics keeps it so. */
#define SQL_FAILED_ROWS(columns, condition)                                                        \
    "SELECT " columns " FROM {table} o WHERE o.sent_at IS NULL AND o.attempts > 0 AND " condition  \
    " ORDER BY o.{aggregate_type}, o.{aggregate_id}, o.{seq}"
/* The ids of the first $1 of those rows in {seq} order (sorted after the read: they are few). */
#define SQL_FAILED_IN_ORDER(condition)                                                             \
    "ARRAY(SELECT f.{seq} FROM (" SQL_FAILED_ROWS("o.{seq}", condition) ") f ORDER BY 1 LIMIT $1)"
/* The held-back aggregates as one value, {key: first held {seq}} (NULL when none), in which each
 * unsent row looks its aggregate up (SQL_CLAIMABLE: a binary search in the object's sorted keys,
 * and nothing at all while nothing is held back). As rows that the claim anti-joined, they left
 * PostgreSQL one plan that keeps the claim's index order (SQL_CLAIM_PLAN: no sort; a hash join's
 * output has none): a nested loop comparing every candidate row with every held-back aggregate,
 * whatever the statistics said. With 1,000 aggregates held back that was 800,000 comparisons and
 * 412 ms a claim of 800 (pgbench, median), 2.6 s with 10,000, exactly when a relay recovers from
 * a topic outage that failed many aggregates; this value, built once (an InitPlan), makes them
 * 25 and 77 ms, and costs nothing measurable with none held back
 * (docs/benchmarks-delete-replay.md). 31_stale_statistics keeps it so. One level, not {type: {id: seq}}:
 * PostgreSQL 15's jsonb_object_agg copies each string of a jsonb value it is given with a
 * snprintf("%s") that reads on to the next zero byte, past the following keys, so an object of
 * objects took time quadratic in the ids of one type: 1.8 s with 40,000 held back, 23 s with
 * 100,000 (ids of 64 bytes; one level 0.28 and 0.56 s), over --session-timeout, which gave every
 * claim up (test 31_many_held_aggregates). The key is SQL_AGG_KEY: the type's length, ':', the
 * type, the id, which no other pair gives. The look-up compares keys byte for byte, as the relay
 * compares aggregates everywhere else (batch.c): so they are grouped byte for byte too (COLLATE
 * "C"). Grouped under a column's nondeterministic collation (an adopted table's, case-insensitive
 * say), 'A' and 'a' made one entry named by either, and the rows of the other found nothing held
 * back, behind a failed row of their own id (test 37_nondeterministic_collation). */
#define SQL_AGG_KEY(x)                                                                             \
    "(pg_catalog.length(coalesce(" x ".{aggregate_type}::text, ''))::text || ':'::text"           \
    " || coalesce(" x ".{aggregate_type}::text, '') || coalesce(" x ".{aggregate_id}::text, ''))"
#define SQL_BLOCKED(blocked_condition)                                                             \
    "WITH blocked AS MATERIALIZED (SELECT pg_catalog.jsonb_object_agg(h.k, h.first_seq) AS m"      \
    " FROM (SELECT " SQL_AGG_KEY("f") " COLLATE pg_catalog.\"C\" AS k,"                          \
    " pg_catalog.min(f.{seq}) AS first_seq"                                                        \
    " FROM (" SQL_FAILED_ROWS("o.{aggregate_type}, o.{aggregate_id}, o.{seq}",                     \
                              "o.lane = ANY($2::smallint[]) AND " blocked_condition) ") f"         \
    " GROUP BY 1) h)"
#define SQL_CLAIMABLE                                                                              \
    " o.sent_at IS NULL AND o.dead_at IS NULL AND o.lane = ANY($2::smallint[])"                    \
    " AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= pg_catalog.now())"                               \
    " AND coalesce(o.{aggregate_type}::text, '') <> ALL($6::text[])"                               \
    " AND ((SELECT b.m FROM blocked b) IS NULL OR NOT coalesce(((SELECT b.m FROM blocked b)"         \
    " ->> " SQL_AGG_KEY("o") ")::bigint < o.{seq}, false))"

/* The plain claim locks the rows in order and waits for a row someone else has locked, at most
 * CLAIM_LOCK_TIMEOUT_MS. It does not skip locked rows: lanes already keep other relays (and the
 * other sessions) off this session's rows, so a locked row is someone else's — an operator's open
 * UPDATE, a report's FOR SHARE, a foreign key check — and skipping it would publish the later
 * events of its aggregate first (docs/guarantees.md). A claim that runs into the timeout fails with 55P03
 * and the session claims around locked rows for a while (SQL_CLAIM_AROUND_LOCKS). */
/*
 * The claim starts at the session's floor ($5, checked by FLOOR_GUARD; floor.h): rows from the
 * floor on come from the unsent index (above), failed rows below it from the small retry index
 * (below: requeued and retried events, SQL_FAILED_IN_ORDER: the first $1 claimable ones in {seq} order,
 * which an index look-up then locks). Below the floor the unsent index holds only versions that are
 * sent, or deleted, and that vacuum may not remove yet (an old snapshot elsewhere): walking them
 * was what made claims slow down with every minute such a snapshot stayed (docs/operations.md#dead-rows-and-old-snapshots). Every row
 * below the floor sorts before every row above it, so the two parts, each locked in order, make
 * one batch in {seq} order. */
#define SQL_CLAIM_PART(name, condition, order)                                                     \
    " " name " AS (SELECT" CLAIM_COLUMNS("NULL::text") " FROM {table} o WHERE " condition          \
    " AND" SQL_CLAIMABLE " ORDER BY " order " LIMIT $1 FOR UPDATE OF o)"
/* $5 is the floor and what it was computed against, as a bigint[] (floor_param): {floor, the
 * table's relfilenode, the oid of the sequence of {seq}, its relfilenode, its last value}, as the
 * floor's last look saw them. A reset of the table or the sequence between that look and this
 * claim (TRUNCATE, TRUNCATE ... RESTART IDENTITY, ALTER SEQUENCE ... RESTART replace a
 * relfilenode; setval down leaves a lower last value) lets new rows be drawn below the floor with
 * attempts 0: a claim on the old floor would send an aggregate's rows above it before its rows
 * below it. So the claim checks, and reads from the table's start (floor 0) when anything
 * differs; the next look starts the floor again (floor.h). pg_sequence_last_value comes first: it
 * locks the sequence (taking in the catalog's changes when the lock is new), so the relfilenode
 * read after it is current and stays so to the end of the transaction (ALTER SEQUENCE waits for
 * the lock; TRUNCATE for the claim's lock on the table). Without SELECT or USAGE on the sequence
 * (a REVOKE the next look turns the floor off for) it reads from 0 rather than fail. All of it
 * costs catalog cache look-ups and one read of the sequence's page, only when the floor is up. */
#define FLOOR_GUARD                                                                                \
    " floor_at AS MATERIALIZED (SELECT CASE WHEN f.p[1] <= 0 THEN 0::bigint"                       \
    " WHEN NOT coalesce(pg_catalog.has_sequence_privilege(f.p[3]::pg_catalog.oid,"                 \
    " 'SELECT, USAGE'), false) THEN 0::bigint"                                                     \
    " WHEN coalesce(pg_catalog.pg_sequence_last_value("                                            \
    "f.p[3]::pg_catalog.oid::pg_catalog.regclass), -1::bigint) < f.p[5] THEN 0::bigint"            \
    " WHEN coalesce(pg_catalog.pg_relation_filenode({table_text}::pg_catalog.regclass)::bigint,"   \
    " 0::bigint) <> f.p[2] OR coalesce(pg_catalog.pg_relation_filenode("                           \
    "f.p[3]::pg_catalog.oid::pg_catalog.regclass)::bigint, 0::bigint) <> f.p[4] THEN 0::bigint"    \
    " ELSE f.p[1] END AS at FROM (SELECT $5::bigint[] AS p) f)"
#define FLOOR_AT "(SELECT g.at FROM floor_at g)"
#define SQL_CLAIM(blocked_condition)                                                               \
    SQL_BLOCKED(blocked_condition) "," FLOOR_GUARD ","                                             \
    SQL_CLAIM_PART("above", "o.{seq} >= " FLOOR_AT, "o.{seq}") ","                                 \
    SQL_CLAIM_PART("below", "o.{seq} = ANY(" SQL_FAILED_IN_ORDER("o.{seq} < " FLOOR_AT " AND"      \
                   SQL_CLAIMABLE) ") AND o.attempts > 0", "o.{seq}")                               \
    " SELECT * FROM (SELECT * FROM below UNION ALL SELECT * FROM above) c ORDER BY 1 LIMIT $1"

/* Around locked rows: the aggregates with a row locked by a running transaction among the next
 * $5 rows (the window; busy: a row's xmax is its locker's transaction id while one transaction
 * holds it, and that transaction holds a lock on its own id in pg_locks) are left out from that
 * row on, before the LIMIT, so a locked aggregate with a long tail cannot fill the batch and
 * stall the others. The claim still waits for (and times out on) a lock it did not see — one
 * beyond the window, one several transactions share (xmax is then a multixact) or one taken
 * meanwhile — rather than skip it: that keeps order. The session then doubles the window
 * (claim.c), so a lock anywhere in the backlog is found in a few rounds, whatever the row limit.
 * It returns the rows as locked, rechecked by PostgreSQL like any FOR UPDATE. It runs at 0.5-0.7
 * times the plain claim's rate (pgbench, 1,000-row claims over 200,000 unsent rows), hence only
 * while locks are there: SQL_FIND_LOCKER, in the same transaction, says when they are gone.
 * Aggregates are grouped and matched byte for byte (COLLATE "C"), as blocked and the recheck
 * group them: under a column's nondeterministic collation (an adopted table's, case-insensitive
 * say) a lock on a row of 'a' also held back 'A', another Kafka key, for as long as it lasted
 * (test 37_nondeterministic_collation). */
#define SQL_CLAIM_AROUND_LOCKS(blocked_condition)                                                  \
    SQL_BLOCKED(blocked_condition) ","                                                             \
    " busy AS MATERIALIZED (SELECT h.agg_type, h.agg_id, pg_catalog.min(h.seq) AS first_seq"                  \
    " FROM (SELECT o.{seq} AS seq, o.xmax, coalesce(o.{aggregate_type}::text, '')"                 \
    " COLLATE pg_catalog.\"C\" AS agg_type, coalesce(o.{aggregate_id}::text, '')"                  \
    " COLLATE pg_catalog.\"C\" AS agg_id FROM {table} o"                                          \
    " WHERE o.sent_at IS NULL AND o.dead_at IS NULL AND o.lane = ANY($2::smallint[])"              \
    " ORDER BY o.{seq} LIMIT $5::bigint) h"                                         \
    " JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = h.xmax"                \
    " AND l.granted AND l.pid <> pg_catalog.pg_backend_pid() GROUP BY 1, 2)"                                  \
    " SELECT" CLAIM_COLUMNS("NULL::text") " FROM {table} o WHERE" SQL_CLAIMABLE                    \
    " AND NOT EXISTS (SELECT 1 FROM busy k"                                                        \
    " WHERE k.agg_type = coalesce(o.{aggregate_type}::text, '') COLLATE pg_catalog.\"C\""           \
    " AND k.agg_id = coalesce(o.{aggregate_id}::text, '') COLLATE pg_catalog.\"C\""                 \
    " AND k.first_seq <= o.{seq})"                                                                 \
    " ORDER BY o.{seq} LIMIT $1 FOR UPDATE OF o"

/* The claim's recheck, the statement after it in its transaction. A claim that waits for a row
 * another transaction holds gets that row as the transaction left it: PostgreSQL rechecks the
 * locked row, and only it, against the claim's conditions, and drops it when it no longer passes.
 * But the claim read which aggregates are held back (blocked, above) at its own snapshot, from
 * before that transaction committed: when it made the row wait for a retry or dead-lettered it
 * (an operator's UPDATE, with attempts > 0 as migrations/0008's CHECK requires), the claim goes
 * on with the aggregate's later rows, and they were published first. This statement, with a
 * snapshot of its own, returns the aggregates of the lanes ($1) held back by a row whose
 * version committed after SQL_CLAIM_PLAN's snapshot (earlier than the claim's: a superset),
 * with that row's {seq}; the session leaves its claimed rows of those aggregates unpublished for
 * this batch (claim.c). A row recorded before that snapshot was seen by the claim itself. Its
 * xmin is compared with the snapshot as 32-bit ids (age() orders them modulo 2^32, which holds
 * for any transaction younger than 2^31), and only within the window a new row's can be in: from
 * that snapshot's xmin up to this statement's own snapshot's xmax (every row it sees committed
 * below it, a savepoint's too). A frozen row keeps its xmin as it was (the xmin column shows
 * it), and once 2^31 transactions have passed it, age() calls it younger than any: without the
 * upper bound, 1,000 such rows still holding their aggregates (dead-lettered under --on-poison
 * hold) made every answer full and surely new, and every batch was held, claim after claim,
 * with nothing sent. A version written in a savepoint (psql's ON_ERROR_ROLLBACK, JDBC's autosave, an ORM's nested transaction) has
 * the savepoint's id as its xmin, which the snapshot does not list (pg_snapshot_xip has top-level
 * ids only) and which is below its xmax once any later transaction committed first: so every
 * row with an xmin at or after the snapshot's xmin (the oldest transaction then running, the
 * savepoint's parent's at the latest) is returned, the 4th column saying whether it is surely
 * new (in xip, or at or after xmax), those first. The others were mostly seen by the claim and
 * hold nothing back (it took none of their aggregates' later rows); they must not make a full
 * answer hold the whole batch (claim.c), or an old snapshot elsewhere with many failed
 * aggregates would stall the session: only surely new rows that may have been left out do. It
 * reads the small retry index as blocked does, so it costs next to nothing while nothing fails,
 * and about what blocked costs while failed rows wait (measured with pgbench, one client,
 * 200,000 unsent rows: 0.06 ms a claim with none; with 2,000 waiting 1.3-1.6 ms, blocked's own
 * look 1.6-2.9 ms), and returns surely new rows only when a transaction of someone else's
 * recorded a failure during the claim; at most $2 rows (a full answer whose last row is surely
 * new: the session holds the whole batch back). Only the rows' xmin tells which are new, and it is in the heap, not in the index: a cheaper recheck would need
 * to know whether the claim waited for a lock at all, which PostgreSQL does not say. The
 * aggregates are grouped byte for byte (COLLATE "C"), as claim.c rechecked_holder matches them
 * (strcmp) and as blocked groups them: under a column's nondeterministic collation (an adopted
 * table's, case-insensitive say) 'A' and 'a' made one group named by either, and the claimed
 * later rows of the other went out before its failed one (test 37_nondeterministic_collation). */
#define CLAIM_SNAPSHOT_XID(x) "(" x "::text::bigint % 4294967296)::text::xid"
#define CLAIM_SNAPSHOT_IDS                                                                         \
    "n AS MATERIALIZED (SELECT ARRAY(SELECT " CLAIM_SNAPSHOT_XID("x.v")                            \
    " FROM pg_catalog.pg_snapshot_xip(p.s) AS x(v)) AS xip,"                                       \
    " " CLAIM_SNAPSHOT_XID("pg_catalog.pg_snapshot_xmax(p.s)") " AS xmax,"                         \
    " " CLAIM_SNAPSHOT_XID("pg_catalog.pg_snapshot_xmin(p.s)") " AS xmin,"                         \
    " " CLAIM_SNAPSHOT_XID("pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())")        \
    " AS now_xmax"                                                                                 \
    " FROM (SELECT pg_catalog.current_setting('" CLAIM_SNAPSHOT_SETTING "')::pg_catalog.pg_snapshot" \
    " AS s) p)"
#define SQL_CLAIM_RECHECK(blocked_condition)                                                       \
    "WITH " CLAIM_SNAPSHOT_IDS " SELECT coalesce(f.{aggregate_type}::text, '')"                    \
    " COLLATE pg_catalog.\"C\", coalesce(f.{aggregate_id}::text, '') COLLATE pg_catalog.\"C\","    \
    " pg_catalog.min(f.{seq}), pg_catalog.bool_or("                                               \
    "f.xmin = ANY(n.xip) OR pg_catalog.age(f.xmin) <= pg_catalog.age(n.xmax))"                    \
    " FROM (" SQL_FAILED_ROWS("o.{aggregate_type}, o.{aggregate_id}, o.{seq}, o.xmin",            \
                              "o.lane = ANY($1::smallint[]) AND " blocked_condition) ") f, n"     \
    " WHERE pg_catalog.age(f.xmin) <= pg_catalog.age(n.xmin)"                                      \
    " AND pg_catalog.age(f.xmin) > pg_catalog.age(n.now_xmax)"                                      \
    " GROUP BY 1, 2 ORDER BY 4 DESC LIMIT $2::bigint"

/* The rows of a claim (rows_query returns CLAIM_COLUMNS in seq order) up to the byte budget: the
 * first row always, then rows while the bytes so far stay within $3 (the session's share of
 * --batch-bytes). A row's bytes are every column that becomes part of its message: the payload,
 * the headers column, the additional fields, the event id, the key (aggregate id), the aggregate
 * and event types and the event time. Rows left out stay locked but untouched until the commit,
 * and come first in the next claim. A row whose message would be over $4 (the producer's
 * message.max.bytes) cannot be sent: its large columns (payload, headers, additional fields, and
 * any of the others over MESSAGE_ID_MAX bytes) are not returned (NULL) and cost only what is
 * returned of the budget; its size comes as the last column (NULL for the other rows: a value
 * there costs memory in every result held), which the relay reads to fail the row. Memory is
 * bounded by configuration, not by the data, whichever column holds the bytes.
 * Converting a payload to text is what costs (measured: 1,000 claimed rows of 500 KB took over a
 * minute a claim when all were converted to find the 16 that fit), so rows_query hands the
 * payloads over as stored, p drops the rows that start beyond the budget by their stored sizes
 * (pg_column_size: no detoasting), and only the rest is converted (s, kept apart by OFFSET 0 so
 * the conversion is not repeated in w) and cut exactly by its text size (w; a bytea payload,
 * --payload-format binary, by its hex text, \x and two digits a byte, as the result holds it until
 * batch.c decodes it in place, while too_big compares its bytes with $4). held, a sum of
 * bigints, is numeric and is compared with the budget as numeric: PostgreSQL has no numeric <=
 * bigint, and one planted in the schema would be chosen over the cast (docs/security.md).
 * Envelope fields (Debezium's envelope placement) ride the same way: rows_query returns the
 * payload and the fields' columns as stored ({o.claim_payload}, {o.envelope_columns}), and s
 * builds the envelope ({p.payload_text}), whose text w counts whole. Built in rows_query,
 * json_build_object converted every claimed row's payload (measured with 528 KB jsonb payloads
 * and --batch-bytes 64 KiB, one row a claim: 3.4-4 times the claims' time; 88_debezium_router
 * part 6 counts the TOAST blocks read). So do the headers column ({o.claim_headers}, named
 * stored_headers) and the fields placed as headers ({o.extra_header_columns}; the claim's own
 * extra_headers column is NULL): s converts them ({p.headers_text}, {p.extra_headers_text}),
 * and w counts their texts. Converted in rows_query (o.headers::text, json_build_object), every
 * claimed row's were read whole (88_debezium_router part 7). */
#define CLAIM_COLUMNS(last_error)                                                                  \
    TABLE_ROW_COLUMNS_AS("{o.claim_payload}", "{o.claim_headers}", "NULL::text", last_error)       \
    "{o.envelope_columns}{o.extra_header_columns}"
#define ROW_NAMES                                                                                  \
    "seq, event_id, aggregate_type, aggregate_id, event_type, payload, stored_headers, attempts,"  \
    " last_error, age, no_extra_headers, created_at, msg_ts, msg_partition{envelope_names}"       \
    "{extra_header_names}"
#define MESSAGE_ID_MAX "4096" /* of a row too large: the longest id or type still returned */
/* A column of the rows of w: NULL when the row is too large and the value longer than that. */
#define BUDGET_SMALL(col)                                                                          \
    " CASE WHEN w.too_big AND pg_catalog.octet_length(w." col "::text) > " MESSAGE_ID_MAX " THEN NULL"        \
    " ELSE w." col " END"
/* The bytes of the small columns, as text (s) or as stored (p). */
#define BUDGET_OTHER_BYTES(f, x)                                                                   \
    " coalesce(" f "(" x ".event_id::text), 0) + coalesce(" f "(" x ".aggregate_type::text), 0)"   \
    " + coalesce(" f "(" x ".aggregate_id::text), 0) + coalesce(" f "(" x ".event_type::text), 0)" \
    " + coalesce(" f "(" x ".created_at), 0)"
/* A row's bytes as the result holds it: the payload's text, the small columns and the headers'
 * texts (s converts them once: v and w read its results). */
#define BUDGET_TEXT_BYTES                                                                          \
    " coalesce(pg_catalog.octet_length(s.text), 0)::bigint + s.other"                               \
    " + coalesce(pg_catalog.octet_length(s.headers), 0)"                                            \
    " + coalesce(pg_catalog.octet_length(s.extra_headers), 0)"
#define SQL_WITHIN_BUDGET(rows_query)                                                              \
    "SELECT w.seq," BUDGET_SMALL("event_id") "," BUDGET_SMALL("aggregate_type") ","                \
    BUDGET_SMALL("aggregate_id") "," BUDGET_SMALL("event_type") ","                                \
    " CASE WHEN w.too_big THEN NULL ELSE w.text END,"                                              \
    " CASE WHEN w.too_big THEN NULL ELSE w.headers END, w.attempts, w.last_error, w.age,"          \
    " CASE WHEN w.too_big THEN NULL ELSE w.extra_headers END, w.created_at, w.msg_ts,"             \
    " w.msg_partition,"                                                                            \
    " CASE WHEN w.too_big THEN w.bytes END"                                                        \
    " FROM (SELECT v.*, pg_catalog.sum(CASE WHEN v.too_big THEN 0 ELSE v.bytes + v.hex_extra END)"           \
    " OVER (ORDER BY v.seq) AS held"                                                               \
    " FROM (SELECT s.*," BUDGET_TEXT_BYTES " AS bytes,"                                            \
    " {s.payload_hex_extra} AS hex_extra," BUDGET_TEXT_BYTES " > $4::bigint AS too_big"            \
    " FROM (SELECT p.*, {p.payload_text} AS text, {p.headers_text} AS headers,"                    \
    " {p.extra_headers_text} AS extra_headers,"                                                    \
    BUDGET_OTHER_BYTES("pg_catalog.octet_length", "p") " AS other"                                            \
    " FROM (SELECT r.*, pg_catalog.row_number() OVER (ORDER BY r.seq) AS n,"                                  \
    " coalesce(pg_catalog.sum(coalesce(pg_catalog.pg_column_size(r.payload), 0) +"                                       \
    BUDGET_OTHER_BYTES("pg_catalog.pg_column_size", "r")                                           \
    " + coalesce(pg_catalog.pg_column_size(r.stored_headers), 0)"                                  \
    "{r.envelope_bytes}{r.extra_header_bytes}) OVER (ORDER BY r.seq"                               \
    " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before"                             \
    " FROM (" rows_query ") AS r(" ROW_NAMES ")) p"                                                \
    " WHERE p.n = 1 OR p.before < $3::bigint OFFSET 0) s) v) w"                                    \
    " WHERE w.n = 1 OR w.held <= $3::bigint::numeric ORDER BY w.seq"

/* Which transaction holds the first locked row among the next $1 unsent ones (the window of the
 * claim around locks it follows, in the same transaction: rows this session locked are left
 * out), for the log and to end the claims around locks once no row there is locked: a row's
 * xmax is the locker's transaction id while a single transaction locks or updates it. */
#define SQL_LOCKED_BY                                                                              \
    "SELECT o.{seq}, l.pid FROM (SELECT o.{seq}, o.xmax FROM {table} o"                            \
    " WHERE o.sent_at IS NULL AND o.dead_at IS NULL AND o.lane = ANY($2::smallint[])"              \
    " ORDER BY o.{seq} LIMIT $1) o JOIN pg_locks l ON l.locktype = 'transactionid'"                \
    " AND l.transactionid = o.xmax AND l.granted AND l.pid <> pg_catalog.pg_backend_pid()"                    \
    " ORDER BY o.{seq} LIMIT 1"

/* The claim floor's statements (relay/engine/floor.h says why each is safe).
 * Before the claim: the lowest failed row of the lanes ($1) that can hold its aggregate's later
 * events back (with --on-poison hold a dead one too), which the floor never passes, so the events
 * it holds back stay above the floor (SQL_FAILED_ROWS: after SQL_CLAIM_PLAN, on the retry index);
 * but for the aggregate types in $2, the claim's $6 (held while Kafka refuses their topic: their
 * rows are the probe's, read from where the hold began, engine.h TopicHold and floor.h);
 * and the last value the sequence of {seq} handed out (NULL before the first), which bounds the
 * floor's candidates: a {seq} given by hand, above the sequence, never lifts the floor; and
 * whether that sequence still hands its values out in order (the session checked it at connect,
 * SQL_FLOOR_CHECK, but ALTER SEQUENCE ... CACHE may change it while the relay runs: a session
 * that cached values would then insert rows below the floor); and the relfilenodes of the table
 * and of that sequence, which TRUNCATE (of the table), TRUNCATE ... RESTART IDENTITY and ALTER
 * SEQUENCE ... RESTART (of the sequence) replace: a reset that new rows overtook before the next
 * look leaves a last value above the one seen before, and only the new relfilenode tells; and
 * the sequence's oid, with which the claims check that nothing changed since (FLOOR_GUARD). */
#define FLOOR_SEQUENCE "pg_catalog.pg_get_serial_sequence({table_text}, {seq_text})::regclass"
#define SQL_FLOOR_HELD(holds)                                                                      \
    "SELECT (SELECT pg_catalog.min(f.{seq}) FROM ("                                                           \
    SQL_FAILED_ROWS("o.{seq}", "o.lane = ANY($1::smallint[])" holds                               \
                    " AND coalesce(o.{aggregate_type}::text, '') <> ALL($2::text[])") ") f),"     \
    " pg_catalog.pg_sequence_last_value(" FLOOR_SEQUENCE "),"                                      \
    " (SELECT q.seqcache = 1 AND NOT q.seqcycle AND q.seqincrement > 0"                            \
    " FROM pg_catalog.pg_sequence q WHERE q.seqrelid = " FLOOR_SEQUENCE "::oid),"                  \
    " (SELECT c.relfilenode FROM pg_catalog.pg_class c"                                            \
    " WHERE c.oid = {table_text}::pg_catalog.regclass::pg_catalog.oid),"                           \
    " (SELECT c.relfilenode FROM pg_catalog.pg_class c"                                            \
    " WHERE c.oid = " FLOOR_SEQUENCE "::pg_catalog.oid),"                                          \
    " " FLOOR_SEQUENCE "::pg_catalog.oid"
/* After the claim: whether the writers listed last time ($1, virtual transaction ids) have all
 * ended, and the transactions that may still add rows to the table (they hold RowExclusiveLock
 * on it: every INSERT takes it before its row's {seq} is drawn). A prepared transaction's locks
 * move to a new virtual id (pid NULL) at PREPARE TRANSACTION: while one holds a lock on the
 * table, no writer counts as ended. pg_locks is read once (MATERIALIZED): each read copies the
 * whole server's lock table under every lock-manager partition lock, stalling every database's
 * commits meanwhile (docs/architecture.md), and one read also gives both answers the same
 * moment. */
#define FLOOR_WRITERS                                                                              \
    "WITH l AS MATERIALIZED (SELECT l.virtualtransaction, l.pid, l.mode FROM pg_locks l,"          \
    " (SELECT {table_text}::regclass::oid AS oid) t,"                                              \
    " (SELECT oid FROM pg_database WHERE datname = pg_catalog.current_database()) d"               \
    " WHERE l.locktype = 'relation' AND l.database = d.oid AND l.relation = t.oid)"                \
    " SELECT NOT EXISTS (SELECT 1 FROM l"                                                          \
    " WHERE l.virtualtransaction = ANY($1::text[]) OR l.pid IS NULL),"                             \
    " ARRAY(SELECT l.virtualtransaction FROM l WHERE l.mode = 'RowExclusiveLock'"                  \
    " AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid())::text"
/* Dead events not yet published to the dead-letter topic: found on the retry index (after
 * SQL_CLAIM_PLAN, as SQL_FAILED_ROWS says), locked unless someone else holds them. */
#define DEAD_LETTER_DUE                                                                            \
    " o.dead_at IS NOT NULL AND o.sent_at IS NULL AND o.attempts > 0"                              \
    " AND o.dead_letter_topic IS NULL AND o.lane = ANY($2::smallint[])"                            \
    " AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= pg_catalog.now())"
#define SQL_CLAIM_DEAD_LETTER                                                                      \
    "SELECT" CLAIM_COLUMNS("o.last_error") " FROM {table} o"                                   \
    " WHERE o.{seq} = ANY(" SQL_FAILED_IN_ORDER(DEAD_LETTER_DUE) ") AND" DEAD_LETTER_DUE           \
    " ORDER BY o.{seq} FOR UPDATE SKIP LOCKED"
/* clang-format on */

/* What holds an aggregate's later events back: a failed event waiting for its retry, and with
 * --on-poison hold a dead one. */
#define HOLD_BLOCKS "(o.next_attempt_at > pg_catalog.now() OR o.dead_at IS NOT NULL)"
#define SKIP_BLOCKS "o.next_attempt_at > pg_catalog.now() AND o.dead_at IS NULL"

_Static_assert(SQL_CLAIM_HOLD_AROUND_LOCKS - SQL_CLAIM_HOLD ==
                   SQL_CLAIM_SKIP_AROUND_LOCKS - SQL_CLAIM_SKIP,
               "SQL_AROUND_LOCKS_OF pairs each claim with its around-locks form");

const char *const session_sql_templates[SESSION_SQL_COUNT] = {
    [SQL_CLAIM_HOLD] = SQL_WITHIN_BUDGET(SQL_CLAIM(HOLD_BLOCKS)),
    [SQL_CLAIM_SKIP] = SQL_WITHIN_BUDGET(SQL_CLAIM(SKIP_BLOCKS)),
    [SQL_CLAIM_HOLD_AROUND_LOCKS] = SQL_WITHIN_BUDGET(SQL_CLAIM_AROUND_LOCKS(HOLD_BLOCKS)),
    [SQL_CLAIM_SKIP_AROUND_LOCKS] = SQL_WITHIN_BUDGET(SQL_CLAIM_AROUND_LOCKS(SKIP_BLOCKS)),
    [SQL_FIND_LOCKER] = SQL_LOCKED_BY,
    [SQL_CLAIM_DEAD] = SQL_WITHIN_BUDGET(SQL_CLAIM_DEAD_LETTER),
    [SQL_CLAIM_RECHECK_HOLD] = SQL_CLAIM_RECHECK(HOLD_BLOCKS),
    [SQL_CLAIM_RECHECK_SKIP] = SQL_CLAIM_RECHECK(SKIP_BLOCKS),
    [SQL_FLOOR_HELD_HOLD] = SQL_FLOOR_HELD(""),
    [SQL_FLOOR_HELD_SKIP] = SQL_FLOOR_HELD(" AND o.dead_at IS NULL"),
    [SQL_FLOOR_WRITERS] = FLOOR_WRITERS,
    [SQL_FLOOR_CHECK] = DIAGNOSE_FLOOR_SQL, /* read by diagnose_floor (diagnose.h) */
    [SQL_MARK_SENT] =
        "UPDATE {table} SET sent_at = pg_catalog.clock_timestamp() WHERE {seq} = ANY($1::bigint[])",
    /* --on-sent delete: no new row version and no sent_at index entry to write, which is most
     * of what marking costs (docs/operations.md#marking-or-deleting-sent-rows). */
    [SQL_DELETE_SENT] = "DELETE FROM {table} WHERE {seq} = ANY($1::bigint[])",
    /* Times are clock_timestamp(), not now(): now() is when the claim transaction began, and a
     * retry wait counted from there could already be over when the failure is recorded. Every
     * failure counts an attempt and waits before the next one: transient failures 1 s doubling to
     * 30 s, rejections --retry-backoff doubling to --retry-backoff-max, both with jitter. The
     * max-attempts-th rejection dead-letters the event. SET expressions see the old row. Every
     * operand is cast to the type of the built-in operator it meets (float8 ^ float8, ...): one
     * that needed a cast would let a look-alike operator in the schema take the call. */
    [SQL_MARK_FAILED] =
        "UPDATE {table} AS o SET attempts = o.attempts + 1,"
        " rejections = o.rejections + f.permanent::int, last_error = f.error,"
        " dead_at = CASE WHEN f.permanent AND o.rejections + 1 >= $4::int"
        " THEN pg_catalog.clock_timestamp() END,"
        " next_attempt_at = CASE WHEN f.permanent AND o.rejections + 1 >= $4::int THEN NULL"
        " ELSE pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs =>"
        " (0.5::float8 + pg_catalog.random() / 2::float8) * CASE WHEN"
        " f.permanent THEN least($5::float8 * 2::float8 ^ least(o.rejections, 30)::float8,"
        " $6::float8)"
        " ELSE least(2::float8 ^ least(o.attempts - o.rejections, 30)::float8, 30::float8) END) END"
        " FROM unnest($1::bigint[], $2::text[], $3::bool[]) AS f(id, error, permanent)"
        " WHERE o.{seq} = f.id RETURNING o.{seq}, o.{event_id}, o.{aggregate_type},"
        " o.{aggregate_id}, o.dead_at IS NOT NULL",
    /* The dead-letter marks touch rows still dead only. The claim's row locks keep a batch's rows
     * as claimed, but a batch recorded row by row has rolled back: a `requeue` waiting for the
     * copy's row lock gets it then, and the row's own record comes after. Marked, the requeued
     * event would carry dead_letter_topic while live, and when it died again its copy would
     * never go (the dead-letter claim takes rows without one), though `dead` said it did;
     * counted as a failure, it would wait up to an hour (holding its aggregate with --on-poison
     * hold). Left alone, it goes at once as requeue promised. */
    [SQL_MARK_DEAD_LETTERED] = "UPDATE {table} SET dead_letter_topic = $2"
                               " WHERE {seq} = ANY($1::bigint[]) AND dead_at IS NOT NULL",
    /* A dead event whose publication to the dead-letter topic failed (or whose record of it the
     * row refused: then it was published, and each retry publishes it again) waits 30 s the
     * first time (no retry time yet: death clears it), then as long as it has been dead, 30 s to
     * an hour: the waits about double, and a row that can never be recorded as dead-lettered
     * costs one dead-letter message an hour, not one every 30 s. No attempt is counted: attempts
     * stays the event's own, which `dead` shows and every copy carries in dlq.attempts, however
     * many publications of it failed (the elapsed time since dead_at stands in for a count of
     * them, which no column keeps). last_error is left alone: it is why the event died, which the
     * next copy carries in dlq.error and `outbox-relay dead` shows; the publication's own error
     * is the relay's news (its log line and outbox_failures_total), not the event's. A copy
     * parked ($2: too large for the dead-letter topic even without its payload, produce.c) is
     * never retried: its retry time is infinity, which the dead-letter claim never reaches and
     * the backlog's count of failed copies still counts, until `requeue` clears it. */
    [SQL_MARK_DEAD_LETTER_FAILED] =
        "UPDATE {table} AS o SET next_attempt_at = CASE WHEN f.parked"
        " THEN 'infinity'::timestamptz ELSE pg_catalog.clock_timestamp()"
        " + pg_catalog.make_interval(secs => CASE WHEN o.next_attempt_at IS NULL THEN 30::float8"
        " ELSE least(greatest(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()"
        " - o.dead_at), 30::float8), 3600::float8) END) END"
        " FROM unnest($1::bigint[], $2::bool[]) AS f(id, parked)"
        " WHERE o.{seq} = f.id AND o.dead_at IS NOT NULL",
};
