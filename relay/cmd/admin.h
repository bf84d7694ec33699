/* admin: one-shot operator commands on the outbox — `dead` lists dead-lettered events, `requeue`
 * puts them back in line, `purge-dead` deletes them. Like migrate, they run outside the relay's
 * loop and use blocking libpq. */
#ifndef OUTBOX_ADMIN_H
#define OUTBOX_ADMIN_H

#include <libpq-fe.h>

#include "config.h"
#include "db.h"

/* Every statement of the one-shot commands (dead, requeue, purge-dead, status, check) ends
 * within their --statement-timeout (ADMIN_STATEMENT_TIMEOUT_S by default, at most
 * CONFIG_STATEMENT_TIMEOUT_MAX_S): PostgreSQL cancels it then (statement_timeout, set by
 * admin_bound_session), and admin_query gives up a grace later (ADMIN_ANSWER_GRACE_S, or the
 * timeout itself when shorter) when no answer came at all (a stopped server). Without a bound
 * they waited for ever behind a lock. */
#define ADMIN_STATEMENT_TIMEOUT_S 30
#define ADMIN_ANSWER_GRACE_S 5
/* Rows a statement of dead, requeue or purge-dead takes at a time (SQL_DEAD_BATCH): a batch of
 * any row size is done well within ADMIN_STATEMENT_TIMEOUT_S. */
#define ADMIN_DEAD_BATCH 10000
/* purge-dead --all's confirmation counts the dead events up to this many ("more than" past it):
 * a count of every one could outlast the statement bound the batches keep to. */
#define ADMIN_PURGE_COUNT_MAX 1000000L
/* The longest a batch of requeue or purge-dead waits for a dead event another transaction holds
 * locked before it gives up, saying so (change_dead). */
#define ADMIN_DEAD_LOCK_TIMEOUT_MS 10000L

/* The longest one poll() of admin_query's waits lasts: an hour (it then looks at its deadline
 * again). */
#define ADMIN_POLL_MAX_MS 3600000

/* The timeout in ms for one poll() toward a deadline left_s seconds ahead: left_s rounded up, at
 * least 1 (a deadline reached or passed, or NaN, polls once more without waiting), at most
 * ADMIN_POLL_MAX_MS, so that it is never negative (poll() would wait for ever) however far the
 * deadline lies. */
int admin_poll_ms(double left_s);

/* Sets the statement bound (seconds, 1 to CONFIG_STATEMENT_TIMEOUT_MAX_S) that admin_connect,
 * admin_bound_session, admin_query and admin_exec use from here on: the command's
 * --statement-timeout, set by each command before it connects. ADMIN_STATEMENT_TIMEOUT_S until
 * then. A value out of range is clamped into it. */
void admin_set_statement_timeout(long seconds);

/* How long admin_query waits for an answer: the statement bound plus its grace (the server's own
 * cancel, at the bound, comes first when the server answers at all). */
long admin_answer_s(void);

/* Blocking helpers shared by the one-shot commands (admin, status, check). Connects and bounds
 * the session (admin_bound_session), with a one-line, password-free error logged on failure;
 * returns NULL then. */
PGconn *admin_connect(const char *conninfo);

/* admin_connect without the statement bound, for verify and replay: a read of a long window, or a
 * replay batch, may rightly run longer than --statement-timeout (with the bound they failed after
 * 30 s): they wait for each answer that long plus what their work adds (verify.c, replay.c), and
 * bound their lock waits themselves (lock_timeout).
 * A role's or database's own statement_timeout still applies. NULL (error logged) on failure. */
PGconn *admin_connect_unbounded(const char *conninfo);

/* The exit status for a command whose admin_connect or admin_connect_unbounded just returned
 * NULL: 2 when the server was older than PostgreSQL 13 (db_connect_checked: no retry cures it,
 * a setup the command cannot work with), else 1 (unreachable, a failed query). */
int admin_connect_exit_code(void);

/* Sets the session's statement_timeout to the statement bound (admin_set_statement_timeout),
 * unless one at most as long is in force already (set by the connection string, the role or the
 * database: it stays). False with e filled in when the statement fails. */
bool admin_bound_session(PGconn *conn, DbError *e);

/* db_query with a deadline: the result (the caller PQclears it) when the statement succeeded;
 * NULL with e filled in when it failed, or PostgreSQL did not read the statement or answer it
 * within admin_answer_s() (then e->conn_lost is set and the connection is mid-statement, left
 * non-blocking: the caller closes it). The statement is sent without blocking, by the same
 * deadline, so a large one to a server that stopped reading waits no longer either. */
PGresult *admin_query(PGconn *conn, const char *sql, int nparams, const char *const *params,
                      DbError *e);

/* admin_query with a deadline of timeout_s seconds instead (migrate, whose DDL may take long). */
PGresult *admin_query_within(PGconn *conn, const char *sql, int nparams, const char *const *params,
                             long timeout_s, DbError *e);

/* The same for sql of one or more statements without parameters (the simple protocol, as
 * PQexec): the last statement's result, or the first error. */
PGresult *admin_script_within(PGconn *conn, const char *sql, long timeout_s, DbError *e);

/* Writes the statement template tmpl (relay/outbox/table.h) for map's table and runs it with text
 * params through admin_query_within (timeout_s its deadline): the result when its status is
 * expect; else NULL with e filled in and nothing logged (e->conn_lost set only when the
 * connection is lost or mid-statement; a template that cannot be written, or another status, has
 * no sqlstate). replay's and verify's statements, whose bounds are their own. */
PGresult *admin_template_within(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                                const char *const *params, ExecStatusType expect, long timeout_s,
                                DbError *e);

/* A row of a statement read one at a time (admin_template_rows_within): a result of one row,
 * which the function must not keep (it is cleared after). */
typedef void (*AdminRowFn)(PGresult *row, void *arg);

/* admin_template_within for a statement that returns rows, read one at a time (libpq's single-row
 * mode): on_row gets each as it comes, so a large result is never held whole beside what the
 * caller makes of it. True when every row came (the statement succeeded); false with e filled in
 * as admin_template_within's, the rows given so far being only part of the answer. */
bool admin_template_rows_within(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                                const char *const *params, long timeout_s, AdminRowFn on_row,
                                void *arg, DbError *e);

/* Runs a statement template (relay/outbox/table.h) written for map's table with text params,
 * through admin_query (its client-side deadline); returns the result, or NULL (error logged,
 * result cleared) when it failed or its status is not `expect`. */
PGresult *admin_exec(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                     const char *const *params, ExecStatusType expect);

/* admin_exec without admin_query's deadline, for a connection of admin_connect_unbounded. */
PGresult *admin_exec_unbounded(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                               const char *const *params, ExecStatusType expect);

/* How long admin_lane_squatters waits before its second look: a relay that joins holds its member
 * slot without lanes only until its next statements take them. */
#define ADMIN_SQUAT_RECHECK_MS 2000

/* The sessions that hold the lane group's locks and cannot be relays, by the relay's own rule and
 * in its columns (SQL_LANE_SQUATTERS: pid, what, lanes, slots, role, application, client
 * address), as the relay's upkeep counts them: a "slot-without-lanes" holder, which can be a
 * relay joining, only when a second look ADMIN_SQUAT_RECHECK_MS later (taken only then) finds it
 * so again (squatters.h, the rule the upkeep applies too); map: the table, whose relays' roles
 * (any that may UPDATE it) are never named for a slot without lanes. For status and check, which
 * said nothing of such sessions: only a relay with --metrics-listen did. Blocks up to two statement
 * bounds and the wait. Returns the rows that count (the caller PQclears the result), or NULL with
 * e filled in when a look failed (or no memory was left: e->message says so). */
PGresult *admin_lane_squatters(PGconn *conn, const TableMap *map, DbError *e);

/* Prints the dead-lettered events (a table, or JSON lines with cfg->json) to stdout. Returns the
 * exit status: 0, or 1 on a database error or a row --json cannot print (not UTF-8; logged, the
 * other rows printed). */
int admin_dead(const Config *cfg);

/* Requeues the dead-lettered event cfg->id, or all of them with cfg->all: clears dead_at,
 * rejections and the retry time, keeps attempts and last_error as history. Prints how many were
 * requeued. Returns 0, 1 on a database error, or 1 when --id names no dead-lettered event. */
int admin_requeue(const Config *cfg);

/* Deletes the dead-lettered event cfg->id, or all of them with cfg->all (sent and waiting rows are
 * never touched). With --on-poison hold, the later events of a purged event's aggregate go on.
 * Prints how many were deleted. With --all and no --yes, on a terminal (stdin and stderr), it
 * first asks on stderr whether to delete the N dead-lettered events, and changes nothing unless
 * the answer is y. Returns 0, 1 on a database error, when --id names no dead-lettered event, or
 * when the deletion was not confirmed. */
int admin_purge_dead(const Config *cfg);

#endif
