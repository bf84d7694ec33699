#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "optval.h"
#include "secrets.h"

typedef enum { OPT_STRING, OPT_INT, OPT_CHOICE, OPT_BOOL, OPT_KAFKA, OPT_DURATION } OptType;

typedef struct OptionDef {
    const char *name; /* flag without "--"; also the config file key */
    OptType type;
    const char *env;            /* environment fallback, or NULL */
    const char *def;            /* default as text, or NULL for none */
    long min, max;              /* inclusive range of an OPT_INT */
    const char *const *choices; /* NULL-terminated names of an OPT_CHOICE, stored as int index */
    size_t offset;              /* field in Config */
    const char *metavar;        /* placeholder shown in --help */
    const char *help;
} OptionDef;

#define FIELD(f) offsetof(Config, f)

/* Choice fields are stored as int; the enums behind them must be int-sized. */
_Static_assert(sizeof(LogLevel) == sizeof(int), "LogLevel stored as int");
_Static_assert(sizeof(PoisonPolicy) == sizeof(int), "PoisonPolicy stored as int");
_Static_assert(sizeof(TableLayout) == sizeof(int), "TableLayout stored as int");
_Static_assert(sizeof(OnSent) == sizeof(int), "OnSent stored as int");
_Static_assert(sizeof(OrderScope) == sizeof(int), "OrderScope stored as int");

static const char *const log_levels[] = {"debug", "info", "warn", "error", NULL};
static const char *const poison_policies[] = {"hold", "skip", NULL};
static const char *const on_sent_actions[] = {"mark", "delete", NULL};  /* in OnSent order */
static const char *const layouts[] = {"relay", "debezium", NULL};       /* in TableLayout order */
static const char *const order_scopes[] = {"aggregate", "topic", NULL}; /* in OrderScope order */

static const OptionDef options[] = {
    {"database-url", OPT_STRING, "DATABASE_URL", NULL, 0, 0, NULL, FIELD(database_url), "URL",
     "PostgreSQL connection string (URL or key=value form); required"},
    {"database-url-file", OPT_STRING, "DATABASE_URL_FILE", NULL, 0, 0, NULL,
     FIELD(database_url_file), "PATH",
     "read the database URL from this file instead (its content, trailing newline removed)"},
    {"brokers", OPT_STRING, "KAFKA_BROKERS", NULL, 0, 0, NULL, FIELD(brokers), "LIST",
     "Kafka bootstrap servers, host:port[,host:port...]; required by run"},
    {"config", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(config_file), "FILE",
     "JSON config file: an object whose keys are these option names"},
    {"batch-bytes", OPT_INT, NULL, "8388608", 65536, 1073741824, NULL, FIELD(batch_bytes), "BYTES",
     "payload bytes one claim may hold (a larger row still goes alone); bounds memory"},
    {"batch-size", OPT_INT, NULL, "1000", 1, 100000, NULL, FIELD(batch_size), "N",
     "rows claimed per transaction (1-100000)"},
    {"sessions", OPT_INT, NULL, "2", 1, 8, NULL, FIELD(sessions), "N",
     "claim sessions (PostgreSQL connections) per relay: one claims while another waits for Kafka"},
    {"topic-template", OPT_STRING, NULL, "outbox.event.{aggregate_type}", 0, 0, NULL,
     FIELD(topic_template), "TEMPLATE",
     "Kafka topic per row; {aggregate_type} (or ${routedByValue}) and {event_type} are "
     "replaced [Debezium: route.topic.replacement]"},
    {"table", OPT_STRING, NULL, "outbox", 0, 0, NULL, FIELD(table), "[SCHEMA.]NAME",
     "the outbox table; another than the relay's own needs `migrate` with the same options"},
    {"layout", OPT_CHOICE, NULL, "relay", 0, 0, layouts, FIELD(layout), "LAYOUT",
     "default column names: relay (id, event_id, aggregate_type, aggregate_id, event_type, "
     "payload, headers) or debezium (seq, id, aggregatetype, aggregateid, type, payload)"},
    {"seq-column", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(seq_column), "COLUMN",
     "bigint column giving the order events go out in (migrate adds it when missing)"},
    {"event-id-column", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(event_id_column), "COLUMN",
     "unique event id, sent as header id [Debezium: table.field.event.id]"},
    {"aggregate-type-column", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(aggregate_type_column),
     "COLUMN", "routes the event to its topic [Debezium: route.by.field]"},
    {"aggregate-id-column", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(aggregate_id_column),
     "COLUMN", "the message key [Debezium: table.field.event.key]"},
    {"event-type-column", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(event_type_column), "COLUMN",
     "the event type, for {event_type} [Debezium: table.field.event.type]"},
    {"payload-column", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(payload_column), "COLUMN",
     "the message value: jsonb, json or text [Debezium: table.field.event.payload]"},
    {"headers-column", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(headers_column), "COLUMN",
     "jsonb object of extra headers per row, or none (default: headers; debezium: none)"},
    {"additional-fields", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(additional_fields),
     "COL:header[:NAME],...",
     "columns sent as headers too [Debezium: table.fields.additional.placement]"},
    {"kafka", OPT_KAFKA, NULL, NULL, 0, 0, NULL, FIELD(kafka), "KEY=VALUE",
     "librdkafka producer property, repeatable (in a config file: an object)"},
    {"kafka-file", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(kafka_file), "PATH",
     "librdkafka properties from a file, KEY=VALUE per line, # comments (e.g. SASL secrets)"},
    {"log-level", OPT_CHOICE, NULL, "info", 0, 0, log_levels, FIELD(log_level), "LEVEL",
     "debug, info, warn or error"},
    {"poll-interval", OPT_INT, NULL, "1000", 1, 3600000, NULL, FIELD(poll_interval_ms), "MS",
     "fallback poll when no wakeup arrives, in milliseconds"},
    {"delivery-timeout", OPT_INT, NULL, "30000", 100, 3600000, NULL, FIELD(delivery_timeout_ms),
     "MS",
     "how long a batch waits for acknowledgements before cancelling the rest (retried later)"},
    {"session-timeout", OPT_INT, NULL, "15000", 1000, 3600000, NULL, FIELD(session_timeout_ms),
     "MS",
     "a relay that stops talking (frozen, cut off) loses its PostgreSQL session and lanes within "
     "this; also the deadline of every round trip to PostgreSQL. Lower: faster takeover; a "
     "statement slower than this is given up and retried"},
    {"shutdown-timeout", OPT_INT, NULL, "10000", 0, 3600000, NULL, FIELD(shutdown_timeout_ms), "MS",
     "on SIGTERM/SIGINT, how long to wait for in-flight acknowledgements"},
    {"busy-poll-interval", OPT_INT, NULL, "2", 1, 1000, NULL, FIELD(busy_poll_interval_ms), "MS",
     "when producers are mid-transaction as the relay runs out of work, check again after this"},
    {"sleep-after", OPT_INT, NULL, "50", 0, 60000, NULL, FIELD(sleep_after_ms), "MS",
     "stay awake polling this long after the last row before sleeping (waiting for NOTIFY)"},
    {"rebalance-interval", OPT_INT, NULL, "1000", 100, 60000, NULL, FIELD(rebalance_interval_ms),
     "MS", "how often lanes are re-divided among the running relays"},
    {"max-attempts", OPT_INT, NULL, "10", 1, 1000, NULL, FIELD(max_attempts), "N",
     "permanent failures (rejections) of one event before it is dead-lettered"},
    {"retry-backoff", OPT_INT, NULL, "5000", 10, 3600000, NULL, FIELD(retry_backoff_ms), "MS",
     "first wait before retrying a rejected event; doubles per rejection"},
    {"retry-backoff-max", OPT_INT, NULL, "600000", 10, 86400000, NULL, FIELD(retry_backoff_max_ms),
     "MS", "cap on the wait between retries of one event"},
    {"on-poison", OPT_CHOICE, NULL, "hold", 0, 0, poison_policies, FIELD(on_poison), "POLICY",
     "hold: later events of a dead-lettered event's aggregate wait for it; skip: they go on"},
    {"on-sent", OPT_CHOICE, NULL, "mark", 0, 0, on_sent_actions, FIELD(on_sent), "ACTION",
     "a delivered row: mark sets its sent_at (kept until --retention); delete removes it"},
    {"order-scope", OPT_CHOICE, NULL, "aggregate", 0, 0, order_scopes, FIELD(order_scope), "SCOPE",
     "aggregate: all of an aggregate's events stay in order, so the topic template may not use "
     "{event_type}; topic: order holds per aggregate within each topic only"},
    {"dead-letter-topic", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(dead_letter_topic), "TOPIC",
     "also publish dead-lettered events here, with the error in headers (default: none)"},
    {"metrics-listen", OPT_STRING, NULL, NULL, 0, 0, NULL, FIELD(metrics_listen), "HOST:PORT",
     "serve /metrics, /healthz and /readyz over HTTP here, e.g. 127.0.0.1:9187 (default: off)"},
    {"retention", OPT_DURATION, NULL, "off", 0, 0, NULL, FIELD(retention_s), "DURATION",
     "delete sent rows older than this, e.g. 72h, 30m, 90s; 0 or off keeps them forever"},
    {"horizon-warn", OPT_DURATION, NULL, "5m", 0, 0, NULL, FIELD(horizon_warn_s), "DURATION",
     "with --metrics-listen: log when one snapshot has held back vacuum this long; 0 or off: "
     "never"},
    {"id", OPT_INT, NULL, NULL, 1, LONG_MAX, NULL, FIELD(id), "ID",
     "requeue, purge-dead: the outbox id of one dead-lettered event"},
    {"all", OPT_BOOL, NULL, NULL, 0, 0, NULL, FIELD(all), "",
     "requeue, purge-dead: every dead-lettered event"},
    {"json", OPT_BOOL, NULL, NULL, 0, 0, NULL, FIELD(json), "", "dead, status: print JSON"},
};

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* Debezium's Outbox Event Router option names, accepted for the options they mean (as flags
 * and config file keys), so a connector's settings carry over. */
static const struct {
    const char *alias;
    const char *name;
} aliases[] = {
    {"table.field.event.id", "event-id-column"},
    {"table.field.event.key", "aggregate-id-column"},
    {"table.field.event.type", "event-type-column"},
    {"table.field.event.payload", "payload-column"},
    {"route.by.field", "aggregate-type-column"},
    {"route.topic.replacement", "topic-template"},
    {"table.fields.additional.placement", "additional-fields"},
};

/* What a running relay takes over on SIGHUP: values it reads afresh each time it uses them. The
 * rest is built into state at start-up (timers, the producer, the claim statement, the
 * connection) or changes what rows mean half-way through (topics), and needs a restart. Only
 * number and choice options may be listed (config_apply_reloadable copies them by value). */
static const char *const reloadable[] = {"log-level",
                                         "batch-size",
                                         "batch-bytes",
                                         "retention",
                                         "delivery-timeout",
                                         "shutdown-timeout",
                                         "max-attempts",
                                         "retry-backoff",
                                         "retry-backoff-max",
                                         "busy-poll-interval",
                                         "sleep-after",
                                         "horizon-warn",
                                         NULL};

/* Where a value came from, in precedence order (0: not set). */
enum { LEVEL_UNSET, LEVEL_DEFAULT, LEVEL_FILE, LEVEL_ENV, LEVEL_FLAG };
static const char *const level_names[] = {"nowhere", "default", "the config file",
                                          "the environment", "flags"};

static const struct {
    const char *name;
    Command command;
    const char *help;
} commands[] = {
    {"run", CMD_RUN, "relay unsent outbox rows to Kafka until SIGTERM or SIGINT"},
    {"migrate", CMD_MIGRATE, "apply the embedded schema migrations, then exit"},
    {"dead", CMD_DEAD, "list dead-lettered events with their errors (--json for scripts)"},
    {"requeue", CMD_REQUEUE, "put dead-lettered events back in line (--id ID or --all)"},
    {"purge-dead", CMD_PURGE_DEAD, "delete dead-lettered events for good (--id ID or --all)"},
    {"status", CMD_STATUS, "backlog, oldest unsent event, dead events, throughput, active relays"},
    {"help", CMD_HELP, "show this help (also --help, -h)"},
    {"version", CMD_VERSION, "show the version (also --version)"},
};

static const OptionDef *find_option(const char *name, size_t len)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0)
            return &options[i];
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strlen(aliases[i].alias) == len && strncmp(aliases[i].alias, name, len) == 0)
            return find_option(aliases[i].name, strlen(aliases[i].name));
    return NULL;
}

bool config_parse_kafka_prop(const char *text, KafkaProp *out)
{
    const char *eq = strchr(text, '=');
    if (!eq || eq == text)
        return false;
    out->key = strndup(text, (size_t)(eq - text));
    out->value = strdup(eq + 1);
    return true;
}

bool config_parse_duration(const char *text, long *seconds)
{
    if (strcmp(text, "off") == 0 || strcmp(text, "0") == 0) {
        *seconds = 0;
        return true;
    }
    char *end;
    errno = 0;
    long n = strtol(text, &end, 10);
    if (end == text || *text == '-' || *text == '+' || errno != 0 || end[0] == '\0' ||
        end[1] != '\0')
        return false;
    long unit = end[0] == 's'   ? 1
                : end[0] == 'm' ? 60
                : end[0] == 'h' ? 3600
                : end[0] == 'd' ? 86400
                                : 0;
    if (unit == 0 || n > 3650L * 86400 / unit)
        return false;
    *seconds = n * unit;
    return true;
}

static void kafka_append(Config *cfg, KafkaProp prop)
{
    KafkaProp *grown = realloc(cfg->kafka, (cfg->kafka_len + 1) * sizeof(*grown));
    if (!grown) {
        perror("outbox-relay");
        exit(1);
    }
    cfg->kafka = grown;
    cfg->kafka[cfg->kafka_len++] = prop;
}

/* Stores one textual value into its Config field after checking type and range. `source` names
 * where the value came from ("--batch-size", "DATABASE_URL", "config file x.json: key ...") so
 * the error says exactly what to fix. */
static bool set_value(Config *cfg, const OptionDef *opt, const char *value, const char *source,
                      char *err, size_t errlen)
{
    void *field = (char *)cfg + opt->offset;
    switch (opt->type) {
    case OPT_STRING:
        return optval_string(field, value, source, err, errlen);
    case OPT_INT:
        return optval_long(field, value, opt->min, opt->max, source, err, errlen);
    case OPT_CHOICE: {
        char expected[128] = "";
        for (int i = 0; opt->choices[i]; i++) {
            if (strcmp(value, opt->choices[i]) == 0) {
                *(int *)field = i;
                return true;
            }
            snprintf(expected + strlen(expected), sizeof(expected) - strlen(expected), "%s%s",
                     i == 0                ? ""
                     : opt->choices[i + 1] ? ", "
                                           : " or ",
                     opt->choices[i]);
        }
        return optval_fail(err, errlen, "%s: expected %s, got '%s'", source, expected, value);
    }
    case OPT_BOOL:
        if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0)
            *(bool *)field = true;
        else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0)
            *(bool *)field = false;
        else
            return optval_fail(err, errlen, "%s: expected true or false, got '%s'", source, value);
        return true;
    case OPT_KAFKA: {
        KafkaProp prop;
        /* The text is not echoed: without its '=', a value cannot be told from its key, and
         * values may be secrets. */
        if (!config_parse_kafka_prop(value, &prop))
            return optval_fail(err, errlen, "%s: expected KEY=VALUE (a non-empty key, then '=')",
                               source);
        kafka_append(cfg, prop);
        return true;
    }
    case OPT_DURATION:
        if (!config_parse_duration(value, (long *)field))
            return optval_fail(
                err, errlen,
                "%s: expected a duration such as 90s, 30m, 72h or 7d (or 0/off), got '%s'", source,
                value);
        return true;
    }
    return optval_fail(err, errlen, "%s: unsupported option type", source);
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

static bool load_file(Config *cfg, const char *path, unsigned char *levels, char *err,
                      size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* jansson quotes the text "near" the error, which may be part of a secret value. */
        char *near = strstr(jerr.text, " near '");
        if (near)
            *near = '\0';
        if (jerr.line <= 0)
            return optval_fail(err, errlen, "config file %s: %s", path, jerr.text);
        return optval_fail(err, errlen, "config file %s: line %d column %d: %s", path, jerr.line,
                           jerr.column, jerr.text);
    }
    bool ok = true;
    if (!json_is_object(root)) {
        ok = optval_fail(err, errlen, "config file %s: expected a JSON object at the top level",
                         path);
        goto done;
    }

    const char *key;
    json_t *value;
    char source[512];
    json_object_foreach(root, key, value)
    {
        const OptionDef *opt = find_option(key, strlen(key));
        snprintf(source, sizeof(source), "config file %s: key \"%s\"", path, key);
        if (!opt || strcmp(key, "config") == 0) {
            ok = optval_fail(err, errlen, "config file %s: unknown key \"%s\"", path, key);
            goto done;
        }
        levels[opt - options] = LEVEL_FILE;
        if (opt->type == OPT_KAFKA) {
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
                kafka_append(cfg, (KafkaProp){strdup(pkey), text});
            }
            continue;
        }
        /* Integers must be JSON numbers or numeric strings; other scalars go in as text and
         * set_value checks them like a flag. */
        char *text = json_scalar_text(value);
        if (!text) {
            ok = optval_fail(err, errlen, "%s: expected a string or a number", source);
            goto done;
        }
        ok = set_value(cfg, opt, text, source, err, errlen);
        free(text);
        if (!ok)
            goto done;
    }
done:
    json_decref(root);
    return ok;
}

/* Reads a small text file whole. Returns NULL with one line in err. */
static char *read_text_file(const char *option, const char *path, char *err, size_t errlen)
{
    enum { MAX_SIZE = 1 << 20 };
    FILE *f = fopen(path, "r");
    if (!f) {
        optval_fail(err, errlen, "%s %s: %s", option, path, strerror(errno));
        return NULL;
    }
    char *text = malloc(MAX_SIZE + 1);
    size_t n = text ? fread(text, 1, MAX_SIZE + 1, f) : 0;
    bool failed = !text || ferror(f);
    int saved = errno;
    fclose(f);
    if (failed || n > MAX_SIZE) {
        free(text);
        optval_fail(err, errlen, "%s %s: %s", option, path,
                    failed ? strerror(saved) : "larger than 1 MiB");
        return NULL;
    }
    text[n] = '\0';
    if (strlen(text) != n) {
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
        free(text);
        return optval_fail(err, errlen, "database-url-file %s: %s (it must hold just the URL)",
                           cfg->database_url_file, why);
    }
    free(cfg->database_url);
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
    KafkaProp *props = NULL;
    size_t n = 0;
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
        KafkaProp *grown = realloc(props, (n + 1) * sizeof(*grown));
        if (!grown) {
            ok = optval_fail(err, errlen, "kafka-file %s: out of memory", cfg->kafka_file);
            break;
        }
        props = grown;
        props[n++] = (KafkaProp){strndup(line, (size_t)(key_end - line)), strdup(value)};
    }
    if (ok && n > 0) {
        KafkaProp *grown = realloc(cfg->kafka, (cfg->kafka_len + n) * sizeof(*grown));
        ok = grown != NULL;
        if (ok) {
            cfg->kafka = grown;
            memmove(cfg->kafka + at + n, cfg->kafka + at, (cfg->kafka_len - at) * sizeof(*grown));
            memcpy(cfg->kafka + at, props, n * sizeof(*props));
            cfg->kafka_len += n;
            n = 0;
        } else {
            optval_fail(err, errlen, "kafka-file %s: out of memory", cfg->kafka_file);
        }
    }
    for (size_t i = 0; i < n; i++) {
        free(props[i].key);
        free(props[i].value);
    }
    free(props);
    /* The buffer held the secrets too: clear it before it goes back to the allocator. */
    explicit_bzero(text, text_len);
    free(text);
    return ok;
}

/* database-url-file and database-url are two spellings of one setting: the one from the
 * stronger source wins, and both from the same source is a mistake worth stopping for. */
static bool read_secret_files(Config *cfg, const unsigned char *levels, size_t kafka_file_at,
                              char *err, size_t errlen)
{
    const OptionDef *url = find_option("database-url", strlen("database-url"));
    const OptionDef *url_file = find_option("database-url-file", strlen("database-url-file"));
    int l_url = levels[url - options], l_file = levels[url_file - options];
    if (l_file != LEVEL_UNSET && l_file == l_url)
        return optval_fail(err, errlen,
                           "database-url and database-url-file are both set by %s: use one",
                           level_names[l_file]);
    if (l_file > l_url && !read_database_url_file(cfg, err, errlen))
        return false;
    if (cfg->kafka_file && !read_kafka_file(cfg, kafka_file_at, err, errlen))
        return false;
    return true;
}

/* A flag given on the command line, kept until the file and environment are applied. */
typedef struct FlagValue {
    const OptionDef *opt;
    const char *value;
    const char *spelling; /* "--batch-size" as typed, for errors */
} FlagValue;

bool config_load(Config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->command = CMD_HELP;
    if (argc < 2)
        return optval_fail(err, errlen, "missing command: try 'outbox-relay --help'");

    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0)
        cmd = "help";
    else if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0)
        cmd = "version";
    bool known = false;
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        if (strcmp(cmd, commands[i].name) == 0) {
            cfg->command = commands[i].command;
            known = true;
        }
    }
    if (!known) {
        if (cmd[0] == '-')
            return optval_fail(err, errlen,
                               "expected a command before '%s': try 'outbox-relay --help'", cmd);
        return optval_fail(err, errlen, "unknown command '%s': try 'outbox-relay --help'", cmd);
    }

    /* Pass 1: collect flags. They are applied last so that they win. */
    FlagValue *flags = calloc((size_t)argc, sizeof(*flags));
    size_t n_flags = 0;
    bool ok = true;
    if (!flags) {
        perror("outbox-relay");
        exit(1);
    }
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            cfg->command = CMD_HELP;
            goto out;
        }
        if (strncmp(arg, "--", 2) != 0) {
            ok = optval_fail(err, errlen, "unexpected argument '%s': try 'outbox-relay --help'",
                             arg);
            goto out;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const OptionDef *opt = find_option(name, name_len);
        if (!opt) {
            ok = optval_fail(err, errlen, "unknown option '--%.*s': try 'outbox-relay --help'",
                             (int)name_len, name);
            goto out;
        }
        const char *value = eq ? eq + 1 : NULL;
        if (!value && opt->type == OPT_BOOL)
            value = "true"; /* a bare switch */
        if (!value) {
            if (i + 1 >= argc) {
                ok = optval_fail(err, errlen, "option --%s needs a value (%s)", opt->name,
                                 opt->metavar);
                goto out;
            }
            value = argv[++i];
        }
        flags[n_flags++] = (FlagValue){opt, value, arg};
    }

    /* Pass 2: defaults, then the file, then the environment, then the flags. */
    unsigned char levels[N_OPTIONS] = {0};
    for (size_t i = 0; i < N_OPTIONS && ok; i++) {
        if (options[i].def)
            ok = set_value(cfg, &options[i], options[i].def, "default", err, errlen);
        levels[i] = options[i].def ? LEVEL_DEFAULT : LEVEL_UNSET;
    }

    const char *config_path = NULL;
    for (size_t i = 0; i < n_flags; i++)
        if (strcmp(flags[i].opt->name, "config") == 0)
            config_path = flags[i].value;
    if (ok && config_path)
        ok = load_file(cfg, config_path, levels, err, errlen);
    size_t kafka_file_at = cfg->kafka_len; /* --kafka-file lines go after the file's entries */

    for (size_t i = 0; i < N_OPTIONS && ok; i++) {
        const char *env = options[i].env ? getenv(options[i].env) : NULL;
        if (env && *env) {
            ok = set_value(cfg, &options[i], env, options[i].env, err, errlen);
            levels[i] = LEVEL_ENV;
        }
    }

    for (size_t i = 0; i < n_flags && ok; i++) {
        char source[128];
        snprintf(source, sizeof(source), "--%s", flags[i].opt->name);
        ok = set_value(cfg, flags[i].opt, flags[i].value, source, err, errlen);
        levels[flags[i].opt - options] = LEVEL_FLAG;
    }
    if (ok && cfg->command != CMD_HELP && cfg->command != CMD_VERSION)
        ok = read_secret_files(cfg, levels, kafka_file_at, err, errlen);
    if (!ok)
        goto out;

    if (cfg->command != CMD_HELP && cfg->command != CMD_VERSION && !cfg->database_url) {
        ok = optval_fail(err, errlen,
                         "missing database URL: pass --database-url or set DATABASE_URL");
        goto out;
    }
    TableOptions table = {cfg->layout,
                          cfg->table,
                          cfg->seq_column,
                          cfg->event_id_column,
                          cfg->aggregate_type_column,
                          cfg->aggregate_id_column,
                          cfg->event_type_column,
                          cfg->payload_column,
                          cfg->headers_column,
                          cfg->additional_fields};
    if (!table_map_init(&cfg->map, &table, err, errlen))
        ok = false;
    else if (cfg->command == CMD_RUN && !cfg->brokers)
        ok = optval_fail(err, errlen, "missing Kafka brokers: pass --brokers or set KAFKA_BROKERS");
    else if (cfg->command == CMD_RUN && cfg->retry_backoff_max_ms < cfg->retry_backoff_ms)
        ok = optval_fail(err, errlen,
                         "--retry-backoff-max (%ld) must not be below --retry-backoff (%ld)",
                         cfg->retry_backoff_max_ms, cfg->retry_backoff_ms);
    else if (cfg->command == CMD_REQUEUE && (cfg->id > 0) == cfg->all)
        ok = optval_fail(err, errlen, "requeue needs exactly one of --id ID or --all");
    else if (cfg->command == CMD_PURGE_DEAD && (cfg->id > 0) == cfg->all)
        ok = optval_fail(err, errlen, "purge-dead needs exactly one of --id ID or --all");
out:
    free(flags);
    return ok;
}

void config_free(Config *cfg)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (options[i].type == OPT_STRING) {
            char **slot = (char **)((char *)cfg + options[i].offset);
            free(*slot);
            *slot = NULL;
        }
    for (size_t i = 0; i < cfg->kafka_len; i++) {
        free(cfg->kafka[i].key);
        free(cfg->kafka[i].value);
    }
    free(cfg->kafka);
    cfg->kafka = NULL;
    cfg->kafka_len = 0;
    table_map_free(&cfg->map);
}

void config_print_help(FILE *out)
{
    fprintf(out, "Usage: outbox-relay COMMAND [OPTIONS]\n\n"
                 "Moves rows from a PostgreSQL outbox table to Kafka, at least once, in order per\n"
                 "aggregate.\n\nCommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\nOptions (precedence: flag > environment > config file > default):\n");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const OptionDef *o = &options[i];
        char lhs[64];
        snprintf(lhs, sizeof(lhs), "--%s %s", o->name, o->metavar);
        fprintf(out, "  %-28s %s", lhs, o->help);
        if (o->env)
            fprintf(out, " [env %s]", o->env);
        if (o->def)
            fprintf(out, " [default %s]", o->def);
        if (config_option_reloadable(o->name))
            fprintf(out, " [SIGHUP]");
        fputc('\n', out);
    }
    fprintf(out,
            "\nOptions marked [SIGHUP] take effect when a running relay gets SIGHUP (it re-reads\n"
            "the config file and environment); other changes need a restart.\n"
            "Exit status: 0 on success, 1 on a runtime failure, 2 on bad input.\n");
}

bool config_option_reloadable(const char *name)
{
    for (size_t i = 0; reloadable[i]; i++)
        if (strcmp(reloadable[i], name) == 0)
            return true;
    return false;
}

static bool same_string(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static bool same_value(const OptionDef *o, const Config *a, const Config *b)
{
    const void *fa = (const char *)a + o->offset, *fb = (const char *)b + o->offset;
    switch (o->type) {
    case OPT_STRING:
        return same_string(*(char *const *)fa, *(char *const *)fb);
    case OPT_INT:
    case OPT_DURATION:
        return *(const long *)fa == *(const long *)fb;
    case OPT_CHOICE:
        return *(const int *)fa == *(const int *)fb;
    case OPT_BOOL:
        return *(const bool *)fa == *(const bool *)fb;
    case OPT_KAFKA:
        if (a->kafka_len != b->kafka_len)
            return false;
        for (size_t i = 0; i < a->kafka_len; i++)
            if (!same_string(a->kafka[i].key, b->kafka[i].key) ||
                !same_string(a->kafka[i].value, b->kafka[i].value))
                return false;
        return true;
    }
    return false;
}

void config_diff(const Config *running, const Config *fresh, ConfigChangeFn fn, void *arg)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!same_value(&options[i], running, fresh))
            fn(options[i].name, config_option_reloadable(options[i].name), arg);
}

void config_apply_reloadable(Config *running, const Config *fresh)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const OptionDef *o = &options[i];
        if (!config_option_reloadable(o->name))
            continue;
        void *to = (char *)running + o->offset;
        const void *from = (const char *)fresh + o->offset;
        switch (o->type) {
        case OPT_INT:
        case OPT_DURATION:
            *(long *)to = *(const long *)from;
            break;
        case OPT_CHOICE:
            *(int *)to = *(const int *)from;
            break;
        case OPT_BOOL:
            *(bool *)to = *(const bool *)from;
            break;
        case OPT_STRING:
        case OPT_KAFKA:
            break; /* never reloadable: see the list above */
        }
    }
}

void config_register_secrets(const Config *cfg)
{
    secrets_add_conninfo(cfg->database_url);
    for (size_t i = 0; i < cfg->kafka_len; i++)
        if (secrets_kafka_key_sensitive(cfg->kafka[i].key))
            secrets_add(cfg->kafka[i].value);
}
