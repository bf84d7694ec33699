/* outbox-relay: command line entry point. Parses the configuration, checks everything that can
 * be checked before touching the network (so bad input fails fast with exit status 2), then runs
 * the requested command. */
#include <ev.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "config.h"
#include "kafka.h"
#include "log.h"
#include "migrate.h"
#include "relay.h"
#include "route.h"

#ifndef OUTBOX_RELAY_VERSION
#define OUTBOX_RELAY_VERSION "dev"
#endif

#define EXIT_USAGE 2

/* Prints one line for bad input and returns the usage exit status. */
static int usage_error(const char *msg)
{
    fprintf(stderr, "outbox-relay: %s\n", msg);
    return EXIT_USAGE;
}

/* libpq accepts the connection string lazily; parse it now so a typo fails at start-up. The
 * message never echoes the string itself: it may hold a password. */
static bool check_conninfo(const char *conninfo, char *err, size_t errlen)
{
    char *why = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &why);
    if (!opts) {
        snprintf(err, errlen, "--database-url: invalid connection string: %s",
                 why ? strtok(why, "\n") : "out of memory");
        PQfreemem(why);
        return false;
    }
    PQconninfoFree(opts);
    return true;
}

static int cmd_run(const Config *cfg)
{
    char err[1024];
    if (!check_conninfo(cfg->database_url, err, sizeof(err)) ||
        !route_template_check(cfg->topic_template, err, sizeof(err)) ||
        (cfg->dead_letter_topic &&
         !route_topic_name_check("--dead-letter-topic", cfg->dead_letter_topic, err, sizeof(err))))
        return usage_error(err);
    rd_kafka_conf_t *kconf = kafka_conf_build(cfg, err, sizeof(err));
    if (!kconf)
        return usage_error(err);

    struct ev_loop *loop = ev_default_loop(EVFLAG_AUTO);
    Relay *relay = relay_new(loop, cfg, kconf, err, sizeof(err));
    if (!relay)
        return usage_error(err);

    char masked[1024], q1[1100], q2[600], q3[300];
    log_info(
        "outbox-relay starting",
        "version=%s database=%s brokers=%s topic_template=%s batch_size=%ld", OUTBOX_RELAY_VERSION,
        log_quote(log_mask_conninfo(cfg->database_url, masked, sizeof(masked)), q1, sizeof(q1)),
        log_quote(cfg->brokers, q2, sizeof(q2)), log_quote(cfg->topic_template, q3, sizeof(q3)),
        cfg->batch_size);
    int rc = relay_run(relay);
    relay_free(relay);
    ev_loop_destroy(loop);
    return rc;
}

static int cmd_migrate(const Config *cfg)
{
    char err[1024];
    if (!check_conninfo(cfg->database_url, err, sizeof(err)))
        return usage_error(err);
    return migrate_run(cfg->database_url);
}

int main(int argc, char **argv)
{
    /* A peer closing a socket must surface as an error return, not kill the process. */
    signal(SIGPIPE, SIG_IGN);

    Config cfg;
    char err[1024];
    if (!config_load(&cfg, argc, argv, err, sizeof(err))) {
        config_free(&cfg);
        return usage_error(err);
    }
    log_set_level(cfg.log_level);

    int rc = 0;
    switch (cfg.command) {
    case CMD_HELP:
        config_print_help(stdout);
        break;
    case CMD_VERSION:
        printf("outbox-relay %s (librdkafka %s, libpq %d)\n", OUTBOX_RELAY_VERSION,
               rd_kafka_version_str(), PQlibVersion());
        break;
    case CMD_RUN:
        rc = cmd_run(&cfg);
        break;
    case CMD_MIGRATE:
        rc = cmd_migrate(&cfg);
        break;
    case CMD_DEAD:
    case CMD_REQUEUE: {
        if (!check_conninfo(cfg.database_url, err, sizeof(err))) {
            rc = usage_error(err);
            break;
        }
        rc = cfg.command == CMD_DEAD ? admin_dead(&cfg) : admin_requeue(&cfg);
        break;
    }
    }
    config_free(&cfg);
    return rc;
}
