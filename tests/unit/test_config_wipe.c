/* Unit test for config.c: a secret read from a file is zeroed before its memory is freed, on
 * every error path too. This binary replaces free() with counting_free.h's, which, while armed,
 * looks through each block freed for a marker planted in the file, then hands the block to the
 * allocator's own free (the sanitizer's). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "counting_free.h"
#include "db.h"
#include "pg.h"
#include "registry.h"

/* Planted in each secret; free_marker throughout, and free_alone unless a test names another
 * text a block may not hold whole. */
static const char MARKER[] = "wipe-marker-Q7zX";

/* Loads argv with --database-url-file naming a file holding the len bytes at text: the load must
 * fail and leave no freed block holding MARKER. */
static void assert_load_wipes(const char *text, size_t len, const char *needle)
{
    char path[] = "/tmp/outbox-relay-test-wipe-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    assert_int_equal(close(fd), 0);
    char *argv[] = {(char *)"outbox-relay", (char *)"migrate", (char *)"--database-url-file", path,
                    NULL};
    Config cfg;
    char err[512] = "";
    freed_with_marker = 0;
    free_armed = true;
    bool ok = config_load(&cfg, 4, argv, err, sizeof(err));
    config_free(&cfg);
    free_armed = false;
    unlink(path);
    assert_false(ok);
    if (!strstr(err, needle))
        fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
    assert_null(strstr(err, MARKER));
    assert_int_equal(freed_with_marker, 0);
}

/* A database-URL file of more than one line (the URL, then a stray line) or holding a NUL byte:
 * refused, and not left in the heap. (A file libpq gets to parse is checked by the next test,
 * for libpq's copies of the password alone: PQconninfoParse frees a scratch copy of the whole
 * string unzeroed, which no caller can change.) */
static void test_database_url_file_refused_is_wiped(void **state)
{
    (void)state;
    unsetenv("DATABASE_URL");
    unsetenv("DATABASE_URL_FILE");
    static const char two_lines[] = "postgresql://u:wipe-marker-Q7zX@h/db\nsecond line\n";
    assert_load_wipes(two_lines, strlen(two_lines), "more than one line");
    static const char nul[] = "postgresql://u:wipe-marker-Q7zX@h/db\0x\n";
    assert_load_wipes(nul, sizeof(nul) - 1, "contains a NUL byte");
}

/* A URL libpq parses (to register its password, to check it, to plan its hosts): libpq copies
 * the password into a block of its own for each parse, which the relay frees
 * (secrets_conninfo_free) zeroed. libpq's scratch copy of the whole string, freed inside
 * PQconninfoParse, is beyond reach: the count is of blocks holding the password alone. */
static void test_libpq_password_copies_are_wiped(void **state)
{
    (void)state;
    unsetenv("DATABASE_URL");
    unsetenv("DATABASE_URL_FILE");
    char *argv[] = {(char *)"outbox-relay", (char *)"migrate", (char *)"--database-url",
                    (char *)"postgresql://u:wipe-marker-Q7zX@h/db", NULL};
    Config cfg;
    char err[512] = "";
    freed_alone = 0;
    free_armed = true;
    bool ok = config_load(&cfg, 4, argv, err, sizeof(err));
    if (ok) {
        config_register_secrets(&cfg);                                     /* as main does */
        ok = db_check_writer_conninfo(cfg.database_url, err, sizeof(err)); /* as migrate does */
    }
    config_free(&cfg);
    free_armed = false;
    if (!ok)
        fail_msg("load or check: %s", err);
    assert_int_equal(freed_alone, 0);
}

/* A config file holding a secret (a librdkafka password, as the shipped relay.json can):
 * jansson's copies of it (its lexer's buffer, the string value, the key and value of the
 * object) and the relay's are zeroed when freed: no freed block holds it. */
static void test_config_file_secret_is_wiped(void **state)
{
    (void)state;
    unsetenv("DATABASE_URL");
    unsetenv("DATABASE_URL_FILE");
    char path[] = "/tmp/outbox-relay-test-wipe-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char text[] = "{\"kafka\": {\"sasl.password\": \"wipe-marker-Q7zX\"},\n"
                               " \"database-url\": \"postgresql://u@h/db\"}\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    assert_int_equal(close(fd), 0);
    char *argv[] = {(char *)"outbox-relay", (char *)"migrate", (char *)"--config", path, NULL};
    Config cfg;
    char err[512] = "";
    freed_with_marker = 0;
    free_armed = true;
    bool ok = config_load(&cfg, 4, argv, err, sizeof(err));
    config_free(&cfg);
    free_armed = false;
    unlink(path);
    if (!ok)
        fail_msg("config_load: %s", err);
    assert_int_equal(freed_with_marker, 0);
}

static void on_pg_state(PgConn *pg, bool up, const char *reason, void *arg)
{
    (void)pg, (void)up, (void)reason, (void)arg;
}

/* A connection's copy of its connection string (the password in it) is zeroed when the
 * connection is freed. libpq's scratch copy is cut by its parse (NULs at the separators), so the
 * count of blocks freed holding the whole URL is the relay's own copies'. */
static void test_pg_conn_copy_is_wiped(void **state)
{
    (void)state;
    static const char url[] = "postgresql://u:wipe-marker-Q7zX@127.0.0.1:1/db";
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    assert_non_null(loop);
    freed_alone = 0;
    free_alone = url;
    free_armed = true;
    PgConn *pg = pg_conn_new_named(loop, url, "wipe", on_pg_state, NULL, NULL);
    assert_non_null(pg);
    pg_conn_free(pg);
    free_armed = false;
    free_alone = MARKER;
    ev_loop_destroy(loop);
    assert_int_equal(freed_alone, 0);
}

/* DATABASE_URL in the environment and --database-url-file as a flag: the file, the stronger
 * source, wins, and the environment's URL (its password) that the option held until then is
 * zeroed when it gives way. Counted as blocks freed holding that whole URL: libpq's scratch copy
 * of the file's URL is another string, and the environment's is never parsed. */
static void test_env_url_replaced_by_file_is_wiped(void **state)
{
    (void)state;
    static const char env_url[] = "postgresql://u:wipe-marker-Q7zX@h/envdb";
    setenv("DATABASE_URL", env_url, 1);
    unsetenv("DATABASE_URL_FILE");
    char path[] = "/tmp/outbox-relay-test-wipe-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char text[] = "postgresql://u@h/filedb\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    assert_int_equal(close(fd), 0);
    char *argv[] = {(char *)"outbox-relay", (char *)"migrate", (char *)"--database-url-file", path,
                    NULL};
    Config cfg;
    char err[512] = "";
    freed_alone = 0;
    free_alone = env_url;
    free_armed = true;
    bool ok = config_load(&cfg, 4, argv, err, sizeof(err));
    bool from_file =
        ok && cfg.database_url && strcmp(cfg.database_url, "postgresql://u@h/filedb") == 0;
    config_free(&cfg);
    free_armed = false;
    free_alone = MARKER;
    unlink(path);
    unsetenv("DATABASE_URL");
    if (!ok)
        fail_msg("config_load: %s", err);
    assert_true(from_file);
    assert_int_equal(freed_alone, 0);
}

/* --schema-registry-auth-file (USER:PASSWORD): the registry reads its line through stdio, whose
 * buffer (malloc'd by the FILE, freed by fclose) held the whole file. No freed block may hold
 * the password: neither that buffer nor the registry's copy of the line. */
static void test_registry_auth_file_is_wiped(void **state)
{
    (void)state;
    char path[] = "/tmp/outbox-relay-test-wipe-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char text[] = "reg:wipe-marker-Q7zX\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    assert_int_equal(close(fd), 0);
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    assert_non_null(loop);
    RegistryOptions o = {.urls = "http://127.0.0.1:1", .auth_file = path, .timeout_ms = 1000};
    char err[512] = "";
    freed_with_marker = 0;
    free_armed = true;
    Registry *r = registry_new(loop, &o, NULL, NULL, err, sizeof(err));
    registry_free(r, NULL);
    free_armed = false;
    ev_loop_destroy(loop);
    unlink(path);
    if (!r)
        fail_msg("registry_new: %s", err);
    assert_int_equal(freed_with_marker, 0);
}

int main(void)
{
    free_marker = free_alone = MARKER;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_database_url_file_refused_is_wiped),
        cmocka_unit_test(test_libpq_password_copies_are_wiped),
        cmocka_unit_test(test_config_file_secret_is_wiped),
        cmocka_unit_test(test_pg_conn_copy_is_wiped),
        cmocka_unit_test(test_env_url_replaced_by_file_is_wiped),
        cmocka_unit_test(test_registry_auth_file_is_wiped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
