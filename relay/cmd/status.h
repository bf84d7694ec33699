/* status: `outbox-relay status`, a one-shot look at the outbox and the relays working on it —
 * backlog, age of the oldest unsent event, dead-lettered events, throughput of the last minute
 * and the active relays (their member-slot advisory locks in pg_locks, with pid, lanes and client
 * address from pg_stat_activity when the role may see them). Blocking libpq, like admin. */
#ifndef OUTBOX_STATUS_H
#define OUTBOX_STATUS_H

#include <libpq-fe.h>

#include "config.h"
#include "strbuf.h"

/* Prints the status to stdout: a short report, or one JSON object with cfg->json. Returns the
 * exit status: 0, or 1 on a database error (logged). */
int status_run(const Config *cfg);

/* The backend pids of relays (SQL_RELAYS's second column) as an int[] literal into out, every one
 * of them, in their order: the list the application names and users are looked up by. */
void status_pid_array(const PGresult *relays, StrBuf *out);

#endif
