/* Unit tests for tls_report.c: how the configuration's PostgreSQL and Kafka connections are
 * judged (verified, unverified, optional, plaintext; remote or not), the warnings for remote
 * unverified ones and --require-tls refusing them. Nothing connects: the judgement reads the
 * configuration only, so hosts that are not loopback can be named here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "tls_report.h"

/* A Config with the URL, brokers and --kafka properties (KEY, VALUE, ... NULL) given. */
static Config make(const char *url, const char *brokers, OptPair *props, size_t n)
{
    Config c;
    memset(&c, 0, sizeof(c));
    c.database_url = (char *)url;
    c.brokers = (char *)brokers;
    c.kafka.items = props;
    c.kafka.len = n;
    return c;
}

static void judge(const char *url, const char *brokers, OptPair *props, size_t n, TlsSide *pg,
                  TlsSide *kafka)
{
    Config c = make(url, brokers, props, n);
    tls_report_judge(&c, pg, kafka);
}

static void test_pg_modes(void **state)
{
    unsetenv("PGSSLMODE");
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    TlsSide pg, k;
    judge("postgresql://u@db.example.com/x", "127.0.0.1:9092", NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_OPTIONAL); /* libpq's default: prefer */
    assert_string_equal(pg.mode, "prefer");
    assert_true(pg.remote);
    assert_string_equal(pg.first_remote, "db.example.com");
    judge("postgresql://u@db.example.com/x?sslmode=require", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_UNVERIFIED);
    judge("host=db.example.com sslmode=verify-ca", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_UNVERIFIED); /* the chain, not the name */
    judge("host=db.example.com sslmode=verify-full", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_VERIFIED);
    judge("host=db.example.com sslmode=disable", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_PLAINTEXT);
    setenv("PGSSLMODE", "verify-full", 1);
    judge("host=db.example.com", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_VERIFIED); /* libpq's environment counts */
    unsetenv("PGSSLMODE");
}

static void test_pg_hosts(void **state)
{
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    TlsSide pg, k;
    const char *local[] = {"postgresql://u@localhost/x",
                           "postgresql://u@127.0.0.1:5433/x",
                           "postgresql://u@[::1]/x",
                           "host=/run/postgresql dbname=x",
                           "dbname=x",
                           "postgresql://u@127.0.0.2,localhost/x",
                           "host=db.example.com hostaddr=127.0.0.1"};
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++) {
        judge(local[i], NULL, NULL, 0, &pg, &k);
        if (pg.remote)
            fail_msg("%s judged remote (%s)", local[i], pg.first_remote);
    }
    judge("postgresql://u@127.0.0.1,db2.example.com:5433/x", NULL, NULL, 0, &pg, &k);
    assert_true(pg.remote);
    assert_string_equal(pg.first_remote, "db2.example.com");
    judge("postgresql://u@10.0.0.5/x", NULL, NULL, 0, &pg, &k);
    assert_true(pg.remote);
    /* A password's '@' not percent-encoded: libpq's host "s3c@db" holds the password's tail,
     * under SECRETS_MIN_LEN (the scrub misses it), named in the warning and --require-tls. */
    judge("postgresql://app:pw@s3c@db/x", NULL, NULL, 0, &pg, &k);
    assert_true(pg.remote);
    assert_string_equal(pg.first_remote, "...");
    /* ... cut at ',' too: libpq's hosts "abc" (a piece of the password as meant) and "@127..." */
    judge("postgresql://u:x@abc,@127.0.0.1/x", NULL, NULL, 0, &pg, &k);
    assert_true(pg.remote);
    assert_string_equal(pg.first_remote, "...");
    /* a real host name stays */
    judge("postgresql://u:pw@db.example.com/x", NULL, NULL, 0, &pg, &k);
    assert_string_equal(pg.first_remote, "db.example.com");
}

static void test_kafka(void **state)
{
    TlsSide pg, k;
    judge("dbname=x", "kafka.example.com:9092", NULL, 0, &pg, &k);
    assert_int_equal(k.level, TLS_PLAINTEXT);
    assert_true(k.remote);
    assert_string_equal(k.first_remote, "kafka.example.com");
    OptPair ssl[] = {{"security.protocol", "SASL_SSL"}};
    judge("dbname=x", "kafka.example.com:9093", ssl, 1, &pg, &k);
    assert_int_equal(k.level, TLS_VERIFIED);
    OptPair noverify[] = {{"security.protocol", "ssl"},
                          {"enable.ssl.certificate.verification", "false"}};
    judge("dbname=x", "kafka.example.com:9093", noverify, 2, &pg, &k);
    assert_int_equal(k.level, TLS_UNVERIFIED);
    OptPair noname[] = {{"security.protocol", "ssl"},
                        {"ssl.endpoint.identification.algorithm", "none"}};
    judge("dbname=x", "kafka.example.com:9093", noname, 2, &pg, &k);
    assert_int_equal(k.level, TLS_UNVERIFIED);
    OptPair later[] = {{"security.protocol", "ssl"}, {"security.protocol", "plaintext"}};
    judge("dbname=x", "kafka.example.com:9093", later, 2, &pg, &k);
    assert_int_equal(k.level, TLS_PLAINTEXT); /* the last setting wins, as in librdkafka */
    judge("dbname=x", "127.0.0.1:9092,localhost:9093,[::1]:9094,PLAINTEXT://127.0.0.9:1", NULL, 0,
          &pg, &k);
    assert_false(k.remote);
    OptPair servers[] = {{"bootstrap.servers", "b.example.com:9092"}};
    judge("dbname=x", "127.0.0.1:9092", servers, 1, &pg, &k);
    assert_true(k.remote); /* the property overrides --brokers */
}

/* Issue 46 item 4: configurations that librdkafka reads as unverified or remote while the
 * report said verified or local. Each is refused by --require-tls. */
static void assert_refused(const Config *c, const char *what)
{
    char err[512] = "";
    if (tls_report_require(c, true, err, sizeof(err)))
        fail_msg("--require-tls accepted %s", what);
    assert_null(strchr(err, '\n'));
}

/* Every spelling of false librdkafka accepts for a bool property (rdkafka_conf.c compares
 * case-insensitively with true/false, t/f, 1/0 ... as librdkafka 2.0.2 itself reports). */
static void test_kafka_bool_spellings(void **state)
{
    const char *falses[] = {"f", "F", "False", "FALSE", "0", "false"};
    for (size_t i = 0; i < sizeof(falses) / sizeof(falses[0]); i++) {
        OptPair p[] = {{"security.protocol", "ssl"},
                       {"enable.ssl.certificate.verification", (char *)falses[i]}};
        TlsSide pg, k;
        judge("dbname=x", "kafka.example.com:9093", p, 2, &pg, &k);
        if (k.level != TLS_UNVERIFIED)
            fail_msg("enable.ssl.certificate.verification=%s judged %s", falses[i],
                     tls_level_name(k.level));
        Config c = make("dbname=x", "kafka.example.com:9093", p, 2);
        assert_refused(&c, falses[i]);
    }
    OptPair yes[] = {{"security.protocol", "SSL"}, {"enable.ssl.certificate.verification", "T"}};
    TlsSide pg, k;
    judge("dbname=x", "kafka.example.com:9093", yes, 2, &pg, &k);
    assert_int_equal(k.level, TLS_VERIFIED);
    OptPair none[] = {{"security.protocol", "ssl"},
                      {"ssl.endpoint.identification.algorithm", "NONE"}};
    judge("dbname=x", "kafka.example.com:9093", none, 2, &pg, &k);
    assert_int_equal(k.level, TLS_UNVERIFIED);
}

/* metadata.broker.list and bootstrap.servers are one property in librdkafka: the last one set
 * is where it connects, --brokers included (set first). */
static void test_kafka_broker_aliases(void **state)
{
    TlsSide pg, k;
    OptPair later[] = {{"bootstrap.servers", "127.0.0.1:9092"},
                       {"metadata.broker.list", "kafka.example.com:9092"}};
    judge("dbname=x", "127.0.0.1:9092", later, 2, &pg, &k);
    assert_true(k.remote);
    assert_string_equal(k.first_remote, "kafka.example.com");
    Config c = make("dbname=x", "127.0.0.1:9092", later, 2);
    assert_refused(&c, "metadata.broker.list after bootstrap.servers");

    OptPair mbl[] = {{"metadata.broker.list", "kafka.example.com:9092"}};
    judge("dbname=x", "127.0.0.1:9092", mbl, 1, &pg, &k);
    assert_true(k.remote); /* the property overrides --brokers */

    OptPair back[] = {{"metadata.broker.list", "kafka.example.com:9092"},
                      {"bootstrap.servers", "localhost:9092"}};
    judge("dbname=x", "kafka.example.com:9092", back, 2, &pg, &k);
    assert_false(k.remote); /* the last one wins, whichever its name */
}

/* Only real loopback addresses are local: 127.0.0.0/8 and ::1 literals, localhost. A name that
 * starts with "127." resolves wherever its owner wants. */
static void test_loopback_is_literal(void **state)
{
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    TlsSide pg, k;
    const char *remote_pg[] = {"postgresql://u@127.attacker.example/x",
                               "host=127.0.0.1.nip.io dbname=x", "host=127.0.0.1x dbname=x",
                               "host=localhost.attacker.example dbname=x",
                               "host=::1.example dbname=x"};
    for (size_t i = 0; i < sizeof(remote_pg) / sizeof(remote_pg[0]); i++) {
        judge(remote_pg[i], "127.0.0.1:9092", NULL, 0, &pg, &k);
        if (!pg.remote)
            fail_msg("%s judged loopback", remote_pg[i]);
        Config c = make(remote_pg[i], "127.0.0.1:9092", NULL, 0);
        assert_refused(&c, remote_pg[i]);
    }
    judge("dbname=x", "127.attacker.example:9092", NULL, 0, &pg, &k);
    assert_true(k.remote);
    Config c = make("dbname=x", "127.attacker.example:9092", NULL, 0);
    assert_refused(&c, "broker 127.attacker.example");
    /* still loopback */
    judge("host=127.255.0.1 dbname=x", "127.0.0.2:9092,[::1]:9093,localhost:1", NULL, 0, &pg, &k);
    assert_false(pg.remote);
    assert_false(k.remote);
}

/* libpq pairs host and hostaddr entry by entry; an empty hostaddr entry means "resolve the
 * host of the same position". */
static void test_pg_host_and_hostaddr_lists(void **state)
{
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    TlsSide pg, k;
    judge("host=a.example.com,b.example.com hostaddr=127.0.0.1, dbname=x", NULL, NULL, 0, &pg, &k);
    assert_true(pg.remote);
    assert_string_equal(pg.first_remote, "b.example.com");
    Config c = make("host=a.example.com,b.example.com hostaddr=127.0.0.1, dbname=x",
                    "127.0.0.1:9092", NULL, 0);
    assert_refused(&c, "an empty hostaddr entry");
    judge("host=a.example.com,b.example.com hostaddr=127.0.0.1,127.0.0.2 dbname=x", NULL, NULL, 0,
          &pg, &k);
    assert_false(pg.remote);
    setenv("PGHOST", "db.example.com", 1);
    judge("dbname=x", NULL, NULL, 0, &pg, &k);
    assert_true(pg.remote); /* libpq's environment counts */
    unsetenv("PGHOST");
}

/* A service file (service=, PGSERVICE) may give the host and the sslmode, and the judgement
 * does not read it: a host it may supply counts as remote, an sslmode it may supply as optional,
 * so --require-tls refuses; what the string itself sets is judged as always. */
static void test_pg_service(void **state)
{
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    unsetenv("PGSSLMODE");
    unsetenv("PGSERVICE");
    TlsSide pg, k;
    judge("service=orders dbname=x", NULL, NULL, 0, &pg, &k);
    assert_true(pg.remote);
    assert_string_equal(pg.first_remote, "service orders");
    assert_int_equal(pg.level, TLS_OPTIONAL);
    Config c = make("service=orders", "127.0.0.1:9092", NULL, 0);
    assert_refused(&c, "a host from a service file");
    /* PGSSLMODE is not what libpq uses when the service file sets sslmode. */
    setenv("PGSSLMODE", "verify-full", 1);
    judge("service=orders host=localhost", NULL, NULL, 0, &pg, &k);
    assert_true(pg.remote);
    assert_int_equal(pg.level, TLS_OPTIONAL);
    unsetenv("PGSSLMODE");
    /* The string's own sslmode wins over the file's. */
    judge("service=orders sslmode=verify-full", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_VERIFIED);
    assert_string_equal(pg.mode, "verify-full");
    /* Every host given its address: the file cannot move it. */
    judge("service=orders hostaddr=127.0.0.1 sslmode=disable", NULL, NULL, 0, &pg, &k);
    assert_false(pg.remote);
    assert_int_equal(pg.level, TLS_PLAINTEXT);
    setenv("PGSERVICE", "orders", 1);
    judge("dbname=x", NULL, NULL, 0, &pg, &k);
    assert_true(pg.remote);
    assert_string_equal(pg.first_remote, "service orders");
    unsetenv("PGSERVICE");
}

/* gssencmode=require (in the string, or PGGSSENCMODE without a service) means GSSAPI encryption
 * with Kerberos mutual authentication or no connection: as good as verify-full, so --require-tls
 * takes it. prefer proves nothing before connecting; a service file may set its own. */
static void test_pg_gssenc(void **state)
{
    unsetenv("PGSSLMODE");
    unsetenv("PGGSSENCMODE");
    unsetenv("PGSERVICE");
    unsetenv("PGHOST");
    TlsSide pg, k;
    judge("host=db.example.com gssencmode=require", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_VERIFIED);
    assert_string_equal(pg.mode, "gssencmode=require");
    assert_true(pg.remote);
    bool ok;
    char err[512];
    Config c = make("postgresql://u@db.example.com/x?gssencmode=require&sslmode=disable",
                    "127.0.0.1:9092", NULL, 0);
    ok = tls_report_require(&c, true, err, sizeof(err));
    if (!ok)
        fail_msg("gssencmode=require refused: %s", err);
    judge("host=db.example.com gssencmode=prefer", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_OPTIONAL);
    c = make("host=db.example.com gssencmode=prefer", "127.0.0.1:9092", NULL, 0);
    assert_refused(&c, "gssencmode=prefer");
    setenv("PGGSSENCMODE", "require", 1);
    judge("host=db.example.com", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_VERIFIED); /* libpq's environment counts */
    judge("host=db.example.com service=orders", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_OPTIONAL); /* unless a service file may set it */
    unsetenv("PGGSSENCMODE");
    judge("host=db.example.com service=orders gssencmode=require", NULL, NULL, 0, &pg, &k);
    assert_int_equal(pg.level, TLS_VERIFIED); /* the string's own beats the file's */
}

/* Runs tls_report_require and, when it passes, tls_report_log, with stderr captured; returns
 * what they logged (static buffer). */
static const char *check_logged(const Config *c, bool require, bool *ok, char *err, size_t errlen)
{
    static char out[8192];
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    dup2(fileno(tmp), 2);
    *ok = tls_report_require(c, require, err, errlen);
    if (*ok)
        tls_report_log(c);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(out, 1, sizeof(out) - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
    return out;
}

static void test_check(void **state)
{
    unsetenv("PGSSLMODE");
    char err[512] = "";
    bool ok;
    Config local = make("postgresql://u@127.0.0.1/x", "127.0.0.1:9092", NULL, 0);
    const char *log = check_logged(&local, true, &ok, err, sizeof(err));
    assert_true(ok);
    assert_non_null(strstr(log, "msg=\"connection security\" postgres=optional"));
    assert_null(strstr(log, "not verified"));

    Config remote =
        make("postgresql://u@db.example.com/x?sslmode=require", "kafka.example.com:9092", NULL, 0);
    log = check_logged(&remote, false, &ok, err, sizeof(err));
    assert_true(ok);
    assert_non_null(strstr(log, "level=warn msg=\"postgres connection not verified\" "
                                "host=\"db.example.com\" sslmode=\"require\""));
    assert_non_null(strstr(log, "level=warn msg=\"kafka connection not verified\" "
                                "broker=\"kafka.example.com\""));

    log = check_logged(&remote, true, &ok, err, sizeof(err));
    assert_false(ok);
    assert_string_equal(log, ""); /* refused before anything is said: the error is the line */
    assert_non_null(strstr(err, "--require-tls: PostgreSQL host db.example.com"));
    assert_null(strchr(err, '\n'));

    OptPair ssl[] = {{"security.protocol", "ssl"}};
    Config good = make("postgresql://u@db.example.com/x?sslmode=verify-full",
                       "kafka.example.com:9093", ssl, 1);
    log = check_logged(&good, true, &ok, err, sizeof(err));
    assert_true(ok);
    assert_non_null(strstr(log, "postgres=verified"));
    assert_non_null(strstr(log, "kafka=verified"));
    assert_null(strstr(log, "not verified"));
}

/* The Schema Registry, when payloads go through it: a remote plain http URL (curl's default
 * scheme too) is warned about and refused by --require-tls, naming the host without the URL's
 * password; https, loopback http, or a relay sending JSON (no registry used) pass. */
static void test_registry(void **state)
{
    unsetenv("PGSSLMODE");
    char err[512] = "";
    bool ok;
    OptPair ssl[] = {{"security.protocol", "ssl"}};
    Config c = make("postgresql://u@db.example.com/x?sslmode=verify-full", "kafka.example.com:9093",
                    ssl, 1);
    c.value_format = VALUE_AVRO;
    const char *plain[] = {"http://u:pw@sr.example.com:8081/base",
                           "https://sr1.example.com,sr2.example.com:8081",
                           "http://[2001:db8::1]:8081"};
    const char *host[] = {"sr.example.com", "sr2.example.com", "[2001:db8::1]"};
    for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
        c.schema_registry_url = (char *)plain[i];
        const char *log = check_logged(&c, true, &ok, err, sizeof(err));
        assert_false(ok);
        assert_string_equal(log, "");
        char want[200];
        snprintf(want, sizeof(want), "--require-tls: Schema Registry host %s over plain http",
                 host[i]);
        assert_non_null(strstr(err, want));
        assert_null(strstr(err, "pw"));
        log = check_logged(&c, false, &ok, err, sizeof(err));
        assert_true(ok);
        snprintf(want, sizeof(want),
                 "level=warn msg=\"schema registry connection not encrypted\" host=\"%s\"",
                 host[i]);
        assert_non_null(strstr(log, want));
    }
    const char *fine[] = {"https://sr.example.com:8081", "http://127.0.0.1:8081,http://localhost",
                          "HTTPS://sr.example.com"};
    for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++) {
        c.schema_registry_url = (char *)fine[i];
        const char *log = check_logged(&c, true, &ok, err, sizeof(err));
        assert_true(ok);
        assert_null(strstr(log, "schema registry"));
    }
    c.schema_registry_url = (char *)"http://sr.example.com:8081";
    c.value_format = VALUE_JSON; /* not used: nothing connects to it */
    check_logged(&c, true, &ok, err, sizeof(err));
    assert_true(ok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pg_modes),
        cmocka_unit_test(test_pg_hosts),
        cmocka_unit_test(test_kafka),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_kafka_bool_spellings),
        cmocka_unit_test(test_kafka_broker_aliases),
        cmocka_unit_test(test_loopback_is_literal),
        cmocka_unit_test(test_pg_host_and_hostaddr_lists),
        cmocka_unit_test(test_pg_service),
        cmocka_unit_test(test_pg_gssenc),
        cmocka_unit_test(test_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
