/* fake_pg: a stand-in for relay/io/pg.c and pg_request.c (the PgConn interface of pg.h) for the
 * engine's unit tests (test_engine.c): no server, no socket. Each connection records the request
 * the engine sends (its statements' SQL and parameter text, the callback and its argument) and a
 * test answers it with canned PGresults (built with libpq's PQmakeEmptyPGresult, PQsetResultAttrs
 * and PQsetvalue), with a failure carrying a SQLSTATE, or by dropping the connection.
 *
 * The callback contract is pg.h's, reproduced exactly:
 *  - pg_conn_send never calls the callback from inside itself; it returns false (and records
 *    nothing) when the connection is not up or a request is in flight, or n is out of range;
 *  - an answer calls the callback once, with the connection idle again (it may send at once);
 *    results[i] is the result of statement i, the callback may keep one by setting it to NULL,
 *    the rest are cleared after it returns; error is NULL when every statement succeeded, else
 *    the first failure's message, and each statement after a failed one is PGRES_PIPELINE_ABORTED;
 *  - a failure with a SQLSTATE that shows the session unusable (25006, 57P01-57P03, class 08)
 *    drops the connection instead, as pg_request.c does;
 *  - a lost connection (fake_pg_drop, pg_conn_reset) first fails the request in flight
 *    (callback with results NULL, n 0 and the reason), then reports down through on_state;
 *    pg_conn_reset does so synchronously, from inside the caller, as pg.c's pg_lose does.
 * The connection then stays down until the test brings it up again (fake_pg_up): no backoff.
 *
 * PQresultErrorField cannot be given a SQLSTATE without a server, so the fake's
 * pg_failed_sqlstate reads it from a table of the error results it made (fake_pg_error). */
#ifndef OUTBOX_FAKE_PG_H
#define OUTBOX_FAKE_PG_H

#include <stdbool.h>

#include "pg.h"

/* One request as the engine sent it: copies of its statements' SQL and parameters (each
 * statement's parameters joined with '|', SQL NULL as "NULL"). */
typedef struct FakeRequest {
    int n;
    char *sql[PG_MAX_QUERIES];
    char *params[PG_MAX_QUERIES];
    PgResultFn cb;
    void *arg;
} FakeRequest;

/* Called with each request pg_conn_send accepts, when set (the tests record what was sent). */
extern void (*fake_pg_sent_hook)(PgConn *pg, const FakeRequest *req);

/* How many of the next pg_conn_send calls (on any connection) return false as if the send had
 * failed, recording nothing (0: none; the tests set it). */
extern int fake_pg_refuse_sends;

/* Connections made since the last fake_pg_forget, in creation order (pg_conn_free'd ones are
 * removed). At most FAKE_PG_MAX of them. */
#define FAKE_PG_MAX 8
int fake_pg_count(void);
PgConn *fake_pg_at(int i);
/* The connection created with this name (pg_conn_new_named), or NULL. */
PgConn *fake_pg_named(const char *name);
/* The name given at creation ("" for none). */
const char *fake_pg_name(const PgConn *pg);
/* Whether its owner said the process reached its server before (pg_conn_seen_before): its
 * connect is then not logged as "postgres connected". */
bool fake_pg_seen_before(const PgConn *pg);

/* Brings the connection up and tells its owner (on_state up), synchronously. */
void fake_pg_up(PgConn *pg);
/* Drops the connection as a network failure would (see the contract above). */
void fake_pg_drop(PgConn *pg, const char *reason);
/* Delivers a notification (LISTEN) to the owner. */
void fake_pg_notify(PgConn *pg, const char *channel, const char *payload);
/* The pid pg_conn_backend gives: each fake_pg_up starts a new "server process" (1000, 1001, ...),
 * whose start time is "2026-11-28 18:00:00.<pid, 6 digits>"; kept after a drop, as pg.c keeps it.
 */
int fake_pg_backend_pid(const PgConn *pg);
/* How often pg_conn_reset was called on this connection. */
int fake_pg_resets(const PgConn *pg);

/* The request in flight, or NULL. Valid until it is answered. */
const FakeRequest *fake_pg_pending(const PgConn *pg);
/* Answers the request in flight with results[0..n-1] (n must be the request's statement count;
 * the fake takes them over): error is derived from them as pg_request.c does. Calls the
 * callback synchronously. */
void fake_pg_answer(PgConn *pg, PGresult **results, int n);

/* Result builders (the caller owns what they return until it hands it to fake_pg_answer). */
PGresult *fake_pg_command_ok(void);
/* A PGRES_TUPLES_OK result with ncols text columns named by the comma-separated `cols` and
 * nrows rows of cells (row-major; NULL = SQL NULL). */
PGresult *fake_pg_tuples(const char *cols, int nrows, const char *const *cells);
/* A failed statement: PGRES_FATAL_ERROR with message msg and SQLSTATE sqlstate (NULL: none). */
PGresult *fake_pg_error(const char *sqlstate, const char *msg);
PGresult *fake_pg_aborted(void);

/* Forgets the SQLSTATE table (call between tests; results already cleared are forgotten by
 * PQclear'ing them through the fake as well). */
void fake_pg_forget(void);

#endif
