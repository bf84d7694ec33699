/* consumer-demo: a shipping service downstream of the order service.
 *
 *   consumer-demo [run] --database-url URL --brokers LIST --topic T --group G
 *   consumer-demo migrate --database-url URL
 *
 * Consumes OrderCreated events and creates one shipment per order, and OrderUpdated events that
 * bring it to a newer version of the order, exactly once per event id however often Kafka
 * delivers it (consumer.h). Bad input exits 2 with one line on stderr
 * before anything connects. */
#include <librdkafka/rdkafka.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "consumer.h"
#include "db.h"
#include "log.h"
#include "opts.h"
#include "rcache.h"
#include "secrets.h"

#ifndef OUTBOX_RELAY_VERSION
#define OUTBOX_RELAY_VERSION "dev"
#endif

#define EXIT_USAGE 2

extern const char consumer_schema_sql[];

enum { CMD_RUN, CMD_MIGRATE, CMD_HELP, CMD_VERSION };

typedef struct Options {
    char *database_url;
    char *brokers;
    char *topic;
    char *group;
    OptList kafka;
    char *health_file;
    long stats_interval;
    char *redis_url;
    long redis_timeout_ms;
    long redis_ttl;
    long dedupe_ttl;
    long sweep_interval;
    LogLevel log_level;
} Options;

#define F(f) offsetof(Options, f)
#define RUN (1u << CMD_RUN)
#define MIGRATE (1u << CMD_MIGRATE)

static const OptDef options[] = {
    {.name = "database-url",
     .type = OPT_STRING,
     .env = "DATABASE_URL",
     .offset = F(database_url),
     .commands = RUN | MIGRATE,
     .required = RUN | MIGRATE,
     .metavar = "URL",
     .help = "PostgreSQL connection string (URL or key=value form)"},
    {.name = "brokers",
     .type = OPT_STRING,
     .env = "KAFKA_BROKERS",
     .offset = F(brokers),
     .commands = RUN,
     .required = RUN,
     .metavar = "LIST",
     .help = "Kafka bootstrap servers, host:port[,host:port...]"},
    {.name = "topic",
     .type = OPT_STRING,
     .env = "TOPIC",
     .def = "outbox.event.order",
     .offset = F(topic),
     .commands = RUN,
     .metavar = "T",
     .help = "topic to consume (the relay's default topic for aggregate_type 'order')"},
    {.name = "group",
     .type = OPT_STRING,
     .env = "GROUP",
     .def = "consumer-demo",
     .offset = F(group),
     .commands = RUN,
     .metavar = "G",
     .help = "Kafka consumer group; instances of one group share the partitions"},
    {.name = "kafka",
     .type = OPT_LIST,
     .offset = F(kafka),
     .commands = RUN,
     .metavar = "KEY=VALUE",
     .help = "a librdkafka consumer property, repeatable"},
    {.name = "health-file",
     .type = OPT_STRING,
     .offset = F(health_file),
     .commands = RUN,
     .metavar = "PATH",
     .help = "touched every second while consuming works (for container health checks)"},
    {.name = "stats-interval",
     .type = OPT_INT,
     .def = "10",
     .min = 1,
     .max = 3600,
     .offset = F(stats_interval),
     .commands = RUN,
     .metavar = "SECONDS",
     .help = "how often the counters are logged, when they changed"},
    {.name = "redis-url",
     .type = OPT_STRING,
     .env = "REDIS_URL",
     .offset = F(redis_url),
     .commands = RUN,
     .metavar = "redis://HOST:PORT[/DB]",
     .help = "optional Redis in front of processed_events: ids of committed events, to skip "
             "duplicates without a transaction"},
    {.name = "redis-timeout-ms",
     .type = OPT_INT,
     .def = "100",
     .min = 1,
     .max = 10000,
     .offset = F(redis_timeout_ms),
     .commands = RUN,
     .metavar = "MS",
     .help = "bound on each Redis call; a slower Redis is treated as down"},
    {.name = "redis-ttl",
     .type = OPT_INT,
     .def = "86400",
     .min = 1,
     .max = 31536000,
     .offset = F(redis_ttl),
     .commands = RUN,
     .metavar = "SECONDS",
     .help = "how long Redis remembers a processed event id (keep it at most --dedupe-ttl)"},
    {.name = "dedupe-ttl",
     .type = OPT_INT,
     .def = "604800",
     .min = 60,
     .max = 315360000,
     .offset = F(dedupe_ttl),
     .commands = RUN,
     .metavar = "SECONDS",
     .help = "how long processed_events remembers an event id; keep it above the topic's retention "
             "(an older redelivery is applied again, a no-op for the versioned shipments)"},
    {.name = "sweep-interval",
     .type = OPT_INT,
     .def = "60",
     .min = 1,
     .max = 86400,
     .offset = F(sweep_interval),
     .commands = RUN,
     .metavar = "SECONDS",
     .help = "how often expired processed_events rows are deleted (a backlog continues at once)"},
    {.name = "log-level",
     .type = OPT_LOG_LEVEL,
     .def = "info",
     .offset = F(log_level),
     .commands = RUN | MIGRATE,
     .metavar = "LEVEL",
     .help = "debug, info, warn or error"},
};

static const CmdDef commands[] = {
    {"run", CMD_RUN, "consume until SIGTERM or SIGINT (the default command)"},
    {"migrate", CMD_MIGRATE,
     "create the demo tables (processed_events, shipments, parked_messages), then exit"},
    {"help", CMD_HELP, "show this help (also --help, -h)"},
    {"version", CMD_VERSION, "show the version (also --version)"},
};

static const OptSpec spec = {
    .prog = "consumer-demo",
    .summary =
        "A shipping service: consumes OrderCreated/OrderUpdated events and keeps one shipment per\n"
        "order at the order's newest version,\n"
        "deduplicating on the event's id header in the same transaction as the shipment.",
    .cmds = commands,
    .ncmds = sizeof(commands) / sizeof(commands[0]),
    .default_cmd = CMD_RUN,
    .help_cmd = CMD_HELP,
    .version_cmd = CMD_VERSION,
    .opts = options,
    .nopts = sizeof(options) / sizeof(options[0]),
};

static volatile sig_atomic_t stop = 0;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

/* Prints one line of bad input, scrubbed of the registered secrets (libpq's and librdkafka's
 * errors may echo a value), and returns the usage exit status. */
static int usage_error(const char *msg)
{
    char line[1024];
    snprintf(line, sizeof(line), "%s", msg);
    secrets_scrub(line);
    fprintf(stderr, "consumer-demo: %s\n", line);
    return EXIT_USAGE;
}

static int cmd_run(const Options *o)
{
    char err[600];
    ConsumerConfig cfg = {o->database_url,   o->brokers,    o->topic,
                          o->group,          &o->kafka,     o->health_file,
                          o->stats_interval, o->redis_url,  o->redis_timeout_ms,
                          o->redis_ttl,      o->dedupe_ttl, o->sweep_interval};
    char host[256];
    int port, db;
    /* librdkafka takes no user info in the broker list: it would try to resolve
     * "USER:PASSWORD@HOST" for ever, and its lines and ours ("consumer-demo running" brokers=)
     * would show the password, which is no registered secret. Not echoed: a ',' in the password
     * would split it over two entries. */
    if (strchr(o->brokers, '@'))
        return usage_error("--brokers: an entry holds user info ('@', not shown: it may hold a "
                           "password): the list is HOST:PORT[,...]; give the credentials as "
                           "--kafka sasl.username and --kafka sasl.password");
    if (!db_check_writer_conninfo(o->database_url, err, sizeof(err)) ||
        !consumer_check(&cfg, err, sizeof(err)) ||
        (o->redis_url &&
         !rcache_parse_url(o->redis_url, host, sizeof(host), &port, &db, err, sizeof(err))))
        return usage_error(err);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    return consumer_run(&cfg, &stop);
}

static int cmd_migrate(const Options *o)
{
    char err[300], q[400];
    if (!db_check_writer_conninfo(o->database_url, err, sizeof(err)))
        return usage_error(err);
    PGconn *conn = db_connect_once(o->database_url, "consumer-demo");
    if (!conn)
        return 1;
    DbError e;
    bool ok = db_apply_schema(conn, "consumer-demo", consumer_schema_sql, &e);
    if (!ok)
        log_error("cannot apply the schema", "error=%s",
                  log_quote(db_error_text(&e), q, sizeof(q)));
    PQfinish(conn);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    /* Before anything reads a password into memory: a core would hold it. */
    secrets_no_core_dumps();
    signal(SIGPIPE, SIG_IGN);
    /* Hidden: the generated sections of the man page, for tools/gen-man.sh. */
    if (argc == 2 && strcmp(argv[1], "--help-man") == 0) {
        opts_print_man(&spec, stdout);
        return 0;
    }
    Options o = {0};
    int cmd;
    char err[1024];
    if (!opts_parse(&spec, &o, &cmd, argc, argv, err, sizeof(err))) {
        opts_free(&spec, &o);
        return usage_error(err);
    }
    /* As the relay does (relay/main.c): from here on nothing the process writes may show a
     * password (log_write scrubs the registered ones), and ps or /proc/PID/cmdline, which every
     * local user may read, shows none: the connection strings go whole from argv, and a
     * sensitive --kafka property's value. */
    secrets_add_conninfo(o.database_url);
    secrets_add_conninfo(o.redis_url);
    for (size_t i = 0; i < o.kafka.len; i++)
        if (secrets_kafka_key_sensitive(o.kafka.items[i].key))
            secrets_add(o.kafka.items[i].value);
    static const char *const whole[] = {"database-url", "redis-url", NULL};
    secrets_scrub_argv(&spec, argc, argv, whole, NULL);
    log_set_level(o.log_level);
    /* As the relay says at start-up: masked in connection strings, but not scrubbed elsewhere. */
    log_warn_short_secrets(secrets_too_short());
    int rc = 0;
    switch (cmd) {
    case CMD_RUN:
        rc = cmd_run(&o);
        break;
    case CMD_MIGRATE:
        rc = cmd_migrate(&o);
        break;
    case CMD_HELP:
        opts_print_help(&spec, stdout);
        break;
    case CMD_VERSION:
        printf("consumer-demo %s (librdkafka %s, libpq %d)\n", OUTBOX_RELAY_VERSION,
               rd_kafka_version_str(), PQlibVersion());
        break;
    }
    opts_free(&spec, &o);
    return rc;
}
