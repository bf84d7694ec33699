/* xiddate: dates transaction ids by the time a look first saw the next transaction id pass them,
 * from (time, next transaction id) samples in bounded memory. The vacuum horizon look
 * (relay/service/upkeep.c) dates a replication slot's xmin with it: PostgreSQL keeps no start
 * for a slot's snapshot. */
#ifndef OUTBOX_XIDDATE_H
#define OUTBOX_XIDDATE_H

#include <stdbool.h>

/* How many samples are kept: thinned when full, so that they reach back to the first look with
 * a precision that coarsens with age. */
#define XIDDATE_SAMPLES 64

typedef struct XidDates {
    /* When (monotonic seconds) each next transaction id was first seen, oldest first, the ids
     * rising. */
    struct {
        double at;
        long long next_xid;
    } s[XIDDATE_SAMPLES];
    int n;
    /* The last id dated (-1 none) and its date (-1: no transaction after it yet), kept while the
     * id stays, so that thinning the samples never makes one snapshot younger. */
    long long dated_xid;
    double dated_since;
} XidDates;

/* Empties d: no samples, nothing dated. */
void xiddate_init(XidDates *d);

/* Notes that a look at time `now` saw `next_xid` (64 bits) as the next transaction id; a sample
 * only when it moved on since the last one. One below the last sample's is another server's (a
 * failover to a standby that lagged, a restore: one server's next id never goes back), whose
 * ids the samples never saw pass: they are dropped and dating starts over from this look.
 * Returns true then (the caller says so), false otherwise. */
bool xiddate_sample(XidDates *d, long long next_xid, double now);

/* How long before `now` the samples first saw a transaction id past `xid` (64 bits): a lower
 * bound (before the first sample nothing is known). 0 when none has yet. */
double xiddate_held(XidDates *d, long long xid, double now);

#endif
