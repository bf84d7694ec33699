#include "migrate.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admin.h"
#include "db.h"
#include "grants.h"
#include "log.h"
#include "schema.h"

/* How long a statement of migrate waits for a lock (a stricter lock_timeout of the connection
 * string stays). The DDL of the migrations and of every adoption (ALTER TABLE, CREATE TRIGGER,
 * CREATE INDEX) waits for every transaction that holds the table, a relay's batch waiting for
 * Kafka or a forgotten BEGIN, and while it waits every producer's INSERT queues behind it: a
 * wait without end would stop the applications' writes with it. Set once migrate holds its own
 * advisory lock, which concurrent migrates wait for as long as a migration takes. */
#define MIGRATE_LOCK_TIMEOUT "10s"

/* A backend notices that its client went away only when it next reads from or writes to it: one
 * running a migration's statement (an adoption's index build or table rewrite on a large table, a
 * wait for a lock) went on for its whole length after migrate was interrupted (SIGINT, a killed
 * init container, --migrate-timeout), holding the locks every producer's INSERT waits for, to roll
 * it all back at the end, and held migrate's lock against the run that was to retry it. Checked
 * every second instead (PostgreSQL 14 and later; a shorter setting stays, 13 has none). */
#define SQL_CHECK_CLIENT                                                                           \
    "SELECT pg_catalog.set_config(name, '1s', false) FROM pg_catalog.pg_settings"                  \
    " WHERE name = 'client_connection_check_interval'::pg_catalog.text"                            \
    " AND setting::pg_catalog.int4 NOT BETWEEN 1 AND 1000"

/* How long one statement may go unanswered (--migrate-timeout), and whether one was not: the
 * connection is then left mid-statement and nothing more is sent on it (no ROLLBACK, no unlock:
 * closing it ends both). */
static long answer_s;
static bool conn_lost;

/* Waits for the lock that keeps concurrent migrates apart (two relays' init containers), taken for
 * the session. A migrate waits for another as long as that one's migrations take, which the
 * database's or the role's lock_timeout and statement_timeout do not know: operators set them to
 * bound DDL, and they made the second migrate fail while the first was still working ("canceling
 * statement due to lock timeout", blamed on a table). So this one statement runs without them
 * (SET LOCAL: the migrations keep them); --migrate-timeout bounds the wait instead. */
static const char *const SQL_MIGRATE_LOCK =
    "BEGIN; SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0;"
    " SELECT pg_catalog.pg_advisory_lock(" LOCK_KEY_MIGRATE "); COMMIT";

/* Runs sql (one or more commands) and returns the last result; on failure logs it with the
 * step's name and returns NULL. */
static PGresult *exec_step(PGconn *conn, const char *sql, const char *what)
{
    DbError e;
    if (conn_lost)
        return NULL;
    PGresult *res = admin_script_within(conn, sql, answer_s, &e);
    conn_lost = conn_lost || (!res && e.conn_lost);
    if (!res) {
        char q[512];
        bool lock = strcmp(e.sqlstate, "55P03") == 0; /* lock_not_available */
        log_error(
            "migration failed", "step=%s error=%s%s", what, log_quote(e.message, q, sizeof(q)),
            lock ? " hint=\"another transaction held a table this step changes for "
                   "longer than " MIGRATE_LOCK_TIMEOUT " (a long transaction, a relay's batch "
                   "waiting for Kafka); this step was rolled back: run migrate again\""
                 : "");
    }
    return res;
}

static bool exec_ok(PGconn *conn, const char *sql, const char *what)
{
    PGresult *res = exec_step(conn, sql, what);
    PQclear(res);
    return res != NULL;
}

/* Sets SQL_CHECK_CLIENT for the session. A server that refuses it is told in a warning and
 * migrate goes on: the check only shortens what an interrupted migrate leaves running, and a
 * refusal is the server's setup, not migrate's to fix (a platform without the check: Windows, and
 * PostgreSQL 14 on macOS or FreeBSD: "invalid value for parameter", it must be 0 there; pg_settings
 * not readable by the role). Failing there made migrate unusable on those servers. False only when
 * the connection is lost (logged as a failed step). */
static bool check_client_set(PGconn *conn)
{
    DbError e;
    if (conn_lost)
        return false;
    PGresult *res = admin_script_within(conn, SQL_CHECK_CLIENT, answer_s, &e);
    PQclear(res);
    conn_lost = conn_lost || (!res && e.conn_lost);
    if (res)
        return true;
    char q[512];
    if (conn_lost) {
        log_error("migration failed", "step=setup error=%s", log_quote(e.message, q, sizeof(q)));
        return false;
    }
    log_warn("client_connection_check_interval not set: an interrupted migrate's statement runs "
             "on the server to its end",
             "error=%s", log_quote(e.message, q, sizeof(q)));
    return true;
}

/* Adopting a table the embedded migrations did not create (relay/outbox/table.h): the columns the
 * relay keeps its bookkeeping in, as in migrations 0001 and 0003, with defaults, so the
 * application's INSERTs need no change. The order column is an identity: existing rows get numbers
 * in their physical order, new ones at insert. ADD COLUMN of an identity or a stored generated
 * column rewrites the table under an exclusive lock (a large table: plan a window). */
#define ADD_COLUMN(name, definition) " ADD COLUMN IF NOT EXISTS " name " " definition ","
/* As in migrations/0010 (0003, hardened); the relay's own table may not exist here. */
static const char *const SQL_ADOPT_FUNCTION =
    "CREATE OR REPLACE FUNCTION outbox_lane(aggregate_type text, aggregate_id text)"
    " RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS"
    " $$ SELECT (pg_catalog.hashtextextended(aggregate_type OPERATOR(pg_catalog.||)"
    " '/'::pg_catalog.text"
    " OPERATOR(pg_catalog.||) aggregate_id, 0::bigint) OPERATOR(pg_catalog.&) " LANE_MASK
    "::bigint)::smallint $$";
/* The table's DDL. It, the hardening migration (which installs the wakeup trigger again on every
 * table that has one, and the claim floor's on the relay's own) and SQL_ADOPT_FUNCTION run only
 * when adoption_in_place says they have not all been done (item by item, or by this version's
 * text): each ALTER TABLE, CREATE INDEX and trigger install locks the table against its writers,
 * ALTER TABLE even when IF NOT EXISTS finds nothing to do.
 * The lane hashes the aggregate's bytes (COLLATE "C"), as the relay tells aggregates apart
 * everywhere else. Under the columns' own collation, hashtextextended hashes a nondeterministic
 * (ICU) collation's sort key instead: the lanes followed the ICU library's version, and a stored
 * generated column is never computed again (REINDEX, which PostgreSQL asks for after an ICU
 * upgrade, leaves it), so after an upgrade an aggregate's new events could land in another lane
 * than its unsent or held ones, owned by another session or relay, and be published before them
 * (test 37_nondeterministic_collation). Under a deterministic collation the bytes were hashed
 * already: the same lanes as before. */
static const char *const SQL_ADOPT =
    "ALTER TABLE {table}"
    " ADD COLUMN IF NOT EXISTS {seq} bigint GENERATED ALWAYS AS "
    "IDENTITY," SCHEMA_BOOKKEEPING_COLUMNS(
        ADD_COLUMN) " ADD COLUMN IF NOT EXISTS lane smallint GENERATED ALWAYS AS"
                    " (outbox_lane(coalesce({aggregate_type}::text, '') COLLATE pg_catalog.\"C\", "
                    "coalesce({aggregate_id}::text, '') COLLATE pg_catalog.\"C\"))"
                    " STORED;"
                    /* Marks name rows by the order column: it must name exactly one row. An
                     * existing column with NULLs or duplicates fails here, and the adoption rolls
                     * back. */
                    "ALTER TABLE {table} ALTER COLUMN {seq} SET NOT NULL;"
                    "CREATE UNIQUE INDEX IF NOT EXISTS {seq_idx} ON {table} ({seq});"
                    "CREATE INDEX IF NOT EXISTS {unsent_idx} ON {table} ({seq}) WHERE sent_at IS "
                    "NULL;"
                    "CREATE INDEX IF NOT EXISTS {retry_idx} ON {table} ({aggregate_type}, "
                    "{aggregate_id}, {seq})"
                    " WHERE sent_at IS NULL AND attempts > 0;"
                    "CREATE INDEX IF NOT EXISTS {sent_idx} ON {table} (sent_at) WHERE sent_at IS "
                    "NOT NULL;"
                    /* The trigger as migrations/0007 defines it; the table's oid comes from its row
                     * type, so its name is never written into a string literal. */
                    "SELECT outbox_wakeup_install(typrelid::regclass) FROM pg_type"
                    " WHERE oid = pg_catalog.pg_typeof(NULL::{table})::oid;"
                    /* What the claim floor needs of the table, as migrations/0008 defines it. */
                    "SELECT outbox_floor_install(typrelid::regclass, {seq_text},"
                    " {aggregate_type_text}, {aggregate_id_text}) FROM pg_type"
                    " WHERE oid = pg_catalog.pg_typeof(NULL::{table})::oid";
static const char *const SQL_ADOPT_HEADERS =
    "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {headers} jsonb";
/* The indexes SQL_ADOPT names that are not what it would create: each row the name and why.
 * CREATE INDEX IF NOT EXISTS skips a name any relation of the schema has, so the name may be
 * another relation's (a table renamed keeps its indexes' names: a new table of the old name got
 * none, with only a notice), or an index of the table's own with another definition (another
 * column, no predicate, a non-unique one on the order column, one left invalid by a failed
 * CREATE INDEX CONCURRENTLY) that the claims cannot use as they expect; the unique index on the
 * order column is what catches duplicates in an existing one: marks name rows by it, and a
 * duplicate would be marked sent with its twin, unsent. Compared: access method btree, validity,
 * uniqueness, the key columns in order (by attribute number; as text, since int2vector's array
 * starts at 0, which = compares), no expressions, the predicate
 * as PostgreSQL prints it back (pg_get_expr of the same expression on the same column names
 * prints the same text), and for each key column what CREATE INDEX gives it unless told
 * otherwise: the default operator class (text_pattern_ops orders text by bytes, not as the
 * column), the column's own collation (COLLATE "C" orders and compares as the claims' statements
 * do not) and no sort options (DESC, NULLS FIRST). Those were not compared: such an index passed
 * adoption, and the claims it is named for may not use it. */
/* The four indexes the relay wants (k, its name for it, unique, key columns, predicate as
 * pg_get_expr prints it, and the definition as CREATE INDEX takes it). */
#define INDEX_WANTED                                                                               \
    " (VALUES (1, {seq_idx_text}, true, ARRAY[{seq_text}], NULL,"                                  \
    " pg_catalog.concat('UNIQUE (', pg_catalog.quote_ident({seq_text}), ')')),"                    \
    " (2, {unsent_idx_text}, false, ARRAY[{seq_text}], '(sent_at IS NULL)',"                       \
    " pg_catalog.concat('(', pg_catalog.quote_ident({seq_text}), ') WHERE sent_at IS NULL')),"     \
    " (3, {retry_idx_text}, false, ARRAY[{aggregate_type_text}, {aggregate_id_text}, {seq_text}]," \
    " '((sent_at IS NULL) AND (attempts > 0))',"                                                   \
    " pg_catalog.concat('(', pg_catalog.quote_ident({aggregate_type_text}), ', ',"                 \
    " pg_catalog.quote_ident({aggregate_id_text}), ', ', pg_catalog.quote_ident({seq_text}),"      \
    " ') WHERE sent_at IS NULL AND attempts > 0')),"                                               \
    " (4, {sent_idx_text}, false, ARRAY['sent_at'], '(sent_at IS NOT NULL)',"                      \
    " '(sent_at) WHERE sent_at IS NOT NULL'::pg_catalog.text))"                                    \
    " AS n(k, name, uniq, cols, pred, want)"
/* Whether index i (pg_class) of pg_index row x is wanted index n, as the comment above says. */
#define INDEX_IS_WANTED                                                                            \
    "(x.indisvalid AND x.indisunique = n.uniq"                                                     \
    " AND x.indexprs IS NULL AND x.indnkeyatts = pg_catalog.cardinality(n.cols)"                   \
    " AND x.indnatts = x.indnkeyatts"                                                              \
    " AND i.relam = (SELECT oid FROM pg_catalog.pg_am WHERE amname = 'btree'::pg_catalog.name)"    \
    " AND pg_catalog.array_to_string(x.indkey::pg_catalog.int2[], ' ')"                            \
    " = pg_catalog.array_to_string(ARRAY(SELECT a.attnum FROM pg_catalog.unnest(n.cols)"           \
    " WITH ORDINALITY AS c(col, ord) JOIN pg_catalog.pg_attribute a ON a.attrelid = x.indrelid"    \
    " AND a.attname = c.col::pg_catalog.name ORDER BY c.ord), ' ')"                                \
    " AND pg_catalog.pg_get_expr(x.indpred, x.indrelid) IS NOT DISTINCT FROM n.pred"               \
    " AND NOT EXISTS (SELECT 1 FROM pg_catalog.generate_series(0::pg_catalog.int4,"                \
    " x.indnkeyatts::pg_catalog.int4 - 1::pg_catalog.int4) AS k(i)"                                \
    " JOIN pg_catalog.pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[k.i]"      \
    " LEFT JOIN pg_catalog.pg_opclass o ON o.oid = x.indclass[k.i]"                                \
    " WHERE x.indoption[k.i] <> 0::pg_catalog.int2 OR x.indcollation[k.i] <> a.attcollation"       \
    " OR o.opcdefault IS NOT TRUE))"
const char *const migrate_index_check_sql =
    "SELECT n.name, CASE WHEN i.oid IS NULL THEN 'another relation''s'"
    " ELSE 'another definition' END, n.want"
    " FROM" INDEX_WANTED
    " LEFT JOIN (pg_catalog.pg_index x JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid)"
    " ON i.relname = n.name::pg_catalog.name"
    " AND x.indrelid = pg_catalog.to_regclass({table_text})::pg_catalog.oid"
    " WHERE i.oid IS NULL OR NOT " INDEX_IS_WANTED " ORDER BY n.k";
const char *const migrate_index_served_sql =
    "SELECT n.name, n.want, EXISTS (SELECT 1 FROM pg_catalog.pg_index x"
    " JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid"
    " WHERE x.indrelid = pg_catalog.to_regclass({table_text})::pg_catalog.oid"
    " AND i.relname = n.name::pg_catalog.name), n.k"
    " FROM" INDEX_WANTED " WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index x"
    " JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid"
    " WHERE x.indrelid = pg_catalog.to_regclass({table_text})::pg_catalog.oid"
    " AND " INDEX_IS_WANTED ")"
    " ORDER BY n.k";
/* (These statements, like the rest of migrate's, qualify their functions and cast their
 * literals, so no look-alike another role planted in the schema resolves: docs/security.md.)
 * Whether the table has what SQL_ADOPT gives it, its catalog part: this version's adoption
 * recorded for this table (FINGERPRINT, in schema_migrations: a changed SQL_ADOPT runs again
 * once), the order column NOT NULL, the three triggers, the constraint, and the four index names on
 * the table (their definitions are migrate_index_check_sql's to judge). Reads catalogs only. */
static const char *const SQL_ADOPTED =
    "SELECT EXISTS (SELECT 1 FROM schema_migrations"
    " WHERE version = pg_catalog.concat('adopted ', c.oid, ' FINGERPRINT'))"
    " AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid"
    " AND a.attname = {seq_text}::pg_catalog.name AND a.attnotnull AND NOT a.attisdropped)"
    " AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.oid"
    " AND t.tgname IN ('outbox_wakeup'::pg_catalog.name, 'outbox_wakeup_replica'::pg_catalog.name,"
    " 'outbox_floor_visible'::pg_catalog.name)) = 3::pg_catalog.int8"
    " AND EXISTS (SELECT 1 FROM pg_catalog.pg_constraint k WHERE k.conrelid = c.oid"
    " AND k.conname = 'outbox_waits_after_failure'::pg_catalog.name)"
    " AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_index x JOIN pg_catalog.pg_class i"
    " ON i.oid = x.indexrelid WHERE x.indrelid = c.oid AND i.relname IN"
    " ({seq_idx_text}::pg_catalog.name, {unsent_idx_text}::pg_catalog.name,"
    " {retry_idx_text}::pg_catalog.name, {sent_idx_text}::pg_catalog.name)) = 4::pg_catalog.int8"
    " FROM (SELECT pg_catalog.to_regclass({table_text})::pg_catalog.oid AS oid) c";
/* Records this version's adoption of the table (and forgets an older version's). */
static const char *const SQL_RECORD_ADOPTED =
    "DELETE FROM schema_migrations WHERE pg_catalog.split_part(version, ' ', 1)"
    " = 'adopted'::pg_catalog.text"
    " AND pg_catalog.split_part(version, ' ', 2)"
    " = pg_catalog.to_regclass({table_text})::pg_catalog.oid::pg_catalog.text;"
    "INSERT INTO schema_migrations (version) SELECT pg_catalog.concat('adopted ',"
    " pg_catalog.to_regclass({table_text})::pg_catalog.oid, ' FINGERPRINT')";
/* Every column of the table, none read (which columns it has: adoption_in_place). */
static const char *const SQL_ALL_COLUMNS = "SELECT * FROM {table} LIMIT 0";
/* The bookkeeping columns the table already had under the relay's names (ADD COLUMN IF NOT EXISTS
 * keeps them as they are) that do not work as the relay's, with what they must be. A NULL in
 * attempts counts nothing (NULL + 1): a failed row gets no backoff, holds none of its aggregate's
 * later events back (attempts > 0 is NULL), and once the claim floor passes it is on neither
 * index the claims read; a lane that is not the generated column puts rows in no lane any relay
 * owns, and so does one generated by another expression ((hashtext(id) % 100)::smallint: lanes
 * outside 0-63). The expression is judged by what it depends on (pg_depend), not by its text,
 * which PostgreSQL prints differently by column type and version: the relay's outbox_lane (the
 * one in --schema, on migrate's pinned search_path), both configured aggregate columns, and no
 * other function or operator outside pg_catalog (whose objects pg_depend does not record).
 * A lane written by migrate before the COALESCEs were added still passes. */
/* clang-format off */
#define LANE_DEPENDS(condition)                                                                    \
    "SELECT 1 FROM pg_catalog.pg_depend p WHERE p.classid = 'pg_catalog.pg_attrdef'::"             \
    "pg_catalog.regclass::pg_catalog.oid AND p.objid = d.oid AND " condition
#define LANE_FUNCTION                                                                              \
    "pg_catalog.to_regprocedure('outbox_lane(pg_catalog.text,pg_catalog.text)')::pg_catalog.oid"
#define PG_PROC_OID "'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid"
#define PG_OPERATOR_OID "'pg_catalog.pg_operator'::pg_catalog.regclass::pg_catalog.oid"
#define PG_CLASS_OID "'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid"
static const char *const SQL_CHECK_BOOKKEEPING =
    "SELECT c.name, c.want FROM (VALUES ('attempts', 'integer NOT NULL DEFAULT 0'),"
    " ('rejections', 'integer NOT NULL DEFAULT 0'),"
    " ('lane', 'smallint GENERATED ALWAYS AS (outbox_lane(COALESCE(<aggregate type>::text, '''')"
    " COLLATE \"C\", COALESCE(<aggregate id>::text, '''') COLLATE \"C\")) STORED'))"
    " AS c(name, want)"
    " JOIN pg_catalog.pg_attribute a ON a.attrelid = pg_catalog.to_regclass({table_text})::"
    "pg_catalog.oid AND a.attname = c.name::pg_catalog.name AND NOT a.attisdropped"
    " WHERE CASE WHEN c.name = 'lane'::pg_catalog.text THEN a.attgenerated <> 's'::\"char\""
    " OR a.atttypid <> 'pg_catalog.int2'::pg_catalog.regtype::pg_catalog.oid"
    " OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attrdef d"
    " WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum"
    " AND EXISTS (" LANE_DEPENDS("p.refclassid = " PG_PROC_OID " AND p.refobjid = " LANE_FUNCTION) ")"
    " AND NOT EXISTS (" LANE_DEPENDS("p.refclassid IN (" PG_PROC_OID ", " PG_OPERATOR_OID ")"
                                     " AND p.refobjid IS DISTINCT FROM " LANE_FUNCTION) ")"
    " AND (SELECT pg_catalog.count(DISTINCT r.attnum) FROM pg_catalog.pg_depend p"
    " JOIN pg_catalog.pg_attribute r ON r.attrelid = p.refobjid AND r.attnum = p.refobjsubid"
    " WHERE p.classid = 'pg_catalog.pg_attrdef'::pg_catalog.regclass::pg_catalog.oid"
    " AND p.objid = d.oid AND p.refclassid = " PG_CLASS_OID
    " AND r.attname IN ({aggregate_type_text}::pg_catalog.name,"
    " {aggregate_id_text}::pg_catalog.name)) = 2::pg_catalog.int8)"
    " ELSE NOT a.attnotnull OR NOT a.atthasdef END";
/* clang-format on */
/* An aggregate column of a nondeterministic collation under a lane column adopted before its
 * expression hashed bytes (SQL_ADOPT, COLLATE "C"): its lanes follow the ICU version. ADD COLUMN IF
 * NOT EXISTS keeps such a column, and its rows' lanes cannot change while relays claim them (an
 * aggregate's rows would lie in two lanes at once), so migrate says what to do rather than do it.
 * Told apart by the expression's text (no pg_depend entry names the pinned collation "C";
 * PostgreSQL prints it unqualified, pg_catalog being on migrate's search_path). Columns: the
 * column, its collation. Reads catalogs only. */
static const char *const SQL_LANE_BY_COLLATION =
    "SELECT a.attname::pg_catalog.text, k.collname::pg_catalog.text FROM pg_catalog.pg_attribute a"
    " JOIN pg_catalog.pg_collation k ON k.oid = a.attcollation"
    " WHERE a.attrelid = pg_catalog.to_regclass({table_text})::pg_catalog.oid AND NOT "
    "a.attisdropped"
    " AND a.attname IN ({aggregate_type_text}::pg_catalog.name, "
    "{aggregate_id_text}::pg_catalog.name)"
    " AND NOT k.collisdeterministic AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute l"
    " JOIN pg_catalog.pg_attrdef d ON d.adrelid = l.attrelid AND d.adnum = l.attnum"
    " WHERE l.attrelid = a.attrelid AND l.attname = 'lane'::pg_catalog.name AND NOT l.attisdropped"
    " AND pg_catalog.strpos(pg_catalog.pg_get_expr(d.adbin, d.adrelid),"
    " 'COLLATE \"C\"'::pg_catalog.text) = 0::pg_catalog.int4)"
    " ORDER BY a.attnum LIMIT 1";
/* Reads no row, but fails on a column the claims read and the table lacks, and tells the order
 * column's type (the first). */
static const char *const SQL_CHECK_COLUMNS =
    "SELECT" TABLE_ROW_COLUMNS("o.last_error") " FROM {table} o LIMIT 0";

/* Expands a template for map and runs it (blocking: migrate is a one-shot command). */
static PGresult *exec_mapped(PGconn *conn, const TableMap *map, const char *tmpl, const char *what)
{
    char err[256], q[512];
    char *sql = table_sql(map, conn, tmpl, err, sizeof(err));
    if (!sql) {
        log_error("migration failed", "step=%s error=%s", what, log_quote(err, q, sizeof(q)));
        return NULL;
    }
    PGresult *res = exec_step(conn, sql, what);
    free(sql);
    return res;
}

static bool exec_mapped_ok(PGconn *conn, const TableMap *map, const char *tmpl, const char *what)
{
    PGresult *res = exec_mapped(conn, map, tmpl, what);
    PQclear(res);
    return res != NULL;
}

/* The order column must be an integer: the relay passes row numbers as bigint[]. */
#define INT8OID 20
#define INT4OID 23

/* The migration whose functions an adopted table uses too: 0009 defines every one of them
 * (outbox_lane, the wakeup's of 0007, the claim floor's of 0008) in its hardened form, so it is the
 * only file adopting runs. 0007 and 0008 must not run here: they predate the hardening (unqualified
 * format(), =(oid, regclass), pg_get_serial_sequence(text, name), ...), so running them on every
 * `migrate --table` would call look-alikes planted in the schema as the owner, and would replace
 * the hardened functions with their plain versions until 0009 ran again (docs/security.md). */
#define HARDENING_MIGRATION "0009_hardening.sql"

static const MigrationFile *migration_named(const char *name)
{
    for (size_t i = 0; i < migration_count; i++)
        if (strcmp(migration_files[i].name, name) == 0)
            return &migration_files[i];
    return NULL;
}

/* FNV-1a (64 bits) of text, continuing from h: tells one version's adoption SQL from another's. */
static unsigned long long fnv1a(unsigned long long h, const char *text)
{
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        h = (h ^ *p) * 1099511628211ULL;
    return h;
}

/* tmpl with its one "FINGERPRINT" replaced by hex (a-f0-9, no quoting needed). */
static char *with_fingerprint(const char *tmpl, const char *hex)
{
    const char *at = strstr(tmpl, "FINGERPRINT");
    size_t len = strlen(tmpl) + strlen(hex) + 1;
    char *out = at ? malloc(len) : NULL;
    if (out)
        snprintf(out, len, "%.*s%s%s", (int)(at - tmpl), tmpl, hex, at + strlen("FINGERPRINT"));
    return out;
}

/* Runs tmpl with "FINGERPRINT" replaced by hex, expanded for map; the result, or NULL (logged). */
static PGresult *exec_fingerprinted(PGconn *conn, const TableMap *map, const char *tmpl,
                                    const char *hex, const char *what)
{
    char *sql = with_fingerprint(tmpl, hex);
    if (!sql) {
        log_error("migration failed", "step=%s error=\"out of memory\"", what);
        return NULL;
    }
    PGresult *res = exec_mapped(conn, map, sql, what);
    free(sql);
    return res;
}

/* The fingerprint of this version's adoption DDL for map's table (the hardening migration, and
 * SQL_ADOPT_FUNCTION, SQL_ADOPT and, when a headers column is configured, SQL_ADOPT_HEADERS as
 * expanded) into hex. False (logged) when a template does not expand. */
static bool adoption_fingerprint(PGconn *conn, const TableMap *map, const MigrationFile *hardening,
                                 char hex[17])
{
    unsigned long long h = fnv1a(14695981039346656037ULL, hardening->sql);
    const char *tmpls[] = {SQL_ADOPT_FUNCTION, SQL_ADOPT, map->headers ? SQL_ADOPT_HEADERS : NULL};
    for (size_t i = 0; i < 3 && tmpls[i]; i++) {
        char err[256], q[512];
        char *sql = table_sql(map, conn, tmpls[i], err, sizeof(err));
        if (!sql) {
            log_error("migration failed", "step=adopt error=%s", log_quote(err, q, sizeof(q)));
            return false;
        }
        h = fnv1a(h, sql);
        h = fnv1a(h, ";");
        free(sql);
    }
    snprintf(hex, 17, "%016llx", h);
    return true;
}

/* Whether res has a column of exactly this name: PQfnumber folds an unquoted name to lower case,
 * so it gets the name in double quotes, its own doubled. */
static bool has_column(const PGresult *res, const char *name)
{
    char quoted[2 * 64 + 3];
    size_t n = 0;
    quoted[n++] = '"';
    for (const char *p = name; *p && n < sizeof(quoted) - 3; p++) {
        if (*p == '"')
            quoted[n++] = '"';
        quoted[n++] = *p;
    }
    quoted[n++] = '"';
    quoted[n] = '\0';
    return PQfnumber(res, quoted) >= 0;
}

/* Whether everything the hardening migration, SQL_ADOPT_FUNCTION, SQL_ADOPT (and
 * SQL_ADOPT_HEADERS) would do is done already, so that a run
 * of `migrate --table` on an adopted table takes no lock its producers' INSERTs would wait for
 * (ALTER TABLE, CREATE INDEX and CREATE TRIGGER all do, each up to the lock timeout, even when
 * they change nothing). Any doubt is "not in place": the DDL then runs as on the first adoption.
 * False (logged) when a statement failed. */
static bool adoption_in_place(PGconn *conn, const TableMap *map, const char *hex, bool *in_place)
{
    *in_place = false;
    PGresult *res = exec_fingerprinted(conn, map, SQL_ADOPTED, hex, "check adopted");
    if (!res)
        return false;
    bool catalog = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    if (!catalog)
        return true;
    if (!(res = exec_mapped(conn, map, SQL_ALL_COLUMNS, "check adopted")))
        return false;
#define HAS_COLUMN(name, definition) &&has_column(res, name)
    *in_place = has_column(res, map->seq) && has_column(res, "lane") &&
                (!map->headers || has_column(res, map->headers))
                    SCHEMA_BOOKKEEPING_COLUMNS(HAS_COLUMN);
#undef HAS_COLUMN
    PQclear(res);
    return true;
}

/* The checks of an adopted table that the claims and marks rely on, run after each adoption's DDL
 * and by --dry-run on a table adopted before: the mapped columns (the order column an integer),
 * the relay's index names (not another relation's, not another definition) and the bookkeeping
 * columns that were the table's own. True when they pass; else false, with one line logged that
 * says what to fix (name: the table as said in logs). Reads only. */
static bool adoption_checks(PGconn *conn, const TableMap *map, const char *name)
{
    PGresult *cols = NULL, *foreign = NULL, *unlike = NULL;
    bool ok =
        (cols = exec_mapped(conn, map, SQL_CHECK_COLUMNS, "check columns")) != NULL &&
        (foreign = exec_mapped(conn, map, migrate_index_check_sql, "check indexes")) != NULL &&
        (unlike = exec_mapped(conn, map, SQL_CHECK_BOOKKEEPING, "check columns")) != NULL;
    if (ok && PQntuples(unlike) > 0) {
        char q1[200], q2[200];
        log_error("migration failed: the table has a column of the relay's bookkeeping that does "
                  "not work as the relay's; make it so (or rename it), then run migrate again",
                  "step=check table=%s column=%s expected=%s", name,
                  log_quote(PQgetvalue(unlike, 0, 0), q1, sizeof(q1)),
                  log_quote(PQgetvalue(unlike, 0, 1), q2, sizeof(q2)));
        ok = false;
    }
    PQclear(unlike);
    /* Before the indexes: on a column of another type, the index of the order column is not
     * the relay's either, and the type is what to fix. */
    if (ok && PQftype(cols, 0) != INT8OID && PQftype(cols, 0) != INT4OID) {
        log_error("migration failed",
                  "step=check table=%s error=\"the order column (seq-column) "
                  "must be bigint or integer\"",
                  name);
        ok = false;
    }
    PQclear(cols);
    if (ok && PQntuples(foreign) > 0 &&
        strcmp(PQgetvalue(foreign, 0, 1), "another relation's") == 0) {
        char q[200];
        log_error("migration failed: an index name the table needs is another relation's (a "
                  "table renamed keeps its indexes' names); rename or drop that one, then run "
                  "migrate again",
                  "step=check table=%s index=%s", name,
                  log_quote(PQgetvalue(foreign, 0, 0), q, sizeof(q)));
        ok = false;
    } else if (ok && PQntuples(foreign) > 0) {
        char q[200], qw[300];
        log_error("migration failed: the table has an index of the name the relay needs with "
                  "another definition, which the claims and marks cannot rely on; drop or rename "
                  "it, then run migrate again (it is created as expected)",
                  "step=check table=%s index=%s expected=%s", name,
                  log_quote(PQgetvalue(foreign, 0, 0), q, sizeof(q)),
                  log_quote(PQgetvalue(foreign, 0, 2), qw, sizeof(qw)));
        ok = false;
    }
    PQclear(foreign);
    PGresult *lane = ok ? exec_mapped(conn, map, SQL_LANE_BY_COLLATION, "check lanes") : NULL;
    if (lane && PQntuples(lane) > 0) {
        char q1[200], q2[200];
        log_warn("the table's lanes hash an aggregate column under its nondeterministic "
                 "collation, so they follow the ICU version: after an ICU upgrade an aggregate's "
                 "new events may land in another lane than its earlier ones and overtake them; "
                 "with every relay stopped, ALTER TABLE ... DROP COLUMN lane and run migrate "
                 "again (it rewrites the table)",
                 "table=%s column=%s collation=%s", name,
                 log_quote(PQgetvalue(lane, 0, 0), q1, sizeof(q1)),
                 log_quote(PQgetvalue(lane, 0, 1), q2, sizeof(q2)));
    }
    PQclear(lane);
    return ok;
}

static bool adopt_table(PGconn *conn, const TableMap *map)
{
    char name[160], hex[17];
    table_map_display(map, name, sizeof(name));
    const MigrationFile *hardening = migration_named(HARDENING_MIGRATION);
    if (!hardening || !adoption_fingerprint(conn, map, hardening, hex) ||
        !exec_ok(conn, "BEGIN", "adopt"))
        return false;
    bool in_place = false;
    /* The roles' grants follow, outside this transaction (grants_apply, every run). The checks
     * run either way: they read, and lock nothing a writer waits for. */
    bool ok =
        adoption_in_place(conn, map, hex, &in_place) &&
        (in_place || (exec_ok(conn, hardening->sql, hardening->name) &&
                      exec_mapped_ok(conn, map, SQL_ADOPT_FUNCTION, "adopt") &&
                      exec_mapped_ok(conn, map, SQL_ADOPT, "adopt") &&
                      (!map->headers || exec_mapped_ok(conn, map, SQL_ADOPT_HEADERS, "adopt")))) &&
        adoption_checks(conn, map, name);
    if (ok && !in_place) {
        PGresult *rec = exec_fingerprinted(conn, map, SQL_RECORD_ADOPTED, hex, "adopt");
        ok = rec != NULL;
        PQclear(rec);
    }
    if (ok && exec_ok(conn, "COMMIT", "adopt")) {
        if (in_place)
            log_info("table already adopted; its DDL skipped", "table=%s", name);
        else
            log_info("table adopted", "table=%s", name);
        return true;
    }
    exec_ok(conn, "ROLLBACK", "rollback");
    return false;
}

static bool is_applied(PGconn *conn, const char *version, bool *applied)
{
    const char *params[1] = {version};
    DbError e;
    PGresult *res = admin_query_within(conn, "SELECT 1 FROM schema_migrations WHERE version = $1",
                                       1, params, answer_s, &e);
    if (res)
        *applied = PQntuples(res) > 0;
    else {
        char q[512];
        log_error("migration failed", "step=check error=%s", log_quote(e.message, q, sizeof(q)));
    }
    PQclear(res);
    return res != NULL;
}

/* Names migrations were recorded under before they were renamed: known, so a database that
 * recorded one is not taken for one a newer outbox-relay migrated (database_ahead refused it, exit
 * 2, and check said FAIL, telling the operator to run a version that does not exist). The
 * migration that replaced each is not recorded under its own name there, so it applies next, on
 * top: it must be safe after the old one (idempotent). Add a name here whenever a migration file
 * is renamed or folded into another. */
static const char *const retired_migrations[] = {
    /* Folded into 0009_hardening.sql by c06a3c8. */
    "0010_replay.sql",
    /* On main from 251156f to d87ddf0, never released: 95f09c6 extended it to the claim floor's
     * trigger as 0011_triggers_always.sql, which enables ALWAYS what is enabled so already. */
    "0011_wakeup_always.sql",
};

int migrate_unknown(PGconn *conn, long answer_timeout_s, char *newest, size_t len, DbError *e)
{
    char known[4096];
    size_t at = 0;
    size_t n_retired = sizeof(retired_migrations) / sizeof(retired_migrations[0]);
    known[at++] = '{';
    for (size_t i = 0; i < migration_count + n_retired && at < sizeof(known); i++)
        at += (size_t)snprintf(known + at, sizeof(known) - at, "%s\"%s\"", i ? "," : "",
                               i < migration_count ? migration_files[i].name
                                                   : retired_migrations[i - migration_count]);
    if (at + 2 > sizeof(known)) {
        memset(e, 0, sizeof(*e));
        snprintf(e->message, sizeof(e->message), "too many migrations to list");
        return -1;
    }
    known[at++] = '}';
    known[at] = '\0';
    const char *params[1] = {known};
    PGresult *res =
        admin_query_within(conn,
                           "SELECT version, pg_catalog.count(*) OVER () FROM schema_migrations"
                           " WHERE NOT (version OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[]))"
                           " AND version OPERATOR(pg_catalog.~)"
                           " '^[0-9]+_[^ ]*[.]sql$'::pg_catalog.text"
                           " ORDER BY version DESC LIMIT 1",
                           1, params, answer_timeout_s, e);
    if (!res)
        return -1;
    int unknown = 0;
    if (PQntuples(res) > 0) {
        snprintf(newest, len, "%s", PQgetvalue(res, 0, 0));
        unknown = atoi(PQgetvalue(res, 0, 1));
    }
    PQclear(res);
    return unknown;
}

/* Whether the database is ahead of this binary (migrate_unknown): *ahead set, the latest unknown
 * version copied to newest and their number to *unknown. Why: such a database said "migrations
 * up to date" to an older binary, whose relays then run on a schema they were not written for
 * (a constraint, trigger or column default they do not know) and may mis-handle its rows;
 * migrate refuses instead (migrate_run). False (logged) when the read failed. */
static bool database_ahead(PGconn *conn, bool *ahead, char *newest, size_t len, long *unknown)
{
    DbError e;
    int n = migrate_unknown(conn, answer_s, newest, len, &e);
    if (n < 0) {
        conn_lost = conn_lost || e.conn_lost;
        char q[512];
        log_error("migration failed", "step=check error=%s",
                  log_quote(db_error_text(&e), q, sizeof(q)));
        return false;
    }
    *ahead = n > 0;
    *unknown = n;
    return true;
}

/* The one line for a database ahead of this binary (database_ahead), by the run and --dry-run:
 * an error naming the way back (the newer version) and the way to go on anyway (a rollback:
 * --allow-newer-schema), or, with that flag, a warning. */
static void say_ahead(const char *newest, long unknown, bool allowed)
{
    char q[300];
    if (allowed)
        log_warn("the database was migrated by a newer outbox-relay: this binary does not know "
                 "its latest migrations, and its relays may mis-handle rows of that schema; "
                 "allowed by --allow-newer-schema: nothing applied, no grant given",
                 "newest=%s unknown=%ld known=%s", log_quote(newest, q, sizeof(q)), unknown,
                 migration_files[migration_count - 1].name);
    else
        log_error("the database was migrated by a newer outbox-relay: this binary does not know "
                  "its latest migrations, and its relays may mis-handle rows of that schema; "
                  "nothing applied, no grant given",
                  "newest=%s unknown=%ld known=%s hint=\"run migrate and the relays of the "
                  "version that migrated it (migrations are not undone), or, to run this version "
                  "on it anyway (a rollback), its migrate with --allow-newer-schema\"",
                  log_quote(newest, q, sizeof(q)), unknown,
                  migration_files[migration_count - 1].name);
}

static bool apply_one(PGconn *conn, const MigrationFile *m)
{
    if (!exec_ok(conn, "BEGIN", m->name))
        return false;
    if (!exec_ok(conn, m->sql, m->name))
        goto failed;
    const char *params[1] = {m->name};
    DbError e;
    PGresult *res = admin_query_within(conn, "INSERT INTO schema_migrations (version) VALUES ($1)",
                                       1, params, answer_s, &e);
    conn_lost = conn_lost || (!res && e.conn_lost);
    bool recorded = res != NULL;
    PQclear(res);
    if (!recorded || !exec_ok(conn, "COMMIT", m->name))
        goto failed;
    return true;
failed:
    exec_ok(conn, "ROLLBACK", "rollback");
    return false;
}

/* What the server says while migrating. db_connect sends notices to the debug log, which hid the
 * one that mattered most: 0006's "role outbox_relay is missing ... grants skipped" went only to
 * the server's own log while migrate said "migration applied". Every NOTICE and WARNING now goes
 * to stderr, with the step that raised it. */
static const char *notice_step = "connect";

static void on_notice(void *arg, const PGresult *res)
{
    const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *message = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    const char *hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
    bool warning = severity && strcmp(severity, "WARNING") == 0;
    char q_step[200], q_msg[600], q_hint[600];
    log_write(warning ? LOG_WARN : LOG_INFO, "server notice", "severity=%s step=%s message=%s%s%s",
              severity ? severity : "NOTICE", log_quote(notice_step, q_step, sizeof(q_step)),
              log_quote(message ? message : "", q_msg, sizeof(q_msg)), hint ? " hint=" : "",
              hint ? log_quote(hint, q_hint, sizeof(q_hint)) : "");
}

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* db_connect, retried every second for up to wait_s seconds (0: once). Why: migrate is often the
 * first client of a database that starts with it (docker compose, an init container), and a
 * PostgreSQL that is still initialising refuses connections or answers "the database system is
 * starting up" for a while. db_connect's connect_timeout bounds each attempt. NULL with the last
 * error in err when every attempt failed, or at once with *unsupported set for a server older
 * than PostgreSQL 13 (db_connect_checked). */
static PGconn *connect_waiting(const char *conninfo, long wait_s, bool *unsupported, char *err,
                               size_t errlen)
{
    double deadline = monotonic_s() + (double)wait_s;
    for (int attempt = 1;; attempt++) {
        PGconn *conn =
            db_connect_checked(conninfo, "outbox-relay migrate", unsupported, err, errlen);
        /* An old server stays old: no wait cures it. */
        if (conn || *unsupported || wait_s <= 0 || monotonic_s() + 1.0 > deadline)
            return conn;
        if (attempt == 1) {
            char q_err[600];
            log_warn("cannot connect to PostgreSQL yet, retrying", "wait_s=%ld error=%s", wait_s,
                     log_quote(err, q_err, sizeof(q_err)));
        }
        struct timespec second = {1, 0};
        nanosleep(&second, NULL);
    }
}

/* Whether schema exists. Checked before anything is created: with search_path "SCHEMA,
 * pg_temp" (db_pin_search_path), a missing SCHEMA makes pg_temp the first schema that exists,
 * and every CREATE would land there, said "applied", and vanish with the session. */
static bool schema_exists(PGconn *conn, const char *schema)
{
    DbError e;
    const char *params[1] = {schema};
    PGresult *res = admin_query_within(conn, "SELECT pg_catalog.to_regnamespace($1) IS NOT NULL", 1,
                                       params, answer_s, &e);
    if (!res) {
        char q[512];
        log_error("migration failed", "step=schema error=%s",
                  log_quote(db_error_text(&e), q, sizeof(q)));
        return false;
    }
    bool exists = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    if (!exists) {
        char q[200];
        log_error("schema does not exist; nothing migrated",
                  "schema=%s hint=\"create it first (CREATE SCHEMA, as the database's owner), or "
                  "pass the --schema that holds the relay's objects\"",
                  log_quote(schema, q, sizeof(q)));
    }
    return exists;
}

/* --dry-run: says what a run would apply (each migration not recorded) or whether it would adopt
 * the table, and changes nothing: reads only, takes no lock but a reader's, gives no grant. Why:
 * every command accepts every option, and --dry-run was replay's alone, so `migrate --dry-run`,
 * typed to see what an upgrade would do, applied every migration. Once nothing is pending, also
 * each grant a run would give (grants_plan). True (logged) when the reads
 * succeeded; *ahead set (and said, as the run says it) for a database ahead of this binary
 * (database_ahead), which the run refuses unless allow_newer. */
static bool dry_run(PGconn *conn, const TableMap *map, const char *schema, bool allow_newer,
                    bool *ahead)
{
    DbError e;
    PGresult *res = admin_query_within(
        conn, "SELECT pg_catalog.to_regclass('schema_migrations'::pg_catalog.text) IS NOT NULL", 0,
        NULL, answer_s, &e);
    if (!res) {
        char q[512];
        log_error("migration failed", "step=check error=%s",
                  log_quote(db_error_text(&e), q, sizeof(q)));
        return false;
    }
    bool recorded = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    char newest[200];
    long unknown = 0;
    if (recorded && !database_ahead(conn, ahead, newest, sizeof(newest), &unknown))
        return false;
    if (*ahead) {
        say_ahead(newest, unknown, allow_newer);
        return true;
    }
    size_t pending = 0, total = migration_count;
    if (!table_map_is_own(map, schema)) {
        char name[160], hex[17];
        table_map_display(map, name, sizeof(name));
        const MigrationFile *hardening = migration_named(HARDENING_MIGRATION);
        bool in_place = false;
        /* A table that does not exist (a typo in --table, the wrong database) is what the run
         * fails on (exit 1, "relation ... does not exist"): said here too, not "adoption
         * pending", exit 0, which read as "the run will adopt it". */
        if (!exec_mapped_ok(conn, map, SQL_ALL_COLUMNS, "check"))
            return false;
        if (recorded && (!hardening || !adoption_fingerprint(conn, map, hardening, hex) ||
                         !adoption_in_place(conn, map, hex, &in_place)))
            return false;
        /* What the run checks of an adopted table (an index of the relay's name made another
         * way since, a bookkeeping column changed): the run fails on it, exit 1. */
        if (in_place && !adoption_checks(conn, map, name))
            return false;
        total = 1;
        pending = in_place ? 0 : 1;
        if (in_place)
            log_info("table already adopted", "table=%s", name);
        else
            log_info("table adoption pending (dry run: not adopted)", "table=%s", name);
    } else {
        for (size_t i = 0; i < migration_count; i++) {
            bool applied = false;
            if (recorded && !is_applied(conn, migration_files[i].name, &applied))
                return false;
            if (applied)
                continue;
            log_info("migration pending (dry run: not applied)", "version=%s",
                     migration_files[i].name);
            pending++;
        }
    }
    /* The grants a run gives after its migrations (grants_apply, every run): once nothing is
     * pending, what a run would give now; before, the migrations change what there is to grant
     * (0006 creates the roles), and the run grants after them. */
    int grants = 0, refused = 0;
    if (pending == 0) {
        bool lost = false;
        grants = grants_plan(conn, map, answer_s, &lost, &refused);
        conn_lost = conn_lost || lost;
        if (grants < 0)
            return false;
    }
    log_info("dry run: nothing changed", "pending=%zu total=%zu grants_pending=%d", pending, total,
             grants);
    return refused == 0; /* a grant the run could not give: it fails on it, exit 1 */
}

int migrate_run(const char *conninfo, const TableMap *map, const char *schema, long wait_s,
                long answer_timeout_s, bool dry, bool allow_newer)
{
    answer_s = answer_timeout_s;
    conn_lost = false;
    char masked[1024], q_url[1100], err[300], q_err[600];
    bool unsupported = false;
    PGconn *conn = connect_waiting(conninfo, wait_s, &unsupported, err, sizeof(err));
    if (!conn) {
        log_error(
            "cannot connect to PostgreSQL", "url=%s error=%s",
            log_quote(log_mask_conninfo(conninfo, masked, sizeof(masked)), q_url, sizeof(q_url)),
            log_quote(err, q_err, sizeof(q_err)));
        return unsupported ? 2 : 1; /* an old server: a setup to fix, not a failure to retry */
    }

    int rc = 1;
    size_t applied_now = 0;
    PQsetNoticeReceiver(conn, on_notice, NULL);
    notice_step = "setup";
    bool ahead = false;
    char newest[200];
    long unknown = 0;
    if (dry) {
        if (check_client_set(conn) && schema_exists(conn, schema ? schema : "public") &&
            dry_run(conn, map, schema, allow_newer, &ahead))
            rc = ahead && !allow_newer ? 2 : 0;
        goto done;
    }
    /* Session-level lock: released by the unlock below or when the connection closes. The table
     * is created only when missing, so that a run with nothing to do says nothing. */
    if (!exec_ok(conn, "SET client_min_messages = notice", "setup") || !check_client_set(conn) ||
        !exec_ok(conn, SQL_MIGRATE_LOCK, "lock") ||
        !exec_ok(conn, DB_BOUND_SETTING_SQL("lock_timeout", MIGRATE_LOCK_TIMEOUT, "false"),
                 "setup") ||
        !schema_exists(conn, schema ? schema : "public") ||
        !exec_ok(conn,
                 "DO $$ BEGIN IF pg_catalog.to_regclass('schema_migrations') IS NULL THEN"
                 " CREATE TABLE schema_migrations ("
                 " version text PRIMARY KEY,"
                 " applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()); END IF; END $$",
                 "schema_migrations") ||
        !database_ahead(conn, &ahead, newest, sizeof(newest), &unknown))
        goto done;
    /* Refused, not warned: its relays would run on a schema they were not written for, and the
     * init container that runs migrate first is what stops them (exit 2: a setup to fix, which
     * no retry cures). But a rollback to this version after a newer one migrated is an
     * operator's call (migrations keep older relays working where they can: install.md
     * Upgrading): with --allow-newer-schema a warning, nothing applied (every migration this
     * binary knows is the newer one's too), no grant given, 0, and the init container lets the
     * relays start. The lock goes with the connection. */
    if (ahead) {
        say_ahead(newest, unknown, allow_newer);
        rc = allow_newer ? 0 : 2;
        goto done;
    }

    /* Another table than the relay's own: the embedded migrations, written for the relay's own
     * table, do not apply (and would clash with a foreign table named outbox). */
    if (!table_map_is_own(map, schema)) {
        notice_step = "adopt";
        if (!adopt_table(conn, map))
            goto done;
    } else {
        for (size_t i = 0; i < migration_count; i++) {
            const MigrationFile *m = &migration_files[i];
            bool applied = false;
            if (!is_applied(conn, m->name, &applied))
                goto done;
            if (applied)
                continue;
            notice_step = m->name;
            if (!apply_one(conn, m))
                goto done;
            log_info("migration applied", "version=%s", m->name);
            applied_now++;
        }
    }
    /* Not recorded as applied: the grants are given and read back on every run (grants.h). */
    notice_step = "grants";
    bool granted = !conn_lost && grants_apply(conn, map, answer_s, &conn_lost);
    exec_ok(conn, "SELECT pg_catalog.pg_advisory_unlock(" LOCK_KEY_MIGRATE ")", "unlock");
    if (conn_lost)
        goto done; /* said as the step failed */
    if (!granted) {
        log_error("migrate incomplete: the grants above are missing, so the relay's roles cannot "
                  "work yet; fix them and run migrate again",
                  "applied=%zu total=%zu", applied_now, migration_count);
        goto done;
    }
    if (table_map_is_own(map, schema))
        log_info("migrations up to date", "applied=%zu total=%zu", applied_now, migration_count);
    rc = 0;
done:
    PQfinish(conn);
    return rc;
}
