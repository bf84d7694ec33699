/* metrics: the relay's counters, gauges and latency histogram, and their Prometheus text form.
 *
 * One registry per process, like the default registry of Prometheus client libraries: the relay
 * cycle counts what happens where it happens (a call each), the upkeep connection sets the
 * backlog gauges, and the HTTP endpoint renders everything on a scrape. All of it runs on the
 * loop thread; nothing here locks or allocates per event except the first time a topic is seen.
 *
 * Names are prefixed outbox_; see metrics.c (or GET /metrics) for each metric's HELP text. */
#ifndef OUTBOX_METRICS_H
#define OUTBOX_METRICS_H

#include <stdbool.h>

#include "batch.h"
#include "strbuf.h"

/* More distinct topics than this are counted under topic="_other" (a topic template with
 * {event_type} in it could otherwise grow the label set without bound). */
#define METRICS_MAX_TOPICS 1000

/* One database's registry when a process serves several (docs/operations.md#many-databases):
 * its samples carry database="NAME". Without any, the process's own registry is used, and its
 * samples carry no database label (one database: the output as it always was). */
typedef struct MetricsDb MetricsDb;

/* A registry for the database called name (copied); NULL when out of memory. It is rendered, in
 * the order made, until metrics_db_free. */
MetricsDb *metrics_db_new(const char *name);
/* Forgets db (a database removed by SIGHUP): its series leave /metrics. NULL is fine. */
void metrics_db_free(MetricsDb *db);
/* Where the counting functions below count from now on, on this thread: db, or NULL for the
 * process's own registry. Set as a database's work starts (relay_enter, upkeep). */
void metrics_select(MetricsDb *db);
/* The registry selected now (NULL: the process's own). */
MetricsDb *metrics_selected(void);

/* State read from the relay at scrape time. */
typedef struct MetricsLive {
    bool postgres_up;
    bool kafka_up;
    bool registry_up; /* the Schema Registry answers; true without one */
    int lanes_owned;
    int live_sessions; /* of all relays (lane group members) at the last rebalance, ours included */
    int claim_sessions; /* this relay's sessions that claim now (the rest rest: --min-sessions) */
    int held_aggregate_types; /* RelayStatus's: held out of the claims while Kafka refuses them */
    int kafka_away;           /* RelayStatus's: 0 none, 1 away, 2 trying (outbox_kafka_away) */
    bool ready;               /* /readyz's verdict (outbox_ready); per database with --databases
                               * (outbox_database_ready) */
} MetricsLive;

/* Forgets every value (unit tests). */
void metrics_reset(void);

/* An event was acknowledged by the broker: counts it under its topic and, when latency_s >= 0,
 * observes its latency. */
void metrics_event_published(const char *topic, double latency_s);

/* A delivery attempt failed; permanent = it would fail again (a rejection). */
void metrics_failure(bool permanent);
void metrics_dead_lettered(void);
void metrics_batch_committed(void);
void metrics_retention_deleted(long long rows);

/* The backlog as of the last refresh: unsent rows that are not dead-lettered, dead-lettered
 * rows, of those the ones whose copy to the dead-letter topic failed and waits for a retry
 * (BACKLOG_DEAD_LETTER_FAILED, statements.h), and the age in seconds of the oldest unsent row
 * (negative: there is none). */
void metrics_set_backlog(long long unsent, long long dead, long long dead_letter_failed,
                         double oldest_age_s);
/* How long the upkeep now waits between backlog counts, set after each count, failed ones
 * included (pace_backlog, upkeep.c): the refresh interval, or ten times the count's time when
 * that is longer. outbox_backlog_refresh_timestamp_seconds plus this is when the next refresh is
 * due, so an alert on the gauges' age follows a slow count's pace. */
void metrics_set_backlog_pace(double every_s);
/* How far retention is behind, as of the last backlog refresh with --retention on: the seconds
 * by which the oldest sent row is older than the retention (0: none is). known false (retention
 * turned off) stops exporting it. */
void metrics_set_retention_overdue(bool known, double overdue_s);
/* Sessions that are not relays holding the lane group's locks (upkeep.c). */
void metrics_set_lane_squatters(int sessions);

/* The oldest snapshot that holds back vacuum, as of the last refresh: how many transactions old
 * its xmin is, and for how many seconds its holder has been in its transaction (negative: not
 * known, e.g. a replication slot). Without one, xids = 0. */
void metrics_set_vacuum_horizon(long long xids, double held_s);

/* A claim's rows (or its error) arrived `seconds` after it was sent. */
void metrics_claim_done(double seconds);

/* The relay's hook for an acknowledged row of batch b (claimed at b->claimed_at, monotonic time):
 * counts event rows (dead-letter copies are not events published) under the topic the template
 * gives them, with latency = the row's age when claimed (database clock) + the time since the
 * claim (now - b->claimed_at, both monotime_now()). */
void metrics_row_acked(const Batch *b, const BatchRow *br, double now);

/* Appends the Prometheus text exposition (format 0.0.4) of every metric to out. */
void metrics_render(StrBuf *out, const MetricsLive *live);

/* metrics_render for several databases: every sample of dbs[i] (lives[i] its live state) carries
 * database="NAME"; each metric's HELP and TYPE come once; outbox_database_ready is added. */
void metrics_render_databases(StrBuf *out, MetricsDb *const *dbs, const MetricsLive *lives, int n);

#endif
