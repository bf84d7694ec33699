/* lanes: dividing the outbox among relays so that each aggregate has one publisher at a time.
 *
 * Every aggregate hashes into one of LANE_COUNT lanes (the generated column outbox.lane). A relay
 * claims rows only from lanes it owns, and owns a lane by holding a session-level advisory lock
 * on it, so ownership ends exactly when its PostgreSQL session does: a relay that dies or loses
 * its connection loses its lanes and its open claim at the same moment, and nobody else can take
 * a lane while its rows are still locked by the previous owner.
 *
 * Relays find each other through advisory locks too: each holds one "member slot" lock, and
 * pg_locks lists the live members. Lanes are assigned by rendezvous hashing over the member
 * slots, so when a relay joins or leaves only about 1/N of the lanes move. Rebalancing runs
 * between batches (never while rows are claimed): a lane is released only when this relay has
 * nothing of it in flight.
 *
 * A member whose relay cannot reach Kafka while others can (a gray failure: its link to the
 * brokers cut, its PostgreSQL link up) marks itself away with a lock beside its slot, and one
 * trying Kafka again after that marks itself trying: while some member is neither (healthy), the
 * lanes are divided among the healthy and trying members, the away ones get none; when none is
 * healthy (a Kafka outage for everyone) among all of them, so that nothing moves, and a trial
 * takes no lane from another member that cannot reach Kafka either. */
#ifndef OUTBOX_LANES_H
#define OUTBOX_LANES_H

#include <stdbool.h>
#include <stdint.h>

#include "pg.h"
#include "schema.h"
#include "strbuf.h"

/* Member slots 0..LANE_MAX_MEMBERS-1; more relays than this wait for a free slot. */
#define LANE_MAX_MEMBERS 1024

typedef struct Lanes Lanes;

/* What a member says of its relay's Kafka (SQL_LANES_MEMBERS' mark column). */
typedef enum {
    LANE_MARK_NONE = 0,   /* healthy */
    LANE_MARK_AWAY = 1,   /* cannot reach Kafka: gives its lanes to the healthy, if any */
    LANE_MARK_TRYING = 2, /* away before, trying again: its share while others are healthy */
} LaneMark;

/* Called when a rebalance or a leave finished. ok = false: a query failed (logged; its SQLSTATE
 * and message in error_state and error), so which locks the session holds is uncertain, and the
 * owner must reset the connection; a rebalance that could not get a member slot is ok, with no
 * lanes (the next one tries again). */
typedef void (*LanesDoneFn)(Lanes *lanes, bool ok, void *arg);

struct Lanes {
    int slot;          /* this relay's member slot, -1 when not (yet) a member */
    int live_sessions; /* live sessions (of all relays) seen at the last rebalance */
    /* Which members those were: a fingerprint of their slots (non-zero once a look was made, 0
     * before), so that a leave and a join between two looks are a change though the count is
     * the same. */
    uint64_t members;
    bool owned[LANE_COUNT]; /* lanes whose advisory lock this session holds */
    int n_owned;
    StrBuf owned_array;  /* owned lanes as an array literal, the claim's parameter */
    bool gained;         /* the last rebalance acquired at least one lane */
    LaneMark mark;       /* the mark lock this session holds (LANE_MARK_NONE: none) */
    bool no_slot_logged; /* "no free member slot" was said; said again only after a join */
    /* The mark whose refusal was said ("lane mark refused"), LANE_MARK_NONE when none: said
     * again only after the session held the mark it wanted, or wanted none. */
    LaneMark refused_said;
    /* The failed query's SQLSTATE ("" when none) and message, when done was called with ok
     * false: a role that may not read pg_locks, say, is the setup's fault, which no reconnect
     * cures (sqlstate.h). */
    char error_state[6];
    char error[256];
    /* in flight */
    LaneMark want_mark; /* the rebalance's mark, set before its look */
    char old_param[16], new_param[16];
    const char *old_params[1], *new_params[1];
    StrBuf lock_array, unlock_array;
    LanesDoneFn done;
    void *arg;
};

void lanes_init(Lanes *l);
void lanes_free(Lanes *l);

/* Forgets membership and ownership: the session that held them is gone. */
void lanes_reset(Lanes *l);

/* Joins (if needed), marks the member as mark says of its relay's Kafka, reads the live members,
 * and locks/unlocks lanes to match this relay's share. Uses pg (must be idle) for a few round
 * trips; calls done when finished. Returns false when pg was not idle (done is not called). */
bool lanes_rebalance(Lanes *l, PgConn *pg, LaneMark mark, LanesDoneFn done, void *arg);

/* Leaves the group: gives up every lane and the member slot, in one round trip on pg (must be
 * idle), then calls done; the session claims nothing until it rebalances (and so joins) again.
 * Returns false when pg was not idle (done is not called). A failed query calls done with ok
 * false: the owner resets the connection, which gives everything up too. With nothing to give up
 * (no slot, no lane), done is called before this returns: the driver asks to leave only with a
 * slot or lanes (next_step), so it never meets that nested call. */
bool lanes_leave(Lanes *l, PgConn *pg, LanesDoneFn done, void *arg);

/* Pure: which lanes the member `slot` should own when the live members are slots[0..n-1]. */
void lanes_assign(const int *slots, int n, int slot, bool out[LANE_COUNT]);

/* Pure: the members that share the lanes, of the live members slots[0..n-1] (marks[i]: member
 * i's): those not away when some member is healthy (LANE_MARK_NONE), else all n. Written to out
 * (room for n), in order; returns how many. */
int lanes_sharing(const int *slots, const LaneMark *marks, int n, int *out);

#endif
