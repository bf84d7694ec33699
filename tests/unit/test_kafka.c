/* Unit tests for kafka.c's configuration: the protective librdkafka defaults the relay sets
 * (README, "--kafka"), that --kafka entries come after them, and that the settings the
 * per-aggregate order depends on cannot be turned off. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "config.h"
#include "kafka.h"

/* Loads `outbox-relay run` with the given extra arguments (NULL-terminated) and builds the
 * librdkafka configuration; NULL (with err set) when kafka_conf_build refuses. */
static rd_kafka_conf_t *build(Config *cfg, char *err, size_t errlen, ...)
{
    char *argv[16] = {"outbox-relay",     "run",       "--database-url",
                      "postgresql://x/y", "--brokers", "127.0.0.1:9"};
    int argc = 6;
    va_list ap;
    va_start(ap, errlen);
    for (char *a = va_arg(ap, char *); a; a = va_arg(ap, char *))
        argv[argc++] = a;
    va_end(ap);
    assert_true(config_load(cfg, argc, argv, err, errlen));
    return kafka_conf_build(cfg, NULL, err, errlen);
}

/* Asserts that property key of conf has the value want. */
static void assert_prop(const rd_kafka_conf_t *conf, const char *key, const char *want)
{
    char value[256];
    size_t size = sizeof(value);
    assert_int_equal(rd_kafka_conf_get(conf, key, value, &size), RD_KAFKA_CONF_OK);
    if (strcmp(value, want) != 0)
        fail_msg("%s is \"%s\", expected \"%s\"", key, value, want);
}

static void test_protective_defaults(void **state)
{
    Config cfg;
    char err[512] = "";
    rd_kafka_conf_t *conf = build(&cfg, err, sizeof(err), (char *)NULL);
    assert_non_null(conf);
    assert_prop(conf, "enable.idempotence", "true");
    assert_prop(conf, "enable.gapless.guarantee", "true");
    assert_prop(conf, "partitioner", "consistent");
    assert_prop(conf, "message.timeout.ms", "0");
    assert_prop(conf, "linger.ms", "0");
    assert_prop(conf, "message.copy.max.bytes", "0");
    assert_prop(conf, "client.id", "outbox-relay");
    assert_prop(conf, "bootstrap.servers", "127.0.0.1:9");
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
}

/* --layout debezium takes over topics Debezium's Java producer wrote: its keys must land where
 * murmur2 put them, unless the operator names a partitioner; the relay layout stays consistent. */
static void test_partitioner_follows_the_layout(void **state)
{
    struct {
        const char *args[4];
        const char *want;
    } cases[] = {
        {{NULL}, "consistent"},
        {{"--layout", "debezium", NULL}, "murmur2"},
        {{"--layout", "debezium", "--kafka", "partitioner=consistent"}, "consistent"},
        {{"--layout", "debezium", "--kafka", "partitioner=fnv1a"}, "fnv1a"},
        {{"--kafka", "partitioner=murmur2", NULL}, "murmur2"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Config cfg;
        char err[512] = "";
        rd_kafka_conf_t *conf = build(&cfg, err, sizeof(err), cases[i].args[0], cases[i].args[1],
                                      cases[i].args[2], cases[i].args[3], (char *)NULL);
        assert_non_null(conf);
        kafka_conf_layout_partitioner(conf, &cfg);
        assert_prop(conf, "partitioner", cases[i].want);
        rd_kafka_conf_destroy(conf);
        config_free(&cfg);
    }
}

static void test_flags_come_after_the_defaults(void **state)
{
    Config cfg;
    char err[512] = "";
    rd_kafka_conf_t *conf = build(&cfg, err, sizeof(err), "--kafka", "linger.ms=5", "--kafka",
                                  "client.id=mine", (char *)NULL);
    assert_non_null(conf);
    assert_prop(conf, "linger.ms", "5");
    assert_prop(conf, "client.id", "mine");
    assert_prop(conf, "enable.idempotence", "true");
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
}

static void test_idempotence_cannot_be_turned_off(void **state)
{
    Config cfg;
    char err[512] = "";
    assert_null(build(&cfg, err, sizeof(err), "--kafka", "enable.idempotence=false", (char *)NULL));
    assert_non_null(strstr(err, "enable.idempotence=false: must stay true"));
    config_free(&cfg);
}

static void test_delivery_callbacks_cannot_be_set(void **state)
{
    Config cfg;
    char err[512] = "";
    assert_null(build(&cfg, err, sizeof(err), "--kafka", "dr_msg_cb=x", (char *)NULL));
    assert_non_null(strstr(err, "cannot be set from configuration"));
    config_free(&cfg);
}

/* Writes text to a fresh temporary file; its path goes to path (PATH_MAX bytes). */
static void write_temp(char *path, const char *suffix, const char *text)
{
    snprintf(path, PATH_MAX, "/tmp/test_kafka_XXXXXX%s", suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* A property librdkafka rejects is named with where it was set: the --kafka-file and its line,
 * the config file, or the flag (docs/security.md), not as a --kafka flag whatever its origin. */
static void test_rejected_property_names_its_origin(void **state)
{
    Config cfg;
    char err[1024] = "", props[PATH_MAX], json[PATH_MAX], want[PATH_MAX + 64];
    write_temp(props, ".properties", "# SASL\nlinger.ms=1\n\n  no.such.prop = 1\n");
    assert_null(build(&cfg, err, sizeof(err), "--kafka-file", props, (char *)NULL));
    snprintf(want, sizeof(want), "kafka-file %s line 4: no.such.prop: ", props);
    if (strncmp(err, want, strlen(want)) != 0)
        fail_msg("error \"%s\" does not start with \"%s\"", err, want);
    config_free(&cfg);

    write_temp(json, ".json", "{\"kafka\": {\"linger.ms\": \"notanumber\"}}\n");
    assert_null(build(&cfg, err, sizeof(err), "--config", json, (char *)NULL));
    snprintf(want, sizeof(want), "config file %s: kafka linger.ms: ", json);
    if (strncmp(err, want, strlen(want)) != 0)
        fail_msg("error \"%s\" does not start with \"%s\"", err, want);
    config_free(&cfg);

    /* All three: the config file's entries come first, then the file's lines, then the flags. */
    write_temp(json, ".json", "{\"kafka\": {\"linger.ms\": \"5\", \"acks\": \"all\"}}\n");
    unlink(props);
    write_temp(props, ".properties", "linger.ms=2\nbad.one=1\n");
    assert_null(build(&cfg, err, sizeof(err), "--config", json, "--kafka-file", props, "--kafka",
                      "linger.ms=3", (char *)NULL));
    snprintf(want, sizeof(want), "kafka-file %s line 2: bad.one: ", props);
    if (strncmp(err, want, strlen(want)) != 0)
        fail_msg("error \"%s\" does not start with \"%s\"", err, want);
    config_free(&cfg);
    unlink(props);
    write_temp(props, ".properties", "linger.ms=2\n");
    assert_null(build(&cfg, err, sizeof(err), "--config", json, "--kafka-file", props, "--kafka",
                      "x.y=1", (char *)NULL));
    if (strncmp(err, "--kafka x.y: ", 13) != 0)
        fail_msg("error \"%s\" does not start with \"--kafka x.y: \"", err);
    config_free(&cfg);
    unlink(props);
    unlink(json);
}

/* Properties librdkafka takes one by one but refuses together only when the producer is made
 * (acks=1, max.in.flight.requests.per.connection=6 or retries=0 with idempotence) are refused
 * here, so check refuses what run refuses, naming the entry after which the configuration stays
 * refused and where it was set. */
static void test_producer_refusal_names_its_origin(void **state)
{
    static const char *const refused[][2] = {
        {"acks=1", "--kafka acks: librdkafka refuses the producer: "},
        {"max.in.flight.requests.per.connection=6",
         "--kafka max.in.flight.requests.per.connection: librdkafka refuses the producer: "},
        {"retries=0", "--kafka retries: librdkafka refuses the producer: "},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        Config cfg;
        char err[1024] = "";
        assert_null(build(&cfg, err, sizeof(err), "--kafka", refused[i][0], (char *)NULL));
        if (strncmp(err, refused[i][1], strlen(refused[i][1])) != 0)
            fail_msg("error \"%s\" does not start with \"%s\"", err, refused[i][1]);
        config_free(&cfg);
    }
    /* A later entry that puts it right is taken; the entry after the last good state is named. */
    Config cfg;
    char err[1024] = "", props[PATH_MAX], want[PATH_MAX + 64];
    write_temp(props, ".properties", "acks=1\nacks=all\nretries=0\n");
    assert_null(build(&cfg, err, sizeof(err), "--kafka-file", props, (char *)NULL));
    snprintf(want, sizeof(want), "kafka-file %s line 3: retries: ", props);
    if (strncmp(err, want, strlen(want)) != 0)
        fail_msg("error \"%s\" does not start with \"%s\"", err, want);
    config_free(&cfg);
    rd_kafka_conf_t *conf =
        build(&cfg, err, sizeof(err), "--kafka", "acks=1", "--kafka", "acks=-1", (char *)NULL);
    assert_non_null(conf);
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
    unlink(props);
}

/* The same for a property the relay refuses itself. */
static void test_refused_property_names_its_origin(void **state)
{
    Config cfg;
    char err[1024] = "", props[PATH_MAX], want[PATH_MAX + 64];
    write_temp(props, ".properties", "linger.ms=1\nenable.idempotence=false\n");
    assert_null(build(&cfg, err, sizeof(err), "--kafka-file", props, (char *)NULL));
    snprintf(want, sizeof(want), "kafka-file %s line 2: enable.idempotence", props);
    if (strncmp(err, want, strlen(want)) != 0)
        fail_msg("error \"%s\" does not start with \"%s\"", err, want);
    config_free(&cfg);
    unlink(props);
}

/* Builds as build() does with stderr (the log) captured into logged (logged_len bytes). */
static rd_kafka_conf_t *build_logged(Config *cfg, char *err, size_t errlen, char *logged,
                                     size_t logged_len, char **args)
{
    char *argv[16] = {"outbox-relay",     "run",       "--database-url",
                      "postgresql://x/y", "--brokers", "127.0.0.1:9"};
    int argc = 6;
    for (char **a = args; *a; a++)
        argv[argc++] = *a;
    assert_true(config_load(cfg, argc, argv, err, errlen));
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
    rd_kafka_conf_t *conf = kafka_conf_build(cfg, NULL, err, errlen);
    fflush(stderr);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    rewind(tmp);
    size_t n = fread(logged, 1, logged_len - 1, tmp);
    logged[n] = '\0';
    fclose(tmp);
    return conf;
}

/* Without the gap-less guarantee librdkafka sends a partition's later messages on after the
 * broker rejected one (docs/guarantees.md, "In Kafka"): refused like idempotence, in any
 * spelling librdkafka takes, and named where it was set. */
static void test_gapless_cannot_be_turned_off(void **state)
{
    Config cfg;
    char err[1024] = "";
    assert_null(
        build(&cfg, err, sizeof(err), "--kafka", "enable.gapless.guarantee=false", (char *)NULL));
    if (strncmp(err, "--kafka enable.gapless.guarantee=false: must stay true", 54) != 0)
        fail_msg("error \"%s\"", err);
    config_free(&cfg);
    assert_null(build(&cfg, err, sizeof(err), "--kafka", "enable.gapless.guarantee=F", "--kafka",
                      "linger.ms=1", (char *)NULL));
    assert_non_null(strstr(err, "enable.gapless.guarantee=false: must stay true"));
    config_free(&cfg);
    /* Set back by a later entry: the final value is what librdkafka uses. */
    rd_kafka_conf_t *conf =
        build(&cfg, err, sizeof(err), "--kafka", "enable.gapless.guarantee=false", "--kafka",
              "enable.gapless.guarantee=true", (char *)NULL);
    assert_non_null(conf);
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
}

/* Idempotence is checked by its final value too: "1" is true, and is not refused. */
static void test_idempotence_spelled_otherwise(void **state)
{
    Config cfg;
    char err[1024] = "";
    rd_kafka_conf_t *conf =
        build(&cfg, err, sizeof(err), "--kafka", "enable.idempotence=1", (char *)NULL);
    if (!conf)
        fail_msg("refused: %s", err);
    assert_prop(conf, "enable.idempotence", "true");
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
    assert_null(build(&cfg, err, sizeof(err), "--kafka", "enable.idempotence=0", (char *)NULL));
    assert_non_null(strstr(err, "--kafka enable.idempotence=false: must stay true"));
    config_free(&cfg);
}

/* A message timeout shorter than --delivery-timeout fails single messages and lets the later
 * ones of their partition through (docs/configuration.md, "Why no message timeout"): refused,
 * under every name librdkafka takes for it. */
static void test_short_message_timeout_refused(void **state)
{
    static const char *const spellings[] = {"message.timeout.ms=5000", "delivery.timeout.ms=5000",
                                            "topic.message.timeout.ms=5000"};
    for (size_t i = 0; i < sizeof(spellings) / sizeof(spellings[0]); i++) {
        Config cfg;
        char err[1024] = "", want[128];
        assert_null(build(&cfg, err, sizeof(err), "--kafka", spellings[i], (char *)NULL));
        snprintf(want, sizeof(want), "--kafka %.*s=5000: must be 0",
                 (int)(strchr(spellings[i], '=') - spellings[i]), spellings[i]);
        if (strncmp(err, want, strlen(want)) != 0)
            fail_msg("error \"%s\" does not start with \"%s\"", err, want);
        assert_non_null(strstr(err, "--delivery-timeout (30000 ms)"));
        config_free(&cfg);
    }
}

/* One at least as long as --delivery-timeout never fires first: accepted, with a warning. */
static void test_long_message_timeout_warns(void **state)
{
    Config cfg;
    char err[1024] = "", logged[4096];
    char *args[] = {"--delivery-timeout", "5000", "--kafka", "message.timeout.ms=5000", NULL};
    rd_kafka_conf_t *conf = build_logged(&cfg, err, sizeof(err), logged, sizeof(logged), args);
    if (!conf)
        fail_msg("refused: %s", err);
    assert_prop(conf, "message.timeout.ms", "5000");
    if (!strstr(logged, "level=warn msg=\"message.timeout.ms is set") ||
        !strstr(logged, "origin=\"--kafka message.timeout.ms\""))
        fail_msg("logged: %s", logged);
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
    /* The relay's own 0 says nothing. */
    char *none[] = {NULL};
    conf = build_logged(&cfg, err, sizeof(err), logged, sizeof(logged), none);
    assert_non_null(conf);
    assert_string_equal(logged, "");
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
}

/* With several databases, the producer is the process's: a message timeout is measured against
 * the longest --delivery-timeout of them, not the top level's. */
static void test_message_timeout_against_every_database(void **state)
{
    Config cfg;
    char err[1024] = "";
    char *argv[] = {"outbox-relay",
                    "run",
                    "--brokers",
                    "127.0.0.1:9",
                    "--kafka",
                    "message.timeout.ms=45000",
                    "--databases",
                    "[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                    " {\"name\": \"b\", \"database-url\": \"postgresql://h/b\","
                    " \"delivery-timeout\": 60000}]",
                    NULL};
    assert_true(config_load(&cfg, 8, argv, err, sizeof(err)));
    assert_null(kafka_conf_build(&cfg, NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "at least --delivery-timeout (60000 ms)"));
    config_free(&cfg);
}

/* A partitioner that places a keyed message at random spreads one aggregate over partitions:
 * random for every key, consistent_random (librdkafka's default) for an empty one (an aggregate
 * id '' or NULL). Refused; those that hash every non-NULL key are taken. */
static void test_scattering_partitioners_refused(void **state)
{
    static const char *const refused[] = {"partitioner=random", "partitioner=consistent_random",
                                          "topic.partitioner=random"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        Config cfg;
        char err[1024] = "";
        assert_null(build(&cfg, err, sizeof(err), "--kafka", refused[i], (char *)NULL));
        if (strncmp(err, "--kafka ", 8) != 0 || !strstr(err, "breaks per-aggregate order"))
            fail_msg("%s: error \"%s\"", refused[i], err);
        config_free(&cfg);
    }
    static const char *const taken[] = {"partitioner=murmur2_random", "partitioner=fnv1a",
                                        "partitioner=murmur2"};
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++) {
        Config cfg;
        char err[1024] = "";
        rd_kafka_conf_t *conf = build(&cfg, err, sizeof(err), "--kafka", taken[i], (char *)NULL);
        if (!conf)
            fail_msg("%s refused: %s", taken[i], err);
        rd_kafka_conf_destroy(conf);
        config_free(&cfg);
    }
}

/* With a transactional.id every message outside a transaction is refused, and the relay begins
 * none: refused at start rather than failing every batch for ever. */
static void test_transactional_id_refused(void **state)
{
    Config cfg;
    char err[1024] = "";
    assert_null(build(&cfg, err, sizeof(err), "--kafka", "transactional.id=relay-1", (char *)NULL));
    if (strncmp(err, "--kafka transactional.id: the relay does not use transactions", 61) != 0)
        fail_msg("error \"%s\"", err);
    assert_null(strstr(err, "relay-1"));
    config_free(&cfg);
}

/* With delivery.report.only.error librdkafka reports no success, and the relay marks rows on
 * success reports only: refused at start rather than sending every batch again for ever. */
static void test_report_only_error_refused(void **state)
{
    const char *spellings[] = {"delivery.report.only.error=true", "delivery.report.only.error=1"};
    for (size_t i = 0; i < sizeof(spellings) / sizeof(spellings[0]); i++) {
        Config cfg;
        char err[1024] = "";
        assert_null(build(&cfg, err, sizeof(err), "--kafka", spellings[i], (char *)NULL));
        if (strncmp(err, "--kafka delivery.report.only.error=true: the relay marks a row sent", 67))
            fail_msg("%s: error \"%s\"", spellings[i], err);
        config_free(&cfg);
    }
    Config cfg;
    char err[1024] = "";
    rd_kafka_conf_t *conf =
        build(&cfg, err, sizeof(err), "--kafka", "delivery.report.only.error=false", (char *)NULL);
    if (!conf)
        fail_msg("delivery.report.only.error=false refused: %s", err);
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
}

/* test.mock.num.brokers makes librdkafka publish into a cluster in the relay's own process:
 * every row marked sent, every event lost at exit. Refused, whatever spelling of the count. */
static void test_mock_brokers_refused(void **state)
{
    const char *spellings[] = {"test.mock.num.brokers=1", "test.mock.num.brokers=3"};
    for (size_t i = 0; i < sizeof(spellings) / sizeof(spellings[0]); i++) {
        Config cfg;
        char err[1024] = "";
        rd_kafka_conf_t *conf =
            build(&cfg, err, sizeof(err), "--kafka", spellings[i], (char *)NULL);
        if (conf)
            rd_kafka_conf_destroy(conf);
        assert_null(conf);
        if (!strstr(err, "--kafka test.mock.num.brokers=") ||
            !strstr(err, "lose every event at exit"))
            fail_msg("%s: error \"%s\"", spellings[i], err);
        config_free(&cfg);
    }
    Config cfg;
    char err[1024] = "";
    rd_kafka_conf_t *conf =
        build(&cfg, err, sizeof(err), "--kafka", "test.mock.num.brokers=0", (char *)NULL);
    if (!conf)
        fail_msg("test.mock.num.brokers=0 refused: %s", err);
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
}

static int reports_after_retire;

static void count_report(void *opaque, rd_kafka_resp_err_t err, void *arg)
{
    (void)opaque;
    (void)err;
    (void)arg;
    reports_after_retire++;
}

/* A retired producer is destroyed by its own thread, and whatever it still reports (here a
 * message queued to a broker that never answers, purged by the retirement) reaches no one: not
 * the KafkaDeliveryFn its owner gave. kafka_retired_wait returns once it is gone (the sanitizers
 * see its memory freed, its threads joined); a second retirement after it is taken at once. */
static void test_retired_producer_reports_to_no_one(void **state)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    assert_non_null(loop);
    for (int round = 0; round < 2; round++) {
        char err[512] = "";
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        assert_int_equal(
            rd_kafka_conf_set(conf, "bootstrap.servers", "127.0.0.1:9", err, sizeof(err)),
            RD_KAFKA_CONF_OK);
        KafkaProducer *kp = kafka_producer_new(loop, conf, count_report, NULL, err, sizeof(err));
        assert_non_null(kp);
        static const char value[] = "v";
        assert_int_equal(
            kafka_produce(kp, "t", RD_KAFKA_PARTITION_UA, 0, "k", 1, value, 1, NULL, NULL),
            RD_KAFKA_RESP_ERR_NO_ERROR);
        reports_after_retire = 0;
        assert_true(kafka_producer_retire(kp));
        assert_int_equal(kafka_retired_wait(-1), 0);
        ev_run(loop, EVRUN_NOWAIT);
        assert_int_equal(reports_after_retire, 0);
    }
    ev_loop_destroy(loop);
}

/* What the thread that destroys a freed producer blocks, seen from its after callback. */
typedef struct {
    pthread_t caller;
    bool ran, other_thread, hup_blocked, term_blocked, segv_blocked;
} RetireMask;

static void record_mask(void *arg)
{
    RetireMask *m = arg;
    sigset_t now;
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    m->ran = true;
    m->other_thread = !pthread_equal(pthread_self(), m->caller);
    m->hup_blocked = sigismember(&now, SIGHUP);
    m->term_blocked = sigismember(&now, SIGTERM);
    m->segv_blocked = sigismember(&now, SIGSEGV);
}

/* The thread that destroys a producer off the loop takes none of the process's signals: they are
 * the loop's. It took them, inheriting the loop thread's mask, so that a SIGHUP while ops_free
 * has SIGHUP blocked in the main thread (libev having just given it its default back) went to
 * that thread and ended the relay. A fault inside librdkafka must still crash it with its report
 * (SIGSEGV not blocked). */
static void test_retire_thread_takes_no_signals(void **state)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    assert_non_null(loop);
    char err[512] = "";
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(rd_kafka_conf_set(conf, "bootstrap.servers", "127.0.0.1:9", err, sizeof(err)),
                     RD_KAFKA_CONF_OK);
    KafkaProducer *kp = kafka_producer_new(loop, conf, count_report, NULL, err, sizeof(err));
    assert_non_null(kp);
    static const char value[] = "v";
    /* Queued to a broker that never answers: the destroy goes to a thread, and after with it. */
    assert_int_equal(kafka_produce(kp, "t", RD_KAFKA_PARTITION_UA, 0, "k", 1, value, 1, NULL, NULL),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
    RetireMask m = {.caller = pthread_self()};
    kafka_producer_free_then(kp, 0, record_mask, &m);
    assert_int_equal(kafka_retired_wait(-1), 0);
    assert_true(m.ran);
    assert_true(m.other_thread);
    assert_true(m.hup_blocked);
    assert_true(m.term_blocked);
    assert_false(m.segv_blocked);
    ev_loop_destroy(loop);
}

/* A retired producer's errors are served by its own thread's last flush, in its database's log
 * context: the fatal error raised before its retirement (queued, not yet served) must not say
 * "recreating the producer" (the live one is the replacement), nor "kafka unreachable" or
 * "reachable again": it is no longer the relay's producer. */
static void test_retired_producer_says_nothing_of_the_live_one(void **state)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    assert_non_null(loop);
    char err[512] = "";
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(rd_kafka_conf_set(conf, "bootstrap.servers", "127.0.0.1:9", err, sizeof(err)),
                     RD_KAFKA_CONF_OK);
    assert_int_equal(rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err)),
                     RD_KAFKA_CONF_OK);
    KafkaProducer *kp = kafka_producer_new(loop, conf, count_report, NULL, err, sizeof(err));
    assert_non_null(kp);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
    /* Queued on the producer's main queue now; the loop never serves it. */
    assert_int_equal(rd_kafka_test_fatal_error(kafka_handle(kp),
                                               RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                                               "raised by the test"),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
    assert_true(kafka_producer_retire(kp));
    assert_int_equal(kafka_retired_wait(-1), 0);
    fflush(stderr);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    rewind(tmp);
    char logged[16384];
    size_t n = fread(logged, 1, sizeof(logged) - 1, tmp);
    logged[n] = '\0';
    fclose(tmp);
    assert_null(strstr(logged, "recreating the producer"));
    assert_null(strstr(logged, "kafka unreachable"));
    assert_null(strstr(logged, "kafka reachable again"));
    ev_loop_destroy(loop);
}

/* Broker threads held in their name lookup until released: rd_kafka_destroy waits for them, as
 * for a nameserver that does not answer. */
static atomic_int lookups_held;
static atomic_bool lookups_released;

static int held_lookup(const char *node, const char *service, const struct addrinfo *hints,
                       struct addrinfo **res, void *opaque)
{
    (void)service;
    (void)opaque;
    if (!node && !hints) {
        freeaddrinfo(*res); /* never given one: nothing is, below */
        return 0;
    }
    atomic_fetch_add(&lookups_held, 1);
    while (!atomic_load(&lookups_released)) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return EAI_AGAIN;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_kafka: a producer's destroy blocked its caller\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    _exit(1);
}

/* A producer whose broker thread is held in its name lookup, made on loop. */
static KafkaProducer *held_producer(struct ev_loop *loop)
{
    char err[512] = "";
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(
        rd_kafka_conf_set(conf, "bootstrap.servers", "held.invalid:9", err, sizeof(err)),
        RD_KAFKA_CONF_OK);
    rd_kafka_conf_set_resolve_cb(conf, held_lookup);
    int before = atomic_load(&lookups_held);
    KafkaProducer *kp = kafka_producer_new(loop, conf, count_report, NULL, err, sizeof(err));
    assert_non_null(kp);
    while (atomic_load(&lookups_held) == before) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return kp;
}

/* A producer freed (its relay's database removed by SIGHUP, on the loop) while another old one
 * is still being destroyed: kafka_producer_retire refuses it (one replacement at a time), and
 * relay_free_within falls back to kafka_producer_free, which destroyed it on the caller's thread
 * and so blocked the loop for as long as rd_kafka_destroy took (here: until the name
 * lookups are released). Now both are destroyed off it; kafka_retired_wait is bounded by its
 * timeout, says how many are left, and joins them once they end. */
static void test_free_beside_a_retiring_producer_does_not_block(void **state)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    assert_non_null(loop);
    atomic_store(&lookups_released, false);
    KafkaProducer *old = held_producer(loop), *removed = held_producer(loop);
    assert_true(kafka_producer_retire(old));
    signal(SIGALRM, on_alarm);
    alarm(20); /* the old code blocks in kafka_producer_free until the release below: never */
    assert_false(kafka_producer_retire(removed)); /* one replacement at a time, as before */
    kafka_producer_free(removed, 0);
    assert_int_equal(kafka_retired_wait(100), 2); /* bounded: both still held */
    alarm(0);
    atomic_store(&lookups_released, true);
    assert_int_equal(kafka_retired_wait(-1), 0);
    ev_loop_destroy(loop);
}

static atomic_int payloads_freed;
static void free_payload(void *payload)
{
    free(payload);
    atomic_fetch_add(&payloads_freed, 1);
}

/* A producer freed with a message still queued, its payload the caller's (a removed database's
 * batch given up): kafka_producer_free purged and flushed it (up to 100 ms) and could destroy it
 * on the caller's thread, the loop. kafka_producer_free_then returns at once, the destroy on a
 * thread, and frees the payload there only after the producer is destroyed (here: not while its
 * broker thread is held in its name lookup). */
static void test_free_then_frees_payloads_after_the_destroy(void **state)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    assert_non_null(loop);
    atomic_store(&lookups_released, false);
    atomic_store(&payloads_freed, 0);
    KafkaProducer *kp = held_producer(loop);
    char *payload = strdup("{\"seq\":1}");
    assert_non_null(payload);
    assert_int_equal(kafka_produce(kp, "outbox.event.order", RD_KAFKA_PARTITION_UA, 0, "k", 1,
                                   payload, strlen(payload), NULL, NULL),
                     RD_KAFKA_RESP_ERR_NO_ERROR);
    signal(SIGALRM, on_alarm);
    alarm(20);
    kafka_producer_free_then(kp, 0, free_payload, payload);
    assert_int_equal(kafka_retired_wait(100), 1); /* still being destroyed, off this thread */
    alarm(0);
    assert_int_equal(atomic_load(&payloads_freed), 0); /* not before the destroy */
    atomic_store(&lookups_released, true);
    assert_int_equal(kafka_retired_wait(-1), 0);
    assert_int_equal(atomic_load(&payloads_freed), 1);
    ev_loop_destroy(loop);
}

/* A producer whose recreation failed is NULL (relay.c): kafka_fatal must say "not usable" rather
 * than dereference it (relay.c and claim.c ask it; only relay_fail's stopping flag kept them from
 * crashing). */
static void test_fatal_without_a_producer(void **state)
{
    assert_true(kafka_fatal(NULL));
}

/* Not authorised and unknown topic are the setup's faults, never the message's: counted against
 * a row they dead-lettered every event of a topic whose ACL was revoked. The two classes are
 * apart, and each setup error has a hint. */
static void test_setup_errors_are_not_rejections(void **state)
{
    static const rd_kafka_resp_err_t setup[] = {
        RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED,
        RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED,
        RD_KAFKA_RESP_ERR__AUTHENTICATION,
        RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC,
        RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
    };
    for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++) {
        assert_true(kafka_error_setup(setup[i]));
        assert_false(kafka_error_permanent(setup[i]));
        assert_non_null(strstr(kafka_error_setup_hint(setup[i]), " "));
    }
    assert_true(kafka_error_permanent(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE));
    assert_false(kafka_error_setup(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE));
    assert_false(kafka_error_setup(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT));
    assert_non_null(strstr(kafka_error_setup_hint(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART),
                           "create the topic"));
    assert_non_null(
        strstr(kafka_error_setup_hint(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED), "ACL"));
}

static void on_files_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_kafka: a TLS file that is a FIFO was opened (waits for ever)\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    _exit(1);
}

/* librdkafka opens the TLS files in rd_kafka_new, on the relay's event loop for a producer made
 * while it runs (a database a reload adds, a recreation): a FIFO's open waits for a writer. A
 * file that is not a regular file is refused at start-up, naming the property and the path,
 * before the trial producer would open it (the alarm turns that wait into a failure); a CA
 * directory is taken, and without TLS (plaintext) no file is looked at. */
static void test_tls_files_must_be_regular(void **state)
{
    (void)state;
    char dir[128], fifo[192], prop[300], err[1024];
    snprintf(dir, sizeof(dir), "/tmp/test_kafka_%ld_files", (long)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(fifo, sizeof(fifo), "%s/ca.pem", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    signal(SIGALRM, on_files_alarm);
    alarm(30);
    const char *props[] = {"ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
                           "ssl.crl.location", "ssl.keystore.location"};
    for (size_t i = 0; i < sizeof(props) / sizeof(props[0]); i++) {
        Config cfg;
        snprintf(prop, sizeof(prop), "%s=%s", props[i], fifo);
        memset(err, 0, sizeof(err));
        rd_kafka_conf_t *conf = build(&cfg, err, sizeof(err), "--kafka", "security.protocol=ssl",
                                      "--kafka", prop, NULL);
        if (conf)
            fail_msg("%s a FIFO taken", props[i]);
        char want[700];
        /* The whole reason, true of run (whose start-up says it) and of the commands alike:
         * it said "on the relay's event loop whenever it makes a producer" for check's and
         * verify's too. */
        snprintf(want, sizeof(want),
                 "kafka %s %s: not a regular file or a directory (librdkafka opens it whenever a "
                 "client is made, and a pipe's, device's or socket's open could wait without end: "
                 "on the running relay's event loop, or past a command's --statement-timeout)",
                 props[i], fifo);
        if (!strstr(err, want))
            fail_msg("%s: got \"%s\"", props[i], err);
        config_free(&cfg);
        /* Plaintext: librdkafka opens none of them. */
        Config plain;
        conf = build(&plain, err, sizeof(err), "--kafka", prop, "--kafka",
                     "ssl.keystore.password=unused", NULL); /* librdkafka wants one anyway */
        assert_non_null(conf);
        rd_kafka_conf_destroy(conf);
        config_free(&plain);
    }
    alarm(0);
    Config cfg;
    snprintf(prop, sizeof(prop), "ssl.ca.location=%s", dir); /* a directory of certificates */
    rd_kafka_conf_t *conf =
        build(&cfg, err, sizeof(err), "--kafka", "security.protocol=ssl", "--kafka", prop, NULL);
    if (!conf)
        fail_msg("a CA directory refused: %s", err);
    assert_true(kafka_conf_files_ok(conf, err, sizeof(err)));
    rd_kafka_conf_destroy(conf);
    config_free(&cfg);
    /* A directory in another file's place cannot stop the loop either (librdkafka's own error
     * refuses the producer at once): not refused here, with a reason that would be false. */
    for (size_t i = 1; i < sizeof(props) / sizeof(props[0]); i++) {
        rd_kafka_conf_t *raw = rd_kafka_conf_new();
        assert_int_equal(rd_kafka_conf_set(raw, "security.protocol", "ssl", err, sizeof(err)),
                         RD_KAFKA_CONF_OK);
        assert_int_equal(rd_kafka_conf_set(raw, props[i], dir, err, sizeof(err)), RD_KAFKA_CONF_OK);
        if (!kafka_conf_files_ok(raw, err, sizeof(err)))
            fail_msg("%s a directory refused: %s", props[i], err);
        rd_kafka_conf_destroy(raw);
    }
    unlink(fifo);
    rmdir(dir);
}

/* A self-signed certificate (EC P-256, valid until 2126): a CA file librdkafka loads. */
static const char test_ca_pem[] =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBbzCCARWgAwIBAgIUcoO78kWDvZsJSoZsPoWSX31ouTAwCgYIKoZIzj0EAwIw\n"
    "DDEKMAgGA1UEAwwBdDAgFw0yNjExMjkwMjQzMTZaGA8yMTI2MTEwNTAyNDMxNlow\n"
    "DDEKMAgGA1UEAwwBdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABPFe5p7AyQeH\n"
    "Tz7NCL6K1F37G89cFSOwjUdMB4po8h21i9bcS1s4eYNyOclpeQyY9tvJ+2JsNF7x\n"
    "dJOKOcii98ejUzBRMB0GA1UdDgQWBBS9C0kqwGMxq3ml7iPZavSkzR+acjAfBgNV\n"
    "HSMEGDAWgBS9C0kqwGMxq3ml7iPZavSkzR+acjAPBgNVHRMBAf8EBTADAQH/MAoG\n"
    "CCqGSM49BAMCA0gAMEUCIAtprh6lg1CD+VPfti/3k3qP83uKKXkecZEDDjdyZQvO\n"
    "AiEA1JJvblYamS9fHAPXcn9yxNgwOvq0G1IBWeUGwykp+aM=\n"
    "-----END CERTIFICATE-----\n";

/* The window kafka_conf_files_ok leaves, made real: the CA file is swapped for a FIFO (by one
 * rename) after kafka_conf_pin_files and before rd_kafka_new, as a file can be after any check.
 * librdkafka must load the file that was checked (the producer is made, at once) and never open
 * the FIFO (the alarm turns that wait into a failure); an error of librdkafka's names the path,
 * not the /proc alias it was handed. */
static void test_pinned_tls_file_is_the_one_checked(void **state)
{
    (void)state;
    char dir[128], ca[192], fifo[192], key[192], err[1024];
    snprintf(dir, sizeof(dir), "/tmp/test_kafka_%ld_pins", (long)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    snprintf(key, sizeof(key), "%s/key.pem", dir);
    FILE *f = fopen(ca, "w");
    assert_non_null(f);
    fputs(test_ca_pem, f);
    fclose(f);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    assert_int_equal(rd_kafka_conf_set(conf, "security.protocol", "ssl", err, sizeof(err)),
                     RD_KAFKA_CONF_OK);
    assert_int_equal(rd_kafka_conf_set(conf, "ssl.ca.location", ca, err, sizeof(err)),
                     RD_KAFKA_CONF_OK);
    KafkaPins pins;
    if (!kafka_conf_pin_files(conf, &pins, err, sizeof(err)))
        fail_msg("a regular CA file refused: %s", err);
    assert_int_equal(rename(fifo, ca), 0); /* the path is a FIFO from now on */
    signal(SIGALRM, on_files_alarm);
    alarm(30);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    alarm(0);
    if (!rk)
        fail_msg("the producer was refused: %s", err);
    kafka_pins_close(&pins);
    rd_kafka_destroy(rk);

    /* The path, a FIFO now, is refused by the next producer's pinning, naming it. */
    conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "security.protocol", "ssl", err, sizeof(err));
    rd_kafka_conf_set(conf, "ssl.ca.location", ca, err, sizeof(err));
    assert_false(kafka_conf_pin_files(conf, &pins, err, sizeof(err)));
    char want[400];
    snprintf(want, sizeof(want), "kafka ssl.ca.location %s: not a regular file", ca);
    if (!strstr(err, want))
        fail_msg("got \"%s\"", err);
    rd_kafka_conf_destroy(conf);

    /* librdkafka's own error (a key that is not PEM) names the path it was configured with. */
    f = fopen(key, "w");
    assert_non_null(f);
    fputs("not a key\n", f);
    fclose(f);
    unlink(ca);
    conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "security.protocol", "ssl", err, sizeof(err));
    rd_kafka_conf_set(conf, "ssl.key.location", key, err, sizeof(err));
    assert_true(kafka_conf_pin_files(conf, &pins, err, sizeof(err)));
    char alias[300];
    size_t len = sizeof(alias);
    assert_int_equal(rd_kafka_conf_get(conf, "ssl.key.location", alias, &len), RD_KAFKA_CONF_OK);
    assert_non_null(strstr(alias, "/proc/self/fd/"));
    snprintf(err, sizeof(err), "ssl.key.location failed: cannot read %s: bad", alias);
    kafka_pins_text(&pins, err, sizeof(err));
    snprintf(want, sizeof(want), "ssl.key.location failed: cannot read %s: bad", key);
    assert_string_equal(err, want);
    /* An absent file is refused by the pinning itself (a FIFO made there later would wait). */
    rd_kafka_conf_t *absent = rd_kafka_conf_new();
    rd_kafka_conf_set(absent, "security.protocol", "ssl", err, sizeof(err));
    rd_kafka_conf_set(absent, "ssl.certificate.location", ca, err, sizeof(err));
    KafkaPins none;
    assert_false(kafka_conf_pin_files(absent, &none, err, sizeof(err)));
    assert_non_null(strstr(err, "No such file"));
    rd_kafka_conf_destroy(absent);
    kafka_pins_close(&pins);
    rd_kafka_conf_destroy(conf);
    unlink(key);
    rmdir(dir);
}

/* An error of librdkafka's naming one pinned file is given that file's path, not another's whose
 * descriptor number starts the same: with 3 free and 4 to 30 taken, two pins get 3 and 31, and
 * "/proc/self/fd/31" is not "/proc/self/fd/3" followed by a 1. A path written in is final. */
static void test_pins_text_matches_whole_numbers(void **state)
{
    (void)state;
    KafkaPins pins = {0};
    pins.fd[0] = 3 + 1, pins.path[0] = "/etc/kafka/ca.pem";
    pins.fd[2] = 31 + 1, pins.path[2] = "/etc/kafka/client.pem";
    char text[256] = "ssl.certificate.location failed: cannot read /proc/self/fd/31: bad; "
                     "/proc/self/fd/3 too";
    kafka_pins_text(&pins, text, sizeof(text));
    assert_string_equal(text, "ssl.certificate.location failed: cannot read "
                              "/etc/kafka/client.pem: bad; /etc/kafka/ca.pem too");
    /* A path that holds an alias (an operator's own /proc/self/fd/31 pinned as 3) is not
     * rewritten again, and no room leaves the alias. */
    pins.fd[2] = 0;
    pins.path[0] = "/proc/self/fd/31";
    snprintf(text, sizeof(text), "at /proc/self/fd/3.");
    kafka_pins_text(&pins, text, sizeof(text));
    assert_string_equal(text, "at /proc/self/fd/31.");
    char small[24] = "at /proc/self/fd/3.";
    pins.path[0] = "/a/path/that/is/far/too/long.pem";
    kafka_pins_text(&pins, small, sizeof(small));
    assert_string_equal(small, "at /proc/self/fd/3.");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_protective_defaults),
        cmocka_unit_test(test_partitioner_follows_the_layout),
        cmocka_unit_test(test_tls_files_must_be_regular),
        cmocka_unit_test(test_pinned_tls_file_is_the_one_checked),
        cmocka_unit_test(test_pins_text_matches_whole_numbers),
        cmocka_unit_test(test_flags_come_after_the_defaults),
        cmocka_unit_test(test_idempotence_cannot_be_turned_off),
        cmocka_unit_test(test_delivery_callbacks_cannot_be_set),
        cmocka_unit_test(test_rejected_property_names_its_origin),
        cmocka_unit_test(test_refused_property_names_its_origin),
        cmocka_unit_test(test_producer_refusal_names_its_origin),
        cmocka_unit_test(test_gapless_cannot_be_turned_off),
        cmocka_unit_test(test_idempotence_spelled_otherwise),
        cmocka_unit_test(test_short_message_timeout_refused),
        cmocka_unit_test(test_long_message_timeout_warns),
        cmocka_unit_test(test_message_timeout_against_every_database),
        cmocka_unit_test(test_scattering_partitioners_refused),
        cmocka_unit_test(test_transactional_id_refused),
        cmocka_unit_test(test_report_only_error_refused),
        cmocka_unit_test(test_mock_brokers_refused),
        cmocka_unit_test(test_retired_producer_reports_to_no_one),
        cmocka_unit_test(test_retire_thread_takes_no_signals),
        cmocka_unit_test(test_retired_producer_says_nothing_of_the_live_one),
        cmocka_unit_test(test_free_beside_a_retiring_producer_does_not_block),
        cmocka_unit_test(test_free_then_frees_payloads_after_the_destroy),
        cmocka_unit_test(test_fatal_without_a_producer),
        cmocka_unit_test(test_setup_errors_are_not_rejections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
