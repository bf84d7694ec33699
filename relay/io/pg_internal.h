/* pg_internal: the insides of a PgConn (pg.h), shared by its two halves and nothing else:
 * pg.c, the connection's life (connecting host after host, setup, heartbeats, deadlines, losing
 * and retrying), and pg_request.c, the requests (pipelined statements, prepared statements,
 * reading results and notifications). */
#ifndef OUTBOX_PG_INTERNAL_H
#define OUTBOX_PG_INTERNAL_H

#include <ev.h>
#include <libpq-fe.h>
#include <stdbool.h>

#include "backoff.h"
#include "db.h"
#include "pg.h"
#include "pg_plan.h"
#include "resolve.h"

/* Distinct statements a connection prepares; beyond that, statements are sent unprepared. A
 * session asks for 10 at most: the claim's (planner settings, dead-letter claim, the floor's two
 * looks, the claim, its recheck, the claim around locks and its look for a locker) and the
 * marks' (planner settings, sent marks). */
#define PG_MAX_PREPARED 12
/* PG_SETUP: connected, the session's timeouts being set; the owner hears "up" after that. */
typedef enum { PG_DOWN, PG_CONNECTING, PG_SETUP, PG_UP } PgState;

/* A statement prepared (or being prepared) on the current connection. Names are never reused
 * within a connection: a statement dropped from this list after a failure may still exist on
 * the server. */
typedef struct Prepared {
    char *sql; /* a copy: the statement's identity; NULL = free slot */
    char name[32];
} Prepared;

/* What one result of a request answers: the preparing of a statement, or a statement of the
 * request (run as a prepared one when slot >= 0). */
typedef struct Expected {
    bool preparing;
    int slot; /* the prepared statement's, or -1 */
} Expected;

struct PgConn {
    struct ev_loop *loop;
    char *conninfo;
    char tag[40]; /* "conn=NAME " in log lines of a named connection, else "" */
    /* The log context (log_set_context) current when the connection was made: its database's,
     * when a process serves several; made current again by each of its watchers. */
    const char *log_context;
    PGconn *conn;
    PgState state;
    PgPlan plan; /* what every attempt passes to libpq, and the hosts to try in turn */
    int target;  /* the host being tried */
    /* The current host's name being looked up (resolve.h), before libpq is given its addresses;
     * state is PG_CONNECTING and conn NULL meanwhile. */
    Resolve *resolving;
    bool looked_up; /* the attempt under way gave libpq an address of that lookup */
    /* That lookup's addresses, NUL-separated, tried one attempt each, so that connect_timeout
     * bounds each address as libpq bounds each address of a name it looks up itself: with the
     * whole list in one attempt, a first address that never answers (a host that died) used up
     * the timeout and the others were never tried. addr is the one being tried, addrs_end ends
     * the list; addr_error holds the failures of the addresses tried so far, "; " between them
     * (libpq's message for a list names each), reported with the last if none connects. NULL:
     * no lookup's addresses, or none failed yet. */
    char *addrs, *addr, *addrs_end;
    char *addr_error;
    double request_timeout_s;
    bool ever_up; /* for "connected" vs "reconnected" in the log */
    /* What the log has said of the current outage: the loss (warn), then the first connection
     * made again (info), then that connection's loss if it came within PG_STABLE_S (warn, once),
     * and "reconnected" again once a connection lasts PG_STABLE_S (on_stable, which ends the
     * outage); everything else in the outage goes to debug. */
    enum { OUTAGE_NONE, OUTAGE_LOST, OUTAGE_BACK, OUTAGE_RELAPSED } outage_logged;
    /* A file libpq would open that is refused (db_check_files) is a setting to fix, not a
     * passing outage: said at warn level even within an outage, once per reason. files_refused
     * is the reason last said ("" once the files pass); say_loss makes pg_lose say this loss. */
    char files_refused[160];
    bool say_loss;
    /* The TLS files this attempt hands libpq by /proc/self/fd alias (db_check_files_pinned):
     * open from the attempt's start until its connection is made or it is over. */
    DbPins pins;
    ev_timer stable; /* PG_STABLE_S after a connection is made: the outage (if any) has ended */
    ev_io io;
    int io_fd, io_events;
    ev_timer timer;    /* connect timeout while connecting, reconnect delay while down */
    ev_timer quiet;    /* restarted at every send: a third of the session timeout of silence */
    ev_timer deadline; /* runs while an answer is outstanding (request_timeout_s) */
    bool heartbeat;    /* a heartbeat's Sync is in the pipeline, ahead of any request */
    ev_tstamp heartbeat_sent_at;
    unsigned long syncs_done; /* answers completed: progress, for the deadline */
    char *broken; /* a result said this session is unusable (read-only, shutting down) */
    /* The server's reason for ending the session, when it sent one while no request was out
     * (pg_terminate_backend, the idle timeouts, a shutdown): libpq hands such an error to the
     * notice receiver, and then says only that the server closed the connection. */
    char *server_fatal;
    /* Why the last server reached was refused for its version (db_version_supported), "" when
     * it was not: for /readyz (pg_conn_refused), as the log says it once. Kept while the rounds
     * of attempts meet an old server (refused_now: this round did), cleared by a connection or
     * a round that met none (the server gone, say), which is then what is true. */
    char refused[120];
    bool refused_now;
    /* The server process of the connection made last (pg_conn_backend): 0 and "" until its setup
     * learnt them. Kept when the connection is lost (its backend may live on), until the next
     * connection is made. */
    int backend_pid;
    char backend_start[PG_BACKEND_START_LEN];
    ev_timer defer; /* reports a send failure from the loop, not from inside pg_conn_send */
    char *deferred_loss;
    Backoff backoff;

    Prepared prepared[PG_MAX_PREPARED];
    unsigned long prepared_count; /* names given out on this connection */

    /* The request in flight. */
    bool busy;
    PgResultFn cb;
    void *cb_arg;
    int nqueries, nresults;
    PGresult *results[PG_MAX_QUERIES];
    /* A statement prepared on first use whose preparing failed: its own result comes next,
     * aborted with no error of its own, and this one (with the SQLSTATE: a missing table, a
     * privilege) stands in for it. */
    PGresult *prepare_failure;
    Expected expected[2 * PG_MAX_QUERIES]; /* in send order */
    int nexpected, nreceived;
    char *error;

    PgStateFn on_state;
    PgNotifyFn on_notify;
    void *arg;
};

/* ---- pg.c ---- */

/* Watches fd for events (-1: nothing). */
void pg_set_io(PgConn *pg, int fd, int events);
/* Connected as far as the socket goes: setting up the session, or up. */
bool pg_linked(const PgConn *pg);
/* An answer (a request's or a heartbeat's) is outstanding. */
bool pg_awaiting(const PgConn *pg);
/* The connection is gone (or never came up): close it, fail the request, schedule a retry. */
void pg_lose(PgConn *pg, const char *why);
/* Keeps res (an error the server sent outside any request) as its reason for ending the session,
 * which pg_lose names; the first one kept stays. */
void pg_keep_server_fatal(PgConn *pg, const PGresult *res);

/* ---- pg_request.c ---- */

/* A new connection has none of the old one's statements. */
void pg_forget_all_prepared(PgConn *pg);
/* Fails the request in flight, if any: its callback gets NULL results and reason. */
void pg_fail_request(PgConn *pg, const char *reason);
/* Clears a kept failure of preparing (PgConn.prepare_failure) that no result took. */
void pg_drop_prepare_failure(PgConn *pg);
/* Something went to the server: restart the quiet timer, and the deadline unless an earlier
 * answer is still awaited (its deadline stands). */
void pg_sent(PgConn *pg, bool was_awaiting);
/* Reads what has arrived: completes the request (or the heartbeat) whose answer is whole. */
void pg_read_results(PgConn *pg);
/* Sends one statement of the connection's own (the session setup) as a request. */
bool pg_send_internal(PgConn *pg, const char *sql, PgResultFn cb);

#endif
