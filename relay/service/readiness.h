/* readiness: whether one relay can do its work, and why not — the one judgement /readyz
 * (ops.c), systemd's STATUS= (sdnotify.h, through ops_sd_status) and each database of a list
 * (databases.c) answer with, so the three cannot disagree. */
#ifndef OUTBOX_READINESS_H
#define OUTBOX_READINESS_H

#include <stdbool.h>

#include "relay.h"
#include "strbuf.h"

/* True when st says the relay can work: PostgreSQL and Kafka reachable, not away from Kafka
 * (delivery timeouts in a row: kafka_away 1; trying again is ready), the Schema Registry
 * available, not stopping, no setup fault, and no session that is not a relay holding the lane
 * group's locks (lane_squatters, upkeep_lane_squatters). When false and why is not NULL, appends
 * each reason as " reason;" (one line: a setup fault's text is escaped as a log value is, and
 * scrubbed of registered secrets, secrets.h). */
bool readiness_judge(const RelayStatus *st, int lane_squatters, StrBuf *why);

#endif
