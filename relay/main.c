/* outbox-relay: command line entry point. Parses the configuration, checks everything that can
 * be checked before touching the network (so bad input fails fast with exit status 2), then runs
 * the requested command. */
#include <errno.h>
#include <ev.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "addr.h"
#include "admin.h"
#include "check.h"
#include "config.h"
#include "databases.h"
#include "db.h"
#include "kafka.h"
#include "log.h"
#include "http.h"
#include "migrate.h"
#include "monotime.h"
#include "ops.h"
#include "pg.h"
#include "relay.h"
#include "sdnotify.h"
#include "secrets.h"
#include "status.h"
#include "tls_report.h"
#include "replay.h"
#include "route.h"
#include "verify.h"

#ifndef OUTBOX_RELAY_VERSION
#define OUTBOX_RELAY_VERSION "dev"
#endif

#define EXIT_USAGE 2

/* Prints one line (secrets scrubbed: libpq and librdkafka may echo values; and kept one line
 * for every reader and terminal: the values may come from a file or the server) and returns
 * status. */
static int error_line(const char *msg, int status)
{
    char line[1024];
    snprintf(line, sizeof(line), "%s", msg);
    secrets_scrub(line);
    log_one_line(line);
    fprintf(stderr, "outbox-relay: %s\n", line);
    return status;
}

/* Prints one line for bad input and returns the usage exit status. */
static int usage_error(const char *msg)
{
    return error_line(msg, EXIT_USAGE);
}

/* What run checks before touching the network, shared with check (which must refuse what run
 * refuses, with the same exit status). libpq accepts the connection string lazily; parse it now so
 * a typo fails at start-up. The message never echoes the string itself: it may hold a password.
 * Returns the producer configuration, or NULL after printing the one line of bad input (*status
 * EXIT_USAGE) or of a runtime failure (*status 1: no thread for the trial producer). */
/* How long a run's exit waits, in all, for the Kafka producers still being destroyed off the
 * loop (kafka.h): rd_kafka_destroy waits for its broker threads, and one in a name lookup that
 * never answers, or a connection attempt, holds it up for as long, which held the exit past
 * systemd's TimeoutStopSec= (45 s; the stop itself may take 40 s). What they still held was
 * purged: the rows not marked stay unsent, to go out again (at least once). */
#define EXIT_PRODUCERS_WAIT_MS 3000

/* Waits for those producers, up to EXIT_PRODUCERS_WAIT_MS from its first call in all (it is
 * called on every way out of run). Returns whether none is left; says so once when some are. */
static bool producers_gone(void)
{
    static double deadline;
    static bool said;
    if (deadline == 0)
        deadline = monotime_now() + EXIT_PRODUCERS_WAIT_MS / 1000.0;
    double left = deadline - monotime_now();
    int n = kafka_retired_wait(left > 0 ? (int)(left * 1000) : 0);
    if (n > 0 && !said) {
        log_warn("exiting without waiting for old Kafka producers still being destroyed (a "
                 "broker thread stuck in a name lookup or a connection attempt); the rows not "
                 "marked stay unsent and go out again",
                 "producers=%d waited_ms=%d", n, EXIT_PRODUCERS_WAIT_MS);
        said = true;
    }
    return n == 0;
}

static rd_kafka_conf_t *run_input(Config *cfg, int *status)
{
    char err[1024], host[256];
    unsigned port;
    rd_kafka_conf_t *kconf = NULL;
    bool runtime = false;
    bool dbs_ok = true;
    for (int i = 0; dbs_ok && i < cfg->n_dbs; i++)
        dbs_ok = databases_entry_check(&cfg->dbs[i], err, sizeof(err));
    if (!dbs_ok || (!cfg->n_dbs && !databases_entry_check(cfg, err, sizeof(err))) ||
        (cfg->metrics_listen && !addr_parse_host_port("--metrics-listen", cfg->metrics_listen, host,
                                                      sizeof(host), &port, err, sizeof(err))))
        goto bad;
    kconf = kafka_conf_build(cfg, &runtime, err, sizeof(err));
    /* With --require-tls, nothing connects unprotected: checked before the producer exists
     * (librdkafka connects as soon as it does); with several databases, for each of them by
     * databases_entry_check. */
    if (!kconf || (!cfg->n_dbs && !tls_report_require(cfg, cfg->require_tls, err, sizeof(err))))
        goto bad;
    return kconf;
bad:
    if (kconf)
        rd_kafka_conf_destroy(kconf);
    *status = error_line(err, runtime ? 1 : EXIT_USAGE);
    return NULL;
}

/* libev's answer to a failed system call (no descriptor left for its signal pipe, say) is
 * perror and abort(): a core-less crash with a line in no format of ours. A runtime failure, said
 * in one line, exit 1 (restarted by systemd). libev expects no return. */
static void on_ev_syserr(const char *msg)
{
    char line[300];
    snprintf(line, sizeof(line), "event loop: %s: %s", msg, strerror(errno));
    error_line(line, 1);
    _exit(1);
}

/* The process's event loop, or NULL after one line (ev_default_loop fails without epoll, select
 * or poll descriptors to spare). EVFLAG_NOENV: without it libev takes LIBEV_FLAGS from the
 * environment in place of these flags, and one inherited from a shell or a unit would pick the
 * backend (select, capped at FD_SETSIZE descriptors; 4.33's experimental linuxaio or io_uring) and
 * the signal mode (EVFLAG_SIGNALFD: signals blocked and read from a signalfd, a SIGHUP then fatal
 * to any thread that has it unblocked; EVFLAG_NOSIGMASK) the relay is neither written for nor
 * tested in. The registry's probe loop and check's loop pin it the same way. */
static struct ev_loop *default_loop(void)
{
    ev_set_syserr_cb(on_ev_syserr);
    struct ev_loop *loop = ev_default_loop(EVFLAG_AUTO | EVFLAG_NOENV);
    if (!loop)
        error_line("cannot create the event loop (out of descriptors or memory?)", 1);
    return loop;
}

/* What run makes first in either mode: the event loop and the operations server on it, into
 * *loop and *ops. Returns false after one line (*status 1, a runtime failure: the input was
 * checked), kconf destroyed and nothing left made. */
static bool run_loop_ops(Config *cfg, rd_kafka_conf_t *kconf, int argc, char **argv,
                         struct ev_loop **loop, Ops **ops, int *status)
{
    char err[1024];
    *loop = default_loop();
    if (!*loop) {
        rd_kafka_conf_destroy(kconf);
        *status = 1;
        return false;
    }
    *ops = ops_new(*loop, cfg, argc, argv, err, sizeof(err));
    if (!*ops) {
        rd_kafka_conf_destroy(kconf);
        ev_loop_destroy(*loop);
        *status = error_line(err, 1);
        return false;
    }
    return true;
}

/* run with --databases: a pipeline per database on the one loop (databases.h). */
static int run_databases(Config *cfg, rd_kafka_conf_t *kconf, int argc, char **argv)
{
    char err[1024];
    struct ev_loop *loop;
    Ops *ops;
    int status;
    if (!run_loop_ops(cfg, kconf, argc, argv, &loop, &ops, &status))
        return status;
    char q2[600];
    log_info("outbox-relay starting", "version=%s databases=%d brokers=%s", OUTBOX_RELAY_VERSION,
             cfg->n_dbs, log_quote(cfg->brokers, q2, sizeof(q2)));
    for (int i = 0; i < cfg->n_dbs; i++) {
        const Config *db = &cfg->dbs[i];
        char masked[1024], q1[1100], q3[300], context[80];
        snprintf(context, sizeof(context), "database=%s", db->database_name);
        log_set_context(context);
        log_info(
            "database",
            "url=%s topic_template=%s batch_size=%ld sessions=%ld retention_s=%ld "
            "on_sent=%s",
            log_quote(log_mask_conninfo(db->database_url, masked, sizeof(masked)), q1, sizeof(q1)),
            log_quote(db->topic_template, q3, sizeof(q3)), db->batch_size, db->sessions,
            db->retention_s, db->on_sent == ON_SENT_DELETE ? "delete" : "mark");
        tls_report_log(db);
    }
    log_set_context(NULL);
    Databases *dbs = databases_new(loop, cfg, kconf, cfg->metrics_listen != NULL, err, sizeof(err));
    rd_kafka_conf_destroy(kconf);
    /* The input was checked (run_input, config_load): what fails now is the machine's (memory,
     * descriptors, threads), which a restart may cure. Exit 2 would keep systemd from trying
     * (RestartPreventExitStatus=2). */
    if (!dbs) {
        ops_free(ops);
        ev_loop_destroy(loop);
        return error_line(err, 1);
    }
    /* A wrong registry password is one clear line now, as with one database. */
    if (!databases_check_registries(dbs, err, sizeof(err))) {
        databases_free(dbs);
        ops_free(ops);
        /* Each producer had every report in: the first went to kafka_producer_retire's thread,
         * which must be done before exit (librdkafka torn down under it, its last lines lost). */
        (void)producers_gone();
        ev_loop_destroy(loop);
        return error_line(err, 1);
    }
    ops_start_databases(ops, dbs);
    databases_start(dbs);
    /* NULL unless run by systemd (Type=notify) */
    SdNotify *sd = sdnotify_start(loop, databases_sd_status, dbs);
    int rc = databases_run(dbs);
    sdnotify_free(sd);
    ops_free(ops);
    databases_free(dbs);
    (void)producers_gone(); /* old producers still being destroyed (kafka.h) */
    ev_loop_destroy(loop);
    return rc;
}

static int cmd_run(Config *cfg, int argc, char **argv)
{
    char err[1024];
    int status;
    rd_kafka_conf_t *kconf = run_input(cfg, &status);
    if (!kconf)
        return status;
    /* A process option: every database's connections and requests (--databases too). */
    pg_set_session_timeout(cfg->session_timeout_ms);
    if (cfg->n_dbs)
        return run_databases(cfg, kconf, argc, argv);

    struct ev_loop *loop;
    Ops *ops;
    if (!run_loop_ops(cfg, kconf, argc, argv, &loop, &ops, &status))
        return status;
    Relay *relay = relay_new(loop, cfg, kconf, err, sizeof(err));
    /* A runtime failure (exit 1, restarted by systemd): the input was checked by run_input and
     * config_load, so what fails here is the machine's (memory, descriptors, threads). */
    if (!relay) {
        ops_free(ops);
        ev_loop_destroy(loop);
        return error_line(err, 1);
    }
    /* A wrong registry password is one clear line now, not a stream of failed lookups. */
    if (!relay_check_registry(relay, err, sizeof(err))) {
        relay_free(relay);
        ops_free(ops);
        (void)producers_gone(); /* relay_free handed its idle producer to a thread (kafka.h) */
        ev_loop_destroy(loop);
        return error_line(err, 1);
    }

    char masked[1024], q1[1100], q2[600], q3[300];
    log_info(
        "outbox-relay starting",
        "version=%s database=%s brokers=%s topic_template=%s batch_size=%ld retention_s=%ld "
        "on_sent=%s",
        OUTBOX_RELAY_VERSION,
        log_quote(log_mask_conninfo(cfg->database_url, masked, sizeof(masked)), q1, sizeof(q1)),
        log_quote(cfg->brokers, q2, sizeof(q2)), log_quote(cfg->topic_template, q3, sizeof(q3)),
        cfg->batch_size, cfg->retention_s, cfg->on_sent == ON_SENT_DELETE ? "delete" : "mark");
    /* Stated once the input is known good (bad input stays one line), at start. */
    tls_report_log(cfg);
    ops_start(ops, relay);
    /* NULL unless run by systemd (Type=notify); STATUS= judged as /readyz is. */
    SdNotify *sd = sdnotify_start(loop, ops_sd_status, ops);
    int rc = relay_run(relay);
    sdnotify_free(sd);
    ops_free(ops);
    relay_free(relay);
    (void)producers_gone(); /* old producers still being destroyed (kafka.h) */
    ev_loop_destroy(loop);
    return rc;
}

static int cmd_migrate(const Config *cfg)
{
    char err[1024];
    if (!db_check_writer_conninfo(cfg->database_url, err, sizeof(err)))
        return usage_error(err);
    return migrate_run(cfg->database_url, &cfg->map, cfg->schema, cfg->connect_wait_s,
                       cfg->migrate_timeout_s, cfg->dry_run, cfg->allow_newer_schema);
}

/* A copy of argv (strings included) for what parses the command line again later: a SIGHUP
 * reload. The original is scrubbed of secrets (config_scrub_argv). NULL when out of memory. */
static char **argv_copy(int argc, char **argv)
{
    char **copy = calloc((size_t)argc + 1, sizeof(*copy));
    for (int i = 0; copy && i < argc; i++)
        if (!(copy[i] = strdup(argv[i]))) {
            for (int j = 0; j < i; j++)
                free(copy[j]);
            free(copy);
            return NULL;
        }
    return copy;
}

static void argv_free(int argc, char **copy)
{
    for (int i = 0; copy && i < argc; i++) {
        explicit_bzero(copy[i], strlen(copy[i]));
        free(copy[i]);
    }
    free(copy);
}

/* No core dumps: a core file holds the database password and the Kafka credentials, readable
 * by whoever may read the crash directory (systemd-coredump keeps them). RLIMIT_CORE 0 stops
 * the kernel writing one; PR_SET_DUMPABLE 0 also stops core pipes (systemd-coredump) and keeps
 * other processes of the same user out of our memory and secrets: ptrace, /proc/PID/mem,
 * environ and io need CAP_SYS_PTRACE from then on (checked as another user: cmdline, stat,
 * status and limits stay readable by all, which is what ps, top and the tests read). Failures
 * are ignored: a sandbox that forbids them forbids dumps too. */
static void disable_core_dumps(void)
{
    struct rlimit none = {0, 0};
    (void)setrlimit(RLIMIT_CORE, &none);
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

int main(int argc, char **argv)
{
    disable_core_dumps();
    /* A relay reloads on SIGHUP (ops.c), but its handler comes only once the loop and the relay
     * exist: until then, blocked rather than ignored or left to its default, which ended a relay
     * that was still reading its configuration (a --database-url-file pipe) and lost a reload
     * asked before the handler was in (the change then never applied, nothing said). ops_start
     * unblocks it with the handler in, so one that came meanwhile reloads on the loop's first
     * turn. The other commands let it through at once, after parsing. Threads made meanwhile
     * (librdkafka's, which block every signal anyway) inherit the mask. */
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    sigprocmask(SIG_BLOCK, &hup, NULL);
    /* A peer closing a socket must surface as an error return, not kill the process. */
    signal(SIGPIPE, SIG_IGN);
    /* Hidden: the generated sections of the man page, for tools/gen-man.sh. */
    if (argc == 2 && strcmp(argv[1], "--help-man") == 0) {
        config_print_man(stdout);
        return 0;
    }
    /* Hidden: the option table as tab-separated lines, for tools/docs.py. */
    if (argc == 2 && strcmp(argv[1], "--help-table") == 0) {
        config_print_table(stdout);
        return 0;
    }
    /* Hidden: the shipped sample configuration (systemd/relay.json). */
    if (argc == 2 && strcmp(argv[1], "--help-config") == 0) {
        config_print_sample(stdout);
        return 0;
    }

    Config cfg;
    char err[1024];
    if (!config_load(&cfg, argc, argv, err, sizeof(err))) {
        config_free(&cfg);
        return usage_error(err);
    }
    /* Before any connection: the relay and migrate resolve every name of theirs through this
     * search_path only (db.h), whatever the role's or database's settings say. */
    if (cfg.command != CMD_HELP && cfg.command != CMD_VERSION &&
        !db_pin_search_path(cfg.schema, cfg.command == CMD_MIGRATE, err, sizeof(err))) {
        config_free(&cfg);
        return usage_error(err);
    }
    log_set_level(cfg.log_level);
    log_set_format(cfg.log_format);
    /* Only run reloads: for the others SIGHUP is what it was (a hangup, replay's own handler). */
    if (cfg.command != CMD_RUN)
        sigprocmask(SIG_UNBLOCK, &hup, NULL);
    /* From here on, nothing the process writes may show them. */
    config_register_secrets(&cfg);
    /* ps and /proc/PID/cmdline show argv to every local user: the secrets go from it, and a
     * reload reads the copy. */
    char **kept = argv_copy(argc, argv);
    if (!kept) {
        config_free(&cfg);
        return error_line("out of memory", 1);
    }
    config_scrub_argv(argc, argv);
    config_warn_loose_secret_files(&cfg);
    /* Masked where the relay knows its place (a connection string), but not scrubbed from other
     * text: the one place it can still show, said once rather than left to be found. */
    log_warn_short_secrets(secrets_too_short());

    /* The commands other than run work on one database: with --databases, the one --database
     * names (its entry's options over the file's). run serves them all. */
    const Config *one = &cfg;
    if (cfg.command != CMD_HELP && cfg.command != CMD_VERSION) {
        if (cfg.command == CMD_RUN && cfg.database) {
            config_free(&cfg);
            argv_free(argc, kept);
            return usage_error("--database: run serves every database of --databases; the option "
                               "picks one for the other commands");
        }
        if (cfg.command != CMD_RUN && !(one = config_pick_database(&cfg, err, sizeof(err)))) {
            config_free(&cfg);
            argv_free(argc, kept);
            return usage_error(err);
        }
    }

    int rc = 0;
    switch (cfg.command) {
    case CMD_HELP:
        config_print_help(stdout, argc, argv);
        break;
    case CMD_VERSION:
        printf("outbox-relay %s (librdkafka %s, libpq %d)\n", OUTBOX_RELAY_VERSION,
               rd_kafka_version_str(), PQlibVersion());
        break;
    case CMD_RUN:
        rc = cmd_run(&cfg, argc, kept);
        /* Whichever way run ended: a relay or database freed on a failure path (databases_new
         * failing for a later entry frees the earlier ones) may have handed its producer to
         * a thread (kafka.h), which must be done before the process exits (librdkafka torn
         * down under it); one that is not done in time is left: the process ends at once,
         * without exit()'s teardown (atexit handlers, OpenSSL's among them) under its thread. */
        if (!producers_gone()) {
            fflush(NULL);
            config_free(&cfg);
            argv_free(argc, kept);
            _exit(rc);
        }
        break;
    case CMD_MIGRATE:
        rc = cmd_migrate(one);
        break;
    case CMD_CHECK: {
        int status;
        rd_kafka_conf_t *kconf = run_input(&cfg, &status);
        rc = kconf ? check_run(one, kconf) : status;
        break;
    }
    case CMD_DEAD:
    case CMD_REQUEUE:
    case CMD_PURGE_DEAD:
    case CMD_STATUS:
    case CMD_VERIFY:
    case CMD_REPLAY: {
        /* verify and replay name each row's topic as run would: a template run refuses is
         * refused here too (verify would report every row missing, replay "no legal topic"). */
        bool topics = cfg.command == CMD_VERIFY || cfg.command == CMD_REPLAY;
        rd_kafka_conf_t *vconf = NULL;
        /* requeue, purge-dead and replay write; dead, status and verify may read a standby. */
        bool writes = cfg.command == CMD_REQUEUE || cfg.command == CMD_PURGE_DEAD ||
                      cfg.command == CMD_REPLAY;
        if (!(writes ? db_check_writer_conninfo : db_check_conninfo)(one->database_url, err,
                                                                     sizeof(err)) ||
            (topics &&
             !route_template_check(one->topic_template, one->order_scope != ORDER_PER_AGGREGATE,
                                   err, sizeof(err))) ||
            (cfg.command == CMD_VERIFY && !(vconf = verify_kafka_conf(one, err, sizeof(err))))) {
            rc = usage_error(err);
            break;
        }
        rc = cfg.command == CMD_DEAD      ? admin_dead(one)
             : cfg.command == CMD_REQUEUE ? admin_requeue(one)
             : cfg.command == CMD_STATUS  ? status_run(one)
             : cfg.command == CMD_VERIFY  ? verify_run(one, vconf)
             : cfg.command == CMD_REPLAY  ? replay_run(one)
                                          : admin_purge_dead(one);
        break;
    }
    }
    /* Output that could not be written (a full disk, a closed pipe) is a failure: a script
     * reading `dead --json >file` must not take a cut list for the whole one. stdio keeps the
     * error; the last buffer is written here. */
    int write_error = fflush(stdout) != 0 ? errno : 0;
    if (write_error || ferror(stdout)) {
        char msg[160];
        snprintf(msg, sizeof(msg), "cannot write to standard output: %s",
                 write_error ? strerror(write_error) : "write error");
        rc = error_line(msg, rc ? rc : 1);
    }
    config_free(&cfg);
    argv_free(argc, kept);
    return rc;
}
