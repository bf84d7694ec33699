/* ops: the operations side of `run`, beside the relay cycle on the same loop — the metrics and
 * health endpoints (--metrics-listen), the upkeep connection (backlog gauges, --retention) and
 * configuration reload on SIGHUP. */
#ifndef OUTBOX_OPS_H
#define OUTBOX_OPS_H

#include <ev.h>

#include "config.h"
#include "databases.h"
#include "relay.h"

typedef struct Ops Ops;

/* Binds the metrics address (if any), before anything else starts, so that a taken port is the
 * only thing reported. cfg is the running configuration: SIGHUP updates its reloadable options
 * in place (re-reading argv, the environment and the config file); one that comes once a shutdown
 * has begun is refused with one line ("reload ignored: shutting down"). Returns NULL with one line
 * in err when the address cannot be bound. */
Ops *ops_new(struct ev_loop *loop, Config *cfg, int argc, char **argv, char *err, size_t errlen);

/* Starts the rest for relay: the upkeep connection and the SIGHUP handler. Requests are answered
 * once the loop runs. */
void ops_start(Ops *ops, Relay *relay);

/* ops_start for several databases (--databases): /metrics, /readyz and SIGHUP cover them all;
 * each database has its own upkeep (databases.h), so none is started here. /readyz answers 200
 * while at least one database is ready, with a line per database
 * (docs/operations.md#many-databases). */
void ops_start_databases(Ops *ops, Databases *dbs);

/* What systemd's STATUS= says of the relay ops_start was given (an SdStatusFn: arg is the Ops):
 * the verdict and reasons /readyz gives (readiness.h), with the lanes and sessions when ready. */
void ops_sd_status(const void *arg, RelayStatus *st, char *status, size_t len);

/* Stops everything; call before relay_free. SIGHUP is ignored from then on: the loop is over, and
 * nothing is left to reload. NULL is fine. */
void ops_free(Ops *ops);

#endif
