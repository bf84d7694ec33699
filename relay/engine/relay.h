/* relay: the claim -> produce -> acknowledge -> mark -> commit cycle, on one libev loop.
 *
 * Each cycle opens a transaction, claims up to batch_size unsent rows of its lanes in id order
 * (FOR UPDATE), produces each to Kafka, waits for every delivery report, then in one
 * round trip sets sent_at on the acknowledged rows, counts an attempt and records the error on
 * the failed ones, and commits. A row is never marked before the broker acknowledged it; a crash
 * or lost connection before the commit rolls the claim back and the rows are sent again later
 * (at least once; consumers dedupe on the `id` header).
 *
 * A relay runs --sessions such cycles side by side, each on its own PostgreSQL connection and
 * each a member of the lane group (lanes.h) like a relay of its own, sharing one producer: while
 * one session waits for Kafka, another claims or marks. The engine's modules and who does what:
 * engine.h. */
#ifndef OUTBOX_RELAY_H
#define OUTBOX_RELAY_H

#include <ev.h>
#include <librdkafka/rdkafka.h>
#include <stdbool.h>

#include "config.h"
#include "metrics.h"

typedef struct Relay Relay;

/* Creates the relay and its producer (taking ownership of kconf); PostgreSQL is connected by
 * relay_run. cfg must have passed config_load and kconf kafka_conf_build: every failure left is
 * a runtime one (out of memory, no descriptor or thread for the producer, libcurl), returned as
 * NULL with one line in err, and main exits 1 on it, never 2 (bad input). cfg must outlive the
 * relay. */
Relay *relay_new(struct ev_loop *loop, const Config *cfg, rd_kafka_conf_t *kconf, char *err,
                 size_t errlen);

/* ---- several databases in one process (docs/operations.md#many-databases) ----
 * Each database has a relay of its own (its sessions, lanes, floor, wakeup, byte budget and
 * producer) on the one loop; these let something above start, watch and stop them one by one. */

/* Called once every session of r has stopped (the relay is done: relay_finish, then relay_free,
 * outside the callback that called it). */
typedef void (*RelayStoppedFn)(Relay *r, void *arg);

/* Instead of ending the loop when r has stopped, calls fn(r, arg). Set before relay_start. */
void relay_set_stopped_hook(Relay *r, RelayStoppedFn fn, void *arg);
/* Gives r's log lines the context fields ("database=NAME", copied; NULL: none) and its counts
 * the metrics registry m (NULL: the process's own). Set before relay_start. */
void relay_set_database(Relay *r, const char *log_context, MetricsDb *m);
/* Makes r's log context and metrics registry the current ones (log_set_context,
 * metrics_select): called as r's work starts on the loop (session_step, its timers). */
void relay_enter(const Relay *r);
/* Connects r's sessions; the cycle runs on the loop. */
void relay_start(Relay *r);
/* Stops r as SIGTERM would: every session finishes its batch (within --shutdown-timeout) and
 * gives its lanes back; then the stopped hook is called. */
void relay_drain(Relay *r);
/* Logs r's totals ("stopped") and returns its exit status: after it has stopped. */
int relay_finish(Relay *r);
/* Like relay_new, without signal handlers: whoever runs several relays handles the signals and
 * calls relay_drain on each. */
Relay *relay_new_quiet(struct ev_loop *loop, const Config *cfg, rd_kafka_conf_t *kconf, char *err,
                       size_t errlen);

/* Connects and runs the loop until SIGTERM/SIGINT and a clean shutdown. Returns the process exit
 * status. A second signal during shutdown exits the process at once (the open transaction rolls
 * back). */
int relay_run(Relay *r);

/* What the relay's state looks like right now, for the metrics and health endpoints. */
typedef struct RelayStatus {
    bool postgres_up; /* the relay's own connection */
    bool kafka_up;    /* see kafka_up() */
    bool registry_up; /* the Schema Registry answers (true without --value-format avro/json-schema)
                       */
    bool stopping;    /* shutting down after SIGTERM/SIGINT */
    int lanes_owned;
    int live_sessions; /* of all relays (lane group members) at the last rebalance, ours included */
    int claim_sessions; /* this relay's sessions connected, in the lane group and claiming now */
    /* Aggregate types this relay's sessions hold out of their claims because Kafka refuses their
     * topic for a fault of the setup (TopicHold, engine.h), each counted once however many
     * sessions hold it: their events wait while the others go. */
    int held_aggregate_types;
    /* What the relay says of its Kafka to the lane group (relay_lane_mark, LaneMark of lanes.h):
     * 0 none, 1 away (delivery timeouts in a row: its lanes go to the relays that reach Kafka, if
     * any), 2 trying (its share taken back on a trial, until an acknowledgement or a timeout). */
    int kafka_away;
    /* A session's claims or marks fail for a reason of the setup (privileges, a missing table or
     * column: sqlstate.h): it holds no lanes, so the relay is not ready. The first such error,
     * "" when none. */
    char setup_error[200];
} RelayStatus;

void relay_status(const Relay *r, RelayStatus *out);

/* Releases everything; call after relay_run returned. Messages still in the producer get up to
 * 1 s to be acknowledged (relay_free_within: flush_ms), then are purged: their rows stay unsent
 * and are sent again. A producer with nothing left is destroyed off the loop
 * (kafka_producer_retire; the process waits for it with kafka_retired_wait before it exits). */
void relay_free(Relay *r);
void relay_free_within(Relay *r, int flush_ms);

/* With --value-format avro or json-schema: the Schema Registry's start-up check (it blocks up to
 * --schema-registry-timeout: call it before relay_run). False with one line in err when the
 * registry refuses the credentials or its TLS certificate; true otherwise (also without a
 * registry, and when it does not answer: rows wait for it). */
bool relay_check_registry(Relay *r, char *err, size_t errlen) __attribute__((warn_unused_result));

/* After relay_check_registry on from: to's registry, not probed (another database of a
 * --databases list, or one a SIGHUP adds, from a running or draining database's), starts as
 * from's stands (serializer_take_probe). Returns whether it did: false, with nothing done, when
 * either has no registry or their registries' URLs differ. */
bool relay_take_registry_probe(Relay *to, const Relay *from);

/* False while the Schema Registry the values need is down (for /readyz and the metric). */
bool relay_registry_up(const Relay *r);

#endif
