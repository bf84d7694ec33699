/* Unit tests for db_hosts_split: pairing a connection string's host, hostaddr and port lists into
 * the hosts the relay tries one at a time (each with its own connect timeout); and for the
 * fallback_application_name, options and connect timeout pg_plan_make passes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "db.h"
#include "pg_plan.h"

static void assert_host(const DbHost *h, const char *host, const char *hostaddr, const char *port)
{
    if (host)
        assert_string_equal(h->host, host);
    else
        assert_null(h->host);
    if (hostaddr)
        assert_string_equal(h->hostaddr, hostaddr);
    else
        assert_null(h->hostaddr);
    if (port)
        assert_string_equal(h->port, port);
    else
        assert_null(h->port);
}

/* Element i of each list goes with host i. */
static void test_pairs_hosts_and_ports(void **state)
{
    DbHost *h = NULL;
    int n = db_hosts_split("db1,db2,db3", NULL, "5432,5433,5434", &h);
    assert_int_equal(n, 3);
    assert_host(&h[0], "db1", NULL, "5432");
    assert_host(&h[1], "db2", NULL, "5433");
    assert_host(&h[2], "db3", NULL, "5434");
    db_hosts_free(h, n);
}

/* One port applies to every host; no port leaves libpq's default. */
static void test_single_or_no_port(void **state)
{
    DbHost *h = NULL;
    int n = db_hosts_split("db1,db2", NULL, "6432", &h);
    assert_int_equal(n, 2);
    assert_host(&h[0], "db1", NULL, "6432");
    assert_host(&h[1], "db2", NULL, "6432");
    db_hosts_free(h, n);
    n = db_hosts_split("db1,db2", NULL, NULL, &h);
    assert_int_equal(n, 2);
    assert_host(&h[1], "db2", NULL, NULL);
    db_hosts_free(h, n);
}

/* hostaddr lists pair with host lists, or stand alone; an empty element stays empty (libpq's
 * default for that host). */
static void test_hostaddr_and_empty_elements(void **state)
{
    DbHost *h = NULL;
    int n = db_hosts_split("a.example,b.example", "10.0.0.1,10.0.0.2", "1,2", &h);
    assert_int_equal(n, 2);
    assert_host(&h[0], "a.example", "10.0.0.1", "1");
    assert_host(&h[1], "b.example", "10.0.0.2", "2");
    db_hosts_free(h, n);
    n = db_hosts_split(NULL, "10.0.0.1,10.0.0.2", "5432", &h);
    assert_int_equal(n, 2);
    assert_host(&h[1], NULL, "10.0.0.2", "5432");
    db_hosts_free(h, n);
    n = db_hosts_split("db1,,db3", NULL, "1,,3", &h);
    assert_int_equal(n, 3);
    assert_host(&h[1], "", NULL, "");
    db_hosts_free(h, n);
}

/* One host, no host at all (the default socket, or the environment's), and lists libpq would
 * reject: one entry holding the lists whole, so libpq reports the mismatch itself. */
static void test_one_entry_otherwise(void **state)
{
    DbHost *h = NULL;
    int n = db_hosts_split("db1", NULL, "5432", &h);
    assert_int_equal(n, 1);
    assert_host(&h[0], "db1", NULL, "5432");
    db_hosts_free(h, n);
    n = db_hosts_split(NULL, NULL, NULL, &h);
    assert_int_equal(n, 1);
    assert_host(&h[0], NULL, NULL, NULL);
    db_hosts_free(h, n);
    n = db_hosts_split("db1,db2", NULL, "1,2,3", &h);
    assert_int_equal(n, 1);
    assert_host(&h[0], "db1,db2", NULL, "1,2,3");
    db_hosts_free(h, n);
    n = db_hosts_split("db1", "10.0.0.1,10.0.0.2", NULL, &h);
    assert_int_equal(n, 1);
    assert_host(&h[0], "db1", "10.0.0.1,10.0.0.2", NULL);
    db_hosts_free(h, n);
}

/* The value of keyword among a plan's parameters, NULL when absent; fails if it is there twice. */
static const char *plan_value(const PgPlan *plan, const char *keyword)
{
    const char *found = NULL;
    for (int i = 0; i < plan->nparams; i++) {
        if (strcmp(plan->keys[i], keyword) == 0) {
            assert_null(found);
            found = plan->values[i];
        }
    }
    return found;
}

/* The relay names its connections for pg_stat_activity, but a name in the string wins: a
 * fallback_application_name given there is passed alone, and application_name outranks any
 * fallback in libpq itself. */
static void test_fallback_application_name(void **state)
{
    (void)state;
    PgPlan plan = {0};
    assert_true(pg_plan_make(&plan, "dbname=x", 30000, "outbox-relay session-0"));
    assert_string_equal(plan_value(&plan, "fallback_application_name"), "outbox-relay session-0");
    pg_plan_free(&plan);
    assert_true(pg_plan_make(&plan, "dbname=x fallback_application_name=mine", 30000, "relay"));
    assert_string_equal(plan_value(&plan, "fallback_application_name"), "mine");
    pg_plan_free(&plan);
    assert_true(pg_plan_make(&plan, "postgresql:///x?application_name=a", 30000, "relay"));
    assert_string_equal(plan_value(&plan, "application_name"), "a");
    pg_plan_free(&plan);
    assert_true(pg_plan_make(&plan, "dbname=x", 30000, NULL));
    assert_null(plan_value(&plan, "fallback_application_name"));
    pg_plan_free(&plan);
}

/* Given addresses as hostaddr, libpq names only the address: the name is put back, in libpq's
 * own form, on every line that names a server; other text is left alone. */
static void test_error_names_the_host(void **state)
{
    char out[512];
    pg_error_name_host("connection to server at \"10.0.0.3\", port 5432 failed: Connection "
                       "refused\n\tIs the server running on that host and accepting TCP/IP "
                       "connections?\nconnection to server at \"::1\", port 5432 failed: timeout\n",
                       "db.example", out, sizeof(out));
    assert_string_equal(out, "connection to server at \"db.example\" (10.0.0.3), port 5432 failed: "
                             "Connection refused\n\tIs the server running on that host and "
                             "accepting TCP/IP connections?\nconnection to server at "
                             "\"db.example\" (::1), port 5432 failed: timeout\n");
    pg_error_name_host("FATAL:  password authentication failed for user \"relay\"", "db", out,
                       sizeof(out));
    assert_string_equal(out, "FATAL:  password authentication failed for user \"relay\"");
    pg_error_name_host("connection to server at \"db\" (10.0.0.3), port 5432 failed: x", "db", out,
                       sizeof(out));
    assert_string_equal(out, "connection to server at \"db\" (10.0.0.3), port 5432 failed: x");
    pg_error_name_host("connection to server at \"10.0.0.3\", port 1 failed", "db", out, 20);
    assert_int_equal(strlen(out), 19); /* cut, terminated */
}

/* A password holding an unescaped '@' whose tail is too short for the scrub of registered
 * secrets (3 characters): the host that libpq makes of it is logged as "...". */
static void test_password_tail_not_shown(void **state)
{
    PgPlan plan = {0};
    assert_true(pg_plan_make(&plan, "postgresql://app:pw@s3c@h1:1,h2:2/app", 30000, NULL));
    assert_int_equal(plan.ntargets, 2);
    assert_string_equal(plan.targets[0].shown, "...:1");
    assert_string_equal(plan.targets[1].shown, "h2:2");
    assert_string_equal(plan.targets[0].addr.host, "s3c@h1"); /* libpq is given it as it is */
    pg_plan_free(&plan);
    assert_string_equal(db_host_shown("db.example"), "db.example");
    assert_null(db_host_shown(NULL));
}

/* A service file (pg_service.conf) as the only source of options and connect_timeout: with a
 * pinned schema the plan sends an explicit options entry, which hides the service's from libpq,
 * so they must be in it, before the pin; and the relay's own per-host timer takes the service's
 * connect_timeout (libpq enforces none in non-blocking mode), 0 or less being 10 s. */
static void test_service_options_and_timeout(void **state)
{
    (void)state;
    char path[] = "/tmp/test_pg_serviceXXXXXX", err[256];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char text[] = "[opts]\noptions=-c statement_timeout=12345\nconnect_timeout=4\n"
                        "[zero]\nconnect_timeout=0\n";
    assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)(sizeof(text) - 1));
    close(fd);
    unsetenv("PGOPTIONS");
    unsetenv("PGSERVICE");
    unsetenv("PGCONNECT_TIMEOUT");
    setenv("PGSERVICEFILE", path, 1);
    assert_true(db_pin_search_path("relayschema", false, err, sizeof(err)));
    PgPlan plan = {0};
    assert_true(pg_plan_make(&plan, "service=opts dbname=x", 30000, NULL));
    const char *options = plan_value(&plan, "options");
    assert_non_null(options);
    if (!strstr(options, "-c statement_timeout=12345 -c search_path=pg_catalog,relayschema"))
        fail_msg("the service file's options were dropped: %s", options);
    if (plan.connect_timeout_s != 4.0)
        fail_msg("the service file's connect_timeout=4 not taken: %g s", plan.connect_timeout_s);
    pg_plan_free(&plan);
    /* The string's own still wins over the service's. */
    assert_true(
        pg_plan_make(&plan, "service=opts dbname=x connect_timeout=7 options=-cx=1", 30000, NULL));
    assert_string_equal(plan_value(&plan, "options"),
                        "-cx=1 -c search_path=pg_catalog,relayschema,pg_temp");
    assert_true(plan.connect_timeout_s == 7.0);
    pg_plan_free(&plan);
    /* 0 in the service file: libpq's "no limit" is the relay's 10 s. */
    assert_true(pg_plan_make(&plan, "service=zero dbname=x", 30000, NULL));
    assert_true(plan.connect_timeout_s == PG_PLAN_CONNECT_TIMEOUT_S);
    pg_plan_free(&plan);
    assert_true(db_pin_search_path(NULL, false, err, sizeof(err)));
    unsetenv("PGSERVICEFILE");
    unlink(path);
}

/* A host that only the service file names is the plan's to look up (off the loop, resolve.h), as
 * a URL's is: left unset, libpq filled it in from the file and looked it up inside PQconnectPoll,
 * on the loop. libpq's order: the string's, else the service's, else PGHOST/PGPORT; each keyword
 * on its own. */
static void test_service_host_is_planned(void **state)
{
    (void)state;
    char path[] = "/tmp/test_pg_serviceXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char text[] = "[svc]\nhost=db1.example,db2.example\nport=6543\n"
                        "[addr]\nhostaddr=10.0.0.9\n";
    assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)(sizeof(text) - 1));
    close(fd);
    unsetenv("PGSERVICE");
    unsetenv("PGHOSTADDR");
    setenv("PGSERVICEFILE", path, 1);
    setenv("PGHOST", "env.example", 1);
    setenv("PGPORT", "7000", 1);
    PgPlan plan = {0};
    assert_true(pg_plan_make(&plan, "service=svc dbname=x", 30000, NULL));
    assert_int_equal(plan.ntargets, 2);
    assert_host(&plan.targets[0].addr, "db1.example", NULL, "6543");
    assert_host(&plan.targets[1].addr, "db2.example", NULL, "6543");
    pg_plan_free(&plan);
    /* The string's host wins over the service's; the service's port over PGPORT. */
    assert_true(pg_plan_make(&plan, "service=svc host=url.example dbname=x", 30000, NULL));
    assert_int_equal(plan.ntargets, 1);
    assert_host(&plan.targets[0].addr, "url.example", NULL, "6543");
    pg_plan_free(&plan);
    /* PGSERVICE names the service when the string does not; what the file leaves unset comes
     * from the environment. */
    setenv("PGSERVICE", "addr", 1);
    assert_true(pg_plan_make(&plan, "dbname=x", 30000, NULL));
    assert_int_equal(plan.ntargets, 1);
    assert_host(&plan.targets[0].addr, "env.example", "10.0.0.9", "7000");
    pg_plan_free(&plan);
    unsetenv("PGSERVICE");
    unsetenv("PGHOST");
    unsetenv("PGPORT");
    unsetenv("PGSERVICEFILE");
    unlink(path);
}

/* The relay's keepalives and tcp_user_timeout are defaults: a service file's wins, as the
 * string's does (passed as entries, the defaults beat the file's, which libpq fills in only
 * where nothing is set). */
static void test_service_keepalives_win(void **state)
{
    (void)state;
    char path[] = "/tmp/test_pg_serviceXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char text[] = "[keep]\nkeepalives_idle=60\ntcp_user_timeout=5000\n";
    assert_int_equal(write(fd, text, sizeof(text) - 1), (ssize_t)(sizeof(text) - 1));
    close(fd);
    unsetenv("PGSERVICE");
    setenv("PGSERVICEFILE", path, 1);
    PgPlan plan = {0};
    assert_true(pg_plan_make(&plan, "service=keep dbname=x", 30000, NULL));
    if (plan_value(&plan, "keepalives_idle") || plan_value(&plan, "tcp_user_timeout"))
        fail_msg("the service file's keepalives_idle/tcp_user_timeout overridden: %s, %s",
                 plan_value(&plan, "keepalives_idle"), plan_value(&plan, "tcp_user_timeout"));
    assert_string_equal(plan_value(&plan, "keepalives"), "1");
    assert_string_equal(plan_value(&plan, "keepalives_interval"), "3");
    pg_plan_free(&plan);
    unsetenv("PGSERVICEFILE");
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_names_the_host),
        cmocka_unit_test(test_password_tail_not_shown),
        cmocka_unit_test(test_service_options_and_timeout),
        cmocka_unit_test(test_service_host_is_planned),
        cmocka_unit_test(test_service_keepalives_win),
        cmocka_unit_test(test_pairs_hosts_and_ports),
        cmocka_unit_test(test_single_or_no_port),
        cmocka_unit_test(test_hostaddr_and_empty_elements),
        cmocka_unit_test(test_one_entry_otherwise),
        cmocka_unit_test(test_fallback_application_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
