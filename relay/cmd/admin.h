/* admin: one-shot operator commands on the outbox — `dead` lists dead-lettered events, `requeue`
 * puts them back in line, `purge-dead` deletes them. Like migrate, they run outside the relay's
 * loop and use blocking libpq. */
#ifndef OUTBOX_ADMIN_H
#define OUTBOX_ADMIN_H

#include <libpq-fe.h>

#include "config.h"

/* Blocking helpers shared by the one-shot commands (admin, status). Connects with a one-line,
 * password-free error logged on failure; returns NULL then. */
PGconn *admin_connect(const char *conninfo);

/* Runs a statement template (relay/outbox/table.h) written for map's table with text params;
 * returns the result, or NULL (error logged, result cleared) when its status is not `expect`. */
PGresult *admin_exec(PGconn *conn, const TableMap *map, const char *tmpl, int nparams,
                     const char *const *params, ExecStatusType expect);

/* Prints the dead-lettered events (a table, or JSON lines with cfg->json) to stdout. Returns the
 * exit status: 0, or 1 on a database error (logged). */
int admin_dead(const Config *cfg);

/* Requeues the dead-lettered event cfg->id, or all of them with cfg->all: clears dead_at,
 * rejections and the retry time, keeps attempts and last_error as history. Prints how many were
 * requeued. Returns 0, 1 on a database error, or 1 when --id names no dead-lettered event. */
int admin_requeue(const Config *cfg);

/* Deletes the dead-lettered event cfg->id, or all of them with cfg->all (sent and waiting rows are
 * never touched). With --on-poison hold, the later events of a purged event's aggregate go on.
 * Prints how many were deleted. Returns 0, 1 on a database error, or 1 when --id names no
 * dead-lettered event. */
int admin_purge_dead(const Config *cfg);

#endif
