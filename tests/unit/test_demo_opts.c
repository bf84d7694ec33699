/* Unit tests for lib/opts.c: commands, per-command options, precedence (flag >
 * environment > default), ranges, repeatable KEY=VALUE lists, required options and --help. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "log.h"
#include "opts.h"

enum { C_RUN, C_LOAD, C_HELP, C_VERSION };

typedef struct T {
    char *url;
    long rate;
    OptList kv;
    LogLevel level;
} T;

static const OptDef defs[] = {
    {.name = "url",
     .type = OPT_STRING,
     .env = "TEST_OPTS_URL",
     .offset = offsetof(T, url),
     .commands = 3,
     .required = 3,
     .metavar = "URL",
     .help = "the url"},
    {.name = "rate",
     .type = OPT_INT,
     .def = "5",
     .max = 100,
     .offset = offsetof(T, rate),
     .commands = 1u << C_LOAD,
     .metavar = "R",
     .help = "a rate"},
    {.name = "kv",
     .type = OPT_LIST,
     .offset = offsetof(T, kv),
     .commands = 1u << C_RUN,
     .metavar = "K=V",
     .help = "pairs"},
    {.name = "log-level",
     .type = OPT_LOG_LEVEL,
     .def = "info",
     .offset = offsetof(T, level),
     .commands = 3,
     .metavar = "L",
     .help = "level"},
};
static const CmdDef cmds[] = {{"run", C_RUN, "run"},
                              {"load", C_LOAD, "load"},
                              {"help", C_HELP, "help"},
                              {"version", C_VERSION, "version"}};

static OptSpec spec(int default_cmd)
{
    return (OptSpec){.prog = "prog",
                     .summary = "summary",
                     .cmds = cmds,
                     .ncmds = 4,
                     .default_cmd = default_cmd,
                     .help_cmd = C_HELP,
                     .version_cmd = C_VERSION,
                     .opts = defs,
                     .nopts = 4};
}

/* Parses a NULL-terminated argument list (after the program name). */
static bool parse(int default_cmd, T *t, int *cmd, char *err, ...)
{
    char *argv[16] = {"prog"};
    int argc = 1;
    va_list ap;
    va_start(ap, err);
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    OptSpec s = spec(default_cmd);
    memset(t, 0, sizeof(*t));
    err[0] = '\0';
    return opts_parse(&s, t, cmd, argc, argv, err, 256);
}

static void release(T *t)
{
    OptSpec s = spec(-1);
    opts_free(&s, t);
}

static void test_command_and_defaults(void **state)
{
    T t;
    int cmd;
    char err[256];
    unsetenv("TEST_OPTS_URL");
    assert_true(parse(-1, &t, &cmd, err, "load", "--url", "u1", NULL));
    assert_int_equal(cmd, C_LOAD);
    assert_string_equal(t.url, "u1");
    assert_int_equal(t.rate, 5);
    assert_int_equal(t.level, LOG_INFO);
    release(&t);
    assert_true(parse(-1, &t, &cmd, err, "load", "--url=u2", "--rate=0", NULL));
    assert_string_equal(t.url, "u2");
    assert_int_equal(t.rate, 0);
    release(&t);
}

static void test_default_command(void **state)
{
    T t;
    int cmd;
    char err[256];
    assert_true(parse(C_RUN, &t, &cmd, err, "--url", "u", "--kv", "a=1", "--kv", "b=c=d", NULL));
    assert_int_equal(cmd, C_RUN);
    assert_int_equal(t.kv.len, 2);
    assert_string_equal(t.kv.items[0].key, "a");
    assert_string_equal(t.kv.items[0].value, "1");
    assert_string_equal(t.kv.items[1].key, "b");
    assert_string_equal(t.kv.items[1].value, "c=d");
    release(&t);
    assert_false(parse(-1, &t, &cmd, err, "--url", "u", NULL));
    assert_string_equal(err, "expected a command before '--url': try 'prog --help'");
    release(&t);
    /* An argument an error shows may hold a secret (none is registered yet): an option's value
     * is left out, anything else masked as a connection string is. */
    assert_false(parse(-1, &t, &cmd, err, "--url=postgresql://u:pw-secret@h/d", NULL));
    assert_string_equal(err, "expected a command before '--url=...': try 'prog --help'");
    release(&t);
    assert_false(parse(-1, &t, &cmd, err, "postgresql://u:pw-secret@h/d", NULL));
    assert_string_equal(err, "unknown command 'postgresql://u:***@h/d': try 'prog --help'");
    release(&t);
    assert_false(parse(-1, &t, &cmd, err, "--help", "http://API-token@h", NULL));
    assert_string_equal(err, "--help takes no arguments, got 'http://***@h': try 'prog --help' or "
                             "'prog COMMAND --help'");
    release(&t);
    assert_false(parse(-1, &t, &cmd, err, NULL));
    assert_string_equal(err, "missing command: try 'prog --help'");
    release(&t);
}

static void test_environment_and_precedence(void **state)
{
    T t;
    int cmd;
    char err[256];
    setenv("TEST_OPTS_URL", "from-env", 1);
    assert_true(parse(-1, &t, &cmd, err, "run", NULL));
    assert_string_equal(t.url, "from-env");
    release(&t);
    assert_true(parse(-1, &t, &cmd, err, "run", "--url", "from-flag", NULL));
    assert_string_equal(t.url, "from-flag");
    release(&t);
    unsetenv("TEST_OPTS_URL");
}

static void test_errors(void **state)
{
    static const struct {
        const char *args[6];
        const char *err;
    } cases[] = {
        {{"bogus"}, "unknown command 'bogus': try 'prog --help'"},
        {{"run", "--nope", "x"}, "unknown option '--nope': try 'prog --help'"},
        /* A ':' typed for the '=': the rest may be a secret (none registered yet). */
        {{"run", "--url:postgresql://u:pw-secret@h/d"},
         "unknown option '--url...': try 'prog --help'"},
        {{"run", "--kv.sasl.password=x"}, "unknown option '--kv.sasl.password': try 'prog --help'"},
        {{"run", "--rate", "1"}, "option --rate does not apply to 'run'"},
        {{"load", "--url"}, "option --url needs a value (URL)"},
        {{"load", "--url", "u", "stray"}, "unexpected argument 'stray': try 'prog --help'"},
        /* A stray argument may be a secret, before any is registered for a scrub: after an
         * empty "--url=" it is most likely the value (not shown); otherwise it is masked as a
         * connection string is. */
        {{"load", "--url=", "postgresql://u:pw-secret@h/d"},
         "unexpected argument after '--url=' (not shown: it may be that option's value, with a "
         "blank after the '='): try 'prog --help'"},
        {{"load", "--url=", "bare-token"},
         "unexpected argument after '--url=' (not shown: it may be that option's value, with a "
         "blank after the '='): try 'prog --help'"},
        /* The same after a KEY=VALUE entry given an empty value ("--kafka sasl.password= pw"),
         * the entry shown as shown_arg shows it. */
        {{"run", "--url", "u", "--kv", "sasl.password=", "pw-secret"},
         "unexpected argument after 'sasl.password=' (not shown: it may be that option's value, "
         "with a blank after the '='): try 'prog --help'"},
        {{"run", "--url", "u", "--kv=sasl.password=", "pw-secret"},
         "unexpected argument after '--kv=...' (not shown: it may be that option's value, with a "
         "blank after the '='): try 'prog --help'"},
        {{"load", "--url", "postgresql://u:pw-secret@h/d?sslmode=", "require"},
         "unexpected argument after 'postgresql://u:***@h/d?sslmode=' (not shown: it may be that "
         "option's value, with a blank after the '='): try 'prog --help'"},
        {{"load", "--url", "u", "postgresql://u:pw-secret@h/d"},
         "unexpected argument 'postgresql://u:***@h/d': try 'prog --help'"},
        /* a --kafka-like list's sensitive key given its value after a blank: that value, a
         * bare word, is not shown either */
        {{"run", "--kv", "sasl.password", "pw-secret"},
         "unexpected argument after 'sasl.password' (not shown: it may be that key's value, with "
         "a blank instead of the '='): try 'prog --help'"},
        {{"run", "--kv", "ssl.key.password=", "pw-secret"},
         "unexpected argument after 'ssl.key.password=' (not shown: it may be that option's "
         "value, with a blank after the '='): try 'prog --help'"},
        {{"run", "--kv", "client.id", "stray"}, "unexpected argument 'stray': try 'prog --help'"},
        /* A librdkafka secret property given without its --kafka, and the tail of a password
         * cut at a blank ("postgresql://u:pw secret@h/d" unquoted), are not shown either. */
        {{"run", "--url", "u", "sasl.password=pw-secret"},
         "unexpected argument 'sasl.password=...': try 'prog --help'"},
        {{"load", "--url", "postgresql://u:pw", "secret-tail@h/d"},
         "unexpected argument '***@h/d': try 'prog --help'"},
        {{"load", "--url", "u", "host=h password=pw-secret"},
         "unexpected argument 'host=h password=***': try 'prog --help'"},
        {{"load", "--url", ""}, "--url: value must not be empty"},
        {{"load", "--url", "u", "--rate=101"},
         "--rate: expected an integer from 0 to 100, got '101'"},
        {{"load", "--url", "u", "--rate=1x"},
         "--rate: expected an integer from 0 to 100, got '1x'"},
        {{"load", "--url", "u", "--rate="}, "--rate: expected an integer from 0 to 100, got ''"},
        {{"run", "--url", "u", "--kv=novalue"},
         "--kv: expected KEY=VALUE (a non-empty key, then '=')" /* not echoed: may be a secret */},
        {{"run", "--url", "u", "--kv==v"}, "--kv: expected KEY=VALUE (a non-empty key, then '=')"},
        {{"run", "--log-level", "loud"},
         "--log-level: expected debug, info, warn or error, got 'loud'"},
        {{"run"}, "missing --url (or set TEST_OPTS_URL)"},
        {{"load", "--url", "u", "--rate=1\n2"},
         "--rate: expected an integer from 0 to 100, got '1?2'"},
    };
    unsetenv("TEST_OPTS_URL");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        T t;
        int cmd;
        char err[256];
        const char *const *a = cases[i].args;
        bool ok = parse(-1, &t, &cmd, err, a[0], a[1], a[2], a[3], a[4], a[5], NULL);
        release(&t);
        if (ok || strcmp(err, cases[i].err) != 0)
            fail_msg("case %zu: got %s '%s', expected '%s'", i, ok ? "success" : "error", err,
                     cases[i].err);
    }
}

static void test_help_and_version(void **state)
{
    T t;
    int cmd;
    char err[256];
    assert_true(parse(-1, &t, &cmd, err, "--help", NULL));
    assert_int_equal(cmd, C_HELP);
    assert_true(parse(-1, &t, &cmd, err, "-V", NULL));
    assert_int_equal(cmd, C_VERSION);
    assert_true(parse(-1, &t, &cmd, err, "run", "-h", NULL));
    assert_int_equal(cmd, C_HELP);
    release(&t);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    OptSpec s = spec(-1);
    opts_print_help(&s, f);
    fclose(f);
    assert_non_null(strstr(text, "Usage: prog COMMAND [OPTIONS]"));
    assert_non_null(strstr(text, "--rate R"));
    assert_non_null(strstr(text, "[default 5] (load)"));
    assert_non_null(strstr(text, "[env TEST_OPTS_URL] (run,load)"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_command_and_defaults),       cmocka_unit_test(test_default_command),
        cmocka_unit_test(test_environment_and_precedence), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_help_and_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
