#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <strings.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "db.h"
#include "kafka_guard.h"
#include "log.h"
#include "optval.h"
#include "opts.h"
#include "secrets.h"
#include "strbuf.h"

#define FIELD(f) offsetof(Config, f)

/* The commands that use an option (OptDef.commands; 0: all), for `outbox-relay COMMAND --help`
 * and the man page. Every command still accepts every option (commands_shown below): scripts,
 * environments and tests pass one set to several commands. check uses what run uses, since it
 * checks run's configuration. */
#define FOR(c) (1u << (c))
#define RUN_LIKE (FOR(CMD_RUN) | FOR(CMD_CHECK))
#define KAFKA_USERS (RUN_LIKE | FOR(CMD_VERIFY))

/* Choice fields are stored as int; the enums behind them must be int-sized. */
_Static_assert(sizeof(PoisonPolicy) == sizeof(int), "PoisonPolicy stored as int");
_Static_assert(sizeof(TableLayout) == sizeof(int), "TableLayout stored as int");
_Static_assert(sizeof(OnSent) == sizeof(int), "OnSent stored as int");
_Static_assert(sizeof(OrderScope) == sizeof(int), "OrderScope stored as int");
_Static_assert(sizeof(MessageFormat) == sizeof(int), "MessageFormat stored as int");
_Static_assert(sizeof(LogFormat) == sizeof(int), "LogFormat stored as int");

static const char *const poison_policies[] = {"hold", "skip", NULL};
static const char *const on_sent_actions[] = {"mark", "delete", NULL}; /* in OnSent order */
static const char *const off_on[] = {"off", "on", NULL};
static const char *const layouts[] = {"relay", "debezium", NULL}; /* in TableLayout order */
static const char *const message_formats[] = {"relay", "cloudevents", NULL}; /* MessageFormat */
static const char *const order_scopes[] = {"aggregate", "topic", "partition",
                                           NULL};                      /* in OrderScope order */
static const char *const payload_formats[] = {"text", "binary", NULL}; /* false, true */
static const char *const value_formats[] = {"json", "avro", "json-schema", NULL}; /* ValueFormat */
static const char *const subject_strategies[] = {"topic", "record", "topic-record",
                                                 NULL}; /* in SubjectStrategy order */
_Static_assert(sizeof(ValueFormat) == sizeof(int), "ValueFormat stored as int");
_Static_assert(sizeof(SubjectStrategy) == sizeof(int), "SubjectStrategy stored as int");
static const char *const log_formats[] = {"text", "json", NULL}; /* in LogFormat order */

static const OptDef options[] = {
    {.name = "database-url",
     .type = OPT_STRING,
     .env = "DATABASE_URL",
     .offset = FIELD(database_url),
     .metavar = "URL",
     .help = "PostgreSQL connection string (URL or key=value form); required"},
    {.name = "database-url-file",
     .type = OPT_STRING,
     .env = "DATABASE_URL_FILE",
     .offset = FIELD(database_url_file),
     .metavar = "PATH",
     .help =
         "read the database URL from this file instead (its content, trailing newline removed)"},
    {.name = "brokers",
     .type = OPT_STRING,
     .env = "KAFKA_BROKERS",
     .offset = FIELD(brokers),
     .commands = KAFKA_USERS,
     .metavar = "LIST",
     .help = "Kafka bootstrap servers, host:port[,host:port...]; required by run"},
    {.name = "config",
     .type = OPT_STRING,
     .offset = FIELD(config_file),
     .metavar = "FILE",
     .help =
         "JSON config file: an object whose keys are these option names; a key starting with # is "
         "ignored (a comment)"},
    {.name = "batch-bytes",
     .type = OPT_INT,
     .def = "8388608",
     .min = 65536,
     .max = 1073741824,
     .offset = FIELD(batch_bytes),
     .commands = RUN_LIKE,
     .metavar = "BYTES",
     .help = "payload bytes one claim may hold (a larger row still goes alone); bounds memory",
     .reloadable = true},
    {.name = "batch-size",
     .type = OPT_INT,
     .def = "800",
     .min = 1,
     .max = 100000,
     .offset = FIELD(batch_size),
     .commands = RUN_LIKE,
     .metavar = "N",
     .help = "rows claimed per transaction (1-100000)",
     .reloadable = true},
    {.name = "sessions",
     .type = OPT_INT,
     .def = "2",
     .min = 1,
     .max = 8,
     .offset = FIELD(sessions),
     .commands = RUN_LIKE,
     .metavar = "N",
     .help = "claim sessions (PostgreSQL connections) per relay, at most: one claims while another "
             "waits for Kafka"},
    {.name = "min-sessions",
     .type = OPT_INT,
     .def = "1",
     .min = 1,
     .max = 8,
     .offset = FIELD(min_sessions),
     .commands = RUN_LIKE,
     .metavar = "N",
     .help = "claim sessions that always take part; the others (up to --sessions) join when ten "
             "claims in a row come back full (a backlog) and rest after --session-rest-after "
             "without one"},
    {.name = "session-rest-after",
     .type = OPT_INT,
     .def = "30000",
     .min = 1000,
     .max = 3600000,
     .offset = FIELD(session_rest_after_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "how long without a full claim (and with none of its batches still out) before the "
             "sessions above --min-sessions give their lanes back (1000-3600000)"},
    {.name = "topic-template",
     .type = OPT_STRING,
     .def = "outbox.event.{aggregate_type}",
     .offset = FIELD(topic_template),
     .commands = KAFKA_USERS | FOR(CMD_REPLAY),
     .metavar = "TEMPLATE",
     .help = "Kafka topic per row; {aggregate_type} (or ${routedByValue}) and {event_type} are "
             "replaced [Debezium: route.topic.replacement]"},
    {.name = "schema",
     .type = OPT_STRING,
     .def = "public",
     .offset = FIELD(schema),
     .metavar = "NAME",
     .help = "schema of the relay's functions and bookkeeping (and of --table without one); every "
             "connection pins search_path to pg_catalog, NAME, pg_temp"},
    {.name = "table",
     .type = OPT_STRING,
     .def = "outbox",
     .offset = FIELD(table),
     .metavar = "[SCHEMA.]NAME",
     .help =
         "the outbox table; another than the relay's own needs `migrate` with the same options"},
    {.name = "layout",
     .type = OPT_CHOICE,
     .def = "relay",
     .offset = FIELD(layout),
     .metavar = "LAYOUT",
     .help =
         "default column names: relay (id, event_id, aggregate_type, aggregate_id, event_type, "
         "payload, headers) or debezium (seq, id, aggregatetype, aggregateid, type, payload; keys "
         "placed by murmur2 as Debezium's Java producer does, unless --kafka names a "
         "partitioner)",
     .choices = layouts},
    {.name = "seq-column",
     .type = OPT_STRING,
     .offset = FIELD(seq_column),
     .metavar = "COLUMN",
     .help = "bigint column giving the order events go out in (migrate adds it when missing)"},
    {.name = "event-id-column",
     .type = OPT_STRING,
     .offset = FIELD(event_id_column),
     .metavar = "COLUMN",
     .help = "unique event id, sent as header id [Debezium: table.field.event.id]"},
    {.name = "aggregate-type-column",
     .type = OPT_STRING,
     .offset = FIELD(aggregate_type_column),
     .metavar = "COLUMN",
     .help = "routes the event to its topic [Debezium: route.by.field]"},
    {.name = "aggregate-id-column",
     .type = OPT_STRING,
     .offset = FIELD(aggregate_id_column),
     .metavar = "COLUMN",
     .help = "the message key [Debezium: table.field.event.key]"},
    {.name = "event-type-column",
     .type = OPT_STRING,
     .offset = FIELD(event_type_column),
     .metavar = "COLUMN",
     .help = "the event type, for {event_type} [Debezium: table.field.event.type]"},
    {.name = "payload-column",
     .type = OPT_STRING,
     .offset = FIELD(payload_column),
     .metavar = "COLUMN",
     .help = "the message value: jsonb, json or text [Debezium: table.field.event.payload]"},
    {.name = "headers-column",
     .type = OPT_STRING,
     .offset = FIELD(headers_column),
     .metavar = "COLUMN",
     .help = "jsonb object of extra headers per row, or none (default: headers; debezium: none)"},
    {.name = "additional-fields",
     .type = OPT_STRING,
     .offset = FIELD(additional_fields),
     .metavar = "COL:PLACEMENT[:NAME],...",
     .help = "columns placed in the message too: COL:header[:NAME] a header, COL:envelope[:NAME] a "
             "field of the value beside payload, COL:partition the partition (needs --order-scope "
             "partition) [Debezium: table.fields.additional.placement]"},
    {.name = "timestamp-column",
     .type = OPT_STRING,
     .offset = FIELD(timestamp_column),
     .metavar = "COLUMN",
     .help = "timestamp or timestamptz column giving the message's timestamp (default: the time "
             "it is produced) [Debezium: table.field.event.timestamp]"},
    {.name = "payload-format",
     .type = OPT_CHOICE,
     .def = "text",
     .offset = FIELD(payload_binary),
     .metavar = "FORMAT",
     .help = "text: the payload column's text form (jsonb, json, text); binary: a bytea column, "
             "published byte for byte",
     .choices = payload_formats},
    {.name = "tombstone-on-empty-payload",
     .type = OPT_BOOL,
     .offset = FIELD(tombstone_on_empty_payload),
     .metavar = "",
     .help = "a NULL or blank (white space only) payload goes out as a tombstone, a null value, "
             "also with envelope fields (default: only a NULL payload without envelope fields is "
             "one) [Debezium: route.tombstone.on.empty.payload]"},
    {.name = "kafka",
     .type = OPT_LIST,
     .offset = FIELD(kafka),
     .commands = KAFKA_USERS,
     .metavar = "KEY=VALUE",
     .help = "librdkafka producer property, repeatable (in a config file: an object)"},
    {.name = "kafka-file",
     .type = OPT_STRING,
     .offset = FIELD(kafka_file),
     .commands = KAFKA_USERS,
     .metavar = "PATH",
     .help =
         "librdkafka properties from a file, KEY=VALUE per line, # comments (e.g. SASL secrets)"},
    {.name = "kafka-allow-unsafe",
     .type = OPT_STRING,
     .offset = FIELD(kafka_allow_unsafe),
     .commands = KAFKA_USERS,
     .metavar = "NAME,...",
     .help =
         "allow these librdkafka properties that load code, run commands or write files (refused "
         "otherwise); a flag only, never from the config file"},
    {.name = "require-tls",
     .type = OPT_BOOL,
     .offset = FIELD(require_tls),
     .commands = RUN_LIKE,
     .metavar = "",
     .help =
         "run: refuse to start when a PostgreSQL host or Kafka broker other than loopback would be "
         "reached without a verified TLS connection (default: a warning)"},
    {.name = "log-level",
     .type = OPT_LOG_LEVEL,
     .def = "info",
     .offset = FIELD(log_level),
     .metavar = "LEVEL",
     .help = "debug, info, warn or error",
     .reloadable = true},
    {.name = "log-format",
     .type = OPT_CHOICE,
     .def = "text",
     .offset = FIELD(log_format),
     .metavar = "FORMAT",
     .help = "text: one logfmt line per event (time level=... msg=\"...\" key=value ...); json: "
             "one JSON object per line with the same keys (ts, level, msg, then the fields)",
     .choices = log_formats},
    {.name = "poll-interval",
     .type = OPT_INT,
     .def = "1000",
     .min = 1,
     .max = 3600000,
     .offset = FIELD(poll_interval_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "fallback poll when no wakeup arrives, in milliseconds"},
    {.name = "delivery-timeout",
     .type = OPT_INT,
     .def = "30000",
     .min = 100,
     .max = 3600000,
     .offset = FIELD(delivery_timeout_ms),
     .commands = KAFKA_USERS,
     .metavar = "MS",
     .help =
         "how long a batch waits for acknowledgements before cancelling the rest (retried later)",
     .reloadable = true},
    {.name = "session-timeout",
     .type = OPT_INT,
     .def = "15000",
     .min = 1000,
     .max = 3600000,
     .offset = FIELD(session_timeout_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "a relay that stops talking (frozen, cut off) loses its PostgreSQL session and lanes "
             "within this; also the deadline of every round trip to PostgreSQL. Lower: faster "
             "takeover; a statement slower than this is given up and retried"},
    {.name = "shutdown-timeout",
     .type = OPT_INT,
     .def = "10000",
     .max = 3600000,
     .offset = FIELD(shutdown_timeout_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "on SIGTERM/SIGINT, how long to wait for in-flight acknowledgements",
     .reloadable = true},
    {.name = "busy-poll-interval",
     .type = OPT_INT,
     .def = "2",
     .min = 1,
     .max = 1000,
     .offset = FIELD(busy_poll_interval_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "how often an awake session with no rows claims again (for --sleep-after, and "
             "while producers are mid-transaction until the wakeup's waiter waits for them)",
     .reloadable = true},
    {.name = "sleep-after",
     .type = OPT_INT,
     .def = "50",
     .max = 60000,
     .offset = FIELD(sleep_after_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "stay awake polling this long after the last row before sleeping (waiting for NOTIFY)",
     .reloadable = true},
    {.name = "rebalance-interval",
     .type = OPT_INT,
     .def = "1000",
     .min = 100,
     .max = 60000,
     .offset = FIELD(rebalance_interval_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "how often lanes are re-divided among the running relays"},
    {.name = "kafka-away-after",
     .type = OPT_INT,
     .def = "2",
     .max = 1000,
     .offset = FIELD(kafka_away_after),
     .commands = RUN_LIKE,
     .metavar = "N",
     .help = "delivery timeouts in a row with nothing acknowledged after which the relay gives "
             "its lanes to the relays that reach Kafka (kept when none does); 0: never"},
    {.name = "max-attempts",
     .type = OPT_INT,
     .def = "10",
     .min = 1,
     .max = 1000,
     .offset = FIELD(max_attempts),
     .commands = RUN_LIKE,
     .metavar = "N",
     .help = "permanent failures (rejections) of one event before it is dead-lettered",
     .reloadable = true},
    {.name = "retry-backoff",
     .type = OPT_INT,
     .def = "5000",
     .min = 10,
     .max = 3600000,
     .offset = FIELD(retry_backoff_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "first wait before retrying a rejected event; doubles per rejection",
     .reloadable = true},
    {.name = "retry-backoff-max",
     .type = OPT_INT,
     .def = "600000",
     .min = 10,
     .max = 86400000,
     .offset = FIELD(retry_backoff_max_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "cap on the wait between retries of one event",
     .reloadable = true},
    {.name = "on-poison",
     .type = OPT_CHOICE,
     .def = "hold",
     .offset = FIELD(on_poison),
     .commands = RUN_LIKE,
     .metavar = "POLICY",
     .help =
         "hold: later events of a dead-lettered event's aggregate wait for it; skip: they go on",
     .choices = poison_policies},
    {.name = "on-sent",
     .type = OPT_CHOICE,
     .def = "mark",
     .offset = FIELD(on_sent),
     .commands = RUN_LIKE | FOR(CMD_STATUS),
     .metavar = "ACTION",
     .help = "a delivered row: mark sets its sent_at (kept until --retention); delete removes it",
     .choices = on_sent_actions},
    {.name = "claim-floor",
     .type = OPT_CHOICE,
     .def = "on",
     .offset = FIELD(claim_floor),
     .commands = RUN_LIKE,
     .metavar = "on|off",
     .help =
         "on: claims start after the rows already sent, so dead row versions an old snapshot keeps "
         "cost nothing; off: from the start of the unsent index",
     .choices = off_on},
    {.name = "order-scope",
     .type = OPT_CHOICE,
     .def = "aggregate",
     .offset = FIELD(order_scope),
     .commands = KAFKA_USERS | FOR(CMD_REPLAY),
     .metavar = "SCOPE",
     .help =
         "aggregate: all of an aggregate's events stay in order, so the topic template may not use "
         "{event_type}; topic: order holds per aggregate within each topic only; partition: within "
         "each topic and partition only (needed by a partition column)",
     .choices = order_scopes},
    {.name = "message-format",
     .type = OPT_CHOICE,
     .def = "relay",
     .offset = FIELD(message_format),
     .metavar = "FORMAT",
     .help =
         "relay: headers id, event_type, aggregate_type; cloudevents: also the CloudEvents Kafka "
         "binding's ce_ attributes, so CloudEvents SDKs read the messages as events",
     .choices = message_formats},
    {.name = "value-format",
     .type = OPT_CHOICE,
     .def = "json",
     .offset = FIELD(value_format),
     .commands = RUN_LIKE,
     .metavar = "FORMAT",
     .help = "json: the payload as it is; avro or json-schema: encoded by the schema the Schema "
             "Registry holds for the message's subject, in Confluent's wire format",
     .choices = value_formats},
    {.name = "schema-registry-url",
     .type = OPT_STRING,
     .env = "SCHEMA_REGISTRY_URL",
     .offset = FIELD(schema_registry_url),
     .commands = RUN_LIKE,
     .metavar = "URL[,URL...]",
     .help = "Schema Registry base URL(s), at most 8, tried in turn; required by --value-format "
             "avro or json-schema"},
    {.name = "schema-registry-auth-file",
     .type = OPT_STRING,
     .offset = FIELD(schema_registry_auth_file),
     .commands = RUN_LIKE,
     .metavar = "PATH",
     .help = "basic-auth credentials for the registry, USER:PASSWORD on one line (a secret: "
             "never logged)"},
    {.name = "schema-registry-ca-file",
     .type = OPT_STRING,
     .offset = FIELD(schema_registry_ca_file),
     .commands = RUN_LIKE,
     .metavar = "PATH",
     .help = "PEM CA bundle (read into memory, at most 8 MiB) that verifies an https registry "
             "(default: the system's)"},
    {.name = "schema-registry-timeout",
     .type = OPT_INT,
     .def = "5000",
     .min = 100,
     .max = 600000,
     .offset = FIELD(schema_registry_timeout_ms),
     .commands = RUN_LIKE,
     .metavar = "MS",
     .help = "bound on each registry request, connection included"},
    {.name = "schema-registry-lookup-rate",
     .type = OPT_INT,
     .def = "20",
     .min = 1,
     .max = 10000,
     .offset = FIELD(schema_registry_lookup_rate),
     .commands = RUN_LIKE,
     .metavar = "N",
     .help = "registry requests a second for subjects without a schema at hand (new ones, and "
             "those it lacked, asked again after 5 s), up to 5 s of them (5 x N) at once; beyond "
             "it their rows wait, so rows naming many unknown subjects cannot flood the registry"},
    {.name = "schema-version",
     .type = OPT_INT,
     .def = "0",
     .min = 0,
     .max = INT32_MAX,
     .offset = FIELD(schema_version),
     .commands = RUN_LIKE,
     .metavar = "N",
     .help = "the subject's schema version to encode with; 0: the latest (fetched once, as "
             "Confluent's use.latest.version)"},
    {.name = "subject-name-strategy",
     .type = OPT_CHOICE,
     .def = "topic",
     .offset = FIELD(subject_name_strategy),
     .commands = RUN_LIKE,
     .metavar = "STRATEGY",
     .help =
         "topic: subject <topic>-value; record: <event type>; topic-record: <topic>-<event type>",
     .choices = subject_strategies},
    {.name = "ce-source",
     .type = OPT_STRING,
     .def = "outbox-relay",
     .offset = FIELD(ce_source),
     .commands = RUN_LIKE,
     .metavar = "URI",
     .help = "with --message-format cloudevents: the events' source attribute"},
    {.name = "ce-content-type",
     .type = OPT_STRING,
     .offset = FIELD(ce_content_type),
     .commands = RUN_LIKE,
     .metavar = "TYPE",
     .help = "with --message-format cloudevents: the payloads' media type (content-type header; "
             "default: application/avro with --value-format avro, application/octet-stream with "
             "--payload-format binary, else application/json)"},
    {.name = "dead-letter-topic",
     .type = OPT_STRING,
     .offset = FIELD(dead_letter_topic),
     .commands = RUN_LIKE,
     .metavar = "TOPIC",
     .help = "also publish dead-lettered events here, with the error in headers (default: none)"},
    {.name = "metrics-listen",
     .type = OPT_STRING,
     .offset = FIELD(metrics_listen),
     .commands = RUN_LIKE,
     .metavar = "HOST:PORT",
     .help =
         "serve /metrics, /healthz and /readyz over HTTP here, e.g. 127.0.0.1:9187 (default: off)"},
    {.name = "retention",
     .type = OPT_DURATION,
     .def = "off",
     .offset = FIELD(retention_s),
     .commands = RUN_LIKE,
     .metavar = "DURATION",
     .help = "delete sent rows older than this, e.g. 72h, 30m, 90s; 0 or off keeps them forever",
     .reloadable = true},
    {.name = "horizon-warn",
     .type = OPT_DURATION,
     .def = "5m",
     .offset = FIELD(horizon_warn_s),
     .commands = RUN_LIKE,
     .metavar = "DURATION",
     .help =
         "with --metrics-listen: log when one snapshot has held back vacuum this long; 0 or off: "
         "never",
     .reloadable = true},
    {.name = "connect-wait",
     .type = OPT_DURATION,
     .def = "off",
     .offset = FIELD(connect_wait_s),
     .commands = FOR(CMD_MIGRATE),
     .metavar = "DURATION",
     .help =
         "migrate: retry connecting to PostgreSQL for up to this long (e.g. 60s; for a database "
         "that is still starting); 0 or off: try once"},
    {.name = "migrate-timeout",
     .type = OPT_DURATION,
     .def = "10m",
     .min = 1, /* 0 or off would wait for ever on a server that stopped answering */
     .offset = FIELD(migrate_timeout_s),
     .commands = FOR(CMD_MIGRATE),
     .metavar = "DURATION",
     .help = "migrate: give up when PostgreSQL has not answered one statement (a migration's DDL, "
             "the lock of a concurrent migrate) within this long"},
    {.name = "allow-newer-schema",
     .type = OPT_BOOL,
     .offset = FIELD(allow_newer_schema),
     .commands = FOR(CMD_MIGRATE) | FOR(CMD_CHECK),
     .metavar = "",
     .help = "migrate, check: a database a newer outbox-relay migrated is a warning, not refused "
             "(a rollback to this version: migrate applies nothing, gives no grant, exits 0); a "
             "flag only, never from the config file"},
    {.name = "statement-timeout",
     .type = OPT_DURATION,
     .def = "30s",
     .min = 1, /* 0 or off would wait for ever on a lock or a server that stopped answering */
     .max = CONFIG_STATEMENT_TIMEOUT_MAX_S, /* longer than a day is a typo of its unit */
     .offset = FIELD(statement_timeout_s),
     .commands = FOR(CMD_DEAD) | FOR(CMD_REQUEUE) | FOR(CMD_PURGE_DEAD) | FOR(CMD_STATUS) |
                 FOR(CMD_CHECK) | FOR(CMD_VERIFY) | FOR(CMD_REPLAY),
     .metavar = "DURATION",
     .help = "dead, requeue, purge-dead, status, check: PostgreSQL ends a statement running this "
             "long (statement_timeout; a stricter one of the URL, role or database stays), and the "
             "command gives up on one not answered a few seconds later (exit 1); verify, replay: "
             "give up on a statement not answered within this long plus what its work adds "
             "(outbox-relay(1)); check, verify: give up on Kafka when it has not answered a "
             "request (or verify has had no message) within this long (exit 1). 1s to 24h: raise "
             "it for a large verify or replay on a slow server"},
    /* An outbox id may be 0 or negative: the relay sends and dead-letters those too. */
    {.name = "id",
     .type = OPT_INT,
     .min = LONG_MIN,
     .max = LONG_MAX,
     .offset = FIELD(id),
     .commands = FOR(CMD_REQUEUE) | FOR(CMD_PURGE_DEAD),
     .metavar = "ID",
     .help = "requeue, purge-dead: the outbox id of one dead-lettered event"},
    {.name = "all",
     .type = OPT_BOOL,
     .offset = FIELD(all),
     .commands = FOR(CMD_REQUEUE) | FOR(CMD_PURGE_DEAD),
     .metavar = "",
     .help = "requeue, purge-dead: every dead-lettered event"},
    {.name = "json",
     .type = OPT_BOOL,
     .offset = FIELD(json),
     .commands = FOR(CMD_DEAD) | FOR(CMD_STATUS) | FOR(CMD_VERIFY),
     .metavar = "",
     .help = "dead, status, verify: print JSON"},
    {.name = "since",
     .type = OPT_DURATION,
     .def = "1h",
     .min = 1, /* 0 or off would check nothing and say ok */
     .offset = FIELD(verify_since_s),
     .commands = FOR(CMD_VERIFY),
     .metavar = "DURATION",
     .help = "verify: check the rows marked sent this far back, e.g. 15m, 2h"},
    {.name = "from-beginning",
     .type = OPT_BOOL,
     .offset = FIELD(verify_from_beginning),
     .commands = FOR(CMD_VERIFY),
     .metavar = "",
     .help = "verify: read the topics from their first message, not from the window's start time"},
    {.name = "after-replay",
     .type = OPT_BOOL,
     .offset = FIELD(verify_after_replay),
     .commands = FOR(CMD_VERIFY),
     .metavar = "",
     .help = "verify: judge a row whose first copy is out of order by a later copy in its place, "
             "as a replay of events Kafka still held leaves (an order break whose events were "
             "sent again passes too)"},
    {.name = "max-rows",
     .type = OPT_INT,
     .def = "2000000",
     .min = 1,
     .max = 1000000000,
     .offset = FIELD(verify_max_rows),
     .commands = FOR(CMD_VERIFY),
     .metavar = "N",
     .help = "verify: refuse a window of more rows than this (each held in memory, about 230 "
             "bytes at peak); narrow --since or raise it"},
    {.name = "from-id",
     .type = OPT_INT,
     .min = LONG_MIN,
     .max = LONG_MAX,
     .offset = FIELD(replay_from_id),
     .commands = FOR(CMD_REPLAY),
     .metavar = "ID",
     .help = "replay: sent events from this outbox id on"},
    {.name = "to-id",
     .type = OPT_INT,
     .min = LONG_MIN,
     .max = LONG_MAX,
     .offset = FIELD(replay_to_id),
     .commands = FOR(CMD_REPLAY),
     .metavar = "ID",
     .help = "replay: sent events up to this outbox id (inclusive)"},
    {.name = "sent-after",
     .type = OPT_STRING,
     .offset = FIELD(replay_sent_after),
     .commands = FOR(CMD_REPLAY),
     .metavar = "TIME",
     .help = "replay: events marked sent at or after this time (a PostgreSQL timestamptz, e.g. "
             "'2026-11-26 10:00+00'): the time their messages went to Kafka"},
    {.name = "sent-before",
     .type = OPT_STRING,
     .offset = FIELD(replay_sent_before),
     .commands = FOR(CMD_REPLAY),
     .metavar = "TIME",
     .help = "replay: events marked sent before this time"},
    {.name = "aggregate-type",
     .type = OPT_STRING,
     .offset = FIELD(replay_aggregate_type),
     .commands = FOR(CMD_REPLAY),
     .metavar = "TYPE",
     .help = "replay: events of this aggregate type only"},
    {.name = "aggregate-id",
     .type = OPT_STRING,
     .offset = FIELD(replay_aggregate_id),
     .commands = FOR(CMD_REPLAY),
     .metavar = "ID",
     .help = "replay: events of this aggregate id only"},
    {.name = "event-type",
     .type = OPT_STRING,
     .offset = FIELD(replay_event_type),
     .commands = FOR(CMD_REPLAY),
     .metavar = "TYPE",
     .help = "replay: events of this event type only"},
    {.name = "missing",
     .type = OPT_STRING,
     .offset = FIELD(replay_missing),
     .commands = FOR(CMD_REPLAY),
     .metavar = "FILE",
     .help = "replay: the events `verify --json` reported missing, read from FILE (- for stdin)"},
    {.name = "dry-run",
     .type = OPT_BOOL,
     .offset = FIELD(dry_run),
     .commands = FOR(CMD_REPLAY) | FOR(CMD_MIGRATE),
     .metavar = "",
     .help = "replay: say how many events and which topics, change nothing; migrate: list the "
             "migrations it would apply (or the adoption), change nothing; a flag only, never from "
             "the config file"},
    {.name = "yes",
     .type = OPT_BOOL,
     .offset = FIELD(yes),
     .commands = FOR(CMD_REPLAY) | FOR(CMD_PURGE_DEAD),
     .metavar = "",
     .help = "replay: no confirmation for a large selection (needed without a terminal); "
             "purge-dead --all: no confirmation on a terminal (none is asked without one)"},
    {.name = "batch-rows",
     .type = OPT_INT,
     .def = "10000",
     .min = 1,
     .max = 100000,
     .offset = FIELD(replay_batch_rows),
     .commands = FOR(CMD_REPLAY),
     .metavar = "N",
     .help = "replay: events per transaction"},
    /* ---- many databases (docs/operations.md#many-databases) ---- */
    {.name = "databases",
     .type = OPT_STRING,
     .offset = FIELD(databases),
     .metavar = "JSON",
     .help = "serve several databases in one process: a JSON array (in a config file: the array "
             "itself) of objects, each with a name, database-url or database-url-file, and the "
             "per-database options it changes (table, layout and columns, topic-template, "
             "on-sent, retention, sessions ...); instead of --database-url",
     .reloadable = true},
    {.name = "database",
     .type = OPT_STRING,
     .offset = FIELD(database),
     .metavar = "NAME",
     .help = "with --databases: the one database a command other than run (migrate, status, "
             "verify, dead, requeue, purge-dead, replay, check) works on; run serves them all"},
};

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* Debezium's Outbox Event Router option names, accepted for the options they mean (as flags
 * and config file keys), so a connector's settings carry over. */
static const OptAlias aliases[] = {
    {"table.field.event.id", "event-id-column"},
    {"table.field.event.key", "aggregate-id-column"},
    {"table.field.event.type", "event-type-column"},
    {"table.field.event.payload", "payload-column"},
    {"route.by.field", "aggregate-type-column"},
    {"route.topic.replacement", "topic-template"},
    {"table.fields.additional.placement", "additional-fields"},
    {"table.field.event.timestamp", "timestamp-column"},
    {"route.tombstone.on.empty.payload", "tombstone-on-empty-payload"},
};

/* How an OptSource is said in an error. */
static const char *const source_names[] = {"nowhere", "default", "the config file",
                                           "the environment", "flags"};

static const CmdDef commands[] = {
    {"run", CMD_RUN, "relay unsent outbox rows to Kafka until SIGTERM or SIGINT"},
    {"migrate", CMD_MIGRATE, "apply the embedded schema migrations, then exit"},
    {"dead", CMD_DEAD, "list dead-lettered events with their errors (--json for scripts)"},
    {"requeue", CMD_REQUEUE, "put dead-lettered events back in line (--id ID or --all)"},
    {"purge-dead", CMD_PURGE_DEAD, "delete dead-lettered events for good (--id ID or --all)"},
    {"status", CMD_STATUS, "backlog, oldest unsent event, dead events, throughput, active relays"},
    {"verify", CMD_VERIFY,
     "read the topics back and check them against the outbox (--since); exit 0 all found in "
     "order, 1 missing or out of order, 3 inconclusive (partitions not positioned by time: use "
     "--from-beginning)"},
    {"replay", CMD_REPLAY,
     "put sent events back in line to be published again, as fresh events (no attempt counted): "
     "select them by id, time sent, aggregate, event type or verify's --json list (--missing); "
     "--dry-run shows what it would do"},
    {"check", CMD_CHECK,
     "check the configuration, PostgreSQL (table, columns, privileges, claim floor) and Kafka as "
     "run would need them; exit 0 good, 1 problems found, 2 bad configuration"},
    {"help", CMD_HELP, "show this help (also --help, -h)"},
    {"version", CMD_VERSION, "show the version (also --version)"},
};

/* Inserts prop at position at of list (the list takes both strings). */
static void kafka_insert_into(OptList *list, size_t at, OptPair prop)
{
    if (!prop.key || !prop.value) {
        perror("outbox-relay");
        exit(1);
    }
    OptPair *grown = realloc(list->items, (list->len + 1) * sizeof(*grown));
    if (!grown) {
        perror("outbox-relay");
        exit(1);
    }
    list->items = grown;
    memmove(grown + at + 1, grown + at, (list->len - at) * sizeof(*grown));
    grown[at] = prop;
    list->len++;
}

/* Inserts prop at position at of the --kafka list (the list takes both strings). */
static void kafka_insert(Config *cfg, size_t at, OptPair prop)
{
    kafka_insert_into(&cfg->kafka, at, prop);
}

/* A JSON scalar as the text a flag would carry; NULL for objects, arrays and null. */
static char *json_scalar_text(json_t *v)
{
    char buf[64];
    if (json_is_string(v))
        return strdup(json_string_value(v));
    if (json_is_integer(v)) {
        snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return strdup(buf);
    }
    if (json_is_real(v)) {
        snprintf(buf, sizeof(buf), "%.17g", json_real_value(v));
        return strdup(buf);
    }
    if (json_is_boolean(v))
        return strdup(json_is_true(v) ? "true" : "false");
    return NULL;
}

/* The text of a config file's (or a --databases entry's) value for opt: a JSON true or false
 * only for a switch ("table": true would name a table "true"); NULL for what opt cannot take. */
static char *scalar_for(const OptDef *opt, json_t *v)
{
    return json_is_boolean(v) && opt->type != OPT_BOOL ? NULL : json_scalar_text(v);
}

/* What scalar_for takes for opt, for the error. */
static const char *scalar_expected(const OptDef *opt)
{
    return opt->type == OPT_BOOL ? "true or false"
                                 : "a string or a number (true and false are for switches)";
}

static const OptSpec spec;

/* Where the option NAME (of the spec) got its value, from the sources config_load_once keeps. */
static OptSource source_of(const OptSource *sources, const char *name)
{
    return sources[opts_find(&spec, name, strlen(name)) - options];
}

/* ---- many databases -------------------------------------------------------------------------
 * An entry of --databases is an object: "name", the URL ("database-url" or "database-url-file")
 * and any of these options, which then hold for that database alone. The others are the
 * process's: Kafka (one cluster, its properties), the endpoints, logging, the search_path pin
 * (--schema: every connection of the process, db.h) and the session timeout (pg.h). */
static const char *const database_keys[] = {"database-url",
                                            "database-url-file",
                                            "table",
                                            "layout",
                                            "seq-column",
                                            "event-id-column",
                                            "aggregate-type-column",
                                            "aggregate-id-column",
                                            "event-type-column",
                                            "payload-column",
                                            "headers-column",
                                            "additional-fields",
                                            "topic-template",
                                            "on-sent",
                                            "retention",
                                            "sessions",
                                            "min-sessions",
                                            "session-rest-after",
                                            "batch-size",
                                            "batch-bytes",
                                            "dead-letter-topic",
                                            "on-poison",
                                            "max-attempts",
                                            "retry-backoff",
                                            "retry-backoff-max",
                                            "message-format",
                                            "ce-source",
                                            "ce-content-type",
                                            "order-scope",
                                            "claim-floor",
                                            "poll-interval",
                                            "busy-poll-interval",
                                            "sleep-after",
                                            "rebalance-interval",
                                            "delivery-timeout",
                                            "horizon-warn",
                                            "timestamp-column",
                                            "payload-format",
                                            "tombstone-on-empty-payload",
                                            "value-format",
                                            "subject-name-strategy",
                                            "schema-version",
                                            NULL};

/* Records that key set opt in one source (where: a config file, or an entry of --databases); a
 * second key for the same option there, an alias beside the option's own name, is refused rather
 * than letting whichever comes last win. spelled: one slot per option. */
static bool set_once(const char **spelled, const OptDef *opt, const char *key, const char *where,
                     char *err, size_t errlen)
{
    size_t i = (size_t)(opt - options);
    if (spelled[i])
        return optval_fail(err, errlen, "%s: keys \"%s\" and \"%s\" both set %s: keep one of them",
                           where, spelled[i], key, opt->name);
    spelled[i] = key;
    return true;
}

static bool database_key(const char *key)
{
    for (size_t i = 0; database_keys[i]; i++)
        if (strcmp(database_keys[i], key) == 0)
            return true;
    return false;
}

/* A copy of from's option values (strings and lists duplicated), without its databases. */
static void config_copy(Config *to, const Config *from)
{
    memcpy(to, from, sizeof(*to));
    memset(&to->map, 0, sizeof(to->map));
    to->databases = to->database = to->database_name = NULL;
    to->dbs = NULL;
    to->n_dbs = 0;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        void *field = (char *)to + options[i].offset;
        if (options[i].type == OPT_STRING) {
            char **slot = field;
            if (*slot && !(*slot = strdup(*slot))) {
                perror("outbox-relay");
                exit(1);
            }
        } else if (options[i].type == OPT_LIST) {
            OptList *list = field, copy = {NULL, 0};
            for (size_t j = 0; j < list->len; j++)
                kafka_insert_into(
                    &copy, copy.len,
                    (OptPair){strdup(list->items[j].key), strdup(list->items[j].value)});
            *list = copy;
        }
    }
    if (from->kafka_file_entries) {
        size_t size = from->kafka_file_entries * sizeof(*to->kafka_file_lines);
        if (!(to->kafka_file_lines = malloc(size))) {
            perror("outbox-relay");
            exit(1);
        }
        memcpy(to->kafka_file_lines, from->kafka_file_lines, size);
    }
}

/* A database name: what goes into log lines, metric labels and status output unquoted. */
static bool database_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
              name[i] == '_' || name[i] == '-'))
            return false;
    return true;
}

static bool read_database_url_file(Config *cfg, char *err, size_t errlen);
static bool config_map_init(Config *cfg, char *err, size_t errlen);
static char *read_text_file(const char *option, const char *path, char *err, size_t errlen);

/* Set while config_load_reload reads the configuration, on the event loop: a FIFO's open waits
 * for a writer and a device's read may never end, which would freeze every database. One loop
 * thread loads configurations, never two at once. */
static bool regular_files_only;

/* Opens the file an option names for reading (optval_open_file): at a reload only a regular
 * file, without waiting; at start-up anything readable but a directory. */
static int open_input(const char *option, const char *path, char *err, size_t errlen)
{
    return optval_open_file(option, path, regular_files_only, err, errlen);
}

/* The registry's files, read as the registry reads them (relay/io/registry.c) but with the rest
 * of the configuration, so that run and check refuse an unreadable or malformed one alike, as bad
 * input (exit 2): check used to report it as a problem found (exit 1). The password is never
 * shown, and its copy is cleared. */
static bool registry_files_check(const Config *cfg, char *err, size_t errlen)
{
    const char *auth = cfg->schema_registry_auth_file, *ca = cfg->schema_registry_ca_file;
    /* A pipe (--schema-registry-auth-file <(...)) can be read once: the registry's read at
     * start-up is the one that counts, and says what is wrong with it; at a reload open_input
     * refuses it. A device (/dev/null) reads alike twice: checked here, as bad input (exit 2,
     * and check says it), not left to the relay's start (exit 1). */
    struct stat st;
    bool pipe_at_start = auth && !regular_files_only && stat(auth, &st) == 0 &&
                         (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
    if (auth && !pipe_at_start) {
        char *text = read_text_file("schema-registry-auth-file", auth, err, errlen);
        if (!text)
            return false;
        size_t line = strcspn(text, "\r\n");
        const char *colon = memchr(text, ':', line);
        bool ok = colon && colon != text && line < CONFIG_AUTH_LINE_MAX - 1;
        explicit_bzero(text, strlen(text));
        free(text);
        if (!ok)
            return optval_fail(err, errlen,
                               "schema-registry-auth-file %s: expected USER:PASSWORD on one line "
                               "of at most %d bytes",
                               auth, CONFIG_AUTH_LINE_MAX - 2);
    }
    /* The bundle, read whole by the registry: readable, not a directory, at most its bound (a pipe
     * is the registry's to measure as it reads). */
    int fd = ca ? open_input("schema-registry-ca-file", ca, err, errlen) : -2;
    if (fd < 0)
        return fd != -1;
    struct stat ca_st;
    bool too_large = fstat(fd, &ca_st) == 0 && S_ISREG(ca_st.st_mode) &&
                     (uintmax_t)ca_st.st_size > CONFIG_CA_FILE_MAX;
    close(fd);
    if (too_large)
        return optval_fail(err, errlen, "schema-registry-ca-file %s: larger than %s", ca,
                           CONFIG_CA_FILE_MAX_TEXT);
    return true;
}

/* The list is split at every ',' (curl's URLs hold none unencoded), so a ',' in a URL's user
 * info ("http://reg:pa,ss@h") cuts the password in two: "http://reg:pa", whose "pa" reads as a
 * port, and "ss@h", a URL with a user name and no password, and neither piece is masked where
 * the URL is shown nor registered as a secret. Refused, naming the URL by its place, not its
 * text: a URL of a list that is followed by another and has a port that is not a number, and a
 * URL after the first that holds user info but no scheme (a list's URLs with user info take
 * their scheme, so that no cut password reads as one). Also refused, by place: a URL holding a
 * blank. */
static bool registry_urls_commas(const char *urls, char *err, size_t errlen)
{
    int place = 0;
    for (const char *p = urls; p && *p;) {
        p += strspn(p, ", ");
        size_t len = strcspn(p, ",");
        if (len == 0)
            continue;
        place++;
        /* registry_new keeps a URL's text after its leading spaces as it is, and curl refuses a
         * URL holding a blank ("URL using bad/illegal format"): every lookup through it would
         * fail, the relay running with rows waiting behind a warning. */
        for (size_t i = 0; i < len; i++)
            if (isspace((unsigned char)p[i]))
                return optval_fail(err, errlen,
                                   "schema-registry-url: URL %d of the list holds a blank, which "
                                   "curl refuses in a URL: separate the URLs with ',' (spaces "
                                   "after it are fine) and write a blank in a URL as %%20",
                                   place);
        const char *end = p + len, *scheme = memmem(p, len, "://", 3);
        const char *auth = scheme ? scheme + 3 : p;
        const char *auth_end = auth + strcspn(auth, "/?#,");
        bool user_info = memchr(auth, '@', (size_t)(auth_end - auth)) != NULL;
        if (user_info && !scheme && place > 1)
            return optval_fail(err, errlen,
                               "schema-registry-url: URL %d of the list holds user info ('@') "
                               "and no scheme (not shown: it may hold a password): the list is "
                               "split at every ',', so write a ',' in a password as %%2C and give "
                               "a URL with user info its scheme (http:// or https://)",
                               place);
        const char *host = auth;
        if (*host == '[') {
            const char *close = memchr(host, ']', (size_t)(auth_end - host));
            host = close ? close + 1 : auth_end;
        }
        const char *colon = memchr(host, ':', (size_t)(auth_end - host));
        bool port_number = true;
        for (const char *c = colon ? colon + 1 : auth_end; c < auth_end; c++)
            port_number = port_number && isdigit((unsigned char)*c);
        bool followed = *end == ',' && end[strspn(end, ", ")] != '\0';
        if (!user_info && !port_number && followed)
            return optval_fail(err, errlen,
                               "schema-registry-url: URL %d of the list has a port that is not a "
                               "number (not shown: it may be a password cut at a ','): the list "
                               "is split at every ',', so write a ',' in a password as %%2C",
                               place);
        /* A host name with non-ASCII letters (an IDN): curl converts one to its ASCII form only
         * under a UTF-8 locale, which the relay never sets, and the relay looks host names up
         * itself (resolve.h), so such a URL failed as "Could not resolve host" after the whole
         * --schema-registry-timeout, sending the operator to DNS. Named by place, as above (a
         * cut password may hold such bytes too). */
        const char *name = auth;
        for (const char *c = auth; c < auth_end; c++)
            if (*c == '@')
                name = c + 1;
        const char *name_end = *name == '[' ? auth_end : name + strcspn(name, ":/?#,");
        for (const char *c = name; c < name_end && c < auth_end; c++)
            if ((unsigned char)*c >= 0x80)
                return optval_fail(err, errlen,
                                   "schema-registry-url: URL %d of the list has a host name with "
                                   "non-ASCII letters, which the relay cannot use: give its ASCII "
                                   "form (xn--..., as `idn2 NAME` prints it)",
                                   place);
        p = end;
    }
    return true;
}

/* The registry's URL list, split and counted as registry_new splits it (relay/io/registry.c:
 * commas, leading spaces dropped, empty items skipped, at most CONFIG_REGISTRY_URLS_MAX, no query
 * or fragment in the first of them): bad input refused here with the rest (exit 2), not by
 * registry_new inside relay_new, whose failures are runtime ones (exit 1, which systemd restarts: a
 * list it refuses would restart for ever). */
static bool registry_urls_check(const char *urls, char *err, size_t errlen)
{
    if (!registry_urls_commas(urls, err, errlen))
        return false;
    int given = 0;
    for (const char *p = urls; p && *p;) {
        p += strspn(p, ",");
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, ",");
        if (len == 0)
            continue;
        given++;
        if (given <= CONFIG_REGISTRY_URLS_MAX && (memchr(p, '?', len) || memchr(p, '#', len))) {
            /* registry_new's refusal, in its words (requests append /subjects/... to the URL as
             * written, which after a query or fragment lands in the query), and the URL as it
             * shows it: its password masked, without the query (a key masking may not know). */
            char url[1024], shown[2100];
            const char *scheme = strstr(p, "://");
            bool bare = !scheme || (size_t)(scheme - p) > len;
            snprintf(url, sizeof(url), "%s%.*s", bare ? "http://" : "", (int)len, p);
            log_mask_conninfo(url, shown, sizeof(shown));
            explicit_bzero(url, sizeof(url));
            const char *from = shown;
            if (bare && strncmp(shown, "http://", strlen("http://")) == 0)
                from += strlen("http://");
            return optval_fail(err, errlen,
                               "schema-registry-url %.*s: a query or fragment ('?', '#') is not "
                               "supported: give the registry's base URL (a path prefix is fine)",
                               (int)strcspn(from, "?#"), from);
        }
        p += len;
    }
    if (given == 0)
        return optval_fail(err, errlen, "schema-registry-url: no URL given");
    if (given > CONFIG_REGISTRY_URLS_MAX)
        return optval_fail(err, errlen, "schema-registry-url: at most %d URLs, %d given",
                           CONFIG_REGISTRY_URLS_MAX, given);
    return true;
}

/* run and check: check takes what run takes, and refuses what run would refuse. */
static bool runs_relay(const Config *cfg)
{
    return cfg->command == CMD_RUN || cfg->command == CMD_CHECK;
}

/* The checks between the options that one database's relay runs with: the top level's, and each
 * --databases entry's (the options around the list with the entry's over them), so that an entry
 * is refused for whatever the same options are refused for without a list. cfg->map must be
 * resolved (config_map_init). sessions_bound: --sessions bounds --min-sessions (false around a
 * list that leaves --sessions at its default: each entry's then follow their own min-sessions,
 * checked in the entry). Returns false with one line in err; the caller names the entry. */
static bool database_options_check(const Config *cfg, bool sessions_bound, char *err, size_t errlen)
{
    bool runs = runs_relay(cfg);
    const char *value_format = cfg->value_format == VALUE_AVRO ? "avro" : "json-schema";
    if (runs && cfg->value_format != VALUE_JSON && !cfg->schema_registry_url)
        return optval_fail(err, errlen, "--value-format %s needs --schema-registry-url",
                           value_format);
    if (runs && cfg->value_format != VALUE_JSON &&
        (!registry_urls_check(cfg->schema_registry_url, err, errlen) ||
         !registry_files_check(cfg, err, errlen)))
        return false;
    /* The encoders read the payload column as JSON: bytes, or the payload beside envelope
     * fields, would fail in every row, and every row would be dead-lettered. */
    if (cfg->value_format != VALUE_JSON && (cfg->map.payload_binary || cfg->map.n_envelope > 0))
        return optval_fail(err, errlen,
                           "--value-format %s encodes a JSON payload: not with --payload-format "
                           "binary or envelope fields",
                           value_format);
    /* Kafka orders a partition, not a key: rows of one aggregate that name different partitions
     * are read in no order across them, so the promise shrinks to each partition, and the
     * operator says so (as {event_type} in the topic template needs --order-scope topic). */
    if (cfg->map.partition && cfg->order_scope != ORDER_PER_PARTITION)
        return optval_fail(err, errlen,
                           "additional-fields: %s:partition needs --order-scope partition (order "
                           "then holds per aggregate within each partition; keep the column "
                           "constant per aggregate for whole-aggregate order)",
                           cfg->map.partition);
    if (runs && cfg->retry_backoff_max_ms < cfg->retry_backoff_ms)
        return optval_fail(err, errlen,
                           "--retry-backoff-max (%ld) must not be below --retry-backoff (%ld)",
                           cfg->retry_backoff_max_ms, cfg->retry_backoff_ms);
    if (runs && sessions_bound && cfg->min_sessions > cfg->sessions)
        return optval_fail(err, errlen, "--min-sessions (%ld) must not exceed --sessions (%ld)",
                           cfg->min_sessions, cfg->sessions);
    return true;
}

/* Whether the run's databases a and b would both read one pipe as their
 * --schema-registry-auth-file at start-up (each database's registry reads the file itself,
 * relay/io/registry.c): the first would empty it, and the second would fail with a misleading
 * "expected USER:PASSWORD" on a file that held one. At a reload open_input refuses a pipe anyway;
 * `check` reads one database's. One pipe under two names (/dev/stdin and /proc/self/fd/0) is one
 * file: compared by device and inode. */
static bool registry_pipe_shared(const Config *a, const Config *b)
{
    const char *pa = a->schema_registry_auth_file, *pb = b->schema_registry_auth_file;
    struct stat sa, sb;
    return !regular_files_only && a->command == CMD_RUN && pa && pb &&
           a->value_format != VALUE_JSON && b->value_format != VALUE_JSON && stat(pa, &sa) == 0 &&
           stat(pb, &sb) == 0 && (S_ISFIFO(sa.st_mode) || S_ISSOCK(sa.st_mode)) &&
           sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* One entry of --databases into db, a copy of base with the entry's options over it.
 * sessions_default: base's --sessions is the default (set by no file, variable or flag), and so
 * is an entry's that does not set it: its --min-sessions, not 2. A process of many databases
 * should cost one connection per idle database (docs/operations.md#many-databases): a resting
 * session keeps its connection (so that it can take over when the claiming one's is lost, even
 * from a server that refuses new ones: test 32), which one database can afford and fifty idle
 * ones should not. A busy database is given more in its entry. */
static bool database_load(Config *db, const Config *base, bool sessions_default, json_t *entry,
                          size_t at, char *err, size_t errlen)
{
    config_copy(db, base);
    if (!json_is_object(entry))
        return optval_fail(err, errlen, "databases[%zu]: expected an object", at);
    json_t *name = json_object_get(entry, "name");
    if (!json_is_string(name) || !database_name_ok(json_string_value(name)))
        return optval_fail(err, errlen,
                           "databases[%zu]: \"name\" must be 1-63 characters of a-z, 0-9, _ and -",
                           at);
    db->database_name = strdup(json_string_value(name));
    free(db->database_url);
    free(db->database_url_file);
    db->database_url = db->database_url_file = NULL;
    const char *key;
    json_t *value;
    char source[200];
    bool sessions_set = false;
    const char *spelled[N_OPTIONS] = {0};
    json_object_foreach(entry, key, value)
    {
        if (strcmp(key, "name") == 0 || key[0] == '#')
            continue;
        snprintf(source, sizeof(source), "databases \"%s\": key \"%s\"", db->database_name, key);
        const OptDef *opt = opts_find(&spec, key, strlen(key));
        /* A key no option has (a typo) is said so, as the config file says it: "the process's
         * options go outside the list" sent the reader to look for an option that is none. */
        if (!opt)
            return optval_fail(err, errlen, "%s: unknown key", source);
        if (!database_key(opt->name))
            return optval_fail(err, errlen,
                               "%s: not a per-database option (the process's options go outside "
                               "the list)",
                               source);
        char where[100];
        snprintf(where, sizeof(where), "databases \"%s\"", db->database_name);
        if (!set_once(spelled, opt, key, where, err, errlen))
            return false;
        char *text = scalar_for(opt, value);
        if (!text)
            return optval_fail(err, errlen, "%s: expected %s", source, scalar_expected(opt));
        sessions_set = sessions_set || opt->offset == FIELD(sessions);
        bool ok = opts_set(opt, db, text, source, err, errlen);
        explicit_bzero(text, strlen(text));
        free(text);
        if (!ok)
            return false;
    }
    if (db->database_url && db->database_url_file)
        return optval_fail(err, errlen,
                           "databases \"%s\": database-url and database-url-file: use one",
                           db->database_name);
    if (db->database_url_file && !read_database_url_file(db, err, errlen)) {
        /* The file's error names the file; which entry gave it is said here. */
        char why[1024];
        snprintf(why, sizeof(why), "%s", err);
        return optval_fail(err, errlen, "databases \"%s\": %s", db->database_name, why);
    }
    if (!db->database_url)
        return optval_fail(err, errlen,
                           "databases \"%s\": missing database-url or database-url-file",
                           db->database_name);
    if (sessions_default && !sessions_set)
        db->sessions = db->min_sessions;
    char why[600];
    if (!config_map_init(db, why, sizeof(why)) ||
        !database_options_check(db, true, why, sizeof(why)))
        return optval_fail(err, errlen, "databases \"%s\": %s", db->database_name, why);
    return true;
}

/* jansson's error text without the input it quotes, which may be part of a secret: the text
 * "near" the error, and the escape or code point a string's "invalid Unicode" errors quote. What
 * is left keeps jansson's own quoted punctuation ("'}' expected"); any other quoted text gives
 * way to a description of the error's kind. Edits e->text in place and returns it. */
static const char *json_error_said(json_error_t *e)
{
    char *near = strstr(e->text, " near '");
    if (near)
        *near = '\0';
    bool quotes_input = false;
    for (const char *q = strchr(e->text, '\''); q && !quotes_input;) {
        const char *close = strchr(q + 1, '\'');
        quotes_input = !close || close != q + 2 || !strchr("{}[]:,", q[1]);
        q = close ? strchr(close + 1, '\'') : NULL;
    }
    if (!quotes_input)
        return e->text;
    const char *kind;
    switch (json_error_code(e)) {
    case json_error_invalid_utf8:
        kind = "invalid UTF-8";
        break;
    case json_error_premature_end_of_input:
        kind = "the text ends inside a value";
        break;
    case json_error_null_character:
        kind = "a NUL character (\\u0000) in a string";
        break;
    default:
        kind = "invalid JSON (a string with a bad escape or Unicode code point?)";
        break;
    }
    snprintf(e->text, sizeof(e->text), "%s", kind);
    return e->text;
}

/* Builds cfg->dbs from cfg->databases; sessions_default as database_load takes it. */
static bool databases_load(Config *cfg, bool sessions_default, char *err, size_t errlen)
{
    json_error_t jerr;
    /* The list holds database URLs and perhaps librdkafka secrets: jansson's copies of them are
     * zeroed when freed, from the parse to the json_decref below (secrets_json_wipe). */
    secrets_json_wipe(true);
    json_t *list = json_loads(cfg->databases, JSON_REJECT_DUPLICATES, &jerr);
    bool ok = true;
    if (!list && jerr.line <= 0)
        ok = optval_fail(err, errlen, "databases: expected a JSON array of objects: %s",
                         json_error_said(&jerr));
    else if (!list) /* where, never the text: it holds the database URLs */
        ok = optval_fail(err, errlen,
                         "databases: expected a JSON array of objects: line %d column %d: %s",
                         jerr.line, jerr.column, json_error_said(&jerr));
    else if (!json_is_array(list))
        ok = optval_fail(err, errlen, "databases: expected a JSON array of objects");
    if (!ok || !json_is_array(list)) {
        json_decref(list);
        secrets_json_wipe(false);
        return false;
    }
    size_t n = json_array_size(list);
    if (n == 0)
        ok = optval_fail(err, errlen, "databases: the list is empty");
    else if (n > CONFIG_MAX_DATABASES)
        ok = optval_fail(err, errlen,
                         "databases: %zu entries, at most %d in one process: split the list "
                         "over several processes (docs/operations.md#many-databases)",
                         n, CONFIG_MAX_DATABASES);
    else if (!(cfg->dbs = calloc(n, sizeof(Config)))) {
        perror("outbox-relay");
        exit(1);
    }
    for (size_t i = 0; ok && i < n; i++) {
        cfg->n_dbs = (int)i + 1;
        ok = database_load(&cfg->dbs[i], cfg, sessions_default, json_array_get(list, i), i, err,
                           errlen);
        for (size_t j = 0; ok && j < i; j++) {
            if (strcmp(cfg->dbs[j].database_name, cfg->dbs[i].database_name) == 0)
                ok = optval_fail(err, errlen, "databases: \"%s\" is named twice",
                                 cfg->dbs[i].database_name);
            /* A database's lanes are one group (keyed by the database, not the table): two
             * entries would split them, and each would leave its table's rows in the other's
             * lanes unclaimed, while both look ready. */
            else if (registry_pipe_shared(&cfg->dbs[j], &cfg->dbs[i]))
                ok = optval_fail(err, errlen,
                                 "databases: \"%s\" and \"%s\" both read "
                                 "schema-registry-auth-file %s, a pipe, which can be read once: "
                                 "give a regular file (mode 0600)",
                                 cfg->dbs[j].database_name, cfg->dbs[i].database_name,
                                 cfg->dbs[i].schema_registry_auth_file);
            else if (db_same_database(cfg->dbs[j].database_url, cfg->dbs[i].database_url))
                ok = optval_fail(
                    err, errlen,
                    "databases: \"%s\" and \"%s\" name the same database (host, "
                    "port and dbname; localhost, 127.0.0.1, ::1 and a socket "
                    "directory are one host): list each database once (its lanes are one "
                    "group, which two entries would split, each leaving rows of its "
                    "table unclaimed)",
                    cfg->dbs[j].database_name, cfg->dbs[i].database_name);
        }
    }
    json_decref(list);
    secrets_json_wipe(false);
    return ok;
}

const Config *config_pick_database(const Config *cfg, char *err, size_t errlen)
{
    if (!cfg->n_dbs) {
        if (cfg->database) {
            optval_fail(err, errlen, "--database %s: no --databases list to pick it from",
                        cfg->database);
            return NULL;
        }
        return cfg;
    }
    for (int i = 0; cfg->database && i < cfg->n_dbs; i++)
        if (strcmp(cfg->dbs[i].database_name, cfg->database) == 0)
            return &cfg->dbs[i];
    StrBuf names = {0};
    for (int i = 0; i < cfg->n_dbs; i++) {
        if (i)
            strbuf_puts(&names, ", ");
        strbuf_puts(&names, cfg->dbs[i].database_name);
    }
    optval_fail(err, errlen, "%s: pass --database NAME, one of %s",
                cfg->database ? "unknown --database" : "several databases", names.s);
    strbuf_free(&names);
    return NULL;
}

/* The config file: a JSON object whose keys are option names (or aliases); --kafka is an object
 * of librdkafka properties. Loaded after the defaults, before the environment and flags. */
static bool load_file(const OptSpec *sp, void *out, const char *path, OptSource *sources, char *err,
                      size_t errlen)
{
    Config *cfg = out;
    /* Read here, not by jansson: a directory is named as one (jansson fails to read it, a
     * JSON error that hides the reason), at a reload only a regular file is read, and the text
     * is capped at 1 MiB as every other file the configuration names is (json_loadfd read any
     * size, and a reload on the running relay held it all). The text may hold secrets: cleared
     * once parsed. */
    char *whole = read_text_file("config file", path, err, errlen);
    if (!whole)
        return false;
    json_error_t jerr;
    size_t len = strlen(whole);
    /* jansson's copies of the file's secrets are zeroed when freed, from the parse to the
     * json_decref at the end (secrets_json_wipe). */
    secrets_json_wipe(true);
    json_t *root = json_loadb(whole, len, JSON_REJECT_DUPLICATES, &jerr);
    explicit_bzero(whole, len);
    free(whole);
    bool ok = true;
    if (!root) {
        /* jansson quotes the text "near" the error, which may be part of a secret value. */
        const char *said = json_error_said(&jerr);
        if (jerr.line <= 0)
            ok = optval_fail(err, errlen, "config file %s: %s", path, said);
        else
            ok = optval_fail(err, errlen, "config file %s: line %d column %d: %s", path, jerr.line,
                             jerr.column, said);
        secrets_json_wipe(false);
        return ok;
    }
    if (!json_is_object(root)) {
        ok = optval_fail(err, errlen, "config file %s: expected a JSON object at the top level",
                         path);
        goto done;
    }

    const char *key;
    json_t *value;
    char source[512];
    const char *spelled[N_OPTIONS] = {0}; /* the key that set each option */
    json_object_foreach(root, key, value)
    {
        /* JSON has no comments: a key starting with # is one (the shipped relay.json lists
         * every option so, with its default, config_print_sample). */
        if (key[0] == '#')
            continue;
        const OptDef *opt = opts_find(sp, key, strlen(key));
        snprintf(source, sizeof(source), "config file %s: key \"%s\"", path, key);
        if (!opt || strcmp(key, "config") == 0) {
            ok = optval_fail(err, errlen, "config file %s: unknown key \"%s\"", path, key);
            goto done;
        }
        char where[480];
        snprintf(where, sizeof(where), "config file %s", path);
        if (!(ok = set_once(spelled, opt, key, where, err, errlen)))
            goto done;
        sources[opt - sp->opts] = OPT_FROM_FILE;
        if (strcmp(opt->name, "databases") == 0 && json_is_array(value)) {
            /* The list stays JSON text, read by databases_load like the flag's value. */
            char *text = json_dumps(value, JSON_COMPACT);
            ok = text && opts_set(opt, cfg, text, source, err, errlen);
            if (text)
                explicit_bzero(text, strlen(text));
            free(text);
            if (!ok)
                goto done;
            continue;
        }
        if (opt->type == OPT_LIST) {
            if (!json_is_object(value)) {
                ok = optval_fail(err, errlen, "%s: expected an object of librdkafka properties",
                                 source);
                goto done;
            }
            const char *pkey;
            json_t *pval;
            json_object_foreach(value, pkey, pval)
            {
                char *text = json_scalar_text(pval);
                if (!text || *pkey == '\0') {
                    free(text);
                    ok = optval_fail(err, errlen,
                                     "%s: property \"%s\" must be a string, number or boolean",
                                     source, pkey);
                    goto done;
                }
                kafka_insert(cfg, cfg->kafka.len, (OptPair){strdup(pkey), text});
            }
            continue;
        }
        /* Integers must be JSON numbers or numeric strings; other scalars go in as text and
         * opts_set checks them like a flag. */
        char *text = scalar_for(opt, value);
        if (!text) {
            ok = optval_fail(err, errlen, "%s: expected %s", source, scalar_expected(opt));
            goto done;
        }
        ok = opts_set(opt, cfg, text, source, err, errlen);
        explicit_bzero(text, strlen(text)); /* a database URL, perhaps */
        free(text);
        if (!ok)
            goto done;
    }
done:
    cfg->kafka_from_file = cfg->kafka.len;
    json_decref(root);
    secrets_json_wipe(false);
    return ok;
}

/* Reads a small text file whole. Returns NULL with one line in err. */
static char *read_text_file(const char *option, const char *path, char *err, size_t errlen)
{
    enum { MAX_SIZE = 1 << 20 };
    int fd = open_input(option, path, err, errlen);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        optval_fail(err, errlen, "%s %s: %s", option, path, strerror(errno));
        close(fd);
        return NULL;
    }
    char *text = malloc(MAX_SIZE + 1);
    size_t n = text ? fread(text, 1, MAX_SIZE + 1, f) : 0;
    bool failed = !text || ferror(f);
    int saved = errno;
    fclose(f);
    /* Refused or not, the text may be a secret: cleared before it goes back to the allocator. */
    if (failed || n > MAX_SIZE) {
        if (text)
            explicit_bzero(text, n);
        free(text);
        optval_fail(err, errlen, "%s %s: %s", option, path,
                    failed ? strerror(saved) : "larger than 1 MiB");
        return NULL;
    }
    text[n] = '\0';
    if (strlen(text) != n) {
        explicit_bzero(text, n);
        free(text);
        optval_fail(err, errlen, "%s %s: contains a NUL byte", option, path);
        return NULL;
    }
    return text;
}

/* The database URL is the file's whole content without trailing line breaks. */
static bool read_database_url_file(Config *cfg, char *err, size_t errlen)
{
    char *text = read_text_file("database-url-file", cfg->database_url_file, err, errlen);
    if (!text)
        return false;
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
        text[--n] = '\0';
    const char *why = n == 0                  ? "is empty"
                      : strpbrk(text, "\r\n") ? "holds more than one line"
                                              : NULL;
    if (why) {
        explicit_bzero(text, n); /* a URL with a password, even with a stray line after it */
        free(text);
        return optval_fail(err, errlen, "database-url-file %s: %s (it must hold just the URL)",
                           cfg->database_url_file, why);
    }
    /* Checked here so the error names the file (db_check_conninfo never echoes its text: a
     * file that is not a URL at all may be a token). */
    char bad[512];
    if (!db_check_conninfo(text, bad, sizeof(bad))) {
        explicit_bzero(text, n);
        free(text);
        return optval_fail(err, errlen, "database-url-file %s: %s", cfg->database_url_file, bad);
    }
    /* A weaker source's URL (DATABASE_URL under a --database-url-file flag) gives way: it holds
     * its password. */
    secrets_free_zeroed(cfg->database_url);
    cfg->database_url = text;
    return true;
}

/* librdkafka properties, one KEY=VALUE per line; blank lines and lines starting with # are
 * skipped, spaces around the key and before the value are ignored. Inserted at `at`. Errors name
 * the line, never its text: it may hold a secret. */
static bool read_kafka_file(Config *cfg, size_t at, char *err, size_t errlen)
{
    char *text = read_text_file("kafka-file", cfg->kafka_file, err, errlen);
    if (!text)
        return false;
    size_t text_len = strlen(text);
    bool ok = true;
    int lineno = 0;
    for (char *line = text, *next; ok && line && *line; line = next) {
        lineno++;
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        size_t len = strlen(line);
        if (len > 0 && line[len - 1] == '\r')
            line[--len] = '\0';
        while (*line == ' ' || *line == '\t')
            line++;
        if (*line == '\0' || *line == '#')
            continue;
        char *eq = strchr(line, '=');
        char *key_end = eq;
        while (key_end && key_end > line && (key_end[-1] == ' ' || key_end[-1] == '\t'))
            key_end--;
        if (!eq || key_end == line) {
            ok = optval_fail(err, errlen, "kafka-file %s line %d: expected KEY=VALUE",
                             cfg->kafka_file, lineno);
            break;
        }
        char *value = eq + 1;
        while (*value == ' ' || *value == '\t')
            value++;
        int *lines = realloc(cfg->kafka_file_lines, (cfg->kafka_file_entries + 1) * sizeof(*lines));
        if (!lines) {
            perror("outbox-relay");
            exit(1);
        }
        cfg->kafka_file_lines = lines;
        lines[cfg->kafka_file_entries++] = lineno;
        kafka_insert(cfg, at++, (OptPair){strndup(line, (size_t)(key_end - line)), strdup(value)});
    }
    /* The buffer held the secrets too: clear it before it goes back to the allocator. */
    explicit_bzero(text, text_len);
    free(text);
    return ok;
}

/* database-url-file and database-url are two spellings of one setting: the one from the
 * stronger source wins, and both from the same source is a mistake worth stopping for. */
static bool read_secret_files(Config *cfg, const OptSource *sources, size_t kafka_file_at,
                              char *err, size_t errlen)
{
    OptSource l_url = source_of(sources, "database-url");
    OptSource l_file = source_of(sources, "database-url-file");
    if (l_file != OPT_FROM_NOWHERE && l_file == l_url)
        return optval_fail(err, errlen,
                           "database-url and database-url-file are both set by %s: use one",
                           source_names[l_file]);
    if (l_file > l_url && !read_database_url_file(cfg, err, errlen))
        return false;
    if (cfg->kafka_file && !read_kafka_file(cfg, kafka_file_at, err, errlen))
        return false;
    return true;
}

/* The security.protocol librdkafka will use, from the --kafka properties as librdkafka reads them
 * (aliases, any case, the last one winning). */
static void kafka_security_protocol(const Config *cfg, char *out, size_t outlen)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char errstr[256];
    for (size_t i = 0; i < cfg->kafka.len; i++)
        rd_kafka_conf_set(conf, cfg->kafka.items[i].key, cfg->kafka.items[i].value, errstr,
                          sizeof(errstr));
    size_t n = outlen;
    if (rd_kafka_conf_get(conf, "security.protocol", out, &n) != RD_KAFKA_CONF_OK)
        snprintf(out, outlen, "plaintext");
    rd_kafka_conf_destroy(conf);
}

/* A port: digits only, 1-65535. */
static bool port_ok(const char *text, size_t len)
{
    long n = 0;
    for (size_t i = 0; i < len; i++)
        if (text[i] < '0' || text[i] > '9' || (n = n * 10 + (text[i] - '0')) > 65535)
            return false;
    return len > 0 && n > 0;
}

/* One entry of the broker list, [PROTOCOL://]HOST[:PORT], as librdkafka parses it
 * (rd_kafka_broker_name_parse): the protocol must be security.protocol's (librdkafka otherwise
 * adds no broker); a host with one ':' has a port; an IPv6 address with a port is bracketed, one
 * without may stand alone. Returns what is wrong, or NULL when the entry is good. */
static const char *broker_entry_problem(const char *entry, size_t len, const char *protocol)
{
    const char *end = entry + len, *scheme = memmem(entry, len, "://", 3);
    if (scheme) {
        static const char *const protocols[] = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL",
                                                NULL};
        size_t plen = (size_t)(scheme - entry);
        bool known = false,
             same = strlen(protocol) == plen && strncasecmp(entry, protocol, plen) == 0;
        for (size_t i = 0; protocols[i]; i++)
            known = known ||
                    (strlen(protocols[i]) == plen && strncasecmp(entry, protocols[i], plen) == 0);
        if (!known)
            return "unknown protocol: use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL";
        if (!same)
            return "the protocol is not security.protocol's, and librdkafka would add no broker: "
                   "set --kafka security.protocol to it, or leave the prefix out";
        entry = scheme + 3;
        const char *slash = memchr(entry, '/', (size_t)(end - entry));
        if (slash)
            end = slash; /* librdkafka ignores a URL's path */
    }
    size_t n = (size_t)(end - entry);
    if (n > 0 && entry[0] == '[') {
        const char *close = memchr(entry, ']', n);
        if (!close || close == entry + 1)
            return "expected an IPv6 address in brackets, [ADDRESS]:PORT";
        if (close + 1 == end)
            return NULL;
        return close[1] == ':' && port_ok(close + 2, (size_t)(end - close - 2))
                   ? NULL
                   : "expected [ADDRESS]:PORT, a port from 1 to 65535";
    }
    const char *colon = memchr(entry, ':', n);
    size_t hostlen = colon ? (size_t)(colon - entry) : n;
    if (colon && memchr(colon + 1, ':', (size_t)(end - colon - 1))) {
        /* Several colons: an IPv6 address without a port (librdkafka's default, 9092). */
        char addr[INET6_ADDRSTRLEN];
        struct in6_addr a6;
        if (n < sizeof(addr)) {
            memcpy(addr, entry, n);
            addr[n] = '\0';
            if (inet_pton(AF_INET6, addr, &a6) == 1)
                return NULL;
        }
        return "expected HOST:PORT (an IPv6 address with a port goes in brackets, [ADDRESS]:PORT)";
    }
    /* An empty host is librdkafka's localhost. */
    for (size_t i = 0; i < hostlen; i++)
        if (!isalnum((unsigned char)entry[i]) && !strchr("._-", entry[i]))
            return "a host name is letters, digits, '.', '-' and '_'";
    size_t portlen = colon ? (size_t)(end - colon - 1) : 0;
    if (colon && portlen > 0 && colon[portlen] == '/')
        portlen--; /* "host:9092/": librdkafka reads the port up to the slash */
    if (colon && !port_ok(colon + 1, portlen))
        return "the port must be a number from 1 to 65535";
    return NULL;
}

/* --brokers, a comma-separated list of brokers as librdkafka reads bootstrap.servers: a typo
 * (a port that is not a number, a list of commas) would otherwise leave the relay retrying
 * forever. Empty entries are skipped, as librdkafka skips them; at least one broker is needed. */
static bool brokers_check(const Config *cfg, OptSource from, char *err, size_t errlen)
{
    const char *source = from == OPT_FROM_ENV    ? "KAFKA_BROKERS"
                         : from == OPT_FROM_FILE ? "config file: key \"brokers\""
                                                 : "--brokers";
    /* librdkafka takes no user info in the list ('@' is no host's or port's): an entry holding
     * one (sasl_ssl://USER:PASSWORD@HOST:PORT) is refused without showing any entry, since the
     * password may also hold the ',' that splits entries ("u:pa,ss@h" shows "u:pa" as one). */
    if (strchr(cfg->brokers, '@'))
        return optval_fail(err, errlen,
                           "%s: an entry holds user info ('@', not shown: it may hold a "
                           "password): the list is [PROTOCOL://]HOST[:PORT][,...]; give the "
                           "credentials as --kafka sasl.username and --kafka sasl.password",
                           source);
    char protocol[32];
    kafka_security_protocol(cfg, protocol, sizeof(protocol));
    size_t entries = 0;
    for (const char *p = cfg->brokers; *p;) {
        if (*p == ',' || isspace((unsigned char)*p)) {
            p++; /* librdkafka skips ',' and ' '; other blanks would make an entry of nothing */
            continue;
        }
        size_t len = strcspn(p, ",");
        while (len > 0 && strchr(" \t\r\n", p[len - 1]))
            len--; /* "k1:9092 ,k2:9092": librdkafka reads the port up to the blank */
        const char *why = strcspn(p, " \t\r\n") < len
                              ? "blanks inside an entry (the entries are separated by ',')"
                              : broker_entry_problem(p, len, protocol);
        if (why)
            return optval_fail(err, errlen, "%s: broker '%.*s': %s", source,
                               (int)(len < 200 ? len : 200), p, why);
        entries++;
        p += len;
        p += strspn(p, " \t\r\n");
    }
    if (entries == 0)
        return optval_fail(err, errlen,
                           "%s: expected at least one broker, [PROTOCOL://]HOST[:PORT][,...]",
                           source);
    return true;
}

/* Properties that load code, run commands or write files are refused (kafka_guard.h) unless
 * --kafka-allow-unsafe names them. That option counts only as a flag: the point is that whoever
 * may edit the config file or the environment cannot grant it to themselves. */
static bool check_kafka_properties(Config *cfg, const OptSource *sources, char *err, size_t errlen)
{
    OptSource from = source_of(sources, "kafka-allow-unsafe");
    if (cfg->kafka_allow_unsafe && from != OPT_FROM_FLAG)
        return optval_fail(err, errlen,
                           "--kafka-allow-unsafe is accepted only as a flag, not from %s",
                           source_names[from]);
    if (!kafka_guard_check_allow(cfg->kafka_allow_unsafe, err, errlen))
        return false;
    for (size_t i = 0; i < cfg->kafka.len; i++) {
        char origin[1024];
        config_kafka_origin(cfg, i, origin, sizeof(origin));
        if (!kafka_guard_check(cfg->kafka.items[i].key, cfg->kafka.items[i].value,
                               cfg->kafka_allow_unsafe, origin, err, errlen))
            return false;
    }
    return true;
}

void config_kafka_origin(const Config *cfg, size_t i, char *out, size_t outlen)
{
    const char *key = i < cfg->kafka.len ? cfg->kafka.items[i].key : "";
    size_t from_file = cfg->kafka_from_file;
    if (i < from_file)
        snprintf(out, outlen, "config file %s: kafka %s", cfg->config_file ? cfg->config_file : "",
                 key);
    else if (i - from_file < cfg->kafka_file_entries)
        snprintf(out, outlen, "kafka-file %s line %d: %s", cfg->kafka_file ? cfg->kafka_file : "",
                 cfg->kafka_file_lines[i - from_file], key);
    else
        snprintf(out, outlen, "--kafka %s", key);
}

static const OptSpec spec = {
    .prog = "outbox-relay",
    .summary = "Moves rows from a PostgreSQL outbox table to Kafka, at least once, in order per\n"
               "aggregate.",
    .cmds = commands,
    .ncmds = sizeof(commands) / sizeof(commands[0]),
    .default_cmd = -1,
    .help_cmd = CMD_HELP,
    .version_cmd = CMD_VERSION,
    .opts = options,
    .nopts = N_OPTIONS,
    .aliases = aliases,
    .naliases = sizeof(aliases) / sizeof(aliases[0]),
    .file_option = "config",
    .load_file = load_file,
    .commands_shown = true,
    .help_footer =
        "\nOptions marked [SIGHUP] take effect when a running relay gets SIGHUP (it re-reads\n"
        "the config file; the environment stays the one it started with, so a changed\n"
        "EnvironmentFile= needs a restart, not a reload); other changes need a restart.\n",
};

/* Choice fields are stored as int, and the command as the engine's int. */
_Static_assert(sizeof(Command) == sizeof(int), "Command stored as int");

/* Where the package installs the service's configuration (systemd/outbox-relay.service.in). */
static const char *installed_dir = "/etc/outbox-relay";

void config_set_installed_dir(const char *dir)
{
    installed_dir = dir;
}

/* The commands an operator runs by hand on the relay's host, as the relay's role: without any
 * database setting they take the installed service's (migrate runs as the owner, run under its
 * unit with explicit flags: neither guesses). */
static bool takes_installed(Command c)
{
    return c == CMD_DEAD || c == CMD_REQUEUE || c == CMD_PURGE_DEAD || c == CMD_STATUS ||
           c == CMD_VERIFY || c == CMD_CHECK;
}

/* The commands among those that reach Kafka (verify, check): they take the installed
 * kafka.properties too, as the unit hands it to run (--kafka-file), so that the brokers' TLS and
 * SASL settings an operator put there apply to them as to the service. */
static bool takes_installed_kafka(Command c)
{
    return c == CMD_VERIFY || c == CMD_CHECK;
}

/* The installed files that are readable, as flags appended to argv (a new array the caller
 * frees; its strings are static or in paths). Returns the new argc, or argc when neither
 * relay.json nor database-url is (kafka.properties alone gives no database to work on). */
static int installed_args(Command command, int argc, char **argv, char ***out, char paths[3][512],
                          char *said, size_t saidlen)
{
    snprintf(paths[0], 512, "%s/relay.json", installed_dir);
    snprintf(paths[1], 512, "%s/database-url", installed_dir);
    snprintf(paths[2], 512, "%s/kafka.properties", installed_dir);
    bool config = access(paths[0], R_OK) == 0, url = access(paths[1], R_OK) == 0;
    bool kafka = takes_installed_kafka(command) && access(paths[2], R_OK) == 0;
    for (int i = 1; i < argc && kafka; i++)
        if (strcmp(argv[i], "--kafka-file") == 0 || strncmp(argv[i], "--kafka-file=", 13) == 0)
            kafka = false; /* the operator's own file: not second-guessed */
    *out = NULL;
    if (!config && !url)
        return argc;
    char **args = calloc((size_t)argc + 7, sizeof(*args));
    if (!args) {
        perror("outbox-relay");
        exit(1);
    }
    memcpy(args, argv, (size_t)argc * sizeof(*args));
    int n = argc;
    if (config) {
        args[n++] = (char *)"--config";
        args[n++] = paths[0];
    }
    if (url) {
        args[n++] = (char *)"--database-url-file";
        args[n++] = paths[1];
    }
    /* As a flag, it replaces a kafka-file key of relay.json, as the unit's flag does. */
    if (kafka) {
        args[n++] = (char *)"--kafka-file";
        args[n++] = paths[2];
    }
    snprintf(said, saidlen, "%s%s%s%s%s", config ? paths[0] : "", config && url ? " and " : "",
             url ? paths[1] : "", kafka ? " and " : "", kafka ? paths[2] : "");
    *out = args;
    return n;
}

/* The missing URL, said with every way to give it (and, after the installed files were tried,
 * why they did not give it). */
static bool missing_url(bool tried, char *err, size_t errlen)
{
    char url_file[512];
    snprintf(url_file, sizeof(url_file), "%s/database-url", installed_dir);
    const char *why = !tried                        ? ""
                      : access(url_file, F_OK) == 0 ? " (the installed service's credential is "
                                                      "readable by root only: run as root, or pass "
                                                      "the URL)"
                                                    : " (no installed service's credential either)";
    return optval_fail(err, errlen,
                       "missing database URL: pass --database-url URL or --database-url-file PATH, "
                       "set DATABASE_URL, or give --config FILE with a database-url-file key%s",
                       why);
}

/* The options that read as a selection of rows, each its owners' alone (the commands of its
 * OptDef). Every command takes every option (scripts pass one set to several), but another's
 * selection was taken and ignored: `replay --since 2h --aggregate-type order` replayed every
 * sent order event, not the last two hours', `replay --id 7 ...` ignored the id, `verify
 * --sent-after T --sent-before U` checked the last hour and could say ok of a window it never
 * read, `purge-dead --all --aggregate-type order` deleted every dead event, not the order ones,
 * and `dead --aggregate-type order` listed them all, which read as the order ones. in_verify and
 * in_replay end verify's and replay's refusal, after the owners' names (NULL: theirs); the
 * other commands' refusals end alike for every option (selections_check). */
static const struct {
    const char *option, *in_verify, *in_replay;
} selections[] = {
    {"since", NULL, " window; replay selects by --sent-after/--sent-before"},
    {"sent-after", " selection; verify checks the window --since gives", NULL},
    {"sent-before", " selection; verify checks the window --since gives", NULL},
    {"from-id", " selection; verify checks the window --since gives", NULL},
    {"to-id", " selection; verify checks the window --since gives", NULL},
    {"aggregate-type", " selection; verify checks every row of its window", NULL},
    {"aggregate-id", " selection; verify checks every row of its window", NULL},
    {"event-type", " selection; verify checks every row of its window", NULL},
    {"missing", "; verify writes that list with --json", NULL},
    {"id", "; verify checks every row of its window", "; replay selects by --from-id/--to-id"},
    {"all", "; verify checks the window --since gives", "; replay needs a selection"}};

/* Refuses, with one line in err, a selection option given as a flag to a command that selects
 * rows (replay, verify, requeue, purge-dead) or lists them all (dead) and is not among its
 * owners: "CMD does not take --OPTION (it is OWNER's...; what CMD does instead)". The file and
 * the environment may be shared by every command: taken from there. The first such flag in the
 * table's order is named. */
static bool selections_check(const Config *cfg, const OptSource *sources, char *err, size_t errlen)
{
    const char *name = "";
    for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++)
        if (commands[c].id == (int)cfg->command)
            name = commands[c].name;
    for (size_t i = 0; i < sizeof(selections) / sizeof(selections[0]); i++) {
        const char *option = selections[i].option;
        unsigned owners = opts_find(&spec, option, strlen(option))->commands;
        if ((owners & FOR(cfg->command)) || source_of(sources, option) != OPT_FROM_FLAG)
            continue;
        char end[96];
        const char *why = cfg->command == CMD_VERIFY   ? selections[i].in_verify
                          : cfg->command == CMD_REPLAY ? selections[i].in_replay
                                                       : NULL;
        if (why)
            snprintf(end, sizeof(end), "%s", why);
        else if (cfg->command == CMD_VERIFY || cfg->command == CMD_REPLAY)
            continue; /* theirs, by the table: the OptDef would say so too */
        else if (cfg->command == CMD_REQUEUE || cfg->command == CMD_PURGE_DEAD)
            snprintf(end, sizeof(end), "; %s selects by --id ID or --all alone", name);
        else if (cfg->command == CMD_DEAD)
            snprintf(end, sizeof(end), "; dead lists every dead-lettered event");
        else
            return true; /* run, migrate, status and check select no rows */
        char whose[96] = "";
        for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++)
            if (owners & FOR(commands[c].id))
                snprintf(whose + strlen(whose), sizeof(whose) - strlen(whose), "%s%s's",
                         whose[0] ? " and " : "", commands[c].name);
        return optval_fail(err, errlen, "%s does not take --%s (it is %s%s)", name, option, whose,
                           end);
    }
    return true;
}

/* Refuses, with one line in err, --dry-run from anywhere but the command line, and given as a flag
 * to a command that has no dry run (all but its OptDef's: migrate and replay). Every command takes
 * every option, and one that has no dry run did its work for real: `purge-dead --all --dry-run`,
 * typed to see what it would delete, deleted every dead event, `requeue --all --dry-run` requeued
 * them all, `run --dry-run` relayed. A dry run is asked of one invocation, never of a file every
 * command shares: there it made `migrate` (an init container's) change nothing and exit 0, and
 * the next run met an unmigrated schema. --databases entries refuse it already (not a
 * per-database option). */
static bool dry_run_check(const Config *cfg, const OptSource *sources, char *err, size_t errlen)
{
    OptSource from = source_of(sources, "dry-run");
    if (cfg->dry_run && from != OPT_FROM_FLAG)
        return optval_fail(err, errlen, "--dry-run is accepted only as a flag, not from %s",
                           source_names[from]);
    unsigned owners = opts_find(&spec, "dry-run", strlen("dry-run"))->commands;
    if (!cfg->dry_run || (owners & FOR(cfg->command)))
        return true;
    const char *name = "";
    for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++)
        if (commands[c].id == (int)cfg->command)
            name = commands[c].name;
    return optval_fail(err, errlen,
                       "%s does not take --dry-run (migrate and replay have a dry run; %s would do "
                       "its work for real)",
                       name, name);
}

static bool config_load_once(Config *cfg, int argc, char **argv, bool *url_missing, char *err,
                             size_t errlen);

/* A hash of a regular file's content (FNV-1a, 64 bits), read without waiting; 0 when it is not
 * one or cannot be read whole. A pipe at start-up is not even opened: its writer, let go by a
 * reader that then closes, would meet a closed pipe, and the registry would read nothing. */
static uint64_t file_sum(const char *path)
{
    struct stat st;
    if (!path || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    uint64_t h = 14695981039346656037ULL;
    unsigned char buf[16384];
    uintmax_t total = 0;
    ssize_t n;
    while (total <= CONFIG_CA_FILE_MAX && (n = read(fd, buf, sizeof(buf))) > 0) {
        for (ssize_t i = 0; i < n; i++)
            h = (h ^ buf[i]) * 1099511628211ULL;
        total += (uintmax_t)n;
    }
    bool whole = total <= CONFIG_CA_FILE_MAX && n == 0;
    explicit_bzero(buf, sizeof(buf)); /* the auth file's password */
    close(fd);
    return whole ? (h ? h : 1) : 0;
}

/* The files one load has hashed, by path: a list's entries take the registry's files from the
 * options around the list, and a CA bundle (up to 8 MiB) hashed again for each of them held the
 * loop about 2 s per SIGHUP with 100 entries. Two paths at most for the options around the list
 * and for each entry. */
typedef struct FileSums {
    struct {
        const char *path;
        uint64_t sum;
    } seen[2 * (CONFIG_MAX_DATABASES + 1)];
    size_t n;
} FileSums;

/* file_sum, once per path of one load. */
static uint64_t file_sum_once(FileSums *sums, const char *path)
{
    if (!path)
        return 0;
    for (size_t i = 0; i < sums->n; i++)
        if (strcmp(sums->seen[i].path, path) == 0)
            return sums->seen[i].sum;
    uint64_t sum = file_sum(path);
    if (sums->n < sizeof(sums->seen) / sizeof(sums->seen[0])) {
        sums->seen[sums->n].path = path;
        sums->seen[sums->n++].sum = sum;
    }
    return sum;
}

static void registry_files_sum_with(Config *cfg, FileSums *sums)
{
    if (runs_relay(cfg) && cfg->value_format != VALUE_JSON) {
        cfg->schema_registry_auth_sum = file_sum_once(sums, cfg->schema_registry_auth_file);
        cfg->schema_registry_ca_sum = file_sum_once(sums, cfg->schema_registry_ca_file);
    }
    for (int i = 0; i < cfg->n_dbs; i++)
        registry_files_sum_with(&cfg->dbs[i], sums);
}

/* What the registry's files hold now, for cfg and each database of its list (config_diff). */
static void registry_files_sum(Config *cfg)
{
    FileSums sums = {.n = 0};
    registry_files_sum_with(cfg, &sums);
}

bool config_load_reload(Config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    regular_files_only = true;
    bool ok = config_load(cfg, argc, argv, err, errlen);
    regular_files_only = false;
    return ok;
}

bool config_load(Config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    bool url_missing = false;
    bool ok = config_load_once(cfg, argc, argv, &url_missing, err, errlen);
    /* A --config that lacks the URL is the operator's choice: said, not second-guessed. */
    if (ok || !url_missing || !takes_installed(cfg->command) || cfg->config_file)
        return ok;
    char **args, paths[3][512], said[1700];
    int n = installed_args(cfg->command, argc, argv, &args, paths, said, sizeof(said));
    if (n == argc)
        return missing_url(true, err, errlen);
    config_free(cfg);
    url_missing = false;
    ok = config_load_once(cfg, n, args, &url_missing, err, errlen);
    free(args);
    if (ok)
        log_info("no database URL given: using the installed service's configuration",
                 "files=\"%s\"", said);
    else if (url_missing)
        missing_url(true, err, errlen);
    return ok;
}

/* Resolves cfg's table and column options into cfg->map. */
static bool config_map_init(Config *cfg, char *err, size_t errlen)
{
    TableOptions table = {cfg->layout,
                          cfg->table,
                          cfg->seq_column,
                          cfg->event_id_column,
                          cfg->aggregate_type_column,
                          cfg->aggregate_id_column,
                          cfg->event_type_column,
                          cfg->payload_column,
                          cfg->headers_column,
                          cfg->additional_fields,
                          cfg->timestamp_column,
                          cfg->message_format == FORMAT_CLOUDEVENTS,
                          cfg->payload_binary != 0,
                          cfg->tombstone_on_empty_payload,
                          cfg->message_format == FORMAT_CLOUDEVENTS};
    return table_map_init(&cfg->map, &table, err, errlen);
}

static bool config_load_once(Config *cfg, int argc, char **argv, bool *url_missing, char *err,
                             size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    int command = CMD_HELP;
    OptSource sources[N_OPTIONS];
    bool ok = opts_parse_traced(&spec, cfg, &command, sources, argc, argv, err, errlen);
    cfg->command = (Command)command;
    if (!ok || cfg->command == CMD_HELP || cfg->command == CMD_VERSION)
        return ok;
    /* --kafka-file lines go after the config file's --kafka entries, before the flags'. */
    if (!read_secret_files(cfg, sources, cfg->kafka_from_file, err, errlen))
        return false;
    if (!check_kafka_properties(cfg, sources, err, errlen))
        return false;

    if (cfg->databases && (cfg->database_url || cfg->database_url_file))
        return optval_fail(err, errlen,
                           "databases and database-url (or database-url-file) are both set: the "
                           "list names each database's URL");
    if (!cfg->database_url && !cfg->databases) {
        *url_missing = true;
        return missing_url(false, err, errlen);
    }
    if (!config_map_init(cfg, err, errlen))
        return false;
    /* --sessions left at its default: around a list, each entry's follow its min-sessions. */
    bool sessions_default = source_of(sources, "sessions") == OPT_FROM_DEFAULT;
    if (cfg->databases && !databases_load(cfg, sessions_default, err, errlen))
        return false;
    /* Around a list, a --sessions left at its default is no bound: each entry's sessions default
     * to its min-sessions (database_load), which checks its own pair. */
    if (!database_options_check(cfg, !(cfg->databases && sessions_default), err, errlen))
        return false;
    if ((cfg->command == CMD_RUN || cfg->command == CMD_VERIFY || cfg->command == CMD_CHECK) &&
        !cfg->brokers)
        return optval_fail(err, errlen,
                           "missing Kafka brokers: pass --brokers or set KAFKA_BROKERS");
    /* Checked for the commands that talk to Kafka: an environment file shared by every command
     * must not stop migrate over a list only run would read. */
    if ((cfg->command == CMD_RUN || cfg->command == CMD_VERIFY || cfg->command == CMD_CHECK) &&
        cfg->brokers && !brokers_check(cfg, source_of(sources, "brokers"), err, errlen))
        return false;
    cfg->id_set = source_of(sources, "id") > OPT_FROM_DEFAULT;
    if (cfg->command == CMD_REQUEUE && cfg->id_set == cfg->all)
        return optval_fail(err, errlen, "requeue needs exactly one of --id ID or --all");
    cfg->replay_from_id_set = source_of(sources, "from-id") > OPT_FROM_DEFAULT;
    cfg->replay_to_id_set = source_of(sources, "to-id") > OPT_FROM_DEFAULT;
    if (cfg->command == CMD_REPLAY && !cfg->replay_from_id_set && !cfg->replay_to_id_set &&
        !cfg->replay_sent_after && !cfg->replay_sent_before && !cfg->replay_aggregate_type &&
        !cfg->replay_aggregate_id && !cfg->replay_event_type && !cfg->replay_missing)
        return optval_fail(err, errlen,
                           "replay needs a selection: --from-id, --to-id, --sent-after, "
                           "--sent-before, --aggregate-type, --aggregate-id, --event-type or "
                           "--missing");
    if (!selections_check(cfg, sources, err, errlen))
        return false;
    if (!dry_run_check(cfg, sources, err, errlen))
        return false;
    /* A rollback's one-off decision: from a file (or the environment) every later migrate of
     * every version would accept a newer schema unasked. */
    if (cfg->allow_newer_schema && source_of(sources, "allow-newer-schema") != OPT_FROM_FLAG)
        return optval_fail(err, errlen,
                           "--allow-newer-schema is accepted only as a flag, not from %s",
                           source_names[source_of(sources, "allow-newer-schema")]);
    if (cfg->command == CMD_REPLAY && cfg->replay_from_id_set && cfg->replay_to_id_set &&
        cfg->replay_from_id > cfg->replay_to_id)
        return optval_fail(err, errlen, "--from-id (%ld) must not exceed --to-id (%ld)",
                           cfg->replay_from_id, cfg->replay_to_id);
    if (cfg->command == CMD_PURGE_DEAD && cfg->id_set == cfg->all)
        return optval_fail(err, errlen, "purge-dead needs exactly one of --id ID or --all");
    registry_files_sum(cfg);
    return true;
}

void config_free(Config *cfg)
{
    for (int i = 0; cfg->dbs && i < cfg->n_dbs; i++)
        config_free(&cfg->dbs[i]);
    free(cfg->dbs);
    cfg->dbs = NULL;
    cfg->n_dbs = 0;
    free(cfg->database_name);
    cfg->database_name = NULL;
    free(cfg->kafka_file_lines);
    cfg->kafka_file_lines = NULL;
    cfg->kafka_file_entries = 0;
    opts_free(&spec, cfg);
    table_map_free(&cfg->map);
}

void config_print_help(FILE *out, int argc, char **argv)
{
    int cmd = opts_help_command(&spec, argc, argv);
    if (cmd >= 0)
        opts_print_command_help(&spec, cmd, out);
    else {
        opts_print_help(&spec, out);
        fprintf(out, "One command and its options only: %s COMMAND --help.\n", spec.prog);
    }
}

void config_print_man(FILE *out)
{
    opts_print_man(&spec, out);
}

void config_print_table(FILE *out)
{
    opts_print_table(&spec, out);
}

/* A JSON string literal of text (the help texts hold quotes, never control characters). */
static void put_json_string(FILE *out, const char *text)
{
    json_t *s = json_string(text);
    char *dumped = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    fputs(dumped ? dumped : "\"\"", out);
    free(dumped);
    json_decref(s);
}

void config_print_sample(FILE *out)
{
    fputs("{\n  \"#\": \"outbox-relay configuration, read by the unit (--config). Every option of "
          "outbox-relay(1) is a key, listed below with its default; a key starting with # is "
          "ignored: remove the # to set one. The database URL is not set here: the unit reads "
          "it from /etc/outbox-relay/database-url as a credential. Flags and the environment win "
          "over this file.\",\n\n  \"brokers\": \"localhost:9092\",\n  \"metrics-listen\": "
          "\"127.0.0.1:9187\"",
          out);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const OptDef *o = &options[i];
        /* Not from a file: the file itself, a flag-only grant or request (a dry run is asked of
         * one invocation), and the secret (a credential). */
        if (strcmp(o->name, "config") == 0 || strcmp(o->name, "kafka-allow-unsafe") == 0 ||
            strcmp(o->name, "dry-run") == 0 || strcmp(o->name, "allow-newer-schema") == 0 ||
            strcmp(o->name, "database-url") == 0 || strcmp(o->name, "brokers") == 0 ||
            strcmp(o->name, "metrics-listen") == 0)
            continue;
        char note[600];
        snprintf(note, sizeof(note), "%s%s", o->help, o->reloadable ? " [SIGHUP]" : "");
        fprintf(out, ",\n\n  \"# %s\": ", o->name);
        put_json_string(out, note);
        fprintf(out, ",\n  \"#%s\": ", o->name);
        if (o->type == OPT_LIST)
            fputs("{}", out);
        else if (strcmp(o->name, "databases") == 0)
            fputs("[]", out);
        else if (o->type == OPT_BOOL)
            fputs("false", out);
        else if (o->def && o->type == OPT_INT)
            fputs(o->def, out);
        else
            put_json_string(out, o->def ? o->def : o->metavar);
    }
    fputs("\n}\n", out);
}

bool config_option_reloadable(const char *name)
{
    const OptDef *o = opts_find(&spec, name, strlen(name));
    return o && o->reloadable;
}

static bool same_string(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static bool same_value(const OptDef *o, const Config *a, const Config *b)
{
    const void *fa = (const char *)a + o->offset, *fb = (const char *)b + o->offset;
    switch (o->type) {
    case OPT_STRING:
        return same_string(*(char *const *)fa, *(char *const *)fb);
    case OPT_INT:
    case OPT_DURATION:
        return *(const long *)fa == *(const long *)fb;
    case OPT_CHOICE:
    case OPT_LOG_LEVEL:
        return *(const int *)fa == *(const int *)fb;
    case OPT_BOOL:
        return *(const bool *)fa == *(const bool *)fb;
    case OPT_LIST: {
        const OptList *la = fa, *lb = fb;
        if (la->len != lb->len)
            return false;
        for (size_t i = 0; i < la->len; i++)
            if (!same_string(la->items[i].key, lb->items[i].key) ||
                !same_string(la->items[i].value, lb->items[i].value))
                return false;
        return true;
    }
    }
    return false;
}

/* Whether a registry file named alike holds another content now (both read: a hash 0 is
 * unknown, a pipe at start-up). A changed name is the option's own change. */
static bool file_changed(const char *running_path, uint64_t running_sum, const char *fresh_path,
                         uint64_t fresh_sum)
{
    return running_path && same_string(running_path, fresh_path) && running_sum && fresh_sum &&
           running_sum != fresh_sum;
}

void config_diff(const Config *running, const Config *fresh, ConfigChangeFn fn, void *arg)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!same_value(&options[i], running, fresh))
            fn(options[i].name, options[i].reloadable, arg);
    /* The registry's client reads its files once (registry_new): a password or CA rotated under
     * the same path is not taken by a reload, which said "changed=none" over it, so that the
     * rotation seemed done until the old password was refused. Said as the restart-only change
     * it is, by the option's name. */
    if (file_changed(running->schema_registry_auth_file, running->schema_registry_auth_sum,
                     fresh->schema_registry_auth_file, fresh->schema_registry_auth_sum))
        fn("schema-registry-auth-file", false, arg);
    if (file_changed(running->schema_registry_ca_file, running->schema_registry_ca_sum,
                     fresh->schema_registry_ca_file, fresh->schema_registry_ca_sum))
        fn("schema-registry-ca-file", false, arg);
}

void config_apply_reloadable(Config *running, const Config *fresh)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const OptDef *o = &options[i];
        if (!o->reloadable)
            continue;
        void *to = (char *)running + o->offset;
        const void *from = (const char *)fresh + o->offset;
        switch (o->type) {
        case OPT_INT:
        case OPT_DURATION:
            *(long *)to = *(const long *)from;
            break;
        case OPT_CHOICE:
        case OPT_LOG_LEVEL:
            *(int *)to = *(const int *)from;
            break;
        case OPT_BOOL:
            *(bool *)to = *(const bool *)from;
            break;
        case OPT_STRING:
        case OPT_LIST:
            break; /* never reloadable: strings and lists are not copied by value */
        }
    }
}

/* The password of each Schema Registry URL: curl takes USER:PASSWORD@ in a URL's authority, and
 * the URL is logged as written (the registry's warnings name it). The list is split as the
 * registry splits it (relay/io/registry.c); each URL's password is found by the code that finds
 * a database URL's (secrets_add_conninfo: the text between the userinfo's first ':' and the '@'
 * that ends it, as written, percent-encoding and all; shorter than SECRETS_MIN_LEN, it is not
 * registered). --schema-registry-auth-file's password is registered when the registry reads the
 * file (registry_new). */
static void register_registry_secrets(const char *urls)
{
    if (!urls)
        return;
    char *copy = strdup(urls), *save = NULL;
    if (!copy) {
        perror("outbox-relay");
        exit(1);
    }
    for (char *u = strtok_r(copy, ",", &save); u; u = strtok_r(NULL, ",", &save)) {
        while (*u == ' ')
            u++;
        if (strstr(u, "://")) {
            secrets_add_conninfo(u);
            continue;
        }
        /* curl takes a URL without a scheme as http:// (reg:PASSWORD@host:8081 works). */
        char *with_scheme = NULL;
        if (asprintf(&with_scheme, "http://%s", u) < 0) {
            perror("outbox-relay");
            exit(1);
        }
        secrets_add_conninfo(with_scheme);
        explicit_bzero(with_scheme, strlen(with_scheme));
        free(with_scheme);
    }
    explicit_bzero(copy, strlen(urls));
    free(copy);
}

void config_register_secrets(const Config *cfg)
{
    for (int i = 0; i < cfg->n_dbs; i++)
        config_register_secrets(&cfg->dbs[i]);
    if (cfg->database_url)
        secrets_add_conninfo(cfg->database_url);
    register_registry_secrets(cfg->schema_registry_url);
    for (size_t i = 0; i < cfg->kafka.len; i++)
        if (secrets_kafka_key_sensitive(cfg->kafka.items[i].key))
            secrets_add(cfg->kafka.items[i].value);
}

/* Warns about one file when group or others may read it and it holds a registered secret, or
 * whatever it holds when the whole file is one (credentials). */
static void warn_if_loose(const char *path, bool credentials)
{
    struct stat st;
    if (!path || stat(path, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) == 0)
        return;
    char err[256];
    char *text = read_text_file("secret file", path, err, sizeof(err));
    if (!text)
        return;
    bool secret = credentials ? text[0] != '\0' : secrets_found(text);
    explicit_bzero(text, strlen(text));
    free(text);
    if (!secret)
        return;
    char q[600];
    log_warn("secret file readable by other users",
             "file=%s mode=%04o hint=\"chmod 600 it (owned by the relay's user), or hand it to the "
             "service with systemd's LoadCredential=\"",
             log_quote(path, q, sizeof(q)), (unsigned)(st.st_mode & 07777));
}

void config_warn_loose_secret_files(const Config *cfg)
{
    warn_if_loose(cfg->config_file, false);
    warn_if_loose(cfg->database_url_file, false);
    warn_if_loose(cfg->kafka_file, false);
    /* USER:PASSWORD, its password registered only when the registry reads the file (later, in
     * registry_new): the file is a secret whole. */
    warn_if_loose(cfg->schema_registry_auth_file, true);
    for (int i = 0; i < cfg->n_dbs; i++)
        warn_if_loose(cfg->dbs[i].database_url_file, false);
}

void config_scrub_argv(int argc, char **argv)
{
    /* The whole URL: a password may hide in several places. */
    static const char *const whole[] = {"database-url", "databases", NULL};
    static const char *const url_lists[] = {"schema-registry-url", NULL};
    secrets_scrub_argv(&spec, argc, argv, whole, url_lists);
}
