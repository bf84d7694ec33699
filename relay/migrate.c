#include "migrate.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <string.h>

#include "log.h"
#include "pg.h"

/* Any fixed number works; it only has to differ from the application's own advisory locks. */
#define MIGRATE_LOCK_KEY "7243016118520431001"

/* Runs one command; on failure logs it with the migration's name and returns false. */
static bool exec_ok(PGconn *conn, const char *sql, const char *what)
{
    PGresult *res = PQexec(conn, sql);
    ExecStatusType st = PQresultStatus(res);
    bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok) {
        char q[512];
        log_error("migration failed", "step=%s error=%s", what,
                  log_quote(pg_error_line(PQresultErrorMessage(res)), q, sizeof(q)));
    }
    PQclear(res);
    return ok;
}

static bool is_applied(PGconn *conn, const char *version, bool *applied)
{
    const char *params[1] = {version};
    PGresult *res = PQexecParams(conn, "SELECT 1 FROM schema_migrations WHERE version = $1", 1,
                                 NULL, params, NULL, NULL, 0);
    bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;
    if (ok)
        *applied = PQntuples(res) > 0;
    else {
        char q[512];
        log_error("migration failed", "step=check error=%s",
                  log_quote(pg_error_line(PQresultErrorMessage(res)), q, sizeof(q)));
    }
    PQclear(res);
    return ok;
}

static bool apply_one(PGconn *conn, const MigrationFile *m)
{
    if (!exec_ok(conn, "BEGIN", m->name))
        return false;
    if (!exec_ok(conn, m->sql, m->name))
        goto failed;
    const char *params[1] = {m->name};
    PGresult *res = PQexecParams(conn, "INSERT INTO schema_migrations (version) VALUES ($1)", 1,
                                 NULL, params, NULL, NULL, 0);
    bool recorded = PQresultStatus(res) == PGRES_COMMAND_OK;
    PQclear(res);
    if (!recorded || !exec_ok(conn, "COMMIT", m->name))
        goto failed;
    return true;
failed:
    exec_ok(conn, "ROLLBACK", "rollback");
    return false;
}

int migrate_run(const char *conninfo)
{
    char masked[1024], q_url[1100], q_err[600];
    PGconn *conn = PQconnectdb(conninfo);
    if (PQstatus(conn) != CONNECTION_OK) {
        log_error(
            "cannot connect to PostgreSQL", "url=%s error=%s",
            log_quote(log_mask_conninfo(conninfo, masked, sizeof(masked)), q_url, sizeof(q_url)),
            log_quote(pg_error_line(PQerrorMessage(conn)), q_err, sizeof(q_err)));
        PQfinish(conn);
        return 1;
    }

    int rc = 1;
    size_t applied_now = 0;
    /* Session-level lock: released by the unlock below or when the connection closes. */
    if (!exec_ok(conn, "SET client_min_messages = warning", "setup") ||
        !exec_ok(conn, "SELECT pg_advisory_lock(" MIGRATE_LOCK_KEY ")", "lock") ||
        !exec_ok(conn,
                 "CREATE TABLE IF NOT EXISTS schema_migrations ("
                 " version text PRIMARY KEY,"
                 " applied_at timestamptz NOT NULL DEFAULT now())",
                 "schema_migrations"))
        goto done;

    for (size_t i = 0; i < migration_count; i++) {
        const MigrationFile *m = &migration_files[i];
        bool applied = false;
        if (!is_applied(conn, m->name, &applied))
            goto done;
        if (applied)
            continue;
        if (!apply_one(conn, m))
            goto done;
        log_info("migration applied", "version=%s", m->name);
        applied_now++;
    }
    exec_ok(conn, "SELECT pg_advisory_unlock(" MIGRATE_LOCK_KEY ")", "unlock");
    log_info("migrations up to date", "applied=%zu total=%zu", applied_now, migration_count);
    rc = 0;
done:
    PQfinish(conn);
    return rc;
}
