#include "load.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "log.h"

#define ORDER_JSON_SQL(event)                                                                      \
    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)"                       \
    " SELECT 'order', id::text, '" event "', jsonb_build_object('id', id,"                         \
    " 'customer_id', customer_id, 'amount_cents', amount_cents, 'currency', currency,"             \
    " 'status', status, 'version', version, 'created_at',"                                         \
    " to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))"                \
    " FROM o RETURNING aggregate_id"

/* One statement each, so the order row and its event commit together. */
static const char *const create_sql =
    "WITH o AS (INSERT INTO orders (customer_id, amount_cents, currency) VALUES ($1, $2, $3)"
    " RETURNING *) " ORDER_JSON_SQL("OrderCreated");
static const char *const amend_sql =
    "WITH o AS (UPDATE orders SET amount_cents = $2, version = version + 1, updated_at = now()"
    " WHERE id = $1 RETURNING *) " ORDER_JSON_SQL("OrderAmended");

static const char *const currencies[] = {"EUR", "USD", "GBP", "JPY", "CHF"};

typedef struct Worker {
    const LoadConfig *cfg;
    volatile sig_atomic_t *stop;
    long index;
    long created, amended, failed;
    pthread_t thread;
} Worker;

static void sleep_until(const struct timespec *t)
{
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, t, NULL) == EINTR)
        ;
}

static void add_ns(struct timespec *t, double ns)
{
    long long total = (long long)t->tv_nsec + (long long)ns;
    t->tv_sec += (time_t)(total / 1000000000LL);
    t->tv_nsec = (long)(total % 1000000000LL);
}

/* Writes one event for aggregate a; ids[a / connections] holds its order id once created. */
static bool write_event(Worker *w, PGconn *conn, long i, char (*ids)[37])
{
    const LoadConfig *cfg = w->cfg;
    long a = i % cfg->aggregates;
    char *id = ids[a / cfg->connections];
    char customer[48], amount[32];
    snprintf(customer, sizeof(customer), "load-customer-%ld", a);
    snprintf(amount, sizeof(amount), "%ld", 100 + (i * 7919) % 100000);
    DbError e;
    PGresult *res;
    bool creating = id[0] == '\0';
    if (creating) {
        const char *v[3] = {customer, amount, currencies[a % 5]};
        res = db_query(conn, create_sql, 3, v, &e);
    } else {
        const char *v[2] = {id, amount};
        res = db_query(conn, amend_sql, 2, v, &e);
    }
    if (!res || PQntuples(res) != 1) {
        char q[400];
        log_error("load: write failed", "event=%ld error=%s", i,
                  log_quote(res ? "order not found" : db_error_text(&e), q, sizeof(q)));
        PQclear(res);
        return false;
    }
    if (creating) {
        snprintf(id, 37, "%s", PQgetvalue(res, 0, 0));
        w->created++;
    } else {
        w->amended++;
    }
    PQclear(res);
    return true;
}

static void *work(void *arg)
{
    Worker *w = arg;
    const LoadConfig *cfg = w->cfg;
    char err[300];
    PGconn *conn = db_connect(cfg->conninfo, "producer-demo-load", err, sizeof(err));
    long mine_aggr = (cfg->aggregates - w->index + cfg->connections - 1) / cfg->connections;
    char(*ids)[37] = calloc((size_t)(mine_aggr > 0 ? mine_aggr : 1), sizeof(*ids));
    if (!conn || !ids) {
        char q[400];
        log_error("load: cannot connect", "error=%s",
                  log_quote(conn ? "out of memory" : err, q, sizeof(q)));
        w->failed = -1;
        PQfinish(conn);
        free(ids);
        return NULL;
    }
    /* Worker w writes the events of its aggregates, i.e. i % aggregates % connections == w,
     * each at its slot in the global schedule (event i is due at start + i / rate). */
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < cfg->count && !*w->stop; i++) {
        if ((i % cfg->aggregates) % cfg->connections != w->index)
            continue;
        if (cfg->rate > 0) {
            struct timespec due = start;
            add_ns(&due, (double)i * 1e9 / (double)cfg->rate);
            sleep_until(&due);
        }
        if (!write_event(w, conn, i, ids)) {
            w->failed++;
            if (PQstatus(conn) != CONNECTION_OK)
                break; /* the rest would fail the same way */
        }
    }
    PQfinish(conn);
    free(ids);
    return NULL;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) / 1e9;
}

int load_run(const LoadConfig *cfg, volatile sig_atomic_t *stop, FILE *out)
{
    Worker *workers = calloc((size_t)cfg->connections, sizeof(*workers));
    if (!workers) {
        log_error("load: out of memory", NULL);
        return 1;
    }
    log_info("load starting", "events=%ld rate=%ld aggregates=%ld connections=%ld", cfg->count,
             cfg->rate, cfg->aggregates, cfg->connections);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long started = 0;
    for (long w = 0; w < cfg->connections; w++) {
        workers[w] = (Worker){.cfg = cfg, .stop = stop, .index = w};
        if (pthread_create(&workers[w].thread, NULL, work, &workers[w]) != 0) {
            log_error("load: cannot start a thread", NULL);
            *stop = 1;
            break;
        }
        started++;
    }
    long created = 0, amended = 0, failed = 0;
    bool connect_failed = false;
    for (long w = 0; w < started; w++) {
        pthread_join(workers[w].thread, NULL);
        created += workers[w].created;
        amended += workers[w].amended;
        if (workers[w].failed < 0)
            connect_failed = true;
        else
            failed += workers[w].failed;
    }
    double secs = seconds_since(&t0);
    long written = created + amended;
    fprintf(out,
            "{\"events\":%ld,\"created\":%ld,\"amended\":%ld,\"failed\":%ld,\"seconds\":%.3f,"
            "\"events_per_second\":%.1f}\n",
            written, created, amended, failed, secs, secs > 0 ? (double)written / secs : 0.0);
    fflush(out);
    log_info("load finished", "events=%ld created=%ld amended=%ld failed=%ld seconds=%.3f", written,
             created, amended, failed, secs);
    free(workers);
    return written == cfg->count && !connect_failed && started == cfg->connections ? 0 : 1;
}
