/* Unit tests for db.c's start-up check of a connection string: a string that does not parse is
 * refused with libpq's reason, but never with the text it quotes from the string (issue 46: a
 * --database-url-file pointed at a token file printed the token). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "db.h"
#include "strbuf.h"

static void test_check_conninfo_hides_input(void **state)
{
    char err[512];
    assert_false(db_check_conninfo("ghp_16C7e42F292c6912E7710c838347Ae178B4a", err, sizeof(err)));
    assert_non_null(strstr(err, "database URL: invalid connection string: "));
    assert_non_null(strstr(err, "missing \"=\"")); /* what was expected stays */
    assert_null(strstr(err, "16C7e42F"));
    assert_false(db_check_conninfo("host=h s3cr3tkey=v", err, sizeof(err)));
    assert_null(strstr(err, "s3cr3tkey"));
    assert_false(db_check_conninfo("host=h ab", err, sizeof(err)));
    assert_null(strstr(err, "\"ab\""));
    assert_true(db_check_conninfo("postgresql://u@localhost/x", err, sizeof(err)));
    /* A token longer than the line kept of libpq's message: the line ends inside the quote, and
     * before, the text after the opening quote was shown as it was. */
    char token[401];
    for (size_t i = 0; i < sizeof(token) - 1; i++)
        token[i] = "k9Xq"[i % 4];
    token[sizeof(token) - 1] = '\0';
    assert_false(db_check_conninfo(token, err, sizeof(err)));
    assert_non_null(strstr(err, "missing \"=\""));
    assert_null(strstr(err, "k9Xq"));
}

/* A token holding a '"': the quotes in libpq's echo were paired in order, so the part after the
 * token's own quote was shown (missing "=" after "..."en-s3cret"). Every such part is hidden now,
 * the token's quote the first, the last or anywhere, and in a token longer than the line kept. */
static void test_check_conninfo_hides_quoted_input(void **state)
{
    const char *tokens[] = {"tok\"en-s3cret", "\"en-s3cret", "tok\"\"en-s3cret\"",
                            "t\"o\"k\"en-s3cret", "a\"en-s3cret", "tok\"en-s3cret\"x",
                            /* libpq quotes a URI's parts percent-decoded */
                            "postgresql://h/db?tok%65n-s3cret=1",
                            "postgresql://h/db?tok%22en-s%33cret=1"};
    char err[512];
    for (size_t i = 0; i < sizeof(tokens) / sizeof(tokens[0]); i++) {
        memset(err, 0, sizeof(err));
        assert_false(db_check_conninfo(tokens[i], err, sizeof(err)));
        if (!strstr(err, "database URL: invalid connection string: ") || strstr(err, "en-s3cret") ||
            strstr(err, "s3cr"))
            fail_msg("token %s: %s", tokens[i], err);
    }
    char token[401];
    for (size_t i = 0; i < sizeof(token) - 1; i++)
        token[i] = i % 50 == 7 ? '"' : "k9Xq"[i % 4];
    token[sizeof(token) - 1] = '\0';
    assert_false(db_check_conninfo(token, err, sizeof(err)));
    if (strstr(err, "k9X") || strstr(err, "9Xq") || strstr(err, "Xqk") || strstr(err, "qk9"))
        fail_msg("long token: %s", err);
    assert_non_null(strstr(err, "missing \"=\""));
}

/* libpq rebuilds a URI's host list before it decodes it (each host without its port, joined by
 * ','), and "invalid percent-encoded token" / "forbidden value %00" quote that list: a text that
 * occurs nowhere in the string as written, which the masking looked for, so the token was shown
 * ("%2tok-s3cret,h2"). Found by feeding db_check_conninfo random strings around a secret. */
static void test_check_conninfo_hides_rebuilt_host_list(void **state)
{
    const char *urls[] = {
        "postgresql://%2tok-s3cret:5432,h2/db",   "postgresql://h1:5432,%2tok-s3cret:5433/db",
        "postgresql://,h2:5432],tok-s3cret%00==", "postgresql://%41tok-s3cretport:,%&",
        "postgresql://\\ %00]tok-s3cret:5432,db", "postgresql://, tok-s3cret[::1]%tok-s3cret",
        "postgresql://%2tok-s3cret:5432,port\"\\"};
    char err[512];
    for (size_t i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
        memset(err, 0, sizeof(err));
        assert_false(db_check_conninfo(urls[i], err, sizeof(err)));
        if (!strstr(err, "database URL: invalid connection string: ") || strstr(err, "s3cr") ||
            !strstr(err, "percent-encoded"))
            fail_msg("%s: %s", urls[i], err);
    }
}

/* A password holding an unescaped '@' ends at the first '@' for libpq, and its tail became the
 * host name, which db_connect's error quoted as it was: could not translate host name
 * "t-pw-s3cret@127.0.0.1". Hidden now, while a real host name in an error stays (glibc refuses
 * a name with an '@' without asking DNS: no network here). */
static void test_connect_error_hides_password_tail(void **state)
{
    char err[512] = "";
    assert_null(db_connect("postgresql://app:p@t-pw-s3cret@127.0.0.1:1/app?sslmode=disable",
                           "test_db", err, sizeof(err)));
    if (strstr(err, "s3cret") || !strstr(err, "could not translate host name"))
        fail_msg("%s", err);
    assert_null(db_connect("postgresql://app:pw@localhost:1/app?sslmode=disable", "test_db", err,
                           sizeof(err)));
    if (!strstr(err, "\"localhost\""))
        fail_msg("the host name must stay: %s", err);
}

/* libpq cuts the rest of a password after its first '@' into hosts at ',': such a host holds no
 * '@', but lies in the password as meant (to the last '@'), as written or percent-decoded. Found
 * by feeding random strings around a secret through the relay's connect errors unscrubbed (267
 * leaks in 1M before, 0 after). */
static void test_hide_password_tail_host_list(void **state)
{
    const char *url = "postgresql://app:x@pw-s3cret,@127.0.0.1:1/app";
    char line[200] = "could not translate host name \"pw-s3cret\" to address: x";
    db_hide_password_tail(line, url);
    assert_string_equal(line, "could not translate host name \"...\" to address: x");
    snprintf(line, sizeof(line), "connection to server at \"127.0.0.1\", port 1 failed");
    db_hide_password_tail(line, url);
    assert_string_equal(line, "connection to server at \"127.0.0.1\", port 1 failed");
    snprintf(line, sizeof(line), "could not translate host name \"pw-s3cret\" to address: x");
    db_hide_password_tail(line, "postgresql://app:x@pw%2Ds3cret,@127.0.0.1:1/app");
    assert_string_equal(line, "could not translate host name \"...\" to address: x");
    /* One '@': the password is libpq's, and a host that happens to be in it stays. */
    snprintf(line, sizeof(line), "could not translate host name \"db\" to address: x");
    db_hide_password_tail(line, "postgresql://app:db@db/app");
    assert_string_equal(line, "could not translate host name \"db\" to address: x");
}

/* Values libpq only checks when it connects are bad input too (a port that is not a number made
 * run retry forever; sslmode=bogus passed check's "config" line): refused naming the setting,
 * never echoing the string (a password may be anywhere in it). Every value libpq takes passes. */
static void test_check_conninfo_values(void **state)
{
    const char *bad[][2] = {
        {"postgresql://u:pw-s3cret@127.0.0.1:notaport/db", "port"},
        {"postgresql://u:pw-s3cret@127.0.0.1:0/db", "port"},
        {"postgresql://u:pw-s3cret@127.0.0.1:65536/db", "port"},
        {"postgresql://u:pw-s3cret@127.0.0.1:-5/db", "port"},
        {"host=h port=5432x", "port"},
        {"host=a,b port=1,2,3", "3 ports for 2 hosts"},
        {"host=a port=1,2", "2 ports for 1 hosts"},
        {"postgresql://u:pw-s3cret@h/db?sslmode=bogus", "sslmode"},
        {"postgresql://u:pw-s3cret@h/db?sslmode=pw-s3cret", "sslmode"},
        {"host=h sslmode=Require", "sslmode"},
        {"host=h gssencmode=always", "gssencmode"},
        {"host=h target_session_attrs=master", "target_session_attrs"},
        {"host=h connect_timeout=10s", "connect_timeout"},
        {"host=h connect_timeout=", "connect_timeout"},
        {"host=h connect_timeout=2147483648", "connect_timeout"},
        {"host=h keepalives=on", "keepalives"},
        {"host=h keepalives_idle=abc", "keepalives_idle"},
        {"host=h keepalives_interval=5s", "keepalives_interval"},
        {"host=h keepalives_count=", "keepalives_count"},
        {"postgresql://u:pw-s3cret@h/db?tcp_user_timeout=30s", "tcp_user_timeout"},
        {"host=h channel_binding=required", "channel_binding"},
    };
    char err[512];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(err, 0, sizeof(err));
        if (db_check_conninfo(bad[i][0], err, sizeof(err)))
            fail_msg("\"%s\" accepted", bad[i][0]);
        if (!strstr(err, bad[i][1]) || strncmp(err, "database URL: ", 14) != 0)
            fail_msg("\"%s\": error \"%s\" does not name %s", bad[i][0], err, bad[i][1]);
        assert_null(strstr(err, "s3cret"));
        assert_null(strchr(err, '\n'));
    }
    const char *good[] = {
        "postgresql://u:pw@127.0.0.1:5432/db?sslmode=verify-full&connect_timeout=5",
        "postgresql://h1,h2:5433/db?target_session_attrs=read-write",
        "postgresql://h1:5432,h2:5433/db?target_session_attrs=prefer-standby",
        "host=a,b,c port=5432",
        "host=a,b port=5432,",
        "hostaddr=10.0.0.1,10.0.0.2 host=a,b port=1,65535",
        "host=/var/run/postgresql port=5432 gssencmode=disable sslmode=disable",
        "host=h sslmode=allow connect_timeout=-1",
        "host=h sslmode=prefer",
        "host=h sslmode=require target_session_attrs=any",
        "host=h sslmode=verify-ca target_session_attrs=standby gssencmode=prefer",
        "dbname=x",
        /* as libpq's parse_int_param reads numbers: blanks around, a sign, any int */
        "host=h port=' 5432 '",
        "host=h connect_timeout=+3",
        "host=h connect_timeout=2147483647",
        "host=h keepalives=0 keepalives_idle=10 keepalives_interval=-1 keepalives_count=3",
        "host=h tcp_user_timeout=30000 channel_binding=require",
        "host=h channel_binding=disable",
        "host=h channel_binding=prefer",
        "host=h port=00000000000000000000000000000000000000005432",
        "postgresql:///db",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (!db_check_conninfo(good[i], err, sizeof(err)))
            fail_msg("\"%s\" refused: %s", good[i], err);
}

/* A command that writes refuses a target_session_attrs that picks a read-only server, in the
 * string or in the environment (every claim would fail "read-only transaction" and run retry for
 * ever); the string's own setting wins over the environment, as in libpq. */
static void test_writer_conninfo(void **state)
{
    char err[512];
    unsetenv("PGTARGETSESSIONATTRS");
    const char *refused[] = {"host=h target_session_attrs=standby",
                             "postgresql://h/db?target_session_attrs=read-only",
                             "host=a,b target_session_attrs=prefer-standby"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        if (db_check_writer_conninfo(refused[i], err, sizeof(err)))
            fail_msg("\"%s\" taken by a writer", refused[i]);
        assert_non_null(strstr(err, "cannot be written to"));
        assert_true(db_check_conninfo(refused[i], err, sizeof(err))); /* a reader takes it */
    }
    const char *taken[] = {"host=h", "host=h target_session_attrs=read-write",
                           "host=a,b target_session_attrs=primary",
                           "host=h target_session_attrs=any"};
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++)
        if (!db_check_writer_conninfo(taken[i], err, sizeof(err)))
            fail_msg("\"%s\" refused: %s", taken[i], err);
    assert_false(db_check_writer_conninfo("host=h port=x", err, sizeof(err))); /* and the rest */
    setenv("PGTARGETSESSIONATTRS", "standby", 1);
    assert_false(db_check_writer_conninfo("host=h", err, sizeof(err)));
    assert_true(
        db_check_writer_conninfo("host=h target_session_attrs=read-write", err, sizeof(err)));
    unsetenv("PGTARGETSESSIONATTRS");
}

/* Writes text to a fresh file under /tmp; its path into path. */
static void write_file(char *path, size_t len, const char *name, const char *text)
{
    snprintf(path, len, "/tmp/test_db_%ld_%s", (long)getpid(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A target_session_attrs that a service file sets (service= in the string, or PGSERVICE) picks
 * the server as surely as one in the string: a writer refuses a read-only one, naming the
 * service. The string's own setting wins over the file's, and the file's over the environment's;
 * the system file is read only when the user's file lacks the group, as libpq does. */
static void test_writer_service(void **state)
{
    char err[512], user[128], sys[192], sysdir[128];
    unsetenv("PGTARGETSESSIONATTRS");
    unsetenv("PGSERVICE");
    write_file(user, sizeof(user), "user.conf",
               "# services\n"
               "[ro]\n"
               "host=replica.example\n"
               "  target_session_attrs=standby  \n"
               "[rw]\n"
               "host=primary.example\n"
               "[rwish]\n"
               "target_session_attrs=read-write\n"
               "[prefer]\n"
               "target_session_attrs=prefer-standby\n");
    snprintf(sysdir, sizeof(sysdir), "/tmp/test_db_%ld_sysdir", (long)getpid());
    mkdir(sysdir, 0700);
    snprintf(sys, sizeof(sys), "%s/pg_service.conf", sysdir);
    FILE *f = fopen(sys, "w");
    assert_non_null(f);
    fputs("[sysonly]\ntarget_session_attrs=read-only\n[rw]\ntarget_session_attrs=standby\n", f);
    fclose(f);
    setenv("PGSERVICEFILE", user, 1);
    setenv("PGSYSCONFDIR", sysdir, 1);

    const char *refused[] = {"service=ro", "postgresql:///db?service=prefer", "service=sysonly"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        memset(err, 0, sizeof(err));
        if (db_check_writer_conninfo(refused[i], err, sizeof(err)))
            fail_msg("\"%s\" taken by a writer", refused[i]);
        assert_non_null(strstr(err, "cannot be written to"));
        assert_non_null(strstr(err, "(from service "));
    }
    const char *taken[] = {"service=rw", "service=rwish", "service=ro target_session_attrs=any",
                           "service=missing"};
    for (size_t i = 0; i < sizeof(taken) / sizeof(taken[0]); i++)
        if (!db_check_writer_conninfo(taken[i], err, sizeof(err)))
            fail_msg("\"%s\" refused: %s", taken[i], err);
    setenv("PGSERVICE", "ro", 1);
    assert_false(db_check_writer_conninfo("host=h", err, sizeof(err)));
    assert_true(db_check_writer_conninfo("host=h service=rw", err, sizeof(err)));
    setenv("PGTARGETSESSIONATTRS", "read-write", 1); /* the file's beats the environment's */
    assert_false(db_check_writer_conninfo("host=h", err, sizeof(err)));
    unsetenv("PGTARGETSESSIONATTRS");
    unsetenv("PGSERVICE");

    char value[64];
    assert_true(db_service_value("ro", "host", value, sizeof(value)));
    assert_string_equal(value, "replica.example");
    assert_false(db_service_value("r", "host", value, sizeof(value))); /* "[ro]" is not "[r]" */
    unsetenv("PGSERVICEFILE");
    unsetenv("PGSYSCONFDIR");
    unlink(user);
    unlink(sys);
    rmdir(sysdir);
}

/* What a service file's group sets is checked as the string is (libpq fills it in where the
 * string sets nothing): a bad port or sslmode there failed every attempt of run for ever after
 * a start-up check that passed. Refused naming the service and the setting, never a value;
 * what the string sets itself is not the file's to judge. */
static void test_service_values(void **state)
{
    char err[512], path[128];
    unsetenv("PGSERVICE");
    write_file(path, sizeof(path), "values.conf",
               "[badport]\nhost=db.example\nport=54x32\npassword=pw-s3cret\n"
               "[badmode]\nsslmode=Require\n"
               "[noeq]\nhost=db.example\ns3cretline\n"
               "[ports]\nhost=a\nport=5432,5433\n"
               "[good]\nhost=db.example\nport=5432\nsslmode=verify-full\n"
               "password=it's a \\ secret\n"
               /* From this review: libpq keeps a key's first value, matches keys with no blanks
                * trimmed, and refuses a nested service=; the check took the last value (refusing
                * [firstgood], passing [firstbad]) and passed the other two. */
               "[firstgood]\nport=5432\nport=54x32\n[firstbad]\nport=54x32\nport=5432\n"
               "[blankkey]\nport =5432\n[nested]\nservice=good\n"
               "[ldap]\nldap://ldap.example/dc=example,dc=com?uniqueMember?one?(cn=db)\n");
    setenv("PGSERVICEFILE", path, 1);
    const char *bad[][2] = {
        {"service=badport", "service badport: port: expected"},
        {"service=badmode dbname=x", "service badmode: sslmode: expected"},
        {"service=noeq", "service noeq: invalid service file entry"},
        {"service=firstbad", "service firstbad: port: expected"},
        {"service=blankkey", "service blankkey: invalid service file entry: line 25: expected"},
        {"service=nested", "service nested: invalid service file entry: line 27: a nested"},
        {"service=ldap", "service ldap: invalid service file entry: line 29: an LDAP lookup"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(err, 0, sizeof(err));
        if (db_check_conninfo(bad[i][0], err, sizeof(err)))
            fail_msg("\"%s\" accepted", bad[i][0]);
        if (!strstr(err, bad[i][1]))
            fail_msg("\"%s\": error \"%s\" does not say %s", bad[i][0], err, bad[i][1]);
        assert_null(strstr(err, "s3cret"));
        assert_null(strchr(err, '\n'));
    }
    const char *good[] = {
        "service=good",           "service=badport port=5432",       "service=missing",
        "host=a,b service=ports", "service=badmode sslmode=require", "service=firstgood"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (!db_check_conninfo(good[i], err, sizeof(err)))
            fail_msg("\"%s\" refused: %s", good[i], err);
    setenv("PGSERVICE", "badport", 1);
    assert_false(db_check_conninfo("dbname=x", err, sizeof(err)));
    unsetenv("PGSERVICE");
    unsetenv("PGSERVICEFILE");
    unlink(path);
}

/* A PGSERVICEFILE that cannot be opened: libpq fails every connection that names a service
 * ("service file ... not found") and reads no other file, where the check fell back to the system
 * file, passed, and took its values (run then retried for ever). Refused now, naming the file;
 * a string that names no service is not libpq's to look the file up for, and passes. */
static void test_service_file_missing(void **state)
{
    char err[512], sys[192], sysdir[128], value[64];
    unsetenv("PGSERVICE");
    snprintf(sysdir, sizeof(sysdir), "/tmp/test_db_%ld_sysdir2", (long)getpid());
    mkdir(sysdir, 0700);
    snprintf(sys, sizeof(sys), "%s/pg_service.conf", sysdir);
    FILE *f = fopen(sys, "w");
    assert_non_null(f);
    fputs("[sys]\nhost=sys.example\ntarget_session_attrs=read-write\n", f);
    fclose(f);
    setenv("PGSYSCONFDIR", sysdir, 1);
    unsetenv("PGSERVICEFILE");
    assert_true(db_check_conninfo("service=sys", err, sizeof(err))); /* the system file's */
    const char *files[] = {"/nonexistent/test_db/pg_service.conf", ""};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        setenv("PGSERVICEFILE", files[i], 1);
        memset(err, 0, sizeof(err));
        if (db_check_conninfo("service=sys", err, sizeof(err)))
            fail_msg("PGSERVICEFILE=\"%s\" taken", files[i]);
        if (!strstr(err, "service sys: service file \"") || !strstr(err, files[i]) ||
            !strstr(err, "(from PGSERVICEFILE)") || strchr(err, '\n'))
            fail_msg("PGSERVICEFILE=\"%s\": %s", files[i], err);
        setenv("PGSERVICE", "sys", 1);
        assert_false(db_check_conninfo("dbname=x", err, sizeof(err)));
        assert_false(db_check_writer_conninfo("dbname=x", err, sizeof(err)));
        unsetenv("PGSERVICE");
        assert_false(db_service_value("sys", "host", value, sizeof(value))); /* nothing taken */
        assert_true(db_check_conninfo("host=h dbname=x", err, sizeof(err)));
    }
    unsetenv("PGSERVICEFILE");
    unsetenv("PGSYSCONFDIR");
    unlink(sys);
    rmdir(sysdir);
}

/* A listening socket on 127.0.0.1 that takes connections (the kernel's backlog) and never
 * answers them: a server that hangs. Its port into port. */
static int silent_server(char *port, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 8), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    snprintf(port, len, "%u", ntohs(a.sin_port));
    return fd;
}

/* The connect_timeout libpq takes from db_connect's parameters: the connection db_connect would
 * make to the string's (first) host, from the very parameters it passes (db_connect_params and
 * db_connect_params_host, then libpq's own parsing of them: the service file, the environment, a
 * later entry beating an earlier one), started without waiting and read back with PQconninfo,
 * the setting the connection enforces. Into out ("" when libpq has none). */
static void effective_connect_timeout(const char *conninfo, char *out, size_t len)
{
    char err[300];
    DbConnectParams p;
    assert_true(db_connect_params(conninfo, "test_db", &p, err, sizeof(err)));
    db_connect_params_host(&p, 0, NULL);
    PGconn *conn = PQconnectStartParams(p.keys, p.values, p.expand_dbname);
    db_connect_params_free(&p);
    assert_non_null(conn);
    if (PQstatus(conn) == CONNECTION_BAD)
        fail_msg("%s: %s", conninfo, PQerrorMessage(conn));
    PQconninfoOption *opts = PQconninfo(conn);
    assert_non_null(opts);
    out[0] = '\0';
    for (PQconninfoOption *o = opts; o->keyword; o++)
        if (strcmp(o->keyword, "connect_timeout") == 0 && o->val)
            snprintf(out, len, "%s", o->val);
    PQconninfoFree(opts);
    PQfinish(conn);
}

/* The value of keyword libpq takes for host i of db_connect's walk through conninfo's hosts,
 * from the very parameters it passes (as effective_connect_timeout), into out ("(none)" when
 * libpq has none). The hosts are socket directories that do not exist: nothing is reached. */
static void effective_host_setting(const char *conninfo, int i, const char *keyword, char *out,
                                   size_t len)
{
    char err[300];
    DbConnectParams p;
    assert_true(db_connect_params(conninfo, "test_db", &p, err, sizeof(err)));
    assert_true(i < p.nhosts);
    db_connect_params_host(&p, i, NULL);
    PGconn *conn = PQconnectStartParams(p.keys, p.values, p.expand_dbname);
    db_connect_params_free(&p);
    assert_non_null(conn);
    PQconninfoOption *opts = PQconninfo(conn);
    assert_non_null(opts);
    snprintf(out, len, "(none)");
    for (PQconninfoOption *o = opts; o->keyword; o++)
        if (strcmp(o->keyword, keyword) == 0 && o->val)
            snprintf(out, len, "%s", o->val);
    PQconninfoFree(opts);
    PQfinish(conn);
}

/* An empty host or port, the whole setting or one entry of a list, is libpq's default (the
 * socket directory, port 5432), never PGHOST's or PGPORT's: libpq fills in from the environment
 * only what the string leaves unset. Each host's entries were passed as parameters, where libpq
 * takes an empty value for none, so "port=,5433" with PGPORT=5434 went to 5434 for its first
 * host (another server than the same string reached before), and host='' to PGHOST. */
static void test_connect_params_empty_entries(void **state)
{
    (void)state;
    char v[256];
    unsetenv("PGSERVICE");
    setenv("PGHOST", "/nonexistent-pghost", 1);
    setenv("PGPORT", "1", 1);
    effective_host_setting("host='' port=5 dbname=x user=x", 0, "host", v, sizeof(v));
    assert_string_equal(v, "");
    effective_host_setting("host=/nonexistent-a,/nonexistent-b port=,5 dbname=x user=x", 0, "port",
                           v, sizeof(v));
    assert_string_equal(v, "");
    effective_host_setting("host=/nonexistent-a,/nonexistent-b port=,5 dbname=x user=x", 1, "port",
                           v, sizeof(v));
    assert_string_equal(v, "5");
    effective_host_setting("host=/nonexistent-a,/nonexistent-b port=,5 dbname=x user=x", 1, "host",
                           v, sizeof(v));
    assert_string_equal(v, "/nonexistent-b");
    effective_host_setting("host=/nonexistent-a,,/nonexistent-c port=5 dbname='a b' user=x", 1,
                           "host", v, sizeof(v));
    assert_string_equal(v, "");
    /* what the string does not set still comes from the environment, and its dbname stays */
    effective_host_setting("dbname='a b\\\\c\\'d' user=x", 0, "host", v, sizeof(v));
    assert_string_equal(v, "/nonexistent-pghost");
    effective_host_setting("dbname='a b\\\\c\\'d' user=x", 0, "port", v, sizeof(v));
    assert_string_equal(v, "1");
    effective_host_setting("dbname='a b\\\\c\\'d' user=x", 0, "dbname", v, sizeof(v));
    assert_string_equal(v, "a b\\c'd");
    /* so is any other empty setting: password='' is the password file's, not PGPASSWORD's */
    setenv("PGPASSWORD", "from-the-environment", 1);
    effective_host_setting("host=/nonexistent-a password='' dbname=x user=x", 0, "password", v,
                           sizeof(v));
    unsetenv("PGPASSWORD");
    assert_string_equal(v, "");
    unsetenv("PGHOST");
    unsetenv("PGPORT");
}

/* connect_timeout=0 (in the string, in the service file it names, or PGCONNECT_TIMEOUT) is
 * libpq's "no limit": a server that never answers held a command (migrate, check) for ever.
 * db_connect bounds it with the default instead. What is checked is the bound libpq itself
 * ends up with for the connection db_connect would make, so no connect timeout is waited out
 * (the test once waited two of them, 20 s); the server only ever sees a connection started and
 * closed. */
static void test_connect_timeout_zero(void **state)
{
    char port[16], conninfo[256], path[128], service[256], timeout[32];
    int fd = silent_server(port, sizeof(port));
    unsetenv("PGCONNECT_TIMEOUT");
    unsetenv("PGSERVICE");
    alarm(30); /* nothing here waits for the server: a hang fails the test */
    snprintf(conninfo, sizeof(conninfo),
             "host=127.0.0.1 port=%s dbname=x user=x sslmode=disable gssencmode=disable "
             "connect_timeout=0",
             port);
    effective_connect_timeout(conninfo, timeout, sizeof(timeout));
    assert_string_equal(timeout, DB_CONNECT_TIMEOUT_DEFAULT);
    snprintf(service, sizeof(service), "[hang]\nconnect_timeout=-1\nport=%s\n", port);
    write_file(path, sizeof(path), "hang.conf", service);
    setenv("PGSERVICEFILE", path, 1);
    effective_connect_timeout("service=hang host=127.0.0.1 dbname=x user=x sslmode=disable "
                              "gssencmode=disable",
                              timeout, sizeof(timeout));
    assert_string_equal(timeout, DB_CONNECT_TIMEOUT_DEFAULT);
    unsetenv("PGSERVICEFILE");
    unlink(path);
    setenv("PGCONNECT_TIMEOUT", "0", 1);
    snprintf(conninfo, sizeof(conninfo),
             "host=127.0.0.1 port=%s dbname=x user=x sslmode=disable gssencmode=disable", port);
    effective_connect_timeout(conninfo, timeout, sizeof(timeout));
    assert_string_equal(timeout, DB_CONNECT_TIMEOUT_DEFAULT);
    unsetenv("PGCONNECT_TIMEOUT");
    /* A positive value of the user's stays: the override is for "no limit" only. */
    snprintf(conninfo, sizeof(conninfo),
             "host=127.0.0.1 port=%s dbname=x user=x sslmode=disable gssencmode=disable "
             "connect_timeout=3",
             port);
    effective_connect_timeout(conninfo, timeout, sizeof(timeout));
    assert_string_equal(timeout, "3");
    alarm(0);
    close(fd);
}

/* The startup packet a db_connect sends to port (its key/value pairs, NULs turned to spaces):
 * a child accepts the one connection on fd, reads what comes and closes, so the connect fails. */
static void startup_packet(int fd, const char *conninfo, char *out, size_t len)
{
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        /* A db_connect that never connects must fail the test, not hang it: the child ends,
         * which closes the pipe the parent reads. */
        alarm(30);
        int c = accept(fd, NULL, NULL);
        char buf[8192];
        ssize_t n = c >= 0 ? read(c, buf, sizeof(buf)) : -1;
        for (ssize_t i = 0; i < n; i++)
            buf[i] = buf[i] ? buf[i] : ' ';
        if (n > 0 && write(pipefd[1], buf, (size_t)n) < 0)
            _exit(1);
        _exit(0);
    }
    close(pipefd[1]);
    char err[300];
    assert_null(db_connect(conninfo, "test_db", err, sizeof(err)));
    ssize_t n = read(pipefd[0], out, len - 1);
    out[n > 0 ? n : 0] = '\0';
    close(pipefd[0]);
    waitpid(child, NULL, 0);
}

/* With a pinned schema, db_connect sends an explicit options entry: it carried the string's
 * options or PGOPTIONS, and dropped a service file's, which libpq fills in only where nothing
 * is set. Now the service file's options go along, before the pinned search_path. */
static void test_pinned_options_from_service(void **state)
{
    char port[16], path[128], service[256], packet[1024], err[256];
    int fd = silent_server(port, sizeof(port));
    unsetenv("PGOPTIONS");
    unsetenv("PGSERVICE");
    snprintf(service, sizeof(service), "[opts]\noptions=-c statement_timeout=12345\n");
    write_file(path, sizeof(path), "opts.conf", service);
    setenv("PGSERVICEFILE", path, 1);
    assert_true(db_pin_search_path("relayschema", false, err, sizeof(err)));
    char conninfo[256];
    snprintf(conninfo, sizeof(conninfo),
             "service=opts host=127.0.0.1 port=%s dbname=x user=x sslmode=disable "
             "gssencmode=disable",
             port);
    startup_packet(fd, conninfo, packet, sizeof(packet));
    assert_non_null(strstr(packet, "search_path=pg_catalog,relayschema,pg_temp"));
    if (!strstr(packet, "-c statement_timeout=12345"))
        fail_msg("the service file's options were dropped: %s", packet);
    assert_true(db_pin_search_path(NULL, false, err, sizeof(err)));
    unsetenv("PGSERVICEFILE");
    unlink(path);
    close(fd);
}

/* From this review: db_connect took the options it carries along with the pinned search_path
 * (the string's, else the service file's, else PGOPTIONS) into a 1024-byte buffer: longer
 * options (many -c settings) went out cut, the last setting lost or changed silently. */
static void test_pinned_long_options(void **state)
{
    char port[16], packet[8192], err[256];
    int fd = silent_server(port, sizeof(port));
    unsetenv("PGOPTIONS");
    unsetenv("PGSERVICE");
    StrBuf opts = {0};
    for (int i = 0; i < 60; i++)
        strbuf_puts(&opts, "-c work_mem=64MB ");
    strbuf_puts(&opts, "-c statement_timeout=12345");
    assert_true(opts.len > 1024);
    assert_true(db_pin_search_path("relayschema", false, err, sizeof(err)));
    const char *base = "host=127.0.0.1 dbname=x user=x sslmode=disable gssencmode=disable";
    char conninfo[2048];
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            snprintf(conninfo, sizeof(conninfo), "options='%s' port=%s %s", opts.s, port, base);
        else {
            setenv("PGOPTIONS", opts.s, 1);
            snprintf(conninfo, sizeof(conninfo), "port=%s %s", port, base);
        }
        startup_packet(fd, conninfo, packet, sizeof(packet));
        assert_non_null(strstr(packet, "search_path=pg_catalog,relayschema,pg_temp"));
        if (!strstr(packet, "-c statement_timeout=12345"))
            fail_msg("the %s's long options were cut: %.80s...", i ? "PGOPTIONS" : "string",
                     packet);
    }
    unsetenv("PGOPTIONS");
    assert_true(db_pin_search_path(NULL, false, err, sizeof(err)));
    strbuf_free(&opts);
    close(fd);
}

/* libpq reads a service file's lines into 1024 bytes and refuses a longer one wherever it lies
 * in what it reads ("line N too long in service file": every connection fails); the start-up
 * check read 1024-byte pieces and passed it. 1021 bytes and a newline is the longest line
 * libpq takes. */
static void test_service_long_line(void **state)
{
    (void)state;
    char err[512], path[128];
    unsetenv("PGSERVICE");
    StrBuf text = {0};
    char fill[1100];
    memset(fill, 'x', sizeof(fill));
    /* [fits]: a line of exactly 1021 bytes before its newline; [long]: one byte more. */
    strbuf_puts(&text, "[fits]\nhost=db.example\noptions=");
    strbuf_append(&text, fill, 1021 - strlen("options="));
    strbuf_puts(&text, "\n[long]\nhost=db.example\noptions=");
    strbuf_append(&text, fill, 1022 - strlen("options="));
    strbuf_puts(&text, "\n[after]\nhost=db.example\n");
    write_file(path, sizeof(path), "long.conf", text.s);
    setenv("PGSERVICEFILE", path, 1);
    if (!db_check_conninfo("service=fits", err, sizeof(err)))
        fail_msg("a line of 1021 bytes refused: %s", err);
    const char *bad[] = {"service=long", "service=after", "service=missing"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(err, 0, sizeof(err));
        if (db_check_conninfo(bad[i], err, sizeof(err)))
            fail_msg("\"%s\" accepted past a line libpq refuses", bad[i]);
        if (!strstr(err, "invalid service file entry: line 6: longer than libpq reads"))
            fail_msg("\"%s\": error \"%s\"", bad[i], err);
        assert_null(strchr(err, '\n'));
    }
    unsetenv("PGSERVICEFILE");
    unlink(path);
    strbuf_free(&text);
}

/* Two entries of a --databases list that name their databases by service: the strings give no
 * host, port or dbname, and were taken for one database (the list refused, "name the same
 * database"). Each is now what libpq would take: the string's, the service's, the
 * environment's. */
static void test_same_database_by_service(void **state)
{
    (void)state;
    char path[128];
    unsetenv("PGSERVICE");
    unsetenv("PGDATABASE");
    unsetenv("PGHOST");
    unsetenv("PGPORT");
    write_file(path, sizeof(path), "same.conf",
               "[orders]\nhost=db.example\ndbname=orders\n"
               "[billing]\nhost=db.example\ndbname=billing\n"
               "[orders2]\nhost=db.example\ndbname=orders\n");
    setenv("PGSERVICEFILE", path, 1);
    assert_false(db_same_database("service=orders", "service=billing"));
    assert_true(db_same_database("service=orders", "service=orders2"));
    assert_true(db_same_database("service=orders", "host=db.example dbname=orders"));
    assert_false(db_same_database("service=orders dbname=billing", "service=orders"));
    assert_true(db_same_database("host=a dbname=x", "postgresql://a/x"));
    assert_false(db_same_database("host=a dbname=x", "host=a dbname=y"));
    unsetenv("PGSERVICEFILE");
    unlink(path);
}

/* Two spellings of one database in a --databases list were taken for two (host, port and
 * dbname compared as written): localhost and 127.0.0.1, ::1, a socket directory or no host at
 * all (libpq's socket directory), a port left out and 5432, a name's case, a dbname left to
 * default to the user name, a host list naming the other's host. Each pair would run two lane
 * groups' worth of entries on one database, each leaving the other's rows unclaimed. */
static void test_same_database_spellings(void **state)
{
    (void)state;
    static const char *const unset[] = {"PGSERVICE",  "PGSERVICEFILE", "PGDATABASE", "PGHOST",
                                        "PGHOSTADDR", "PGPORT",        "PGUSER"};
    for (size_t i = 0; i < sizeof(unset) / sizeof(unset[0]); i++)
        unsetenv(unset[i]);
    setenv("PGSERVICEFILE", "/nonexistent/pg_service.conf", 1);
    assert_true(db_same_database("host=localhost dbname=x", "host=127.0.0.1 dbname=x"));
    assert_true(db_same_database("postgresql://localhost/x", "postgresql://[::1]/x"));
    assert_true(db_same_database("host=/var/run/postgresql dbname=x", "host=localhost dbname=x"));
    assert_true(db_same_database("dbname=x", "host=127.0.0.1 port=5432 dbname=x"));
    assert_true(
        db_same_database("host=db.example port=5432 dbname=x", "host=DB.Example. dbname=x"));
    assert_true(db_same_database("host=localhost user=orders", "host=localhost dbname=orders"));
    assert_true(db_same_database("host=a,b dbname=x", "host=b dbname=x"));
    assert_true(db_same_database("host=a,b port=5432,5433 dbname=x", "host=b port=5433 dbname=x"));
    assert_true(
        db_same_database("host=a hostaddr=10.0.0.1 dbname=x", "hostaddr=10.0.0.1 dbname=x"));
    /* Not the same: another port, another database, another host, another host's port. */
    assert_false(db_same_database("host=localhost port=5433 dbname=x", "host=localhost dbname=x"));
    assert_false(db_same_database("host=localhost dbname=x", "host=localhost dbname=y"));
    assert_false(db_same_database("host=localhost dbname=x", "host=10.0.0.1 dbname=x"));
    assert_false(db_same_database("host=a,b port=5432,5433 dbname=x", "host=b port=5432 dbname=x"));
    unsetenv("PGSERVICEFILE");
}

/* The "HOST:PORT" label of the logs and errors (an old server passed over, a plan's target):
 * an IPv6 address was written bare, "::1:5432", which reads as another address. */
static void test_host_label_ipv6(void **state)
{
    (void)state;
    char out[64];
    const struct {
        DbHost h;
        const char *want;
    } cases[] = {
        {{"::1", NULL, "5432"}, "[::1]:5432"},
        {{NULL, "fe80::1%lo", "5433"}, "[fe80::1%lo]:5433"},
        {{"db.example", NULL, "5432"}, "db.example:5432"},
        {{NULL, "10.0.0.1", NULL}, "10.0.0.1:"},
        {{"/run/postgresql", NULL, "5432"}, "/run/postgresql:5432"},
        {{NULL, NULL, "5432"}, "(default):5432"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_string_equal(db_host_label(&cases[i].h, out, sizeof(out)), cases[i].want);
}

/* One address of a short host name tried alone (db_connect_params_addr, as db_connect_checked
 * does for a name's later addresses) leaves room for every host's own string: the room made for
 * the longest host was cut down to the address's string, shorter than a long name of the list,
 * and the next host's string was written past the end (ASan: heap-buffer-overflow). */
static void test_connect_params_addr_keeps_room(void **state)
{
    (void)state;
    char err[300];
    unsetenv("PGSERVICE");
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    unsetenv("PGPORT");
    const char *longname = "a-much-longer-host-name-of-the-list.db.internal.example.com";
    char conninfo[256];
    snprintf(conninfo, sizeof(conninfo), "host=pg,%s dbname=x", longname);
    DbConnectParams p;
    assert_true(db_connect_params(conninfo, "test_db", &p, err, sizeof(err)));
    assert_int_equal(p.nhosts, 2);
    assert_true(db_connect_params_addr(&p, 0, "10.0.0.1", NULL));
    assert_non_null(strstr(p.target, "hostaddr='10.0.0.1'"));
    db_connect_params_host(&p, 1, NULL);
    assert_non_null(strstr(p.target, longname));
    assert_null(strstr(p.target, "hostaddr"));
    db_connect_params_free(&p);
}

/* libpq pairs the host, hostaddr and port lists one to one, wherever each comes from (the
 * string, its service file, PGHOST/PGHOSTADDR/PGPORT); lists it cannot pair fail every attempt
 * of run for ever. The check counted only the string's ports against the string's hosts. */
static void test_host_lists_paired(void **state)
{
    (void)state;
    char err[512], path[128];
    unsetenv("PGSERVICE");
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    unsetenv("PGPORT");
    write_file(path, sizeof(path), "lists.conf",
               "[three]\nhost=a,b\nport=1,2,3\n[two]\nhost=a,b\n[addr]\nhostaddr=10.0.0.1\n"
               "[badaddr]\nhostaddr=db.example\n");
    setenv("PGSERVICEFILE", path, 1);
    const char *bad[][2] = {
        {"host=a,b hostaddr=127.0.0.1",
         "2 hosts (from the URL) for 1 hostaddr values (from the URL)"},
        {"service=three", "3 ports (from service three) for 2 hosts (from service three)"},
        {"service=two port=1,2,3", "3 ports (from the URL) for 2 hosts (from service two)"},
        {"service=addr host=a,b",
         "2 hosts (from the URL) for 1 hostaddr values (from service addr)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(err, 0, sizeof(err));
        if (db_check_conninfo(bad[i][0], err, sizeof(err)))
            fail_msg("\"%s\" accepted", bad[i][0]);
        if (!strstr(err, bad[i][1]))
            fail_msg("\"%s\": error \"%s\" does not say %s", bad[i][0], err, bad[i][1]);
    }
    setenv("PGPORT", "1,2,3", 1);
    assert_false(db_check_conninfo("host=a,b", err, sizeof(err)));
    assert_non_null(strstr(err, "3 ports (from PGPORT) for 2 hosts (from the URL)"));
    assert_true(db_check_conninfo("host=a,b,c", err, sizeof(err)));
    unsetenv("PGPORT");
    /* Hosts from PGHOST count as the string's do (test_check_conninfo_values took these two for
     * good, uncounted; with no host anywhere libpq refuses them: "could not match 2 port numbers
     * to 1 hosts"). */
    assert_false(db_check_conninfo("dbname=x port=5432,5433", err, sizeof(err)));
    setenv("PGHOST", "a,b", 1);
    assert_true(db_check_conninfo("dbname=x port=5432,5433", err, sizeof(err)));
    assert_true(db_check_conninfo("service=missing port=5432,5433", err, sizeof(err)));
    unsetenv("PGHOST");
    /* A hostaddr entry that is not a numeric address fails its host's every attempt ("could
     * not parse network address"). */
    const char *names[][2] = {
        {"hostaddr=db.example", "hostaddr (from the URL): entry 1 is not a numeric IP address"},
        {"host=a,b hostaddr=10.0.0.1,db", "hostaddr (from the URL): entry 2 is not"},
        {"service=badaddr", "hostaddr (from service badaddr): entry 1 is not"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        memset(err, 0, sizeof(err));
        if (db_check_conninfo(names[i][0], err, sizeof(err)))
            fail_msg("\"%s\" accepted", names[i][0]);
        if (!strstr(err, names[i][1]))
            fail_msg("\"%s\": error \"%s\" does not say %s", names[i][0], err, names[i][1]);
        assert_null(strstr(err, "db.example"));
    }
    setenv("PGHOSTADDR", "localhost", 1);
    assert_false(db_check_conninfo("dbname=x", err, sizeof(err)));
    assert_non_null(strstr(err, "hostaddr (from PGHOSTADDR)"));
    unsetenv("PGHOSTADDR");
    const char *good[] = {"host=a,b,c hostaddr=10.0.0.1,,::1",
                          "hostaddr=fe80::1%lo",
                          "service=two port=1,2",
                          "service=two port=5432",
                          "host=a,b port=,",
                          "hostaddr=10.0.0.1,10.0.0.2 port=1,2",
                          "service=addr host=a",
                          "host=a,b hostaddr=",
                          "port=5432"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (!db_check_conninfo(good[i], err, sizeof(err)))
            fail_msg("\"%s\" refused: %s", good[i], err);
    unsetenv("PGSERVICEFILE");
    unlink(path);
}

/* The value of key among db_connect's parameters (the last one: libpq keeps the last), NULL when
 * absent. */
static const char *param(const DbConnectParams *p, const char *key)
{
    const char *found = NULL;
    for (int i = 0; p->keys[i]; i++)
        if (strcmp(p->keys[i], key) == 0)
            found = p->values[i];
    return found;
}

/* The keepalives, tcp_user_timeout and connect_timeout db_connect sets are defaults: a service
 * file's (or PGCONNECT_TIMEOUT) is the user's choice and wins. Passed as entries of their own,
 * the defaults beat them (libpq fills in a service file's and the environment's values only
 * where nothing is set), so a service's keepalives_idle=60 or a PGCONNECT_TIMEOUT=3 was silently
 * replaced by 10. */
static void test_connect_defaults_yield(void **state)
{
    (void)state;
    char path[128], err[256];
    unsetenv("PGSERVICE");
    unsetenv("PGCONNECT_TIMEOUT");
    write_file(path, sizeof(path), "keep.conf",
               "[keep]\nkeepalives_idle=60\ntcp_user_timeout=5000\n"
               "fallback_application_name=mine\n");
    setenv("PGSERVICEFILE", path, 1);
    DbConnectParams p;
    assert_true(db_connect_params("service=keep dbname=x", "test_db", &p, err, sizeof(err)));
    if (param(&p, "keepalives_idle") || param(&p, "tcp_user_timeout"))
        fail_msg("the service file's keepalives_idle/tcp_user_timeout overridden: %s, %s",
                 param(&p, "keepalives_idle"), param(&p, "tcp_user_timeout"));
    assert_null(param(&p, "fallback_application_name"));
    /* What the file leaves unset keeps the relay's default. */
    assert_string_equal(param(&p, "keepalives"), "1");
    assert_string_equal(param(&p, "keepalives_interval"), "5");
    assert_string_equal(param(&p, "connect_timeout"), DB_CONNECT_TIMEOUT_DEFAULT);
    db_connect_params_free(&p);
    setenv("PGCONNECT_TIMEOUT", "3", 1);
    assert_true(db_connect_params("dbname=x", NULL, &p, err, sizeof(err)));
    assert_null(param(&p, "connect_timeout"));
    assert_string_equal(param(&p, "keepalives_idle"), "10");
    db_connect_params_free(&p);
    /* No limit (0) from anywhere is still bounded: the default goes after the string. */
    setenv("PGCONNECT_TIMEOUT", "0", 1);
    assert_true(db_connect_params("dbname=x", NULL, &p, err, sizeof(err)));
    assert_string_equal(param(&p, "connect_timeout"), DB_CONNECT_TIMEOUT_DEFAULT);
    db_connect_params_free(&p);
    unsetenv("PGCONNECT_TIMEOUT");
    unsetenv("PGSERVICEFILE");
    unlink(path);
}

/* The files libpq opens itself while it connects, on the relay's event loop (the service file
 * in PQconnectStart, the TLS files in PQconnectPoll), must each be a regular file or absent: a
 * FIFO's open waits for a writer and would freeze every database. Refused naming the setting,
 * where it came from and the path, from the string, the environment or libpq's default under the
 * home directory; sslmode=disable reads no TLS file, an engine's key ("engine:id") is no file.
 * The check only stats: a FIFO is never opened (the alarm turns a wait into a failure). */
static void test_library_files(void **state)
{
    (void)state;
    char dir[128], fifo[192], plain[192], dotpg[192], home_fifo[256], cs[1024], err[1024];
    snprintf(dir, sizeof(dir), "/tmp/test_db_%ld_files", (long)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    snprintf(plain, sizeof(plain), "%s/plain", dir);
    snprintf(dotpg, sizeof(dotpg), "%s/.postgresql", dir);
    snprintf(home_fifo, sizeof(home_fifo), "%s/root.crt", dotpg);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    FILE *f = fopen(plain, "w");
    assert_non_null(f);
    fclose(f);
    const char *saved_home = getenv("HOME");
    char *home = saved_home ? strdup(saved_home) : NULL;
    setenv("HOME", dir, 1);
    unsetenv("PGSSLROOTCERT");
    unsetenv("PGSSLMODE");
    unsetenv("PGSERVICE");
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    alarm(30); /* a FIFO opened would wait for a writer: a hang fails the test */

    const char *keys[] = {"sslrootcert", "sslcert", "sslkey", "sslcrl"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        /* With a root and a client certificate: libpq reads the CRL only with the one, the
         * key only with the other. */
        snprintf(cs, sizeof(cs), "host=h sslrootcert=%s sslcert=%s %s=%s", plain, plain, keys[i],
                 fifo);
        memset(err, 0, sizeof(err));
        if (db_check_conninfo(cs, err, sizeof(err)))
            fail_msg("%s a FIFO taken", keys[i]);
        char want[300];
        snprintf(want, sizeof(want), "database URL: %s %s: not a regular file", keys[i], fifo);
        if (!strstr(err, want))
            fail_msg("%s: got \"%s\"", keys[i], err);
        assert_null(strchr(err, '\n'));
        snprintf(cs, sizeof(cs), "host=h sslmode=disable %s=%s", keys[i], fifo);
        assert_true(db_check_conninfo(cs, err, sizeof(err))); /* no TLS, no file read */
        snprintf(cs, sizeof(cs), "host=h %s=%s", keys[i], plain);
        assert_true(db_check_conninfo(cs, err, sizeof(err)));
        snprintf(cs, sizeof(cs), "host=h %s=%s/absent", keys[i], dir);
        assert_true(db_check_conninfo(cs, err, sizeof(err))); /* libpq goes on without it */
    }
    snprintf(cs, sizeof(cs), "host=h sslcert=%s sslkey=engine:%s", plain, fifo);
    assert_true(db_check_conninfo(cs, err, sizeof(err)));
    /* Without a client certificate libpq never looks at the key: the relay does not either. */
    snprintf(cs, sizeof(cs), "host=h sslkey=%s", fifo);
    if (!db_check_conninfo(cs, err, sizeof(err)))
        fail_msg("sslkey without a certificate refused: %s", err);
    snprintf(cs, sizeof(cs), "host=h sslcert=%s/absent sslkey=%s", dir, fifo);
    assert_true(db_check_conninfo(cs, err, sizeof(err)));
    snprintf(cs, sizeof(cs), "host=h sslcert=%s sslkey=%s", dir, fifo); /* fails to load */
    assert_true(db_check_conninfo(cs, err, sizeof(err)));
    /* Without a root certificate libpq never loads a CRL; with sslcrldir set it takes no
     * default CRL (~/.postgresql/root.crl). */
    snprintf(cs, sizeof(cs), "host=h sslcrl=%s", fifo);
    if (!db_check_conninfo(cs, err, sizeof(err)))
        fail_msg("sslcrl without a root certificate refused: %s", err);
    snprintf(cs, sizeof(cs), "host=h sslrootcert=%s sslcrl=%s", dir, fifo); /* fails to load */
    assert_true(db_check_conninfo(cs, err, sizeof(err)));
    char crl_default[256];
    snprintf(crl_default, sizeof(crl_default), "%s/root.crl", dotpg);
    assert_int_equal(mkdir(dotpg, 0700), 0);
    assert_int_equal(mkfifo(crl_default, 0600), 0);
    snprintf(cs, sizeof(cs), "host=h sslrootcert=%s", plain);
    assert_false(db_check_conninfo(cs, err, sizeof(err)));
    assert_non_null(strstr(err, "sslcrl (from libpq's default)"));
    snprintf(cs, sizeof(cs), "host=h sslrootcert=%s sslcrldir=%s", plain, dir);
    if (!db_check_conninfo(cs, err, sizeof(err)))
        fail_msg("default CRL checked though sslcrldir is set: %s", err);
    unlink(crl_default);
    rmdir(dotpg);
    /* Only Unix sockets: libpq never sets up TLS on one, so opens none of the files. */
    const char *unix_only[] = {"host=/run/postgresql", "host=@abstract",
                               "host=/run/postgresql,/tmp", "host=", "port=5433"};
    for (size_t i = 0; i < sizeof(unix_only) / sizeof(unix_only[0]); i++) {
        snprintf(cs, sizeof(cs), "%s sslrootcert=%s", unix_only[i], fifo);
        if (!db_check_conninfo(cs, err, sizeof(err)))
            fail_msg("%s: refused though libpq uses no TLS there: %s", unix_only[i], err);
    }
    const char *some_tcp[] = {"host=/run/postgresql,h", "host=/run/postgresql hostaddr=127.0.0.1",
                              "host=,h", "hostaddr=127.0.0.1"};
    for (size_t i = 0; i < sizeof(some_tcp) / sizeof(some_tcp[0]); i++) {
        snprintf(cs, sizeof(cs), "%s sslrootcert=%s", some_tcp[i], fifo);
        if (db_check_conninfo(cs, err, sizeof(err)))
            fail_msg("%s: a FIFO taken though a host is over TCP", some_tcp[i]);
    }
    setenv("PGHOST", "h", 1); /* the environment's host is the one libpq takes */
    snprintf(cs, sizeof(cs), "sslrootcert=%s", fifo);
    assert_false(db_check_conninfo(cs, err, sizeof(err)));
    unsetenv("PGHOST");
    setenv("PGSSLROOTCERT", fifo, 1);
    assert_false(db_check_conninfo("host=h", err, sizeof(err)));
    assert_non_null(strstr(err, "sslrootcert (from PGSSLROOTCERT)"));
    unsetenv("PGSSLROOTCERT");
    /* libpq's default, ~/.postgresql/root.crt. */
    assert_int_equal(mkdir(dotpg, 0700), 0);
    assert_int_equal(mkfifo(home_fifo, 0600), 0);
    assert_false(db_check_conninfo("host=h", err, sizeof(err)));
    assert_non_null(strstr(err, "sslrootcert (from libpq's default)"));
    assert_true(db_check_conninfo("host=h sslmode=disable", err, sizeof(err)));
    unlink(home_fifo);
    /* The service file, which the relay reads too (db_effective_value) and libpq at every
     * connection: PGSERVICEFILE a FIFO. */
    setenv("PGSERVICEFILE", fifo, 1);
    assert_false(db_check_conninfo("service=svc", err, sizeof(err)));
    assert_non_null(strstr(err, "not a regular file"));
    assert_non_null(strstr(err, fifo));
    char *value = NULL, from[80];
    PQconninfoOption *opts = PQconninfoParse("service=svc", NULL);
    assert_non_null(opts);
    assert_false(db_effective_value(opts, "host", NULL, &value, from, sizeof(from)));
    PQconninfoFree(opts);
    assert_true(db_check_conninfo("host=h", err, sizeof(err))); /* no service named: not read */
    /* An empty service, in the string or PGSERVICE set empty (an env file's PGSERVICE=): libpq
     * reads the files for it as for any other (it skips them only when none is given), so its
     * open of the FIFO would stop the loop; refused too. */
    if (db_check_conninfo("host=h service=''", err, sizeof(err)))
        fail_msg("service='' took PGSERVICEFILE a FIFO, which libpq opens");
    assert_non_null(strstr(err, fifo));
    setenv("PGSERVICE", "", 1);
    if (db_check_conninfo("host=h", err, sizeof(err)))
        fail_msg("PGSERVICE empty took PGSERVICEFILE a FIFO, which libpq opens");
    assert_non_null(strstr(err, fifo));
    unsetenv("PGSERVICE");
    /* The system's file a FIFO: libpq opens it only when the first file lacks the group. */
    char svc[192];
    snprintf(svc, sizeof(svc), "%s/first.conf", dir);
    f = fopen(svc, "w");
    assert_non_null(f);
    fputs("[svc]\nhost=h\n", f);
    fclose(f);
    char sysdir[200], sysconf[256];
    snprintf(sysdir, sizeof(sysdir), "%s/sys", dir);
    snprintf(sysconf, sizeof(sysconf), "%s/pg_service.conf", sysdir);
    assert_int_equal(mkdir(sysdir, 0700), 0);
    assert_int_equal(mkfifo(sysconf, 0600), 0);
    setenv("PGSYSCONFDIR", sysdir, 1);
    setenv("PGSERVICEFILE", svc, 1);
    if (!db_check_conninfo("service=svc", err, sizeof(err)))
        fail_msg("system service file checked though the first holds the group: %s", err);
    assert_false(db_check_conninfo("service=other", err, sizeof(err))); /* libpq reads it */
    assert_non_null(strstr(err, sysconf));
    unsetenv("PGSERVICEFILE");
    unsetenv("PGSYSCONFDIR");
    unlink(sysconf);
    rmdir(sysdir);
    unlink(svc);
    alarm(0);

    if (home) {
        setenv("HOME", home, 1);
        free(home);
    } else {
        unsetenv("HOME");
    }
    rmdir(dotpg);
    unlink(fifo);
    unlink(plain);
    rmdir(dir);
}

/* The minimum server version (db_version_supported, the rule of db_connect and of the relay's
 * own connections): PostgreSQL 12 lacks gen_random_uuid() built in (migrate failed half-way) and
 * pg_current_snapshot() (every claim failed), so 12 and older are refused with one line naming
 * both versions, in either numbering (12.19 is 120019, 9.6.24 is 90624), and 13 on are not. */
static void test_version_supported(void **state)
{
    (void)state;
    char err[120] = "";
    assert_true(db_version_supported(130000, err, sizeof(err)));
    assert_true(db_version_supported(130016, err, sizeof(err)));
    assert_true(db_version_supported(170002, err, sizeof(err)));
    assert_string_equal(err, "");
    assert_false(db_version_supported(120019, err, sizeof(err)));
    assert_string_equal(err, "PostgreSQL 13 or later is required; the server is 12.19");
    assert_false(db_version_supported(129999, err, sizeof(err)));
    assert_string_equal(err, "PostgreSQL 13 or later is required; the server is 12.9999");
    assert_false(db_version_supported(90624, err, sizeof(err)));
    assert_string_equal(err, "PostgreSQL 13 or later is required; the server is 9.6.24");
    assert_false(db_version_supported(0, err, sizeof(err)));
    assert_string_equal(err, "PostgreSQL 13 or later is required; the server is of an unknown "
                             "version");
    char small[20];
    assert_false(db_version_supported(120019, small, sizeof(small)));
    assert_int_equal(strlen(small), sizeof(small) - 1); /* cut, terminated */
}

/* A directory in a TLS file's place, or as the service file, can neither wait in its open nor
 * in its read: libpq ignores an sslcrl directory and reads a service file that is one as empty.
 * Only what can wait (a FIFO) is refused, and its reason says what it is not. */
static void test_library_files_directories(void **state)
{
    (void)state;
    char dir[128], sub[192], fifo[192], svc[192], cs[512], err[1024];
    snprintf(dir, sizeof(dir), "/tmp/test_db_%ld_dirs", (long)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(sub, sizeof(sub), "%s/crl.d", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(svc, sizeof(svc), "%s/pg_service.conf", dir);
    FILE *f = fopen(svc, "w");
    assert_non_null(f);
    fputs("[svc]\nhost=h\n", f);
    fclose(f);
    const char *saved_home = getenv("HOME");
    char *home = saved_home ? strdup(saved_home) : NULL;
    setenv("HOME", dir, 1);
    unsetenv("PGSSLMODE");
    unsetenv("PGSERVICE");
    unsetenv("PGSERVICEFILE");
    alarm(30);

    const char *keys[] = {"sslrootcert", "sslcert", "sslkey", "sslcrl"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        snprintf(cs, sizeof(cs), "host=h sslcert=%s/absent %s=%s", dir, keys[i], sub);
        if (!db_check_conninfo(cs, err, sizeof(err)))
            fail_msg("%s a directory refused: %s", keys[i], err);
    }
    snprintf(cs, sizeof(cs), "host=h sslrootcert=%s sslcrl=%s", svc, fifo); /* any file */
    assert_false(db_check_conninfo(cs, err, sizeof(err)));
    /* The whole reason, true of run and of the commands (dead, status, verify, ...), whose
     * connections are made on no event loop: it said "libpq reads it on the relay's event loop"
     * to them too. */
    if (!strstr(err, "not a regular file or a directory (libpq opens it at every connection, "
                     "and a pipe's, device's or socket's open could wait without end: on the "
                     "running relay's event loop, or past every bound of a command)"))
        fail_msg("got \"%s\"", err);
    /* PGSERVICEFILE a directory: read as empty, the system's file then holds the group. */
    setenv("PGSERVICEFILE", sub, 1);
    setenv("PGSYSCONFDIR", dir, 1);
    if (!db_check_conninfo("service=svc", err, sizeof(err)))
        fail_msg("service file a directory refused: %s", err);
    char value[64] = "";
    assert_true(db_service_value("svc", "host", value, sizeof(value)));
    assert_string_equal(value, "h");
    unsetenv("PGSERVICEFILE");
    unsetenv("PGSYSCONFDIR");
    alarm(0);

    if (home) {
        setenv("HOME", home, 1);
        free(home);
    } else {
        unsetenv("HOME");
    }
    unlink(svc);
    unlink(fifo);
    rmdir(sub);
    rmdir(dir);
}

/* The window db_check_files leaves, closed for the TLS files: each one libpq would open is
 * opened by the check itself, without waiting, and handed to libpq as /proc/self/fd/N. Once a
 * FIFO is renamed over the path, opening the alias as libpq does (a blocking open) still opens
 * the file checked, at once, with its content and its mode (libpq's sslkey check reads the
 * mode through the alias); libpq's errors are written back to the path. */
static void test_library_files_pinned(void **state)
{
    (void)state;
    char dir[128], root[192], cert[192], key[192], fifo[192], cs[1024], err[1024];
    snprintf(dir, sizeof(dir), "/tmp/test_db_%ld_pins", (long)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(root, sizeof(root), "%s/root.crt", dir);
    snprintf(cert, sizeof(cert), "%s/client.crt", dir);
    snprintf(key, sizeof(key), "%s/client.key", dir);
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    const char *files[] = {root, cert, key};
    for (size_t i = 0; i < 3; i++) {
        FILE *f = fopen(files[i], "w");
        assert_non_null(f);
        fprintf(f, "content of %zu\n", i);
        fclose(f);
    }
    assert_int_equal(chmod(key, 0600), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *saved_home = getenv("HOME");
    char *home = saved_home ? strdup(saved_home) : NULL;
    setenv("HOME", dir, 1); /* no default file of the real home's */
    unsetenv("PGSERVICE");
    unsetenv("PGSSLMODE");
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    alarm(30); /* a FIFO opened would wait for a writer: a hang fails the test */

    snprintf(cs, sizeof(cs), "host=h sslrootcert=%s sslcert=%s sslkey=%s", root, cert, key);
    PQconninfoOption *opts = PQconninfoParse(cs, NULL);
    assert_non_null(opts);
    DbPins pins;
    if (!db_check_files_pinned(opts, &pins, err, sizeof(err)))
        fail_msg("regular TLS files refused: %s", err);
    assert_int_equal(pins.n, 3);
    for (int i = 0; i < pins.n; i++) {
        assert_string_equal(pins.path[i], files[i]);
        assert_non_null(strstr(pins.alias[i], "/proc/self/fd/"));
    }
    assert_string_equal(pins.keyword[0], "sslrootcert");
    assert_string_equal(pins.keyword[2], "sslkey");
    assert_int_equal(rename(fifo, root), 0); /* the path is a FIFO from now on */
    int fd = open(pins.alias[0], O_RDONLY);  /* as libpq's fopen: blocking */
    assert_true(fd >= 0);
    char buf[64] = "";
    assert_true(read(fd, buf, sizeof(buf) - 1) > 0);
    close(fd);
    assert_string_equal(buf, "content of 0\n");
    struct stat st;
    assert_int_equal(stat(pins.alias[2], &st), 0); /* libpq's sslkey mode check */
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);

    char said[300], shown[300];
    snprintf(said, sizeof(said), "could not read root certificate file \"%s\": no", pins.alias[0]);
    db_pins_text(&pins, said, shown, sizeof(shown));
    char want[300];
    snprintf(want, sizeof(want), "could not read root certificate file \"%s\": no", root);
    assert_string_equal(shown, want);
    db_pins_close(&pins);
    assert_int_equal(pins.n, 0);

    /* The path, a FIFO now, is refused by the next attempt's check, naming it; nothing held. */
    assert_false(db_check_files_pinned(opts, &pins, err, sizeof(err)));
    snprintf(want, sizeof(want), "database URL: sslrootcert %s: not a regular file", root);
    if (!strstr(err, want))
        fail_msg("got \"%s\"", err);
    assert_int_equal(pins.n, 0);
    PQconninfoFree(opts);

    /* Nothing pinned where libpq opens nothing: no TLS, a Unix socket, an engine's key. */
    unlink(root);
    const char *before[] = {"host=h sslmode=disable", "host=/run/postgresql", "host=h"};
    const char *after[] = {"", "", " sslkey=engine:id"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(cs, sizeof(cs), "%s sslcert=%s%s", before[i], cert, after[i]);
        opts = PQconninfoParse(cs, NULL);
        assert_non_null(opts);
        assert_true(db_check_files_pinned(opts, &pins, err, sizeof(err)));
        assert_int_equal(pins.n, i == 2 ? 1 : 0); /* the certificate only */
        db_pins_close(&pins);
        PQconninfoFree(opts);
    }
    /* "/proc/self/fd/1" is not the start of "/proc/self/fd/12" */
    DbPins one = {.n = 1};
    snprintf(one.alias[0], sizeof(one.alias[0]), "/proc/self/fd/1");
    one.path[0] = "/p";
    db_pins_text(&one, "a /proc/self/fd/12 b /proc/self/fd/1: c", shown, sizeof(shown));
    assert_string_equal(shown, "a /proc/self/fd/12 b /p: c");
    alarm(0);
    if (home)
        setenv("HOME", home, 1);
    free(home);
    unlink(cert);
    unlink(key);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_supported),
        cmocka_unit_test(test_check_conninfo_hides_input),
        cmocka_unit_test(test_check_conninfo_hides_quoted_input),
        cmocka_unit_test(test_check_conninfo_hides_rebuilt_host_list),
        cmocka_unit_test(test_connect_error_hides_password_tail),
        cmocka_unit_test(test_hide_password_tail_host_list),
        cmocka_unit_test(test_service_file_missing),
        cmocka_unit_test(test_check_conninfo_values),
        cmocka_unit_test(test_writer_conninfo),
        cmocka_unit_test(test_writer_service),
        cmocka_unit_test(test_service_values),
        cmocka_unit_test(test_library_files),
        cmocka_unit_test(test_library_files_directories),
        cmocka_unit_test(test_library_files_pinned),
        cmocka_unit_test(test_connect_timeout_zero),
        cmocka_unit_test(test_connect_params_empty_entries),
        cmocka_unit_test(test_pinned_options_from_service),
        cmocka_unit_test(test_pinned_long_options),
        cmocka_unit_test(test_connect_defaults_yield),
        cmocka_unit_test(test_service_long_line),
        cmocka_unit_test(test_same_database_by_service),
        cmocka_unit_test(test_same_database_spellings),
        cmocka_unit_test(test_host_label_ipv6),
        cmocka_unit_test(test_host_lists_paired),
        cmocka_unit_test(test_connect_params_addr_keeps_room),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
