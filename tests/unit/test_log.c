/* Unit tests for log.c: connection-string masking, value quoting, levels and the line format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "secret_text.h"

/* ---- log_mask_conninfo ----------------------------------------------------------------- */

static void assert_masked(const char *conninfo, const char *expected)
{
    char out[512];
    memset(out, 'Z', sizeof(out));
    const char *r = log_mask_conninfo(conninfo, out, sizeof(out));
    assert_ptr_equal(r, out);
    if (strcmp(out, expected) != 0)
        fail_msg("mask(\"%s\")\n  got      \"%s\"\n  expected \"%s\"", conninfo, out, expected);
    if (strstr(out, "secret") || strstr(out, "cret"))
        fail_msg("mask(\"%s\") leaks the password: \"%s\"", conninfo, out);
}

static void test_mask_url(void **state)
{
    assert_masked("postgresql://u:secret@h/db", "postgresql://u:***@h/db");
    assert_masked("postgres://relay:secret@db.example.com:5432/outbox",
                  "postgres://relay:***@db.example.com:5432/outbox");
    assert_masked("postgresql://:secret@h/db", "postgresql://:***@h/db");
    assert_masked("postgresql://u:secret@h", "postgresql://u:***@h");
}

static void test_mask_url_with_query(void **state)
{
    assert_masked("postgresql://u:secret@h:5432/db?sslmode=require&application_name=relay",
                  "postgresql://u:***@h:5432/db?sslmode=require&application_name=relay");
    assert_masked("postgresql://u:secret@h?connect_timeout=5",
                  "postgresql://u:***@h?connect_timeout=5");
}

static void test_mask_url_with_at_in_path(void **state)
{
    /* an '@' in the database name ends what looks like user info (over-masking is safe) */
    assert_masked("postgresql://u:secret@h/db@x", "postgresql://u:***@x");
    assert_masked("postgresql://u:secret@h/db?options=a@b", "postgresql://u:***@h/db?options=a@b");
    /* Text up to the last '@' before the query looks like user info and is masked from its
     * ':', whatever libpq makes of it: over-masking a port and database name is safe (a port
     * cannot be told from a password of digits holding a '/', "u:5432/pw@x"). */
    assert_masked("postgresql://h:5432/db@x", "postgresql://h:***@x");
}

/* From this review: an '@' in a registry URL's path (after the first '/', with no ':' before
 * it) was taken for the end of a bare token, so "http://h/p@th" showed "***@th" after its
 * "http:" and two slashes (and the host was registered as a secret). Only text holding a ':'
 * ("user:pass", either with a '/') lets an '@' after the first '/' end the user info. Fails on
 * the old code. */
static void test_mask_url_at_in_path_without_user_info(void **state)
{
    assert_masked("http://h/p@th", "http://h/p@th");
    assert_masked("https://reg.example/ccompat/x@y/subjects",
                  "https://reg.example/ccompat/x@y/subjects");
    assert_masked("http://[::1]/a@b", "http://[::1]/a@b");
    /* a token before the first '/' is still the user info, a later '@' the path's */
    assert_masked("http://TOKEN-secret@h/p@th", "http://***@h/p@th");
    /* the other side: a password holding '/' is still masked whole */
    assert_masked("http://u:pa/secret@h/x", "http://u:***@h/x");
    assert_masked("http://u/x:secret@h/x", "http://u/x:***@h/x");
    assert_masked("http://TOKEN-secret@h", "http://***@h");
    /* still over-masked (safe side): a port cannot be told from a password "8081/..." */
    assert_masked("http://h:8081/subjects/a@b", "http://h:***@b");
}

/* A '/' not percent-encoded in the password: libpq ends the user info at it and reads no
 * password (host "u", port "pa", database "ss@h/db"); before, the masker did the same and showed
 * the password. Anything up to the last '@' before the query is user info. */
static void test_mask_url_password_with_slash(void **state)
{
    assert_masked("postgresql://user:pa/secret@host/db", "postgresql://user:***@host/db");
    assert_masked("postgres://u:se/cr/et@h:5432/db?sslmode=require&application_name=a@b",
                  "postgres://u:***@h:5432/db?sslmode=require&application_name=a@b");
    assert_masked("postgresql://u:a/b?secret@h/db", "postgresql://u:***@h/db");
    assert_masked("postgresql://u:a?b/secret@h", "postgresql://u:***@h");
    assert_masked("postgresql://u:a?x=1/secret@h/db", "postgresql://u:***@h/db");
    assert_masked("postgresql://u:p@x?a=secret@h", "postgresql://u:***@h");
    /* the other schemes the relay masks (a Schema Registry's URL) alike */
    assert_masked("http://u:pa/secret@registry:8081/x", "http://u:***@registry:8081/x");
    assert_masked("host=h password=x/secret", "host=h password=***");
}

static void test_mask_url_with_at_in_password(void **state)
{
    assert_masked("postgresql://u:secret@x@h/db", "postgresql://u:***@h/db");
}

/* libpq ends the user info at the first '@' before a '/', so '?' and '#' may be part of the
 * password; before, the masker stopped looking at them and showed the password. */
static void test_mask_url_password_with_query_chars(void **state)
{
    assert_masked("postgresql://u:sec?ret@h/db", "postgresql://u:***@h/db");
    assert_masked("postgresql://u:sec#ret@h:5432", "postgresql://u:***@h:5432");
    assert_masked("postgresql://u:a?b#c@h?sslmode=require", "postgresql://u:***@h?sslmode=require");
    /* no user info: a ':' and an '@' after a '/' are not one */
    assert_masked("postgresql://h/db?options=a:b@c", "postgresql://h/db?options=a:b@c");
}

/* In key=value form '&' is an ordinary character of a value: only a URL's query string
 * separates parameters with it. Before, the part after the '&' was shown. */
static void test_mask_keyword_value_with_ampersand(void **state)
{
    assert_masked("host=h password=ab&secret user=u", "host=h password=*** user=u");
    assert_masked("sslpassword=x&secret", "sslpassword=***");
    /* the query string: as before */
    assert_masked("postgresql://h/db?password=ab&sslmode=require",
                  "postgresql://h/db?password=***&sslmode=require");
}

/* libpq (conninfo_uri_parse_params) ends a query value at '&' alone: blanks, quotes and
 * backslashes belong to it. Before, the mask stopped at a blank and read quotes as keyword-form
 * quoting, and showed the rest of the password. */
static void test_mask_url_query_value_ends_at_ampersand(void **state)
{
    assert_masked("postgresql://u@h/db?password=correct horse-secret&sslmode=disable",
                  "postgresql://u@h/db?password=***&sslmode=disable");
    assert_masked("postgresql://u@h/db?password=''secret", "postgresql://u@h/db?password=***");
    assert_masked("postgresql://u@h/db?password='a b'secret&x=1",
                  "postgresql://u@h/db?password=***&x=1");
    assert_masked("postgresql://u@h/db?password=a\\ secret", "postgresql://u@h/db?password=***");
    assert_masked("postgresql://u@h/db?sslpassword=a\tsecret",
                  "postgresql://u@h/db?sslpassword=***");
}

/* libpq reads a string as a URL only when it starts with postgresql:// or postgres://; before,
 * any "://" made the mask read a key=value string as a URL, masking from a value's ':' to a
 * later '@' and never reaching the password pair, whose end was shown. */
static void test_mask_keyword_form_holding_scheme(void **state)
{
    assert_masked("host=h://:x password=,&@%eZsecret", "host=h://:x password=***");
    assert_masked("host=h dbname=a://b:c@d password=secret",
                  "host=h dbname=a://b:c@d password=***");
    assert_masked("application_name=x://y:z password='a@b secret'@c",
                  "application_name=x://y:z password=***@c");
    /* not at the very start: key=value form for libpq (which refuses it), masked as both */
    assert_masked(" postgresql://u:secret@h", " postgresql://u:***@h");
    /* another scheme (a Schema Registry URL): read as a URL and as pairs */
    assert_masked("http://reg:secret@h:8081", "http://reg:***@h:8081");
    assert_masked("https://h/x?password=se cret&y=1", "https://h/x?password=***&y=1");
    /* its user info without ':' is a token (an API key, a Redis token): masked whole; in
     * libpq's URL it is a user name, shown */
    assert_masked("http://APIKEY-secret@h:8081", "http://***@h:8081");
    assert_masked("redis://TOKEN-secret@h:6379/0", "redis://***@h:6379/0");
    assert_masked("https://a@b:@h", "https://a@b:***@h");
    assert_masked("postgresql://relay@h/db", "postgresql://relay@h/db");
    assert_masked("http://h:8081/x", "http://h:8081/x");
}

/* libpq's key=value reading: the next pair may follow a closing quote at once, and a pair may
 * come after a word without '=' (libpq refuses the string, which may still be logged). */
static void test_mask_keyword_form_as_libpq_reads_it(void **state)
{
    assert_masked("host='h'password=secret", "host='h'password=***");
    assert_masked("host=h oops password=secret", "host=h oops password=***");
    assert_masked("password='unclosed secret", "password=***");
    assert_masked("password=secret\\", "password=***");
}

/* libpq percent-decodes the names of query parameters, so these are passwords too; before,
 * only the literal name was looked for and these were shown. */
static void test_mask_url_query_encoded_name(void **state)
{
    assert_masked("postgresql://h/db?%70assword=secret&sslmode=require",
                  "postgresql://h/db?%70assword=***&sslmode=require");
    assert_masked("postgresql://h/db?sslmode=require&ssl%70ass%77ord=secret",
                  "postgresql://h/db?sslmode=require&ssl%70ass%77ord=***");
    assert_masked("postgresql://u:secret@h/db?%70assword=secret",
                  "postgresql://u:***@h/db?%70assword=***");
    /* other encoded names stay */
    assert_masked("postgresql://h/db?%75ser=u%20x", "postgresql://h/db?%75ser=u%20x");
}

static void test_mask_url_query_password(void **state)
{
    assert_masked("postgresql://h/db?password=secret&sslmode=require",
                  "postgresql://h/db?password=***&sslmode=require");
    assert_masked("postgresql://h/db?sslmode=require&password=secret",
                  "postgresql://h/db?sslmode=require&password=***");
    assert_masked("postgresql://u:secret@h/db?password=secret",
                  "postgresql://u:***@h/db?password=***");
}

/* The client key's passphrase too: before, it was shown as given (the secrets registry scrubs
 * only values of 4 characters or more, so "abc" reached the log). */
static void test_mask_sslpassword(void **state)
{
    assert_masked("host=h sslpassword=secret user=u", "host=h sslpassword=*** user=u");
    assert_masked("sslpassword = 'sec ret'", "sslpassword = ***");
    assert_masked("postgresql://u@h/db?sslmode=require&sslpassword=secret&x=1",
                  "postgresql://u@h/db?sslmode=require&sslpassword=***&x=1");
    assert_masked("postgresql://u:secret@h/db?sslpassword=secret",
                  "postgresql://u:***@h/db?sslpassword=***");
    /* Still only whole keys. */
    assert_masked("host=h nosslpassword=x", "host=h nosslpassword=x");
}

static void test_mask_keyword_value(void **state)
{
    assert_masked("password=secret", "password=***");
    assert_masked("host=h password=secret dbname=d", "host=h password=*** dbname=d");
    assert_masked("host=h user=u password=secret", "host=h user=u password=***");
    assert_masked("host=h password = secret dbname=d", "host=h password = *** dbname=d");
}

static void test_mask_keyword_value_quoted(void **state)
{
    assert_masked("host=h password = 'se cret' user=u", "host=h password = *** user=u");
    assert_masked("password='secret'", "password=***");
    /* escaped quote and escaped backslash inside the quotes */
    assert_masked("password='se\\'cret' user=u", "password=*** user=u");
    assert_masked("password='secret\\\\' user=u", "password=*** user=u");
}

static void test_mask_word_password_elsewhere(void **state)
{
    /* "password" as a value or inside another keyword is not a password field */
    assert_masked("host=h dbname=password user=u", "host=h dbname=password user=u");
    assert_masked("user=password password=secret", "user=password password=***");
    assert_masked("host=h application_name=password", "host=h application_name=password");
    assert_masked("host=h passwordx=1", "host=h passwordx=1");
}

static void test_mask_no_password_unchanged(void **state)
{
    const char *same[] = {"",
                          "host=localhost port=5432 dbname=outbox user=relay",
                          "postgresql://relay@h:5432/outbox?sslmode=require",
                          "postgresql://h/db",
                          "postgresql://u@[::1]:5432/db",
                          "postgresql:///outbox?host=/var/run/postgresql",
                          "service=outbox"};
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++)
        assert_masked(same[i], same[i]);
}

static void test_mask_null(void **state)
{
    char out[16] = "garbage";
    assert_ptr_equal(log_mask_conninfo(NULL, out, sizeof(out)), out);
    assert_string_equal(out, "");
}

/* libpq separates keyword=value pairs by any whitespace, so a tab or newline before
 * "password" must not hide it from the masker. */
static void test_mask_keyword_after_tab(void **state)
{
    assert_masked("host=h\tpassword=secret", "host=h\tpassword=***");
    assert_masked("host=h\npassword=secret", "host=h\npassword=***");
}

/* libpq honours backslash escapes in unquoted values ("se\\ cret" is one password): the
 * whole value is masked, not just up to the escaped space. */
static void test_mask_unquoted_escaped_space(void **state)
{
    assert_masked("password=se\\ cret host=h", "password=*** host=h");
}

static void test_mask_never_leaks(void **state)
{
    const char *inputs[] = {
        "postgresql://u:secret@h/db",
        "postgresql://u:secret@h:5432/db?sslmode=require",
        "postgresql://u:secret@h/db@x",
        "postgresql://h/db?password=secret&sslmode=require",
        "postgresql://h/db?x=1&password=secret",
        "password=secret",
        "host=h password=secret",
        "host=h password = 'se cret' user=u",
        "host=h password='se\\'cret'",
        "password=secret password=secret",
        "host=h password=secret password = 'secret' user=u",
    };
    for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
        char out[512];
        log_mask_conninfo(inputs[i], out, sizeof(out));
        if (strstr(out, "secret") || strstr(out, "cret") || !strstr(out, "***"))
            fail_msg("mask(\"%s\") = \"%s\"", inputs[i], out);
    }
}

/* Masking happens before the result is cut to the buffer, so a masked text that exactly fits
 * is kept whole. */
static void test_mask_fits_exact_buffer(void **state)
{
    char out[sizeof("host=h password=*** dbname=d")];
    log_mask_conninfo("host=h password=secret dbname=d", out, sizeof(out));
    assert_string_equal(out, "host=h password=*** dbname=d");
}

/* Masks conninfo into a heap buffer of exactly n bytes for every n from 1 to strlen + 8, each in
 * a child process so that an out-of-bounds write (ASan aborts the child) fails this test alone.
 * The password is upper case and nothing else is, so an upper-case letter in the output is a
 * leaked part of it. Fails listing every bad n; the first failure's details go to stderr. */
static void check_truncation(const char *conninfo)
{
    char bad[1024] = "";
    size_t used = 0;
    for (size_t n = 1; n <= strlen(conninfo) + 8; n++) {
        bool quiet = used > 0;
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            if (quiet && !freopen("/dev/null", "w", stderr))
                _exit(5);
            char *out = malloc(n);
            if (!out)
                _exit(4);
            log_mask_conninfo(conninfo, out, n);
            if (strnlen(out, n) == n) {
                fprintf(stderr, "outlen %zu: output not terminated\n", n);
                _exit(3);
            }
            for (const char *p = out; *p; p++) {
                if (isupper((unsigned char)*p)) {
                    fprintf(stderr, "outlen %zu: password leaked: \"%s\"\n", n, out);
                    _exit(2);
                }
            }
            free(out);
            _exit(0);
        }
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
            continue;
        const char *what = !WIFEXITED(status)         ? "signal"
                           : WEXITSTATUS(status) == 1 ? "sanitizer"
                           : WEXITSTATUS(status) == 2 ? "leak"
                           : WEXITSTATUS(status) == 3 ? "unterminated"
                                                      : "error";
        used += (size_t)snprintf(bad + used, sizeof(bad) - used, " %zu:%s", n, what);
        assert_true(used < sizeof(bad));
    }
    if (used > 0)
        fail_msg("masking \"%s\" into an outlen-byte buffer fails for outlen:%s", conninfo, bad);
}

/* ---- log_mask_conninfo against random strings around a password ------------------------ */

/* The mask alone (no registered secrets scrub what it leaves): random text around a password in
 * each form; whenever libpq reads a password (or sslpassword) holding part of the secret, or a
 * URL's password as meant (the user info's ':' to the last '@' before the first '/') holds it,
 * the masked string may show no 4 characters of it. */
static uint64_t mask_fuzz_state = 88172645463325252ULL;

static void mask_fuzz_random(char *out, unsigned maxlen)
{
    static const char chars[] = "@@@::://??#&&==%%,,''\"\\\\  \taB1.[]-5p";
    static const char *words[] = {
        "password=", "sslpassword=", "%70assword=", "host=", "://", "postgresql://", "'", "?", "&"};
    unsigned n = secret_text_next(&mask_fuzz_state, maxlen + 1), o = 0;
    for (unsigned i = 0; i < n && o < maxlen; i++) {
        if (secret_text_next(&mask_fuzz_state, 10) == 0) {
            const char *w =
                words[secret_text_next(&mask_fuzz_state, sizeof(words) / sizeof(words[0]))];
            size_t wl = strlen(w);
            if (o + wl > maxlen)
                break;
            memcpy(out + o, w, wl);
            o += (unsigned)wl;
        } else {
            out[o++] = chars[secret_text_next(&mask_fuzz_state, sizeof(chars) - 1)];
        }
    }
    out[o] = '\0';
}

static bool mask_fuzz_intended(const char *ci)
{
    PQconninfoOption *opts = PQconninfoParse(ci, NULL);
    bool yes = false;
    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        yes = yes || (o->val && strstr(o->keyword, "password") && secret_text_shown(o->val));
    PQconninfoFree(opts);
    if (yes || !opts)
        return yes;
    const char *auth = NULL;
    if (strncmp(ci, "postgresql://", 13) == 0)
        auth = ci + 13;
    else if (strncmp(ci, "postgres://", 11) == 0)
        auth = ci + 11;
    if (!auth)
        return false;
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

static void test_mask_random_strings_around_a_password(void **state)
{
    int leaks = 0, seen = 0;
    for (int t = 0; t < 200000; t++) {
        char r[4][24], ci[512], out[1024];
        for (int i = 0; i < 4; i++)
            mask_fuzz_random(r[i], 12);
        const char *S = SECRET_TEXT;
        switch (secret_text_next(&mask_fuzz_state, 9)) {
        case 0:
            snprintf(ci, sizeof(ci), "%s password=%s%s%s %s", r[0], r[1], S, r[2], r[3]);
            break;
        case 1:
            snprintf(ci, sizeof(ci), "%s password = '%s%s%s'%s", r[0], r[1], S, r[2], r[3]);
            break;
        case 2:
            snprintf(ci, sizeof(ci), "host=h%s sslpassword=%s%s%s%s", r[0], r[1], S, r[2], r[3]);
            break;
        case 3:
            snprintf(ci, sizeof(ci), "postgresql://u%s:%s%s%s@h%s", r[0], r[1], S, r[2], r[3]);
            break;
        case 4:
            snprintf(ci, sizeof(ci), "postgresql://u@h%s/db?%spassword=%s%s%s&%s", r[0], r[1], r[2],
                     S, r[3], r[0]);
            break;
        case 5:
            snprintf(ci, sizeof(ci), "postgres://%s@%s/d?x=1&%%70assword=%s%s%s", r[0], r[1], r[2],
                     S, r[3]);
            break;
        case 6:
            snprintf(ci, sizeof(ci), "postgresql://[%s]%s?sslpassword=%s%s%s", r[0], r[1], r[2], S,
                     r[3]);
            break;
        case 7:
            snprintf(ci, sizeof(ci), "%s%s password=%s%s%s", r[0], r[1], r[2], S, r[3]);
            break;
        default:
            snprintf(ci, sizeof(ci), "postgresql://%s:%s%s@%s/%s", r[0], r[1], S, r[2], r[3]);
            break;
        }
        if (!mask_fuzz_intended(ci))
            continue;
        seen++;
        log_mask_conninfo(ci, out, sizeof(out));
        if (secret_text_shown(out) && leaks++ < 5)
            print_message("leak: %s shows %s\n", ci, out);
    }
    print_message("%d strings with a password read, %d leaks\n", seen, leaks);
    assert_true(seen > 10000);
    assert_int_equal(leaks, 0);
}

/* A buffer smaller than the conninfo, cut anywhere around "password=": the result stays in
 * bounds (ASan checks) and never holds any part of the password. Same for the quoted and
 * query-string forms below. */
static void test_mask_truncated_keyword_in_bounds(void **state)
{
    check_truncation("host=h password=SECRETPW dbname=d");
}

/* As above, quoted form. */
static void test_mask_truncated_quoted_in_bounds(void **state)
{
    check_truncation("host=h password='SECRET PW' dbname=d");
}

/* As above, URL query form. */
static void test_mask_truncated_query_in_bounds(void **state)
{
    check_truncation("postgresql://h/db?sslmode=require&password=SECRETPW&x=y");
}

/* As above, URL userinfo form: a cut inside the userinfo must not expose the password's start. */
static void test_mask_truncated_url_no_leak(void **state)
{
    check_truncation("postgresql://u:SECRETPW@h/db");
}

/* ---- log_quote ------------------------------------------------------------------------- */

static void assert_quoted(const char *value, const char *expected)
{
    char out[256];
    assert_ptr_equal(log_quote(value, out, sizeof(out)), out);
    assert_string_equal(out, expected);
}

static void test_quote_plain(void **state)
{
    assert_quoted("hello", "\"hello\"");
    assert_quoted("with space", "\"with space\"");
    assert_quoted("", "\"\"");
    assert_quoted(NULL, "\"\"");
    assert_quoted("caf\xc3\xa9", "\"caf\xc3\xa9\"");
}

static void test_quote_escapes(void **state)
{
    assert_quoted("say \"hi\"", "\"say \\\"hi\\\"\"");
    assert_quoted("C:\\path", "\"C:\\\\path\"");
    assert_quoted("line1\nline2", "\"line1\\nline2\"");
    assert_quoted("a\tb\rc", "\"a\\x09b\\x0dc\"");
    assert_quoted("\x01\x1f\x7f", "\"\\x01\\x1f\\x7f\"");
    assert_quoted("\\\"", "\"\\\\\\\"\"");
}

static void test_quote_output_is_one_line(void **state)
{
    char in[64], out[512];
    for (int c = 1; c < 64; c++)
        in[c - 1] = (char)c;
    in[63] = '\0';
    log_quote(in, out, sizeof(out));
    for (const char *p = out; *p; p++)
        assert_true((unsigned char)*p >= 0x20 && (unsigned char)*p != 0x7f);
}

static void test_quote_truncates(void **state)
{
    char in[101], out[16];
    memset(in, 'a', 100);
    in[100] = '\0';
    log_quote(in, out, sizeof(out));
    assert_string_equal(out, "\"aaaaaaaaaa...\"");

    char big[512];
    log_quote(in, big, sizeof(big));
    assert_int_equal(strlen(big), 102);
    assert_null(strstr(big, "..."));
}

static void test_quote_truncation_keeps_escapes_whole(void **state)
{
    char out[16];
    log_quote("aaaaaaaaa\"bbbbbbb", out, sizeof(out));
    assert_string_equal(out, "\"aaaaaaaaa...\"");
    log_quote("aaaaaaaa\nbbbbbbb", out, sizeof(out));
    assert_string_equal(out, "\"aaaaaaaa\\n...\"");
    log_quote("aaaaaaa\x01zzzzzzz", out, sizeof(out));
    assert_string_equal(out, "\"aaaaaaa...\"");
}

static void test_quote_small_buffers(void **state)
{
    /* every size stays in bounds (heap buffers, so ASan sees a one-byte overrun) */
    const char *in = "a \"long\" value\nwith\\everything\x01";
    for (size_t n = 1; n < 64; n++) {
        char *out = malloc(n);
        assert_non_null(out);
        log_quote(in, out, n);
        assert_true(strnlen(out, n) < n);
        size_t len = strlen(out);
        if (len > 0) {
            assert_int_equal(out[0], '"');
            assert_int_equal(out[len - 1], '"');
            assert_true(len >= 2);
        }
        free(out);
    }
}

/* Issue 46: characters that end a line or rewrite a terminal for readers other than a byte-wise
 * one. U+0085 (NEL), U+2028/U+2029 split lines in Java, JavaScript and Unicode-aware log viewers;
 * C1 controls (0x9b is CSI) and ESC drive terminals; bidi overrides and isolates reorder what a
 * reader sees; invalid UTF-8 is read differently by each decoder. All leave log_quote escaped. */
static void test_quote_unicode_line_breaks_and_bidi(void **state)
{
    assert_quoted("a\xc2\x85level=error", "\"a\\u0085level=error\"");
    assert_quoted("a\xe2\x80\xa8"
                  "b\xe2\x80\xa9"
                  "c",
                  "\"a\\u2028b\\u2029c\"");
    assert_quoted("\xe2\x80\xae"
                  "gnp.exe",
                  "\"\\u202egnp.exe\"");
    assert_quoted("\xe2\x80\xaa\xe2\x81\xa6\xe2\x81\xa9", "\"\\u202a\\u2066\\u2069\"");
    assert_quoted("\xc2\x9b"
                  "31m",
                  "\"\\u009b31m\"");
    assert_quoted("\x1b]0;title\x07", "\"\\x1b]0;title\\x07\"");
    assert_quoted("zero\xe2\x80\x8bwidth", "\"zero\\u200bwidth\"");
    /* invalid UTF-8: a lone continuation byte, a cut sequence, an overlong '/', a surrogate */
    assert_quoted("a\x80"
                  "b",
                  "\"a\\x80b\"");
    assert_quoted("a\xe2\x80", "\"a\\xe2\\x80\"");
    assert_quoted("\xc0\xaf", "\"\\xc0\\xaf\"");
    assert_quoted("\xed\xa0\x80", "\"\\xed\\xa0\\x80\"");
    /* ordinary non-ASCII text stays readable */
    assert_quoted("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",
                  "\"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\"");
}

/* A cut never splits a multi-byte character (a reader would see invalid UTF-8). */
static void test_quote_cut_keeps_characters_whole(void **state)
{
    char out[16];
    log_quote("aaaaaaaaa\xe6\x97\xa5\xe6\x97\xa5", out, sizeof(out));
    assert_string_equal(out, "\"aaaaaaaaa...\"");
}

/* log_one_line leaves nothing a line-splitting reader or a terminal acts on. */
static void test_one_line_unicode(void **state)
{
    char s[] = "a\nb\x1b[31m\xc2\x85"
               "c\xe2\x80\xa8"
               "d\xe2\x80\xae"
               "e\xff";
    log_one_line(s);
    assert_string_equal(s, "a?b?[31m?c?d?e?");
}

/* log_escape: log_quote's escaping without the quotes, for a terminal (outbox-relay dead). */
static void test_escape_bare(void **state)
{
    char out[128];
    assert_string_equal(log_escape("say \"hi\"", out, sizeof(out)), "say \"hi\"");
    assert_string_equal(log_escape("a\\b\nc\x1b]0;t\x07", out, sizeof(out)),
                        "a\\\\b\\nc\\x1b]0;t\\x07");
    assert_string_equal(log_escape("x\xe2\x80\xa8y\xc2\x85z\xe2\x80\xae", out, sizeof(out)),
                        "x\\u2028y\\u0085z\\u202e");
    assert_string_equal(log_escape(NULL, out, sizeof(out)), "");
    char small[10];
    assert_string_equal(log_escape("abcdefghijklmnop", small, sizeof(small)), "abcdef...");
}

/* ---- levels ---------------------------------------------------------------------------- */

static void test_level_parse(void **state)
{
    LogLevel l = LOG_ERROR;
    assert_true(log_level_parse("debug", &l));
    assert_int_equal(l, LOG_DEBUG);
    assert_true(log_level_parse("info", &l));
    assert_int_equal(l, LOG_INFO);
    assert_true(log_level_parse("warn", &l));
    assert_int_equal(l, LOG_WARN);
    assert_true(log_level_parse("error", &l));
    assert_int_equal(l, LOG_ERROR);

    const char *bad[] = {"", "DEBUG", "Info", "warning", "err", "info ", " info", "fatal"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        l = LOG_WARN;
        if (log_level_parse(bad[i], &l))
            fail_msg("\"%s\" parsed as a level", bad[i]);
        assert_int_equal(l, LOG_WARN);
    }
}

static void test_level_names_round_trip(void **state)
{
    assert_string_equal(log_level_name(LOG_DEBUG), "debug");
    assert_string_equal(log_level_name(LOG_INFO), "info");
    assert_string_equal(log_level_name(LOG_WARN), "warn");
    assert_string_equal(log_level_name(LOG_ERROR), "error");
    for (LogLevel l = LOG_DEBUG; l <= LOG_ERROR; l++) {
        LogLevel back;
        assert_true(log_level_parse(log_level_name(l), &back));
        assert_int_equal(back, l);
    }
}

static void test_set_get_level(void **state)
{
    LogLevel saved = log_get_level();
    assert_int_equal(saved, LOG_INFO); /* the default */
    log_set_level(LOG_ERROR);
    assert_int_equal(log_get_level(), LOG_ERROR);
    log_set_level(saved);
}

/* ---- log_write ------------------------------------------------------------------------- */

/* Runs the writes with stderr redirected to a temporary file; returns what was written
 * (caller frees). */
static char *capture_stderr(void (*writes)(void))
{
    char path[] = "/tmp/outbox-relay-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    writes();
    fflush(stderr);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);

    off_t size = lseek(fd, 0, SEEK_END);
    assert_true(size >= 0);
    char *text = calloc((size_t)size + 1, 1);
    assert_non_null(text);
    assert_int_equal(pread(fd, text, (size_t)size, 0), size);
    close(fd);
    unlink(path);
    return text;
}

static void write_some(void)
{
    log_set_level(LOG_INFO);
    log_debug("hidden", "x=%d", 1);
    log_info("claimed batch", "rows=%d first_id=%lld", 3, 17LL);
    log_warn("say \"hi\"", NULL);
    log_error("plain", "code=%d", 7);
}

static void test_write_format_and_filter(void **state)
{
    char *text = capture_stderr(write_some);
    assert_null(strstr(text, "hidden"));

    const char *expect[] = {" level=info msg=\"claimed batch\" rows=3 first_id=17\n",
                            " level=warn msg=\"say \\\"hi\\\"\"\n",
                            " level=error msg=\"plain\" code=7\n"};
    const char *line = text;
    for (size_t i = 0; i < 3; i++) {
        /* 2024-01-02T03:04:05.678Z */
        int y, mo, d, h, mi, s, ms, used = 0;
        assert_int_equal(
            sscanf(line, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &y, &mo, &d, &h, &mi, &s, &ms, &used),
            7);
        assert_int_equal(used, 24);
        const char *rest = line + used;
        size_t len = strlen(expect[i]);
        if (strncmp(rest, expect[i], len) != 0)
            fail_msg("line %zu is \"%s\", expected the tail \"%s\"", i, line, expect[i]);
        line = rest + len;
    }
    assert_string_equal(line, "");
    free(text);
}

/* Values a caller puts into the fields without log_quote (an event id, a prepared transaction's
 * name) still cannot start a line of their own or reach the terminal raw. */
static void write_raw_fields(void)
{
    log_set_level(LOG_INFO);
    log_warn("dead", "event_id=%s gid=%s", "x\n2024-01-01T00:00:00.000Z level=error msg=\"forged\"",
             "g\x1b[2J\xe2\x80\xa8level=error\xc2\x85z");
}

static void test_write_escapes_raw_fields(void **state)
{
    char *text = capture_stderr(write_raw_fields);
    size_t len = strlen(text);
    assert_true(len > 0);
    assert_ptr_equal(strchr(text, '\n'), text + len - 1);
    assert_null(strchr(text, '\x1b'));
    assert_null(strstr(text, "\xe2\x80\xa8"));
    assert_null(strstr(text, "\xc2\x85"));
    assert_non_null(strstr(text, "event_id=x\\n2024"));
    assert_non_null(strstr(text, "gid=g\\x1b[2J\\u2028level=error\\u0085z"));
    free(text);
}

static void write_long(void)
{
    char big[4096];
    memset(big, 'v', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    log_error("long", "value=%s", big);
}

static void test_write_long_line_is_one_line(void **state)
{
    char *text = capture_stderr(write_long);
    size_t len = strlen(text);
    assert_true(len > 1000);
    assert_true(len <= 2048);
    assert_int_equal(text[len - 1], '\n');
    assert_ptr_equal(strchr(text, '\n'), text + len - 1);
    free(text);
}

/* A line cut at its limit stays key=value text: before, it could end inside a quoted value
 * (no closing quote: a logfmt reader took the rest as one value or dropped the line), and
 * nothing said it was cut. The field that crosses the limit keeps what fits, cut at a whole
 * escape, with "..." and its closing quote; " cut" marks the line. */
static char cut_value[3000];

static void write_cut_quoted(void)
{
    /* Each \x01 byte is escaped to the 4 characters \x01: a cut must not split one. */
    memset(cut_value, '\x01', sizeof(cut_value) - 1);
    cut_value[sizeof(cut_value) - 1] = '\0';
    char q[4 * sizeof(cut_value)];
    log_error("long", "a=1 value=%s", log_quote(cut_value, q, sizeof(q)));
}

/* Whether the quotes of a log line pair up: a quote after '=' opens a value, a backslash
 * escapes the next character inside one, and a quote closes it. */
static bool quotes_closed(const char *line)
{
    bool in = false;
    for (const char *p = line; *p; p++) {
        if (!in && *p == '"' && p > line && p[-1] == '=')
            in = true;
        else if (in && *p == '\\' && p[1])
            p++;
        else if (in && *p == '"')
            in = false;
    }
    return !in;
}

static void test_write_cut_inside_quoted_value(void **state)
{
    char *text = capture_stderr(write_cut_quoted);
    size_t len = strlen(text);
    assert_true(len <= 2047);
    assert_ptr_equal(strchr(text, '\n'), text + len - 1);
    text[len - 1] = '\0';
    assert_true(quotes_closed(text));
    const char *end = strstr(text, "...\" cut");
    assert_non_null(end);
    assert_ptr_equal(end + strlen("...\" cut"), text + len - 1);
    /* The kept part of the value is whole escapes: "\x01" repeated. */
    const char *v = strstr(text, " value=\"");
    assert_non_null(v);
    v += strlen(" value=\"");
    assert_true(end > v);
    assert_int_equal((end - v) % 4, 0);
    for (const char *p = v; p < end; p += 4)
        assert_memory_equal(p, "\\x01", 4);
    free(text);
}

static void write_cut_quoted_json(void)
{
    log_set_format(LOG_FORMAT_JSON);
    write_cut_quoted();
    log_set_format(LOG_FORMAT_TEXT);
}

static void test_write_cut_json_says_cut(void **state)
{
    char *text = capture_stderr(write_cut_quoted_json);
    size_t len = strlen(text);
    assert_true(len > 2);
    assert_int_equal(text[len - 1], '\n');
    text[len - 1] = '\0';
    assert_non_null(strstr(text, "\"a\":1,\"value\":\""));
    const char *tail = "...\",\"cut\":true}";
    assert_true(len - 1 > strlen(tail));
    assert_string_equal(text + len - 1 - strlen(tail), tail);
    free(text);
}

/* A key that crosses the limit is dropped (a bare word would read as another flag). */
static void write_cut_in_key(void)
{
    char pad[2100];
    memset(pad, 'p', sizeof(pad) - 1);
    pad[sizeof(pad) - 1] = '\0';
    pad[1900] = ' '; /* "pppp... pppp": the second word crosses the limit */
    log_error("long", "a=%s", pad);
}

static void test_write_cut_drops_a_cut_key(void **state)
{
    char *text = capture_stderr(write_cut_in_key);
    size_t len = strlen(text);
    assert_true(len <= 2047);
    text[len - 1] = '\0';
    const char *tail = "pp cut"; /* the first field whole, then the mark */
    assert_string_equal(text + strlen(text) - strlen(tail), tail);
    assert_null(strstr(text, "pp pp"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_url),
        cmocka_unit_test(test_mask_url_with_query),
        cmocka_unit_test(test_mask_url_with_at_in_path),
        cmocka_unit_test(test_mask_url_at_in_path_without_user_info),
        cmocka_unit_test(test_mask_url_password_with_slash),
        cmocka_unit_test(test_mask_url_with_at_in_password),
        cmocka_unit_test(test_mask_url_password_with_query_chars),
        cmocka_unit_test(test_mask_keyword_value_with_ampersand),
        cmocka_unit_test(test_mask_url_query_encoded_name),
        cmocka_unit_test(test_mask_url_query_password),
        cmocka_unit_test(test_mask_url_query_value_ends_at_ampersand),
        cmocka_unit_test(test_mask_keyword_form_holding_scheme),
        cmocka_unit_test(test_mask_keyword_form_as_libpq_reads_it),
        cmocka_unit_test(test_mask_sslpassword),
        cmocka_unit_test(test_mask_keyword_value),
        cmocka_unit_test(test_mask_keyword_value_quoted),
        cmocka_unit_test(test_mask_word_password_elsewhere),
        cmocka_unit_test(test_mask_no_password_unchanged),
        cmocka_unit_test(test_mask_null),
        cmocka_unit_test(test_mask_keyword_after_tab),
        cmocka_unit_test(test_mask_unquoted_escaped_space),
        cmocka_unit_test(test_mask_never_leaks),
        cmocka_unit_test(test_mask_fits_exact_buffer),
        cmocka_unit_test(test_mask_truncated_keyword_in_bounds),
        cmocka_unit_test(test_mask_truncated_quoted_in_bounds),
        cmocka_unit_test(test_mask_truncated_query_in_bounds),
        cmocka_unit_test(test_mask_truncated_url_no_leak),
        cmocka_unit_test(test_mask_random_strings_around_a_password),
        cmocka_unit_test(test_quote_plain),
        cmocka_unit_test(test_quote_unicode_line_breaks_and_bidi),
        cmocka_unit_test(test_quote_cut_keeps_characters_whole),
        cmocka_unit_test(test_one_line_unicode),
        cmocka_unit_test(test_escape_bare),
        cmocka_unit_test(test_write_escapes_raw_fields),
        cmocka_unit_test(test_quote_escapes),
        cmocka_unit_test(test_quote_output_is_one_line),
        cmocka_unit_test(test_quote_truncates),
        cmocka_unit_test(test_quote_truncation_keeps_escapes_whole),
        cmocka_unit_test(test_quote_small_buffers),
        cmocka_unit_test(test_level_parse),
        cmocka_unit_test(test_level_names_round_trip),
        cmocka_unit_test(test_set_get_level),
        cmocka_unit_test(test_write_format_and_filter),
        cmocka_unit_test(test_write_long_line_is_one_line),
        cmocka_unit_test(test_write_cut_inside_quoted_value),
        cmocka_unit_test(test_write_cut_json_says_cut),
        cmocka_unit_test(test_write_cut_drops_a_cut_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
