/* databases: one process serving several databases (--databases;
 * docs/operations.md#many-databases).
 *
 * Each database is a pipeline of its own on the one loop: its relay (sessions, lanes, floor,
 * wakeup, byte budget and its own Kafka producer, so a delivery timeout or purge caused by its
 * messages cancels nothing of another's), its upkeep (connecting for each tick's work, so that an
 * idle database holds its claim session's connection alone) and its metrics registry; its log
 * lines carry database=NAME. A database that is down, locked or refused delays only itself.
 * SIGTERM/SIGINT drain them all (a second signal exits at once); SIGHUP starts the databases the
 * list gained and drains the ones it lost, leaving the others alone. */
#ifndef OUTBOX_DATABASES_H
#define OUTBOX_DATABASES_H

#include <ev.h>
#include <librdkafka/rdkafka.h>
#include <stdbool.h>

#include "config.h"
#include "metrics.h"
#include "relay.h"
#include "strbuf.h"

typedef struct Databases Databases;

/* What run refuses in one database's settings before anything connects: its connection string
 * (parsed, never echoed: it may hold a password), topic template against --order-scope,
 * dead-letter topic, and with a name (a --databases entry) --require-tls against its URL and
 * the brokers. Used at start for every entry and on SIGHUP for each entry added. Returns false
 * with one line in err (naming the entry when it has a name). */
bool databases_entry_check(const Config *cfg, char *err, size_t errlen);

/* Builds a relay and metrics registry for every entry of cfg->dbs (its upkeep, with gauges or
 * --retention, comes at databases_start), taking each entry's Config out of cfg (cfg->dbs is
 * left with zeroed entries) and a producer per database from kconf (a copy each; kconf stays the
 * caller's, kept for databases added later). Nothing connects before databases_start. Returns
 * NULL with one line in err. */
Databases *databases_new(struct ev_loop *loop, Config *cfg, const rd_kafka_conf_t *kconf,
                         bool gauges, char *err, size_t errlen);

/* The start-up check of the Schema Registry (relay_check_registry: credentials refused is an
 * error, a registry not answering a warning), made once: the registry's URLs and credentials are
 * the process's. Blocks up to --schema-registry-timeout: call before the loop runs (a database a
 * SIGHUP adds is not probed; its lookups log what fails). False with one line in err. */
bool databases_check_registries(Databases *d, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Makes every database's upkeep, connects its sessions and installs SIGTERM/SIGINT. */
void databases_start(Databases *d);

/* Runs the loop until every database has stopped; returns the exit status (1 when a database's
 * relay failed, which stops them all). */
int databases_run(Databases *d);

/* What a SIGHUP's fresh configuration may not bring to the running databases d, checked before
 * anything of it is applied (reload_config_then's check): an added entry whose name is still
 * draining from an earlier reload, an added entry naming the database (host, port, dbname) a
 * kept entry serves with its running URL, or more databases than CONFIG_MAX_DATABASES with the
 * draining ones (a stopped twin that stays stopped, databases_reload, is not added: none of
 * these). False with one line in err naming the entry; true when fresh has no list. */
bool databases_reload_check(const Databases *d, const Config *fresh, char *err, size_t errlen);

/* SIGHUP: fresh is the configuration just loaded, after databases_reload_check(d, fresh) and each
 * entry's databases_entry_check passed, in the same turn of the loop. Databases it names that are
 * not running start (but an entry stopped because it reaches another's database stays stopped
 * while fresh spells its URL as before and keeps that other one); running ones it no longer names
 * drain and go; the others take fresh's reloadable options (their URL and other options keep the
 * running values: a restart, or a remove and an add under another name, changes them). Logged by
 * name. */
void databases_reload(Databases *d, Config *fresh);

/* What /readyz, /metrics and systemd see. */
typedef struct DatabasesStatus {
    int total;       /* databases running (draining ones included) */
    int ready;       /* of those, ready: connected, claiming, Kafka reachable, no setup fault */
    bool stopping;   /* the process is shutting down */
    RelayStatus all; /* postgres_up, kafka_up: of any database (systemd's READY=1 waits for
                      * one connected database); lanes, sessions: the sums */
} DatabasesStatus;
void databases_status(const Databases *d, DatabasesStatus *out);

/* An SdStatusFn (sdnotify.h) for d: ready while any database is, STATUS= "ready: N of M
 * databases ready" (naming the first not ready). */
void databases_sd_status(const void *d, RelayStatus *st, char *status, size_t len);

/* Appends one line per database, "NAME ready" or "NAME not ready: REASONS", to body. */
void databases_readyz(const Databases *d, StrBuf *body);

/* Appends the Prometheus exposition of every database's metrics (database="NAME"), with
 * outbox_database_ready per database. */
void databases_metrics(const Databases *d, StrBuf *out);

/* Releases everything; after databases_run returned. NULL is fine. */
void databases_free(Databases *d);

#endif
