/* grants: what the least-privileged roles of migrations/0006 need on the outbox, given by
 * `migrate` on every run and checked by `check`.
 *
 * The grants used to live only in migrations 0006 and 0008, which run once: an owner without
 * CREATEROLE applied them with the roles missing, PostgreSQL only warned (into its own log), the
 * migrations were recorded as applied, and nothing ever granted them again. Now `migrate` runs
 * this step after the migrations each time (it is not recorded): it creates the roles when it
 * may, grants each privilege (GRANT is idempotent), then reads the privileges back, so creating
 * the roles and running `migrate` again is the whole remedy and no SQL file is needed. One list
 * below names each privilege once, with the test and the GRANT, for both commands. */
#ifndef OUTBOX_GRANTS_H
#define OUTBOX_GRANTS_H

#include <libpq-fe.h>
#include <stdbool.h>

#include "table.h"

/* What the relay needs beyond reading and marking rows, which decides the privileges checked. */
typedef struct GrantsUse {
    bool deletes;     /* --on-sent delete, --retention or purge-dead: DELETE on the table */
    bool claim_floor; /* --claim-floor on: SELECT on the order column's sequence */
} GrantsUse;

/* migrate's grants step, on conn (autocommit, as the owner) for map's table: creates the roles
 * outbox_relay and outbox_producer where missing when the session may, grants each what it needs,
 * and reads the privileges back. Logs every failure as one line saying what to create or grant
 * and how; returns true only when both roles exist and hold every privilege. Each statement is
 * given up when PostgreSQL has not answered it within answer_s seconds: false then, with
 * *conn_lost set (the connection is left mid-statement and must only be closed). */
bool grants_apply(PGconn *conn, const TableMap *map, long answer_s, bool *conn_lost)
    __attribute__((warn_unused_result));

/* migrate --dry-run's view of grants_apply, reading only: logs each role that is missing ("role
 * missing (dry run: ...)") and, for each role that exists, each privilege it lacks with the GRANT
 * a run would give ("grant pending (dry run: not given)"). Each of those the session's role could
 * not give (a role to create without CREATEROLE, a GRANT on an object it does not own and is not
 * a superuser for: the run fails on it) is logged as an error instead and counted in *refused.
 * map's table must exist (before the migrations have created it, what a run grants is all of
 * it). Returns how many it logged, or -1 when a read failed (logged), *conn_lost set when
 * PostgreSQL did not answer within answer_s. */
int grants_plan(PGconn *conn, const TableMap *map, long answer_s, bool *conn_lost, int *refused);

/* Calls fn for each privilege the session's own role lacks for use on map's table (the table must
 * exist), with a sentence naming it, the GRANT that gives it (to outbox_relay when the role is a
 * member of it, else to the role itself), whether `migrate` gives it to outbox_relay on every
 * run (all but DELETE, which it gives only with the role's first grants, and SELECT on pg_locks,
 * EXECUTE on the advisory lock functions and USAGE on plpgsql, PostgreSQL's own, which it
 * never grants), and
 * nonmember: NULL when
 * the role is outbox_relay or one of its members, else its name quoted as an identifier (what
 * migrate grants outbox_relay does not reach it; GRANT outbox_relay TO it would). Each statement is
 * bounded as admin_query bounds it (the session set up by admin_bound_session). Returns the number
 * of privileges missing, or -1 when the check itself failed (logged); *conn_lost is then true when
 * PostgreSQL did not answer in time, and the connection, left mid-statement, must only be
 * closed. */
typedef void (*GrantsMissingFn)(const char *what, const char *grant, bool migrate_grants,
                                const char *nonmember, void *arg);
int grants_check(PGconn *conn, const TableMap *map, GrantsUse use, GrantsMissingFn fn, void *arg,
                 bool *conn_lost);

#endif
