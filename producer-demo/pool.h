/* pool: a fixed-size pool of blocking PostgreSQL connections shared by the HTTP threads.
 *
 * The mutex guards only the bookkeeping (which slot is free); connecting, querying and closing
 * happen outside it, so one slow statement never holds up another thread's acquire. Slots
 * connect lazily and reconnect after a connection was reported broken, so the server starts,
 * and keeps answering (503), while PostgreSQL is down. */
#ifndef PRODUCER_POOL_H
#define PRODUCER_POOL_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct DbPool DbPool;

/* Creates a pool of size slots for conninfo (copied); nothing connects yet. setup_sql (copied;
 * NULL: none) runs on every new connection before it is handed out (session settings: the
 * server's timeouts); a connection on which it fails counts as one that could not connect. name
 * (a string literal: "requests", "cleanup") tells its outage lines from another pool's. NULL
 * when out of memory. */
DbPool *pool_new(const char *conninfo, const char *setup_sql, int size, const char *name);

/* Takes a free slot, waiting up to wait_ms for one, and makes sure it is connected. Returns NULL
 * with one line in err when no slot frees up in time or PostgreSQL cannot be reached; both are
 * logged here (an outage once, not per request). */
PGconn *pool_acquire(DbPool *p, int wait_ms, char *err, size_t errlen);

/* Gives a connection back. broken = true (or a transaction left open) closes it, and the next
 * acquire of that slot reconnects. */
void pool_release(DbPool *p, PGconn *conn, bool broken);

/* Closes every connection. All must have been released. */
void pool_free(DbPool *p);

#endif
