/* janitor: deletes expired Idempotency-Key records, in bounded batches.
 *
 * Each batch is its own short transaction (a long DELETE would hold row locks and vacuum back),
 * and a sweep stops after max_batches so one sweep never runs unbounded; what is left goes in the
 * next sweep. The serve command runs sweeps on a thread of their own; `producer-demo cleanup`
 * runs one sweep from cron or by hand. */
#ifndef PRODUCER_JANITOR_H
#define PRODUCER_JANITOR_H

#include <libpq-fe.h>
#include <stdatomic.h>

#include "pool.h"

typedef struct Janitor Janitor;

/* Deletes expired records batch at a time until a batch comes back short, max_batches ran or
 * *stop became true (looked at before each batch; NULL: never), so that a shutdown waits for the
 * batch in progress, not for the rest of a sweep (up to max_batches statements). Returns how many
 * were deleted, or -1 after a database error (logged). */
long janitor_sweep(PGconn *conn, long batch, long max_batches, const atomic_bool *stop);

/* Starts a thread that sweeps every interval_s seconds with a connection from pool. NULL when
 * the thread cannot be created. */
Janitor *janitor_start(DbPool *pool, long interval_s, long batch, long max_batches);

/* Wakes the thread, waits for the cleanup batch in progress to end, and frees it. */
void janitor_stop(Janitor *j);

#endif
