/* producer-demo: an order service that writes its events through the transactional outbox.
 *
 *   producer-demo serve   --database-url URL --listen HOST:PORT   the HTTP API (api.h)
 *   producer-demo load    --database-url URL --count N --rate R --aggregates A
 *   producer-demo migrate --database-url URL                      apply schema.sql
 *   producer-demo cleanup --database-url URL                      one expired-key sweep
 *
 * Bad input exits 2 with one line on stderr before anything connects. */
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "addr.h"
#include "api.h"
#include "backoff.h"
#include "db.h"
#include "fastpath.h"
#include "janitor.h"
#include "load.h"
#include "log.h"
#include "opts.h"
#include "pool.h"
#include "rcache.h"
#include "secrets.h"
#include "server.h"

#ifndef OUTBOX_RELAY_VERSION
#define OUTBOX_RELAY_VERSION "dev"
#endif

#define EXIT_USAGE 2
#define SCHEMA_LOCK "producer-demo"
#define POOL_WAIT_MS 5000  /* a request waits this long for a database connection, then 503 */
#define SWEEP_BATCHES 100L /* batches per cleanup sweep: bounds one sweep's work */

extern const char producer_schema_sql[]; /* schema.sql, embedded by tools/embed-text.sh */

enum { CMD_SERVE, CMD_LOAD, CMD_MIGRATE, CMD_CLEANUP, CMD_HELP, CMD_VERSION };

typedef struct Options {
    char *database_url;
    char *listen;
    long max_connections;
    long max_per_address;
    long request_deadline;
    long request_log_rate;
    long db_connections;
    long lock_timeout;
    long statement_timeout;
    long key_ttl;
    long cleanup_interval;
    long cleanup_batch;
    long count;
    long rate;
    long aggregates;
    long connections;
    char *redis_url;
    long redis_timeout_ms;
    long redis_guard_ms;
    long redis_cache_ttl;
    LogLevel log_level;
} Options;

#define F(f) offsetof(Options, f)
#define SERVE (1u << CMD_SERVE)
#define LOAD (1u << CMD_LOAD)
#define MIGRATE (1u << CMD_MIGRATE)
#define CLEANUP (1u << CMD_CLEANUP)
#define DB (SERVE | LOAD | MIGRATE | CLEANUP)

static const OptDef options[] = {
    {.name = "database-url",
     .type = OPT_STRING,
     .env = "DATABASE_URL",
     .offset = F(database_url),
     .commands = DB,
     .required = DB,
     .metavar = "URL",
     .help = "PostgreSQL connection string (URL or key=value form)"},
    {.name = "listen",
     .type = OPT_STRING,
     .env = "LISTEN",
     .def = "127.0.0.1:8080",
     .offset = F(listen),
     .commands = SERVE,
     .metavar = "HOST:PORT",
     .help = "address to serve HTTP on ([IPV6]:PORT for IPv6, port 0 picks a free one)"},
    {.name = "max-connections",
     .type = OPT_INT,
     .def = "128",
     .min = 1,
     .max = 10000,
     .offset = F(max_connections),
     .commands = SERVE,
     .metavar = "N",
     .help = "HTTP connections served at once (one thread each)"},
    {.name = "max-connections-per-address",
     .type = OPT_INT,
     .def = "64",
     .min = 1,
     .max = 10000,
     .offset = F(max_per_address),
     .commands = SERVE,
     .metavar = "N",
     .help = "HTTP connections from one client address at once (more are closed at accept)"},
    {.name = "request-deadline",
     .type = OPT_INT,
     .def = "10",
     .min = 1,
     .max = 3600,
     .offset = F(request_deadline),
     .commands = SERVE,
     .metavar = "SECONDS",
     .help =
         "a request's line, headers and body must arrive within this (from the connection's start "
         "or the previous response), else the connection is cut"},
    {.name = "request-log-rate",
     .type = OPT_INT,
     .def = "20",
     .min = 0,
     .max = 1000000,
     .offset = F(request_log_rate),
     .commands = SERVE,
     .metavar = "N",
     .help = "\"request\" lines (one an answer) logged a second at most, the rest counted in a "
             "\"request lines held back\" line; 0: none"},
    {.name = "db-connections",
     .type = OPT_INT,
     .def = "8",
     .min = 1,
     .max = 1000,
     .offset = F(db_connections),
     .commands = SERVE,
     .metavar = "N",
     .help = "PostgreSQL connections in the requests' pool (the key cleanup has one more)"},
    /* Every statement of the server waits at most this long for a lock (55P03) and runs at most
     * --statement-timeout (57014); either answers 503 + Retry-After, its transaction rolled back
     * (docs/demos.md#producer-demo-the-order-api). 5 s: as long as a request waits for a pooled
     * connection, and long past the milliseconds a request's single-row statements hold their
     * locks, so only someone else's long hold (DDL, LOCK TABLE, an open transaction) trips it;
     * short enough that such a hold costs callers a 503 they can retry, not threads and pooled
     * connections that hang with it. 10 s: a request's statements are single-row index lookups
     * and inserts that take milliseconds, so this catches only a stalled server (I/O, a
     * regressed plan); kept above --lock-timeout so that a lock wait ends as the lock timeout it
     * is. */
    {.name = "lock-timeout",
     .type = OPT_INT,
     .def = "5000",
     .min = 1,
     .max = 3600000,
     .offset = F(lock_timeout),
     .commands = SERVE,
     .metavar = "MS",
     .help = "longest wait for a lock of any statement (lock_timeout); longer: 503 + Retry-After, "
             "rolled back, the Idempotency-Key left free (PATCH's row lock: 409)"},
    {.name = "statement-timeout",
     .type = OPT_INT,
     .def = "10000",
     .min = 1,
     .max = 3600000,
     .offset = F(statement_timeout),
     .commands = SERVE,
     .metavar = "MS",
     .help = "longest run of any statement, waits included (statement_timeout); longer: 503 + "
             "Retry-After, rolled back, the Idempotency-Key left free"},
    {.name = "key-ttl",
     .type = OPT_INT,
     .def = "86400",
     .min = 1,
     .max = 31536000,
     .offset = F(key_ttl),
     .commands = SERVE,
     .metavar = "SECONDS",
     .help = "how long an Idempotency-Key is remembered"},
    {.name = "cleanup-interval",
     .type = OPT_INT,
     .def = "60",
     .min = 1,
     .max = 86400,
     .offset = F(cleanup_interval),
     .commands = SERVE,
     .metavar = "SECONDS",
     .help = "how often expired Idempotency-Keys are deleted (a backlog continues at once)"},
    {.name = "cleanup-batch",
     .type = OPT_INT,
     .def = "1000",
     .min = 1,
     .max = 100000,
     .offset = F(cleanup_batch),
     .commands = SERVE | CLEANUP,
     .metavar = "N",
     .help = "expired keys deleted per transaction"},
    {.name = "count",
     .type = OPT_INT,
     .def = "1000",
     .min = 1,
     .max = 1000000000,
     .offset = F(count),
     .commands = LOAD,
     .metavar = "N",
     .help = "events to write"},
    {.name = "rate",
     .type = OPT_INT,
     .def = "0",
     .max = 10000000,
     .offset = F(rate),
     .commands = LOAD,
     .metavar = "R",
     .help = "events per second; 0 = as fast as possible"},
    {.name = "aggregates",
     .type = OPT_INT,
     .def = "100",
     .min = 1,
     .max = 1000000,
     .offset = F(aggregates),
     .commands = LOAD,
     .metavar = "A",
     .help = "orders the events are spread over (first event creates, later ones amend)"},
    {.name = "connections",
     .type = OPT_INT,
     .def = "1",
     .min = 1,
     .max = 64,
     .offset = F(connections),
     .commands = LOAD,
     .metavar = "N",
     .help = "parallel writers, one connection each"},
    {.name = "redis-url",
     .type = OPT_STRING,
     .env = "REDIS_URL",
     .offset = F(redis_url),
     .commands = SERVE,
     .metavar = "redis://HOST:PORT[/DB]",
     .help = "optional Redis in front of PostgreSQL: cached Idempotency-Key responses and "
             "in-progress guards (PostgreSQL still decides)"},
    {.name = "redis-timeout-ms",
     .type = OPT_INT,
     .def = "100",
     .min = 1,
     .max = 10000,
     .offset = F(redis_timeout_ms),
     .commands = SERVE,
     .metavar = "MS",
     .help = "bound on each Redis call; a slower Redis is treated as down"},
    {.name = "redis-guard-ms",
     .type = OPT_INT,
     .def = "10000",
     .max = 3600000,
     .offset = F(redis_guard_ms),
     .commands = SERVE,
     .metavar = "MS",
     .help = "lifetime of a key's in-progress guard in Redis (0 = no guard): how long a key can "
             "answer 409 after a crash"},
    {.name = "redis-cache-ttl",
     .type = OPT_INT,
     .def = "3600",
     .min = 1,
     .max = 31536000,
     .offset = F(redis_cache_ttl),
     .commands = SERVE,
     .metavar = "SECONDS",
     .help = "cap on how long Redis keeps a cached response (never longer than the key itself); "
             "older retries are answered by PostgreSQL"},
    {.name = "log-level",
     .type = OPT_LOG_LEVEL,
     .def = "info",
     .offset = F(log_level),
     .commands = DB,
     .metavar = "LEVEL",
     .help = "debug, info, warn or error"},
};

static const CmdDef commands[] = {
    {"serve", CMD_SERVE, "serve the order API until SIGTERM or SIGINT"},
    {"load", CMD_LOAD, "write --count orders and outbox events, then print a summary"},
    {"migrate", CMD_MIGRATE, "create the demo tables (orders, idempotency_keys), then exit"},
    {"cleanup", CMD_CLEANUP, "delete expired Idempotency-Keys once, then exit"},
    {"help", CMD_HELP, "show this help (also --help, -h)"},
    {"version", CMD_VERSION, "show the version (also --version)"},
};

static const OptSpec spec = {
    .prog = "producer-demo",
    .summary = "An order service: POST /orders with an Idempotency-Key writes the order and its\n"
               "OrderCreated outbox event in one transaction; PATCH /orders/{id} with If-Match "
               "changes it\n"
               "and writes OrderUpdated the same way; outbox-relay publishes the events.",
    .cmds = commands,
    .ncmds = sizeof(commands) / sizeof(commands[0]),
    .default_cmd = -1,
    .help_cmd = CMD_HELP,
    .version_cmd = CMD_VERSION,
    .opts = options,
    .nopts = sizeof(options) / sizeof(options[0]),
};

/* Prints one line of bad input, scrubbed of the registered secrets (libpq's and librdkafka's
 * errors may echo a value), and returns the usage exit status. */
static int usage_error(const char *msg)
{
    char line[1024];
    snprintf(line, sizeof(line), "%s", msg);
    secrets_scrub(line);
    fprintf(stderr, "producer-demo: %s\n", line);
    return EXIT_USAGE;
}

/* Applies the schema and checks that the relay's outbox table exists. On failure logs why and
 * sets *unreachable when it was the connection that failed (worth retrying); an unreachable
 * server is logged as a warning once, then at debug level while *unreachable stays set. */
static bool prepare_db(const char *url, bool *unreachable)
{
    char err[300], q[400];
    bool was_unreachable = *unreachable;
    *unreachable = false;
    PGconn *conn = db_connect(url, "producer-demo", err, sizeof(err));
    if (!conn) {
        *unreachable = true;
        log_write(was_unreachable ? LOG_DEBUG : LOG_WARN, "postgres unreachable", "error=%s",
                  log_quote(err, q, sizeof(q)));
        return false;
    }
    DbError e;
    bool ok = db_apply_schema(conn, SCHEMA_LOCK, producer_schema_sql, &e);
    if (!ok) {
        *unreachable = e.conn_lost;
        log_error("cannot apply the schema", "error=%s",
                  log_quote(db_error_text(&e), q, sizeof(q)));
    } else {
        PGresult *res = db_query(conn, "SELECT to_regclass('outbox') IS NOT NULL", 0, NULL, &e);
        ok = res && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
        if (!res) {
            *unreachable = e.conn_lost;
            log_error("cannot check for the outbox table", "error=%s",
                      log_quote(db_error_text(&e), q, sizeof(q)));
        } else if (!ok) {
            log_error("table outbox does not exist: run 'outbox-relay migrate' first", NULL);
        }
        PQclear(res);
    }
    PQfinish(conn);
    return ok;
}

/* Waits up to seconds for SIGTERM/SIGINT (blocked in every thread); returns the signal or 0. */
static int wait_signal(const sigset_t *set, double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    int sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

/* Scopes the Redis keys by the database's identity (fastpath_set_namespace). */
static bool redis_namespace(DbPool *pool)
{
    char err[300], ns[160], q[400];
    PGconn *conn = pool_acquire(pool, POOL_WAIT_MS, err, sizeof(err));
    DbError e = {0};
    bool ok = conn && db_identity(conn, ns, sizeof(ns), &e);
    if (conn)
        pool_release(pool, conn, !ok);
    if (!ok) {
        log_error("cannot read the database's identity for the Redis keys", "error=%s",
                  log_quote(conn ? db_error_text(&e) : err, q, sizeof(q)));
        return false;
    }
    fastpath_set_namespace(ns);
    return true;
}

static int cmd_serve(const Options *o)
{
    char err[300], host[256];
    unsigned port;
    if (!db_check_writer_conninfo(o->database_url, err, sizeof(err)) ||
        !addr_parse_host_port("--listen", o->listen, host, sizeof(host), &port, err, sizeof(err)))
        return usage_error(err);
    RCache *redis = NULL;
    if (o->redis_url) {
        /* One context per HTTP connection thread at most; they connect on first use. */
        redis = rcache_new(o->redis_url, (int)o->max_connections, (int)o->redis_timeout_ms, err,
                           sizeof(err));
        if (!redis)
            return usage_error(err);
    }

    /* Signals are taken by sigwait in this thread only; every thread started below inherits
     * the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    /* PostgreSQL may come up after us (containers): wait for it rather than fail. */
    Backoff b;
    backoff_init(&b, 0.2, 5.0, 0);
    bool unreachable = false;
    while (!prepare_db(o->database_url, &unreachable)) {
        if (!unreachable)
            return 1;
        int sig = wait_signal(&set, backoff_next(&b));
        if (sig) {
            log_info("shutting down", "signal=%s", strsignal(sig));
            rcache_free(redis);
            return 0;
        }
    }

    char session_sql[512];
    if (!api_session_sql(o->lock_timeout, o->statement_timeout, session_sql, sizeof(session_sql))) {
        log_error("the session settings do not fit their buffer", NULL); /* cannot happen */
        rcache_free(redis);
        return 1;
    }
    DbPool *pool = pool_new(o->database_url, session_sql, (int)o->db_connections, "requests");
    if (!pool) {
        log_error("out of memory", NULL);
        rcache_free(redis);
        return 1;
    }
    Api api = {.pool = pool,
               .key_ttl_s = o->key_ttl,
               .pool_wait_ms = POOL_WAIT_MS,
               .redis = redis,
               .guard_ms = o->redis_guard_ms,
               .cache_ttl_ms = (long long)o->redis_cache_ttl * 1000};
    if (redis && !redis_namespace(pool)) {
        pool_free(pool);
        rcache_free(redis);
        return 1;
    }
    ServerLimits limits = {o->max_connections, o->max_per_address, o->request_deadline,
                           o->request_log_rate};
    Server *server = server_start(&api, o->listen, &limits, err, sizeof(err));
    if (!server) {
        char q[400];
        log_error("cannot start the HTTP server", "error=%s", log_quote(err, q, sizeof(q)));
        pool_free(pool);
        rcache_free(redis);
        return 1;
    }
    char qlisten[300];
    log_info("producer-demo listening",
             "version=%s listen=%s port=%u key_ttl_s=%ld lock_timeout_ms=%ld "
             "statement_timeout_ms=%ld redis=%s redis_guard_ms=%ld",
             OUTBOX_RELAY_VERSION, log_quote(o->listen, qlisten, sizeof(qlisten)),
             server_port(server), o->key_ttl, o->lock_timeout, o->statement_timeout,
             redis ? "on" : "off", redis ? o->redis_guard_ms : 0L);
    /* The cleanup has a connection of its own, not one of the requests' pool: a backlog keeps it
     * busy round after round, and on a shared pool it took a connection back the moment it gave
     * one up, ahead of the requests waiting for it (with --db-connections 1, every request got
     * 503 until the backlog was gone). */
    DbPool *janitor_pool = pool_new(o->database_url, session_sql, 1, "cleanup");
    Janitor *janitor = janitor_pool ? janitor_start(janitor_pool, o->cleanup_interval,
                                                    o->cleanup_batch, SWEEP_BATCHES)
                                    : NULL;
    if (!janitor)
        log_warn("cannot start the cleanup thread; expired keys stay until 'cleanup'", NULL);

    int sig = 0;
    while (sig != SIGINT && sig != SIGTERM)
        sigwait(&set, &sig);
    log_info("shutting down", "signal=%s", strsignal(sig));
    server_stop(server);
    janitor_stop(janitor);
    pool_free(janitor_pool);
    pool_free(pool);
    if (redis) {
        RCacheStats st = rcache_stats(redis);
        log_info("redis totals",
                 "hits=%ld misses=%ld calls=%ld failures=%ld skipped=%ld outages=%ld",
                 (long)api.redis_hits, (long)api.redis_misses, st.calls, st.failures, st.skipped,
                 st.outages);
        rcache_free(redis);
    }
    log_info("stopped", NULL);
    return 0;
}

static volatile sig_atomic_t load_stop = 0;

static void on_load_signal(int sig)
{
    (void)sig;
    load_stop = 1;
}

static int cmd_load(const Options *o)
{
    char err[300];
    if (!db_check_writer_conninfo(o->database_url, err, sizeof(err)))
        return usage_error(err);
    bool unreachable = false;
    if (!prepare_db(o->database_url, &unreachable))
        return 1;
    struct sigaction sa = {.sa_handler = on_load_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    LoadConfig cfg = {o->database_url, o->count, o->rate, o->aggregates, o->connections};
    return load_run(&cfg, &load_stop, stdout);
}

static int cmd_migrate(const Options *o)
{
    char err[300];
    if (!db_check_writer_conninfo(o->database_url, err, sizeof(err)))
        return usage_error(err);
    bool unreachable = false;
    return prepare_db(o->database_url, &unreachable) ? 0 : 1;
}

static int cmd_cleanup(const Options *o)
{
    char err[300];
    if (!db_check_writer_conninfo(o->database_url, err, sizeof(err)))
        return usage_error(err);
    PGconn *conn = db_connect_once(o->database_url, "producer-demo");
    if (!conn)
        return 1;
    /* No cap on batches here: an operator asked for everything expired to go. */
    long n = janitor_sweep(conn, o->cleanup_batch, 1000000000L, NULL);
    PQfinish(conn);
    if (n >= 0)
        printf("{\"deleted\":%ld}\n", n);
    return n >= 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    /* Before anything reads a password into memory: a core would hold it. */
    secrets_no_core_dumps();
    signal(SIGPIPE, SIG_IGN);
    /* Hidden: the generated sections of the man page, for tools/gen-man.sh. */
    if (argc == 2 && strcmp(argv[1], "--help-man") == 0) {
        opts_print_man(&spec, stdout);
        return 0;
    }
    Options o = {0};
    int cmd;
    char err[1024];
    if (!opts_parse(&spec, &o, &cmd, argc, argv, err, sizeof(err))) {
        opts_free(&spec, &o);
        return usage_error(err);
    }
    /* As the relay does (relay/main.c): from here on nothing the process writes may show a
     * password (log_write scrubs the registered ones), and ps or /proc/PID/cmdline, which every
     * local user may read, shows none: the connection strings go whole from argv, and a
     * sensitive --kafka property's value. */
    secrets_add_conninfo(o.database_url);
    secrets_add_conninfo(o.redis_url);
    static const char *const whole[] = {"database-url", "redis-url", NULL};
    secrets_scrub_argv(&spec, argc, argv, whole, NULL);
    log_set_level(o.log_level);
    /* As the relay says at start-up: masked in connection strings, but not scrubbed elsewhere. */
    log_warn_short_secrets(secrets_too_short());
    int rc = 0;
    switch (cmd) {
    case CMD_SERVE:
        rc = cmd_serve(&o);
        break;
    case CMD_LOAD:
        rc = cmd_load(&o);
        break;
    case CMD_MIGRATE:
        rc = cmd_migrate(&o);
        break;
    case CMD_CLEANUP:
        rc = cmd_cleanup(&o);
        break;
    case CMD_HELP:
        opts_print_help(&spec, stdout);
        break;
    case CMD_VERSION:
        printf("producer-demo %s (libpq %d)\n", OUTBOX_RELAY_VERSION, PQlibVersion());
        break;
    }
    opts_free(&spec, &o);
    return rc;
}
