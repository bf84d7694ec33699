/* upkeep: periodic database work beside the relay — refreshing the backlog gauges every 5 s and
 * deleting sent rows older than --retention — on a second non-blocking PostgreSQL connection.
 *
 * Why a connection of its own: the relay's connection claims again straight after each batch
 * while there is work, so queries interleaved on it would delay claims exactly when the relay is
 * busiest, and anything sent on it must never end up inside a claim transaction. A second
 * session keeps both apart at the cost of one more server connection (only while the metrics
 * endpoint or retention is on; for a database of a list, only for the moment of each tick's work:
 * upkeep_new_on_demand). Every statement runs in its own short transaction: retention
 * deletes at most RETENTION_BATCH rows per statement, one statement after another until a sweep
 * finds no more, each in sent_at order from where the last ended (so a sweep reads each row about
 * once), and never waits on another relay's sweep (SKIP LOCKED). */
#ifndef OUTBOX_UPKEEP_H
#define OUTBOX_UPKEEP_H

#include <ev.h>
#include <stdbool.h>

#include "config.h"

#define UPKEEP_GAUGE_INTERVAL_S 5.0
/* The gauges' interval of an upkeep on demand (upkeep_new_on_demand): each refresh costs a
 * connection start on the server, so it comes as often as a usual Prometheus scrape, no more. */
#define UPKEEP_ON_DEMAND_GAUGE_INTERVAL_S 15.0
#define RETENTION_BATCH 1000
#define UPKEEP_SQUATTERS_MAX 64 /* sessions named at one look, at most */

typedef struct Upkeep Upkeep;

/* Starts what cfg asks for: the backlog gauges when `gauges`, retention when cfg->retention_s >
 * 0; connects only when either is on. cfg must outlive the upkeep; its database URL is copied.
 * Its log lines and gauges go to the log context and metrics registry current now (a process
 * serving several databases makes the database's current first). */
Upkeep *upkeep_new(struct ev_loop *loop, const Config *cfg, bool gauges);

/* Like upkeep_new, for one database of several (databases.c): the connection is opened when a
 * gauge refresh or retention batch is due and closed as soon as none is (a sweep keeps it until
 * it finds no more), so an idle database holds none between ticks; the gauges refresh every
 * UPKEEP_ON_DEMAND_GAUGE_INTERVAL_S, and a retention sweep comes on the same tick once
 * upkeep_retention_interval has passed (so at most that often; one connection does both). The
 * ticks of the upkeeps made one after another are spread over the interval. Same ownership and
 * errors as upkeep_new. */
Upkeep *upkeep_new_on_demand(struct ev_loop *loop, const Config *cfg, bool gauges);

/* Picks up a changed cfg->retention_s (after SIGHUP): starts, stops or re-times retention, and
 * opens or closes the connection as needed. */
void upkeep_reconfigure(Upkeep *u);

void upkeep_free(Upkeep *u);

/* Sessions that are not relays holding the lane group's locks, as of the gauges' last look
 * (upkeep.c, SQL_LANE_SQUATTERS, every gauge interval); 0 for NULL, while the gauges are off, and
 * when no look has answered for three intervals and a statement timeout (not known). */
int upkeep_lane_squatters(const Upkeep *u);

/* Seconds between retention sweeps for a retention of retention_s: a quarter of it, within
 * 1-60 s, so rows go at most about 25 % (and a minute) past their time. */
double upkeep_retention_interval(long retention_s);

#endif
