/* Unit tests of the upkeep session (relay/service/upkeep.c) without a server: the real upkeep
 * over fake_pg (tests/unit/fake_pg.h), answering its first refresh and retention batch with
 * canned results, and reading what it set (/metrics) and logged (stderr, into a file).
 *
 * Why here and not only in tests/it/operations/81_retention.sh: a read of the oldest sent row's
 * age that fails while the count answers is made there by a row sent at -infinity, which
 * PostgreSQL 15 could not subtract from now(); SQL_RETENTION_OLDEST now copes with it, and no
 * row can fail that read any more. A timeout still can, which a test cannot bring about
 * without timing; a canned error can. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "fake_pg.h"
#include "log.h"
#include "metrics.h"
#include "strbuf.h"
#include "upkeep.h"

static struct {
    struct ev_loop *loop;
    Config cfg;
    Upkeep *u;
    PgConn *pg;
    FILE *log; /* stderr's lines while a test runs */
    int stderr_fd;
} T;

static int setup(void **state)
{
    (void)state;
    memset(&T, 0, sizeof(T));
    T.loop = ev_default_loop(0);
    metrics_reset();
    char *argv[] = {"outbox-relay",         "run",       "--database-url",
                    "postgresql://fake/db", "--brokers", "fake:9092",
                    "--retention",          "1h",        NULL};
    char err[512];
    if (!config_load(&T.cfg, 8, argv, err, sizeof(err)))
        fail_msg("config: %s", err);
    T.log = tmpfile();
    assert_non_null(T.log);
    fflush(stderr);
    T.stderr_fd = dup(STDERR_FILENO);
    dup2(fileno(T.log), STDERR_FILENO);
    log_set_level(LOG_DEBUG);
    T.u = upkeep_new(T.loop, &T.cfg, true);
    assert_non_null(T.u);
    T.pg = fake_pg_named("upkeep");
    assert_non_null(T.pg);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    upkeep_free(T.u);
    fflush(stderr);
    dup2(T.stderr_fd, STDERR_FILENO);
    close(T.stderr_fd);
    fclose(T.log);
    fake_pg_forget();
    config_free(&T.cfg);
    return 0;
}

/* How many lines logged so far hold every one of the NULL-terminated needles. */
static int logged(const char *needle, ...)
{
    fflush(stderr);
    rewind(T.log);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof(line), T.log)) {
        bool all = strstr(line, needle) != NULL;
        va_list ap;
        va_start(ap, needle);
        for (const char *s; all && (s = va_arg(ap, const char *));)
            all = strstr(line, s) != NULL;
        va_end(ap);
        n += all;
    }
    fseek(T.log, 0, SEEK_END);
    return n;
}

/* Whether /metrics holds a sample of name. */
static bool served(const char *name)
{
    StrBuf out = {0};
    MetricsLive live = {0};
    metrics_render(&out, &live);
    char sample[128];
    snprintf(sample, sizeof(sample), "\n%s ", name);
    bool found = out.s && strstr(out.s, sample) != NULL;
    strbuf_free(&out);
    return found;
}

/* Brings the connection up and answers its session setup: the first refresh goes at once. */
static void connect_upkeep(void)
{
    fake_pg_up(T.pg);
    const FakeRequest *setup_req = fake_pg_pending(T.pg);
    assert_non_null(setup_req);
    PGresult *r[PG_MAX_QUERIES];
    for (int i = 0; i < setup_req->n; i++)
        r[i] = fake_pg_command_ok();
    fake_pg_answer(T.pg, r, setup_req->n);
}

static const char SQUATTER_COLS[] = "pid,what,lanes,slots,role,app,client";
static const char BACKLOG_COLS[] = "unsent,retrying,dead,oldest,dlq_failed";

/* Answers the refresh in flight (squatters, count, oldest sent row's age, horizon): the count
 * answers, the age's read fails with msg. */
static void answer_refresh_age_failing(const char *msg)
{
    const FakeRequest *req = fake_pg_pending(T.pg);
    assert_non_null(req);
    assert_int_equal(req->n, 4);
    assert_non_null(strstr(req->sql[2], "ORDER BY sent_at LIMIT 1"));
    static const char *const counted[] = {"3", "0", "0", "12.5", "0"};
    PGresult *r[4] = {fake_pg_tuples(SQUATTER_COLS, 0, NULL),
                      fake_pg_tuples(BACKLOG_COLS, 1, counted), fake_pg_error("22008", msg),
                      fake_pg_aborted()};
    fake_pg_answer(T.pg, r, 4);
}

/* The count and the age are one refresh: an age that failed while the count answered set the
 * backlog gauges and their stamp (outbox_backlog_refresh_timestamp_seconds), and the overdue
 * gauge kept its last value under it: OutboxGaugesStale never saw it. */
static void test_refresh_whole_or_none(void **state)
{
    (void)state;
    connect_upkeep();
    answer_refresh_age_failing("ERROR:  canceling statement due to statement timeout");
    assert_false(served("outbox_backlog_refresh_timestamp_seconds"));
    assert_false(served("outbox_backlog_rows"));
    assert_false(served("outbox_retention_overdue_seconds"));
    assert_int_equal(logged("level=warn", "upkeep query failed", "task=backlog", NULL), 1);
}

/* A retention batch that works after a failed refresh says nothing of the refresh: with one
 * last error for all tasks it logged "upkeep queries work again" (task=retention), and the
 * refresh's next failure was new again, a warn line and an info line every interval. */
static void test_retention_working_says_nothing_of_refresh(void **state)
{
    (void)state;
    connect_upkeep();
    answer_refresh_age_failing("ERROR:  canceling statement due to statement timeout");
    const FakeRequest *req = fake_pg_pending(T.pg);
    assert_non_null(req); /* the sweep's batch, sent once the refresh was answered */
    assert_int_equal(req->n, 2);
    assert_non_null(strstr(req->sql[1], "DELETE"));
    static const char *const deleted[] = {"0", NULL};
    PGresult *r[2] = {fake_pg_command_ok(), fake_pg_tuples("count,max", 1, deleted)};
    fake_pg_answer(T.pg, r, 2);
    assert_int_equal(logged("upkeep queries work again", NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_refresh_whole_or_none, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retention_working_says_nothing_of_refresh, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
