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

typedef struct Relay Relay;

/* Creates the relay and its producer (taking ownership of kconf); PostgreSQL is connected by
 * relay_run. Returns NULL with one line in err when the producer cannot be
 * created from the configuration. cfg must outlive the relay. */
Relay *relay_new(struct ev_loop *loop, const Config *cfg, rd_kafka_conf_t *kconf, char *err,
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
    /* A session's claims or marks fail for a reason of the setup (privileges, a missing table or
     * column: sqlstate.h): it holds no lanes, so the relay is not ready. The first such error,
     * "" when none. */
    char setup_error[200];
} RelayStatus;

void relay_status(const Relay *r, RelayStatus *out);

/* Releases everything; call after relay_run returned. */
void relay_free(Relay *r);

/* With --value-format avro or json-schema: the Schema Registry's start-up check (it blocks up to
 * --schema-registry-timeout: call it before relay_run). False with one line in err when the
 * registry refuses the credentials or its TLS certificate; true otherwise (also without a
 * registry, and when it does not answer: rows wait for it). */
bool relay_check_registry(Relay *r, char *err, size_t errlen) __attribute__((warn_unused_result));

/* False while the Schema Registry the values need is down (for /readyz and the metric). */
bool relay_registry_up(const Relay *r);

#endif
