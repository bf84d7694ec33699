/* Unit tests for config.c: commands, defaults, flag forms, precedence and every error path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ev.h>

#include "config.h"
#include "databases.h"
#include "kafka.h"
#include "log.h"
#include "registry.h"
#include "reload.h"
#include "secrets.h"

#define MAX_ARGS 32

/* Runs config_load over a NULL-terminated list of arguments (argv[0] is added). */
static bool load_args(Config *cfg, char *err, size_t errlen, const char *first, ...)
{
    char *argv[MAX_ARGS];
    int argc = 0;
    argv[argc++] = (char *)"outbox-relay";
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a; a = va_arg(ap, const char *)) {
        assert_true(argc < MAX_ARGS - 1);
        argv[argc++] = (char *)a;
    }
    va_end(ap);
    argv[argc] = NULL;
    memset(err, 0, errlen);
    return config_load(cfg, argc, argv, err, errlen);
}

#define LOAD(cfg, err, ...) load_args((cfg), (err), sizeof(err), __VA_ARGS__, (const char *)NULL)

/* A failed load: one non-empty line (no newline) in err that contains `needle`. */
static void assert_error_line(const char *err, const char *needle)
{
    assert_true(strlen(err) > 0);
    assert_null(strchr(err, '\n'));
    if (!strstr(err, needle))
        fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
}

/* Temporary files of the running test, removed by the teardown even when the test fails. */
static char temp_paths[8][64];
static size_t n_temp_paths;

/* Writes text to a fresh temporary file; its path goes to path (at least 64 bytes). */
static void write_temp(char *path, const char *text)
{
    strcpy(path, "/tmp/outbox-relay-test-config-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_true(n_temp_paths < sizeof(temp_paths) / sizeof(temp_paths[0]));
    strcpy(temp_paths[n_temp_paths++], path);
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    assert_int_equal(close(fd), 0);
}

static int clean_env(void **state)
{
    (void)state;
    unsetenv("DATABASE_URL");
    unsetenv("DATABASE_URL_FILE");
    unsetenv("KAFKA_BROKERS");
    unsetenv("SCHEMA_REGISTRY_URL");
    /* Not the host's installed service (a package installed here must not change the tests). */
    config_set_installed_dir("/nonexistent/outbox-relay");
    for (size_t i = 0; i < n_temp_paths; i++)
        unlink(temp_paths[i]);
    n_temp_paths = 0;
    return 0;
}

/* ---- commands -------------------------------------------------------------------------- */

static void test_command_run(void **state)
{
    Config cfg;
    char err[256];
    assert_true(
        LOAD(&cfg, err, "run", "--database-url", "postgresql://h/db", "--brokers", "k:9092"));
    assert_int_equal(cfg.command, CMD_RUN);
    assert_string_equal(cfg.database_url, "postgresql://h/db");
    assert_string_equal(cfg.brokers, "k:9092");
    config_free(&cfg);
}

static void test_command_migrate(void **state)
{
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "migrate", "--database-url", "postgresql://h/db"));
    assert_int_equal(cfg.command, CMD_MIGRATE);
    assert_string_equal(cfg.database_url, "postgresql://h/db");
    assert_null(cfg.brokers);
    config_free(&cfg);
}

static void test_command_help(void **state)
{
    const char *spellings[] = {"--help", "-h", "help"};
    for (size_t i = 0; i < sizeof(spellings) / sizeof(spellings[0]); i++) {
        Config cfg;
        char err[256];
        assert_true(LOAD(&cfg, err, spellings[i]));
        assert_int_equal(cfg.command, CMD_HELP);
        config_free(&cfg);
    }
}

static void test_command_help_after_run(void **state)
{
    /* --help anywhere wins, even without the options run requires. */
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "run", "--help"));
    assert_int_equal(cfg.command, CMD_HELP);
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "migrate", "--batch-size", "5", "-h"));
    assert_int_equal(cfg.command, CMD_HELP);
    config_free(&cfg);
}

static void test_command_version(void **state)
{
    const char *spellings[] = {"--version", "version"};
    for (size_t i = 0; i < sizeof(spellings) / sizeof(spellings[0]); i++) {
        Config cfg;
        char err[256];
        assert_true(LOAD(&cfg, err, spellings[i]));
        assert_int_equal(cfg.command, CMD_VERSION);
        config_free(&cfg);
    }
}

/* Nothing may follow help or version: the extras were ignored, exit 0 ("version --bogus"). */
static void test_help_and_version_take_no_arguments(void **state)
{
    const char *cases[][2] = {{"version", "--bogus"}, {"--version", "extra"}, {"-V", "x"},
                              {"help", "foo"},        {"--help", "run"},      {"-h", "-h"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Config cfg;
        char err[256], want[64];
        if (LOAD(&cfg, err, cases[i][0], cases[i][1]))
            fail_msg("'%s %s' accepted", cases[i][0], cases[i][1]);
        snprintf(want, sizeof(want), "%s takes no arguments, got '%s'", cases[i][0], cases[i][1]);
        assert_error_line(err, want);
        config_free(&cfg);
    }
}

static void test_missing_command(void **state)
{
    Config cfg;
    char err[256];
    char *argv[] = {(char *)"outbox-relay", NULL};
    assert_false(config_load(&cfg, 1, argv, err, sizeof(err)));
    assert_error_line(err, "missing command");
    config_free(&cfg);
}

static void test_unknown_command(void **state)
{
    Config cfg;
    char err[256];
    assert_false(LOAD(&cfg, err, "frobnicate"));
    assert_string_equal(err, "unknown command 'frobnicate': try 'outbox-relay --help'");
    config_free(&cfg);
}

static void test_option_before_command(void **state)
{
    Config cfg;
    char err[256];
    assert_false(LOAD(&cfg, err, "--brokers", "k:9092", "run"));
    assert_error_line(err, "--brokers");
    config_free(&cfg);
}

/* ---- defaults and flag forms ----------------------------------------------------------- */

static void test_defaults(void **state)
{
    Config cfg;
    char err[256];
    assert_true(
        LOAD(&cfg, err, "run", "--database-url", "postgresql://h/db", "--brokers", "k:9092"));
    assert_int_equal(cfg.batch_size, 800);
    assert_string_equal(cfg.topic_template, "outbox.event.{aggregate_type}");
    assert_int_equal(cfg.log_level, LOG_INFO);
    assert_int_equal(cfg.poll_interval_ms, 1000);
    assert_int_equal(cfg.shutdown_timeout_ms, 10000);
    assert_int_equal(cfg.schema_registry_lookup_rate, 20); /* registry.c's budget before the flag */
    assert_null(cfg.config_file);
    assert_null(cfg.kafka.items);
    assert_int_equal(cfg.kafka.len, 0);
    config_free(&cfg);
}

static void test_flag_separate_value(void **state)
{
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "run", "--database-url", "postgresql://h/db", "--brokers", "k:9092",
                     "--batch-size", "50", "--topic-template", "t.{event_type}", "--log-level",
                     "debug", "--poll-interval", "250", "--shutdown-timeout", "0"));
    assert_int_equal(cfg.batch_size, 50);
    assert_string_equal(cfg.topic_template, "t.{event_type}");
    assert_int_equal(cfg.log_level, LOG_DEBUG);
    assert_int_equal(cfg.poll_interval_ms, 250);
    assert_int_equal(cfg.shutdown_timeout_ms, 0);
    config_free(&cfg);
}

static void test_flag_equals_value(void **state)
{
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "run", "--database-url=host=h dbname=d", "--brokers=a:1,b:2",
                     "--batch-size=7", "--topic-template=x.{aggregate_type}", "--log-level=error",
                     "--poll-interval=3600000", "--shutdown-timeout=5"));
    assert_string_equal(cfg.database_url, "host=h dbname=d");
    assert_string_equal(cfg.brokers, "a:1,b:2");
    assert_int_equal(cfg.batch_size, 7);
    assert_string_equal(cfg.topic_template, "x.{aggregate_type}");
    assert_int_equal(cfg.log_level, LOG_ERROR);
    assert_int_equal(cfg.poll_interval_ms, 3600000);
    assert_int_equal(cfg.shutdown_timeout_ms, 5);
    config_free(&cfg);
}

static void test_flag_value_with_equals(void **state)
{
    /* Only the first '=' separates the name; the value keeps the rest. */
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=postgresql://h/db?sslmode=require"));
    assert_string_equal(cfg.database_url, "postgresql://h/db?sslmode=require");
    config_free(&cfg);
}

static void test_batch_size_bounds_accepted(void **state)
{
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=x", "--batch-size=1"));
    assert_int_equal(cfg.batch_size, 1);
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=x", "--batch-size=100000"));
    assert_int_equal(cfg.batch_size, 100000);
    config_free(&cfg);
}

static void test_last_flag_wins(void **state)
{
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=first", "--database-url", "second",
                     "--batch-size=3", "--batch-size=4"));
    assert_string_equal(cfg.database_url, "second");
    assert_int_equal(cfg.batch_size, 4);
    config_free(&cfg);
}

/* ---- precedence ------------------------------------------------------------------------ */

/* JSON has no comments: keys starting with # are ignored, whatever their value, so the shipped
 * relay.json can list every option commented out (issue 44). */
static void test_file_comment_keys(void **state)
{
    char path[64];
    write_temp(path, "{\"#\": \"a note\", \"# batch-size\": \"rows per claim\", "
                     "\"#batch-size\": 5, \"#kafka\": {\"acks\": 0}, \"#no-such-option\": [1],"
                     " \"database-url\": \"file-db\", \"brokers\": \"k:1\"}");
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "run", "--config", path));
    assert_int_equal(cfg.batch_size, 800);
    assert_int_equal(cfg.kafka.len, 0);
    config_free(&cfg);
}

static void test_precedence_database_url(void **state)
{
    char path[64];
    write_temp(path, "{\"database-url\": \"file-db\", \"brokers\": \"file-brokers\"}");
    Config cfg;
    char err[256];

    /* file > default (there is none) */
    assert_true(LOAD(&cfg, err, "run", "--config", path));
    assert_string_equal(cfg.database_url, "file-db");
    assert_string_equal(cfg.config_file, path);
    config_free(&cfg);

    /* env > file */
    setenv("DATABASE_URL", "env-db", 1);
    assert_true(LOAD(&cfg, err, "run", "--config", path));
    assert_string_equal(cfg.database_url, "env-db");
    config_free(&cfg);

    /* flag > env > file, whatever the order of --config on the line */
    assert_true(LOAD(&cfg, err, "run", "--database-url", "flag-db", "--config", path));
    assert_string_equal(cfg.database_url, "flag-db");
    config_free(&cfg);

    /* an empty environment variable counts as unset */
    setenv("DATABASE_URL", "", 1);
    assert_true(LOAD(&cfg, err, "run", "--config", path));
    assert_string_equal(cfg.database_url, "file-db");
    config_free(&cfg);

    unsetenv("DATABASE_URL");
    unlink(path);
}

static void test_precedence_brokers(void **state)
{
    char path[64];
    write_temp(path, "{\"database-url\": \"file-db\", \"brokers\": \"file:1\"}");
    Config cfg;
    char err[256];

    assert_true(LOAD(&cfg, err, "run", "--config", path));
    assert_string_equal(cfg.brokers, "file:1");
    config_free(&cfg);

    setenv("KAFKA_BROKERS", "env:1", 1);
    assert_true(LOAD(&cfg, err, "run", "--config", path));
    assert_string_equal(cfg.brokers, "env:1");
    config_free(&cfg);

    assert_true(LOAD(&cfg, err, "run", "--config", path, "--brokers=flag:1"));
    assert_string_equal(cfg.brokers, "flag:1");
    config_free(&cfg);

    /* env alone, no file */
    setenv("DATABASE_URL", "env-db", 1);
    assert_true(LOAD(&cfg, err, "run"));
    assert_string_equal(cfg.brokers, "env:1");
    assert_string_equal(cfg.database_url, "env-db");
    config_free(&cfg);

    unsetenv("DATABASE_URL");
    unsetenv("DATABASE_URL_FILE");
    unsetenv("KAFKA_BROKERS");
    unlink(path);
}

static void test_precedence_batch_size(void **state)
{
    char path[64];
    write_temp(path, "{\"batch-size\": 250, \"log-level\": \"warn\", \"poll-interval\": \"40\","
                     " \"topic-template\": \"f.{event_type}\"}");
    Config cfg;
    char err[256];

    /* file > default */
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path));
    assert_int_equal(cfg.batch_size, 250);
    assert_int_equal(cfg.log_level, LOG_WARN);
    assert_int_equal(cfg.poll_interval_ms, 40);
    assert_string_equal(cfg.topic_template, "f.{event_type}");
    assert_int_equal(cfg.shutdown_timeout_ms, 10000); /* not in the file: default */
    config_free(&cfg);

    /* flag > file */
    assert_true(
        LOAD(&cfg, err, "migrate", "--batch-size", "9", "--database-url=x", "--config", path));
    assert_int_equal(cfg.batch_size, 9);
    config_free(&cfg);

    unlink(path);
}

/* ---- kafka properties ------------------------------------------------------------------ */

static void assert_prop(const Config *cfg, size_t i, const char *key, const char *value)
{
    assert_true(i < cfg->kafka.len);
    assert_string_equal(cfg->kafka.items[i].key, key);
    assert_string_equal(cfg->kafka.items[i].value, value);
}

static void test_kafka_flags_in_order(void **state)
{
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=x", "--kafka", "acks=all",
                     "--kafka=linger.ms=5", "--kafka", "client.id=a=b", "--kafka", "empty="));
    assert_int_equal(cfg.kafka.len, 4);
    assert_prop(&cfg, 0, "acks", "all");
    assert_prop(&cfg, 1, "linger.ms", "5");
    assert_prop(&cfg, 2, "client.id", "a=b");
    assert_prop(&cfg, 3, "empty", "");
    config_free(&cfg);
}

static void test_kafka_file_then_flags(void **state)
{
    char path[64];
    write_temp(path, "{\"kafka\": {\"acks\": \"all\", \"linger.ms\": 5,"
                     " \"enable.idempotence\": true, \"z.first\": \"1\"}}");
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "migrate", "--kafka=compression.type=lz4", "--database-url=x",
                     "--config", path, "--kafka", "acks=1"));
    assert_int_equal(cfg.kafka.len, 6);
    assert_prop(&cfg, 0, "acks", "all");
    assert_prop(&cfg, 1, "linger.ms", "5");
    assert_prop(&cfg, 2, "enable.idempotence", "true");
    assert_prop(&cfg, 3, "z.first", "1");
    assert_prop(&cfg, 4, "compression.type", "lz4");
    assert_prop(&cfg, 5, "acks", "1");
    config_free(&cfg);
    unlink(path);
}

static void test_parse_kafka_prop(void **state)
{
    OptList list = {0};
    assert_true(opts_list_append(&list, "a=b=c"));
    assert_int_equal(list.len, 1);
    assert_string_equal(list.items[0].key, "a");
    assert_string_equal(list.items[0].value, "b=c");
    assert_false(opts_list_append(&list, "novalue"));
    assert_false(opts_list_append(&list, "=v"));
    assert_false(opts_list_append(&list, ""));
    assert_int_equal(list.len, 1);
    free(list.items[0].key);
    free(list.items[0].value);
    free(list.items);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void test_error_unknown_option(void **state)
{
    Config cfg;
    char err[256];
    assert_false(LOAD(&cfg, err, "run", "--bogus", "1"));
    assert_string_equal(err, "unknown option '--bogus': try 'outbox-relay --help'");
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "run", "--batch-size-x=3"));
    assert_error_line(err, "'--batch-size-x'");
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "migrate", "-x"));
    assert_error_line(err, "'-x'");
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "migrate", "stray"));
    assert_error_line(err, "'stray'");
    config_free(&cfg);
}

static void test_error_missing_value(void **state)
{
    Config cfg;
    char err[256];
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers"));
    assert_error_line(err, "--brokers");
    assert_error_line(err, "needs a value");
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--kafka"));
    assert_error_line(err, "--kafka");
    config_free(&cfg);
}

static void test_error_empty_string_value(void **state)
{
    Config cfg;
    char err[256];
    assert_false(LOAD(&cfg, err, "migrate", "--database-url="));
    assert_error_line(err, "--database-url");
    assert_error_line(err, "empty");
    config_free(&cfg);
}

static void test_error_batch_size(void **state)
{
    /* Digits only: strtol alone would take the blanks and signs (" 5" and "+5" as 5). */
    const char *bad[] = {
        "abc", "0", "100001", "12x", "", "-1", " 5", "+5", " -1", "5 ", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        Config cfg;
        char err[256], quoted[64];
        assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--batch-size", bad[i]));
        assert_error_line(err, "--batch-size");
        assert_error_line(err, "1 to 100000");
        snprintf(quoted, sizeof(quoted), "'%s'", bad[i]);
        assert_error_line(err, quoted);
        config_free(&cfg);
    }
}

static void test_error_batch_size_exact_text(void **state)
{
    Config cfg;
    char err[256];
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--batch-size=12x"));
    assert_string_equal(err, "--batch-size: expected an integer from 1 to 100000, got '12x'");
    config_free(&cfg);
}

static void test_error_batch_size_in_file(void **state)
{
    char path[64];
    write_temp(path, "{\"batch-size\": 0}");
    Config cfg;
    char err[256];
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path));
    assert_error_line(err, path);
    assert_error_line(err, "batch-size");
    assert_error_line(err, "'0'");
    config_free(&cfg);
    unlink(path);
}

static void test_error_log_level(void **state)
{
    Config cfg;
    char err[256];
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--log-level", "loud"));
    assert_string_equal(err, "--log-level: expected debug, info, warn or error, got 'loud'");
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--log-level=INFO"));
    assert_error_line(err, "'INFO'");
    config_free(&cfg);
}

/* Rejected values are echoed back; the error must still be one line (no raw newline). */
static void test_error_value_with_newline_is_one_line(void **state)
{
    Config cfg;
    char err[256];
    bool ok = LOAD(&cfg, err, "migrate", "--database-url=x", "--log-level", "in\nfo");
    config_free(&cfg);
    assert_false(ok);
    assert_error_line(err, "--log-level");
}

static void test_error_malformed_json(void **state)
{
    char path[64], line[32];
    write_temp(path, "{\n  \"brokers\": \"k:9092\",\n  oops\n}\n");
    Config cfg;
    char err[512];
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--config", path));
    assert_error_line(err, path);
    snprintf(line, sizeof(line), "line %d", 3);
    assert_error_line(err, line);
    config_free(&cfg);
    unlink(path);
}

static void test_error_duplicate_key(void **state)
{
    char path[64];
    write_temp(path, "{\"batch-size\": 1,\n\"batch-size\": 2}");
    Config cfg;
    char err[512];
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path));
    assert_error_line(err, path);
    assert_error_line(err, "line 2");
    config_free(&cfg);
    unlink(path);
}

static void test_error_unreadable_file(void **state)
{
    const char *path = "/nonexistent-outbox-relay-dir/config.json";
    Config cfg;
    char err[512];
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path));
    assert_error_line(err, "config file /nonexistent-outbox-relay-dir/config.json");
    config_free(&cfg);
}

/* A directory as --config is said so (it was a JSON parse error); a JSON true or false is taken
 * by switches only ("table": true named a table "true"), in the file and in a --databases
 * entry. */
static void test_error_config_directory_and_booleans(void **state)
{
    Config cfg;
    char err[512], path[64];
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", "/tmp"));
    assert_string_equal(err, "config file /tmp: Is a directory");
    config_free(&cfg);
    const char *bad[] = {"{\"table\": true}", "{\"topic-template\": false}",
                         "{\"batch-size\": true}", "{\"claim-floor\": false}",
                         "{\"retention\": false}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_temp(path, bad[i]);
        if (LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--config", path))
            fail_msg("%s accepted", bad[i]);
        assert_error_line(err, "expected a string or a number (true and false are for switches)");
        config_free(&cfg);
    }
    write_temp(path, "{\"require-tls\": true, \"json\": false, \"all\": 0}");
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--config", path));
    assert_true(cfg.require_tls);
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "run", "--brokers=k:1", "--databases",
                      "[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\","
                      " \"table\": true}]"));
    assert_error_line(err, "databases \"a\": key \"table\": expected a string or a number");
    config_free(&cfg);
}

static void test_error_top_level_not_object(void **state)
{
    const char *texts[] = {"[1, 2]", "[]"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        char path[64];
        write_temp(path, texts[i]);
        Config cfg;
        char err[512];
        assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path));
        assert_error_line(err, path);
        assert_error_line(err, "object");
        config_free(&cfg);
        unlink(path);
    }
}

static void test_error_unknown_config_key(void **state)
{
    char path[64];
    write_temp(path, "{\"batch-size\": 5, \"batchsize\": 5}");
    Config cfg;
    char err[512], expected[256];
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path));
    snprintf(expected, sizeof(expected), "config file %s: unknown key \"batchsize\"", path);
    assert_string_equal(err, expected);
    config_free(&cfg);
    unlink(path);
}

static void test_error_config_key_in_file(void **state)
{
    char path[64];
    write_temp(path, "{\"config\": \"/etc/other.json\"}");
    Config cfg;
    char err[512];
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path));
    assert_error_line(err, path);
    assert_error_line(err, "\"config\"");
    config_free(&cfg);
    unlink(path);
}

static void test_error_kafka_not_object(void **state)
{
    const char *texts[] = {"{\"kafka\": \"acks=all\"}", "{\"kafka\": [\"acks=all\"]}",
                           "{\"kafka\": {\"acks\": {\"x\": 1}}}", "{\"kafka\": {\"acks\": null}}",
                           "{\"kafka\": {\"\": \"v\"}}"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        char path[64];
        write_temp(path, texts[i]);
        Config cfg;
        char err[512];
        assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path));
        assert_error_line(err, path);
        assert_error_line(err, "\"kafka\"");
        config_free(&cfg);
        unlink(path);
    }
}

static void test_error_kafka_flag(void **state)
{
    Config cfg;
    char err[256];
    /* The text is never echoed: without its '=' a secret value cannot be told from a key. */
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--kafka", "s3cret-value"));
    assert_string_equal(err, "--kafka: expected KEY=VALUE (a non-empty key, then '=')");
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--kafka==s3cret-value"));
    assert_string_equal(err, "--kafka: expected KEY=VALUE (a non-empty key, then '=')");
    config_free(&cfg);

    /* a good property before a bad one is still released by config_free */
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=x", "--kafka=acks=all", "--kafka=x"));
    assert_error_line(err, "--kafka");
    config_free(&cfg);
}

/* ---- durations and retention ------------------------------------------------------------- */

static void test_parse_duration(void **state)
{
    const struct {
        const char *text;
        long seconds;
    } good[] = {{"off", 0},      {"0", 0},       {"0s", 0},   {"00", 0},
                {"000", 0},      {"00s", 0},     {"90s", 90}, {"30m", 1800},
                {"72h", 259200}, {"7d", 604800}, {"1s", 1},   {"3650d", 3650L * 86400}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        long s = -1;
        if (!opts_parse_duration(good[i].text, &s) || s != good[i].seconds)
            fail_msg("\"%s\": got %ld, want %ld", good[i].text, s, good[i].seconds);
    }
    const char *bad[] = {"",
                         "s",
                         "10",
                         "10x",
                         "-5s",
                         "+5s",
                         "5 s",
                         "5sec",
                         "1h30m",
                         "3651d",
                         "99999999999999999999s",
                         "OFF",
                         "1.5h",
                         " -1h", /* strtol skips the blank, then takes the sign */
                         " 5s",
                         "\t5s",
                         "\n5s",
                         " +5s",
                         " 0s",
                         "-0s"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        long s = -1;
        if (opts_parse_duration(bad[i], &s))
            fail_msg("\"%s\" accepted as %ld", bad[i], s);
    }
}

static void test_retention_option(void **state)
{
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k"));
    assert_int_equal(cfg.retention_s, 0); /* keep forever by default */
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k", "--retention", "72h"));
    assert_int_equal(cfg.retention_s, 72 * 3600);
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k", "--retention", "72"));
    assert_error_line(err, "--retention: expected a duration");
    config_free(&cfg);
}

/* --dry-run is migrate's and replay's: every other command, given it as a flag, refuses it,
 * since each of them did its work for real (`purge-dead --all --dry-run` deleted every dead
 * event, `requeue --all --dry-run` requeued them, `run --dry-run` relayed). */
static void test_dry_run_refused_by_commands_without_one(void **state)
{
    Config cfg;
    char err[256];
    const char *cmds[][3] = {{"purge-dead", "--all", NULL},
                             {"requeue", "--all", NULL},
                             {"run", "--brokers=k:1", NULL},
                             {"check", "--brokers=k:1", NULL},
                             {"verify", "--brokers=k:1", NULL},
                             {"dead", NULL, NULL},
                             {"status", NULL, NULL}};
    for (size_t c = 0; c < sizeof(cmds) / sizeof(cmds[0]); c++) {
        bool ok = cmds[c][1]
                      ? LOAD(&cfg, err, cmds[c][0], "--database-url=x", cmds[c][1], "--dry-run")
                      : LOAD(&cfg, err, cmds[c][0], "--database-url=x", "--dry-run");
        if (ok) {
            config_free(&cfg);
            fail_msg("%s took --dry-run", cmds[c][0]);
        }
        char want[96];
        snprintf(want, sizeof(want),
                 "%s does not take --dry-run (migrate and replay have a dry run", cmds[c][0]);
        assert_error_line(err, want);
        config_free(&cfg);
    }
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=x", "--dry-run"));
    assert_true(cfg.dry_run);
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "replay", "--database-url=x", "--from-id=1", "--dry-run"));
    assert_true(cfg.dry_run);
    config_free(&cfg);
}

/* --dry-run is a flag only: a config file is shared by every command (the unit's relay.json), and
 * "dry-run": true there made migrate, an init container's, change nothing and exit 0 (replay, too,
 * replayed nothing), while the other commands ignored it. Every command refuses it from the file,
 * in one line; a --databases entry refuses it as no per-database option. */
static void test_dry_run_refused_from_config_file(void **state)
{
    (void)state;
    Config cfg;
    char path[64], err[512];
    write_temp(path, "{\"dry-run\": true, \"brokers\": \"k:1\"}");
    const char *cmds[][2] = {{"migrate", NULL},       {"replay", "--from-id=1"}, {"run", NULL},
                             {"purge-dead", "--all"}, {"requeue", "--all"},      {"status", NULL}};
    for (size_t c = 0; c < sizeof(cmds) / sizeof(cmds[0]); c++) {
        bool ok = cmds[c][1] ? LOAD(&cfg, err, cmds[c][0], "--database-url=x", "--config", path,
                                    cmds[c][1])
                             : LOAD(&cfg, err, cmds[c][0], "--database-url=x", "--config", path);
        if (ok) {
            bool dry = cfg.dry_run;
            config_free(&cfg);
            fail_msg("%s took \"dry-run\": true from the config file (dry run: %s)", cmds[c][0],
                     dry ? "yes" : "no");
        }
        assert_error_line(err, "--dry-run is accepted only as a flag, not from the config file");
        config_free(&cfg);
    }
    /* false in the file changes nothing, and the flag beside such a file is still obeyed */
    write_temp(path, "{\"dry-run\": false, \"brokers\": \"k:1\"}");
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path));
    assert_false(cfg.dry_run);
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=x", "--config", path, "--dry-run"));
    assert_true(cfg.dry_run);
    config_free(&cfg);
    write_temp(path, "{\"databases\": [{\"name\": \"a\", \"database-url\": \"x\", "
                     "\"dry-run\": true}]}");
    assert_false(LOAD(&cfg, err, "migrate", "--config", path, "--database=a"));
    assert_error_line(err, "databases \"a\": key \"dry-run\": not a per-database option");
    config_free(&cfg);
}

/* replay refuses, as flags, the options of other commands that read as a selection (verify's
 * --since, requeue's --id and --all): every command takes every option, and `replay --since 2h
 * --aggregate-type order` replayed every sent order event. verify likewise refuses replay's
 * selection. From the environment they are let be (one environment file serves every
 * command). */
static void test_replay_refuses_other_selections(void **state)
{
    Config cfg;
    char err[256];
    assert_false(
        LOAD(&cfg, err, "replay", "--database-url=x", "--aggregate-type=order", "--since", "2h"));
    assert_string_equal(err, "replay does not take --since (it is verify's window; replay "
                             "selects by --sent-after/--sent-before)");
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "replay", "--database-url=x", "--aggregate-type=order", "--id=7"));
    assert_error_line(err, "replay does not take --id");
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "replay", "--database-url=x", "--aggregate-type=order", "--all"));
    assert_error_line(err, "replay does not take --all");
    config_free(&cfg);
    /* verify refuses replay's selection: it checks the window --since gives, whatever it is
     * told, and its ok would be of a window it never read. */
    const char *replays[][2] = {{"--sent-after", "2026-11-01"},
                                {"--sent-before", "2026-11-02"},
                                {"--from-id", "5"},
                                {"--to-id", "9"},
                                {"--aggregate-type", "order"},
                                {"--aggregate-id", "o-1"},
                                {"--event-type", "Created"},
                                {"--missing", "list.json"}};
    for (size_t i = 0; i < sizeof(replays) / sizeof(replays[0]); i++) {
        if (LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", replays[i][0],
                 replays[i][1]))
            fail_msg("verify took %s", replays[i][0]);
        char want[64];
        snprintf(want, sizeof(want), "verify does not take %s (it is replay's", replays[i][0]);
        assert_error_line(err, want);
        config_free(&cfg);
    }
    /* Nor requeue's: `verify --all` checked the last hour and said ok of it, `verify --id 7`
     * the same whatever event 7 is. */
    assert_false(LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", "--all"));
    assert_error_line(err, "verify does not take --all (it is requeue's");
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", "--id=7"));
    assert_error_line(err, "verify does not take --id (it is requeue's");
    config_free(&cfg);
    /* requeue and purge-dead select by --id or --all alone: another command's selection beside
     * them was ignored, and `purge-dead --all --aggregate-type order` deleted every dead event. */
    const char *dead_cmds[] = {"requeue", "purge-dead"};
    const char *others[][2] = {{"--since", "2h"},
                               {"--sent-after", "2026-11-01"},
                               {"--sent-before", "2026-11-02"},
                               {"--from-id", "5"},
                               {"--to-id", "9"},
                               {"--aggregate-type", "order"},
                               {"--aggregate-id", "o-1"},
                               {"--event-type", "Created"},
                               {"--missing", "list.json"}};
    for (size_t c = 0; c < 2; c++)
        for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
            if (LOAD(&cfg, err, dead_cmds[c], "--database-url=x", "--all", others[i][0],
                     others[i][1]))
                fail_msg("%s took %s", dead_cmds[c], others[i][0]);
            char want[64];
            snprintf(want, sizeof(want), "%s does not take %s (it is ", dead_cmds[c], others[i][0]);
            assert_error_line(err, want);
            config_free(&cfg);
        }
    /* dead lists every dead-lettered event: a selection beside it was ignored, and `dead
     * --aggregate-type order` listed them all, which read as the order ones. */
    const char *not_dead[][2] = {{"--since", "2h"},
                                 {"--sent-after", "2026-11-01"},
                                 {"--sent-before", "2026-11-02"},
                                 {"--from-id", "5"},
                                 {"--to-id", "9"},
                                 {"--aggregate-type", "order"},
                                 {"--aggregate-id", "o-1"},
                                 {"--event-type", "Created"},
                                 {"--missing", "list.json"},
                                 {"--id", "7"},
                                 {"--all", NULL}};
    for (size_t i = 0; i < sizeof(not_dead) / sizeof(not_dead[0]); i++) {
        bool took = not_dead[i][1] ? LOAD(&cfg, err, "dead", "--database-url=x", not_dead[i][0],
                                          not_dead[i][1])
                                   : LOAD(&cfg, err, "dead", "--database-url=x", not_dead[i][0]);
        if (took)
            fail_msg("dead took %s", not_dead[i][0]);
        char want[64];
        snprintf(want, sizeof(want), "dead does not take %s (it is ", not_dead[i][0]);
        assert_error_line(err, want);
        config_free(&cfg);
    }
    assert_true(LOAD(&cfg, err, "dead", "--database-url=x", "--json"));
    config_free(&cfg);
    /* The file (or the environment) may be shared by every command: taken there. */
    char path[64];
    write_temp(path, "{\"aggregate-type\": \"order\", \"since\": \"2h\"}");
    assert_true(LOAD(&cfg, err, "dead", "--database-url=x", "--config", path));
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "purge-dead", "--database-url=x", "--id=7"));
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "requeue", "--database-url=x", "--all"));
    config_free(&cfg);
    /* verify's --since is verify's; replay's own selection alone is taken. */
    assert_true(LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", "--since=2h"));
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "replay", "--database-url=x", "--aggregate-type=order"));
    config_free(&cfg);
}

/* --statement-timeout: 30 s by default, 1s to 24h; 0/off (no bound) and more than a day (a typo
 * of the unit) are refused naming the flag. */
static void test_statement_timeout_range(void **state)
{
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "status", "--database-url=x"));
    assert_int_equal(cfg.statement_timeout_s, 30);
    config_free(&cfg);
    assert_true(
        LOAD(&cfg, err, "replay", "--database-url=x", "--from-id=1", "--statement-timeout=24h"));
    assert_int_equal(cfg.statement_timeout_s, 86400);
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "dead", "--database-url=x", "--statement-timeout=1s"));
    assert_int_equal(cfg.statement_timeout_s, 1);
    config_free(&cfg);
    const char *bad[] = {"0", "off", "-1s", "86401s", "2d"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (LOAD(&cfg, err, "check", "--database-url=x", "--brokers=k:1", "--statement-timeout",
                 bad[i]))
            fail_msg("--statement-timeout '%s' accepted", bad[i]);
        assert_error_line(err, "--statement-timeout");
        config_free(&cfg);
    }
    assert_false(
        LOAD(&cfg, err, "check", "--database-url=x", "--brokers=k:1", "--statement-timeout=25h"));
    assert_string_equal(err, "--statement-timeout: expected a duration from 1s to 1d such as 90s, "
                             "30m or 2h, got '25h'");
    config_free(&cfg);
    /* 0 names the flag's own range, not the general limit of durations (3650d) */
    assert_false(
        LOAD(&cfg, err, "check", "--database-url=x", "--brokers=k:1", "--statement-timeout=0"));
    assert_string_equal(err, "--statement-timeout: expected a duration from 1s to 1d such as 90s, "
                             "30m or 2h, got '0'");
    config_free(&cfg);
}

/* Negative durations never pass, from a flag or a file; verify's --since refuses 0/off (a window
 * of nothing would check no row and say ok). */
static void test_duration_sign_and_since_minimum(void **state)
{
    Config cfg;
    char err[256], path[64];
    const char *flags[][2] = {{"--retention", " -5s"},    {"--horizon-warn", " -1m"},
                              {"--connect-wait", " -1h"}, {"--since", " -1h"},
                              {"--since", "0"},           {"--since", "off"},
                              {"--since", "0s"}};
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        if (LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", flags[i][0],
                 flags[i][1]))
            fail_msg("%s '%s' accepted", flags[i][0], flags[i][1]);
        assert_error_line(err, flags[i][0]);
        config_free(&cfg);
    }
    assert_false(LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", "--since=off"));
    assert_string_equal(err, "--since: expected a duration from 1s to 3650d such as 90s, 30m, 72h "
                             "or 7d, got 'off'");
    config_free(&cfg);
    /* Too long is refused naming the real limit (it said "at least 1s", as though 10000d were too
     * short); the limit itself is taken. */
    assert_false(LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", "--since=10000d"));
    assert_string_equal(err, "--since: expected a duration from 1s to 3650d such as 90s, 30m, 72h "
                             "or 7d, got '10000d'");
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--retention=3651d"));
    assert_string_equal(err, "--retention: expected a duration of at most 3650d such as 90s, 30m, "
                             "72h or 7d (or 0/off), got '3651d'");
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", "--since=3650d"));
    assert_int_equal(cfg.verify_since_s, 3650L * 86400);
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", "--since=1s"));
    assert_int_equal(cfg.verify_since_s, 1);
    config_free(&cfg);
    write_temp(path, "{\"retention\": \" -5s\"}");
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--config", path));
    assert_error_line(err, "retention");
    config_free(&cfg);
    write_temp(path, "{\"since\": \"off\"}");
    assert_false(LOAD(&cfg, err, "verify", "--database-url=x", "--brokers=k:1", "--config", path));
    assert_error_line(err, "since");
    config_free(&cfg);
}

static void test_purge_dead_and_status_commands(void **state)
{
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "purge-dead", "--database-url=x", "--id", "7"));
    assert_int_equal(cfg.command, CMD_PURGE_DEAD);
    assert_int_equal(cfg.id, 7);
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "purge-dead", "--database-url=x"));
    assert_string_equal(err, "purge-dead needs exactly one of --id ID or --all");
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "purge-dead", "--database-url=x", "--id=3", "--all"));
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "status", "--database-url=x", "--json"));
    assert_int_equal(cfg.command, CMD_STATUS);
    assert_true(cfg.json);
    config_free(&cfg);
}

/* ---- secrets from files ------------------------------------------------------------------- */

static void test_database_url_file(void **state)
{
    char path[64];
    Config cfg;
    char err[512];
    const char *contents[] = {"postgresql://u:pw@h/db\n", "postgresql://u:pw@h/db",
                              "postgresql://u:pw@h/db\r\n", "postgresql://u:pw@h/db\n\n"};
    for (size_t i = 0; i < sizeof(contents) / sizeof(contents[0]); i++) {
        write_temp(path, contents[i]);
        assert_true(LOAD(&cfg, err, "migrate", "--database-url-file", path));
        assert_string_equal(cfg.database_url, "postgresql://u:pw@h/db");
        config_free(&cfg);
    }

    write_temp(path, "\n");
    assert_false(LOAD(&cfg, err, "migrate", "--database-url-file", path));
    assert_error_line(err, "is empty");
    config_free(&cfg);

    write_temp(path, "postgresql://u:pw@h/db\nsecond line\n");
    assert_false(LOAD(&cfg, err, "migrate", "--database-url-file", path));
    assert_error_line(err, "more than one line");
    assert_null(strstr(err, "pw"));
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "migrate", "--database-url-file", "/nonexistent/url"));
    assert_error_line(err, "/nonexistent/url");
    config_free(&cfg);
}

static void test_database_url_file_precedence(void **state)
{
    char path[64], conf[64], both[64];
    Config cfg;
    char err[512];
    write_temp(path, "postgresql://from-file/db\n");

    /* a flag beats the environment, whichever of the two spellings each uses */
    setenv("DATABASE_URL", "postgresql://from-env/db", 1);
    assert_true(LOAD(&cfg, err, "migrate", "--database-url-file", path));
    assert_string_equal(cfg.database_url, "postgresql://from-file/db");
    config_free(&cfg);
    unsetenv("DATABASE_URL");

    setenv("DATABASE_URL_FILE", path, 1);
    assert_true(LOAD(&cfg, err, "migrate", "--database-url", "postgresql://from-flag/db"));
    assert_string_equal(cfg.database_url, "postgresql://from-flag/db");
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "migrate"));
    assert_string_equal(cfg.database_url, "postgresql://from-file/db");
    config_free(&cfg);
    unsetenv("DATABASE_URL_FILE");

    /* the environment beats the config file */
    char text[160];
    snprintf(text, sizeof(text), "{\"database-url-file\": \"%s\"}", path);
    write_temp(conf, text);
    setenv("DATABASE_URL", "postgresql://from-env/db", 1);
    assert_true(LOAD(&cfg, err, "migrate", "--config", conf));
    assert_string_equal(cfg.database_url, "postgresql://from-env/db");
    config_free(&cfg);
    unsetenv("DATABASE_URL");

    /* both from the same source is a mistake */
    assert_false(LOAD(&cfg, err, "migrate", "--database-url=postgresql://x/db",
                      "--database-url-file", path));
    assert_string_equal(err, "database-url and database-url-file are both set by flags: use one");
    config_free(&cfg);
    snprintf(text, sizeof(text), "{\"database-url-file\": \"%s\", \"database-url\": \"x\"}", path);
    write_temp(both, text);
    assert_false(LOAD(&cfg, err, "migrate", "--config", both));
    assert_error_line(err, "both set by the config file");
    config_free(&cfg);
}

static void test_kafka_file(void **state)
{
    char props[64], conf[64];
    Config cfg;
    char err[512];
    write_temp(props, "# SASL\n"
                      "  sasl.username = relay\r\n"
                      "sasl.password=p=w d \n"
                      "\n"
                      "   # indented comment\n"
                      "linger.ms=5");
    write_temp(conf, "{\"kafka\": {\"acks\": \"all\", \"linger.ms\": \"1\"}}");
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k", "--config", conf,
                     "--kafka", "linger.ms=9", "--kafka-file", props));
    /* config file entries, then the file's lines, then the flags */
    const char *want[][2] = {{"acks", "all"},
                             {"linger.ms", "1"},
                             {"sasl.username", "relay"},
                             {"sasl.password", "p=w d "},
                             {"linger.ms", "5"},
                             {"linger.ms", "9"}};
    assert_int_equal(cfg.kafka.len, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < cfg.kafka.len; i++) {
        assert_string_equal(cfg.kafka.items[i].key, want[i][0]);
        assert_string_equal(cfg.kafka.items[i].value, want[i][1]);
    }
    config_free(&cfg);

    write_temp(props, "linger.ms=5\n\nsasl.password: s3cret-value\n");
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k", "--kafka-file", props));
    assert_error_line(err, "line 3: expected KEY=VALUE");
    assert_null(strstr(err, "s3cret"));
    config_free(&cfg);

    write_temp(props, " = value\n");
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k", "--kafka-file", props));
    assert_error_line(err, "line 1");
    config_free(&cfg);
}

static void test_error_json_does_not_echo_values(void **state)
{
    /* jansson quotes the text "near" a syntax error: inside a string, part of a password. */
    char path[64];
    write_temp(path, "{\"database-url\": \"postgresql://u:s3cret-value\\q@h/db\"}");
    Config cfg;
    char err[512];
    assert_false(LOAD(&cfg, err, "migrate", "--config", path));
    assert_error_line(err, "line 1 column");
    assert_null(strstr(err, "s3cret"));
    config_free(&cfg);
}

/* A --databases list that is not JSON is said by where (line, column), never by the text jansson
 * quotes: near the error, or the escape an "invalid Unicode" error names, part of a password. The
 * config file's errors keep the same rule. */
static void test_error_databases_json_does_not_echo_values(void **state)
{
    (void)state;
    const char *bad[] = {
        "[{\"name\": \"a\", \"database-url\": postgresql://u:hunter2x@h/d}]",
        "[{\"name\": \"a\", \"database-url\": \"postgresql://u:hunter2x\n@h/d\"}]",
        "[{\"name\": \"a\", \"database-url\": \"postgresql://u:p\\uhunt@h/d\"}]",
        "[{\"name\": \"a\", \"database-url\": \"postgresql://u:p\\ud841\\u0068unt@h/d\"}]",
        "[{\"name\": \"a\", \"database-url\": \"postgresql://u:p@h/d\"}, hunter2x]",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        Config cfg;
        char err[1024];
        assert_false(LOAD(&cfg, err, "run", "--brokers", "k:9092", "--databases", bad[i]));
        assert_error_line(err, "databases: expected a JSON array of objects: line ");
        assert_error_line(err, " column ");
        if (strstr(err, "hunt") || strstr(err, "postgresql") || strstr(err, "\\u"))
            fail_msg("--databases '%s': the error quotes the input: %s", bad[i], err);
        config_free(&cfg);
    }
    char path[64];
    write_temp(path, "{\"database-url\": \"postgresql://u:p\\ud841\\u0068unt@h/db\"}");
    Config cfg;
    char err[512];
    assert_false(LOAD(&cfg, err, "migrate", "--config", path));
    assert_error_line(err, "line 1 column");
    if (strstr(err, "\\u"))
        fail_msg("config file: the error quotes the input: %s", err);
    config_free(&cfg);
    /* jansson's own quoted punctuation stays: it says what was expected. */
    write_temp(path, "{\"database-url\": \"x\"");
    assert_false(LOAD(&cfg, err, "migrate", "--config", path));
    assert_error_line(err, "'}' expected");
    config_free(&cfg);
}

/* ---- reload ------------------------------------------------------------------------------- */

typedef struct Seen {
    char names[512];
} Seen;

static void record_change(const char *option, bool reloadable, void *arg)
{
    Seen *seen = arg;
    size_t len = strlen(seen->names);
    snprintf(seen->names + len, sizeof(seen->names) - len, "%s%s%s", len ? "," : "", option,
             reloadable ? "" : "(restart)");
}

static void test_reload_diff_and_apply(void **state)
{
    Config running, fresh;
    char err[256];
    assert_true(LOAD(&running, err, "run", "--database-url=postgresql://a/db", "--brokers=k",
                     "--batch-size=10", "--topic-template=t.{aggregate_type}", "--kafka=acks=all"));
    assert_true(LOAD(&fresh, err, "run", "--database-url=postgresql://b/db", "--brokers=k",
                     "--batch-size=20", "--log-level=debug", "--retention=1h",
                     "--topic-template=u.{aggregate_type}", "--kafka=acks=-1"));
    Seen seen = {""};
    config_diff(&running, &fresh, record_change, &seen);
    assert_string_equal(seen.names, "database-url(restart),batch-size,topic-template(restart),"
                                    "kafka(restart),log-level,retention");

    config_apply_reloadable(&running, &fresh);
    assert_int_equal(running.batch_size, 20);
    assert_int_equal(running.log_level, LOG_DEBUG);
    assert_int_equal(running.retention_s, 3600);
    assert_string_equal(running.database_url, "postgresql://a/db"); /* restart-only: kept */
    assert_string_equal(running.topic_template, "t.{aggregate_type}");
    assert_string_equal(running.kafka.items[0].value, "all");

    Seen none = {""};
    config_diff(&running, &running, record_change, &none);
    assert_string_equal(none.names, "");
    config_free(&running);
    config_free(&fresh);
}

/* Rewrites the file at path in place (the same name, another content), as an operator rotating
 * a secret does. */
static void rewrite(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* The registry's client reads its auth and CA files once: a reload that finds either changed
 * under the same path names it as restart-only. The old diff compared the paths alone and said
 * nothing ("changed=none" over a rotated registry password); a list's entries too. */
static void test_reload_diff_registry_files(void **state)
{
    char auth[64], ca[64], err[512];
    write_temp(auth, "reg:first-s3cret\n");
    write_temp(ca, "-----BEGIN CERTIFICATE-----\nfirst\n-----END CERTIFICATE-----\n");
    Config running, fresh, again, list_running, list_fresh;
#define REGISTRY_ARGS                                                                              \
    "--brokers=k", "--value-format=avro", "--schema-registry-url=https://sr:8081",                 \
        "--schema-registry-auth-file", auth, "--schema-registry-ca-file", ca
#define LIST "--databases=[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]"
    assert_true(LOAD(&running, err, "run", "--database-url=postgresql://a/db", REGISTRY_ARGS));
    assert_true(LOAD(&list_running, err, "run", LIST, REGISTRY_ARGS));
    rewrite(auth, "reg:second-s3cret\n");
    rewrite(ca, "-----BEGIN CERTIFICATE-----\nsecond\n-----END CERTIFICATE-----\n");
    assert_true(LOAD(&fresh, err, "run", "--database-url=postgresql://a/db", REGISTRY_ARGS));
    assert_true(LOAD(&list_fresh, err, "run", LIST, REGISTRY_ARGS));
    Seen seen = {""}, entry = {""}, none = {""};
    config_diff(&running, &fresh, record_change, &seen);
    assert_string_equal(seen.names,
                        "schema-registry-auth-file(restart),schema-registry-ca-file(restart)");
    assert_int_equal(list_running.n_dbs, 1);
    config_diff(&list_running.dbs[0], &list_fresh.dbs[0], record_change, &entry);
    assert_string_equal(entry.names,
                        "schema-registry-auth-file(restart),schema-registry-ca-file(restart)");
    /* Read again unchanged: nothing to say. */
    assert_true(LOAD(&again, err, "run", "--database-url=postgresql://a/db", REGISTRY_ARGS));
    config_diff(&fresh, &again, record_change, &none);
    assert_string_equal(none.names, "");
#undef LIST
#undef REGISTRY_ARGS
    config_free(&running);
    config_free(&fresh);
    config_free(&again);
    config_free(&list_running);
    config_free(&list_fresh);
    secrets_clear();
}

/* The reads of a file that inotify saw since fd started watching it (IN_ACCESS, IN_OPEN and
 * IN_CLOSE_NOWRITE): the reads of one open merge into one event, an open or close ends them. */
static int reads_seen(int fd)
{
    char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
    int reads = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        for (char *at = buf; at < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)at;
            reads += (ev->mask & IN_ACCESS) != 0;
            at += sizeof(*ev) + ev->len;
        }
    return reads;
}

/* A load hashes each registry file once, however many entries of a list name it (they take it
 * from the options around the list): the CA bundle, up to 8 MiB, was read for the options
 * around the list and again for each entry, on the loop at every SIGHUP (about 2 s with 100
 * entries and a bundle at its bound; 27 ms with one). Entries that name it still tell its
 * change (test_reload_diff_registry_files). */
static void test_registry_files_hashed_once(void **state)
{
    char ca[64], err[512];
    write_temp(ca, "-----BEGIN CERTIFICATE-----\nonce\n-----END CERTIFICATE-----\n");
    int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    assert_true(in >= 0);
    assert_true(inotify_add_watch(in, ca, IN_ACCESS | IN_OPEN | IN_CLOSE_NOWRITE) >= 0);
    Config cfg;
    assert_true(LOAD(&cfg, err, "run", "--brokers=k", "--value-format=avro",
                     "--schema-registry-url=https://sr:8081", "--schema-registry-ca-file", ca,
                     "--databases=[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\"},"
                     "{\"name\": \"c\", \"database-url\": \"postgresql://h/c\"}]"));
    assert_int_equal(cfg.n_dbs, 3);
    assert_int_equal(reads_seen(in), 1);
    for (int i = 0; i < cfg.n_dbs; i++)
        assert_true(cfg.dbs[i].schema_registry_ca_sum != 0);
    assert_true(cfg.dbs[2].schema_registry_ca_sum == cfg.schema_registry_ca_sum);
    close(in);
    config_free(&cfg);
    secrets_clear();
}

static void test_reloadable_options(void **state)
{
    const char *yes[] = {"log-level",    "batch-size",    "retention",         "delivery-timeout",
                         "max-attempts", "retry-backoff", "retry-backoff-max", "shutdown-timeout"};
    const char *no[] = {
        "database-url",  "database-url-file",  "brokers",           "kafka",
        "kafka-file",    "topic-template",     "on-poison",         "metrics-listen",
        "poll-interval", "rebalance-interval", "dead-letter-topic", "on-sent"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        if (!config_option_reloadable(yes[i]))
            fail_msg("%s should be reloadable", yes[i]);
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        if (config_option_reloadable(no[i]))
            fail_msg("%s should need a restart", no[i]);
}

static void test_error_missing_database_url(void **state)
{
    Config cfg;
    char err[256];
    const char *expected = "missing database URL: pass --database-url URL or --database-url-file "
                           "PATH, set DATABASE_URL, or give --config FILE with a database-url-file "
                           "key";
    assert_false(LOAD(&cfg, err, "run", "--brokers", "k:9092"));
    assert_string_equal(err, expected);
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "migrate"));
    assert_string_equal(err, expected);
    config_free(&cfg);
}

/* status, dead, requeue, ... without any database setting take the installed service's files
 * (issue 44: they used to fail naming neither --database-url-file nor --config). */
static void test_installed_configuration(void **state)
{
    Config cfg;
    char err[512], dir[] = "/tmp/outbox-relay-test-installed-XXXXXX", path[600];
    assert_non_null(mkdtemp(dir));
    config_set_installed_dir(dir);

    /* Nothing installed: the error names every way to give the URL. */
    assert_false(LOAD(&cfg, err, "status"));
    assert_error_line(err, "--database-url-file PATH");
    assert_error_line(err, "--config FILE");
    config_free(&cfg);

    snprintf(path, sizeof(path), "%s/relay.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"brokers\": \"k:9092\", \"batch-size\": 7}\n", f);
    fclose(f);
    snprintf(path, sizeof(path), "%s/database-url", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("postgresql://relay@db/outbox\n", f);
    fclose(f);

    assert_true(LOAD(&cfg, err, "status"));
    assert_string_equal(cfg.database_url, "postgresql://relay@db/outbox");
    assert_int_equal(cfg.batch_size, 7);
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "verify"));
    assert_string_equal(cfg.brokers, "k:9092");
    config_free(&cfg);

    /* verify and check reach Kafka as the service does: with the installed kafka.properties
     * (its TLS and SASL settings; docs/install.md runs `outbox-relay check` after editing it).
     * The other commands do not read it, and a --kafka-file of the operator's own stays. */
    char kpath[600];
    snprintf(kpath, sizeof(kpath), "%s/kafka.properties", dir);
    f = fopen(kpath, "w");
    assert_non_null(f);
    fputs("security.protocol=SASL_SSL\n", f);
    fclose(f);
    const char *kafka_commands[] = {"verify", "check"};
    for (size_t i = 0; i < 2; i++) {
        assert_true(LOAD(&cfg, err, kafka_commands[i]));
        assert_non_null(cfg.kafka_file);
        assert_string_equal(cfg.kafka_file, kpath);
        assert_int_equal(cfg.kafka.len, cfg.kafka_from_file + 1);
        assert_string_equal(cfg.kafka.items[cfg.kafka.len - 1].key, "security.protocol");
        assert_string_equal(cfg.kafka.items[cfg.kafka.len - 1].value, "SASL_SSL");
        config_free(&cfg);
    }
    assert_true(LOAD(&cfg, err, "status"));
    assert_null(cfg.kafka_file);
    config_free(&cfg);
    char own[700];
    snprintf(own, sizeof(own), "%s.own", kpath);
    f = fopen(own, "w");
    assert_non_null(f);
    fputs("client.id=mine\n", f);
    fclose(f);
    assert_true(LOAD(&cfg, err, "check", "--kafka-file", own));
    assert_string_equal(cfg.kafka_file, own);
    config_free(&cfg);
    unlink(own);
    unlink(kpath);

    /* An explicit URL wins, and the installed files are not read. */
    assert_true(LOAD(&cfg, err, "dead", "--database-url", "postgresql://x@y/z"));
    assert_string_equal(cfg.database_url, "postgresql://x@y/z");
    assert_int_equal(cfg.batch_size, 800);
    config_free(&cfg);
    /* migrate runs as the owner: never the relay's credential. */
    assert_false(LOAD(&cfg, err, "migrate"));
    config_free(&cfg);

    unlink(path);
    snprintf(path, sizeof(path), "%s/relay.json", dir);
    unlink(path);
    rmdir(dir);
}

static void test_error_missing_brokers(void **state)
{
    Config cfg;
    char err[256];
    assert_false(LOAD(&cfg, err, "run", "--database-url", "postgresql://h/db"));
    assert_string_equal(err, "missing Kafka brokers: pass --brokers or set KAFKA_BROKERS");
    config_free(&cfg);

    /* migrate does not need brokers */
    assert_true(LOAD(&cfg, err, "migrate", "--database-url", "postgresql://h/db"));
    config_free(&cfg);
}

/* --brokers as librdkafka reads it: a port that is not a number, or a list of nothing, left the
 * relay retrying forever; what librdkafka takes that is legitimate (a host without a port, an
 * IPv6 address, a PROTOCOL:// prefix matching security.protocol, a trailing comma) still passes. */
static void test_brokers_list(void **state)
{
    const char *bad[][2] = {
        {",", "at least one broker"},
        {" , ,", "at least one broker"},
        {"\t", "at least one broker"},
        {",\t,\n", "at least one broker"},
        {"localhost:notaport", "'localhost:notaport': the port must be"},
        {"h:0", "the port must be"},
        {"h:65536", "the port must be"},
        {"h:9092,h2:", "'h2:': the port must be"},
        {"h:9092:1", "in brackets"},
        {"[::1]:x", "[ADDRESS]:PORT"},
        {"[::1", "[ADDRESS]:PORT"},
        {"h:90 92", "blanks"},
        {"bogus://h:1", "unknown protocol"},
        {"SASL_SSL://h:9093", "security.protocol"},
        {"h$x:9092", "host name is letters"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        Config cfg;
        char err[512];
        if (LOAD(&cfg, err, "run", "--database-url=x", "--brokers", bad[i][0]))
            fail_msg("--brokers '%s' accepted", bad[i][0]);
        assert_error_line(err, "--brokers: ");
        assert_error_line(err, bad[i][1]);
        config_free(&cfg);
    }
    const char *good[] = {"localhost", "k:9092", "k1:9092,k2:9093, k3:9094", "k:9092,",
                          "[::1]:9092", "[fe80::1%eth0]:9092", "::1", "PLAINTEXT://k:9092",
                          "plaintext://k_1.example-x:9092/ignored", "127.0.0.1:1",
                          /* librdkafka: an empty host is localhost, a port read up to a blank
                           * or a slash */
                          ":9092", "k1:9092 ,k2:9092", "k1:9092/"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        Config cfg;
        char err[512];
        if (!LOAD(&cfg, err, "run", "--database-url=x", "--brokers", good[i]))
            fail_msg("--brokers '%s' refused: %s", good[i], err);
        config_free(&cfg);
    }
    /* The prefix is librdkafka's security.protocol, any case, from --kafka or --kafka-file. */
    Config cfg;
    char err[512];
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers",
                     "SASL_SSL://k:9093,sasl_ssl://k2:9093", "--kafka",
                     "security.protocol=SASL_SSL"));
    config_free(&cfg);
    setenv("KAFKA_BROKERS", "k:x", 1);
    assert_false(LOAD(&cfg, err, "run", "--database-url=x"));
    assert_error_line(err, "KAFKA_BROKERS: broker 'k:x'");
    config_free(&cfg);
    /* User info in an entry is refused without echoing it: the password, whole or cut at a
     * ',' (which splits entries), is never shown. */
    const char *userinfo[] = {"sasl_ssl://u:hunter22@h:1", "u:hunter22@h:1", "k:1,u:hunter22@h:1",
                              "sasl_ssl://u:hun,ter22@h:1", "k:1/u:hunter22@h"};
    for (size_t i = 0; i < sizeof(userinfo) / sizeof(userinfo[0]); i++) {
        assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers", userinfo[i]));
        assert_error_line(err, "--brokers: an entry holds user info");
        if (strstr(err, "hun") || strstr(err, "ter22"))
            fail_msg("--brokers '%s': the error shows the password: %s", userinfo[i], err);
        config_free(&cfg);
    }
    /* Only the commands that talk to Kafka check it: an environment file every command shares
     * does not stop migrate. */
    assert_true(LOAD(&cfg, err, "migrate", "--database-url=x"));
    config_free(&cfg);
}

/* The registry's files are checked with the configuration, so run and check refuse an unreadable
 * or malformed one alike (exit 2: check made it a FAIL line, exit 1); only when a registry is
 * used, and never showing the password. */
/* The auth file's first line is judged alike by the configuration's check and by the registry
 * that reads it at run time (CONFIG_AUTH_LINE_MAX): a file the check passes never fails later. */
static void test_registry_auth_line_same_rule(void **state)
{
    static const struct {
        size_t len;      /* bytes of USER:PASSWORD */
        const char *end; /* what follows them */
    } cases[] = {{1021, ""},   {1021, "\r\n"}, {1022, ""},
                 {1022, "\n"}, {1022, "\r\n"}, {1023, ""},
                 {1023, "\n"}, {1023, "\r\n"}, {4, "\rxxxxxxxxxxxxxxxxxxxxxxxx"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[CONFIG_AUTH_LINE_MAX + 64], path[64], err[512];
        memset(text, 'u', cases[i].len);
        text[1] = ':';
        snprintf(text + cases[i].len, sizeof(text) - cases[i].len, "%s", cases[i].end);
        write_temp(path, text);
        Config cfg;
        bool checked =
            LOAD(&cfg, err, "check", "--database-url=x", "--brokers=k:1", "--value-format=avro",
                 "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file", path);
        config_free(&cfg);
        struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
        RegistryOptions o = {.urls = "http://sr:8081", .auth_file = path, .timeout_ms = 1000};
        Registry *r = registry_new(loop, &o, NULL, NULL, err, sizeof(err));
        if ((r != NULL) != checked)
            fail_msg("%zu bytes + \"%s\": the check %s it, the registry %s it", cases[i].len,
                     cases[i].end[0] == '\r' ? "CR..." : cases[i].end, checked ? "took" : "refused",
                     r ? "took" : "refused");
        assert_int_equal(checked, cases[i].len <= CONFIG_AUTH_LINE_MAX - 2);
        registry_free(r, NULL);
        ev_loop_destroy(loop);
        unlink(path);
        n_temp_paths--;
    }
}

static void test_registry_files_checked(void **state)
{
    char auth[64], bad[64], err[512], longline[64];
    write_temp(auth, "relay:pw-s3cret\n");
    write_temp(bad, "pw-s3cret-without-user\n");
    /* Longer than the registry reads (CONFIG_AUTH_LINE_MAX), the colon past it: refused here
     * as the registry would refuse it at run time. */
    char text[CONFIG_AUTH_LINE_MAX + 16];
    memset(text, 'u', sizeof(text) - 1);
    text[sizeof(text) - 1] = '\0';
    text[CONFIG_AUTH_LINE_MAX + 2] = ':';
    write_temp(longline, text);
    char bigca[64];
    write_temp(bigca, "");
    assert_int_equal(truncate(bigca, (off_t)CONFIG_CA_FILE_MAX + 1), 0);
    const char *commands[] = {"run", "check"};
    for (size_t i = 0; i < 2; i++) {
        Config cfg;
        const char *c = commands[i];
        assert_true(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                         "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file",
                         auth));
        config_free(&cfg);
        assert_false(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                          "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file",
                          "/nonexistent/auth"));
        assert_error_line(err, "schema-registry-auth-file /nonexistent/auth: No such file");
        config_free(&cfg);
        assert_false(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1",
                          "--value-format=json-schema", "--schema-registry-url=http://sr:8081",
                          "--schema-registry-auth-file", bad));
        assert_error_line(err, "expected USER:PASSWORD on one line");
        assert_null(strstr(err, "s3cret"));
        config_free(&cfg);
        assert_false(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                          "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file",
                          longline));
        assert_error_line(err, "on one line of at most 1022 bytes");
        config_free(&cfg);
        assert_false(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                          "--schema-registry-url=http://sr:8081", "--schema-registry-ca-file",
                          "/tmp"));
        assert_error_line(err, "schema-registry-ca-file /tmp: Is a directory");
        config_free(&cfg);
        /* Larger than the registry reads (CONFIG_CA_FILE_MAX): refused here as bad input, as
         * the registry would refuse it at run time. */
        assert_false(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                          "--schema-registry-url=https://sr:8081", "--schema-registry-ca-file",
                          bigca));
        assert_error_line(err, "larger than 8 MiB");
        config_free(&cfg);
        /* No registry in use: the files are not read. */
        assert_true(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1",
                         "--schema-registry-auth-file", "/nonexistent/auth"));
        config_free(&cfg);
    }
    /* A database of a list that uses the registry has the file checked too. */
    Config cfg;
    assert_false(LOAD(&cfg, err, "run", "--brokers=k:1", "--schema-registry-url=http://sr:8081",
                      "--schema-registry-auth-file", "/nonexistent/auth", "--databases",
                      "[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                      "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\","
                      " \"value-format\": \"avro\"}]"));
    assert_error_line(err, "databases \"b\": schema-registry-auth-file");
    config_free(&cfg);
}

/* A registry URL list registry_new would refuse (none, or more than it holds) is bad input
 * refused by the configuration (exit 2): left to relay_new it was a failure main cannot tell
 * from a runtime one, and a runtime failure exits 1 (restarted by systemd). */
static void test_registry_url_list_checked(void **state)
{
    (void)state;
    char err[1024];
    const char *eight = "http://a,http://b,http://c,http://d,http://e,http://f,http://g,http://h";
    char nine[200];
    snprintf(nine, sizeof(nine), "%s, http://i", eight);
    const char *commands[] = {"run", "check"};
    for (size_t i = 0; i < 2; i++) {
        Config cfg;
        const char *c = commands[i];
        assert_true(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                         "--schema-registry-url", eight));
        config_free(&cfg);
        assert_false(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                          "--schema-registry-url", nine));
        assert_error_line(err, "schema-registry-url: at most 8 URLs, 9 given");
        config_free(&cfg);
        assert_false(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                          "--schema-registry-url", " , ,"));
        assert_error_line(err, "schema-registry-url: no URL given");
        config_free(&cfg);
        /* A query or fragment: bad input (exit 2), not registry_new's runtime failure (exit 1,
         * restarted for ever), named as registry_new names it, its password masked. */
        assert_false(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                          "--schema-registry-url",
                          "http://a, https://u:pw-s3cr3t@b:8081/sr?tenant=key-s3cr3t"));
        assert_error_line(err, "schema-registry-url https://u:***@b:8081/sr: a query or fragment "
                               "('?', '#') is not supported: give the registry's base URL (a "
                               "path prefix is fine)");
        assert_null(strstr(err, "s3cr3t"));
        config_free(&cfg);
        assert_false(LOAD(&cfg, err, c, "--database-url=x", "--brokers=k:1", "--value-format=avro",
                          "--schema-registry-url", "b:8081/sr#x,http://c"));
        assert_error_line(err, "schema-registry-url b:8081/sr: a query or fragment ('?', '#') is "
                               "not supported: give the registry's base URL (a path prefix is "
                               "fine)");
        config_free(&cfg);
    }
}

/* The list is split at every ',': one in a password cut it in two pieces, neither masked nor
 * registered ("schema registry more2secret@127.0.0.1:1 does not answer" showed both). Such a
 * list is refused in a line that names the URL by its place, never its text. */
static void test_registry_url_comma_in_password(void **state)
{
    (void)state;
    static const struct {
        const char *urls, *needle;
    } bad[] = {
        {"http://reg:more,2secret@127.0.0.1:1",
         "URL 1 of the list has a port that is not a number"},
        {"reg:more,2secret@127.0.0.1:1", "URL 1 of the list has a port that is not a number"},
        {"http://a:8081, reg:more2secret@b",
         "URL 2 of the list holds user info ('@') and no scheme"},
        {"http://reg:8081,more2secret@b", "URL 2 of the list holds user info ('@') and no scheme"},
        {"http://[::1]:8081,http://us,er:more2secret@b", "URL 3 of the list holds user info"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        Config cfg;
        char err[1024];
        assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1",
                          "--value-format=avro", "--schema-registry-url", bad[i].urls));
        assert_error_line(err, bad[i].needle);
        assert_error_line(err, "%2C");
        if (strstr(err, "more") || strstr(err, "2secret"))
            fail_msg("--schema-registry-url '%s': the error shows the password: %s", bad[i].urls,
                     err);
        config_free(&cfg);
    }
    /* A blank in a URL: curl refuses it, and every lookup through it failed while the relay
     * ran (a trailing blank from an environment file). Spaces after a ',' are skipped. */
    const char *blanks[] = {"http://a:8081 ", "http://a:8081 ,http://b", "http://a, http://b\t",
                            "http://a /sr"};
    for (size_t i = 0; i < sizeof(blanks) / sizeof(blanks[0]); i++) {
        Config cfg;
        char err[1024];
        assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1",
                          "--value-format=avro", "--schema-registry-url", blanks[i]));
        assert_error_line(err, "of the list holds a blank, which curl refuses in a URL");
        config_free(&cfg);
    }
    const char *good[] = {"http://u:p%2Cw@a:8081,https://u:pw@b/sr", "reg:pw@h:8081",
                          "  http://a,  http://b", "http://[::1]:8081,http://[::1],c:1,d",
                          "http://a:8081/x:y,http://b"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        Config cfg;
        char err[1024];
        if (!LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--value-format=avro",
                  "--schema-registry-url", good[i]))
            fail_msg("--schema-registry-url '%s' refused: %s", good[i], err);
        config_free(&cfg);
    }
}

/* A host name with non-ASCII letters: curl takes one only under a UTF-8 locale, which the relay
 * never sets, and the relay's own lookup of the UTF-8 name failed as "Could not resolve host"
 * after the whole --schema-registry-timeout. Refused as bad input (exit 2) at start-up and at a
 * reload, by place, with the ASCII form named as the fix; such letters elsewhere are not the
 * host's. */
static void test_registry_url_idn(void **state)
{
    (void)state;
    const char *bad[] = {"http://b\xc3\xbc"
                         "cher.example:8081",
                         "https://u:pw@b\xc3\xbc"
                         "cher.example/sr",
                         "http://a:8081,b\xc3\xbc"
                         "cher.example"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        for (int reload = 0; reload < 2; reload++) {
            Config cfg;
            char err[1024] = "";
            char *argv[] = {(char *)"outbox-relay",
                            (char *)"run",
                            (char *)"--database-url=x",
                            (char *)"--brokers=k:1",
                            (char *)"--value-format=avro",
                            (char *)"--schema-registry-url",
                            (char *)bad[i],
                            NULL};
            int argc = (int)(sizeof(argv) / sizeof(argv[0])) - 1;
            bool ok = reload ? config_load_reload(&cfg, argc, argv, err, sizeof(err))
                             : config_load(&cfg, argc, argv, err, sizeof(err));
            if (ok)
                fail_msg("--schema-registry-url '%s' taken (%s)", bad[i],
                         reload ? "reload" : "start-up");
            assert_error_line(err, "has a host name with non-ASCII letters");
            assert_error_line(err, "xn--");
            assert_error_line(err, i == 2 ? "URL 2 of the list" : "URL 1 of the list");
            config_free(&cfg);
        }
    }
    const char *good[] = {"http://xn--bcher-kva.example:8081", "http://u:p\xc3\xa4ss@a:8081",
                          "http://a:8081/b\xc3\xbc"
                          "cher",
                          "http://[::1]:8081"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        Config cfg;
        char err[1024];
        if (!LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--value-format=avro",
                  "--schema-registry-url", good[i]))
            fail_msg("--schema-registry-url '%s' refused: %s", good[i], err);
        config_free(&cfg);
    }
}

static void test_error_fits_small_buffer(void **state)
{
    /* A short err buffer is truncated, never overrun. */
    Config cfg;
    char err[16];
    assert_false(LOAD(&cfg, err, "frobnicate-with-a-long-name"));
    assert_int_equal(strlen(err), sizeof(err) - 1);
    config_free(&cfg);
}

static void test_config_free_zeroed(void **state)
{
    Config cfg;
    memset(&cfg, 0, sizeof(cfg));
    config_free(&cfg);
    config_free(&cfg);
    assert_null(cfg.database_url);
    assert_int_equal(cfg.kafka.len, 0);
}

/* Prints the help argv asks for into a string (freed by the caller). */
static char *help_for(const char *cmd)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    char *argv[] = {(char *)"outbox-relay", (char *)cmd, (char *)"--help", NULL};
    config_print_help(f, 3, argv);
    assert_int_equal(fclose(f), 0);
    return text;
}

/* `outbox-relay COMMAND --help` lists that command's options only (issue 44: run --help printed
 * every option of every command). */
static void test_print_command_help(void **state)
{
    char *run = help_for("run");
    assert_non_null(strstr(run, "Usage: outbox-relay run [OPTIONS]"));
    assert_non_null(strstr(run, "--batch-size N"));
    assert_non_null(strstr(run, "--database-url URL"));
    assert_null(strstr(run, "--since"));
    assert_null(strstr(run, "--id ID"));
    assert_null(strstr(run, "--connect-wait"));
    free(run);
    char *status = help_for("status");
    assert_non_null(strstr(status, "Usage: outbox-relay status [OPTIONS]"));
    assert_non_null(strstr(status, "--json"));
    assert_non_null(strstr(status, "--on-sent"));
    assert_null(strstr(status, "--batch-size"));
    assert_null(strstr(status, "--brokers"));
    free(status);
    char *migrate = help_for("migrate");
    assert_non_null(strstr(migrate, "--connect-wait DURATION"));
    assert_null(strstr(migrate, "--retention"));
    free(migrate);
    /* Shown per command, still accepted by every command (one set of flags serves all). */
    Config cfg;
    char err[256];
    assert_true(LOAD(&cfg, err, "status", "--database-url", "x", "--batch-size", "5"));
    assert_int_equal(cfg.batch_size, 5);
    config_free(&cfg);
}

/* The table tools/docs.py generates the configuration reference from: one line per option, every
 * line with all twelve fields, and the fields the reference shows (range, SIGHUP, Debezium name,
 * choices, commands) as the option table has them. */
static void test_print_table(void **state)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    config_print_table(f);
    assert_int_equal(fclose(f), 0);
    assert_true(strncmp(text,
                        "name\tmetavar\ttype\tdefault\tmin\tmax\tenv\treloadable\tcommands\t"
                        "aliases\tchoices\thelp\n",
                        strlen("name\tmetavar")) == 0);
    int lines = 0;
    for (char *line = text; *line; lines++) {
        char *end = strchr(line, '\n');
        assert_non_null(end);
        int tabs = 0;
        for (char *p = line; p < end; p++)
            tabs += *p == '\t';
        if (tabs != 11)
            fail_msg("line %d has %d fields, not 12", lines + 1, tabs + 1);
        line = end + 1;
    }
    assert_true(lines > 40);
    const char *rows[] = {
        "session-rest-after\tMS\tinteger\t30000\t1000\t3600000\t\tno\trun,check\t\t\t",
        "batch-bytes\tBYTES\tinteger\t8388608\t65536\t1073741824\t\tyes\t",
        "sleep-after\tMS\tinteger\t50\t0\t60000\t\tyes\t",
        "horizon-warn\tDURATION\tduration\t5m\t\t\t\tyes\t",
        "database-url\tURL\tstring\t\t\t\tDATABASE_URL\tno\tall\t",
        "event-id-column\tCOLUMN\tstring\t\t\t\t\tno\tall\ttable.field.event.id\t",
        "on-sent\tACTION\tchoice\tmark\t\t\t\tno\trun,status,check\t\tmark|delete\t",
        /* A duration with a maximum says it: without it the reference offered 72h and 7d. */
        "statement-timeout\tDURATION\tduration\t30s\t1\t86400\t",
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (!strstr(text, rows[i]))
            fail_msg("table lacks \"%s\"", rows[i]);
    free(text);
}

static void test_print_help(void **state)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    char *argv[] = {(char *)"outbox-relay", (char *)"--help", NULL};
    config_print_help(f, 2, argv);
    assert_int_equal(fclose(f), 0);
    const char *needles[] = {"Usage: outbox-relay COMMAND",
                             "--database-url URL",
                             "[env DATABASE_URL]",
                             "[env KAFKA_BROKERS]",
                             "[default 1000]",
                             "[default outbox.event.{aggregate_type}]",
                             "--kafka KEY=VALUE",
                             "--metrics-listen HOST:PORT",
                             "--retention DURATION",
                             "--database-url-file PATH",
                             "--kafka-file PATH",
                             "[default 800] [SIGHUP]",
                             "status",
                             "purge-dead",
                             "migrate"};
    for (size_t i = 0; i < sizeof(needles) / sizeof(needles[0]); i++)
        if (!strstr(text, needles[i]))
            fail_msg("help text lacks \"%s\"", needles[i]);
    free(text);
}

/* Debezium's option names set the options they stand for, as flags and as config file keys. */
static void test_debezium_aliases(void **state)
{
    char path[64];
    write_temp(path, "{\"layout\": \"debezium\", \"table.field.event.key\": \"k\","
                     " \"route.by.field\": \"rt\","
                     " \"route.topic.replacement\": \"ev.${routedByValue}\","
                     " \"table.fields.additional.placement\": \"type:header:eventType\"}");
    Config cfg;
    char err[512];
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--config", path,
                     "--table.field.event.payload", "body", "--table", "app.events"));
    assert_int_equal(cfg.layout, LAYOUT_DEBEZIUM);
    assert_string_equal(cfg.map.aggregate_id, "k");
    assert_string_equal(cfg.map.aggregate_type, "rt");
    assert_string_equal(cfg.map.payload, "body");
    assert_string_equal(cfg.map.event_id, "id"); /* the layout's default */
    assert_string_equal(cfg.map.schema, "app");
    assert_string_equal(cfg.map.name, "events");
    assert_string_equal(cfg.topic_template, "ev.${routedByValue}");
    assert_int_equal(cfg.map.n_extra, 1);
    assert_string_equal(cfg.map.extra[0].header, "eventType");
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--additional-fields",
                      "type:offset"));
    assert_error_line(err, "placement 'offset'");
    config_free(&cfg);

    /* The rest of the router: envelope fields, the partition placement (only with the order
     * promise narrowed to partitions) and the timestamp column, by Debezium's names. */
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1",
                     "--table.fields.additional.placement",
                     "type:envelope:eventType,part:partition", "--order-scope", "partition",
                     "--table.field.event.timestamp", "occurred_at", "--payload-format", "text"));
    assert_int_equal(cfg.map.n_envelope, 1);
    assert_string_equal(cfg.map.envelope[0].header, "eventType");
    assert_string_equal(cfg.map.partition, "part");
    assert_string_equal(cfg.map.timestamp, "occurred_at");
    assert_false(cfg.map.payload_binary);
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--additional-fields",
                      "part:partition"));
    assert_error_line(err, "needs --order-scope partition");
    config_free(&cfg);
    assert_true(
        LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--payload-format", "binary"));
    assert_true(cfg.map.payload_binary);
    config_free(&cfg);
}

/* An option under its Debezium alias and its own name in one source (the flags, a config file,
 * a --databases entry) is refused naming both, not settled by whichever comes last; the same flag
 * twice is a later flag overriding an earlier one (test_last_flag_wins), and a file may set what
 * a flag overrides. */
static void test_alias_and_name_in_one_source(void **state)
{
    Config cfg;
    char err[512], path[64];
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--topic-template",
                      "a.{aggregate_type}", "--route.topic.replacement", "b.{aggregate_type}"));
    assert_string_equal(err, "--topic-template and --route.topic.replacement both set "
                             "topic-template: give one of them");
    config_free(&cfg);
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1",
                      "--table.field.event.key=k", "--aggregate-id-column=k"));
    assert_error_line(err, "--table.field.event.key and --aggregate-id-column both set");
    config_free(&cfg);

    write_temp(path, "{\"route.topic.replacement\": \"a.{aggregate_type}\","
                     " \"topic-template\": \"b.{aggregate_type}\"}");
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--config", path));
    assert_error_line(err, "keys \"route.topic.replacement\" and \"topic-template\" both set "
                           "topic-template");
    assert_error_line(err, path);
    config_free(&cfg);
    /* The file's alias, overridden by the flag's own name: two sources, the flag wins. */
    write_temp(path, "{\"route.topic.replacement\": \"a.{aggregate_type}\"}");
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--config", path,
                     "--topic-template", "b.{aggregate_type}"));
    assert_string_equal(cfg.topic_template, "b.{aggregate_type}");
    config_free(&cfg);

    assert_false(LOAD(&cfg, err, "run", "--brokers=k:1", "--databases",
                      "[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\","
                      " \"payload-column\": \"p\", \"table.field.event.payload\": \"q\"}]"));
    assert_error_line(err, "databases \"a\": keys \"payload-column\" and "
                           "\"table.field.event.payload\" both set payload-column");
    config_free(&cfg);
}

#define T(f) cmocka_unit_test_setup_teardown(f, clean_env, clean_env)

/* config_scrub_argv: every spelling of a secret on the command line becomes "***" (NULs after
 * it), the rest stays as it was, and a bare switch does not swallow the next argument. */
static void test_scrub_argv(void **state)
{
    char a0[] = "outbox-relay", a1[] = "run", a2[] = "--database-url",
         a3[] = "postgresql://u:pw-secret@h/db", a4[] = "--kafka", a5[] = "sasl.password=k-secret",
         a6[] = "--kafka=ssl.key.password=key-secret", a7[] = "--kafka", a8[] = "linger.ms=5",
         a9[] = "--require-tls", a10[] = "--brokers", a11[] = "b:9092",
         a12[] = "--database-url=postgresql://u:pw2-secret@h/db";
    char *argv[] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12};
    size_t len3 = strlen(a3), len12 = strlen(a12);
    config_scrub_argv(13, argv);
    assert_string_equal(argv[3], "***");
    for (size_t i = 3; i < len3; i++)
        assert_int_equal(a3[i], '\0'); /* nothing of the URL left after the NUL */
    assert_string_equal(argv[5], "sasl.password=***");
    assert_string_equal(argv[6], "--kafka=ssl.key.password=***");
    assert_string_equal(argv[8], "linger.ms=5");
    assert_string_equal(argv[9], "--require-tls");
    assert_string_equal(argv[11], "b:9092");
    assert_string_equal(argv[12], "--database-url=***");
    for (size_t i = strlen("--database-url=***"); i < len12; i++)
        assert_int_equal(a12[i], '\0');
}

/* config_scrub_argv: a Schema Registry URL's user info goes by position (a password shorter than
 * SECRETS_MIN_LEN is never registered for the scrub), in each URL of the list, hosts kept. */
static void test_scrub_argv_registry_short_password(void **state)
{
    char a0[] = "outbox-relay", a1[] = "run", a2[] = "--schema-registry-url",
         a3[] = "http://reg:pw@r1:8081,u:p2@r2:8081",
         a4[] = "--schema-registry-url=https://TOKEN@r3";
    char *argv[] = {a0, a1, a2, a3, a4};
    config_scrub_argv(5, argv);
    assert_string_equal(argv[3], "http://******@r1:8081,****@r2:8081");
    assert_string_equal(argv[4], "--schema-registry-url=https://*****@r3");
}

/* ---- many databases (--databases) ----------------------------------------------------------- */

/* Each entry becomes a Config of its own: the file's options with the entry's over them. */
static void test_databases_entries(void **state)
{
    (void)state;
    Config cfg;
    char err[1024], path[64];
    write_temp(path,
               "{\"brokers\": \"k:9092\", \"batch-size\": 300, \"sessions\": 1, \"databases\": ["
               "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
               "{\"name\": \"b-2\", \"database-url\": \"postgresql://h/b\", \"table\": "
               "\"events\", \"batch-size\": 50, \"topic-template\": \"b.{aggregate_type}\"}]}");
    assert_true(LOAD(&cfg, err, "run", "--config", path));
    assert_int_equal(cfg.n_dbs, 2);
    assert_null(cfg.database_url);
    assert_string_equal(cfg.dbs[0].database_name, "a");
    assert_string_equal(cfg.dbs[0].database_url, "postgresql://h/a");
    assert_int_equal(cfg.dbs[0].batch_size, 300); /* the file's */
    assert_int_equal(cfg.dbs[0].sessions, 1);
    assert_string_equal(cfg.dbs[1].database_name, "b-2");
    assert_int_equal(cfg.dbs[1].batch_size, 50); /* the entry's */
    assert_string_equal(cfg.dbs[1].topic_template, "b.{aggregate_type}");
    assert_string_equal(cfg.dbs[1].brokers, "k:9092");
    assert_string_equal(cfg.dbs[1].map.name, "events");
    assert_string_equal(cfg.dbs[0].topic_template, "outbox.event.{aggregate_type}");
    /* Commands pick one; without --database they name the choices. */
    const Config *one = config_pick_database(&cfg, err, sizeof(err));
    assert_null(one);
    assert_error_line(err, "pass --database NAME, one of a, b-2");
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "status", "--config", path, "--database", "b-2"));
    one = config_pick_database(&cfg, err, sizeof(err));
    assert_non_null(one);
    assert_string_equal(one->database_url, "postgresql://h/b");
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "status", "--config", path, "--database", "c"));
    assert_null(config_pick_database(&cfg, err, sizeof(err)));
    assert_error_line(err, "unknown --database: pass --database NAME, one of a, b-2");
    config_free(&cfg);
}

/* An entry's sessions default to its min-sessions (1), not 2: an idle database of many costs
 * one connection. Set in the entry, or around the list, it holds as given. */
static void test_databases_sessions_default(void **state)
{
    (void)state;
    Config cfg;
    char err[1024], path[64];
    write_temp(path,
               "{\"brokers\": \"k:9092\", \"databases\": ["
               "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
               "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\", \"sessions\": 3},"
               "{\"name\": \"c\", \"database-url\": \"postgresql://h/c\", \"min-sessions\": 2}]}");
    assert_true(LOAD(&cfg, err, "run", "--config", path));
    assert_int_equal(cfg.dbs[0].sessions, 1);
    assert_int_equal(cfg.dbs[1].sessions, 3);
    assert_int_equal(cfg.dbs[2].sessions, 2);
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "run", "--config", path, "--sessions", "4"));
    assert_int_equal(cfg.dbs[0].sessions, 4);
    assert_int_equal(cfg.dbs[1].sessions, 3);
    config_free(&cfg);
    /* A min-sessions above the default 2 around the list: each entry's sessions follow it, and
     * the default --sessions is no bound to check it against. */
    write_temp(path, "{\"brokers\": \"k:9092\", \"min-sessions\": 3, \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]}");
    assert_true(LOAD(&cfg, err, "run", "--config", path));
    assert_int_equal(cfg.dbs[0].sessions, 3);
    config_free(&cfg);
    /* A --sessions given around the list still bounds it. */
    assert_false(LOAD(&cfg, err, "run", "--config", path, "--sessions", "2"));
    assert_error_line(err, "min-sessions (3) must not exceed");
    config_free(&cfg);
}

/* What the list refuses, each in one line naming the entry. */
static void test_databases_errors(void **state)
{
    (void)state;
    static const struct {
        const char *json, *needle;
    } cases[] = {
        {"[{\"name\": \"a\", \"database-url\": \"x\", \"brokers\": \"y\"}]",
         "databases \"a\": key \"brokers\": not a per-database option"},
        {"[{\"name\": \"a\", \"database-url\": \"x\", \"sesions\": 2}]",
         "databases \"a\": key \"sesions\": unknown key"},
        {"[{\"name\": \"a\"}]", "databases \"a\": missing database-url or database-url-file"},
        {"[{\"name\": \"A b\", \"database-url\": \"x\"}]", "databases[0]: \"name\" must be"},
        {"[{\"name\": \"a\", \"database-url\": \"x\"}, {\"name\": \"a\", \"database-url\": \"y\"}]",
         "databases: \"a\" is named twice"},
        {"[]", "databases: the list is empty"},
        {"{\"a\": 1}", "databases: expected a JSON array of objects"},
        {"[{\"name\": \"a\", \"database-url\": \"x\", \"sessions\": 9}]",
         "databases \"a\": key \"sessions\""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Config cfg;
        char err[1024];
        assert_false(LOAD(&cfg, err, "run", "--brokers", "k:9092", "--databases", cases[i].json));
        assert_error_line(err, cases[i].needle);
        config_free(&cfg);
    }
    /* A URL beside the list, and more entries than the cap. */
    Config cfg;
    char err[1024];
    assert_false(LOAD(&cfg, err, "run", "--brokers", "k", "--database-url", "x", "--databases",
                      "[{\"name\": \"a\", \"database-url\": \"x\"}]"));
    assert_error_line(err, "databases and database-url (or database-url-file) are both set");
    config_free(&cfg);
    static char many[16384];
    size_t len = 0;
    len += (size_t)snprintf(many + len, sizeof(many) - len, "[");
    for (int i = 0; i <= CONFIG_MAX_DATABASES; i++)
        len += (size_t)snprintf(many + len, sizeof(many) - len,
                                "%s{\"name\": \"t%d\", \"database-url\": \"x\"}", i ? "," : "", i);
    snprintf(many + len, sizeof(many) - len, "]");
    assert_false(LOAD(&cfg, err, "run", "--brokers", "k", "--databases", many));
    assert_error_line(err, "at most 100 in one process");
    config_free(&cfg);
    /* --database without a list, and for run. */
    assert_true(LOAD(&cfg, err, "status", "--database-url", "x", "--database", "a"));
    assert_null(config_pick_database(&cfg, err, sizeof(err)));
    assert_error_line(err, "--database a: no --databases list to pick it from");
    config_free(&cfg);
}

/* The checks between one database's options hold inside a list entry as they do around it,
 * each refused in one line that names the entry: a partition column without --order-scope
 * partition (it would narrow the order promise unasked), avro or json-schema with a binary
 * payload or envelope fields (every row would fail to parse and be dead-lettered), and avro or
 * json-schema without a registry to fetch the schemas from. */
static void test_databases_option_checks(void **state)
{
    (void)state;
    static const struct {
        const char *registry, *entry, *needle;
    } cases[] = {
        {NULL, "\"additional-fields\": \"part:partition\"",
         "databases \"b\": additional-fields: part:partition needs --order-scope partition"},
        {NULL, "\"additional-fields\": \"part:partition\", \"order-scope\": \"topic\"",
         "databases \"b\": additional-fields: part:partition needs --order-scope partition"},
        {"http://sr:8081", "\"value-format\": \"avro\", \"payload-format\": \"binary\"",
         "databases \"b\": --value-format avro encodes a JSON payload: not with --payload-format "
         "binary or envelope fields"},
        {"http://sr:8081",
         "\"value-format\": \"json-schema\", \"additional-fields\": \"type:envelope\"",
         "databases \"b\": --value-format json-schema encodes a JSON payload"},
        {NULL, "\"value-format\": \"avro\"",
         "databases \"b\": --value-format avro needs --schema-registry-url"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        Config cfg;
        char err[1024], list[512];
        snprintf(list, sizeof(list),
                 "[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                 "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\", %s}]",
                 cases[i].entry);
        /* Run and check refuse it, as they refuse the same options without a list. */
        if (cases[i].registry)
            setenv("SCHEMA_REGISTRY_URL", cases[i].registry, 1);
        else
            unsetenv("SCHEMA_REGISTRY_URL");
        assert_false(LOAD(&cfg, err, "run", "--brokers", "k:9092", "--databases", list));
        assert_error_line(err, cases[i].needle);
        config_free(&cfg);
        assert_false(LOAD(&cfg, err, "check", "--brokers", "k:9092", "--databases", list));
        assert_error_line(err, cases[i].needle);
        config_free(&cfg);
    }
    unsetenv("SCHEMA_REGISTRY_URL");
    /* The same entries, with what they need, load. */
    Config cfg;
    char err[1024];
    assert_true(LOAD(&cfg, err, "run", "--brokers", "k:9092", "--schema-registry-url",
                     "http://127.0.0.1:8081", "--databases",
                     "[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\", "
                     "\"additional-fields\": \"part:partition\", \"order-scope\": \"partition\"},"
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\", "
                     "\"value-format\": \"avro\"}]"));
    assert_string_equal(cfg.dbs[0].map.partition, "part");
    assert_int_equal(cfg.dbs[1].value_format, VALUE_AVRO);
    config_free(&cfg);
    /* An entry that sets back what the options around the list lacked passes... */
    assert_true(LOAD(&cfg, err, "run", "--brokers", "k:9092", "--order-scope", "partition",
                     "--databases",
                     "[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\", "
                     "\"additional-fields\": \"part:partition\"}]"));
    config_free(&cfg);
    /* ...and one that takes it away is refused. */
    assert_false(LOAD(&cfg, err, "run", "--brokers", "k:9092", "--order-scope", "partition",
                      "--additional-fields", "part:partition", "--databases",
                      "[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\", "
                      "\"order-scope\": \"aggregate\"}]"));
    assert_error_line(err, "databases \"a\": additional-fields: part:partition needs");
    config_free(&cfg);
}

/* Two entries on one database (a table each, say) would split its one lane group between
 * them: refused, naming both; the same host with other databases, or another port, loads. */
static void test_databases_same_database_refused(void **state)
{
    (void)state;
    Config cfg;
    char err[1024];
    assert_false(LOAD(&cfg, err, "run", "--brokers", "k:9092", "--databases",
                      "[{\"name\": \"a\", \"database-url\": \"postgresql://u@h:5433/d\"},"
                      "{\"name\": \"b\", \"database-url\": \"host=h port=5433 dbname=d user=v\","
                      " \"table\": \"t2.outbox\"}]"));
    assert_error_line(err, "databases: \"a\" and \"b\" name the same database");
    config_free(&cfg);
    /* Two spellings of this machine's server (db.c db_same_database). */
    assert_false(LOAD(&cfg, err, "run", "--brokers", "k:9092", "--databases",
                      "[{\"name\": \"a\", \"database-url\": \"postgresql://localhost:5433/d\"},"
                      "{\"name\": \"b\", \"database-url\": \"postgresql://127.0.0.1:5433/d\"}]"));
    assert_error_line(err, "databases: \"a\" and \"b\" name the same database");
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "run", "--brokers", "k:9092", "--databases",
                     "[{\"name\": \"a\", \"database-url\": \"postgresql://h:5433/d\"},"
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h:5433/e\"},"
                     "{\"name\": \"c\", \"database-url\": \"postgresql://h:5434/d\"}]"));
    config_free(&cfg);
}

/* A SIGHUP that brings in a list entry failing those checks is refused whole, as any list that
 * does not load: the running configuration keeps its databases. */
static void test_databases_reload_refuses_bad_entry(void **state)
{
    (void)state;
    char path[64], err[1024];
    write_temp(path, "{\"brokers\": \"k:9092\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]}");
    char a0[] = "outbox-relay", a1[] = "run", a2[] = "--config";
    char *argv[] = {a0, a1, a2, path, NULL};
    Config running;
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"brokers\": \"k:9092\", \"batch-size\": 7, \"databases\": ["
          "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
          "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\", "
          "\"additional-fields\": \"part:partition\"}]}",
          f);
    assert_int_equal(fclose(f), 0);
    assert_false(reload_config(&running, 4, argv));
    assert_int_equal(running.n_dbs, 1);
    assert_int_not_equal(running.batch_size, 7); /* nothing of the refused file applied */
    config_free(&running);
}

/* stderr (the log) sent to a temporary file between log_capture_begin and log_capture_end. */
typedef struct LogCapture {
    char path[64];
    int fd, saved;
} LogCapture;

static void log_capture_begin(LogCapture *c)
{
    write_temp(c->path, "");
    c->fd = open(c->path, O_WRONLY | O_TRUNC);
    c->saved = dup(STDERR_FILENO);
    assert_true(c->fd >= 0 && c->saved >= 0);
    fflush(stderr);
    assert_true(dup2(c->fd, STDERR_FILENO) >= 0);
}

/* Puts stderr back; returns what was logged since log_capture_begin (freed by caller). */
static char *log_capture_end(LogCapture *c)
{
    fflush(stderr);
    assert_true(dup2(c->saved, STDERR_FILENO) >= 0);
    close(c->fd);
    close(c->saved);
    FILE *f = fopen(c->path, "r");
    assert_non_null(f);
    char *text = calloc(1, 8192);
    assert_non_null(text);
    assert_true(fread(text, 1, 8191, f) < 8191);
    fclose(f);
    return text;
}

/* Runs config_warn_loose_secret_files with stderr (the log) captured; returns what was logged
 * (freed by caller). */
static char *loose_files_logged(const Config *cfg)
{
    LogCapture c;
    log_capture_begin(&c);
    config_warn_loose_secret_files(cfg);
    return log_capture_end(&c);
}

/* --schema-registry-auth-file is USER:PASSWORD whole, its password registered only when the
 * registry reads it: group- or world-readable, it is warned of like the other secret files
 * (it was not: the check looks for a registered secret in the file); 0600, it is not. */
static void test_loose_registry_auth_file_warned(void **state)
{
    (void)state;
    char auth[64];
    write_temp(auth, "reg:auth-file-s3cret\n");
    assert_int_equal(chmod(auth, 0640), 0);
    Config cfg;
    char err[1024];
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--value-format=avro",
                     "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file", auth));
    config_register_secrets(&cfg);
    char *log = loose_files_logged(&cfg);
    char needle[200];
    snprintf(needle, sizeof(needle),
             "level=warn msg=\"secret file readable by other users\" file=\"%s\" mode=0640", auth);
    if (!strstr(log, needle) || strstr(log, "s3cret"))
        fail_msg("a 0640 auth file: logged \"%s\"", log);
    free(log);
    assert_int_equal(chmod(auth, 0600), 0);
    log = loose_files_logged(&cfg);
    if (strstr(log, "readable by other users"))
        fail_msg("a 0600 auth file: logged \"%s\"", log);
    free(log);
    config_free(&cfg);
    secrets_clear();
}

/* An auth file given as a pipe (--schema-registry-auth-file <(...)) can be read once: the check
 * of the configuration leaves it to the registry, whose read is the one that counts. */
static void test_registry_auth_file_pipe_left_unread(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    const char line[] = "reg:piped-s3cret\n";
    assert_int_equal(write(p[1], line, sizeof(line) - 1), (ssize_t)(sizeof(line) - 1));
    close(p[1]);
    char path[32];
    snprintf(path, sizeof(path), "/dev/fd/%d", p[0]);
    Config cfg;
    char err[1024];
    assert_true(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--value-format=avro",
                     "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file", path));
    char left[64] = "";
    ssize_t n = read(p[0], left, sizeof(left) - 1);
    if (n != (ssize_t)(sizeof(line) - 1))
        fail_msg("the pipe was read by the configuration's check: %zd bytes left", n);
    config_free(&cfg);
    close(p[0]);
}

/* Only a pipe is left to the registry's read: a device reads alike twice, and an empty or
 * malformed one is bad input found with the configuration (exit 2; check says it), as before. */
static void test_registry_auth_file_device_checked(void **state)
{
    (void)state;
    Config cfg;
    char err[1024];
    assert_false(LOAD(&cfg, err, "run", "--database-url=x", "--brokers=k:1", "--value-format=avro",
                      "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file",
                      "/dev/null"));
    assert_error_line(err, "schema-registry-auth-file /dev/null: expected USER:PASSWORD");
    config_free(&cfg);
}

/* Each --databases entry's registry reads the auth file itself at start-up: two reading one pipe
 * would leave the second an empty read and a misleading "expected USER:PASSWORD". Refused as bad
 * input, naming both; a regular file, one database, or check (one database) is fine. */
static void test_registry_auth_file_pipe_shared_by_databases(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    const char line[] = "reg:piped-s3cret\n";
    assert_int_equal(write(p[1], line, sizeof(line) - 1), (ssize_t)(sizeof(line) - 1));
    close(p[1]);
    char path[32], file[64];
    snprintf(path, sizeof(path), "/dev/fd/%d", p[0]);
    write_temp(file, line);
    const char *two = "[{\"name\": \"one\", \"database-url\": \"postgresql://h/a\"},"
                      " {\"name\": \"two\", \"database-url\": \"postgresql://h/b\"}]";
    const char *one = "[{\"name\": \"one\", \"database-url\": \"postgresql://h/a\"}]";
    Config cfg;
    char err[1024];
    assert_false(LOAD(&cfg, err, "run", "--brokers=k:1", "--value-format=avro",
                      "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file", path,
                      "--databases", two));
    assert_error_line(err, "databases: \"one\" and \"two\" both read schema-registry-auth-file");
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "run", "--brokers=k:1", "--value-format=avro",
                     "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file", path,
                     "--databases", one));
    config_free(&cfg);
    assert_true(LOAD(&cfg, err, "run", "--brokers=k:1", "--value-format=avro",
                     "--schema-registry-url=http://sr:8081", "--schema-registry-auth-file", file,
                     "--databases", two));
    config_free(&cfg);
    unlink(file);
    close(p[0]);
}

/* The lines of a captured log. */
static int count_lines(const char *log)
{
    int n = 0;
    for (const char *p = log; *p; p++)
        n += *p == '\n';
    return n;
}

/* Runs reload_config with stderr (the log) captured; returns what was logged (freed by caller). */
static char *reload_logged(Config *running, int argc, char **argv, bool *loaded)
{
    LogCapture c;
    log_capture_begin(&c);
    *loaded = reload_config(running, argc, argv);
    return log_capture_end(&c);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* A secret too short to scrub that a SIGHUP reload brings is warned of as at start-up (it was
 * counted, and nothing said); a reload holding none says nothing of it. */
static void test_reload_warns_of_short_secret(void **state)
{
    (void)state;
    char path[64], err[1024];
    write_temp(path, "{\"brokers\": \"k:9092\", \"database-url\": \"postgresql://u:long-pw@h/a\"}");
    char a0[] = "outbox-relay", a1[] = "run", a2[] = "--config";
    char *argv[] = {a0, a1, a2, path, NULL};
    Config running;
    bool loaded;
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    write_file(path, "{\"brokers\": \"k:9092\", \"database-url\": \"postgresql://u:long-pw@h/a\", "
                     "\"kafka\": {\"sasl.password\": \"ab\"}}");
    char *log = reload_logged(&running, 4, argv, &loaded);
    if (!strstr(log, "level=warn msg=\"secret too short to scrub\" count=1 min_length=4"))
        fail_msg("a reload bringing a 2-character sasl.password: logged %s", log);
    free(log);
    /* every reload that holds one says so, once for each (its --databases entries given the
     * file's --kafka properties too) */
    write_file(path, "{\"brokers\": \"k:9092\", \"kafka\": {\"sasl.password\": \"ab\"}, "
                     "\"databases\": [{\"name\": \"a\", \"database-url\": "
                     "\"postgresql://u:long-pw@h/a\"}, {\"name\": \"b\", \"database-url\": "
                     "\"postgresql://u:long-pw@h/b\"}]}");
    log = reload_logged(&running, 4, argv, &loaded);
    if (!strstr(log, "level=warn msg=\"secret too short to scrub\" count=1 min_length=4"))
        fail_msg("a reload keeping a 2-character sasl.password, with two databases: logged %s",
                 log);
    free(log);
    write_file(path, "{\"brokers\": \"k:9092\", \"database-url\": \"postgresql://u:long-pw@h/a\"}");
    log = reload_logged(&running, 4, argv, &loaded);
    assert_true(loaded);
    if (strstr(log, "too short"))
        fail_msg("a reload without a short secret: logged %s", log);
    free(log);
    config_free(&running);
    secrets_clear();
}

/* Replaces the file at path with a FIFO nobody writes to (removed by the teardown). */
static void swap_in_fifo(const char *path)
{
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
}

/* A reload runs on the event loop: a FIFO swapped in for a file the configuration names is
 * refused at once in one line, not waited on (a FIFO's open waits for a writer, freezing every
 * database), and the running configuration is kept. alarm() bounds each reload: one that waits
 * dies of SIGALRM, failing the test. At start-up a pipe is read (a secrets tool's). */
static void test_reload_refuses_fifo(void **state)
{
    (void)state;
    static const char *const options[] = {"--config", "--database-url-file", "--kafka-file",
                                          "--schema-registry-auth-file",
                                          "--schema-registry-ca-file"};
    for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++) {
        char conf[64], url[64], kafka[64], auth[64], ca[64], err[1024];
        write_temp(conf, "{\"batch-size\": 11, \"value-format\": \"avro\"}");
        write_temp(url, "postgresql://u:long-pw@h/a\n");
        write_temp(kafka, "linger.ms=5\n");
        write_temp(auth, "reg:long-pw\n");
        write_temp(ca, "not read: curl's\n");
        char a0[] = "outbox-relay", a1[] = "run", a2[] = "--config", a4[] = "--database-url-file",
             a6[] = "--kafka-file", a8[] = "--brokers", a9[] = "k:9092",
             a10[] = "--schema-registry-url", a11[] = "http://sr:8081",
             a12[] = "--schema-registry-auth-file", a14[] = "--schema-registry-ca-file";
        char *argv[] = {a0, a1,  a2,  conf, a4,   url, a6, kafka, a8,
                        a9, a10, a11, a12,  auth, a14, ca, NULL};
        Config running;
        assert_true(config_load(&running, 16, argv, err, sizeof(err)));
        assert_int_equal(running.batch_size, 11);
        char *paths[] = {conf, url, kafka, auth, ca};
        const char *path = paths[i];
        swap_in_fifo(path);
        bool loaded;
        alarm(20);
        char *log = reload_logged(&running, 16, argv, &loaded);
        alarm(0);
        assert_int_equal(running.batch_size, 11);
        if (loaded ||
            !strstr(log, "configuration reload failed; keeping the running configuration") ||
            !strstr(log, "not a regular file") || !strstr(log, path))
            fail_msg("%s a FIFO: logged %s", options[i], log);
        free(log);
        config_free(&running);
        clean_env(NULL); /* this round's files (temp_paths holds 8) */
    }
}

/* The config file is capped at 1 MiB, as every other file the configuration names is: a reload
 * of a larger one is refused in one line naming it, and the running configuration is kept;
 * start-up refuses it too. On the old code (json_loadfd, no cap) the reload took the 1 MiB + 1
 * file. */
static void test_config_file_capped(void **state)
{
    (void)state;
    char path[64], err[1024];
    write_temp(path, "{\"brokers\": \"k:9092\", \"database-url\": \"postgresql://h/a\", "
                     "\"batch-size\": 11}");
    char a0[] = "outbox-relay", a1[] = "run", a2[] = "--config";
    char *argv[] = {a0, a1, a2, path, NULL};
    Config running;
    bool loaded;
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    /* Valid JSON of exactly 1 MiB + 1 bytes: a comment key's long value. */
    static const char head[] = "{\"brokers\": \"k:9092\", \"database-url\": "
                               "\"postgresql://h/a\", \"batch-size\": 7, \"#\": \"";
    size_t size = (1u << 20) + 1;
    char *big = malloc(size + 1);
    assert_non_null(big);
    memset(big, 'x', size);
    memcpy(big, head, strlen(head));
    memcpy(big + size - 2, "\"}", 2);
    big[size] = '\0';
    write_file(path, big);
    char *log = reload_logged(&running, 4, argv, &loaded);
    assert_int_equal(running.batch_size, 11);
    if (loaded || !strstr(log, "configuration reload failed; keeping the running configuration") ||
        !strstr(log, "larger than 1 MiB") || !strstr(log, path))
        fail_msg("a config file of 1 MiB + 1: logged %s", log);
    free(log);
    Config cfg;
    if (config_load(&cfg, 4, argv, err, sizeof(err)))
        fail_msg("start-up took a config file of 1 MiB + 1");
    assert_non_null(strstr(err, "larger than 1 MiB"));
    config_free(&cfg);
    memcpy(big + size - 4, "\"}", 2); /* 1 MiB - 1: taken */
    big[size - 2] = '\0';
    write_file(path, big);
    log = reload_logged(&running, 4, argv, &loaded);
    if (!loaded || running.batch_size != 7)
        fail_msg("a config file under 1 MiB: logged %s", log);
    free(log);
    free(big);
    config_free(&running);
}

/* A reload that start-up would refuse beyond config_load (a list entry databases_entry_check
 * refuses; a --delivery-timeout past the running producer's message.timeout.ms) is refused whole,
 * in one line naming what is wrong: nothing of it is applied, not even its valid options. */
static void test_reload_all_or_nothing(void **state)
{
    (void)state;
    char path[64], err[1024];
    write_temp(path, "{\"brokers\": \"k:9092\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]}");
    char a0[] = "outbox-relay", a1[] = "run", a2[] = "--config";
    char *argv[] = {a0, a1, a2, path, NULL};
    Config running;
    bool loaded;
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    long batch = running.batch_size;
    /* b's template breaks order ({event_type} without --order-scope topic): start-up refuses
     * it, and so does the reload, batch-size and log-level included. */
    write_file(path, "{\"brokers\": \"k:9092\", \"batch-size\": 7, \"log-level\": \"debug\", "
                     "\"databases\": [{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\", "
                     "\"topic-template\": \"b.{event_type}\"}]}");
    char *log = reload_logged(&running, 4, argv, &loaded);
    assert_false(loaded);
    assert_int_equal(running.batch_size, batch);
    assert_int_not_equal(running.log_level, LOG_DEBUG);
    if (!strstr(log, "level=error msg=\"configuration reload failed; keeping the running "
                     "configuration\" error=\"database b: --topic-template") ||
        strstr(log, "configuration reloaded") || strchr(log, '\n') != strrchr(log, '\n'))
        fail_msg("a bad entry: logged %s", log);
    free(log);
    config_free(&running);

    /* The running producer's message.timeout.ms (60 s) bounds --delivery-timeout as at start. */
    write_file(path,
               "{\"brokers\": \"k:9092\", \"database-url\": \"postgresql://h/a\", "
               "\"delivery-timeout\": 30000, \"kafka\": {\"message.timeout.ms\": \"60000\"}}");
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    batch = running.batch_size;
    write_file(path, "{\"brokers\": \"k:9092\", \"database-url\": \"postgresql://h/a\", "
                     "\"batch-size\": 7, \"delivery-timeout\": 90000, "
                     "\"kafka\": {\"message.timeout.ms\": \"60000\"}}");
    log = reload_logged(&running, 4, argv, &loaded);
    assert_false(loaded);
    assert_int_equal(running.batch_size, batch);
    assert_int_equal(running.delivery_timeout_ms, 30000);
    if (!strstr(log, "--delivery-timeout (90000 ms) is longer than the running producer's "
                     "config file ") ||
        !strstr(log, "kafka message.timeout.ms=60000") || strstr(log, "configuration reloaded"))
        fail_msg("a delivery timeout past message.timeout.ms: logged %s", log);
    free(log);
    /* Up to it: applied. */
    write_file(path, "{\"brokers\": \"k:9092\", \"database-url\": \"postgresql://h/a\", "
                     "\"batch-size\": 7, \"delivery-timeout\": 60000, "
                     "\"kafka\": {\"message.timeout.ms\": \"60000\"}}");
    log = reload_logged(&running, 4, argv, &loaded);
    assert_true(loaded);
    assert_int_equal(running.batch_size, 7);
    assert_int_equal(running.delivery_timeout_ms, 60000);
    free(log);
    config_free(&running);

    /* With a list, the entry whose own --delivery-timeout is too long is named. */
    write_temp(path, "{\"brokers\": \"k:9092\", \"kafka\": {\"message.timeout.ms\": \"60000\"}, "
                     "\"delivery-timeout\": 30000, \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]}");
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    write_file(path, "{\"brokers\": \"k:9092\", \"kafka\": {\"message.timeout.ms\": \"60000\"}, "
                     "\"delivery-timeout\": 30000, \"batch-size\": 7, \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\", "
                     "\"delivery-timeout\": 120000}]}");
    log = reload_logged(&running, 4, argv, &loaded);
    assert_false(loaded);
    assert_int_not_equal(running.batch_size, 7);
    if (!strstr(log, "error=\"database b: --delivery-timeout (120000 ms)"))
        fail_msg("an entry's delivery timeout: logged %s", log);
    free(log);
    config_free(&running);
}

static int hook_then_calls;
static bool hook_refuse(const Config *fresh, void *arg, char *err, size_t errlen)
{
    (void)arg;
    snprintf(err, errlen, "database g: refused by the running relay (%d entries)", fresh->n_dbs);
    return false;
}
static bool hook_accept(const Config *fresh, void *arg, char *err, size_t errlen)
{
    (void)fresh, (void)arg, (void)err, (void)errlen;
    return true;
}
static void hook_then(Config *fresh, void *arg)
{
    (void)fresh, (void)arg;
    hook_then_calls++;
}

/* What only the running relay can refuse (databases_reload_check: a name still draining, an entry
 * naming a database a kept one serves, too many databases) is asked before anything is applied:
 * refused, nothing of the file is taken over (not even the top level's options), then is not
 * called, and the one line names what is wrong. */
static void test_reload_check_hook_all_or_nothing(void **state)
{
    (void)state;
    char path[64], err[1024];
    write_temp(path, "{\"brokers\": \"k:9092\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]}");
    char a0[] = "outbox-relay", a1[] = "run", a2[] = "--config";
    char *argv[] = {a0, a1, a2, path, NULL};
    Config running;
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    long batch = running.batch_size;
    write_file(path, "{\"brokers\": \"k:9092\", \"batch-size\": 7, \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                     "{\"name\": \"g\", \"database-url\": \"postgresql://h/g\"}]}");
    LogCapture c;
    log_capture_begin(&c);
    hook_then_calls = 0;
    bool loaded = reload_config_then(&running, 4, argv, hook_refuse, hook_then, NULL);
    char *log = log_capture_end(&c);
    assert_false(loaded);
    assert_int_equal(hook_then_calls, 0);
    assert_int_equal(running.batch_size, batch);
    assert_int_equal(running.n_dbs, 1);
    if (!strstr(log, "msg=\"configuration reload failed; keeping the running configuration\" "
                     "error=\"database g: refused by the running relay (2 entries)\"") ||
        strstr(log, "configuration reloaded") || strchr(log, '\n') != strrchr(log, '\n'))
        fail_msg("a refusing check: logged %s", log);
    free(log);
    /* Accepted: applied, and then sees it. */
    assert_true(reload_config_then(&running, 4, argv, hook_accept, hook_then, NULL));
    assert_int_equal(hook_then_calls, 1);
    assert_int_equal(running.batch_size, 7);
    config_free(&running);
}

/* The checks of a SIGHUP only the running databases can make (databases_reload_check), on real
 * (never started: nothing connects) databases: an added entry naming the database a kept entry
 * serves is refused, unless the file drops that entry (a rename); a name still draining is
 * refused. */
static void test_databases_reload_check(void **state)
{
    (void)state;
    char path[64], err[1024];
    write_temp(path, "{\"brokers\": \"127.0.0.1:1\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\"}]}");
    char a0[] = "outbox-relay", a1[] = "run", a2[] = "--config";
    char *argv[] = {a0, a1, a2, path, NULL};
    Config running, fresh;
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    bool runtime;
    rd_kafka_conf_t *kconf = kafka_conf_build(&running, &runtime, err, sizeof(err));
    assert_non_null(kconf);
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    assert_non_null(loop);
    Databases *d = databases_new(loop, &running, kconf, false, err, sizeof(err));
    if (!d)
        fail_msg("databases_new: %s", err);
    /* a's URL changed (restart-only: a keeps serving h/a) and g names h/a. */
    write_file(path, "{\"brokers\": \"127.0.0.1:1\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/x\"},"
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\"},"
                     "{\"name\": \"g\", \"database-url\": \"postgresql://h/a\"}]}");
    assert_true(config_load(&fresh, 4, argv, err, sizeof(err)));
    assert_false(databases_reload_check(d, &fresh, err, sizeof(err)));
    if (!strstr(err, "database g: names the same database (host, port and dbname) as database a"))
        fail_msg("a twin: %s", err);
    config_free(&fresh);
    /* a dropped, g added with a's URL: a rename, fine. */
    write_file(path, "{\"brokers\": \"127.0.0.1:1\", \"databases\": ["
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\"},"
                     "{\"name\": \"g\", \"database-url\": \"postgresql://h/a\"}]}");
    assert_true(config_load(&fresh, 4, argv, err, sizeof(err)));
    if (!databases_reload_check(d, &fresh, err, sizeof(err)))
        fail_msg("a rename refused: %s", err);
    config_free(&fresh);
    /* b dropped: it drains (never started, it stays until reaped). */
    write_file(path, "{\"brokers\": \"127.0.0.1:1\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]}");
    assert_true(config_load(&fresh, 4, argv, err, sizeof(err)));
    assert_true(databases_reload_check(d, &fresh, err, sizeof(err)));
    databases_reload(d, &fresh);
    config_free(&fresh);
    write_file(path, "{\"brokers\": \"127.0.0.1:1\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\"}]}");
    assert_true(config_load(&fresh, 4, argv, err, sizeof(err)));
    assert_false(databases_reload_check(d, &fresh, err, sizeof(err)));
    if (!strstr(err, "database b: listed again while it still drains"))
        fail_msg("a draining name: %s", err);
    config_free(&fresh);
    databases_free(d);
    ev_loop_destroy(loop);
    rd_kafka_conf_destroy(kconf);
    config_free(&running);
}

/* A SIGHUP that switches between one database and a --databases list, either way, is refused
 * whole, as other reloads start-up would refuse are (ops.c acts on a changed list only when the
 * relay runs one): one error line first and alone, none of its options applied (it said
 * "configuration reloaded" and then named databases as needing a restart, its batch-size taken).
 * A changed list, in a relay that runs one, is applied. */
static void test_reload_databases_switch_refused(void **state)
{
    (void)state;
    char path[64], err[1024];
    write_temp(path, "{\"brokers\": \"k:9092\", \"database-url\": \"postgresql://h/a\"}");
    char a0[] = "outbox-relay", a1[] = "run", a2[] = "--config";
    char *argv[] = {a0, a1, a2, path, NULL};
    Config running;
    bool loaded;
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    long batch = running.batch_size;
    write_file(path, "{\"brokers\": \"k:9092\", \"batch-size\": 7, \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]}");
    char *log = reload_logged(&running, 4, argv, &loaded);
    assert_false(loaded);
    assert_int_equal(running.batch_size, batch);
    if (count_lines(log) != 1 ||
        !strstr(log, "level=error msg=\"configuration reload failed; keeping the running "
                     "configuration\" error=\"a databases list appeared"))
        fail_msg("one database to a list: logged %s", log);
    free(log);
    config_free(&running);

    /* A list to one database. */
    write_file(path, "{\"brokers\": \"k:9092\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]}");
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    write_file(path, "{\"brokers\": \"k:9092\", \"batch-size\": 7, "
                     "\"database-url\": \"postgresql://h/a\"}");
    log = reload_logged(&running, 4, argv, &loaded);
    assert_false(loaded);
    assert_int_equal(running.batch_size, batch);
    assert_int_equal(running.n_dbs, 1);
    if (count_lines(log) != 1 ||
        !strstr(log, "level=error msg=\"configuration reload failed; keeping the running "
                     "configuration\" error=\"the databases list is gone"))
        fail_msg("a list to one database: logged %s", log);
    free(log);
    config_free(&running);

    /* A list changed in a relay that runs one: applied (databases_reload takes it over). */
    write_file(path, "{\"brokers\": \"k:9092\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"}]}");
    assert_true(config_load(&running, 4, argv, err, sizeof(err)));
    write_file(path, "{\"brokers\": \"k:9092\", \"databases\": ["
                     "{\"name\": \"a\", \"database-url\": \"postgresql://h/a\"},"
                     "{\"name\": \"b\", \"database-url\": \"postgresql://h/b\"}]}");
    log = reload_logged(&running, 4, argv, &loaded);
    if (!strstr(log, "changed=databases") || strstr(log, "need a restart"))
        fail_msg("a changed list: logged %s", log);
    free(log);
    /* The same list again: nothing changed since the reload that took it (the running list
     * was the start-up one for ever, so every later reload said changed=databases). */
    log = reload_logged(&running, 4, argv, &loaded);
    assert_true(loaded);
    if (!strstr(log, "msg=\"configuration reloaded\" changed=none"))
        fail_msg("the list unchanged since the last reload: logged %s", log);
    free(log);
    config_free(&running);
}

/* A password in a Schema Registry URL (curl takes http://USER:PASSWORD@host) is a secret like the
 * database URL's: registered as written (percent-encoded), for each URL of the list, from a flag,
 * the environment or the config file, around a --databases list as without one. */
static void test_registry_url_password_secret(void **state)
{
    (void)state;
    secrets_clear();
    Config cfg;
    char err[1024], line[512], q[600];
    assert_true(LOAD(&cfg, err, "run", "--database-url", "postgresql://h/db", "--brokers", "k:1",
                     "--value-format", "avro", "--schema-registry-url",
                     "http://reg:hunter2@127.0.0.1:8081, https://other:s3cr%40t-x@h2:443/sr"));
    config_register_secrets(&cfg);
    config_free(&cfg);
    snprintf(line, sizeof(line), "url=http://reg:hunter2@127.0.0.1:8081 next=%s",
             "https://other:s3cr%40t-x@h2:443/sr");
    secrets_scrub(line);
    assert_string_equal(line, "url=http://reg:***@127.0.0.1:8081 next=https://other:***@h2:443/sr");
    /* What every log line goes through. */
    log_quote("registry unreachable: http://reg:hunter2@127.0.0.1:8081", q, sizeof(q));
    assert_null(strstr(q, "hunter2"));
    secrets_clear();

    /* From the environment, around a list of databases. */
    setenv("SCHEMA_REGISTRY_URL", "http://user:env-pass-1@sr:8081", 1);
    assert_true(LOAD(&cfg, err, "run", "--brokers", "k:1", "--databases",
                     "[{\"name\": \"a\", \"database-url\": \"postgresql://h/a\", "
                     "\"value-format\": \"json-schema\"}]"));
    assert_false(secrets_found("env-pass-1"));
    config_register_secrets(&cfg);
    assert_true(secrets_found("env-pass-1"));
    assert_false(secrets_found("user")); /* the user name is no secret */
    config_free(&cfg);
    unsetenv("SCHEMA_REGISTRY_URL");
    secrets_clear();

    /* From the config file; a user info without ':' is a token (http://APIKEY@host), registered
     * whole; a URL without user info registers nothing. */
    char path[64];
    write_temp(path, "{\"schema-registry-url\": \"http://only-user@sr:8081,http://sr2:8081\"}");
    assert_true(LOAD(&cfg, err, "run", "--database-url", "postgresql://h/db", "--brokers", "k:1",
                     "--config", path));
    config_register_secrets(&cfg);
    assert_true(secrets_found("only-user"));
    assert_false(secrets_found("sr:8081"));
    assert_false(secrets_found("sr2:8081"));
    config_free(&cfg);
    /* curl takes a URL without a scheme as http://. */
    write_temp(path,
               "{\"schema-registry-url\": \"http://u:file-pass-2@sr:8081,u:no-scheme-3@sr\"}");
    assert_true(LOAD(&cfg, err, "run", "--database-url", "postgresql://h/db", "--brokers", "k:1",
                     "--config", path));
    config_register_secrets(&cfg);
    assert_true(secrets_found("file-pass-2"));
    assert_true(secrets_found("no-scheme-3"));
    config_free(&cfg);
    secrets_clear();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_refuses_other_selections),
        cmocka_unit_test(test_dry_run_refused_by_commands_without_one),
        cmocka_unit_test(test_dry_run_refused_from_config_file),
        cmocka_unit_test(test_scrub_argv),
        cmocka_unit_test(test_scrub_argv_registry_short_password),
        T(test_command_run),
        T(test_debezium_aliases),
        T(test_alias_and_name_in_one_source),
        T(test_command_migrate),
        T(test_command_help),
        T(test_command_help_after_run),
        T(test_command_version),
        T(test_missing_command),
        T(test_help_and_version_take_no_arguments),
        T(test_unknown_command),
        T(test_option_before_command),
        T(test_defaults),
        T(test_flag_separate_value),
        T(test_flag_equals_value),
        T(test_flag_value_with_equals),
        T(test_batch_size_bounds_accepted),
        T(test_last_flag_wins),
        T(test_precedence_database_url),
        T(test_precedence_brokers),
        T(test_precedence_batch_size),
        T(test_kafka_flags_in_order),
        T(test_kafka_file_then_flags),
        T(test_parse_kafka_prop),
        T(test_error_unknown_option),
        T(test_error_missing_value),
        T(test_error_empty_string_value),
        T(test_error_batch_size),
        T(test_error_batch_size_exact_text),
        T(test_error_batch_size_in_file),
        T(test_error_log_level),
        T(test_error_value_with_newline_is_one_line),
        T(test_error_malformed_json),
        T(test_error_duplicate_key),
        T(test_error_unreadable_file),
        T(test_error_top_level_not_object),
        T(test_error_config_directory_and_booleans),
        T(test_error_unknown_config_key),
        T(test_error_config_key_in_file),
        T(test_error_kafka_not_object),
        T(test_error_kafka_flag),
        T(test_error_missing_database_url),
        T(test_installed_configuration),
        T(test_file_comment_keys),
        T(test_print_command_help),
        T(test_error_missing_brokers),
        T(test_brokers_list),
        T(test_registry_files_checked),
        T(test_registry_url_list_checked),
        T(test_registry_auth_line_same_rule),
        T(test_error_fits_small_buffer),
        T(test_config_free_zeroed),
        T(test_print_table),
        T(test_print_help),
        T(test_parse_duration),
        T(test_retention_option),
        T(test_duration_sign_and_since_minimum),
        T(test_statement_timeout_range),
        T(test_purge_dead_and_status_commands),
        T(test_database_url_file),
        T(test_database_url_file_precedence),
        T(test_kafka_file),
        T(test_error_json_does_not_echo_values),
        T(test_error_databases_json_does_not_echo_values),
        T(test_registry_url_comma_in_password),
        T(test_registry_url_idn),
        T(test_loose_registry_auth_file_warned),
        T(test_registry_auth_file_pipe_left_unread),
        T(test_registry_auth_file_pipe_shared_by_databases),
        T(test_registry_auth_file_device_checked),
        T(test_reload_warns_of_short_secret),
        T(test_reload_diff_and_apply),
        T(test_reload_diff_registry_files),
        T(test_registry_files_hashed_once),
        T(test_reloadable_options),
        T(test_databases_entries),
        T(test_databases_sessions_default),
        T(test_databases_errors),
        T(test_databases_option_checks),
        T(test_databases_reload_refuses_bad_entry),
        T(test_reload_check_hook_all_or_nothing),
        T(test_databases_reload_check),
        T(test_reload_databases_switch_refused),
        T(test_reload_all_or_nothing),
        T(test_reload_refuses_fifo),
        T(test_config_file_capped),
        T(test_databases_same_database_refused),
        T(test_registry_url_password_secret),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
