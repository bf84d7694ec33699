/* floor: where a session's claims start in the unsent index; floor.h says why it is safe. */
#include "floor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void floor_reset(ClaimFloor *f)
{
    bool enabled = f->enabled, holding = f->holding;
    floor_free(f);
    *f = (ClaimFloor){.enabled = enabled, .holding = holding};
}

void floor_free(ClaimFloor *f)
{
    free(f->writers);
    f->writers = NULL;
}

const char *floor_param(ClaimFloor *f)
{
    if (!f->enabled || f->floor <= 0)
        snprintf(f->text, sizeof(f->text), "{0}");
    else
        snprintf(f->text, sizeof(f->text), "{%lld,%u,%u,%u,%lld}", f->floor, f->table_node,
                 f->seq_oid, f->seq_node, f->high - 1);
    return f->text;
}

const char *floor_hold_param(ClaimFloor *f)
{
    if (!f->holding || f->hold_from > f->floor) /* none recorded, or above the floor: not safe */
        snprintf(f->text, sizeof(f->text), "{0}");
    else {
        long long floor = f->floor;
        f->floor = f->hold_from;
        floor_param(f);
        f->floor = floor;
    }
    return f->text;
}

void floor_hold_begin(ClaimFloor *f)
{
    if (f->holding)
        return;
    f->holding = true;
    f->hold_from = f->floor;
}

void floor_hold_release(ClaimFloor *f, bool ended)
{
    if (!f->holding)
        return;
    if (f->hold_from < f->floor)
        f->floor = f->hold_from;
    f->on_commit = 0;
    if (ended)
        f->holding = false;
}

const char *floor_writers_param(const ClaimFloor *f)
{
    return f->candidate > 0 && f->writers ? f->writers : "{}";
}

static long long min_ll(long long a, long long b)
{
    return a < b ? a : b;
}

bool floor_after_claim(ClaimFloor *f, const FloorClaim *c)
{
    f->on_commit = 0;
    if (!f->enabled)
        return true;
    /* The sequence was given a cache (or a cycle) since the session checked it: values are no
     * longer drawn in the order of the inserts, so no floor is safe. Back to the table's start,
     * and off; the session's check, asked again (claim.c), decides again. */
    if (!c->seq_in_order) {
        floor_free(f);
        *f = (ClaimFloor){.enabled = false, .restarts = f->restarts, .holding = f->holding};
        return true;
    }
    /* The sequence was set back (TRUNCATE ... RESTART IDENTITY, ALTER SEQUENCE ... RESTART,
     * setval): rows drawn from then on may lie anywhere below the floor, with attempts 0, where
     * the claims read only failed rows. Start again from the table's start, as on a new
     * connection; the look after this one takes up a candidate again. A last value lower than
     * before shows a setval; a reset that one transaction's rows overtook before this look (the
     * last value already past the old one) shows only as a new relfilenode of the table or of
     * the sequence. 0 is no relfilenode to compare (the first look, a partitioned table). */
    long long now_high = c->seq_last >= 0 ? c->seq_last + 1 : 0;
    bool replaced = (f->table_node && c->table_node && f->table_node != c->table_node) ||
                    (f->seq_node && c->seq_node && f->seq_node != c->seq_node);
    if (replaced || now_high < f->high) {
        floor_free(f);
        *f = (ClaimFloor){.enabled = true,
                          .high = now_high,
                          .restarts = f->restarts + 1,
                          .holding = f->holding, /* hold_from 0: new rows may be anywhere */
                          .table_node = c->table_node,
                          .seq_node = c->seq_node,
                          .seq_oid = c->seq_oid};
        return true;
    }
    f->table_node = c->table_node;
    f->seq_node = c->seq_node;
    f->seq_oid = c->seq_oid;
    /* The claim's snapshot came after the look that confirmed f->confirmed, so it saw every row
     * below it that committed: it may rise there, short of the rows it left out. */
    if (c->plain && f->confirmed > 0) {
        long long to = f->confirmed;
        if (c->held >= 0)
            to = min_ll(to, c->held);
        if (c->rows > 0)
            to = min_ll(to, c->last_seq + 1);
        if (to > f->floor)
            f->on_commit = to;
    }
    if (c->seq_last >= 0 && c->seq_last + 1 > f->high)
        f->high = c->seq_last + 1;
    /* The look came after this claim: it confirms for the claims that follow. */
    if (f->candidate > 0 && c->writers_ended) {
        if (f->candidate > f->confirmed)
            f->confirmed = f->candidate;
        f->candidate = 0;
    }
    /* A new candidate only once the last one is confirmed: replacing it with every claim would
     * wait for ever newer writers and, under a steady stream, never confirm anything. */
    if (f->candidate == 0 && f->high > f->confirmed && c->writers) {
        char *copy = strdup(c->writers);
        if (!copy)
            return false;
        free(f->writers);
        f->writers = copy;
        f->candidate = f->high;
    }
    return true;
}

bool floor_commit(ClaimFloor *f)
{
    bool moved = f->on_commit > f->floor;
    if (moved)
        f->floor = f->on_commit;
    f->on_commit = 0;
    return moved;
}

void floor_abandon(ClaimFloor *f)
{
    f->on_commit = 0;
}
