#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "log.h"
#include "secrets.h"

struct DbPool {
    char *conninfo;
    char *setup_sql;  /* run on every new connection; NULL: none */
    const char *name; /* for the log: which pool's outage */
    int size;
    PGconn **conns; /* NULL: not connected */
    bool *busy;
    bool down; /* the last connect failed; logged once per outage */
    pthread_mutex_t mu;
    pthread_cond_t freed;
};

DbPool *pool_new(const char *conninfo, const char *setup_sql, int size, const char *name)
{
    DbPool *p = calloc(1, sizeof(*p));
    char *copy = strdup(conninfo);
    char *setup = setup_sql ? strdup(setup_sql) : NULL;
    PGconn **conns = calloc((size_t)size, sizeof(*conns));
    bool *busy = calloc((size_t)size, sizeof(*busy));
    if (!p || !copy || (setup_sql && !setup) || !conns || !busy) {
        free(p);
        secrets_free_zeroed(copy); /* holds the password */
        free(setup);
        free(conns);
        free(busy);
        return NULL;
    }
    *p = (DbPool){.conninfo = copy,
                  .setup_sql = setup,
                  .name = name,
                  .size = size,
                  .conns = conns,
                  .busy = busy};
    pthread_mutex_init(&p->mu, NULL);
    /* Waits are measured on the monotonic clock, immune to wall-clock jumps. */
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&p->freed, &attr);
    pthread_condattr_destroy(&attr);
    return p;
}

static int find_free(const DbPool *p)
{
    for (int i = 0; i < p->size; i++)
        if (!p->busy[i])
            return i;
    return -1;
}

/* Records a connect outcome; logs only the transitions (down, and back up). */
static void note_connect(DbPool *p, bool ok, const char *why)
{
    pthread_mutex_lock(&p->mu);
    bool was_down = p->down;
    p->down = !ok;
    pthread_mutex_unlock(&p->mu);
    char q[400];
    if (!ok && !was_down)
        log_warn("postgres unreachable", "pool=%s error=%s", p->name, log_quote(why, q, sizeof(q)));
    else if (ok && was_down)
        log_info("postgres reconnected", "pool=%s", p->name);
}

PGconn *pool_acquire(DbPool *p, int wait_ms, char *err, size_t errlen)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += wait_ms / 1000;
    deadline.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }

    pthread_mutex_lock(&p->mu);
    int slot;
    while ((slot = find_free(p)) < 0) {
        if (pthread_cond_timedwait(&p->freed, &p->mu, &deadline) != ETIMEDOUT)
            continue;
        if ((slot = find_free(p)) >= 0)
            break;
        pthread_mutex_unlock(&p->mu);
        snprintf(err, errlen, "all %d database connections are busy", p->size);
        log_warn("all database connections are busy", "size=%d waited_ms=%d", p->size, wait_ms);
        return NULL;
    }
    p->busy[slot] = true;
    PGconn *conn = p->conns[slot];
    pthread_mutex_unlock(&p->mu);

    /* The slot is ours: connecting outside the lock keeps other threads going. */
    if (conn && PQstatus(conn) == CONNECTION_OK)
        return conn;
    PQfinish(conn);
    conn = db_connect(p->conninfo, "producer-demo", err, errlen);
    if (conn && p->setup_sql) {
        DbError e;
        PGresult *res = db_run_script(conn, p->setup_sql, &e); /* one round trip */
        if (!res) {
            snprintf(err, errlen, "setting up the session: %s", db_error_text(&e));
            PQfinish(conn);
            conn = NULL;
        }
        PQclear(res);
    }
    note_connect(p, conn != NULL, err);
    pthread_mutex_lock(&p->mu);
    p->conns[slot] = conn;
    if (!conn) {
        p->busy[slot] = false;
        pthread_cond_signal(&p->freed);
    }
    pthread_mutex_unlock(&p->mu);
    return conn;
}

void pool_release(DbPool *p, PGconn *conn, bool broken)
{
    if (!conn)
        return;
    if (!broken && PQtransactionStatus(conn) != PQTRANS_IDLE) {
        log_warn("connection returned inside a transaction, closing it", NULL);
        broken = true;
    }
    if (broken)
        PQfinish(conn); /* the slot is still marked busy: nobody else can see conn */
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->size; i++) {
        if (p->busy[i] && p->conns[i] == conn) {
            if (broken)
                p->conns[i] = NULL;
            p->busy[i] = false;
            break;
        }
    }
    pthread_cond_signal(&p->freed);
    pthread_mutex_unlock(&p->mu);
}

void pool_free(DbPool *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->size; i++)
        PQfinish(p->conns[i]);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->freed);
    free(p->conns);
    free(p->busy);
    secrets_free_zeroed(p->conninfo); /* holds the password */
    free(p->setup_sql);
    free(p);
}
