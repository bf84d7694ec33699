/* check: `outbox-relay check`, a dry run of `run` for an operator's first hour and for a
 * deployment pipeline. With the configuration `run` would take (main.c has already refused bad
 * input with exit 2), it connects to PostgreSQL and Kafka and checks what the relay needs there:
 * the outbox table and every column the relay reads or writes, the privileges of the session's
 * role (grants.h), and what the claim floor needs (diagnose.h: the order column's sequence and
 * the grant on it). One line per check on stdout ("ok" or "FAIL", a failure with the statement
 * that fixes it), then a summary. Blocking libpq, like the other one-shot commands. */
#ifndef OUTBOX_CHECK_H
#define OUTBOX_CHECK_H

#include <librdkafka/rdkafka.h>

#include "config.h"

/* Runs the checks for cfg; kconf is the producer configuration `run` would use (consumed, also
 * on failure). Returns 0 when every check passed, 1 when at least one found a problem (each
 * printed). Bounded: each connection attempt by connect_timeout, the brokers' answer by 10 s. */
int check_run(const Config *cfg, rd_kafka_conf_t *kconf);

#endif
