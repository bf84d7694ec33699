/* backoff: capped exponential backoff with equal jitter (half fixed, half random), for reconnects
 * and failed batches.
 *
 * The n-th consecutive failure waits a random time in [base*2^n / 2, base*2^n], never more than
 * cap: half of the delay is fixed so retries never collapse to zero, the other half is random so
 * replicas that lost the same server do not come back in lockstep. */
#ifndef OUTBOX_BACKOFF_H
#define OUTBOX_BACKOFF_H

#include <stdint.h>

typedef struct Backoff {
    double base_s;     /* delay after the first failure, before jitter */
    double cap_s;      /* upper bound on any delay */
    unsigned failures; /* consecutive failures so far */
    uint64_t rng;      /* xorshift state, never 0 */
} Backoff;

/* Initialises b; seed 0 picks a seed from the clock and pid. */
void backoff_init(Backoff *b, double base_s, double cap_s, uint64_t seed);

/* Records one more failure and returns how long to wait before the next attempt, in seconds. */
double backoff_next(Backoff *b);

/* Records a success: the next failure starts again from base_s. */
void backoff_reset(Backoff *b);

#endif
