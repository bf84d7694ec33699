#include "pg_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backoff.h"
#include "db.h"
#include "log.h"
#include "secrets.h"

/* Watches fd for events. A connection attempt moves between sockets (the next address or host,
 * an SSL retry) and a new socket often gets the number the old one had: libev must then be told
 * afresh (rearm), or it keeps waiting on a registration the kernel dropped with the old socket. */
#define PG_BACKOFF_BASE_S 0.2
/* Capped at 5 s rather than more: after a failover the relay should find the new primary within
 * seconds, and an attempt costs a refused SYN or one startup exchange. */
#define PG_BACKOFF_CAP_S 5.0
/* A connection that lasts this long ends an outage (on_stable): the backoff starts again from its
 * base and a later loss is logged afresh. One lost sooner (say, made to a standby, whose first
 * LISTEN fails) belongs to the same outage: the backoff goes on growing and the streak stays
 * logged once, where resetting at every connect retried five times a second with two lines
 * each. */
#define PG_STABLE_S PG_BACKOFF_CAP_S

/* The process-wide session timeout (pg_set_session_timeout). */
static long session_timeout_ms = PG_SESSION_TIMEOUT_DEFAULT_MS;

static void watch(PgConn *pg, int fd, int events, bool rearm)
{
    if (!rearm && pg->io_fd == fd && pg->io_events == events && ev_is_active(&pg->io))
        return;
    ev_io_stop(pg->loop, &pg->io);
    pg->io_fd = fd;
    pg->io_events = events;
    if (fd >= 0 && events) {
        ev_io_set(&pg->io, fd, events);
        ev_io_start(pg->loop, &pg->io);
    }
}

void pg_set_io(PgConn *pg, int fd, int events)
{
    watch(pg, fd, events, false);
}

bool pg_linked(const PgConn *pg)
{
    return pg->state == PG_SETUP || pg->state == PG_UP;
}

bool pg_awaiting(const PgConn *pg)
{
    return pg->busy || pg->heartbeat;
}

static void start_connect(PgConn *pg);
static void attempt_target(PgConn *pg);
static void connect_target(PgConn *pg, const char *host, const char *hostaddr);
static void target_failed(PgConn *pg, const char *why);

/* Routes server notices into our log instead of libpq's default raw stderr output. An error
 * that ends the session (FATAL, PANIC) arrives here too when no request was out, just before the
 * server closes the connection: it is kept, so that the loss names the server's reason
 * (pg_lose), where libpq would say only "server closed the connection unexpectedly". */
static void notice_to_log(void *arg, const PGresult *res)
{
    PgConn *pg = arg;
    char q[512];
    log_debug("postgres notice", "%snotice=%s", pg->tag,
              log_quote(db_error_line(PQresultErrorMessage(res)), q, sizeof(q)));
    const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
    if (severity && (strcmp(severity, "FATAL") == 0 || strcmp(severity, "PANIC") == 0))
        pg_keep_server_fatal(pg, res);
}

void pg_keep_server_fatal(PgConn *pg, const PGresult *res)
{
    if (pg->server_fatal)
        return;
    const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    char line[400];
    snprintf(line, sizeof(line), "%s (SQLSTATE %s)",
             primary ? primary : db_error_line(PQresultErrorMessage(res)), state ? state : "none");
    pg->server_fatal = strdup(db_error_line(line));
}

/* Drops the addresses of the last lookup (PgConn.addrs): a new host's attempt, or a connection
 * made, or the object freed. */
static void forget_addrs(PgConn *pg)
{
    free(pg->addrs);
    free(pg->addr_error);
    pg->addrs = pg->addr = pg->addrs_end = pg->addr_error = NULL;
}

/* Closes the libpq connection and everything that watches it. */
static void close_conn(PgConn *pg)
{
    resolve_cancel(pg->resolving);
    pg->resolving = NULL;
    pg_set_io(pg, -1, 0);
    ev_timer_stop(pg->loop, &pg->timer);
    ev_timer_stop(pg->loop, &pg->defer);
    ev_timer_stop(pg->loop, &pg->quiet);
    ev_timer_stop(pg->loop, &pg->deadline);
    ev_timer_stop(pg->loop, &pg->stable);
    free(pg->deferred_loss);
    pg->deferred_loss = NULL;
    free(pg->broken);
    pg->broken = NULL;
    free(pg->server_fatal);
    pg->server_fatal = NULL;
    pg->heartbeat = false;
    if (pg->conn)
        PQfinish(pg->conn);
    pg->conn = NULL;
}

/* The first line of a libpq error as the relay shows it (log, requests, on_state): with the
 * tail of a password whose '@' was not percent-encoded hidden (db_hide_password_tail), which
 * libpq takes for the host name and quotes, and the relay's lookup quotes as libpq does. The
 * scrub of registered secrets cannot catch it: the password registered is the whole one. */
static const char *error_shown(const PgConn *pg, const char *why, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s", db_error_line(why));
    db_hide_password_tail(out, pg->conninfo);
    return out;
}

void pg_lose(PgConn *pg, const char *why)
{
    char reason[512], line[500]; /* line fits after "; " */
    error_shown(pg, why, line, sizeof(line));
    if (pg->server_fatal) /* the server's reason first: it is the cause */
        snprintf(reason, sizeof(reason), "%s; %s", pg->server_fatal, line);
    else
        snprintf(reason, sizeof(reason), "%s", line);
    bool was_up = pg->state == PG_UP;

    close_conn(pg);
    db_pins_close(&pg->pins); /* the attempt, if one was under way, is over */
    pg->state = PG_DOWN;
    pg_forget_all_prepared(pg);

    double delay = backoff_next(&pg->backoff);
    char q[600];
    bool say = pg->say_loss;
    pg->say_loss = false;
    if (pg->outage_logged == OUTAGE_NONE || pg->outage_logged == OUTAGE_BACK || say) {
        log_warn(was_up ? "postgres connection lost" : "postgres unreachable",
                 "%serror=%s retry_in_s=%.2f", pg->tag, log_quote(reason, q, sizeof(q)), delay);
        if (pg->outage_logged == OUTAGE_NONE || pg->outage_logged == OUTAGE_BACK)
            pg->outage_logged = pg->outage_logged == OUTAGE_NONE ? OUTAGE_LOST : OUTAGE_RELAPSED;
    } else {
        log_debug("postgres still unreachable", "%serror=%s retry_in_s=%.2f", pg->tag,
                  log_quote(reason, q, sizeof(q)), delay);
    }
    ev_timer_set(&pg->timer, delay, 0);
    ev_timer_start(pg->loop, &pg->timer);

    pg_fail_request(pg, reason);
    if (was_up)
        pg->on_state(pg, false, reason, pg->arg);
}

/* Settings that make PostgreSQL end this session when the relay stops talking, within the
 * session timeout T, however it stopped:
 * - a frozen process (SIGSTOP, a paused VM) whose kernel still answers TCP: only the idle
 *   timeouts see it, as the backend waits for its next message (in a transaction or not);
 * - a dead host or network while the backend waits: the same idle timeouts; while it has unsent
 *   or unacknowledged data: tcp_user_timeout; keepalives for a socket that is otherwise quiet.
 * The relay's heartbeat (every T/3 of silence) keeps a healthy session from looking idle for T.
 * client_connection_check_interval lets a backend stuck in a long statement notice that the
 * relay gave the connection up (its deadline) instead of running on with the lanes' locks.
 * Older servers get what they know. */
static void setup_sql(const PgConn *pg, char *sql, size_t len)
{
    long t = session_timeout_ms;
    long idle_s = t / 3000 > 0 ? t / 3000 : 1, interval_s = t / 9000 > 0 ? t / 9000 : 1;
    int v = PQserverVersion(pg->conn);
    int n = snprintf(
        sql, len,
        "SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', '%ld', false),"
        " pg_catalog.set_config('tcp_keepalives_idle', '%ld', false),"
        " pg_catalog.set_config('tcp_keepalives_interval', '%ld', false),"
        " pg_catalog.set_config('tcp_keepalives_count', '3', false)",
        t, idle_s, interval_s);
    if (v >= 120000 && n > 0 && (size_t)n < len)
        n += snprintf(sql + n, len - (size_t)n,
                      ", pg_catalog.set_config('tcp_user_timeout', '%ld', false)", t);
    if (v >= 140000 && n > 0 && (size_t)n < len)
        snprintf(sql + n, len - (size_t)n,
                 ", pg_catalog.set_config('idle_session_timeout', '%ld', false),"
                 " pg_catalog.set_config('client_connection_check_interval', '%ld', false)",
                 t, t / 3 > 1000 ? t / 3 : 1000);
}

/* Sent after the session timeouts, as a request of its own (either may fail without undoing the
 * other): the relay's commits wait neither for the WAL flush nor for a synchronous standby, unless
 * the relay's role, its database or the URL (options, PGOPTIONS) set synchronous_commit for it.
 * What the relay writes (sent marks, retention's deletes) may then be lost in a server crash or a
 * failover to a standby that had not received it, and those rows are sent again, which
 * at-least-once delivery allows. Waiting cost a flush, or a round trip to a synchronous standby,
 * in every batch's cycle (docs/operations.md#synchronous-standbys-and-slow-disks). The marks that
 * record failures wait for the local flush (statements.h, SQL_MARK_PLAN_FAILURES). */
static const char SQL_NO_FLUSH_WAIT[] =
    "SELECT pg_catalog.set_config('synchronous_commit', CASE WHEN source IN ('default', "
    "'configuration file',"
    " 'command line', 'environment variable') THEN 'off' ELSE setting END, false)"
    " FROM pg_settings WHERE name = 'synchronous_commit'";

/* The last step of the setup: which server process this connection is (pg_conn_backend), for an
 * owner that must end it should the connection be lost while it lives on (wakeup.h). The start
 * time is written by the server in UTC in a fixed form, so that a later session with other
 * DateStyle or TimeZone settings compares it as text, exactly. */
static const char SQL_BACKEND[] =
    "SELECT pg_catalog.pg_backend_pid(), pg_catalog.to_char(backend_start AT TIME ZONE 'UTC',"
    " 'YYYY-MM-DD HH24:MI:SS.US') FROM pg_catalog.pg_stat_activity"
    " WHERE pid = pg_catalog.pg_backend_pid()";

static void on_backend(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    if (!results)
        return; /* lost: pg_lose() has taken over */
    PGresult *r = results[0];
    if (!error && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
        !PQgetisnull(r, 0, 1) && strlen(PQgetvalue(r, 0, 1)) < sizeof(pg->backend_start)) {
        pg->backend_pid = atoi(PQgetvalue(r, 0, 0));
        snprintf(pg->backend_start, sizeof(pg->backend_start), "%s", PQgetvalue(r, 0, 1));
    } else {
        /* Only a lost wakeup guard's backend goes unended (it then ends within the session
         * timeout, as before): not worth a warning. */
        char q[512];
        log_debug("cannot tell which server process this connection is", "%serror=%s", pg->tag,
                  log_quote(error ? error : "unexpected result", q, sizeof(q)));
    }
    pg->state = PG_UP;
    pg->on_state(pg, true, NULL, pg->arg);
}

static void on_no_flush_wait(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    if (!results)
        return; /* lost: pg_lose() has taken over */
    if (error) {
        /* The relay still works, only each batch waits at its commit. */
        char q[512];
        log_warn("cannot turn synchronous_commit off; the relay's commits wait for the WAL flush",
                 "%serror=%s", pg->tag, log_quote(error, q, sizeof(q)));
    }
    if (!pg_send_internal(pg, SQL_BACKEND, on_backend))
        pg_lose(pg, "cannot send the session setup");
}

bool pg_conn_backend(const PgConn *pg, int *pid, char *start)
{
    *pid = pg->backend_pid;
    snprintf(start, PG_BACKEND_START_LEN, "%s", pg->backend_start);
    return pg->backend_pid > 0 && pg->backend_start[0];
}

static void on_setup(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    if (!results)
        return; /* lost: pg_lose() has taken over */
    if (error) {
        /* The relay still works, only a silent relay keeps its lanes until TCP gives up. */
        char q[512];
        log_warn("cannot set the session timeouts; a silent relay may keep its lanes for long",
                 "%serror=%s", pg->tag, log_quote(error, q, sizeof(q)));
    }
    if (!pg_send_internal(pg, SQL_NO_FLUSH_WAIT, on_no_flush_wait))
        pg_lose(pg, "cannot send the session setup");
}

/* A connection has lasted PG_STABLE_S: the outage before it is over. Said once more if the log
 * last told of a loss (the "reconnected" line went with an earlier, short-lived connection). */
static void on_stable(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    log_set_context(pg->log_context);
    if (pg->state != PG_UP) { /* its setup still under way: it has not proved itself yet */
        ev_timer_set(w, PG_STABLE_S, 0.);
        ev_timer_start(loop, w);
        return;
    }
    if (pg->outage_logged == OUTAGE_RELAPSED) {
        char q1[300], q2[40];
        log_info("postgres reconnected", "%sserver_version=%d host=%s port=%s tls=%s gssenc=%s",
                 pg->tag, PQserverVersion(pg->conn),
                 log_quote(db_host_shown(PQhost(pg->conn)), q1, sizeof(q1)),
                 log_quote(PQport(pg->conn), q2, sizeof(q2)), PQsslInUse(pg->conn) ? "on" : "off",
                 PQgssEncInUse(pg->conn) ? "on" : "off");
    }
    pg->outage_logged = OUTAGE_NONE;
    backoff_reset(&pg->backoff);
}

static void connected(PgConn *pg)
{
    ev_timer_stop(pg->loop, &pg->timer);
    /* An older server would fail every claim (pg_current_snapshot) and migrate (gen_random_uuid):
     * refused here, where every connection of the relay becomes usable, with one line naming both
     * versions. It counts as unreachable, as a host that refuses: the next address or host of the
     * list is tried (one old server of "host=a,b" does not keep the relay from b), after the last
     * the capped backoff (at most every 5 s, logged once), the database not ready meanwhile,
     * other databases of --databases untouched, and picked up by itself once the server is
     * upgraded. Before forget_addrs: target_failed needs the addresses left to try. */
    if (!db_version_supported(PQserverVersion(pg->conn), pg->refused, sizeof(pg->refused))) {
        pg->refused_now = true;
        target_failed(pg, pg->refused);
        return;
    }
    pg->refused[0] = '\0';
    forget_addrs(pg);
    db_pins_close(&pg->pins); /* TLS is set up: libpq opens none of them again */
    if (PQsetnonblocking(pg->conn, 1) != 0 || PQenterPipelineMode(pg->conn) != 1) {
        pg_lose(pg, PQerrorMessage(pg->conn));
        return;
    }
    PQsetNoticeReceiver(pg->conn, notice_to_log, pg);
    PgTarget *t = &pg->plan.targets[pg->target];
    free(t->last_error);
    t->last_error = NULL;
    pg->state = PG_SETUP;
    pg->backend_pid = 0; /* another process now: learnt again (on_backend) */
    pg->backend_start[0] = '\0';
    ev_timer_set(&pg->stable, PG_STABLE_S, 0.); /* the backoff and the outage end if it lasts */
    ev_timer_start(pg->loop, &pg->stable);
    char q1[300], q2[40];
    if (!pg->ever_up || pg->outage_logged == OUTAGE_LOST)
        log_info(pg->ever_up ? "postgres reconnected" : "postgres connected",
                 "%sserver_version=%d host=%s port=%s tls=%s gssenc=%s", pg->tag,
                 PQserverVersion(pg->conn),
                 log_quote(db_host_shown(PQhost(pg->conn)), q1, sizeof(q1)),
                 log_quote(PQport(pg->conn), q2, sizeof(q2)), PQsslInUse(pg->conn) ? "on" : "off",
                 PQgssEncInUse(pg->conn) ? "on" : "off"); /* GSSAPI encryption, not TLS */
    pg->ever_up = true;
    if (pg->outage_logged == OUTAGE_LOST)
        pg->outage_logged = OUTAGE_BACK;
    watch(pg, PQsocket(pg->conn), EV_READ, true);
    char sql[512];
    setup_sql(pg, sql, sizeof(sql));
    if (!pg_send_internal(pg, sql, on_setup))
        pg_lose(pg, "cannot send the session setup");
}

/* Adds one address's failure to those of the lookup's earlier addresses ("; " between them). */
static void addr_error_add(PgConn *pg, const char *line)
{
    size_t had = pg->addr_error ? strlen(pg->addr_error) : 0;
    char *joined = realloc(pg->addr_error, had + 2 + strlen(line) + 1);
    if (!joined)
        return; /* the earlier ones are reported */
    sprintf(joined + had, "%s%s", had ? "; " : "", line);
    pg->addr_error = joined;
}

/* One host failed (refused, timed out, rejected by target_session_attrs...): try the next one,
 * or, after the last, wait and start over. With several hosts, each logs its failure once per
 * change (a host that keeps refusing logs once), the retries at debug level. */
static void target_failed(PgConn *pg, const char *why)
{
    char reason[512], named[1024], line[512], unpinned[1024];
    if (pg->pins.n) { /* libpq names the file it opened: /proc/self/fd/N, the path's alias */
        db_pins_text(&pg->pins, why, unpinned, sizeof(unpinned));
        why = unpinned;
    }
    if (pg->looked_up) {
        /* Given addresses, libpq names only them: put the name back, as libpq writes it. */
        const char *host = pg->plan.targets[pg->target].addr.host;
        pg_error_name_host(why, host, named, sizeof(named));
        why = named;
        char *next = pg->addr ? pg->addr + strlen(pg->addr) + 1 : NULL;
        if (next && next < pg->addrs_end) { /* the name's next address, on a clock of its own */
            char q[600], q2[300];
            log_debug("postgres address failed", "%shost=%s error=%s", pg->tag,
                      log_quote(pg->plan.targets[pg->target].shown, q2, sizeof(q2)),
                      log_quote(error_shown(pg, why, line, sizeof(line)), q, sizeof(q)));
            addr_error_add(pg, line);
            close_conn(pg);
            pg->state = PG_DOWN;
            pg->addr = next;
            connect_target(pg, host, next);
            return;
        }
        /* Every address failed: each one's reason, in the order tried, as libpq reports a name
         * it looks up itself (the first alone said "Connection refused" for localhost's ::1 when
         * 127.0.0.1 refused the password). The last in full, then, if they fit, the others. */
        if (pg->addr_error) {
            char last[512];
            error_shown(pg, why, last, sizeof(last));
            if (strlen(pg->addr_error) + 2 + strlen(last) < sizeof(reason))
                snprintf(named, sizeof(named), "%s; %s", pg->addr_error, last);
            else
                snprintf(named, sizeof(named),
                         "%s; earlier addresses failed too (--log-level debug)", last);
            why = named;
        }
    }
    error_shown(pg, why, reason, sizeof(reason));
    forget_addrs(pg);
    close_conn(pg);
    pg->state = PG_DOWN;
    if (pg->plan.ntargets > 1) {
        PgTarget *t = &pg->plan.targets[pg->target];
        char q[600], q2[300];
        bool changed = !t->last_error || strcmp(t->last_error, reason) != 0;
        log_write(changed ? LOG_WARN : LOG_DEBUG, "postgres host failed", "%shost=%s error=%s",
                  pg->tag, log_quote(t->shown, q2, sizeof(q2)), log_quote(reason, q, sizeof(q)));
        if (changed) {
            free(t->last_error);
            t->last_error = strdup(reason);
        }
        if (++pg->target < pg->plan.ntargets) {
            attempt_target(pg);
            return;
        }
    }
    /* The round is over: an old server it did not meet (the host now unreachable, another
     * failure) is no longer why this connection is down. */
    if (!pg->refused_now)
        pg->refused[0] = '\0';
    pg_lose(pg, reason);
}

static void connect_step(PgConn *pg)
{
    switch (PQconnectPoll(pg->conn)) {
    case PGRES_POLLING_READING:
        watch(pg, PQsocket(pg->conn), EV_READ, true);
        break;
    case PGRES_POLLING_WRITING:
        watch(pg, PQsocket(pg->conn), EV_WRITE, true);
        break;
    case PGRES_POLLING_OK:
        connected(pg);
        break;
    default:
        target_failed(pg, PQerrorMessage(pg->conn));
        break;
    }
}

/* Hands the current target to libpq. hostaddr (NULL: the target's own) is the addresses to try,
 * for a name the relay looked up itself: libpq then looks nothing up. */
static void connect_target(PgConn *pg, const char *host, const char *hostaddr)
{
    const PgTarget *t = &pg->plan.targets[pg->target];
    int n = pg->plan.nparams, expand = pg->plan.expand_dbname;
    /* The host's entries go as a connection string in the dbname, with the string's dbname and
     * empty settings (db_host_conninfo): an empty one ("port=,5433", password='') is libpq's
     * default there, where as a parameter libpq takes it for none and reads PGPORT, PGPASSWORD...
     * (another server, another password than the string's). */
    hostaddr = hostaddr ? hostaddr : t->addr.hostaddr;
    size_t len = db_host_conninfo(pg->plan.parsed, host, hostaddr, t->addr.port, NULL);
    char *target = malloc(len + 1);
    if (!target) {
        target_failed(pg, "out of memory");
        return;
    }
    if (db_host_conninfo(pg->plan.parsed, host, hostaddr, t->addr.port, target) > 0) {
        pg->plan.keys[n] = "dbname", pg->plan.values[n++] = target;
        expand = 1;
    }
    /* Last, so that they win over the same keywords earlier (the string's own paths). */
    for (int i = 0; i < pg->pins.n; i++)
        pg->plan.keys[n] = pg->pins.keyword[i], pg->plan.values[n++] = pg->pins.alias[i];
    pg->plan.keys[n] = NULL, pg->plan.values[n] = NULL;
    pg->conn = PQconnectStartParams(pg->plan.keys, pg->plan.values, expand);
    free(target); /* libpq keeps copies */
    pg->plan.keys[pg->plan.nparams] = NULL, pg->plan.values[pg->plan.nparams] = NULL;
    if (!pg->conn || PQstatus(pg->conn) == CONNECTION_BAD) {
        target_failed(pg, pg->conn ? PQerrorMessage(pg->conn) : "out of memory");
        return;
    }
    pg->state = PG_CONNECTING;
    ev_timer_stop(pg->loop, &pg->timer);
    ev_timer_set(&pg->timer, pg->plan.connect_timeout_s, 0);
    ev_timer_start(pg->loop, &pg->timer);
    /* PQconnectStart leaves the first step as "writing" (the TCP connect in progress). */
    watch(pg, PQsocket(pg->conn), EV_WRITE, true);
}

/* A lookup's failure in libpq's own words, so that the log reads the same either way. */
static void lookup_failed(PgConn *pg, const char *why)
{
    char line[512];
    snprintf(line, sizeof(line), "could not translate host name \"%s\" to address: %s",
             pg->plan.targets[pg->target].addr.host, why);
    target_failed(pg, line);
}

static void on_resolved(void *arg, const char *addrs, int n, const char *error)
{
    PgConn *pg = arg;
    pg->resolving = NULL; /* gone after this call */
    log_set_context(pg->log_context);
    if (n == 0) {
        lookup_failed(pg, error);
        return;
    }
    const PgTarget *t = &pg->plan.targets[pg->target];
    char q[200], q2[RESOLVE_MAX_ADDRS * 90];
    log_debug("postgres host resolved", "%shost=%s addresses=%s", pg->tag,
              log_quote(t->shown, q, sizeof(q)), log_quote(addrs, q2, sizeof(q2)));
    /* One address an attempt, in order (PgConn.addrs); the name goes with it, as TLS
     * verification (verify-full) and the password file match on it. */
    forget_addrs(pg);
    size_t len = strlen(addrs) + 1;
    pg->addrs = malloc(len);
    if (!pg->addrs) {
        target_failed(pg, "out of memory");
        return;
    }
    memcpy(pg->addrs, addrs, len);
    for (char *c = pg->addrs; (c = strchr(c, ',')) != NULL;)
        *c++ = '\0';
    pg->addr = pg->addrs;
    pg->addrs_end = pg->addrs + len;
    pg->looked_up = true;
    connect_target(pg, t->addr.host, pg->addr); /* libpq keeps copies */
}

/* Starts connecting to the current target (one host of the list). A host name is looked up off
 * the loop first (resolve.h), as libpq's own lookup would block it; connect_timeout bounds the
 * lookup, and then the connection, each. */
static void attempt_target(PgConn *pg)
{
    const PgTarget *t = &pg->plan.targets[pg->target];
    /* A hostaddr given (libpq ignores an empty one) needs no lookup; lists left whole (counts
     * libpq rejects) are libpq's to report. */
    pg->looked_up = false;
    forget_addrs(pg);
    /* libpq opens the service file and the TLS files itself, on this loop, at every attempt: one
     * swapped for a FIFO since the start-up (or reload) check would stop the loop in an open
     * that waits for a writer. This attempt fails instead, and is retried as any other; and the
     * TLS files are handed to libpq as the files opened by the check (DbPins), so that one
     * swapped after it is never what libpq opens. */
    char err[600];
    db_pins_close(&pg->pins);
    if (pg->plan.parsed && !db_check_files_pinned(pg->plan.parsed, &pg->pins, err, sizeof(err))) {
        /* Said even within an outage (whose later failures go to debug level): nothing else
         * would tell why the relay does not connect once the server is back. */
        if (strncmp(err, pg->files_refused, sizeof(pg->files_refused) - 1) != 0) {
            pg->say_loss = true;
            snprintf(pg->files_refused, sizeof(pg->files_refused), "%.*s",
                     (int)sizeof(pg->files_refused) - 1, err);
        }
        target_failed(pg, err);
        return;
    }
    pg->files_refused[0] = '\0';
    if ((t->addr.hostaddr && *t->addr.hostaddr) || !resolve_needed(t->addr.host) ||
        strchr(t->addr.host, ',') || (t->addr.port && strchr(t->addr.port, ','))) {
        connect_target(pg, t->addr.host, NULL);
        return;
    }
    pg->resolving = resolve_start(pg->loop, t->addr.host, on_resolved, pg, err, sizeof(err));
    if (!pg->resolving) {
        target_failed(pg, err);
        return;
    }
    pg->state = PG_CONNECTING;
    ev_timer_stop(pg->loop, &pg->timer);
    ev_timer_set(&pg->timer, pg->plan.connect_timeout_s, 0);
    ev_timer_start(pg->loop, &pg->timer);
}

static void start_connect(PgConn *pg)
{
    pg->target = 0;
    pg->refused_now = false;
    attempt_target(pg);
}

static void read_notifies(PgConn *pg)
{
    PGnotify *n;
    while (pg->state == PG_UP && (n = PQnotifies(pg->conn)) != NULL) {
        pg->on_notify(pg, n->relname, n->extra, pg->arg);
        PQfreemem(n);
    }
}

static void flush_output(PgConn *pg)
{
    int r = PQflush(pg->conn);
    if (r < 0)
        pg_lose(pg, PQerrorMessage(pg->conn));
    else
        /* 1: more to send; libpq wants read-readiness too so it can make room. */
        pg_set_io(pg, PQsocket(pg->conn), r ? EV_READ | EV_WRITE : EV_READ);
}

/* Reads what the server sent and hands it out. False when the connection broke (lost). */
static bool consume(PgConn *pg)
{
    if (!PQconsumeInput(pg->conn) || PQstatus(pg->conn) == CONNECTION_BAD) {
        /* Parses what came before the end, so that an error the server sent while no request
         * was out reaches notice_to_log and the loss can name it. */
        (void)PQisBusy(pg->conn);
        pg_lose(pg, PQerrorMessage(pg->conn));
        return false;
    }
    read_notifies(pg);
    pg_read_results(pg);
    /* Reading results may have parsed notifications that came with them: hand them out now,
     * not whenever the socket next has data. */
    read_notifies(pg);
    return pg_linked(pg);
}

static void on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    PgConn *pg = w->data;
    log_set_context(pg->log_context);
    if (pg->state == PG_CONNECTING) {
        connect_step(pg);
        return;
    }
    if (!pg_linked(pg))
        return;
    if ((revents & EV_READ) && !consume(pg))
        return;
    if (pg_linked(pg) && (pg->io_events & EV_WRITE))
        flush_output(pg);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    log_set_context(pg->log_context);
    if (pg->state == PG_CONNECTING) {
        char why[256];
        if (pg->looked_up && pg->addr && pg->conn) /* libpq's words, for target_failed's naming */
            snprintf(why, sizeof(why),
                     "connection to server at \"%s\", port %s failed: no answer within %.0f s "
                     "(connect_timeout)",
                     pg->addr, PQport(pg->conn), pg->plan.connect_timeout_s);
        else
            snprintf(why, sizeof(why), "no %s within %.0f s (connect_timeout)",
                     pg->resolving ? "address" : "connection", pg->plan.connect_timeout_s);
        if (pg->resolving)
            lookup_failed(pg, why);
        else
            target_failed(pg, why);
    } else if (pg->state == PG_DOWN) {
        start_connect(pg);
    }
}

static void on_defer(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    log_set_context(pg->log_context);
    char reason[512];
    snprintf(reason, sizeof(reason), "%s", pg->deferred_loss ? pg->deferred_loss : "send failed");
    pg_lose(pg, reason);
}

/* Nothing went to the server for a third of the session timeout: a heartbeat, so that neither
 * the server's idle timeouts nor a silent network go unnoticed. A lone Sync is the cheapest
 * round trip the protocol has (5 bytes out, 6 back, nothing parsed or planned); inside an open
 * transaction it commits nothing. It is sent only while no request is in flight (a busy
 * backend is not idle, and the request's own deadline watches it); a request sent meanwhile
 * queues behind it in the pipeline, so the owner never notices it. */
static void on_quiet(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    log_set_context(pg->log_context);
    if (pg->state != PG_UP || pg_awaiting(pg) || pg->deferred_loss)
        return;
    if (PQpipelineSync(pg->conn) != 1) {
        pg_lose(pg, PQerrorMessage(pg->conn));
        return;
    }
    pg->heartbeat = true;
    pg->heartbeat_sent_at = ev_time();
    pg_sent(pg, false);
    flush_output(pg);
}

/* No answer within the deadline. The answer may be waiting in the socket unread (the relay
 * itself was frozen, and its timers fire before its reads when it wakes): read first, and give
 * up only if nothing completed. */
static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    PgConn *pg = w->data;
    log_set_context(pg->log_context);
    if (!pg_linked(pg) || !pg_awaiting(pg))
        return;
    unsigned long before = pg->syncs_done;
    if (!consume(pg) || pg->syncs_done != before || !pg_awaiting(pg))
        return;
    char why[160];
    snprintf(why, sizeof(why),
             "no answer from PostgreSQL within %.0f ms (--session-timeout); giving the connection "
             "up",
             pg->request_timeout_s * 1e3);
    pg_lose(pg, why);
}

void pg_set_session_timeout(long ms)
{
    session_timeout_ms = ms;
}

PgConn *pg_conn_new(struct ev_loop *loop, const char *conninfo, PgStateFn on_state,
                    PgNotifyFn on_notify, void *arg)
{
    return pg_conn_new_named(loop, conninfo, NULL, on_state, on_notify, arg);
}

PgConn *pg_conn_new_named(struct ev_loop *loop, const char *conninfo, const char *name,
                          PgStateFn on_state, PgNotifyFn on_notify, void *arg)
{
    PgConn *pg = calloc(1, sizeof(*pg));
    if (!pg)
        return NULL;
    if (name)
        snprintf(pg->tag, sizeof(pg->tag), "conn=%s ", name);
    pg->log_context = log_context();
    pg->loop = loop;
    pg->conninfo = strdup(conninfo);
    char app[64];
    snprintf(app, sizeof(app), "outbox-relay%s%s", name ? " " : "", name ? name : "");
    if (!pg->conninfo || !pg_plan_make(&pg->plan, pg->conninfo, session_timeout_ms, app)) {
        pg_plan_free(&pg->plan);
        secrets_free_zeroed(pg->conninfo); /* holds the password */
        free(pg);
        return NULL;
    }
    pg->on_state = on_state;
    pg->on_notify = on_notify;
    pg->arg = arg;
    pg->io_fd = -1;
    pg->request_timeout_s = (double)session_timeout_ms / 1000.0;
    backoff_init(&pg->backoff, PG_BACKOFF_BASE_S, PG_BACKOFF_CAP_S, 0);
    ev_init(&pg->io, on_io);
    pg->io.data = pg;
    ev_init(&pg->timer, on_timer);
    pg->timer.data = pg;
    ev_init(&pg->defer, on_defer);
    pg->defer.data = pg;
    ev_init(&pg->quiet, on_quiet);
    pg->quiet.repeat = (double)session_timeout_ms / 3000.0;
    pg->quiet.data = pg;
    ev_init(&pg->stable, on_stable);
    pg->stable.data = pg;
    ev_init(&pg->deadline, on_deadline);
    pg->deadline.repeat = pg->request_timeout_s;
    pg->deadline.data = pg;
    start_connect(pg);
    return pg;
}

void pg_conn_set_request_timeout(PgConn *pg, double seconds)
{
    pg->request_timeout_s = seconds;
    pg->deadline.repeat = seconds;
    if (ev_is_active(&pg->deadline))
        ev_timer_again(pg->loop, &pg->deadline);
}

void pg_conn_seen_before(PgConn *pg)
{
    pg->ever_up = true;
}

void pg_conn_free(PgConn *pg)
{
    if (!pg)
        return;
    close_conn(pg);
    db_pins_close(&pg->pins);
    forget_addrs(pg);
    for (int i = 0; i < pg->nresults; i++)
        PQclear(pg->results[i]);
    pg_drop_prepare_failure(pg);
    pg_forget_all_prepared(pg);
    free(pg->error);
    pg_plan_free(&pg->plan);
    secrets_free_zeroed(pg->conninfo); /* holds the password */
    free(pg);
}

const char *pg_conn_refused(const PgConn *pg)
{
    return pg->refused[0] ? pg->refused : NULL;
}

bool pg_conn_up(const PgConn *pg)
{
    return pg->state == PG_UP && !pg->deferred_loss;
}

PGconn *pg_conn_libpq(PgConn *pg)
{
    return pg_conn_up(pg) ? pg->conn : NULL;
}

bool pg_conn_idle(const PgConn *pg)
{
    return pg_conn_up(pg) && !pg->busy;
}

void pg_conn_reset(PgConn *pg, const char *reason)
{
    if (pg->state != PG_DOWN)
        pg_lose(pg, reason);
}
