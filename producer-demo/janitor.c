#include "janitor.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "db.h"
#include "idem.h"
#include "log.h"

struct Janitor {
    DbPool *pool;
    long interval_s, batch, max_batches;
    atomic_bool stop; /* set under mu; the sweep reads it between batches without */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t thread;
};

long janitor_sweep(PGconn *conn, long batch, long max_batches, const atomic_bool *stop)
{
    long total = 0;
    for (long i = 0; i < max_batches && !(stop && atomic_load(stop)); i++) {
        DbError e;
        long n = idem_cleanup_batch(conn, batch, &e);
        if (n < 0) {
            char q[400];
            log_warn("idempotency key cleanup failed", "error=%s",
                     log_quote(db_error_text(&e), q, sizeof(q)));
            return -1;
        }
        log_debug("expired idempotency keys batch", "rows=%ld", n);
        total += n;
        if (n < batch)
            break;
    }
    if (total > 0)
        log_info("expired idempotency keys deleted", "rows=%ld", total);
    return total;
}

static void *run(void *arg)
{
    Janitor *j = arg;
    bool backlog = false; /* the last sweep stopped at max_batches: more are expired */
    pthread_mutex_lock(&j->mu);
    while (!j->stop) {
        /* A sweep cut short at its bound goes on at once: the bound keeps one sweep's work (and
         * its hold on its connection) small, not the rate, so the cleanup keeps up with any
         * rate of new keys the database can delete at (docs/demos.md: 1,000 x 100 keys per sweep).
         */
        if (!backlog) {
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_sec += j->interval_s;
            while (!j->stop && pthread_cond_timedwait(&j->wake, &j->mu, &until) == 0)
                ;
        }
        if (j->stop)
            break;
        /* Sweep without the lock: janitor_stop must be able to flag us meanwhile, and the sweep
         * ends at the next batch when it does. */
        pthread_mutex_unlock(&j->mu);
        char err[300];
        PGconn *conn = pool_acquire(j->pool, 1000, err, sizeof(err));
        backlog = false;
        if (conn) {
            long n = janitor_sweep(conn, j->batch, j->max_batches, &j->stop);
            pool_release(j->pool, conn, n < 0 && PQstatus(conn) != CONNECTION_OK);
            backlog = n >= j->batch * j->max_batches;
        }
        pthread_mutex_lock(&j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

Janitor *janitor_start(DbPool *pool, long interval_s, long batch, long max_batches)
{
    Janitor *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    *j = (Janitor){
        .pool = pool, .interval_s = interval_s, .batch = batch, .max_batches = max_batches};
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&j->wake, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&j->thread, NULL, run, j) != 0) {
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->wake);
        free(j);
        return NULL;
    }
    return j;
}

void janitor_stop(Janitor *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    j->stop = true;
    pthread_cond_signal(&j->wake);
    pthread_mutex_unlock(&j->mu);
    pthread_join(j->thread, NULL);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->wake);
    free(j);
}
