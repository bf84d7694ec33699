/* verify: after an incident, does Kafka hold what the outbox says was sent?
 *
 * `outbox-relay verify --since 1h` reads the rows marked sent in that window, reads their topics
 * back with a real consumer (from a little before the window by the messages' timestamps, or
 * from the beginning with --from-beginning, to the end of every partition as it was when verify
 * started), and checks:
 *   - every row has a message with its id header (else: missing);
 *   - the first copies of one aggregate's rows come in the rows' order, within a topic (with
 *     --order-scope partition, within a topic and partition) (else: out of order); with
 *     --after-replay, a row whose first copy is out of place but whose last copy comes in its
 *     place is judged by that copy and counted (judged_by_later_copy), as a replay of events
 *     Kafka still held leaves them (without it: out of order, since a real break whose events
 *     were sent again leaves the same topic);
 * and counts the duplicates (later copies: at-least-once) and the messages whose id no row of
 * the table has (unknown). Messages of rows outside the window are neither. One summary line on
 * stdout (or one JSON object with --json), each problem on its own line on stderr (the first 20
 * of each kind). Rows deleted since they were sent (--on-sent delete, --retention) cannot be
 * checked: verify sees only the rows that are still there. */
#ifndef OUTBOX_VERIFY_H
#define OUTBOX_VERIFY_H

#include <librdkafka/rdkafka.h>

#include "config.h"

/* Exit status of a check that proves nothing either way: rows are missing, but some partitions
 * could not be positioned by time (a broker that cannot look offsets up by timestamp answers "the
 * end"), so their messages were not read; --from-beginning reads them whole. */
#define VERIFY_INCONCLUSIVE 3

/* The consumer's configuration: verify's own settings, --brokers, then the --kafka properties.
 * NULL with one line in err when librdkafka refuses one (an unknown property, a bad value; a
 * secret's value is never shown), or a TLS file is a FIFO, a device or a socket
 * (kafka_conf_files_ok): bad input, exit 2, as run refuses it. */
rd_kafka_conf_t *verify_kafka_conf(const Config *cfg, char *err, size_t errlen);

/* Runs the check with conf (from verify_kafka_conf; taken, whatever happens). Returns 0 when every
 * row was found in order, 1 when something is missing or out of order (or PostgreSQL or Kafka could
 * not be read: logged), VERIFY_INCONCLUSIVE when rows are missing but partitions could not be
 * positioned by time (nothing out of order), 2 on bad input. Blocks; every wait is bounded (a
 * statement waits for a lock at most 10 s, the consumer stops after 30 s without progress). */
int verify_run(const Config *cfg, rd_kafka_conf_t *conf);

#endif
