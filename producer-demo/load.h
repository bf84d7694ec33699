/* load: writes orders and their outbox events at a chosen rate, for demos and benchmarks.
 *
 * Event i belongs to aggregate (order) i % aggregates: the first event of an aggregate creates
 * the order (OrderCreated), later ones amend its amount and bump its version (OrderAmended, the
 * version in the payload shows the per-aggregate order downstream). Each event is one statement
 * that writes the business row and the outbox row together, so one transaction. Aggregates are
 * split over the connections (aggregate % connections), so one aggregate's events are written by
 * one connection, in order. */
#ifndef PRODUCER_LOAD_H
#define PRODUCER_LOAD_H

#include <signal.h>
#include <stdio.h>

typedef struct LoadConfig {
    const char *conninfo;
    long count;       /* events to write */
    long rate;        /* events per second over all connections; 0 = as fast as possible */
    long aggregates;  /* distinct orders the events are spread over */
    long connections; /* parallel connections (threads) */
} LoadConfig;

/* Runs the load, logs progress, and prints one JSON summary line to out ({"events", "created",
 * "amended", "failed", "seconds", "events_per_second"}). Stops early when *stop becomes non-zero.
 * Returns the exit status: 0 when every event was written, 1 otherwise. */
int load_run(const LoadConfig *cfg, volatile sig_atomic_t *stop, FILE *out);

#endif
