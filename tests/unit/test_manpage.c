/* Unit tests for manpage.c: the roff it writes for the man pages (tools/gen-man.sh). Text from the
 * option tables must come out literally: a backslash or a '.' / '\'' at the start of a line would
 * otherwise be read as roff, and '-' must be \- so options stay copy-pastable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>

#include "manpage.h"

typedef struct {
    char *buf;
    size_t len;
    FILE *f;
} Mem;

static void mem_open(Mem *m)
{
    m->buf = NULL;
    m->len = 0;
    m->f = open_memstream(&m->buf, &m->len);
    assert_non_null(m->f);
}

/* Closes the stream and returns what was written (freed by the caller). */
static char *mem_close(Mem *m)
{
    fclose(m->f);
    return m->buf;
}

static void test_text_escapes(void **state)
{
    Mem m;
    mem_open(&m);
    manpage_text(m.f, ".SH not a request\n'neither\na\\b --x-y 'in.line'");
    char *out = mem_close(&m);
    assert_string_equal(out, "\\&.SH not a request\n\\&'neither\na\\eb \\-\\-x\\-y 'in.line'");
    free(out);
}

static void test_option_full(void **state)
{
    Mem m;
    mem_open(&m);
    ManOption o = {"batch-size", "N", "rows per claim", "BATCH", "1000", "Reloaded on SIGHUP."};
    manpage_option(m.f, &o);
    char *out = mem_close(&m);
    assert_string_equal(out, ".TP\n\\fB\\-\\-batch\\-size\\fR \\fIN\\fR\n"
                             "rows per claim.\n"
                             "Environment: \\fBBATCH\\fR.\n"
                             "Default: \\fB1000\\fR.\n"
                             "Reloaded on SIGHUP.\n");
    free(out);
}

/* A flag without a value (metavar ""), no environment, default or note: the tag and help only. */
static void test_option_bare_flag(void **state)
{
    Mem m;
    mem_open(&m);
    ManOption o = {"all", "", "every dead-lettered event", NULL, NULL, NULL};
    manpage_option(m.f, &o);
    char *out = mem_close(&m);
    assert_string_equal(out, ".TP\n\\fB\\-\\-all\\fR\nevery dead\\-lettered event.\n");
    free(out);
}

static void test_command_env_section(void **state)
{
    Mem m;
    mem_open(&m);
    manpage_section(m.f, "COMMANDS");
    manpage_command(m.f, "purge-dead", "delete them");
    manpage_env(m.f, "DATABASE_URL", "database-url");
    char *out = mem_close(&m);
    assert_string_equal(out,
                        ".SH COMMANDS\n"
                        ".TP\n\\fBpurge\\-dead\\fR\ndelete them\n"
                        ".TP\n\\fBDATABASE_URL\\fR\n"
                        "Read when \\fB\\-\\-database\\-url\\fR is not on the command line.\n");
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_escapes),
        cmocka_unit_test(test_option_full),
        cmocka_unit_test(test_option_bare_flag),
        cmocka_unit_test(test_command_env_section),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
