/* squatters: the two-look rule for the lane group's squatters (SQL_LANE_SQUATTERS).
 *
 * A session holding a member slot without lanes ("slot-without-lanes") can be a relay joining:
 * it holds its slot a moment before it takes its lanes. So such a row counts only when the look
 * before found the same session so too; every other row ("lanes-without-slot", "several-slots",
 * "stray-marks", "prepared-transaction": no relay holds those) counts at once. The relay's upkeep
 * looks every gauge interval and keeps the last look; `status` and `check` look twice,
 * ADMIN_SQUAT_RECHECK_MS apart, and only when the first look found such a row. One rule, one place:
 * both call this. */
#ifndef OUTBOX_SQUATTERS_H
#define OUTBOX_SQUATTERS_H

#include <libpq-fe.h>
#include <stdbool.h>

/* Slot holders without lanes remembered from one look, at most: a relay group has at most 1,024
 * member slots (LANE_MAX_MEMBERS), each such row holds one; more, whose slots lie outside the
 * group's, wait for a later look. */
#define SQUAT_SEEN_MAX 1024

/* The pids one look found holding a slot without lanes. Zeroed ({0}) it is a look that found
 * none, as before the first look. */
typedef struct {
    int pids[SQUAT_SEEN_MAX];
    int n;
} SquatSeen;

/* Whether row `row` of look (a SQL_LANE_SQUATTERS result: pid, what, ...) counts as a squatter
 * given before, the slot holders without lanes of the look before (NULL: there was none), and
 * records the row's pid into now when it is such a holder (now: this look's, zeroed by the caller
 * before its first row; past SQUAT_SEEN_MAX pids are not recorded, and such a holder counts only
 * once a look with room has). Pure: reads look and before, writes now only. */
bool squat_counts(const PGresult *look, int row, const SquatSeen *before, SquatSeen *now);

#endif
