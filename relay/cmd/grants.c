#include "grants.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"

/* The table, as an oid (NULL when it does not exist), and the order column's sequence (NULL when
 * the column has none; looked up only once the column is known to exist, since
 * pg_get_serial_sequence raises on a missing one). */
#define T "to_regclass({table_text})"
#define SEQ                                                                                        \
    "(SELECT pg_get_serial_sequence(" T "::text, {seq_text})::regclass FROM pg_attribute"          \
    " WHERE attrelid = " T " AND attname = {seq_text} AND attnum > 0 AND NOT attisdropped)"
#define LANE_FN "to_regprocedure('outbox_lane(text,text)')"
#define SLEEP_FN "to_regprocedure('outbox_relay_sleep()')"
#define WAKE_FN "to_regprocedure('outbox_relay_wake()')"
#define WAKEUP_STATE "to_regclass('outbox_wakeup_state')"
#define UPDATE_COLUMNS                                                                             \
    "sent_at, attempts, rejections, last_error, next_attempt_at, dead_at, dead_letter_topic"
#define UPDATE_ON(col) "has_column_privilege($1, " T ", '" col "', 'UPDATE')"

enum { FOR_RELAY = 1, FOR_PRODUCER = 2, ONLY_DELETES = 4, ONLY_FLOOR = 8 };

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
} Need;

static const Need
    needs
        [] =
            {
                {FOR_RELAY | FOR_PRODUCER, "USAGE on the outbox table's schema", NULL,
                 "has_schema_privilege($1, (SELECT relnamespace FROM pg_class WHERE oid = " T
                 "), 'USAGE')",
                 "format('GRANT USAGE ON SCHEMA %s TO %I', (SELECT "
                 "relnamespace::regnamespace::text FROM "
                 "pg_class WHERE oid = " T "), $2::text)"},
                {FOR_RELAY, "SELECT on the outbox table", NULL,
                 "has_table_privilege($1, " T ", 'SELECT')",
                 "format('GRANT SELECT ON %s TO %I', " T ", $2::text)"},
                {FOR_RELAY, "UPDATE on the outbox table's delivery columns", NULL,
                 UPDATE_ON("sent_at") " AND " UPDATE_ON("attempts") " AND " UPDATE_ON("rejections") " AND " UPDATE_ON(
                     "last_error") " AND " UPDATE_ON("next_attempt_at") " AND " UPDATE_ON("dead_at") " AND " UPDATE_ON("dead_letter_topic"),
                 "format('GRANT UPDATE (" UPDATE_COLUMNS ") ON %s TO %I', " T ", $2::text)"},
                {FOR_RELAY | ONLY_DELETES,
                 "DELETE on the outbox table (--on-sent delete, --retention)", NULL,
                 "has_table_privilege($1, " T ", 'DELETE')",
                 "format('GRANT DELETE ON %s TO %I', " T ", $2::text)"},
                {FOR_RELAY | FOR_PRODUCER, "EXECUTE on outbox_lane(text, text)",
                 LANE_FN " IS NOT NULL", "has_function_privilege($1, " LANE_FN ", 'EXECUTE')",
                 "format('GRANT EXECUTE ON FUNCTION outbox_lane(text, text) TO %I', $2::text)"},
                {FOR_RELAY,
                 "EXECUTE on the wakeup's functions outbox_relay_sleep() and outbox_relay_wake()",
                 SLEEP_FN " IS NOT NULL AND " WAKE_FN " IS NOT NULL",
                 "has_function_privilege($1, " SLEEP_FN
                 ", 'EXECUTE') AND has_function_privilege($1, " WAKE_FN ", 'EXECUTE')",
                 "format('GRANT EXECUTE ON FUNCTION outbox_relay_sleep(), outbox_relay_wake() TO "
                 "%I', $2::text)"},
                {FOR_RELAY,
                 "SELECT, INSERT, UPDATE and DELETE on outbox_wakeup_state (relays before 0007)",
                 WAKEUP_STATE " IS NOT NULL",
                 "has_table_privilege($1, " WAKEUP_STATE
                 ", 'SELECT') AND has_table_privilege($1, " WAKEUP_STATE
                 ", 'INSERT') AND has_table_privilege($1, " WAKEUP_STATE
                 ", 'UPDATE') AND has_table_privilege($1, " WAKEUP_STATE ", 'DELETE')",
                 "format('GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_wakeup_state TO %I', "
                 "$2::text)"},
                {FOR_RELAY | ONLY_FLOOR,
                 "SELECT on the order column's sequence (the claim floor, 0008)",
                 SEQ " IS NOT NULL", "has_sequence_privilege($1, " SEQ ", 'SELECT, USAGE')",
                 "format('GRANT SELECT ON SEQUENCE %s TO %I', " SEQ ", $2::text)"},
                {FOR_PRODUCER, "INSERT on the outbox table", NULL,
                 "has_table_privilege($1, " T ", 'INSERT')",
                 "format('GRANT INSERT ON %s TO %I', " T ", $2::text)"},
                {FOR_PRODUCER, "SELECT on outbox_wakeup_state (producers before 0007)",
                 WAKEUP_STATE " IS NOT NULL", "has_table_privilege($1, " WAKEUP_STATE ", 'SELECT')",
                 "format('GRANT SELECT ON outbox_wakeup_state TO %I', $2::text)"},
};

#define N_NEEDS (sizeof(needs) / sizeof(needs[0]))

/* Where a need stands for one role. */
typedef enum { NEED_NOT_APPLICABLE, NEED_HELD, NEED_MISSING, NEED_UNKNOWN } NeedState;

/* Evaluates need for role (held?) and writes the GRANT that gives it to grantee in grant (empty
 * when it does not apply). */
static NeedState need_state(PGconn *conn, const TableMap *map, const Need *need, const char *role,
                            const char *grantee, char *grant, size_t grantlen)
{
    char tmpl[4096], err[256], q[600];
    snprintf(tmpl, sizeof(tmpl),
             "SELECT CASE WHEN %s THEN coalesce(%s, false) END,"
             " CASE WHEN %s THEN %s END",
             need->exists ? need->exists : "true", need->held, need->exists ? need->exists : "true",
             need->grant);
    *grant = '\0';
    char *sql = table_sql(map, conn, tmpl, err, sizeof(err));
    if (!sql) {
        log_error("cannot write a privilege's check", "error=%s", log_quote(err, q, sizeof(q)));
        return NEED_UNKNOWN;
    }
    const char *params[2] = {role, grantee};
    DbError e;
    PGresult *res = db_query(conn, sql, 2, params, &e);
    free(sql);
    if (!res) {
        log_error("cannot check a privilege", "privilege=%s error=%s",
                  log_quote(need->what, q, sizeof(q)), db_error_text(&e));
        return NEED_UNKNOWN;
    }
    NeedState state = PQgetisnull(res, 0, 0)                    ? NEED_NOT_APPLICABLE
                      : strcmp(PQgetvalue(res, 0, 0), "t") == 0 ? NEED_HELD
                                                                : NEED_MISSING;
    if (!PQgetisnull(res, 0, 1))
        snprintf(grant, grantlen, "%s", PQgetvalue(res, 0, 1));
    PQclear(res);
    return state;
}

static const char *const roles[2] = {"outbox_relay", "outbox_producer"};

/* Creates role (NOLOGIN, as 0006 does) when it is missing and the session may. True when the
 * role exists afterwards. */
static bool ensure_role(PGconn *conn, const char *role)
{
    const char *params[1] = {role};
    DbError e;
    PGresult *res = db_query(conn, "SELECT to_regrole($1) IS NOT NULL", 1, params, &e);
    bool exists = res && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    if (!res || exists)
        return exists;
    char sql[128];
    snprintf(sql, sizeof(sql), "CREATE ROLE %s NOLOGIN", role); /* a constant name: no quoting */
    if (db_exec(conn, sql, &e)) {
        log_info("role created", "role=%s", role);
        return true;
    }
    /* Created meanwhile by a concurrent migrate: fine. */
    if (strcmp(e.sqlstate, "42710") == 0 || strcmp(e.sqlstate, "23505") == 0)
        return true;
    if (strcmp(e.sqlstate, "42501") != 0)
        log_warn("cannot create the role", "role=%s error=%s", role, db_error_text(&e));
    return false;
}

bool grants_apply(PGconn *conn, const TableMap *map)
{
    bool exists[2];
    char missing[64] = "";
    for (int r = 0; r < 2; r++) {
        exists[r] = ensure_role(conn, roles[r]);
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
         * it (README, "Least privilege"), and a later migrate must not give it back. */
        char unused[1024];
        bool fresh = r == 0 && need_state(conn, map, &needs[1], roles[r], roles[r], unused,
                                          sizeof(unused)) == NEED_MISSING;
        for (size_t i = 0; i < N_NEEDS; i++) {
            const Need *need = &needs[i];
            if (!(need->flags & (r == 0 ? FOR_RELAY : FOR_PRODUCER)) ||
                ((need->flags & ONLY_DELETES) && !fresh))
                continue;
            char grant[1024], q1[600], q2[1100];
            NeedState st = need_state(conn, map, need, roles[r], roles[r], grant, sizeof(grant));
            if (st == NEED_NOT_APPLICABLE)
                continue;
            /* GRANT again even when held: it costs nothing, and the read-back below decides. */
            DbError e;
            if (st != NEED_UNKNOWN && !db_exec(conn, grant, &e))
                log_warn("grant failed", "grant=%s error=%s", log_quote(grant, q2, sizeof(q2)),
                         db_error_text(&e));
            st = need_state(conn, map, need, roles[r], roles[r], grant, sizeof(grant));
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
        PGresult *res = db_query(conn, "SELECT current_user", 0, NULL, &e);
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

int grants_check(PGconn *conn, const TableMap *map, GrantsUse use, GrantsMissingFn fn, void *arg)
{
    DbError e;
    PGresult *res =
        db_query(conn,
                 "SELECT current_user, CASE WHEN to_regrole('outbox_relay') IS NOT NULL"
                 " AND pg_has_role(current_user, 'outbox_relay', 'MEMBER') THEN 'outbox_relay'"
                 " ELSE current_user::text END",
                 0, NULL, &e);
    if (!res) {
        log_error("cannot read the session's role", "error=%s", db_error_text(&e));
        return -1;
    }
    char role[128], grantee[128];
    snprintf(role, sizeof(role), "%s", PQgetvalue(res, 0, 0));
    snprintf(grantee, sizeof(grantee), "%s", PQgetvalue(res, 0, 1));
    PQclear(res);
    int missing = 0;
    for (size_t i = 0; i < N_NEEDS; i++) {
        const Need *need = &needs[i];
        if (!(need->flags & FOR_RELAY) || ((need->flags & ONLY_DELETES) && !use.deletes) ||
            ((need->flags & ONLY_FLOOR) && !use.claim_floor))
            continue;
        char grant[1024];
        NeedState st = need_state(conn, map, need, role, grantee, grant, sizeof(grant));
        if (st == NEED_UNKNOWN)
            return -1;
        if (st == NEED_MISSING) {
            missing++;
            fn(need->what, grant, arg);
        }
    }
    return missing;
}
