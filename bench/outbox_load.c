/*
 * outbox-load: the benchmark's producer for many databases (bench/multidb.sh): one process, one
 * thread, paced single-event INSERT transactions into the outbox tables of one or more databases
 * of one server, at a total rate.
 *
 *   outbox-load --conninfo CONNINFO --database NAME[,NAME...] [--database ...] --rate R
 *               --seconds S [--conns K] [--drain-seconds D] [--per-database]
 *
 * Why not pgbench: pgbench drives one database a run, so N databases took N pgbench processes
 * and N backends of their own; with 50 of them on a 2-core machine the load generator took the
 * CPUs the relay and PostgreSQL were being measured on. Here one process holds K connections a
 * database (default 1) and waits in ppoll() between events.
 *
 * Arrivals: a Poisson process of rate R (exponential gaps, as pgbench -R), each event going to a
 * database picked uniformly at random, so each database sees a Poisson process of rate R/N, as N
 * pgbench -R processes gave. An event due while all of its database's connections are busy waits
 * in that database's queue (at most QUEUE_CAP, beyond which it is skipped and counted) and is
 * sent when one frees; its lag (sent minus due) is reported, so a generator that fell behind its
 * schedule says so. The statement is bench/insert_event.sql's (the payload carries committed_us,
 * clock_timestamp() as the INSERT runs), in autocommit, prepared once per connection.
 *
 * CONNINFO is a libpq connection string without dbname ("host=127.0.0.1 port=5432 user=x");
 * each database's connections add dbname=NAME and application_name=outbox-load. Connections are
 * made before the clock starts (blocking: that is setup). A connection lost during the run is
 * reported and not reopened; its database's later events go to its other connections, or count
 * as failed when it has none.
 * Output, on stdout at the end, one line:
 *   outbox-load: databases N connections C scheduled X committed Y failed F skipped K lag_p50_ms A
 *   lag_p99_ms B lag_max_ms M seconds T
 * (seconds: from the first due event to the last commit), and with --per-database one line
 * "NAME committed Y failed F" per database before it. After S seconds no new event is scheduled;
 * those queued or in flight are waited for, at most D seconds (default 30).
 * Exit: 0 when every scheduled event committed, 1 otherwise (failures, skips, lost connections,
 * a drain that timed out, a signal), 2 on bad flags or a failed setup.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#define MAX_DATABASES 1000
#define MAX_CONNS_PER_DB 64
/* Due events a database may have waiting for a connection: 30 s of a 1,000/s database. */
#define QUEUE_CAP 32768

/* bench/insert_event.sql with the aggregate number as $1. */
static const char INSERT_SQL[] =
    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) "
    "VALUES ('order', 'order-' || lpad(($1::int)::text, 4, '0'), 'order.paid', "
    "jsonb_build_object("
    "'committed_us', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, "
    "'order_id', 'order-' || lpad(($1::int)::text, 4, '0'), "
    "'status', 'paid', "
    "'customer_id', 'cust-' || lpad(($1::int)::text, 5, '0'), "
    "'amount_cents', 4200, "
    "'currency', 'EUR', "
    "'items', '[{\"sku\": \"SKU-01234\", \"qty\": 2, \"price_cents\": 2100}]'::jsonb, "
    "'note', md5(random()::text)), "
    "jsonb_build_object('traceparent', "
    "'00-' || md5(random()::text) || '-' || left(md5(random()::text), 16) || '-01'))";

typedef struct {
    PGconn *pg;
    bool busy; /* a statement sent, its results not all read */
    bool lost;
    int db;
} Conn;

typedef struct {
    const char *name;
    double *queue; /* due times (monotonic s) of events waiting for a connection, a ring */
    int q_head, q_len;
    long committed, failed, skipped;
} Database;

static volatile sig_atomic_t run = 1;

static void on_signal(int sig)
{
    (void)sig;
    run = 0;
}

static void usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "outbox-load: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A uniform double in (0, 1], from the process's own generator (drand48 is enough here). */
static double uniform01(void)
{
    return 1.0 - drand48();
}

static Database dbs[MAX_DATABASES];
static int n_dbs;
static Conn *conns;
static int n_conns;
static double *lags; /* seconds, one per event sent */
static long n_lags, cap_lags;
static bool had_error;

static void record_lag(double lag)
{
    if (n_lags == cap_lags) {
        long cap = cap_lags ? cap_lags * 2 : 4096;
        double *grown = realloc(lags, (size_t)cap * sizeof(*lags));
        if (!grown)
            return; /* a figure less, not a reason to stop the load */
        lags = grown, cap_lags = cap;
    }
    lags[n_lags++] = lag;
}

/* Sends one event on c, due at `due`; false (and the event counted failed) when it cannot. */
static bool send_event(Conn *c, double due)
{
    char aggr[16];
    snprintf(aggr, sizeof(aggr), "%ld", lrand48() % 1000);
    const char *params[1] = {aggr};
    if (!PQsendQueryPrepared(c->pg, "ins", 1, params, NULL, NULL, 0)) {
        fprintf(stderr, "outbox-load: %s: send: %s", dbs[c->db].name, PQerrorMessage(c->pg));
        c->lost = true, had_error = true;
        dbs[c->db].failed++;
        return false;
    }
    c->busy = true;
    record_lag(now_s() - due);
    return true;
}

/* An idle, live connection of database d, or NULL. */
static Conn *idle_conn(int d)
{
    for (int i = 0; i < n_conns; i++)
        if (conns[i].db == d && !conns[i].busy && !conns[i].lost)
            return &conns[i];
    return NULL;
}

static bool has_live_conn(int d)
{
    for (int i = 0; i < n_conns; i++)
        if (conns[i].db == d && !conns[i].lost)
            return true;
    return false;
}

/* An event for database d falls due at `due`: sent now, or queued behind the busy connections. */
static void dispatch(int d, double due)
{
    Database *db = &dbs[d];
    Conn *c = db->q_len == 0 ? idle_conn(d) : NULL;
    if (c) {
        send_event(c, due);
    } else if (!has_live_conn(d)) {
        db->failed++;
    } else if (db->q_len == QUEUE_CAP) {
        db->skipped++;
    } else {
        db->queue[(db->q_head + db->q_len++) % QUEUE_CAP] = due;
    }
}

/* Reads what c's server sent; when its statement is done, sends its database's next queued
 * event. */
static void on_readable(Conn *c)
{
    Database *db = &dbs[c->db];
    if (!PQconsumeInput(c->pg)) {
        fprintf(stderr, "outbox-load: %s: connection lost: %s", db->name, PQerrorMessage(c->pg));
        if (c->busy)
            db->failed++;
        c->lost = true, c->busy = false, had_error = true;
        return;
    }
    while (c->busy && !PQisBusy(c->pg)) {
        PGresult *res = PQgetResult(c->pg);
        if (!res) {
            c->busy = false;
            break;
        }
        if (PQresultStatus(res) == PGRES_COMMAND_OK) {
            db->committed++;
        } else {
            if (db->failed++ == 0)
                fprintf(stderr, "outbox-load: %s: insert: %s", db->name, PQresultErrorMessage(res));
            had_error = true;
        }
        PQclear(res);
    }
    if (!c->busy && db->q_len > 0) {
        double due = db->queue[db->q_head];
        db->q_head = (db->q_head + 1) % QUEUE_CAP, db->q_len--;
        send_event(c, due);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double lag_pct(double p)
{
    if (n_lags == 0)
        return 0;
    long i = (long)ceil((double)n_lags * p / 100.0) - 1;
    return lags[i < 0 ? 0 : i] * 1e3;
}

static void add_databases(char *list)
{
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
        if (n_dbs == MAX_DATABASES)
            usage_error("too many databases", NULL);
        dbs[n_dbs++].name = name;
    }
}

static long parse_long(const char *arg, const char *what, long min, long max)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || *end || end == arg || v < min || v > max)
        usage_error(what, arg);
    return v;
}

static PGconn *connect_db(const char *conninfo, const char *name)
{
    /* With expand_dbname, libpq expands the first dbname as a connection string (CONNINFO) and
     * takes a later one as a plain name, which wins. */
    const char *keys[] = {"dbname", "dbname", "application_name", NULL};
    const char *vals[] = {conninfo, name, "outbox-load", NULL};
    PGconn *pg = PQconnectdbParams(keys, vals, 1);
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "outbox-load: %s: connect: %s", name, PQerrorMessage(pg));
        exit(2);
    }
    PGresult *res = PQprepare(pg, "ins", INSERT_SQL, 1, NULL);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
        fprintf(stderr, "outbox-load: %s: prepare: %s", name, PQresultErrorMessage(res));
        exit(2);
    }
    PQclear(res);
    if (PQsetnonblocking(pg, 1) != 0) {
        fprintf(stderr, "outbox-load: %s: non-blocking: %s", name, PQerrorMessage(pg));
        exit(2);
    }
    return pg;
}

int main(int argc, char **argv)
{
    const char *conninfo = NULL;
    double rate = 0;
    long seconds = 0, per_db = 1, drain_s = 30;
    bool per_database = false;
    static const struct option longopts[] = {
        {"conninfo", required_argument, NULL, 'c'}, {"database", required_argument, NULL, 'd'},
        {"rate", required_argument, NULL, 'r'},     {"seconds", required_argument, NULL, 's'},
        {"conns", required_argument, NULL, 'k'},    {"drain-seconds", required_argument, NULL, 'D'},
        {"per-database", no_argument, NULL, 'p'},   {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            conninfo = optarg;
            break;
        case 'd':
            add_databases(optarg);
            break;
        case 'r':
            rate = (double)parse_long(optarg, "--rate must be 1..1000000", 1, 1000000);
            break;
        case 's':
            seconds = parse_long(optarg, "--seconds must be 1..86400", 1, 86400);
            break;
        case 'k':
            per_db = parse_long(optarg, "--conns must be 1..64", 1, MAX_CONNS_PER_DB);
            break;
        case 'D':
            drain_s = parse_long(optarg, "--drain-seconds must be 0..3600", 0, 3600);
            break;
        case 'p':
            per_database = true;
            break;
        default:
            usage_error("bad flags (see the comment at the top of bench/outbox_load.c)", NULL);
        }
    }
    if (!conninfo || n_dbs == 0 || rate == 0 || seconds == 0 || optind != argc)
        usage_error("--conninfo, --database, --rate and --seconds are required", NULL);

    n_conns = n_dbs * (int)per_db;
    conns = calloc((size_t)n_conns, sizeof(*conns));
    struct pollfd *pfds = calloc((size_t)n_conns, sizeof(*pfds));
    if (!conns || !pfds)
        usage_error("out of memory", NULL);
    for (int d = 0; d < n_dbs; d++) {
        dbs[d].queue = malloc(QUEUE_CAP * sizeof(double));
        if (!dbs[d].queue)
            usage_error("out of memory", NULL);
        for (long k = 0; k < per_db; k++) {
            Conn *c = &conns[d * per_db + k];
            c->db = d;
            c->pg = connect_db(conninfo, dbs[d].name);
        }
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    srand48((long)time(NULL) ^ (long)getpid());

    double start = now_s(), end = start + (double)seconds, next = start, last_commit = start;
    long scheduled = 0;
    for (;;) {
        double t = now_s();
        /* Every event due by now, in order of due time. */
        while (run && next <= t && next < end) {
            dispatch((int)(lrand48() % n_dbs), next);
            scheduled++;
            next += -log(uniform01()) / rate;
        }
        bool scheduling = run && next < end;
        int pending = 0;
        for (int i = 0; i < n_conns; i++) {
            pfds[i].fd = conns[i].lost ? -1 : PQsocket(conns[i].pg);
            pfds[i].events = POLLIN;
            pfds[i].revents = 0;
            /* A send PQflush could not finish (non-blocking): watch for room too. */
            if (!conns[i].lost && PQflush(conns[i].pg) == 1)
                pfds[i].events |= POLLOUT;
            pending += conns[i].busy;
        }
        for (int d = 0; d < n_dbs; d++)
            pending += dbs[d].q_len;
        if (!scheduling && pending == 0)
            break;
        double wake = scheduling ? next : end + (double)drain_s;
        if (!scheduling && (t >= wake || !run))
            break; /* the drain's bound, or a signal: what is left counts as not committed */
        double wait = wake - t > 0 ? wake - t : 0;
        if (wait > 1)
            wait = 1; /* a bounded wait: a signal is seen within a second at worst */
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        int n = ppoll(pfds, (nfds_t)n_conns, &ts, NULL);
        if (n < 0 && errno != EINTR) {
            perror("outbox-load: ppoll");
            return 2;
        }
        for (int i = 0; n > 0 && i < n_conns; i++) {
            if (pfds[i].revents & (POLLIN | POLLERR | POLLHUP)) {
                long before = dbs[conns[i].db].committed;
                on_readable(&conns[i]);
                if (dbs[conns[i].db].committed != before)
                    last_commit = now_s();
            }
        }
    }

    long committed = 0, failed = 0, skipped = 0, left = 0;
    for (int d = 0; d < n_dbs; d++) {
        committed += dbs[d].committed, failed += dbs[d].failed, skipped += dbs[d].skipped;
        left += dbs[d].q_len;
        if (per_database)
            printf("%s committed %ld failed %ld\n", dbs[d].name, dbs[d].committed,
                   dbs[d].failed + dbs[d].skipped + dbs[d].q_len);
    }
    for (int i = 0; i < n_conns; i++)
        left += conns[i].busy;
    qsort(lags, (size_t)n_lags, sizeof(*lags), cmp_double);
    printf("outbox-load: databases %d connections %d scheduled %ld committed %ld failed %ld "
           "skipped %ld lag_p50_ms %.2f lag_p99_ms %.2f lag_max_ms %.2f seconds %.1f\n",
           n_dbs, n_conns, scheduled, committed, failed + left, skipped, lag_pct(50), lag_pct(99),
           n_lags ? lags[n_lags - 1] * 1e3 : 0.0, last_commit - start);
    for (int i = 0; i < n_conns; i++)
        PQfinish(conns[i].pg);
    for (int d = 0; d < n_dbs; d++)
        free(dbs[d].queue);
    free(conns), free(pfds), free(lags);
    return (had_error || failed || skipped || left || !run) ? 1 : 0;
}
