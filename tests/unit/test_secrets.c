/* Unit tests for secrets.c: registering secrets (plain, from connection strings, from librdkafka
 * properties), scrubbing them, and that log lines and quoted values never show one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "config.h"
#include "db.h"
#include "log.h"
#include "opts.h"
#include "pg_plan.h"
#include "secrets.h"
#include "secret_text.h"

static int reset(void **state)
{
    secrets_clear();
    return 0;
}

static void assert_scrubbed(const char *in, const char *want)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", in);
    size_t len = secrets_scrub(buf);
    if (strcmp(buf, want) != 0)
        fail_msg("scrub(\"%s\")\n  got  \"%s\"\n  want \"%s\"", in, buf, want);
    assert_int_equal(len, strlen(want));
}

static void test_scrub(void **state)
{
    secrets_add("hunter22");
    assert_scrubbed("password hunter22 and hunter22!", "password *** and ***!");
    assert_scrubbed("nothing here", "nothing here");
    assert_scrubbed("hunter22", "***");
    assert_scrubbed("", "");
    assert_true(secrets_found("x hunter22 y"));
    assert_false(secrets_found("hunter2"));
}

static void test_short_secrets_ignored(void **state)
{
    secrets_add("abc"); /* would mangle ordinary text */
    secrets_add("");
    secrets_add(NULL);
    assert_scrubbed("abc abc", "abc abc");
}

static void test_short_secrets_counted(void **state)
{
    /* Not registered, but counted for the start-up warning: a password given whole, as libpq
     * reads one from a connection string, or a sensitive librdkafka property's value. */
    assert_int_equal(secrets_too_short(), 0);
    secrets_add("abc");
    assert_int_equal(secrets_too_short(), 1);
    secrets_add(""); /* nothing to show */
    secrets_add(NULL);
    secrets_add("abcd");
    assert_int_equal(secrets_too_short(), 1);
    secrets_add_conninfo("postgresql://u:pw@h/db");
    assert_int_equal(secrets_too_short(), 2);
    secrets_add_conninfo("host=h password=x sslpassword=long-enough");
    assert_int_equal(secrets_too_short(), 3);
    /* pieces of a longer password, cut by readings other than libpq's, are no password given */
    secrets_add_conninfo("postgresql://u:long-one@ab,cd@h/db");
    secrets_add_conninfo("postgresql://u:correct:horse@h/db");
    assert_int_equal(secrets_too_short(), 3);
    /* a value read again (--databases gives each database the file's --kafka properties, a
     * SIGHUP registers everything anew) is still one password to change */
    secrets_add("abc");
    secrets_add("x");
    secrets_add_conninfo("postgresql://u:pw@h2/db");
    assert_int_equal(secrets_too_short(), 3);
    secrets_count_short_anew(); /* a reload's configuration: counted again, each once */
    secrets_add("abc");
    secrets_add("abc");
    assert_int_equal(secrets_too_short(), 4);
    secrets_clear();
    assert_int_equal(secrets_too_short(), 0);
    secrets_add("abc"); /* forgotten with the rest */
    assert_int_equal(secrets_too_short(), 1);
    secrets_clear();
}

static void test_longest_first(void **state)
{
    /* A secret inside a longer one: the longer is scrubbed whole, whatever the order added. */
    secrets_add("hunter22");
    secrets_add("hunter22-longer");
    secrets_add("xx-hunter22-longer-yy");
    assert_scrubbed("a xx-hunter22-longer-yy b hunter22-longer c hunter22 d",
                    "a *** b *** c *** d");
}

static void test_duplicates(void **state)
{
    secrets_add("hunter22");
    secrets_add("hunter22");
    assert_scrubbed("hunter22hunter22", "******");
}

/* A user info without ':' in a URL of a scheme not libpq's is a token (http://APIKEY@host,
 * redis://TOKEN@host): registered; in libpq's URL it is a user name, not registered. */
static void test_conninfo_url_bare_token(void **state)
{
    secrets_add_conninfo("http://APIKEY-s3cret@registry:8081");
    secrets_add_conninfo("redis://REDIS-t0ken@cache:6379/0");
    secrets_add_conninfo("postgresql://relay-user@db/orders");
    assert_scrubbed("key APIKEY-s3cret token REDIS-t0ken", "key *** token ***");
    assert_scrubbed("user relay-user", "user relay-user");
}

/* From this review: an '@' in a registry URL's path was taken for the end of a bare token, so
 * the host ("registry-host/p") was registered and scrubbed from every log line, and the argv
 * masking overwrote it. Only text holding a ':' ("user:pass", either with a '/') lets an '@'
 * after the first '/' end the user info. Fails on the old code. */
static void test_conninfo_url_at_in_path(void **state)
{
    secrets_add_conninfo("http://registry-host/p@th");
    secrets_add_conninfo("https://[::1]/ccompat/a@b");
    assert_scrubbed("registry-host/p [::1]/ccompat/a", "registry-host/p [::1]/ccompat/a");
    /* the other side: a password holding '/' and a token are still registered */
    secrets_add_conninfo("http://u:pa/s3cret-x@h/x");
    secrets_add_conninfo("http://TOKEN-s3cret@h/p@th");
    assert_scrubbed("pw pa/s3cret-x token TOKEN-s3cret", "pw *** token ***");

    static const OptDef defs[] = {{.name = "schema-registry-url", .type = OPT_STRING}};
    const OptSpec spec = {.prog = "demo", .opts = defs, .nopts = 1};
    char a0[] = "demo", a1[] = "--schema-registry-url",
         a2[] = "http://h/p@th,http://u:pa/ss@h/x,http://TOK@h/y@z";
    char *argv[] = {a0, a1, a2, NULL};
    static const char *const lists[] = {"schema-registry-url", NULL};
    secrets_scrub_argv(&spec, 3, argv, NULL, lists);
    assert_string_equal(argv[2], "http://h/p@th,http://*******@h/x,http://***@h/y@z");
}

static void test_conninfo_url(void **state)
{
    /* Percent-encoded in the URL, decoded by libpq: both forms are secrets. */
    secrets_add_conninfo("postgresql://relay:p%40ss-word@db.example.com:5432/orders");
    assert_scrubbed("raw p%40ss-word decoded p@ss-word", "raw *** decoded ***");
    assert_scrubbed("relay db.example.com orders", "relay db.example.com orders");
}

static void test_conninfo_unparsable(void **state)
{
    /* libpq rejects this and echoes the bad token; the raw text is registered anyway. */
    secrets_add_conninfo("postgresql://u:hunter22%zz@h/db");
    assert_scrubbed("invalid percent-encoded token: \"hunter22%zz\"",
                    "invalid percent-encoded token: \"***\"");
}

static void test_conninfo_url_password_with_query_chars(void **state)
{
    /* libpq reads "hunter?22%zz" as the password ('?' does not end the user info) and echoes it
     * when the encoding is bad; before, the raw text was not registered. */
    secrets_add_conninfo("postgresql://u:hunter?22%zz@h/db");
    assert_scrubbed("invalid percent-encoded token: \"hunter?22%zz\"",
                    "invalid percent-encoded token: \"***\"");
    secrets_add_conninfo("postgresql://u:pass#word1@h/db");
    assert_scrubbed("pass#word1", "***");
    /* No '/' after the host, an '@' in the query: libpq's password ends at the first '@'
     * ("sec?ret%zz", echoed as it is when its encoding is bad), not at the query's. */
    secrets_add_conninfo("postgresql://u:sec?ret%zz@h?application_name=a@b");
    assert_scrubbed("invalid percent-encoded token: \"sec?ret%zz\"",
                    "invalid percent-encoded token: \"***\"");
}

static void test_conninfo_url_password_tail(void **state)
{
    /* An '@' not percent-encoded in the password: libpq's password ends at it ("p", too short to
     * register) and the rest is the start of its host name, shown in the relay's host= fields
     * and connect errors. The whole password is a secret, and so is that tail. */
    secrets_add_conninfo("postgresql://app:p@t-pw-s3cret@db.invalid:1/app");
    assert_scrubbed("host=\"t-pw-s3cret@db.invalid\"", "host=\"***@db.invalid\"");
    assert_scrubbed("p@t-pw-s3cret", "***");
    /* The tail percent-decoded too (libpq decodes a URL's host), and from after the colon when
     * the first '@' is in the user name. */
    secrets_add_conninfo("postgresql://app:x@tail%2Dtwo@db/app");
    assert_scrubbed("host \"tail-two@db\"", "host \"***@db\"");
    secrets_add_conninfo("postgresql://me@corp:pass-three@db/app");
    assert_scrubbed("port \"pass-three@db\"", "port \"***@db\"");
    assert_scrubbed("me@corp db app", "me@corp db app");
}

static void test_conninfo_url_password_with_slash(void **state)
{
    /* A '/' not percent-encoded in the password: libpq reads no password but host "app", port
     * "longpart" and database "second-part@db/app", and echoes those in its errors. The user
     * info (to the last '@' before the query) is the password as meant, and its pieces are
     * secrets; before, none of it was registered. */
    const char *url = "postgresql://app:longpart/second-part@db/app";
    secrets_add_conninfo(url);
    assert_scrubbed("longpart/second-part", "***");
    assert_scrubbed("invalid integer value \"longpart\" for connection option \"port\"",
                    "invalid integer value \"***\" for connection option \"port\"");
    assert_scrubbed("database \"second-part@db/app\" does not exist",
                    "database \"***@db/app\" does not exist");
    char err[512];
    assert_false(db_check_conninfo(url, err, sizeof(err)));
    secrets_scrub(err);
    if (strstr(err, "longpart") || strstr(err, "second-part"))
        fail_msg("refusing %s shows the password: %s", url, err);
    /* libpq's second host, cut from the password at ',' (no '@' in it): hidden from a connect
     * error by position too, registered secrets or not */
    char line[256] = "could not translate host name \"second\" to address";
    db_hide_password_tail(line, "postgresql://app:first,second/third@db/app");
    assert_string_equal(line, "could not translate host name \"...\" to address");
}

static void test_conninfo_url_password_pieces(void **state)
{
    /* Found by test_random_strings_around_a_password (146 leaks in its 100k before): libpq
     * cuts the text after its '@' into hosts at ',' (also a decoded %2C)... */
    secrets_add_conninfo("postgresql://u:\\%DD@Zq9xK7wV,@@h:5432/db");
    assert_scrubbed("host name \"Zq9xK7wV\"", "host name \"***\"");
    secrets_add_conninfo("postgresql://u?::2@'1Zq9xK7wV%2C&@%61h/db");
    assert_scrubbed("host name \"'1Zq9xK7wV\"", "host name \"***\"");
    /* ...and log_mask_conninfo ends the password at an '@' before a '?', leaving the rest of
     * the password as meant (to the last '@' before the first '/') as written. */
    const char *url = "postgresql://u:@&@%23Zq9xK7wV?%@?h%79:5432/db";
    secrets_add_conninfo(url);
    char masked[256];
    log_mask_conninfo(url, masked, sizeof(masked));
    secrets_scrub(masked);
    if (strstr(masked, "Zq9xK7wV"))
        fail_msg("masked and scrubbed, %s still shows the password: %s", url, masked);
    /* A password that every reading ends alike is not cut into words scrubbed everywhere. */
    secrets_clear();
    secrets_add_conninfo("postgresql://u:correct:horse:battery@h/db");
    assert_scrubbed("horse correct:horse:battery", "horse ***");
}

/* Random connection strings around a secret, through what the relay shows of one: a refusal at
 * start-up (db_check_conninfo), the masked string, each host as logged, and the connect errors
 * quoting it (the relay's lookup, libpq's "connection to server at"), each scrubbed as the log
 * scrubs it. A leak is 4 characters of the secret in a row; the secret counts as a password
 * where libpq reads it as one, or where a URL's password runs to the last '@' before the first
 * '/'. */
static uint64_t fuzz_state = 88172645463325252ULL;

static bool fuzz_intended(const char *ci)
{
    PQconninfoOption *opts = PQconninfoParse(ci, NULL);
    bool yes = false;
    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        yes = yes || (o->val && strstr(o->keyword, "password") && secret_text_shown(o->val));
    PQconninfoFree(opts);
    const char *auth = strstr(ci, "://");
    if (yes || !auth)
        return yes;
    auth += 3;
    /* the user info: to the last '@' before the first '/' (libpq's reading, a password holding
     * '?'), or before the first '?' (a password holding '/') */
    const char *sec = strstr(auth, SECRET_TEXT);
    const char *last = memrchr(auth, '@', strcspn(auth, "/"));
    const char *last_q = memrchr(auth, '@', strcspn(auth, "?"));
    if (last_q && (!last || last_q > last))
        last = last_q;
    const char *colon = last ? memchr(auth, ':', (size_t)(last - auth)) : NULL;
    return sec && colon && colon < sec && sec + strlen(SECRET_TEXT) <= last;
}

static void fuzz_random(char *out, unsigned maxlen)
{
    static const char chars[] = "@@@::://??#&&==%%,,'\"\\ aB1.2-5";
    static const char hex[] = "0123456789abcdefABCDEF";
    unsigned n = secret_text_next(&fuzz_state, maxlen + 1);
    for (unsigned i = 0; i < n; i++) {
        if (secret_text_next(&fuzz_state, 8) == 0) { /* a %XX escape, maybe cut short */
            out[i] = '%';
            if (i + 1 < n)
                out[++i] = hex[secret_text_next(&fuzz_state, sizeof(hex) - 1)];
            if (i + 1 < n)
                out[++i] = hex[secret_text_next(&fuzz_state, sizeof(hex) - 1)];
            continue;
        }
        out[i] = chars[secret_text_next(&fuzz_state, sizeof(chars) - 1)];
    }
    out[n] = '\0';
}

static int fuzz_leaks;

static void fuzz_see(const char *what, const char *ci, const char *text)
{
    char buf[2048];
    snprintf(buf, sizeof(buf), "%s", text);
    secrets_scrub(buf);
    if (secret_text_shown(buf) && fuzz_leaks++ < 5)
        print_message("leak (%s): %s shows %s\n", what, ci, buf);
}

static void test_random_strings_around_a_password(void **state)
{
    for (int t = 0; t < 100000; t++) {
        char r[6][16], ci[256], err[512], masked[512];
        for (int i = 0; i < 6; i++)
            fuzz_random(r[i], i < 4 ? 6 : 4);
        switch (secret_text_next(&fuzz_state, 7)) {
        case 3:
            snprintf(ci, sizeof(ci), "host=h%s password='%s%s%s' %s", r[0], r[1], SECRET_TEXT, r[2],
                     r[3]);
            break;
        case 4:
            snprintf(ci, sizeof(ci), "postgresql://u@h%s/db?password=%s%s%s&%s", r[0], r[1],
                     SECRET_TEXT, r[2], r[3]);
            break;
        case 5:
            snprintf(ci, sizeof(ci), "postgresql://u@h%s/db?%s%spassword=%s%s%s", r[0], r[4], r[5],
                     r[1], SECRET_TEXT, r[2]);
            break;
        case 6:
            snprintf(ci, sizeof(ci), "postgresql://%s:%s%s%s@h%s", r[0], r[1], SECRET_TEXT, r[2],
                     r[3]);
            break;
        case 0:
            snprintf(ci, sizeof(ci), "postgresql://u%s:%s%s%s@%sh%s:5432/db%s", r[0], r[1],
                     SECRET_TEXT, r[2], r[3], r[4], r[5]);
            break;
        case 1:
            snprintf(ci, sizeof(ci), "postgres://%s:%s%s%s@h%s/d?%s", r[0], r[1], SECRET_TEXT, r[2],
                     r[3], r[4]);
            break;
        default:
            snprintf(ci, sizeof(ci), "host=h%s password=%s%s%s %s", r[0], r[1], SECRET_TEXT, r[2],
                     r[3]);
            break;
        }
        if (!fuzz_intended(ci))
            continue;
        secrets_clear();
        secrets_add_conninfo(ci);
        if (!db_check_conninfo(ci, err, sizeof(err))) {
            fuzz_see("refused", ci, err);
            continue;
        }
        fuzz_see("masked", ci, log_mask_conninfo(ci, masked, sizeof(masked)));
        PgPlan plan = {0};
        if (pg_plan_make(&plan, ci, 30000, "test")) {
            for (int i = 0; i < plan.ntargets; i++) {
                const PgTarget *tg = &plan.targets[i];
                char line[1024], named[1024];
                fuzz_see("host", ci, tg->shown);
                if (!tg->addr.host)
                    continue;
                snprintf(line, sizeof(line), "could not translate host name \"%s\" to address",
                         tg->addr.host);
                db_hide_password_tail(line, ci);
                fuzz_see("lookup", ci, line);
                pg_error_name_host("connection to server at \"10.0.0.1\", port 5432 failed",
                                   tg->addr.host, named, sizeof(named));
                db_hide_password_tail(named, ci);
                fuzz_see("connect", ci, named);
            }
        }
        pg_plan_free(&plan);
    }
    assert_int_equal(fuzz_leaks, 0);
}

static void test_conninfo_query_password_with_blanks(void **state)
{
    /* libpq ends a URL query's value at '&' alone, and so does log_mask_conninfo. */
    const char *url = "postgresql://u@h/db?password=correct horse-battery&sslmode=disable";
    secrets_add_conninfo(url);
    char masked[256];
    log_mask_conninfo(url, masked, sizeof(masked));
    secrets_scrub(masked);
    assert_string_equal(masked, "postgresql://u@h/db?password=***&sslmode=disable");
    /* the whole value is the secret, not each of its words, which text everywhere may hold */
    assert_true(secrets_found("correct horse-battery"));
    assert_false(secrets_found("the checksum is correct"));
}

static void test_conninfo_keyword_form(void **state)
{
    /* a "://" in a key=value string is in some value, whose words are no password */
    secrets_add_conninfo("host=h application_name=x://app:relay-main@prod password=pw12345");
    assert_true(secrets_found("pw12345"));
    assert_false(secrets_found("relay-main"));
    secrets_add_conninfo("host=h dbname=d password='it\\'s a secret' sslpassword=keypass99");
    assert_scrubbed("keypass99", "***");
    assert_true(secrets_found("it's a secret"));   /* as libpq reads it */
    assert_true(secrets_found("it\\'s a secret")); /* as written */
    secrets_add_conninfo("postgresql://h/db?user=u&password=query-secret&sslmode=require");
    assert_scrubbed("query-secret", "***");
}

static void test_conninfo_unquoted_escape(void **state)
{
    /* "pw\ 9999" is one value to libpq; before, the raw text was cut at the blank, "pw\" (too
     * short to register), so libpq's echo of the string as written kept the password. The
     * string fails to parse (no '=' after "bogus"): only the raw text can be registered. */
    secrets_add_conninfo("host=h password=pw\\ 9999 bogus");
    assert_scrubbed("host=h password=pw\\ 9999 bogus", "host=h password=*** bogus");
}

static void test_conninfo_keyword_ampersand(void **state)
{
    /* "ab&cd-secret" is one key=value password; before, the raw text registered was "ab" (too
     * short), so once libpq refused the string (no '=' after "bogus") nothing covered it. */
    secrets_add_conninfo("host=h password=ab&cd-secret bogus");
    assert_scrubbed("password=ab&cd-secret", "password=***");
}

static void test_conninfo_url_encoded_name(void **state)
{
    /* libpq decodes "%70assword" to password; the string fails to parse (bad encoding in the
     * value) and libpq echoes the token, so the raw text must be registered. */
    secrets_add_conninfo("postgresql://h/db?%70assword=hunter22%zz&sslmode=require");
    assert_scrubbed("invalid percent-encoded token: \"hunter22%zz\"",
                    "invalid percent-encoded token: \"***\"");
}

static void test_kafka_keys(void **state)
{
    const char *sensitive[] = {
        "sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem",
        "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret", "ssl_key",
        /* librdkafka 2.10's JWT bearer assertion: its private key and the key's passphrase */
        "sasl.oauthbearer.assertion.private.key.pem",
        "sasl.oauthbearer.assertion.private.key.passphrase"};
    const char *plain[] = {"sasl.username",
                           "linger.ms",
                           "security.protocol",
                           "ssl.ca.location",
                           "bootstrap.servers",
                           "ssl.certificate.pem",
                           "sasl.oauthbearer.assertion.claim.sub"};
    for (size_t i = 0; i < sizeof(sensitive) / sizeof(sensitive[0]); i++)
        if (!secrets_kafka_key_sensitive(sensitive[i]))
            fail_msg("%s should be sensitive", sensitive[i]);
    for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
        if (secrets_kafka_key_sensitive(plain[i]))
            fail_msg("%s should not be sensitive", plain[i]);
}

static void test_add_config(void **state)
{
    OptPair props[] = {{(char *)"sasl.username", (char *)"relay-user"},
                       {(char *)"sasl.password", (char *)"kafka-secret"}};
    Config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.database_url = (char *)"postgresql://u:db-secret@h/db";
    cfg.kafka = (OptList){props, 2};
    config_register_secrets(&cfg);
    assert_scrubbed("db-secret kafka-secret relay-user", "*** *** relay-user");
}

static void test_log_quote_scrubs_before_escaping(void **state)
{
    /* Escaped, a secret holding a quote would no longer match; cut, part of it could remain. */
    secrets_add("pa\"ss\\word");
    char out[64];
    log_quote("error: pa\"ss\\word rejected", out, sizeof(out));
    assert_string_equal(out, "\"error: *** rejected\"");
    secrets_add("0123456789abcdef");
    char small[16];
    log_quote("xx 0123456789abcdef", small, sizeof(small));
    assert_null(strstr(small, "0123"));
}

static void write_lines(void)
{
    log_set_level(LOG_INFO);
    log_info("login as hunter22 failed", "detail=%s", "unquoted hunter22 here");
}

/* What write() writes to stderr, as a string the caller frees. */
static char *stderr_of(void (*write)(void))
{
    char path[] = "/tmp/outbox-relay-test-secrets-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    write();
    fflush(stderr);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    off_t size = lseek(fd, 0, SEEK_END);
    char *text = calloc((size_t)size + 1, 1);
    assert_non_null(text);
    assert_int_equal(pread(fd, text, (size_t)size, 0), size);
    close(fd);
    unlink(path);
    return text;
}

static void test_log_write_scrubs(void **state)
{
    secrets_add("hunter22");
    char *text = stderr_of(write_lines);
    bool shown = strstr(text, "hunter22") != NULL,
         scrubbed = strstr(text, "msg=\"login as *** failed\" detail=unquoted *** here") != NULL;
    free(text);
    assert_false(shown);
    assert_true(scrubbed);
}

static void write_cut_lines(void)
{
    log_set_level(LOG_INFO);
    char pad[2100];
    for (size_t n = 1950; n < 2060; n++) {
        memset(pad, 'p', n);
        pad[n] = '\0';
        log_info("m", "pad=%s error=%s", pad, "unquoted hunter22-long-secret");
    }
}

/* A line longer than log_write's buffer is cut; a secret in an unquoted field that spans the
 * cut was scrubbed only after it, so its start ("hunter22-lon") stayed in the line. */
static void test_log_write_scrubs_before_cutting(void **state)
{
    secrets_add("hunter22-long-secret");
    char *text = stderr_of(write_cut_lines);
    char shown[64] = "";
    const char *part = strstr(text, "hunter");
    if (part)
        snprintf(shown, sizeof(shown), "%.40s", part - 20);
    bool scrubbed = strstr(text, "error=unquoted ***") != NULL;
    free(text);
    if (part)
        fail_msg("a cut line shows part of the secret: ...%s", shown);
    assert_true(scrubbed);
}

/* The demos' command line (secrets_scrub_argv): the whole value of a connection-string option,
 * in both spellings; a sensitive --kafka property's value; any registered secret elsewhere;
 * nothing else (a switch takes no value: the argument after it is judged on its own). */
static void test_scrub_argv(void **state)
{
    (void)state;
    static const OptDef defs[] = {
        {.name = "database-url", .type = OPT_STRING}, {.name = "redis-url", .type = OPT_STRING},
        {.name = "kafka", .type = OPT_LIST},          {.name = "topic", .type = OPT_STRING},
        {.name = "json", .type = OPT_BOOL},
    };
    const OptSpec spec = {.prog = "demo", .opts = defs, .nopts = sizeof(defs) / sizeof(defs[0])};
    char a0[] = "demo", a1[] = "run", a2[] = "--database-url",
         a3[] = "postgresql://u:argv-s3cret@h/db", a4[] = "--redis-url=redis://h:6379/0",
         a5[] = "--kafka", a6[] = "sasl.password=kafka-s3cret", a7[] = "--kafka=client.id=c1",
         a8[] = "--json", a9[] = "--topic", a10[] = "t-argv-s3cret-x";
    char *argv[] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, NULL};
    int argc = 11;
    size_t lens[11];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    secrets_add_conninfo(a3);
    static const char *const whole[] = {"database-url", "redis-url", NULL};
    secrets_scrub_argv(&spec, argc, argv, whole, NULL);
    assert_string_equal(argv[0], "demo");
    assert_string_equal(argv[1], "run");
    assert_string_equal(argv[2], "--database-url");
    assert_string_equal(argv[3], "***");
    assert_string_equal(argv[4], "--redis-url=***");
    assert_string_equal(argv[6], "sasl.password=***");
    assert_string_equal(argv[7], "--kafka=client.id=c1");
    assert_string_equal(argv[8], "--json");
    assert_string_equal(argv[10], "t-***-x");
    /* The argument area keeps its layout: each string's bytes are overwritten, not moved. */
    for (int i = 0; i < argc; i++)
        for (size_t j = strlen(argv[i]); j < lens[i]; j++)
            assert_int_equal(argv[i][j], '\0');
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, reset, reset)
    const struct CMUnitTest tests[] = {
        T(test_scrub),
        T(test_short_secrets_ignored),
        T(test_short_secrets_counted),
        T(test_longest_first),
        T(test_duplicates),
        T(test_conninfo_url),
        T(test_conninfo_url_bare_token),
        T(test_conninfo_url_at_in_path),
        T(test_conninfo_unparsable),
        T(test_conninfo_url_password_with_query_chars),
        T(test_conninfo_url_password_tail),
        T(test_conninfo_url_password_with_slash),
        T(test_conninfo_url_password_pieces),
        T(test_random_strings_around_a_password),
        T(test_conninfo_query_password_with_blanks),
        T(test_conninfo_keyword_form),
        T(test_conninfo_unquoted_escape),
        T(test_conninfo_keyword_ampersand),
        T(test_conninfo_url_encoded_name),
        T(test_kafka_keys),
        T(test_add_config),
        T(test_log_quote_scrubs_before_escaping),
        T(test_log_write_scrubs),
        T(test_log_write_scrubs_before_cutting),
        T(test_scrub_argv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
