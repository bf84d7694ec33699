/* pg_plan: how a connection string is tried — the hosts of its host list, one after the other
 * (libpq's multi-host form, for failover), and the parameters every attempt passes to
 * PQconnectStartParams: the string's own, without host, hostaddr and port (which come from the
 * host being tried, in a string of the attempt's own with the dbname and the empty settings:
 * db_host_conninfo), plus the relay's keepalive defaults for what neither the string nor its
 * service file sets. */
#ifndef OUTBOX_PG_PLAN_H
#define OUTBOX_PG_PLAN_H

#include <libpq-fe.h>
#include <stdbool.h>

#include "db.h"

/* A connection attempt to one host that has not completed after this long (when neither the URL,
 * its service nor PGCONNECT_TIMEOUT sets a positive connect_timeout) moves on to the next host:
 * libpq enforces connect_timeout only in blocking mode, so a black-holed host would otherwise stall
 * the attempt until TCP gives up (minutes). */
#define PG_PLAN_CONNECT_TIMEOUT_S 10.0

/* One host of the connection string, tried in turn. */
typedef struct PgTarget {
    DbHost addr;
    char *shown;      /* "host:port" for the logs */
    char *last_error; /* the failure last logged for this host, until it connects (pg.c's) */
} PgTarget;

typedef struct PgPlan {
    const char **keys, **values; /* for PQconnectStartParams; host entries filled per attempt */
    int nparams, expand_dbname;
    PQconninfoOption *parsed; /* owns the strings in values */
    char keepalive_values[5][16];
    char *options; /* the user's options (the string's, its service's or PGOPTIONS) plus the
                    * pinned search_path (db.h), or NULL */
    PgTarget *targets;
    int ntargets;
    double connect_timeout_s; /* per host: the string's connect_timeout, else its service's, else
                               * PGCONNECT_TIMEOUT's (0 or less: the default); at least 2 s */
    char app_name[64];        /* fallback_application_name, when given */
} PgPlan;

/* Fills plan (zeroed) from conninfo, which must outlive it. The keepalives and tcp_user_timeout
 * are derived from session_timeout_ms, so that a dead server or network is noticed within it;
 * the options carry the search_path pinned by db_pin_search_path (db.h), if any; app (NULL: none,
 * copied, cut at 63 bytes) is the fallback_application_name, which an application_name or
 * fallback_application_name in conninfo overrides.
 * Returns false only when out of memory; an unparsable string is left for libpq to report at
 * every attempt. pg_plan_free releases the plan either way. */
bool pg_plan_make(PgPlan *plan, const char *conninfo, long session_timeout_ms, const char *app)
    __attribute__((warn_unused_result));

/* Pure: libpq's error text msg, for a connection given host's addresses as hostaddr, with host
 * put back where libpq names the server as it does when it looked the name up itself:
 * `connection to server at "ADDR", port` becomes `connection to server at "HOST" (ADDR), port`,
 * each time. Written into out (cut to outlen); returns out. */
const char *pg_error_name_host(const char *msg, const char *host, char *out, size_t outlen);

/* Releases what pg_plan_make allocated and zeroes plan. */
void pg_plan_free(PgPlan *plan);

#endif
