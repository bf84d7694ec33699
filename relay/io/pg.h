/* pg: one non-blocking PostgreSQL connection driven by a libev loop.
 *
 * The connection connects (PQconnectStart/PQconnectPoll), reconnects after a failure with capped
 * exponential backoff and jitter, and runs one request at a time: a short list of parameterised
 * statements sent in libpq pipeline mode, so a whole step of the relay (say BEGIN + claim, or
 * mark + COMMIT) costs one round trip. Nothing here ever blocks the loop, and nothing waits
 * unbounded: every connection attempt, per host, has a timeout, every round trip a deadline, and a
 * quiet connection heartbeats so that the server's idle timeouts only catch relays that stopped
 * (pg_set_session_timeout).
 *
 * Callbacks run from the loop. The owner learns about connection state through on_state and
 * about LISTEN notifications through on_notify. */
#ifndef OUTBOX_PG_H
#define OUTBOX_PG_H

#include <ev.h>
#include <libpq-fe.h>
#include <stdbool.h>

typedef struct PgConn PgConn;

/* Statements one request may carry: a batch's marks and COMMIT (at most 6) with the next claim
 * after them (at most 7 of its CLAIM_MAX_QUERIES when chained: never a setup probe's). */
#define PG_MAX_QUERIES 13

/* One statement of a request: SQL with $n parameters given as text (NULL value = SQL NULL).
 * prepare: run it as a statement prepared on this connection, parsed and planned once (by the
 * server's plan cache) instead of at every send: for the statements the relay runs all the time,
 * whose planning costs more than running them on a few rows (the claim). The first send on each
 * connection prepares it in the same pipeline. */
typedef struct PgQuery {
    const char *sql;
    int nparams;
    const char *const *values;
    bool prepare;
} PgQuery;

/* Called once per request. On success error is NULL and results[i] is the result of query i;
 * the callback may keep a result by setting results[i] = NULL (it then owns it, PQclear), the
 * rest are cleared after it returns. When a statement failed, error holds the first failure's
 * message and results holds what arrived. When the connection was lost, results is NULL, and
 * what the request did is unknown: any of its statements, a COMMIT among them, may have run to
 * completion on the server before the answer was lost (the caller must not count a transaction
 * it committed as rolled back). */
typedef void (*PgResultFn)(PgConn *pg, PGresult **results, int n, const char *error, void *arg);

/* up = true once connected (also after every reconnect); up = false when the connection is lost
 * (reason says why). A request in flight has already been failed when this runs. */
typedef void (*PgStateFn)(PgConn *pg, bool up, const char *reason, void *arg);

typedef void (*PgNotifyFn)(PgConn *pg, const char *channel, const char *payload, void *arg);

/* The session timeout's default (--session-timeout). */
#define PG_SESSION_TIMEOUT_DEFAULT_MS 15000

/* Sets, for every connection created after the call, the session timeout T in milliseconds:
 * - PostgreSQL ends the session of a relay that has sent nothing for T (frozen process, dead
 *   host or network): each connection sets idle_in_transaction_session_timeout and
 *   idle_session_timeout (14+) to T, tcp_user_timeout (12+) to T, server keepalives after T/3
 *   (3 probes T/9 apart) and client_connection_check_interval (14+) to T/3;
 * - libpq gets the same keepalives and tcp_user_timeout unless the connection string sets them;
 * - a connection with nothing sent for T/3 sends a heartbeat (an empty pipeline Sync), so a
 *   healthy relay is never cut off, idle or in a transaction;
 * - every round trip (request or heartbeat) has a deadline of T (pg_conn_set_request_timeout):
 *   with no answer by then the connection is reset, as if lost.
 * Call once, before the first pg_conn_new (not thread-safe; the relay has one loop thread). */
void pg_set_session_timeout(long ms);

/* Creates the connection object and starts connecting. conninfo is copied. A multi-host string
 * (host=a,b port=1,2 or postgresql://a:1,b:2/db) is tried one host at a time, in order, each
 * attempt bounded by the string's connect_timeout (default 10 s, at least 2 s): a host name's
 * lookup, then each of its addresses in turn, is one attempt (as libpq bounds them); each host's
 * failures are logged once per change, and target_session_attrs applies per host (use
 * read-write, or primary, to follow a failover). After the last host, the next round starts
 * after a backoff (0.2 s doubling to 5 s, with jitter). PostgreSQL shows the connection as
 * application_name "outbox-relay" unless conninfo or PGAPPNAME names one. Returns NULL when out of
 * memory. */
PgConn *pg_conn_new(struct ev_loop *loop, const char *conninfo, PgStateFn on_state,
                    PgNotifyFn on_notify, void *arg);

/* Like pg_conn_new, for a second connection of the same process: its log lines carry
 * conn=NAME so they are not mistaken for the relay's own connection, and PostgreSQL shows it
 * as application_name "outbox-relay NAME" unless conninfo or PGAPPNAME names one. */
PgConn *pg_conn_new_named(struct ev_loop *loop, const char *conninfo, const char *name,
                          PgStateFn on_state, PgNotifyFn on_notify, void *arg);

/* Sets this connection's deadline for one round trip, in seconds, instead of the session
 * timeout: for a connection whose statements may legitimately run longer (it should then bound
 * them server-side, e.g. with statement_timeout, below this). */
void pg_conn_set_request_timeout(PgConn *pg, double seconds);

/* Says that this process has reached pg's server before, on an earlier connection object: its
 * connect is then not logged as "postgres connected" (for a connection opened again for each
 * piece of work, upkeep.c's on demand, which would say so every few seconds). An outage and the
 * recovery from it are logged as for any connection. Call right after pg_conn_new*. */
void pg_conn_seen_before(PgConn *pg);

/* Closes the connection (an open transaction rolls back on the server) and frees everything.
 * The callback of a request in flight is not called. */
void pg_conn_free(PgConn *pg);

/* True when connected and no request is in flight (a heartbeat in flight does not count: a
 * request sent meanwhile queues behind it). */
bool pg_conn_idle(const PgConn *pg);
bool pg_conn_up(const PgConn *pg);

/* Why the server this connection reached last was refused for its version ("PostgreSQL 13 or
 * later is required; the server is 12.19"), or NULL when it was not (or none was reached yet),
 * or when the last round of attempts over its hosts met no old server (failed otherwise: what
 * is true now). The connection meanwhile retries as for an unreachable server, after its
 * backoff. */
const char *pg_conn_refused(const PgConn *pg);

/* Sends n statements (1..PG_MAX_QUERIES) in one pipeline. Returns false (and calls nothing) when
 * not idle or n is out of range. The callback runs once: with the results (a statement after a
 * failed one did not run: its result is PGRES_PIPELINE_ABORTED), or (results NULL) when the
 * connection was lost, reset, the answer missed its deadline, or an error showed the session
 * unusable (the server became read-only, SQLSTATE 25006; is shutting down, 57P01-57P03; or class
 * 08): such a connection is reset and reconnects, to the new primary after a failover. */
bool pg_conn_send(PgConn *pg, const PgQuery *queries, int n, PgResultFn cb, void *arg)
    __attribute__((warn_unused_result));

/* For a request's results as a PgResultFn gets them: the index of the first statement that
 * failed or did not run (a result missing, or not PGRES_COMMAND_OK/PGRES_TUPLES_OK, such as
 * PGRES_PIPELINE_ABORTED behind a failure), or n when every one succeeded. */
int pg_first_failed(PGresult *const *results, int n);

/* The SQLSTATE of the request's first failed statement (pg_first_failed), or NULL when none
 * failed or it did not say. Points into that result: valid while it is. */
const char *pg_failed_sqlstate(PGresult *const *results, int n);

/* Drops the connection on purpose (e.g. after an unrecoverable protocol state) and reconnects
 * after a backoff; reported through on_state like any loss. */
void pg_conn_reset(PgConn *pg, const char *reason);

/* Room for a backend's start as pg_conn_backend gives it ("YYYY-MM-DD HH:MM:SS.UUUUUU", UTC). */
#define PG_BACKEND_START_LEN 32

/* The server process (backend) of the connection made last: its pid, and its start time
 * (pg_stat_activity.backend_start in UTC, to the microsecond, as to_char's 'YYYY-MM-DD
 * HH24:MI:SS.US' writes it), which together name that process and no later one given the same
 * pid. Learnt during the connection's setup, before the owner hears "up"; still given after the
 * connection is lost, as its backend may outlive it (a network cut the server has not noticed),
 * until the next connection is made. Returns false (pid 0, start "") when not known: no
 * connection made yet, or the server did not say. start must have PG_BACKEND_START_LEN bytes. */
bool pg_conn_backend(const PgConn *pg, int *pid, char *start);

/* The libpq connection while up, for PQescapeIdentifier and the like (never for queries: those go
 * through pg_conn_send); NULL while down. */
PGconn *pg_conn_libpq(PgConn *pg);

#endif
