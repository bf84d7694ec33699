#include "grants.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "db.h"
#include "log.h"

/* The table, as an oid (NULL when it does not exist), and the order column's sequence (NULL when
 * the column has none; looked up only once the column is known to exist, since
 * pg_get_serial_sequence raises on a missing one). */
#define T "pg_catalog.to_regclass({table_text})"
#define SEQ                                                                                        \
    "(SELECT pg_catalog.pg_get_serial_sequence(" T                                                 \
    "::text, {seq_text})::regclass FROM pg_attribute"                                              \
    " WHERE attrelid = " T "::oid AND attname = {seq_text} AND attnum > 0 AND NOT attisdropped)"
#define LANE_FN "pg_catalog.to_regprocedure('outbox_lane(text,text)')"
#define SLEEP_FN "pg_catalog.to_regprocedure('outbox_relay_sleep()')"
#define WAKE_FN "pg_catalog.to_regprocedure('outbox_relay_wake()')"
/* A relation (the table, the sequence) and a function of the relay's by oid, schema-qualified and
 * quoted, for the GRANTs: regclass's and regprocedure's text leave out a schema on the session's
 * search_path, which `check` pins to --schema, and the owner who runs the GRANT in psql has another
 * one (there an unqualified name is not found, or names an object someone else placed first). */
#define QUALIFIED(oid)                                                                             \
    "(SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) FROM pg_catalog.pg_class c"          \
    " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = " oid "::oid)"
#define FN_QUALIFIED(fn)                                                                           \
    "(SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_proc p"                          \
    " JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = " fn "::oid)"
/* The schema of the relay's functions (--schema), which may not be the table's. */
#define FN_SCHEMA "(SELECT pronamespace FROM pg_catalog.pg_proc WHERE oid = " SLEEP_FN "::oid)"
/* The columns of the table and whether writers (outbox_producer) may INSERT into each: not the
 * order column nor any identity or generated one (OVERRIDING SYSTEM VALUE needs INSERT on the
 * identity column), not the relay's bookkeeping (a writer setting attempts, next_attempt_at or
 * dead_at could hold another application's aggregate back for ever), and not the event id or
 * created_at when the database fills them (the integration contract: an event id a writer chose
 * could repeat another application's, which consumers would then drop as a duplicate). Every
 * other column is the application's: on the relay's own table aggregate_type, aggregate_id,
 * event_type, payload and headers; on an adopted table also its own columns (and an event id
 * column without a default, which the application must then set). */
#define WRITER_COLUMNS                                                                             \
    "(SELECT a.attname::text AS name, a.attidentity = '' AND a.attgenerated = ''"                  \
    " AND a.attname::text <> ALL (ARRAY['sent_at', 'attempts', 'rejections', 'last_error',"        \
    " 'next_attempt_at', 'dead_at', 'dead_letter_topic', 'lane', {seq_text}]::text[])"             \
    " AND NOT (a.atthasdef AND a.attname::text IN ({event_id_text}, 'created_at')) AS writer"      \
    " FROM pg_catalog.pg_attribute a WHERE a.attrelid = " T "::oid AND a.attnum > 0"               \
    " AND NOT a.attisdropped)"
#define UPDATE_COLUMNS                                                                             \
    "sent_at, attempts, rejections, last_error, next_attempt_at, dead_at, dead_letter_topic"
#define UPDATE_ON(col) "pg_catalog.has_column_privilege($1, " T ", '" col "', 'UPDATE')"

/* CHECK_ONLY: a privilege on PostgreSQL's own objects, which PUBLIC holds unless revoked (a
 * hardening step): checked, never granted by migrate, whose role does not own them. */
enum { FOR_RELAY = 1, FOR_PRODUCER = 2, ONLY_DELETES = 4, ONLY_FLOOR = 8, CHECK_ONLY = 16 };

/* Whether the session's role has the privileges of the role owner (an oid expression): a
 * superuser, the owner, or a member of it, who may GRANT on what it owns. */
#define MAY_GIVE(owner) "pg_catalog.pg_has_role(current_user, " owner ", 'USAGE')"
/* Or a role that holds what the GRANT gives WITH GRANT OPTION (an expression of those
 * privileges): PostgreSQL's GRANT lets it give them on, and the dry run said such a role may not,
 * exit 1, where the run gave them and exited 0. */
#define MAY_GIVE_OR(owner, grantable) "(" MAY_GIVE(owner) " OR " grantable ")"
#define GRANTABLE_ON_TABLE(priv)                                                                   \
    "pg_catalog.has_table_privilege(current_user, " T ", '" priv " WITH GRANT OPTION')"
#define UPDATE_GRANTABLE(col)                                                                      \
    "pg_catalog.has_column_privilege(current_user, " T ", '" col "', 'UPDATE WITH GRANT OPTION')"
#define EXECUTE_GRANTABLE(fn)                                                                      \
    "pg_catalog.has_function_privilege(current_user, " fn ", 'EXECUTE WITH GRANT OPTION')"
#define USAGE_GRANTABLE(nsp)                                                                       \
    "pg_catalog.has_schema_privilege(current_user, " nsp ", 'USAGE WITH GRANT OPTION')"
#define TABLE_OWNER "(SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = " T "::oid)"
#define TABLE_SCHEMA_OWNER                                                                         \
    "(SELECT n.nspowner FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_class c"                 \
    " ON c.relnamespace = n.oid WHERE c.oid = " T "::oid)"
#define FN_OWNER(fn) "(SELECT p.proowner FROM pg_catalog.pg_proc p WHERE p.oid = " fn "::oid)"
#define FN_SCHEMA_OWNER                                                                            \
    "(SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.oid = " FN_SCHEMA ")"
#define SEQ_OWNER "(SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = " SEQ "::oid)"

/* One privilege: whether its object exists (NULL: the table itself, always), whether role $1
 * holds it, and the GRANT that gives it to role $2, all SQL expressions (templates of table.h).
 * As in migrations 0006 (the roles' grants), 0007 (the wakeup functions) and 0008 (the
 * sequence); a list of privileges in has_*_privilege means any of them, so each that is needed is
 * tested on its own. */
typedef struct Need {
    unsigned flags;
    const char *what;
    const char *exists;
    const char *held;
    const char *grant;
    /* Whether the session's role may give it, as PostgreSQL's GRANT decides: a superuser, a
     * member of the role owning each object the GRANT names, or a role holding the privilege
     * WITH GRANT OPTION. migrate --dry-run's (grants_plan). */
    const char *may_give;
} Need;

static const Need
    needs
        [] =
            {
                {FOR_RELAY | FOR_PRODUCER, "USAGE on the outbox table's schema", NULL,
                 "pg_catalog.has_schema_privilege($1, (SELECT relnamespace FROM pg_class WHERE oid "
                 "= " T "::oid"
                 "), 'USAGE')",
                 "pg_catalog.format('GRANT USAGE ON SCHEMA %s TO %I', (SELECT "
                 "relnamespace::regnamespace::text FROM "
                 "pg_class WHERE oid = " T "::oid), $2::text)",
                 MAY_GIVE_OR(TABLE_SCHEMA_OWNER,
                             USAGE_GRANTABLE("(SELECT relnamespace FROM pg_catalog.pg_class WHERE "
                                             "oid = " T "::oid)"))},
                {FOR_RELAY, "SELECT on the outbox table", NULL,
                 "pg_catalog.has_table_privilege($1, " T ", 'SELECT')",
                 "pg_catalog.format('GRANT SELECT ON %s TO %I', " QUALIFIED(T) ", $2::text)",
                 MAY_GIVE_OR(TABLE_OWNER, GRANTABLE_ON_TABLE("SELECT"))},
                {FOR_RELAY, "UPDATE on the outbox table's delivery columns", NULL,
                 UPDATE_ON("sent_at") " AND " UPDATE_ON("attempts") " AND " UPDATE_ON("rejections") " AND " UPDATE_ON(
                     "last_error") " AND " UPDATE_ON("next_attempt_at") " AND " UPDATE_ON("dead_at") " AND " UPDATE_ON("dead_letter_topic"),
                 "pg_catalog.format('GRANT UPDATE (" UPDATE_COLUMNS
                 ") ON %s TO %I', " QUALIFIED(T) ", $2::text)",
                 MAY_GIVE_OR(TABLE_OWNER,
                             "(" UPDATE_GRANTABLE("sent_at") " AND " UPDATE_GRANTABLE("attempts") " AND " UPDATE_GRANTABLE("rejections") " AND " UPDATE_GRANTABLE(
                                 "last_error") " AND " UPDATE_GRANTABLE("next_attempt_at") " AND"
                                                                                           " " UPDATE_GRANTABLE("dead_at") " AND " UPDATE_GRANTABLE(
                                                                                               "dea"
                                                                                               "d_"
                                                                                               "let"
                                                                                               "ter"
                                                                                               "_to"
                                                                                               "pi"
                                                                                               "c") ")")},
                {FOR_RELAY | ONLY_DELETES,
                 "DELETE on the outbox table (--on-sent delete, --retention)", NULL,
                 "pg_catalog.has_table_privilege($1, " T ", 'DELETE')",
                 "pg_catalog.format('GRANT DELETE ON %s TO %I', " QUALIFIED(T) ", $2::text)",
                 MAY_GIVE_OR(TABLE_OWNER, GRANTABLE_ON_TABLE("DELETE"))},
                {FOR_RELAY | FOR_PRODUCER, "EXECUTE on outbox_lane(text, text)",
                 LANE_FN " IS NOT NULL",
                 "pg_catalog.has_function_privilege($1, " LANE_FN ", 'EXECUTE')",
                 "pg_catalog.format('GRANT EXECUTE ON FUNCTION %s.outbox_lane(text, text) TO "
                 "%I', " FN_QUALIFIED(LANE_FN) ", $2::text)",
                 MAY_GIVE_OR(FN_OWNER(LANE_FN), EXECUTE_GRANTABLE(LANE_FN))},
                {FOR_RELAY,
                 "EXECUTE on the wakeup's functions outbox_relay_sleep() and outbox_relay_wake()",
                 SLEEP_FN " IS NOT NULL AND " WAKE_FN " IS NOT NULL",
                 "pg_catalog.has_function_privilege($1, " SLEEP_FN
                 ", 'EXECUTE') AND pg_catalog.has_function_privilege($1, " WAKE_FN ", 'EXECUTE')",
                 "pg_catalog.format('GRANT EXECUTE ON FUNCTION %s.outbox_relay_sleep(), "
                 "%s.outbox_relay_wake() TO %I', " FN_QUALIFIED(SLEEP_FN) ", " FN_QUALIFIED(
                     WAKE_FN) ", $2::text)",
                 MAY_GIVE_OR(FN_OWNER(SLEEP_FN), EXECUTE_GRANTABLE(SLEEP_FN)) " AND " MAY_GIVE_OR(
                     FN_OWNER(WAKE_FN), EXECUTE_GRANTABLE(WAKE_FN))},
                /* The relay calls its wakeup's functions by name, through its search_path: in a
                 * schema it may not use they are not found, and its sessions fall back to the
                 * poll timer (a table in another schema than --schema). */
                {FOR_RELAY, "USAGE on the schema of the wakeup's functions",
                 SLEEP_FN " IS NOT NULL",
                 "pg_catalog.has_schema_privilege($1, " FN_SCHEMA ", 'USAGE')",
                 "pg_catalog.format('GRANT USAGE ON SCHEMA %s TO %I', " FN_SCHEMA
                 "::regnamespace::text, $2::text)",
                 MAY_GIVE_OR(FN_SCHEMA_OWNER, USAGE_GRANTABLE(FN_SCHEMA))},
                {FOR_RELAY | ONLY_FLOOR,
                 "SELECT on the order column's sequence (the claim floor, 0008)",
                 SEQ " IS NOT NULL",
                 "pg_catalog.has_sequence_privilege($1, " SEQ ", 'SELECT, USAGE')",
                 "pg_catalog.format('GRANT SELECT ON SEQUENCE %s TO %I', " QUALIFIED(
                     SEQ) ", $2::text)",
                 MAY_GIVE_OR(SEQ_OWNER, "pg_catalog.has_sequence_privilege(current_user, " SEQ
                                        ", 'SELECT WITH GRANT OPTION')")},
                /* The lane group's look and locks (statements.h): refused, a relay session holds
                 * no lanes and reports a setup fault whose hint sends the operator here. */
                {FOR_RELAY | CHECK_ONLY, "SELECT on pg_catalog.pg_locks (the lane group's look)",
                 NULL, "pg_catalog.has_table_privilege($1, 'pg_catalog.pg_locks', 'SELECT')",
                 "pg_catalog.format('GRANT SELECT ON pg_catalog.pg_locks TO %I', $2::text)",
                 "false" /* CHECK_ONLY: migrate never plans it */},
                {FOR_RELAY | CHECK_ONLY,
                 "EXECUTE on pg_try_advisory_lock(integer, integer) and "
                 "pg_advisory_unlock(integer, integer) (the lane group's locks)",
                 NULL,
                 "pg_catalog.has_function_privilege($1, "
                 "'pg_catalog.pg_try_advisory_lock(integer, integer)', 'EXECUTE')"
                 " AND pg_catalog.has_function_privilege($1, "
                 "'pg_catalog.pg_advisory_unlock(integer, integer)', 'EXECUTE')",
                 "pg_catalog.format('GRANT EXECUTE ON FUNCTION"
                 " pg_catalog.pg_try_advisory_lock(integer, integer),"
                 " pg_catalog.pg_advisory_unlock(integer, integer) TO %I', $2::text)",
                 "false" /* CHECK_ONLY: migrate never plans it */},
                /* The wakeup's lock (0009): outbox_relay_sleep() and outbox_relay_wake() run as
                 * the relay's role and call these. Refused, every sleep fails and the sessions
                 * warn "cannot take part in the wakeup" and wait for --poll-interval. */
                {FOR_RELAY | CHECK_ONLY,
                 "EXECUTE on pg_try_advisory_lock(bigint), "
                 "pg_try_advisory_xact_lock_shared(bigint) "
                 "and pg_advisory_unlock(bigint) (the wakeup's lock, taken and given up by "
                 "outbox_relay_sleep() and outbox_relay_wake())",
                 SLEEP_FN " IS NOT NULL",
                 "pg_catalog.has_function_privilege($1, "
                 "'pg_catalog.pg_try_advisory_lock(bigint)', 'EXECUTE')"
                 " AND pg_catalog.has_function_privilege($1, "
                 "'pg_catalog.pg_try_advisory_xact_lock_shared(bigint)', 'EXECUTE')"
                 " AND pg_catalog.has_function_privilege($1, "
                 "'pg_catalog.pg_advisory_unlock(bigint)', 'EXECUTE')",
                 "pg_catalog.format('GRANT EXECUTE ON FUNCTION"
                 " pg_catalog.pg_try_advisory_lock(bigint),"
                 " pg_catalog.pg_try_advisory_xact_lock_shared(bigint),"
                 " pg_catalog.pg_advisory_unlock(bigint) TO %I', $2::text)",
                 "false" /* CHECK_ONLY: migrate never plans it */},
                /* The wakeup's waiter (wakeup.c, SQL_WAITER): a DO block, in plpgsql, that queues
                 * for the same lock with pg_advisory_lock(bigint) while producers hold it shared.
                 * Refused, every wait fails ("the wakeup's waiter failed") and the sessions ask to
                 * sleep every --busy-poll-interval for as long as a producer's transaction stays
                 * open. */
                {FOR_RELAY | CHECK_ONLY,
                 "EXECUTE on pg_advisory_lock(bigint) (the wakeup's waiter, which queues for the "
                 "wakeup's lock while producers are mid-transaction)",
                 SLEEP_FN " IS NOT NULL",
                 "pg_catalog.has_function_privilege($1, "
                 "'pg_catalog.pg_advisory_lock(bigint)', 'EXECUTE')",
                 "pg_catalog.format('GRANT EXECUTE ON FUNCTION"
                 " pg_catalog.pg_advisory_lock(bigint) TO %I', $2::text)",
                 "false" /* CHECK_ONLY: migrate never plans it */},
                {FOR_RELAY | CHECK_ONLY,
                 "USAGE on the language plpgsql (the wakeup's waiter runs a DO block)",
                 SLEEP_FN " IS NOT NULL",
                 "pg_catalog.has_language_privilege($1, 'plpgsql', 'USAGE')",
                 "pg_catalog.format('GRANT USAGE ON LANGUAGE plpgsql TO %I', $2::text)",
                 "false" /* CHECK_ONLY: migrate never plans it */},
                {FOR_PRODUCER,
                 "INSERT on the outbox table's writer columns, and on no other column", NULL,
                 "NOT EXISTS (SELECT 1 FROM " WRITER_COLUMNS " c WHERE NOT c.writer ="
                 " pg_catalog.has_column_privilege($1, " T ", c.name, 'INSERT'))",
                 /* One statement (db_exec sends one): a REVOKE of INSERT on the table takes the
                  * column grants with it, so both go in one transaction, writers never without. */
                 "pg_catalog.format('DO $g$ BEGIN REVOKE INSERT ON %s FROM %I;"
                 " GRANT INSERT (%s) ON %s TO %I; END $g$', " QUALIFIED(
                     T) ", $2::text, (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(c.name), "
                        "', ')"
                        " FROM " WRITER_COLUMNS " c WHERE c.writer), " QUALIFIED(T) ", $2::text)",
                 /* The owner only: a non-owner's REVOKE takes back its own grants alone, so
                  * INSERT on the whole table would stay beside the column grants. */
                 MAY_GIVE(TABLE_OWNER)},
};

#define N_NEEDS (sizeof(needs) / sizeof(needs[0]))

/* Where a need stands for one role. */
typedef enum { NEED_NOT_APPLICABLE, NEED_HELD, NEED_MISSING, NEED_UNKNOWN } NeedState;

/* Evaluates need for role (held?) and writes the GRANT that gives it to grantee in grant (empty
 * when it does not apply). Given up after answer_s seconds without an answer (check: admin_query's
 * bound; migrate: --migrate-timeout): NEED_UNKNOWN with *lost set (the connection is left
 * mid-statement: nothing more may be sent on it). */
static NeedState need_state_giving(PGconn *conn, const TableMap *map, const Need *need,
                                   const char *role, const char *grantee, char *grant,
                                   size_t grantlen, long answer_s, bool *lost, bool *may_give)
{
    char tmpl[6144], err[256], q[600];
    const char *exists = need->exists ? need->exists : "true";
    snprintf(tmpl, sizeof(tmpl),
             "SELECT CASE WHEN %s THEN coalesce(%s, false) END,"
             " CASE WHEN %s THEN %s END, CASE WHEN %s THEN coalesce(%s, false) END",
             exists, need->held, exists, need->grant, exists, may_give ? need->may_give : "true");
    *grant = '\0';
    char *sql = table_sql(map, conn, tmpl, err, sizeof(err));
    if (!sql) {
        log_error("cannot write a privilege's check", "error=%s", log_quote(err, q, sizeof(q)));
        return NEED_UNKNOWN;
    }
    const char *params[2] = {role, grantee};
    DbError e;
    PGresult *res = admin_query_within(conn, sql, 2, params, answer_s, &e);
    free(sql);
    if (!res) {
        *lost = *lost || e.conn_lost;
        log_error("cannot check a privilege", "privilege=%s error=%s",
                  log_quote(need->what, q, sizeof(q)), db_error_text(&e));
        return NEED_UNKNOWN;
    }
    NeedState state = PQgetisnull(res, 0, 0)                    ? NEED_NOT_APPLICABLE
                      : strcmp(PQgetvalue(res, 0, 0), "t") == 0 ? NEED_HELD
                                                                : NEED_MISSING;
    if (!PQgetisnull(res, 0, 1))
        snprintf(grant, grantlen, "%s", PQgetvalue(res, 0, 1));
    if (may_give)
        *may_give = strcmp(PQgetvalue(res, 0, 2), "t") == 0;
    PQclear(res);
    return state;
}

/* need_state_giving without asking whether the session may give it. */
static NeedState need_state(PGconn *conn, const TableMap *map, const Need *need, const char *role,
                            const char *grantee, char *grant, size_t grantlen, long answer_s,
                            bool *lost)
{
    return need_state_giving(conn, map, need, role, grantee, grant, grantlen, answer_s, lost, NULL);
}

static const char *const roles[2] = {"outbox_relay", "outbox_producer"};

/* Creates role (NOLOGIN, as 0006 does) when it is missing and the session may. True when the
 * role exists afterwards; false with *lost set when PostgreSQL did not answer within answer_s. */
static bool ensure_role(PGconn *conn, const char *role, long answer_s, bool *lost)
{
    const char *params[1] = {role};
    DbError e;
    PGresult *res = admin_query_within(conn, "SELECT pg_catalog.to_regrole($1) IS NOT NULL", 1,
                                       params, answer_s, &e);
    bool exists = res && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    if (!res) {
        *lost = *lost || e.conn_lost;
        log_error("cannot look the role up", "role=%s error=%s", role, db_error_text(&e));
    }
    if (!res || exists)
        return exists;
    char sql[128];
    snprintf(sql, sizeof(sql), "CREATE ROLE %s NOLOGIN", role); /* a constant name: no quoting */
    res = admin_query_within(conn, sql, 0, NULL, answer_s, &e);
    PQclear(res);
    if (res) {
        log_info("role created", "role=%s", role);
        return true;
    }
    *lost = *lost || e.conn_lost;
    /* Created meanwhile by a concurrent migrate: fine. */
    if (strcmp(e.sqlstate, "42710") == 0 || strcmp(e.sqlstate, "23505") == 0)
        return true;
    if (strcmp(e.sqlstate, "42501") != 0)
        log_warn("cannot create the role", "role=%s error=%s", role, db_error_text(&e));
    return false;
}

bool grants_apply(PGconn *conn, const TableMap *map, long answer_s, bool *conn_lost)
{
    bool exists[2];
    char missing[64] = "";
    *conn_lost = false;
    for (int r = 0; r < 2; r++) {
        exists[r] = ensure_role(conn, roles[r], answer_s, conn_lost);
        if (*conn_lost)
            return false;
        if (!exists[r])
            snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), "%s%s",
                     *missing ? ", " : "", roles[r]);
    }
    bool ok = true;
    for (int r = 0; r < 2; r++) {
        if (!exists[r])
            continue;
        /* DELETE is given only with the role's first grants on the table (it had no SELECT yet):
         * an operator who uses neither --on-sent delete, --retention nor purge-dead may revoke
         * it (docs/security.md#secure-by-default), and a later migrate must not give it back. */
        char unused[1024];
        bool fresh = r == 0 && need_state(conn, map, &needs[1], roles[r], roles[r], unused,
                                          sizeof(unused), answer_s, conn_lost) == NEED_MISSING;
        if (*conn_lost)
            return false;
        for (size_t i = 0; i < N_NEEDS; i++) {
            const Need *need = &needs[i];
            if (!(need->flags & (r == 0 ? FOR_RELAY : FOR_PRODUCER)) ||
                (need->flags & CHECK_ONLY) || ((need->flags & ONLY_DELETES) && !fresh))
                continue;
            char grant[1024], q1[600], q2[1100];
            NeedState st = need_state(conn, map, need, roles[r], roles[r], grant, sizeof(grant),
                                      answer_s, conn_lost);
            if (*conn_lost)
                return false;
            if (st == NEED_NOT_APPLICABLE)
                continue;
            /* GRANT again even when held: it costs nothing, and the read-back below decides. */
            DbError e;
            PGresult *res =
                st != NEED_UNKNOWN ? admin_query_within(conn, grant, 0, NULL, answer_s, &e) : NULL;
            if (st != NEED_UNKNOWN && !res) {
                *conn_lost = e.conn_lost;
                log_warn("grant failed", "grant=%s error=%s", log_quote(grant, q2, sizeof(q2)),
                         db_error_text(&e));
                if (*conn_lost)
                    return false;
            }
            PQclear(res);
            st = need_state(conn, map, need, roles[r], roles[r], grant, sizeof(grant), answer_s,
                            conn_lost);
            if (*conn_lost)
                return false;
            if (st == NEED_HELD)
                continue;
            ok = false;
            if (st == NEED_MISSING)
                log_error("migrate could not grant what the relay's roles need: run `outbox-relay "
                          "migrate` as the owner of the outbox table and its schema, or have the "
                          "owner run the grant",
                          "role=%s privilege=%s grant=%s", roles[r],
                          log_quote(need->what, q1, sizeof(q1)), log_quote(grant, q2, sizeof(q2)));
        }
    }
    if (*missing) {
        char user[128] = "the migrating role";
        DbError e;
        PGresult *res = admin_query_within(conn, "SELECT current_user", 0, NULL, answer_s, &e);
        *conn_lost = !res && e.conn_lost;
        if (res)
            snprintf(user, sizeof(user), "%s", PQgetvalue(res, 0, 0));
        PQclear(res);
        /* One line saying what to create, by whom, and what to run next. */
        bool both = !exists[0] && !exists[1];
        char msg[768];
        snprintf(msg, sizeof(msg),
                 "role%s %s %s missing and %s may not create %s (no CREATEROLE), so nothing was "
                 "granted to %s: have an administrator run%s%s then run `outbox-relay migrate` "
                 "again (it grants what they need)",
                 both ? "s" : "", missing, both ? "are" : "is", user, both ? "them" : "it",
                 both ? "them" : "it", exists[0] ? "" : " CREATE ROLE outbox_relay NOLOGIN;",
                 exists[1] ? "" : " CREATE ROLE outbox_producer NOLOGIN;");
        log_error(msg, "missing_roles=%s", missing);
        ok = false;
    }
    return ok;
}

int grants_plan(PGconn *conn, const TableMap *map, long answer_s, bool *conn_lost, int *refused)
{
    *conn_lost = false;
    *refused = 0;
    int pending = 0;
    char q1[600], q2[1100];
    for (int r = 0; r < 2; r++) {
        const char *params[1] = {roles[r]};
        DbError e;
        PGresult *res = admin_query_within(conn, "SELECT pg_catalog.to_regrole($1) IS NOT NULL", 1,
                                           params, answer_s, &e);
        if (!res) {
            *conn_lost = e.conn_lost;
            log_error("cannot look the role up", "role=%s error=%s", roles[r], db_error_text(&e));
            return -1;
        }
        bool exists = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
        PQclear(res);
        if (!exists) {
            /* Its grants follow its creation; what they are depends on nothing else. A role
             * without CREATEROLE cannot create it: the run fails there (grants_apply). */
            res =
                admin_query_within(conn,
                                   "SELECT r.rolsuper OR r.rolcreaterole FROM pg_catalog.pg_roles r"
                                   " WHERE r.rolname OPERATOR(pg_catalog.=) current_user",
                                   0, NULL, answer_s, &e);
            if (!res) {
                *conn_lost = e.conn_lost;
                log_error("cannot read the session's role", "error=%s", db_error_text(&e));
                return -1;
            }
            bool may_create = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
            PQclear(res);
            if (may_create)
                log_info("role missing (dry run: not created, nor granted anything)", "role=%s",
                         roles[r]);
            else {
                log_error("role missing, and this role may not create it (no CREATEROLE): the run "
                          "would fail; have an administrator run CREATE ROLE first",
                          "role=%s", roles[r]);
                (*refused)++;
            }
            pending++;
            continue;
        }
        /* As grants_apply: DELETE only with the role's first grants. */
        char unused[1024];
        NeedState first = r == 0 ? need_state(conn, map, &needs[1], roles[r], roles[r], unused,
                                              sizeof(unused), answer_s, conn_lost)
                                 : NEED_HELD;
        if (first == NEED_UNKNOWN)
            return -1;
        for (size_t i = 0; i < N_NEEDS; i++) {
            const Need *need = &needs[i];
            if (!(need->flags & (r == 0 ? FOR_RELAY : FOR_PRODUCER)) ||
                (need->flags & CHECK_ONLY) ||
                ((need->flags & ONLY_DELETES) && first != NEED_MISSING))
                continue;
            char grant[1024];
            bool may_give = false;
            NeedState st = need_state_giving(conn, map, need, roles[r], roles[r], grant,
                                             sizeof(grant), answer_s, conn_lost, &may_give);
            if (st == NEED_UNKNOWN)
                return -1;
            if (st != NEED_MISSING)
                continue;
            /* A grant the session may not give fails the run (grants_apply: exit 1), which the
             * dry run is there to say before the init container meets it. */
            if (may_give)
                log_info("grant pending (dry run: not given)", "role=%s privilege=%s grant=%s",
                         roles[r], log_quote(need->what, q1, sizeof(q1)),
                         log_quote(grant, q2, sizeof(q2)));
            else {
                log_error("grant pending, and this role may not give it (it does not own the "
                          "object, nor holds it WITH GRANT OPTION, nor is it a superuser): the run "
                          "would fail; run migrate as "
                          "the owner of the outbox table and its schema, or have the owner run "
                          "the grant",
                          "role=%s privilege=%s grant=%s", roles[r],
                          log_quote(need->what, q1, sizeof(q1)), log_quote(grant, q2, sizeof(q2)));
                (*refused)++;
            }
            pending++;
        }
    }
    return pending;
}

int grants_check(PGconn *conn, const TableMap *map, GrantsUse use, GrantsMissingFn fn, void *arg,
                 bool *conn_lost)
{
    *conn_lost = false;
    DbError e;
    PGresult *res = admin_query(
        conn,
        "SELECT current_user, CASE WHEN pg_catalog.to_regrole('outbox_relay') IS NOT NULL"
        " AND pg_catalog.pg_has_role(current_user, 'outbox_relay', 'MEMBER') THEN 'outbox_relay'"
        " ELSE current_user::text END, pg_catalog.quote_ident(current_user)",
        0, NULL, &e);
    if (!res) {
        log_error("cannot read the session's role", "error=%s", db_error_text(&e));
        *conn_lost = e.conn_lost;
        return -1;
    }
    char role[128], grantee[128], quoted[140];
    snprintf(role, sizeof(role), "%s", PQgetvalue(res, 0, 0));
    snprintf(grantee, sizeof(grantee), "%s", PQgetvalue(res, 0, 1));
    snprintf(quoted, sizeof(quoted), "%s", PQgetvalue(res, 0, 2));
    PQclear(res);
    /* Not outbox_relay nor a member of it: what migrate grants does not reach this role. */
    const char *nonmember = strcmp(grantee, "outbox_relay") == 0 ? NULL : quoted;
    int missing = 0;
    for (size_t i = 0; i < N_NEEDS; i++) {
        const Need *need = &needs[i];
        if (!(need->flags & FOR_RELAY) || ((need->flags & ONLY_DELETES) && !use.deletes) ||
            ((need->flags & ONLY_FLOOR) && !use.claim_floor))
            continue;
        char grant[1024];
        NeedState st = need_state(conn, map, need, role, grantee, grant, sizeof(grant),
                                  admin_answer_s(), conn_lost);
        if (st == NEED_UNKNOWN)
            return -1;
        if (st == NEED_MISSING) {
            missing++;
            fn(need->what, grant, !(need->flags & (ONLY_DELETES | CHECK_ONLY)), nonmember, arg);
        }
    }
    return missing;
}
