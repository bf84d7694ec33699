/* replay: put events that were sent back in line, to be published again
 * (docs/operations.md#replay).
 *
 * `verify` finds events marked sent whose messages Kafka no longer has (a topic deleted and
 * recreated, an unclean leader election, retention shorter than a consumer's outage). `replay`
 * selects sent events — by id range, by the time they were marked sent, by aggregate, by event
 * type, or the list `verify --json` reported missing (--missing FILE, - for stdin) — and makes
 * each one unsent again as a fresh event: it gets a new order value from the sequence ({seq} =
 * DEFAULT, migrations/0009_hardening.sql says why that keeps the claim floor safe), attempts 0 and
 * no retry time. The relays then claim it above their floors, from the unsent index, at the rate
 * of new events, and no failure is counted against it. Hand-made replays (`UPDATE ... SET
 * sent_at = NULL`) keep their order value and still go through 0008's trigger.
 *
 * Consumers see each replayed event again as a later copy: after every event that was in the
 * outbox when it was replayed, its aggregate's included, with the same id header (event_id).
 * Replayed events keep their order among themselves (new values are drawn in old order).
 *
 * It runs in bounded transactions (--batch-rows each, rows locked FOR UPDATE only while their
 * transaction runs), beside running relays and producers. */
#ifndef OUTBOX_REPLAY_H
#define OUTBOX_REPLAY_H

#include "config.h"

/* Selections larger than this need a confirmation on the terminal, or --yes. */
#define REPLAY_CONFIRM_ROWS 10000

/* Runs the replay cfg describes (cfg->replay_*). Prints what it selected (--dry-run: and stops),
 * for a run of several batches the bounds of the rest before the first (stderr: they survive a
 * kill), progress on a terminal (stderr), and one final line on stdout. SIGINT, SIGTERM and
 * SIGHUP stop it after the batch under way (a second one at once). Returns 0 when done (or nothing
 * matched), 1 on a database error (logged; the batches committed before it stay replayed, a
 * second run picks up the rest) or when the confirmation is refused, 2 on bad input (an
 * unreadable --missing file, a timestamp PostgreSQL cannot read, --sent-after not before
 * --sent-before, a large selection without --yes and no terminal to confirm it). Blocks; each
 * statement waits for a lock (a row, the table) at most 10 s (lock_timeout), then fails as a
 * database error. */
int replay_run(const Config *cfg);

#endif
