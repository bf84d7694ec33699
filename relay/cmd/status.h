/* status: `outbox-relay status`, a one-shot look at the outbox and the relays working on it —
 * backlog, age of the oldest unsent event, dead-lettered events, throughput of the last minute
 * and the active relays (their member-slot advisory locks in pg_locks, with pid, lanes and client
 * address from pg_stat_activity when the role may see them). Blocking libpq, like admin. */
#ifndef OUTBOX_STATUS_H
#define OUTBOX_STATUS_H

#include "config.h"

/* Prints the status to stdout: a short report, or one JSON object with cfg->json. Returns the
 * exit status: 0, or 1 on a database error (logged). */
int status_run(const Config *cfg);

#endif
