#include "admin.h"

#include <errno.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "db.h"
#include "log.h"
#include "monotime.h"
#include "squatters.h"
#include "statements.h"
#include "table.h"

/* The error of a statement given up at its deadline: the connection is mid-statement
 * (e->conn_lost), and the caller closes it. */
static void given_up(DbError *e, const char *what, long timeout_s)
{
    snprintf(e->sqlstate, sizeof(e->sqlstate), "%s", "");
    snprintf(e->message, sizeof(e->message),
             "PostgreSQL did not %s within %ld s (a stopped or overloaded server, or a proxy "
             "that lost it)",
             what, timeout_s);
    e->conn_lost = true;
}

int admin_poll_ms(double left_s)
{
    /* (int)(left_s * 1000) is undefined past INT_MAX ms (~24.8 days), and x86 gives INT_MIN: a
     * negative timeout, which poll() takes as "for ever". replay's batch bound reaches that (the
     * statement bound plus ten times a summary bounded at ten times it: up to ~101 days). The
     * callers loop and compute what is left after each wake-up, so a capped wait is only one of
     * several. */
    if (!(left_s > 0))
        return 1;
    if (left_s >= ADMIN_POLL_MAX_MS / 1000.0)
        return ADMIN_POLL_MAX_MS;
    return (int)(left_s * 1000) + 1;
}

/* Sends what PQsendQuery* queued on the (non-blocking) connection by the deadline. A statement
 * is sent whole before its answer is awaited, and a large one (replay's update of a batch, up to
 * ~1.2 MB) does not fit the sockets' buffers: sent on a blocking connection, libpq waited to
 * write it for as long as the server did not read (a stopped server, a proxy that lost it), with
 * no bound at all. Input that comes meanwhile (a notice) is read, as libpq asks. */
static bool flush_by(PGconn *conn, double deadline, long timeout_s, DbError *e)
{
    for (;;) {
        int queued = PQflush(conn);
        if (queued == 0)
            return true;
        if (queued < 0) {
            db_result(conn, NULL, e);
            return false;
        }
        double left = deadline - monotime_now();
        if (left <= 0) {
            given_up(e, "read the statement", timeout_s);
            return false;
        }
        struct pollfd p = {.fd = PQsocket(conn), .events = POLLIN | POLLOUT};
        int ready = poll(&p, 1, admin_poll_ms(left));
        if ((ready < 0 && errno != EINTR) ||
            (ready > 0 && (p.revents & POLLIN) && !PQconsumeInput(conn))) {
            db_result(conn, NULL, e);
            return false;
        }
    }
}

/* Collects the results of the statement just sent: the last one, or the first error. Blocking
 * libpq waits for an answer as long as the socket stays open, and the keepalives db_connect sets
 * end only a silent network: a stopped server, or one behind a proxy that accepted the
 * connection, acknowledges every packet and never answers. Past the deadline the statement is
 * given up (e->conn_lost); the caller closes the connection. With on_row (single-row mode), each
 * row goes to it as it comes, in a result of its own that is cleared after, and the last result
 * (PGRES_TUPLES_OK) holds none. */
static PGresult *await_answer(PGconn *conn, double deadline, long timeout_s, AdminRowFn on_row,
                              void *arg, DbError *e)
{
    PGresult *last = NULL;
    for (;;) {
        while (PQisBusy(conn)) {
            double left = deadline - monotime_now();
            if (left <= 0) {
                PQclear(last);
                given_up(e, "answer", timeout_s);
                return NULL;
            }
            struct pollfd p = {.fd = PQsocket(conn), .events = POLLIN};
            int ready = poll(&p, 1, admin_poll_ms(left));
            if ((ready < 0 && errno != EINTR) || (ready > 0 && !PQconsumeInput(conn))) {
                PQclear(last);
                return db_result(conn, NULL, e);
            }
        }
        PGresult *res = PQgetResult(conn);
        if (!res)
            break;
        if (PQresultStatus(res) == PGRES_SINGLE_TUPLE) {
            on_row(res, arg);
            PQclear(res);
            continue;
        }
        /* One statement, one result; an error result is kept over what follows it. */
        if (last && PQresultStatus(last) == PGRES_FATAL_ERROR) {
            PQclear(res);
            continue;
        }
        PQclear(last);
        last = res;
    }
    return db_result(conn, last, e);
}

/* Sends sql (with params, or as a script: nparams < 0) and awaits its answer, both by one
 * deadline timeout_s from now. The connection is non-blocking meanwhile, so that no write waits
 * past it, and blocking again after an answer; one given up stays non-blocking, so that
 * PQfinish's goodbye cannot wait on a server that does not read either. */
static PGresult *run_by_deadline(PGconn *conn, const char *sql, int nparams,
                                 const char *const *params, long timeout_s, AdminRowFn on_row,
                                 void *arg, DbError *e)
{
    double deadline = monotime_now() + (double)timeout_s;
    bool blocking = !PQisnonblocking(conn);
    e->conn_lost = false;
    if (blocking && PQsetnonblocking(conn, 1) != 0)
        return db_result(conn, NULL, e);
    int sent = nparams < 0 ? PQsendQuery(conn, sql)
                           : PQsendQueryParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
    PGresult *res = NULL;
    if (!sent) {
        res = db_result(conn, NULL, e);
    } else if (on_row && !PQsetSingleRowMode(conn)) {
        /* Sent, its answer left unread: the connection is mid-statement. */
        e->sqlstate[0] = '\0';
        snprintf(e->message, sizeof(e->message), "cannot read the statement's rows one at a time");
        e->conn_lost = true;
    } else if (flush_by(conn, deadline, timeout_s, e))
        res = await_answer(conn, deadline, timeout_s, on_row, arg, e);
    if (blocking && !e->conn_lost)
        PQsetnonblocking(conn, 0);
    return res;
}

PGresult *admin_query_within(PGconn *conn, const char *sql, int nparams, const char *const *params,
                             long timeout_s, DbError *e)
{
    return run_by_deadline(conn, sql, nparams, params, timeout_s, NULL, NULL, e);
}

PGresult *admin_script_within(PGconn *conn, const char *sql, long timeout_s, DbError *e)
{
    return run_by_deadline(conn, sql, -1, NULL, timeout_s, NULL, NULL, e);
}

/* tmpl written for map's table (table_sql), or NULL with e saying why; the caller frees it. */
static char *template_sql(PGconn *conn, const TableMap *map, const char *tmpl, DbError *e)
{
    e->conn_lost = false;
    char err[256];
    char *sql = table_sql(map, conn, tmpl, err, sizeof(err));
    if (!sql) {
        e->sqlstate[0] = '\0';
        snprintf(e->message, sizeof(e->message), "cannot write the statement: %s", err);
    }
    return sql;
}

PGresult *admin_template_within(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                                const char *const *params, ExecStatusType expect, long timeout_s,
                                DbError *e)
{
    char *sql = template_sql(conn, map, tmpl, e);
    if (!sql)
        return NULL;
    PGresult *res = admin_query_within(conn, sql, nparams, params, timeout_s, e);
    free(sql);
    if (res && PQresultStatus(res) != expect) {
        PQclear(res);
        e->sqlstate[0] = '\0';
        snprintf(e->message, sizeof(e->message), "unexpected result");
        return NULL;
    }
    return res;
}

bool admin_template_rows_within(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                                const char *const *params, long timeout_s, AdminRowFn on_row,
                                void *arg, DbError *e)
{
    char *sql = template_sql(conn, map, tmpl, e);
    if (!sql)
        return false;
    PGresult *res = run_by_deadline(conn, sql, nparams, params, timeout_s, on_row, arg, e);
    free(sql);
    bool ok = res && PQresultStatus(res) == PGRES_TUPLES_OK;
    if (res && !ok) {
        e->sqlstate[0] = '\0';
        snprintf(e->message, sizeof(e->message), "unexpected result");
    }
    PQclear(res);
    return ok;
}

/* The one-shot commands' statement bound (--statement-timeout): a process runs one command. */
static long statement_timeout_s = ADMIN_STATEMENT_TIMEOUT_S;

void admin_set_statement_timeout(long seconds)
{
    statement_timeout_s = seconds < 1 ? 1
                          : seconds > CONFIG_STATEMENT_TIMEOUT_MAX_S
                              ? CONFIG_STATEMENT_TIMEOUT_MAX_S
                              : seconds;
}

long admin_answer_s(void)
{
    /* The grace lets the server's own cancel (a clear "canceling statement due to statement
     * timeout") arrive first; a short bound (a test's, a strict operator's) gets as short a
     * grace, so the whole wait stays near what was asked for. */
    return statement_timeout_s + (statement_timeout_s < ADMIN_ANSWER_GRACE_S
                                      ? statement_timeout_s
                                      : ADMIN_ANSWER_GRACE_S);
}

PGresult *admin_query(PGconn *conn, const char *sql, int nparams, const char *const *params,
                      DbError *e)
{
    return admin_query_within(conn, sql, nparams, params, admin_answer_s(), e);
}

bool admin_bound_session(PGconn *conn, DbError *e)
{
    /* The server's own limit ends a statement that waits for a lock (a migration's ALTER, a
     * VACUUM FULL, an operator's open transaction) with a clear error, and takes the waiting
     * backend out of the lock queue, where it would hold up everyone queued behind it. A
     * stricter limit already in force (the connection string's options, the role's or the
     * database's setting) stays: the bound only shortens a longer one, or none. */
    char bound[32];
    snprintf(bound, sizeof(bound), "%lds", statement_timeout_s);
    const char *params[1] = {bound};
    /* DB_BOUND_SETTING_SQL with the bound as a parameter. */
    PGresult *res = admin_query(conn,
                                "SELECT pg_catalog.set_config('statement_timeout', $1::text, false)"
                                " WHERE pg_catalog.current_setting('statement_timeout')::interval"
                                " NOT BETWEEN interval '1 ms' AND $1::text::interval",
                                1, params, e);
    bool ok = res != NULL;
    PQclear(res);
    return ok;
}

/* The last admin_connect_unbounded's refusal of an old server (one-shot commands: one thread). */
static bool connect_unsupported;

int admin_connect_exit_code(void)
{
    return connect_unsupported ? 2 : 1;
}

PGconn *admin_connect_unbounded(const char *conninfo)
{
    char err[300], q[600];
    PGconn *conn =
        db_connect_checked(conninfo, "outbox-relay", &connect_unsupported, err, sizeof(err));
    if (!conn)
        log_error("cannot connect to PostgreSQL", "error=%s", log_quote(err, q, sizeof(q)));
    return conn;
}

PGconn *admin_connect(const char *conninfo)
{
    char q[600];
    PGconn *conn = admin_connect_unbounded(conninfo);
    if (!conn)
        return NULL;
    DbError e;
    if (!admin_bound_session(conn, &e)) {
        log_error("query failed", "error=%s", log_quote(e.message, q, sizeof(q)));
        PQfinish(conn);
        return NULL;
    }
    return conn;
}

/* no_verdict (may be NULL): set when the statement was sent and neither a result nor an error of
 * the server's came back (no answer within the bound, the connection lost): its outcome is
 * unknown, and the caller, which says so, is left to log it (*e filled in). */
static PGresult *exec_template_e(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                                 const char *const *params, ExecStatusType expect, bool bounded,
                                 DbError *e, bool *no_verdict)
{
    char err[256];
    char *sql = table_sql(map, conn, tmpl, err, sizeof(err));
    if (!sql) {
        log_error("cannot write the statement", "error=%s", err);
        return NULL;
    }
    PGresult *res = bounded ? admin_query(conn, sql, nparams, params, e)
                            : db_query(conn, sql, nparams, params, e);
    free(sql);
    if (!res && no_verdict && !e->sqlstate[0]) {
        *no_verdict = true;
        return NULL;
    }
    /* change_dead (the caller with no_verdict) says in its own line what a lock wait means. */
    if (!res && no_verdict && strcmp(e->sqlstate, "55P03") == 0)
        return NULL;
    if (res && PQresultStatus(res) != expect) {
        PQclear(res);
        res = NULL;
        snprintf(e->message, sizeof(e->message), "unexpected result");
    }
    if (!res) {
        char q[600];
        log_error("query failed", "error=%s", log_quote(e->message, q, sizeof(q)));
    }
    return res;
}

static PGresult *exec_template(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                               const char *const *params, ExecStatusType expect, bool bounded)
{
    DbError e;
    return exec_template_e(conn, map, tmpl, nparams, params, expect, bounded, &e, NULL);
}

PGresult *admin_exec(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                     const char *const *params, ExecStatusType expect)
{
    return exec_template(conn, map, tmpl, nparams, params, expect, true);
}

PGresult *admin_exec_unbounded(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                               const char *const *params, ExecStatusType expect)
{
    return exec_template(conn, map, tmpl, nparams, params, expect, false);
}

PGresult *admin_lane_squatters(PGconn *conn, const TableMap *map, DbError *e)
{
    char err[256];
    char *sql = table_sql(map, conn, SQL_LANE_SQUATTERS, err, sizeof(err));
    if (!sql) {
        *e = (DbError){.conn_lost = false};
        snprintf(e->message, sizeof(e->message), "%s", err);
        return NULL;
    }
    PGresult *first = admin_query(conn, sql, 0, NULL, e);
    if (!first) {
        free(sql);
        return NULL;
    }
    SquatSeen seen_first = {0};
    for (int i = 0; i < PQntuples(first); i++)
        (void)squat_counts(first, i, NULL, &seen_first);
    if (seen_first.n == 0) {
        free(sql);
        return first; /* every row counts at once: no second look */
    }
    PQclear(first);
    struct timespec wait = {ADMIN_SQUAT_RECHECK_MS / 1000,
                            (ADMIN_SQUAT_RECHECK_MS % 1000) * 1000000L};
    while (nanosleep(&wait, &wait) != 0 && errno == EINTR)
        ;
    PGresult *now = admin_query(conn, sql, 0, NULL, e);
    free(sql);
    /* The second look's rows that count (squatters.h). */
    PGresult *out = now ? PQcopyResult(now, PG_COPYRES_ATTRS) : NULL;
    bool copied = out != NULL;
    SquatSeen seen_now = {0};
    for (int i = 0, k = 0; copied && i < PQntuples(now); i++) {
        if (!squat_counts(now, i, &seen_first, &seen_now))
            continue;
        for (int col = 0; copied && col < PQnfields(now); col++)
            copied =
                PQsetvalue(out, k, col, PQgetisnull(now, i, col) ? NULL : PQgetvalue(now, i, col),
                           PQgetlength(now, i, col)) != 0;
        k++;
    }
    if (now && !copied) {
        PQclear(out);
        out = NULL;
        *e = (DbError){.conn_lost = false};
        snprintf(e->message, sizeof(e->message), "out of memory");
    }
    PQclear(now);
    return out;
}

/* Prints row as one JSON line. False when it cannot (a text that is not UTF-8: a SQL_ASCII
 * database stores any bytes), with an error logged: the row must not vanish from the list. */
static bool print_json(PGresult *res, int row)
{
    json_t *o = json_pack(
        "{s:I, s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:s?, s:s, s:s, s:s?, s:s?}", "id",
        (json_int_t)strtoll(PQgetvalue(res, row, 0), NULL, 10), "event_id", PQgetvalue(res, row, 1),
        "aggregate_type", PQgetvalue(res, row, 2), "aggregate_id", PQgetvalue(res, row, 3),
        "event_type", PQgetvalue(res, row, 4), "attempts", atoi(PQgetvalue(res, row, 5)),
        "rejections", atoi(PQgetvalue(res, row, 6)), "dead_at", PQgetvalue(res, row, 7),
        "dead_letter_topic", *PQgetvalue(res, row, 8) ? PQgetvalue(res, row, 8) : NULL,
        "last_error", PQgetvalue(res, row, 9), "dead_letter_copy", PQgetvalue(res, row, 10),
        "dead_letter_retry_at", *PQgetvalue(res, row, 11) ? PQgetvalue(res, row, 11) : NULL,
        "dead_letter_parked",
        strcmp(PQgetvalue(res, row, 10), "parked") == 0 ? DEAD_COPY_PARKED_WHY : NULL);
    /* ASCII only: U+2028, U+0085 and bidi characters of a row reach the terminal as \u escapes,
     * and control characters are escaped by JSON itself. */
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    bool printed = text != NULL;
    if (printed)
        puts(text);
    else
        log_error("cannot print a dead-lettered event as JSON: a text column is not UTF-8",
                  "id=%lld", strtoll(PQgetvalue(res, row, 0), NULL, 10));
    free(text);
    json_decref(o);
    return printed;
}

int admin_dead(const Config *cfg)
{
    admin_set_statement_timeout(cfg->statement_timeout_s);
    PGconn *conn = admin_connect(cfg->database_url);
    if (!conn)
        return admin_connect_exit_code();
    long n = 0;
    int unprinted = 0, rc = 0;
    char after[32] = "", batch[32];
    snprintf(batch, sizeof(batch), "%d", ADMIN_DEAD_BATCH);
    for (;;) {
        const char *params[3] = {NULL, *after ? after : NULL, batch};
        PGresult *res = admin_exec(conn, &cfg->map, SQL_DEAD, 3, params, PGRES_TUPLES_OK);
        if (!res) {
            rc = 1;
            break;
        }
        int rows = PQntuples(res);
        /* The heading once the first batch is read: a command that fails prints its one line. */
        if (!cfg->json && !*after)
            printf("%-10s %-36s %-24s %-8s %-20s %-26s %s\n", "ID", "EVENT_ID", "AGGREGATE",
                   "ATTEMPTS", "DEAD_AT", "COPY", "LAST_ERROR");
        for (int i = 0; i < rows; i++) {
            if (cfg->json) {
                unprinted += !print_json(res, i);
                continue;
            }
            /* Every text column is the writers' (or an error quoting them): escaped as in the
             * log, so a row cannot print a newline, ESC or OSC sequence, U+2028 or a bidi
             * override to the operator's terminal. */
            char event_id[160], agg[520], error[1024], copy[48];
            /* The name is cut where its escaped text fills agg, with "..." (log_escape). Joined
             * into a buffer longer than agg, a name cut here is one that buffer cuts too, so
             * the mark shows: joined into 256 bytes, a longer name (the columns are text, of
             * any length) lost its end unmarked, and read as another aggregate's. */
            char aggregate[sizeof(agg) + 8];
            snprintf(aggregate, sizeof(aggregate), "%s/%s", PQgetvalue(res, i, 2),
                     PQgetvalue(res, i, 3));
            /* The copy's state with its when or why: the retry time of one that failed, and for
             * a parked one (never retried until requeued) that it is too large. */
            const char *state = PQgetvalue(res, i, 10);
            if (strcmp(state, "retrying") == 0)
                snprintf(copy, sizeof(copy), "retry %s", PQgetvalue(res, i, 11));
            else if (strcmp(state, "parked") == 0)
                snprintf(copy, sizeof(copy), "parked: too large");
            else
                snprintf(copy, sizeof(copy), "%s", state);
            printf("%-10s %-36s %-24s %-8s %-20s %-26s %s\n", PQgetvalue(res, i, 0),
                   log_escape(PQgetvalue(res, i, 1), event_id, sizeof(event_id)),
                   log_escape(aggregate, agg, sizeof(agg)), PQgetvalue(res, i, 5),
                   PQgetvalue(res, i, 7), copy,
                   log_escape(PQgetvalue(res, i, 9), error, sizeof(error)));
        }
        n += rows;
        if (rows > 0)
            snprintf(after, sizeof(after), "%s", PQgetvalue(res, rows - 1, 0));
        PQclear(res);
        if (rows < ADMIN_DEAD_BATCH)
            break;
    }
    if (!cfg->json && rc == 0)
        printf("%ld dead-lettered event%s\n", n, n == 1 ? "" : "s");
    PQfinish(conn);
    return rc || unprinted ? 1 : 0;
}

/* Wakes the relays' sleeping sessions (they LISTEN) after a batch that changed rows: an UPDATE
 * or a DELETE fires no wakeup trigger (that is an INSERT's), so requeued events, and with
 * --on-poison hold the events a purged one held back, waited for the relays' poll timer
 * (--poll-interval, up to an hour) rather than going at once. A failure costs that wait, not
 * the change: said once, not counted against the command. False (e filled in) when the connection
 * is lost or left mid-statement (no answer within the bound): nothing more may be sent on it, and
 * the next batch failed with libpq's "another command is already in progress", which named no
 * cause. */
static bool wake_relays(PGconn *conn, bool *warned, DbError *e)
{
    PGresult *res = admin_query(conn, "NOTIFY " WAKEUP_CHANNEL, 0, NULL, e);
    if (!res && !*warned) {
        char q[600];
        log_warn("cannot wake the relays: the events go at their next poll (--poll-interval)",
                 "error=%s", log_quote(db_error_text(e), q, sizeof(q)));
        *warned = true;
    }
    PQclear(res);
    return res || !e->conn_lost;
}

/* The session's setting `name` (a duration: statement_timeout, lock_timeout) in whole
 * milliseconds into *ms; false with e filled in when the query failed. name is a literal of this
 * file, never input. The product names pg_catalog's operator, numeric by numeric: a look-alike
 * `numeric * integer` someone with CREATE on the schema planted would be chosen over it
 * (docs/security.md; 15_shadowing). */
static bool setting_ms(PGconn *conn, const char *name, long *ms, DbError *e)
{
    const char *params[1] = {name};
    PGresult *res = admin_query(conn,
                                "SELECT (extract(epoch FROM pg_catalog.current_setting($1::text)"
                                "::interval) OPERATOR(pg_catalog.*) 1000::numeric)::bigint",
                                1, params, e);
    if (!res)
        return false;
    *ms = strtol(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    return true;
}

/* Asks on the terminal whether to delete every dead-lettered event, as replay asks about a large
 * selection: a deletion is for good, and `purge-dead --all` typed for `dead` or `requeue --all`
 * deleted them all unasked. Asked only when stdin and stderr are a terminal: a script (no
 * terminal) goes on as it always has, and --yes skips the question (the caller). Nothing dead:
 * nothing to ask. Confirmed, *snapshot gets the snapshot the count read (malloc'd; the caller
 * frees it), for the purge to keep to (SQL_DEAD_ROWS_COUNTED): the question waits on a person, and
 * an event that dies meanwhile was not among the N it named. *counted gets N (0 when nothing was
 * asked; past ADMIN_PURGE_COUNT_MAX, more). Returns 0 to go on, 1 when not confirmed or the count
 * failed (said). */
static int confirm_purge(PGconn *conn, const Config *cfg, char **snapshot, long *counted)
{
    if (!isatty(STDIN_FILENO) || !isatty(STDERR_FILENO))
        return 0;
    char cap[32];
    snprintf(cap, sizeof(cap), "%ld", ADMIN_PURGE_COUNT_MAX + 1);
    const char *params[4] = {NULL, NULL, cap, NULL};
    PGresult *res = admin_exec(conn, &cfg->map, SQL_DEAD_COUNT, 4, params, PGRES_TUPLES_OK);
    if (!res)
        return 1;
    long n = strtol(PQgetvalue(res, 0, 0), NULL, 10);
    if (n > 0 && !(*snapshot = strdup(PQgetvalue(res, 0, 1)))) {
        PQclear(res);
        fprintf(stderr, "purge-dead: out of memory; nothing changed\n");
        return 1;
    }
    PQclear(res);
    if (n == 0)
        return 0;
    *counted = n;
    if (n > ADMIN_PURGE_COUNT_MAX)
        fprintf(stderr, "purge more than %ld dead-lettered events for good? [y/N] ",
                ADMIN_PURGE_COUNT_MAX);
    else
        fprintf(stderr, "purge %ld dead-lettered event%s for good? [y/N] ", n, n == 1 ? "" : "s");
    char answer[16] = "";
    if (!fgets(answer, sizeof(answer), stdin) || (answer[0] != 'y' && answer[0] != 'Y')) {
        fprintf(stderr, "purge-dead: not confirmed; nothing changed\n");
        return 1;
    }
    return 0;
}

/* The batch a requeue or purge-dead error line names: the one id asked for, or where an --all
 * run stood (after: the last id a batch changed, "" before the first). */
static void batch_named(const Config *cfg, const char *id, const char *after, char *out,
                        size_t size)
{
    if (!cfg->all)
        snprintf(out, size, "id %s", id);
    else if (*after)
        snprintf(out, size, "ids above %s", after);
    else
        snprintf(out, size, "the first ids");
}

/* Runs sql (SQL_REQUEUE or SQL_PURGE_DEAD: $1 the id, or NULL for all) a batch at a time until a
 * batch comes back short, and reports how many rows it changed as `verb`. A failure after some
 * batches leaves them changed (each was committed) and says how many. A batch that gets no
 * verdict (its commit waits for a synchronous standby that does not answer, past admin_query's
 * bound; or the connection is lost) may or may not have committed: said so, exit 1. */
static int change_dead(const Config *cfg, const char *sql, const char *verb, bool ask)
{
    admin_set_statement_timeout(cfg->statement_timeout_s);
    bool purge = strcmp(verb, "requeued") != 0;             /* SQL_PURGE_DEAD takes $4 too */
    const char *command = purge ? "purge-dead" : "requeue"; /* the lines name it */
    PGconn *conn = admin_connect(cfg->database_url);
    if (!conn)
        return admin_connect_exit_code();
    /* The snapshot the confirmation counted at ($4 of SQL_DEAD_ROWS_COUNTED; NULL: none), and N. */
    char *snapshot = NULL;
    long counted = 0;
    if (ask && confirm_purge(conn, cfg, &snapshot, &counted)) {
        free(snapshot);
        PQfinish(conn);
        return 1;
    }
    /* A batch locks its rows (SQL_DEAD_BATCH), and a dead event someone else holds (a relay
     * publishing its copy to the dead-letter topic, up to --delivery-timeout; an operator's open
     * transaction) held the whole batch until the statement timeout, which said only "canceling
     * statement due to statement timeout". The lock wait ends first (three quarters of the
     * bound, at most ADMIN_DEAD_LOCK_TIMEOUT_MS; a stricter lock_timeout of the connection
     * string stays), so that the error can say what held it. Not skipped (SKIP LOCKED): a batch
     * requeues an aggregate's dead events together, in order. The bound is the one in force,
     * read back from the server: a stricter statement_timeout of the connection string, role or
     * database stays (admin_bound_session), and three quarters of --statement-timeout would
     * outlast it; the line's waited_ms is the lock_timeout in force, not the one asked for. */
    long lock_ms = 0;
    DbError le;
    bool bounded = setting_ms(conn, "statement_timeout", &lock_ms, &le);
    if (bounded) {
        lock_ms = lock_ms / 4 * 3;
        lock_ms = lock_ms < 1                            ? 1
                  : lock_ms > ADMIN_DEAD_LOCK_TIMEOUT_MS ? ADMIN_DEAD_LOCK_TIMEOUT_MS
                                                         : lock_ms;
        char lock_sql[256];
        snprintf(lock_sql, sizeof(lock_sql), DB_BOUND_SETTING_SQL("lock_timeout", "%ldms", "false"),
                 lock_ms, lock_ms);
        PGresult *bound = admin_query(conn, lock_sql, 0, NULL, &le);
        bounded = bound != NULL;
        PQclear(bound);
    }
    if (!bounded || !setting_ms(conn, "lock_timeout", &lock_ms, &le)) {
        char q[600];
        log_error("query failed", "error=%s", log_quote(db_error_text(&le), q, sizeof(q)));
        free(snapshot);
        PQfinish(conn);
        return 1;
    }
    char id[32], after[32] = "", batch[32];
    snprintf(id, sizeof(id), "%ld", cfg->id);
    snprintf(batch, sizeof(batch), "%d", ADMIN_DEAD_BATCH);
    long n = 0;
    bool failed = false, no_verdict = false, warned = false;
    DbError e;
    for (;;) {
        const char *params[4] = {cfg->all ? NULL : id, *after ? after : NULL, batch, snapshot};
        PGresult *res = exec_template_e(conn, &cfg->map, sql, purge ? 4 : 3, params,
                                        PGRES_TUPLES_OK, true, &e, &no_verdict);
        if (!res) {
            if (strcmp(e.sqlstate, "55P03") == 0) {
                char which[64];
                batch_named(cfg, id, after, which, sizeof(which));
                /* 55P03 from lock_timeout: a row of the batch, or the table itself (a
                 * migration's ALTER, an open LOCK TABLE), which the UPDATE or DELETE waits for
                 * alike. */
                log_error("a dead event of the batch, or the outbox table, is locked by another "
                          "transaction (a relay publishing its copy to the dead-letter topic, an "
                          "open transaction, a migration): nothing of the batch was changed. Run "
                          "the command again once it is released (pg_locks shows the holder)",
                          "command=%s batch=\"%s\" done_before=%ld waited_ms=%ld", command, which,
                          n, lock_ms);
            }
            failed = true;
            break;
        }
        long rows = strtol(PQgetvalue(res, 0, 0), NULL, 10);
        if (rows > 0)
            snprintf(after, sizeof(after), "%s", PQgetvalue(res, 0, 1));
        PQclear(res);
        n += rows;
        /* A batch whose wakeup got no answer is done (its own answer came), and so is the
         * command when it was the last; else the rest cannot go on this connection. */
        if (rows > 0 && !wake_relays(conn, &warned, &e) && rows == ADMIN_DEAD_BATCH) {
            char q[600];
            log_error("PostgreSQL stopped answering after a batch: the batches so far are done, "
                      "the rest is not",
                      "error=%s", log_quote(db_error_text(&e), q, sizeof(q)));
            failed = true;
            break;
        }
        if (rows < ADMIN_DEAD_BATCH)
            break;
    }
    PQfinish(conn);
    free(snapshot);
    char msg[64];
    snprintf(msg, sizeof(msg), "%s dead-lettered events", verb);
    if (no_verdict) {
        /* Each batch is one statement and its own transaction: its commit waits as the server
         * is set, with a synchronous standby for the standby. The wait is not cancelled (that
         * would commit locally, without the standby): the batch commits when the standby
         * answers or leaves synchronous_standby_names, or not at all if the server stops. */
        char q[600], which[64];
        batch_named(cfg, id, after, which, sizeof(which));
        log_error("a batch got no verdict from PostgreSQL: whether its events were changed is "
                  "unknown. A synchronous standby that does not answer holds a commit until it "
                  "answers or leaves synchronous_standby_names (pg_stat_activity shows the "
                  "session, application_name outbox-relay, waiting with wait_event SyncRep); once "
                  "no such session is left, `dead` lists the events still dead-lettered. Running "
                  "the command again is safe either way",
                  "command=%s batch=\"%s, up to %d\" done_before=%ld error=%s", command, which,
                  cfg->all ? ADMIN_DEAD_BATCH : 1, n, log_quote(db_error_text(&e), q, sizeof(q)));
        printf("%s %ld event%s before the batch whose outcome is unknown\n", verb, n,
               n == 1 ? "" : "s");
        return 1;
    }
    if (failed) {
        if (n > 0) {
            log_error(msg, "count=%ld stopped=\"by the failure above\"", n);
            printf("%s %ld event%s before the failure\n", verb, n, n == 1 ? "" : "s");
        }
        return 1;
    }
    if (!cfg->all && n == 0) {
        log_error("no dead-lettered event with this id", "id=%ld", cfg->id);
        return 1;
    }
    log_info(msg, "count=%ld", n);
    printf("%s %ld event%s\n", verb, n, n == 1 ? "" : "s");
    /* Fewer than the question named: the rest changed since the count (SQL_DEAD_ROWS_COUNTED), and
     * are left for the operator to see again rather than deleted unseen. */
    if (counted > 0 && counted <= ADMIN_PURGE_COUNT_MAX && n < counted)
        printf("%ld of the %ld counted changed since the count (a relay recorded their copy to the "
               "dead-letter topic, or they were requeued or deleted) and were left: `dead` lists "
               "those still dead-lettered\n",
               counted - n, counted);
    return 0;
}

int admin_requeue(const Config *cfg)
{
    return change_dead(cfg, SQL_REQUEUE, "requeued", false);
}

int admin_purge_dead(const Config *cfg)
{
    return change_dead(cfg, SQL_PURGE_DEAD, "purged", cfg->all && !cfg->yes);
}
