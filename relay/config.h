/* config: the relay's options, from flags, environment, a JSON config file and defaults.
 *
 * One table (config.c) names every option once, with its type, range, environment variable,
 * default and help text; parsing, validation and --help are all driven from it. Precedence is
 * flag > environment > config file > default. */
#ifndef OUTBOX_CONFIG_H
#define OUTBOX_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

#include "log.h"
#include "opts.h"
#include "table.h"

/* The longest line of --schema-registry-auth-file, newline included, as the registry reads it
 * (relay/io/registry.c) and the configuration checks it. */
#define CONFIG_AUTH_LINE_MAX 1024
/* The largest --schema-registry-ca-file the registry reads into memory (the system's bundle is
 * about 200 kB), as it reads it (relay/io/registry.c) and the configuration checks it. */
#define CONFIG_CA_FILE_MAX (8u << 20)
#define CONFIG_CA_FILE_MAX_TEXT "8 MiB"
/* The most --schema-registry-url URLs: relay/io/registry.c's MAX_URLS, which must stay equal. */
#define CONFIG_REGISTRY_URLS_MAX 8

/* The most --statement-timeout takes: a day, which any statement of the commands that may run
 * at all fits (a longer one is a typo of a unit), and which statement_timeout in milliseconds
 * and poll()'s int timeout both hold. */
#define CONFIG_STATEMENT_TIMEOUT_MAX_S 86400L

typedef enum {
    CMD_RUN,
    CMD_MIGRATE,
    CMD_DEAD,
    CMD_REQUEUE,
    CMD_PURGE_DEAD,
    CMD_STATUS,
    CMD_VERIFY,
    CMD_REPLAY,
    CMD_CHECK,
    CMD_HELP,
    CMD_VERSION
} Command;

/* What happens to the later events of an aggregate whose event was dead-lettered. */
typedef enum {
    POISON_HOLD, /* they wait until the dead event is requeued and sent (order is kept) */
    POISON_SKIP, /* they go on; the dead event stays in the table (and the dead-letter topic) */
} PoisonPolicy;

/* What the relay does with a row once Kafka acknowledged it. */
typedef enum {
    ON_SENT_MARK,   /* set sent_at: the row stays, as history, until --retention deletes it */
    ON_SENT_DELETE, /* delete it: drains 1.5-1.8 times as fast (docs/benchmarks.md), no history */
} OnSent;

/* How far per-aggregate order reaches, which decides the topic templates allowed. */
typedef enum {
    ORDER_PER_AGGREGATE, /* all of an aggregate's events, in one topic: no {event_type} */
    ORDER_PER_TOPIC,     /* an aggregate's events within each topic: {event_type} allowed */
    ORDER_PER_PARTITION, /* within each topic and partition: a partition column allowed */
} OrderScope;

/* What a message looks like besides its value (the payload) and key (the aggregate id). */
typedef enum {
    FORMAT_RELAY,       /* the headers id (event id), event_type, aggregate_type, the row's own */
    FORMAT_CLOUDEVENTS, /* those, plus CloudEvents' ce_ attributes (route_cloudevents_add) */
} MessageFormat;

/* The message value: the payload as it is, or encoded by a Schema Registry's schema. */
typedef enum {
    VALUE_JSON,        /* the payload column's text (or bytes): no registry */
    VALUE_AVRO,        /* Confluent wire format, Avro binary (relay/io/serializer.h) */
    VALUE_JSON_SCHEMA, /* Confluent wire format, JSON text checked by a JSON Schema */
} ValueFormat;

/* How a message's Schema Registry subject is named (Confluent's strategies). */
typedef enum {
    SUBJECT_TOPIC,        /* TopicNameStrategy: <topic>-value */
    SUBJECT_RECORD,       /* RecordNameStrategy: <event type> */
    SUBJECT_TOPIC_RECORD, /* TopicRecordNameStrategy: <topic>-<event type> */
} SubjectStrategy;

typedef struct Config {
    Command command;
    char *database_url; /* from --database-url, DATABASE_URL or the file of database-url-file */
    char *database_url_file;
    char *brokers;
    char *config_file;
    long batch_size;
    long batch_bytes;  /* payload bytes a claim may return (the first row always) */
    long sessions;     /* claim sessions at most, each a lane member while it claims */
    long min_sessions; /* sessions that always claim; the rest only while there is a backlog */
    long session_rest_after_ms; /* no full claim for this long: the rest give their lanes back */
    char *topic_template;
    char *schema; /* --schema: every connection's search_path is pg_catalog, schema, pg_temp */
    /* The outbox table and its columns as configured (NULL: the layout's default)... */
    char *table;
    TableLayout layout;
    char *seq_column, *event_id_column, *aggregate_type_column, *aggregate_id_column,
        *event_type_column, *payload_column, *headers_column, *additional_fields, *timestamp_column;
    int payload_binary; /* --payload-format: 0 text, 1 binary (a bytea column, byte for byte) */
    bool tombstone_on_empty_payload; /* a NULL or blank payload goes out as a tombstone */
    TableMap map;                    /* ...and resolved: what every statement is written for */
    OptList kafka; /* librdkafka properties, passed through as given (validated by librdkafka at
                    * start-up), in order: config file entries, --kafka-file lines, flags */
    size_t kafka_from_file; /* of kafka, the config file's entries (--kafka-file goes after) */
    /* The --kafka-file entries, after the config file's: how many, and the line of each (so an
     * error about one names its line, config_kafka_origin). */
    size_t kafka_file_entries;
    int *kafka_file_lines;
    char *kafka_file;
    char *kafka_allow_unsafe; /* --kafka-allow-unsafe: guarded properties allowed (kafka_guard.h) */
    bool require_tls;         /* --require-tls: unverified remote connections are an error */
    LogLevel log_level;
    LogFormat log_format; /* --log-format: text (logfmt) or json */
    long poll_interval_ms;
    long shutdown_timeout_ms;
    long delivery_timeout_ms;
    long session_timeout_ms; /* a silent relay's session ends within this (relay/io/pg.h) */
    long rebalance_interval_ms;
    long kafka_away_after; /* delivery timeouts in a row before the lanes go to peers; 0: never */
    long busy_poll_interval_ms;
    long sleep_after_ms;
    long max_attempts;
    long retry_backoff_ms;
    long retry_backoff_max_ms;
    PoisonPolicy on_poison;
    OnSent on_sent;
    int claim_floor; /* --claim-floor: 1 on, 0 off (relay/engine/floor.h) */
    OrderScope order_scope;
    char *dead_letter_topic; /* NULL: dead events are only kept in the table */
    char *metrics_listen;    /* HOST:PORT of the metrics and health endpoints, NULL: off */
    long retention_s;        /* delete sent rows older than this; 0: keep them forever */
    long horizon_warn_s;     /* log a snapshot holding back vacuum this long; 0: never */
    long connect_wait_s;     /* migrate: retry the first connection this long; 0: once */
    long migrate_timeout_s;  /* migrate: how long one statement may go unanswered */
    long id;                 /* requeue, purge-dead --id */
    bool all;                /* requeue, purge-dead --all */
    bool json;               /* dead, status, verify --json */
    /* Whether --id was given: an outbox id may be 0 or negative (as replay's --from-id), so the
     * value cannot say it. */
    bool id_set;
    MessageFormat message_format;
    ValueFormat value_format;         /* --value-format */
    char *schema_registry_url;        /* base URLs, comma-separated */
    char *schema_registry_auth_file;  /* USER:PASSWORD, a secret (CONFIG_AUTH_LINE_MAX) */
    char *schema_registry_ca_file;    /* PEM CA bundle for https */
    long schema_registry_timeout_ms;  /* bound on each registry request */
    long schema_registry_lookup_rate; /* requests/s for subjects without a schema (registry.h) */
    long schema_version;              /* 0: latest */
    SubjectStrategy subject_name_strategy;
    /* Hashes of what the registry's auth and CA files held when loaded (0: not read, as a pipe at
     * start-up): its client reads them once, so a reload must tell a file changed under the same
     * path (config_diff). Hashes, not copies: the auth file is a secret. */
    uint64_t schema_registry_auth_sum, schema_registry_ca_sum;
    char *ce_source;            /* CloudEvents source attribute */
    char *ce_content_type;      /* CloudEvents datacontenttype (the content-type header) */
    long verify_since_s;        /* verify --since: rows marked sent this far back */
    bool verify_from_beginning; /* verify --from-beginning: read the topics whole */
    bool verify_after_replay;   /* verify --after-replay: a later copy in place may judge a row */
    long verify_max_rows;       /* verify --max-rows: the most rows of a window it holds */
    /* replay (relay/cmd/replay.h): the selection (NULL or 0: not given) and how to run it */
    long replay_from_id, replay_to_id;
    /* Whether --from-id / --to-id were given: an outbox id may be 0 or negative (a sequence
     * started there, an adopted table's own ids), so the value cannot say it. */
    bool replay_from_id_set, replay_to_id_set;
    char *replay_sent_after, *replay_sent_before; /* timestamps, read by PostgreSQL */
    char *replay_aggregate_type, *replay_aggregate_id, *replay_event_type;
    char *replay_missing; /* file with `verify --json` output; "-": stdin */
    bool yes;             /* replay, purge-dead --all: --yes, no confirmation asked */
    long replay_batch_rows;
    bool dry_run; /* migrate and replay: --dry-run, say what would change and change nothing */
    /* migrate and check: --allow-newer-schema, a database a newer relay migrated is warned of,
     * not refused (a rollback) */
    bool allow_newer_schema;
    /* dead, requeue, purge-dead, status, check, verify, replay: --statement-timeout */
    long statement_timeout_s;
    /* Many databases (docs/operations.md#many-databases): --databases, the list as JSON text (an
     * array of objects: a name, a database URL or URL file, and per-database options); dbs, one
     * Config per entry (this one with the entry's options over it), built by config_load; the
     * selection of one by --database NAME for the commands; and, in a Config of dbs,
     * database_name, its entry's name (NULL in the one-database case). */
    char *databases;
    char *database;
    char *database_name;
    struct Config *dbs;
    int n_dbs;
} Config;

/* Databases one process serves at most: each costs its sessions' connections, a Kafka producer
 * (its threads) and its batches' memory (docs/operations.md#many-databases). */
#define CONFIG_MAX_DATABASES 100

/* Fills cfg from argv (argv[1] is the command), the environment and the config file named by
 * --config (or the installed service's files, config_set_installed_dir). On bad input returns false
 * with one line (no newline) in err naming the problem; cfg must still be released with
 * config_free. */
bool config_load(Config *cfg, int argc, char **argv, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* config_load for a reload (SIGHUP), which runs on the event loop: every file the configuration
 * names (--config, --database-url-file, --kafka-file, the registry's files, a list entry's
 * database-url-file) must be a regular file, opened without waiting; a FIFO or a device (which
 * start-up reads: a pipe from a secrets tool) is refused with one line in err, as bad input. */
bool config_load_reload(Config *cfg, int argc, char **argv, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* The directory of the installed service's files (default /etc/outbox-relay, as the package and
 * the unit have them). When `dead`, `requeue`, `purge-dead`, `status`, `verify` or `check` get no
 * database URL from anywhere and no --config, config_load takes DIR/relay.json as --config and
 * DIR/database-url as --database-url-file, each if readable, and logs that it did. For tests;
 * dir must outlive every later config_load. */
void config_set_installed_dir(const char *dir);

/* The configuration a command other than run works on: with --databases, the one --database
 * names (NULL with one line in err when none or an unknown one is named); without, cfg itself
 * (--database is then refused: there is nothing to pick from). Points into cfg. */
const Config *config_pick_database(const Config *cfg, char *err, size_t errlen);

/* Releases what config_load allocated; safe on a zeroed or partly loaded Config. */
void config_free(Config *cfg);

/* Where entry i of cfg->kafka came from, for an error about it, written to out: "--kafka KEY",
 * "kafka-file PATH line N: KEY" or "config file PATH: kafka KEY" (never the value: it may be a
 * secret). */
void config_kafka_origin(const Config *cfg, size_t i, char *out, size_t outlen);

/* Writes the usage text, generated from the option table: of the whole program, or with argv
 * naming a command ("outbox-relay run --help"), of that command and only the options it takes. */
void config_print_help(FILE *out, int argc, char **argv);

/* Writes the generated sections of the man page (roff), from the same table (opts_print_man). */
void config_print_man(FILE *out);

/* Writes the option table as tab-separated lines (opts_print_table), for docs/configuration.md. */
void config_print_table(FILE *out);

/* Writes the sample configuration the package ships as relay.json (systemd/relay.json, checked
 * against this by tests/it/setup/20_cli.sh): brokers and metrics-listen set, every other option a
 * key file may hold commented out (a # key) with its default and help text. */
void config_print_sample(FILE *out);

/* ---- reloading (SIGHUP) --------------------------------------------------------------------- */

/* True for the options a running relay takes over from a reloaded configuration. */
bool config_option_reloadable(const char *name);

/* Calls fn for every option whose value differs between the running and a freshly loaded
 * configuration, in table order, then for a registry auth or CA file whose content changed
 * under the same path (restart-only). Only option names are passed: values may be secrets. */
typedef void (*ConfigChangeFn)(const char *option, bool reloadable, void *arg);
void config_diff(const Config *running, const Config *fresh, ConfigChangeFn fn, void *arg);

/* Copies the values of the reloadable options from fresh into running; everything else keeps
 * its running value. */
void config_apply_reloadable(Config *running, const Config *fresh);

/* Registers every secret of a loaded configuration with lib/secrets.h: the database URL's
 * passwords (of every --databases entry too), the password in each Schema Registry URL's
 * USER:PASSWORD@ (as written, percent-encoded), and the values of sensitive librdkafka properties
 * (from --kafka, --kafka-file and the config file). Call it right after config_load, before
 * anything logs the configuration. */
void config_register_secrets(const Config *cfg);

/* Logs a warning for each secret-bearing file of cfg (the config file, --database-url-file,
 * --kafka-file, --schema-registry-auth-file) that its group or others may read: one holding a
 * registered secret (call after config_register_secrets), or for the auth file, one not empty.
 * Warned, not refused: the secret is already exposed, and refusing to start would turn that into an
 * outage at the next restart; the warning says how to fix it. */
void config_warn_loose_secret_files(const Config *cfg);

/* Overwrites, in place, the secrets on a parsed command line so /proc/PID/cmdline (ps, top, any
 * local user) no longer shows them (secrets_scrub_argv): the whole --database-url and --databases
 * values, the user info of each --schema-registry-url URL, the value of every --kafka KEY=VALUE
 * whose key is sensitive, and any registered secret elsewhere (call after
 * config_register_secrets). Each becomes "***" padded with NULs. Anything that parses the
 * command line again (a SIGHUP reload) must be given a copy taken before. */
void config_scrub_argv(int argc, char **argv);

#endif
