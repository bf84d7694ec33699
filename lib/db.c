#include "db.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <limits.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "secrets.h"
#include "strbuf.h"

static void first_line(const char *msg, char *out, size_t outlen);

const char *db_error_line(const char *message)
{
    static _Thread_local char line[512];
    first_line(message, line, sizeof(line));
    return line;
}

/* Copies the first line of a libpq message (they end in newlines, some span several). */
static void first_line(const char *msg, char *out, size_t outlen)
{
    const char *m = msg ? msg : "";
    size_t n = strcspn(m, "\n");
    if (n >= outlen)
        n = outlen - 1;
    memcpy(out, m, n);
    out[n] = '\0';
    if (n == 0)
        snprintf(out, outlen, "unknown error");
}

/* libpq's parse errors quote the text they stumbled on (missing "=" after "TEXT"), and the
 * string may not be a connection string at all: a --database-url-file pointed at a token file
 * would print the token. A token may itself hold a '"', so quotes cannot be paired in order (the
 * token tok"en showed as "..."en"): from each quote, the longest span up to a later quote, or to
 * the end of the line (first_line cut it inside a long token), whose text occurs in conninfo
 * becomes "...", in place (the line only shrinks). A one-character span ("=") stays, it says
 * what was expected. libpq quotes a URI's parts percent-decoded (tok%65n as "token"), so a span
 * in the decoded string is hidden too. libpq also quotes a URI's host list rebuilt (the hosts
 * with their ports cut off, joined by ','; "invalid percent-encoded token", "forbidden value
 * %00"), which occurs in neither: a span each of whose ','-separated pieces occurs in one of
 * them is the input too. Spans are tried shortest first: one not found ends the search (no
 * longer one, which starts with it, can be), so many quotes cost few searches. */
static bool is_input(char *span, const char *conninfo, const char *decoded)
{
    for (char *piece = span;;) {
        size_t len = strcspn(piece, ",");
        char saved = piece[len];
        piece[len] = '\0';
        bool found = !*piece || strstr(conninfo, piece) || (decoded && strstr(decoded, piece));
        piece[len] = saved;
        if (!found)
            return false;
        if (!saved)
            return true;
        piece += len + 1;
    }
}

/* A copy of the len bytes at s percent-decoded (NULL: out of memory). %00 stays as it is:
 * libpq refuses it, and a NUL would end the search text. */
static char *decoded_copy(const char *s, size_t len)
{
    char *decoded = malloc(len + 1);
    if (!decoded)
        return NULL;
    char *d = decoded;
    for (const char *p = s; p < s + len; p++) {
        unsigned v;
        int n = 0;
        if (*p == '%' && p + 2 < s + len && isxdigit((unsigned char)p[1]) &&
            isxdigit((unsigned char)p[2]) && sscanf(p + 1, "%2x%n", &v, &n) == 1 && n == 2 &&
            v != 0) {
            *d++ = (char)v;
            p += 2;
        } else {
            *d++ = *p;
        }
    }
    *d = '\0';
    return decoded;
}

static void free_secret(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s)); /* it may hold a password */
        free(s);
    }
}

/* only_at: hide only spans holding an '@', or lying in a URL's password as meant (db_connect's
 * errors, which must keep host names). The password as meant runs from the user info's ':' to
 * where secrets_url_userinfo_end ends it; when libpq ends the user info elsewhere (at an earlier
 * '@', or nowhere for a '/' in the password) it cuts the rest into hosts at ',' and ':', a port
 * and a database name ("u:x@s3cret,@@h": a host "s3cret", no '@' in it): a span found in that
 * text, as written or decoded, is hidden too. */
static void hide_quoted_input(char *line, const char *conninfo, bool only_at)
{
    char *decoded = strchr(conninfo, '%') ? decoded_copy(conninfo, strlen(conninfo)) : NULL;
    char *meant = NULL, *meant_decoded = NULL;
    const char *auth = only_at ? strstr(conninfo, "://") : NULL;
    if (auth) {
        auth += 3;
        const char *first_at = memchr(auth, '@', strcspn(auth, "/"));
        const char *last_at = secrets_url_userinfo_end(auth);
        const char *colon = last_at ? memchr(auth, ':', (size_t)(last_at - auth)) : NULL;
        if (colon && first_at != last_at) {
            meant = strndup(colon + 1, (size_t)(last_at - colon - 1));
            meant_decoded = decoded_copy(colon + 1, (size_t)(last_at - colon - 1));
        }
    }
    for (char *open = strchr(line, '"'); open;) {
        char *hide = NULL;
        for (char *close = open + 1;; close++) {
            if (*close != '"' && *close != '\0')
                continue;
            if (close - open - 1 > 1) {
                char saved = *close;
                *close = '\0';
                bool found = is_input(open + 1, conninfo, decoded);
                bool at = !only_at || strchr(open + 1, '@') || (meant && strstr(meant, open + 1)) ||
                          (meant_decoded && strstr(meant_decoded, open + 1));
                *close = saved;
                if (!found)
                    break;
                if (at)
                    hide = close;
            }
            if (*close == '\0')
                break;
        }
        if (!hide) {
            open = strchr(open + 1, '"');
            continue;
        }
        size_t len = (size_t)(hide - open - 1);
        size_t dots = len < 3 ? len : 3; /* never longer than what it replaces */
        memset(open + 1, '.', dots);
        memmove(open + 1 + dots, hide, strlen(hide) + 1);
        hide = open + 1 + dots;
        open = *hide ? strchr(hide + 1, '"') : NULL;
    }
    free_secret(decoded);
    free_secret(meant);
    free_secret(meant_decoded);
}

/* A password holding an unescaped '@' (postgresql://app:s3cr@t-pw@db/app) ends at the first '@'
 * for libpq, and its tail goes on as the host name, which connect errors quote ("could not
 * translate host name "t-pw@db""). Host names never hold an '@': such a span of the string is
 * hidden, while the host names an operator needs stay. */
const char *db_host_shown(const char *host)
{
    return host && strchr(host, '@') ? "..." : host;
}

void db_hide_password_tail(char *line, const char *conninfo)
{
    hide_quoted_input(line, conninfo ? conninfo : "", true);
}

/* Whether value is one of the NULL-terminated names. */
static bool one_of(const char *value, const char *const *names)
{
    for (size_t i = 0; names[i]; i++)
        if (strcmp(value, names[i]) == 0)
            return true;
    return false;
}

/* Entries of a comma-separated list ("a,b" 2, "" 1, as libpq counts hosts and ports). */
static size_t list_len(const char *list)
{
    size_t n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    return n;
}

/* A whole number as libpq reads one (fe-connect.c, parse_int_param): blanks around it, an
 * optional sign, and a value that fits an int. text is len bytes, not terminated. */
static bool libpq_int(const char *text, size_t len, long *out)
{
    char *buf = strndup(text, len); /* any length: leading zeros count for nothing */
    if (!buf)
        return false;
    const char *p = buf;
    while (isspace((unsigned char)*p))
        p++;
    char *end;
    errno = 0;
    long n = strtol(p, &end, 10);
    bool ok = end != p && !errno && n >= INT_MIN && n <= INT_MAX;
    while (ok && isspace((unsigned char)*end))
        end++;
    ok = ok && *end == '\0';
    free(buf);
    *out = n;
    return ok;
}

/* A port list: each entry empty (the default port) or a number from 1 to 65535. */
static bool ports_ok(const char *list)
{
    for (const char *p = list;; p++) {
        size_t len = strcspn(p, ",");
        long n;
        if (len > 0 && (!libpq_int(p, len, &n) || n < 1 || n > 65535))
            return false;
        p += len;
        if (*p == '\0')
            return true;
    }
}

/* A whole number, as libpq reads the integer settings (for connect_timeout, zero or negative is
 * no limit). */
static bool integer_ok(const char *value)
{
    long n;
    return libpq_int(value, strlen(value), &n);
}

/* Formats one line into err and returns false. */
static bool refuse(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool refuse(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return false;
}

/* The settings libpq reads as whole numbers (parse_int_param, or strtol for keepalives) when it
 * connects; a bad one fails every attempt of run for ever ("invalid integer value"). */
static const struct {
    const char *name, *what;
} integer_settings[] = {
    {"connect_timeout", "a whole number of seconds"},
    {"keepalives", "a whole number (1 on, 0 off)"},
    {"keepalives_idle", "a whole number of seconds"},
    {"keepalives_interval", "a whole number of seconds"},
    {"keepalives_count", "a whole number"},
    {"tcp_user_timeout", "a whole number of milliseconds"},
};

/* What an integer setting takes ("a whole number of seconds"), or NULL for another setting. */
static const char *integer_setting(const char *name)
{
    for (size_t i = 0; i < sizeof(integer_settings) / sizeof(integer_settings[0]); i++)
        if (strcmp(name, integer_settings[i].name) == 0)
            return integer_settings[i].what;
    return NULL;
}

/* The values libpq checks only when it connects (a bad one made run retry forever, and check say
 * "ok config" before failing): the ports, the whole numbers, and the settings whose values are a
 * fixed set. The error names the setting, never its value (the string may hold a password
 * anywhere). what names the source ("database URL", "service NAME"). skip (a service group's
 * check) is the string's parse, in the same keyword order: what it sets is not the file's to
 * judge, and the ports are not counted against hosts the string may give. */
static bool conninfo_values_ok(const PQconninfoOption *opts, const PQconninfoOption *skip,
                               const char *what, char *err, size_t errlen)
{
    static const char *const sslmodes[] = {"disable",   "allow",       "prefer", "require",
                                           "verify-ca", "verify-full", NULL};
    static const char *const gssencmodes[] = {"disable", "prefer", "require", NULL};
    static const char *const session_attrs[] = {"any",     "read-write",     "read-only", "primary",
                                                "standby", "prefer-standby", NULL};
    static const char *const channel_bindings[] = {"disable", "prefer", "require", NULL};
    const char *host = "", *hostaddr = "", *port = "";
    for (const PQconninfoOption *o = opts; o->keyword; o++) {
        const char *v = o->val, *k = o->keyword;
        if (!v || (skip && skip[o - opts].val))
            continue; /* skip: set in the string, which beats the service file */
        if (strcmp(k, "host") == 0)
            host = v;
        else if (strcmp(k, "hostaddr") == 0)
            hostaddr = v;
        else if (strcmp(k, "port") == 0)
            port = v;
        else if (strcmp(k, "sslmode") == 0 && !one_of(v, sslmodes))
            return refuse(err, errlen,
                          "%s: sslmode: expected disable, allow, prefer, require, "
                          "verify-ca or verify-full",
                          what);
        else if (strcmp(k, "gssencmode") == 0 && !one_of(v, gssencmodes))
            return refuse(err, errlen, "%s: gssencmode: expected disable, prefer or require", what);
        else if (strcmp(k, "target_session_attrs") == 0 && !one_of(v, session_attrs))
            return refuse(err, errlen,
                          "%s: target_session_attrs: expected any, read-write, "
                          "read-only, primary, standby or prefer-standby",
                          what);
        else if (strcmp(k, "channel_binding") == 0 && !one_of(v, channel_bindings))
            return refuse(err, errlen, "%s: channel_binding: expected disable, prefer or require",
                          what);
        else if (integer_setting(k) && !integer_ok(v))
            return refuse(err, errlen, "%s: %s: expected %s", what, k, integer_setting(k));
    }
    if (!*port)
        return true;
    if (!ports_ok(port))
        return refuse(err, errlen,
                      "%s: port: expected a number from 1 to 65535, or a "
                      "comma-separated list of them (one per host)",
                      what);
    /* libpq pairs a list of ports with the hosts one to one (with hostaddr's, when given).
     * Counted only against hosts the string gives: without them libpq takes the hosts from a
     * service file or PGHOST, which the parse does not apply. */
    size_t n_ports = list_len(port), n_hosts = list_len(*hostaddr ? hostaddr : host);
    if (n_ports > 1 && n_ports != n_hosts && (*host || *hostaddr) && !skip)
        return refuse(err, errlen, "%s: %zu ports for %zu hosts: give one port, or one per host",
                      what, n_ports, n_hosts);
    return true;
}

/* A service's group, read whole for service_values_ok. */
typedef struct ServiceGroup {
    StrBuf text;   /* as a connection string: key='value' ..., each key once (the first) */
    StrBuf seen;   /* the keys given so far, each between newlines */
    char bad[400]; /* a line libpq refuses, said without its text (it may hold a password) */
    bool unopened; /* bad says which file libpq cannot open, no entry of it */
} ServiceGroup;

static bool service_read(const char *service, const char *keyword, char **out, ServiceGroup *all);

/* The group of the service the string names (service=, else PGSERVICE), checked as the string
 * is: libpq fills in from it what the string leaves unset, so a bad value there (port=abc) or a
 * line libpq cannot read failed every attempt of run for ever, after a start-up check that
 * passed. What the string sets is not judged (it wins). A service in no file passes: libpq's
 * own error ("definition of service not found") says so at the first attempt. The error names
 * the service and the setting, never a value (the file may hold a password). */
static bool service_values_ok(const PQconninfoOption *opts, char *err, size_t errlen)
{
    const char *service = getenv("PGSERVICE");
    for (const PQconninfoOption *o = opts; o->keyword; o++)
        if (strcmp(o->keyword, "service") == 0 && o->val)
            service = o->val;
    ServiceGroup g = {0};
    StrBuf group = {0};
    bool in_file = service_read(service, NULL, NULL, &g);
    group = g.text;
    strbuf_free(&g.seen);
    if (!in_file) {
        strbuf_free(&group);
        return true;
    }
    char what[100];
    snprintf(what, sizeof(what), "service %.60s", service);
    char *why = NULL;
    PQconninfoOption *file = g.bad[0] ? NULL : PQconninfoParse(group.s ? group.s : "", &why);
    bool ok;
    if (g.bad[0]) {
        ok = refuse(err, errlen, "%s: %s%s", what,
                    g.unopened ? "" : "invalid service file entry: ", g.bad);
    } else if (!file) {
        char line[256];
        first_line(why ? why : "out of memory", line, sizeof(line));
        hide_quoted_input(line, group.s ? group.s : "", false);
        ok = refuse(err, errlen, "%s: invalid service file entry: %s", what, line);
    } else {
        ok = conninfo_values_ok(file, opts, what, err, errlen);
    }
    PQfreemem(why);
    secrets_conninfo_free(file);
    if (group.s)
        explicit_bzero(group.s, strlen(group.s)); /* it may hold a password */
    strbuf_free(&group);
    return ok;
}

/* Where db_effective_value found a value, for an error: "the URL", or its "service NAME" or
 * environment variable. */
static const char *source_name(const char *from)
{
    return *from ? from : "the URL";
}

/* The host, hostaddr and port lists libpq pairs one to one, each as libpq takes it (the string's,
 * else its service file's, else PGHOST, PGHOSTADDR, PGPORT): a host list and a hostaddr list of
 * other lengths, or a port list of neither one entry nor one per host, fail every attempt
 * ("could not match 2 host names to 1 hostaddr values"), so run retried for ever after a
 * start-up check that passed; the string's own ports were counted against its own hosts only.
 * So does a hostaddr entry that is not a numeric address. The error names the lists' sources,
 * never their values. */
static bool host_lists_ok(const PQconninfoOption *opts, char *err, size_t errlen)
{
    static const char *const keys[][2] = {
        {"host", "PGHOST"}, {"hostaddr", "PGHOSTADDR"}, {"port", "PGPORT"}};
    char *v[3] = {NULL, NULL, NULL}, from[3][80];
    size_t n[3];
    for (size_t i = 0; i < 3; i++) {
        from[i][0] = '\0';
        (void)db_effective_value(opts, keys[i][0], keys[i][1], &v[i], from[i], sizeof(from[i]));
        n[i] = v[i] && *v[i] ? list_len(v[i]) : 0; /* libpq ignores an empty one */
    }
    size_t hosts = n[1] ? n[1] : n[0] ? n[0] : 1;
    bool ok = true;
    if (n[0] && n[1] && n[0] != n[1])
        ok = refuse(err, errlen,
                    "database URL: %zu hosts (from %s) for %zu hostaddr values (from %s): give "
                    "one hostaddr per host",
                    n[0], source_name(from[0]), n[1], source_name(from[1]));
    else if (n[2] > 1 && n[2] != hosts)
        ok = refuse(err, errlen,
                    "database URL: %zu ports (from %s) for %zu hosts (from %s): give one port, "
                    "or one per host",
                    n[2], source_name(from[2]), hosts,
                    n[1]   ? source_name(from[1])
                    : n[0] ? source_name(from[0])
                           : "the default");
    /* Each hostaddr entry as libpq reads it (getaddrinfo with AI_NUMERICHOST, which asks no
     * nameserver): one it cannot parse ("could not parse network address") fails that host's
     * every attempt. An empty entry is fine: that position's host name is used. */
    for (size_t i = 0, at = 0; ok && n[1] && i < n[1]; i++) {
        size_t len = strcspn(v[1] + at, ",");
        char one[128];
        struct addrinfo hints = {.ai_flags = AI_NUMERICHOST,
                                 .ai_family = AF_UNSPEC,
                                 .ai_socktype = SOCK_STREAM},
                        *ai = NULL;
        if (len > 0) {
            snprintf(one, sizeof(one), "%.*s", (int)(len < sizeof(one) ? len : sizeof(one) - 1),
                     v[1] + at);
            if (len >= sizeof(one) || getaddrinfo(one, NULL, &hints, &ai) != 0)
                ok = refuse(err, errlen,
                            "database URL: hostaddr (from %s): entry %zu is not a numeric IP "
                            "address (a name goes in host)",
                            source_name(from[1]), i + 1);
            if (ai)
                freeaddrinfo(ai);
        }
        at += len + 1;
    }
    for (size_t i = 0; i < 3; i++)
        free(v[i]);
    return ok;
}

bool db_check_conninfo(const char *conninfo, char *err, size_t errlen)
{
    char *why = NULL;
    PQconninfoOption *opts = PQconninfoParse(conninfo, &why);
    if (!opts) {
        char line[256];
        first_line(why ? why : "out of memory", line, sizeof(line));
        hide_quoted_input(line, conninfo, false);
        snprintf(err, errlen, "database URL: invalid connection string: %s", line);
        PQfreemem(why);
        return false;
    }
    bool ok = conninfo_values_ok(opts, NULL, "database URL", err, errlen) &&
              service_values_ok(opts, err, errlen) && host_lists_ok(opts, err, errlen) &&
              db_check_files(opts, err, errlen);
    secrets_conninfo_free(opts);
    return ok;
}

/* Why a file libpq opens itself is refused (db_check_files, and the service file's own read):
 * said by run and by the commands (db_check_conninfo), so true of each: the event loop is run's,
 * and a command's connection is made on none. */
#define DB_NOT_REGULAR                                                                             \
    "not a regular file or a directory (libpq opens it at every connection, and a pipe's, "        \
    "device's or socket's open could wait without end: on the running relay's event loop, or "     \
    "past every bound of a command)"

#ifndef PG_SYSCONFDIR
#define PG_SYSCONFDIR "/etc/postgresql-common" /* Debian's; the Makefile sets libpq's own */
#endif

/* One service file, read as libpq reads it (fe-connect.c, parseServiceFile): lines with blanks in
 * front skipped over, blank lines and "#" comments ignored, "[NAME]" opening a group, "key=value"
 * inside it (nothing trimmed around the "=", trailing blanks dropped). Sets *found when the group
 * is in the file (libpq then reads no other file) and copies keyword's value into out. from_env:
 * the file is PGSERVICEFILE's. */
static bool service_file_value(const char *path, const char *service, const char *keyword,
                               char **out, ServiceGroup *all, bool *found, bool from_env)
{
    /* Without blocking, and a regular file only: libpq opens the file at every connection (on
     * the relay's event loop), where a FIFO's open or read would stop it (db_check_files). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        /* libpq's fopen of a directory succeeds and its first fgets fails: it reads the file as
         * empty (no group there) and goes on to the next file. So does this. */
        close(fd);
        return false;
    }
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        *found = true;
        if (all && !all->bad[0]) {
            all->unopened = true;
            snprintf(all->bad, sizeof(all->bad), "service file \"%.120s\"%s: %s", path,
                     from_env ? " (from PGSERVICEFILE)" : "", DB_NOT_REGULAR);
        }
        return all != NULL;
    }
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (fd >= 0 && !f)
        close(fd);
    if (!f && (from_env || stat(path, &st) == 0)) {
        /* libpq opens PGSERVICEFILE's file whether or not it exists, the others when they exist,
         * and one it cannot open fails every connection ("service file not found"), no further
         * file read: the check fell back to the system file and passed. */
        int saved = errno;
        *found = true;
        if (all && !all->bad[0]) {
            all->unopened = true;
            snprintf(all->bad, sizeof(all->bad), "service file \"%.120s\"%s: %s", path,
                     from_env ? " (from PGSERVICEFILE)" : "", strerror(saved));
        }
        return all != NULL;
    }
    if (!f)
        return false;
    char line[1024]; /* libpq's buffer, whose size sets the limit below */
    bool in_group = false, got = false, too_long = false;
    size_t slen = strlen(service);
    unsigned long line_no = 0;
    while (!got && fgets(line, sizeof(line), f)) {
        line_no++;
        size_t n = strlen(line);
        if (n >= sizeof(line) - 1) {
            /* libpq (15, Debian's) reads each line into 1024 bytes and refuses one that fills them,
             * wherever it is in what it reads, comments and other groups too: "line N too long
             * in service file", and every connection fails. Read on here, the rest of the line
             * was taken for a line of its own. Refused here too, and nothing further read. */
            if (all && !all->bad[0])
                snprintf(all->bad, sizeof(all->bad),
                         "line %lu: longer than libpq reads (1022 bytes with its newline)",
                         line_no);
            *found = true; /* libpq reads no further file either */
            too_long = true;
            break;
        }
        while (n > 0 && isspace((unsigned char)line[n - 1]))
            line[--n] = '\0';
        const char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '\0' || *p == '#')
            continue;
        if (*p == '[') {
            if (in_group)
                break; /* the group is over */
            in_group = strncmp(p + 1, service, slen) == 0 && p[slen + 1] == ']';
            *found = *found || in_group;
            continue;
        }
        const char *eq = strchr(p, '=');
        if (in_group && all) {
            /* As a connection string: key='value', quotes and backslashes escaped; a line
             * without "=" as it is, for the parse to refuse as libpq refuses the file. libpq
             * takes a key's first value (it never overrides one set), where the parse would take
             * the last: a key given again is left out. A key libpq cannot match, which the parse
             * would take (blanks before the "="), or a nested service=, is refused here. */
            if (all->bad[0])
                continue;
            /* libpq takes a group's line that starts with "ldap" for an LDAP URL to fetch the
             * settings from, a blocking network call inside PQconnectStart, on the relay's event
             * loop (the parse refused it too, in words that did not say why). */
            if (strncmp(p, "ldap", 4) == 0) {
                snprintf(all->bad, sizeof(all->bad),
                         "line %lu: an LDAP lookup is not supported (libpq would make it on the "
                         "relay's event loop); put the settings in the file",
                         line_no);
                continue;
            }
            if (!eq) {
                strbuf_puts(&all->text, " ");
                strbuf_puts(&all->text, p);
                continue;
            }
            size_t klen = (size_t)(eq - p);
            bool blank = klen == 0;
            for (size_t k = 0; k < klen; k++)
                blank = blank || isspace((unsigned char)p[k]);
            if (blank || (klen == 7 && strncmp(p, "service", 7) == 0)) {
                snprintf(all->bad, sizeof(all->bad), "line %lu: %s", line_no,
                         blank ? "expected key=value, no blanks before the \"=\""
                               : "a nested service= is not supported");
                continue;
            }
            strbuf_puts(&all->seen, "\n");
            size_t mark = all->seen.len;
            strbuf_append(&all->seen, p, klen);
            strbuf_puts(&all->seen, "\n");
            if (all->seen.s && memmem(all->seen.s, mark, all->seen.s + mark - 1, klen + 2))
                continue; /* given before: libpq keeps the first */
            strbuf_puts(&all->text, " ");
            strbuf_append(&all->text, p, klen);
            strbuf_puts(&all->text, "='");
            for (const char *v = eq + 1; *v; v++) {
                if (*v == '\'' || *v == '\\')
                    strbuf_puts(&all->text, "\\");
                strbuf_append(&all->text, v, 1);
            }
            strbuf_puts(&all->text, "'");
        } else if (in_group && eq && (size_t)(eq - p) == strlen(keyword) &&
                   strncmp(p, keyword, (size_t)(eq - p)) == 0) {
            *out = strdup(eq + 1); /* whole: a long options= is not cut */
            got = *out != NULL;
        }
    }
    fclose(f);
    return got || (all && (in_group || too_long));
}

/* The service files libpq reads, in its order: i 0 is PGSERVICEFILE's (*from_env set), else
 * ~/.pg_service.conf; i 1 the system's (PGSYSCONFDIR, else the compiled directory). False when
 * there is no such file to read (no home directory). */
static bool service_file_path(int i, char *path, size_t len, bool *from_env)
{
    const char *file = getenv("PGSERVICEFILE"), *home = getenv("HOME");
    *from_env = i == 0 && file;
    if (i == 1) {
        const char *dir = getenv("PGSYSCONFDIR");
        snprintf(path, len, "%s/pg_service.conf", dir ? dir : PG_SYSCONFDIR);
        return true;
    }
    if (file) {
        snprintf(path, len, "%s", file);
        return true;
    }
    if (!home || !*home) {
        struct passwd *pw = getpwuid(geteuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (home)
        snprintf(path, len, "%s/.pg_service.conf", home);
    return home != NULL;
}

/* db_service_value, or with all the whole group as a connection string (keyword, out unused):
 * true when the group was found. */
static bool service_read(const char *service, const char *keyword, char **out, ServiceGroup *all)
{
    if (!service || !*service)
        return false;
    char path[4096];
    bool found = false, from_env = false;
    if (service_file_path(0, path, sizeof(path), &from_env) &&
        service_file_value(path, service, keyword, out, all, &found, from_env))
        return true;
    if (found)
        return false; /* libpq reads no further file */
    service_file_path(1, path, sizeof(path), &from_env);
    return service_file_value(path, service, keyword, out, all, &found, false);
}

bool db_service_value(const char *service, const char *keyword, char *out, size_t outlen)
{
    char *value = NULL;
    if (!service_read(service, keyword, &value, NULL))
        return false;
    snprintf(out, outlen, "%s", value);
    explicit_bzero(value, strlen(value)); /* it may be a password */
    free(value);
    return true;
}

bool db_effective_value(const PQconninfoOption *opts, const char *keyword, const char *envvar,
                        char **out, char *from, size_t fromlen)
{
    const char *service = getenv("PGSERVICE");
    *out = NULL;
    for (const PQconninfoOption *o = opts; o && o->keyword; o++) {
        if (strcmp(o->keyword, "service") == 0 && o->val)
            service = o->val;
        if (strcmp(o->keyword, keyword) == 0 && o->val) {
            snprintf(from, fromlen, "%s", "");
            return (*out = strdup(o->val)) != NULL;
        }
    }
    if (service_read(service, keyword, out, NULL)) {
        snprintf(from, fromlen, "service %.60s", service);
        return true;
    }
    const char *env = envvar ? getenv(envvar) : NULL;
    if (env) {
        snprintf(from, fromlen, "%s", envvar);
        return (*out = strdup(env)) != NULL;
    }
    return false;
}

/* Elements in a comma-separated list ("" has one, NULL none). */
static int hosts_list_count(const char *list)
{
    return list ? (int)list_len(list) : 0;
}

/* Element i of a list for host i: NULL for no list, the whole list when it is not split (split
 * false) or has one element (a single port applies to every host, as in libpq). */
static bool hosts_list_item(const char *list, int i, bool split, char **out)
{
    *out = NULL;
    if (!list)
        return true;
    if (!split || hosts_list_count(list) == 1) {
        *out = strdup(list);
        return *out != NULL;
    }
    const char *p = list;
    for (; i > 0; i--)
        p = strchr(p, ',') + 1;
    *out = strndup(p, strcspn(p, ","));
    return *out != NULL;
}

int db_hosts_split(const char *host, const char *hostaddr, const char *port, DbHost **out)
{
    int nhost = hosts_list_count(host), naddr = hosts_list_count(hostaddr),
        nport = hosts_list_count(port);
    int n = nhost > naddr ? nhost : naddr;
    bool split = n > 1 && (nhost == 0 || nhost == n) && (naddr == 0 || naddr == n) &&
                 (nport <= 1 || nport == n);
    if (!split)
        n = 1;
    *out = calloc((size_t)n, sizeof(DbHost));
    if (!*out)
        return 0;
    for (int i = 0; i < n; i++) {
        DbHost *h = &(*out)[i];
        if (!hosts_list_item(host, i, split, &h->host) ||
            !hosts_list_item(hostaddr, i, split, &h->hostaddr) ||
            !hosts_list_item(port, i, split, &h->port)) {
            db_hosts_free(*out, n);
            *out = NULL;
            return 0;
        }
    }
    return n;
}

void db_hosts_free(DbHost *hosts, int n)
{
    for (int i = 0; hosts && i < n; i++) {
        free(hosts[i].host);
        free(hosts[i].hostaddr);
        free(hosts[i].port);
    }
    free(hosts);
}

/* The value libpq would connect with for keyword (db_effective_value); a copy in *out (NULL:
 * none). False only when out of memory. */
static bool effective_or_none(const PQconninfoOption *opts, const char *keyword, const char *envvar,
                              char **out)
{
    char from[80];
    if (db_effective_value(opts, keyword, envvar, out, from, sizeof(from)))
        return true;
    return *out == NULL && (!envvar || !getenv(envvar)); /* unset, or out of memory */
}

int db_hosts(const PQconninfoOption *opts, DbHost **out)
{
    /* The host, hostaddr and port come from all three places: a host that only the service file
     * names, left for libpq to fill in, would be looked up by libpq itself (for the relay's
     * connections, a getaddrinfo on the event loop), and paired with no port of the list. */
    char *host = NULL, *hostaddr = NULL, *port = NULL;
    int n = 0;
    *out = NULL;
    if (effective_or_none(opts, "host", "PGHOST", &host) &&
        effective_or_none(opts, "hostaddr", "PGHOSTADDR", &hostaddr) &&
        effective_or_none(opts, "port", "PGPORT", &port))
        n = db_hosts_split(host, hostaddr, port, out);
    free(host);
    free(hostaddr);
    free(port);
    return n;
}

const char *db_host_label(const DbHost *h, char *out, size_t outlen)
{
    const char *shown = h->host && *h->host ? db_host_shown(h->host)
                        : h->hostaddr       ? h->hostaddr
                                            : "(default)";
    /* An IPv6 address is bracketed, as in a URL: "::1:5432" reads as an address of its own. A
     * socket directory (an absolute path) is left as it is. */
    bool v6 = strchr(shown, ':') && shown[0] != '/' && shown[0] != '[';
    snprintf(out, outlen, v6 ? "[%s]:%s" : "%s:%s", shown, h->port ? h->port : "");
    return out;
}

/* The files libpq's TLS set-up opens (fe-secure-openssl.c, initialize_SSL), with their
 * environment variables and the defaults under the home directory taken when none is set. */
static const struct {
    const char *keyword, *envvar, *home_default;
} tls_files[] = {
    {"sslrootcert", "PGSSLROOTCERT", ".postgresql/root.crt"},
    {"sslcert", "PGSSLCERT", ".postgresql/postgresql.crt"},
    {"sslkey", "PGSSLKEY", ".postgresql/postgresql.key"},
    {"sslcrl", "PGSSLCRL", ".postgresql/root.crl"},
};

/* Refuses path (named by what, from from) when it exists and is neither a regular file nor a
 * directory: a FIFO, a device or a socket, whose open or read can wait. A directory opens and
 * fails its read at once: libpq ignores an sslcrl directory (a CRL is optional) and names one
 * in another's place in its own connection error; refusing an sslcrl directory here would refuse
 * a configuration that connects. stat, not open: nothing is
 * read, and a device is not opened (an open may have effects of its own). */
static bool regular_or_absent(const char *path, const char *what, const char *from, char *err,
                              size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))
        return true;
    return refuse(err, errlen, "database URL: %s%s%s%s %s: %s", what, *from ? " (from " : "", from,
                  *from ? ")" : "", path, DB_NOT_REGULAR);
}

/* Whether any host libpq would try is reached over TCP, where it may set up TLS: an entry with a
 * hostaddr, or with a host that is not a Unix socket's directory ("/..." or "@..." abstract). An
 * empty host (and no hostaddr) is libpq's default socket directory. libpq never asks for TLS on
 * a Unix socket (PQconnectPoll clears allow_ssl_try there) and so opens no TLS file for it. */
static bool any_tcp_host(const PQconninfoOption *opts)
{
    char *host = NULL, *addr = NULL, from[80];
    (void)db_effective_value(opts, "host", "PGHOST", &host, from, sizeof(from));
    (void)db_effective_value(opts, "hostaddr", "PGHOSTADDR", &addr, from, sizeof(from));
    const char *h = host ? host : "", *a = addr ? addr : "";
    bool tcp = false;
    for (;;) {
        size_t hl = strcspn(h, ","), al = strcspn(a, ",");
        if (al > 0 || (hl > 0 && h[0] != '/' && h[0] != '@'))
            tcp = true;
        if (tcp || (!h[hl] && !a[al]))
            break;
        h += h[hl] ? hl + 1 : hl;
        a += a[al] ? al + 1 : al;
    }
    free(host);
    free(addr);
    return tcp;
}

/* Opens file (a regular file by its stat a moment ago) for pins without waiting, and records
 * its /proc/self/fd alias for keyword. True when pinned or left to libpq (it could not be opened,
 * or /proc is not mounted: libpq's own open then reports or takes it); false with err when it is
 * no longer a regular file (swapped since the stat). */
static bool pin_file(DbPins *pins, const char *keyword, const char *file, const char *where,
                     char *err, size_t errlen)
{
    int fd = open(file, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return true;
    struct stat st, via;
    int i = pins->n;
    snprintf(pins->alias[i], sizeof(pins->alias[i]), "/proc/self/fd/%d", fd);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        if (!regular_or_absent(file, keyword, where, err, errlen))
            return false;
        return refuse(err, errlen, "database URL: %s%s%s%s %s: %s", keyword,
                      *where ? " (from " : "", where, *where ? ")" : "", file, DB_NOT_REGULAR);
    }
    if (stat(pins->alias[i], &via) != 0 || via.st_dev != st.st_dev || via.st_ino != st.st_ino ||
        !(pins->path[i] = strdup(file))) {
        close(fd);
        return true;
    }
    pins->fd[i] = fd;
    pins->keyword[i] = keyword;
    pins->n++;
    return true;
}

void db_pins_close(DbPins *pins)
{
    for (int i = 0; i < pins->n; i++) {
        close(pins->fd[i]);
        free(pins->path[i]);
    }
    memset(pins, 0, sizeof(*pins));
}

void db_pins_text(const DbPins *pins, const char *text, char *out, size_t outlen)
{
    size_t o = 0;
    while (*text && o + 1 < outlen) {
        int hit = -1;
        for (int i = 0; i < pins->n && hit < 0; i++) {
            size_t alen = strlen(pins->alias[i]);
            /* "/proc/self/fd/1" must not match the start of "/proc/self/fd/12" */
            if (strncmp(text, pins->alias[i], alen) == 0 && !isdigit((unsigned char)text[alen]))
                hit = i;
        }
        if (hit < 0) {
            out[o++] = *text++;
            continue;
        }
        int n = snprintf(out + o, outlen - o, "%s", pins->path[hit]);
        o = n < 0 || (size_t)n >= outlen - o ? outlen - 1 : o + (size_t)n;
        text += strlen(pins->alias[hit]);
    }
    out[o < outlen ? o : outlen - 1] = '\0';
}

bool db_check_files(const PQconninfoOption *opts, char *err, size_t errlen)
{
    return db_check_files_pinned(opts, NULL, err, errlen);
}

bool db_check_files_pinned(const PQconninfoOption *opts, DbPins *pins, char *err, size_t errlen)
{
    if (pins)
        memset(pins, 0, sizeof(*pins));
    const char *service = getenv("PGSERVICE");
    for (const PQconninfoOption *o = opts; o && o->keyword; o++)
        if (strcmp(o->keyword, "service") == 0 && o->val)
            service = o->val;
    char path[4096];
    bool from_env = false, found = false;
    /* The first, then the system's only when libpq reads it: when the first lacks the group.
     * libpq stops at a first file that holds it (or that it cannot open, or with a line too
     * long), and never opens the system's then. The first is read here once it is known to be
     * no FIFO (and service_file_value opens it without blocking, in case it became one). An
     * empty name (service= or PGSERVICE set empty) is a service to libpq all the same: it skips
     * the files only when none is given, and reads them looking for "[]". */
    for (int i = 0; service && i < 2 && !found; i++) {
        if (!service_file_path(i, path, sizeof(path), &from_env))
            continue;
        if (!regular_or_absent(path, "service file", from_env ? "PGSERVICEFILE" : "", err, errlen))
            return false;
        char *unused = NULL; /* a keyword with "=" matches no line: only found is wanted */
        if (i == 0)
            (void)service_file_value(path, service, "=", &unused, NULL, &found, from_env);
        free(unused);
    }
    char *mode = NULL, from[80];
    bool tls = !db_effective_value(opts, "sslmode", "PGSSLMODE", &mode, from, sizeof(from)) ||
               strcmp(mode, "disable") != 0;
    free(mode);
    tls = tls && any_tcp_host(opts);
    /* The defaults under the home directory as libpq 15 finds it (pqGetHomeDirectory): HOME,
     * else the password database's. */
    const char *home = getenv("HOME");
    if (tls && (!home || !*home)) {
        struct passwd *pw = getpwuid(geteuid());
        home = pw ? pw->pw_dir : NULL;
    }
    /* libpq takes the default CRL only when neither sslcrl nor sslcrldir is set. */
    char *crldir = NULL;
    bool have_crldir =
        tls && db_effective_value(opts, "sslcrldir", "PGSSLCRLDIR", &crldir, from, sizeof(from)) &&
        *crldir;
    free(crldir);
    bool ok = true, have_cert = false, have_root = false;
    for (size_t i = 0; tls && ok && i < sizeof(tls_files) / sizeof(tls_files[0]); i++) {
        bool key = strcmp(tls_files[i].keyword, "sslkey") == 0;
        bool crl = strcmp(tls_files[i].keyword, "sslcrl") == 0;
        char *value = NULL;
        const char *file = NULL, *where = from;
        if (db_effective_value(opts, tls_files[i].keyword, tls_files[i].envvar, &value, from,
                               sizeof(from)) &&
            *value) {
            /* A key with a colon names an OpenSSL engine's key ("engine:id"), not a file. */
            if (!key || !strchr(value, ':'))
                file = value;
        } else if (home && *home && !(crl && have_crldir)) {
            snprintf(path, sizeof(path), "%s/%s", home, tls_files[i].home_default);
            file = path;
            where = "libpq's default";
        }
        /* libpq reads the key only with a client certificate (initialize_SSL's have_cert: the
         * certificate file exists and loaded, so a regular file), and the CRL only once the root
         * certificate file loaded; without them it never looks at sslkey or sslcrl, nor their
         * defaults, and neither does this. */
        bool opened = file && (!key || have_cert) && (!crl || have_root);
        if (opened)
            ok = regular_or_absent(file, tls_files[i].keyword, where, err, errlen);
        struct stat st;
        bool loads = file && stat(file, &st) == 0 && S_ISREG(st.st_mode);
        /* libpq is then handed the file opened here, never the path (db.h, DbPins). */
        if (pins && ok && opened && loads)
            ok = pin_file(pins, tls_files[i].keyword, file, where, err, errlen);
        if (strcmp(tls_files[i].keyword, "sslcert") == 0)
            have_cert = loads;
        else if (strcmp(tls_files[i].keyword, "sslrootcert") == 0)
            have_root = loads;
        free(value);
    }
    if (!ok && pins)
        db_pins_close(pins);
    return ok;
}

bool db_check_writer_conninfo(const char *conninfo, char *err, size_t errlen)
{
    if (!db_check_conninfo(conninfo, err, errlen))
        return false;
    static const char *const read_only[] = {"read-only", "standby", "prefer-standby", NULL};
    PQconninfoOption *opts = PQconninfoParse(conninfo, NULL);
    if (!opts)
        return refuse(err, errlen, "out of memory");
    /* libpq takes the setting from the service file, else the environment, when the string
     * does not give it. */
    char *attrs = NULL, from[80];
    bool ok = !db_effective_value(opts, "target_session_attrs", "PGTARGETSESSIONATTRS", &attrs,
                                  from, sizeof(from)) ||
              !one_of(attrs, read_only);
    if (!ok)
        refuse(err, errlen,
               "database URL: target_session_attrs=%s%s%s%s picks a server that cannot be "
               "written to, and this command writes: use read-write (or primary, or any)",
               attrs, *from ? " (from " : "", from, *from ? ")" : "");
    free(attrs);
    secrets_conninfo_free(opts);
    return ok;
}

/* Item i of a comma-separated libpq list ("" when the list is shorter, or the item empty), into
 * out; the list's length into *n. */
static void list_item(const char *list, int i, char *out, size_t outlen, int *n)
{
    const char *p = list ? list : "";
    *n = 1;
    out[0] = '\0';
    for (int k = 0;; k++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (k == i)
            snprintf(out, outlen, "%.*s", (int)len, p);
        if (!comma)
            break;
        (*n)++;
        p = comma + 1;
    }
}

/* The server a host of a connection string reaches, as compared: every spelling of this
 * machine's own server (no host: libpq's socket directory; a socket directory; localhost,
 * 127.0.0.1, ::1) as one, a name in lower case without a trailing dot. */
static void host_key(const char *host, char *out, size_t outlen)
{
    if (!*host || host[0] == '/' || host[0] == '@' || strcasecmp(host, "localhost") == 0 ||
        strcasecmp(host, "localhost.") == 0 || strcmp(host, "127.0.0.1") == 0 ||
        strcmp(host, "::1") == 0) {
        snprintf(out, outlen, "%s", "(this host)");
        return;
    }
    size_t i = 0;
    for (; host[i] && i + 1 < outlen; i++)
        out[i] = (char)tolower((unsigned char)host[i]);
    if (i > 1 && out[i - 1] == '.')
        i--;
    out[i] = '\0';
}

/* The "host|port|dbname" lines of a connection string into out, one per host of its list, each
 * as libpq would take it: the string's, else its service file's, else the environment's; no
 * port libpq's compiled default, no dbname the user name (libpq's defaults). The service's
 * count: two entries "service=orders" and "service=billing" give no host, port or dbname in the
 * strings, and were taken for one database. */
static bool db_target(const char *conninfo, StrBuf *out)
{
    PQconninfoOption *opts = conninfo ? PQconninfoParse(conninfo, NULL) : NULL;
    if (!opts)
        return false;
    static const char *const keys[][2] = {{"host", "PGHOST"},
                                          {"hostaddr", "PGHOSTADDR"},
                                          {"port", "PGPORT"},
                                          {"dbname", "PGDATABASE"},
                                          {"user", "PGUSER"}};
    enum { N_KEYS = sizeof(keys) / sizeof(keys[0]) };
    char *v[N_KEYS] = {NULL}, from[80];
    for (size_t i = 0; i < N_KEYS; i++)
        (void)db_effective_value(opts, keys[i][0], keys[i][1], &v[i], from, sizeof(from));
    secrets_conninfo_free(opts);
    /* libpq's own defaults: the compiled port (asked once: a list of 100 compares 4,950
     * pairs), and a dbname that is the user's name (the operating system's user when none is
     * given). */
    static char default_port[16];
    if (!default_port[0]) {
        snprintf(default_port, sizeof(default_port), "%s", "5432");
        PQconninfoOption *defaults = PQconndefaults();
        for (PQconninfoOption *o = defaults; o && o->keyword; o++)
            if (strcmp(o->keyword, "port") == 0 && o->compiled)
                snprintf(default_port, sizeof(default_port), "%s", o->compiled);
        secrets_conninfo_free(defaults);
    }
    const char *dbname = v[3] && *v[3] ? v[3] : v[4] && *v[4] ? v[4] : NULL;
    struct passwd *pw = dbname ? NULL : getpwuid(geteuid());
    if (!dbname)
        dbname = pw ? pw->pw_name : "";
    int n_hosts = 1, n_addrs = 1, n_ports = 1, n;
    char item[1024], key[1024], port[64];
    list_item(v[0], 0, item, sizeof(item), &n_hosts);
    list_item(v[1], 0, item, sizeof(item), &n_addrs);
    list_item(v[2], 0, item, sizeof(item), &n_ports);
    int count = n_hosts > n_addrs ? n_hosts : n_addrs;
    for (int i = 0; i < count; i++) {
        /* libpq connects to the hostaddr when one is given (the host then names it only). */
        list_item(v[1], i, item, sizeof(item), &n);
        if (!*item)
            list_item(v[0], i, item, sizeof(item), &n);
        host_key(item, key, sizeof(key));
        list_item(v[2], n_ports == 1 ? 0 : i, port, sizeof(port), &n);
        char *end;
        long number = strtol(port, &end, 10);
        if (!*port)
            snprintf(port, sizeof(port), "%s", default_port);
        else if (*end == '\0' && number > 0)
            snprintf(port, sizeof(port), "%ld", number);
        strbuf_puts(out, key);
        strbuf_puts(out, "|");
        strbuf_puts(out, port);
        strbuf_puts(out, "|");
        strbuf_puts(out, dbname);
        strbuf_puts(out, "\n");
    }
    for (size_t i = 0; i < N_KEYS; i++)
        free(v[i]);
    return true;
}

bool db_same_database(const char *a, const char *b)
{
    StrBuf ta = {0}, tb = {0};
    bool same = false;
    if (db_target(a, &ta) && db_target(b, &tb) && ta.s && tb.s) {
        /* Any server of one list that the other lists too: libpq may pick it for both. */
        for (const char *line = ta.s; *line && !same;) {
            const char *nl = strchr(line, '\n');
            size_t len = (size_t)(nl - line);
            for (const char *other = tb.s; *other && !same;) {
                const char *onl = strchr(other, '\n');
                same = (size_t)(onl - other) == len && memcmp(line, other, len) == 0;
                other = onl + 1;
            }
            line = nl + 1;
        }
    }
    strbuf_free(&ta);
    strbuf_free(&tb);
    return same;
}

/* The pinned schema ("" when none); one per process, set before any connection. */
static char pinned_schema[64];
static bool pinned_first; /* SCHEMA before pg_catalog (migrate creates objects there) */

bool db_pin_search_path(const char *schema, bool creates, char *err, size_t errlen)
{
    pinned_first = creates;
    if (!schema) {
        pinned_schema[0] = '\0';
        return true;
    }
    size_t len = strlen(schema);
    bool ok = len > 0 && len < sizeof(pinned_schema) && !(schema[0] >= '0' && schema[0] <= '9');
    for (size_t i = 0; ok && i < len; i++)
        ok = (schema[i] >= 'a' && schema[i] <= 'z') || (schema[i] >= '0' && schema[i] <= '9') ||
             schema[i] == '_';
    if (!ok) {
        /* A plain name needs no quoting in the search_path nor escaping in libpq's options. */
        snprintf(err, errlen,
                 "--schema: expected a plain lower-case name ([a-z_][a-z0-9_]*, at "
                 "most 63 characters)");
        return false;
    }
    memcpy(pinned_schema, schema, len + 1);
    return true;
}

char *db_startup_options(const char *user_options)
{
    if (!pinned_schema[0])
        return NULL;
    const char *user = user_options ? user_options : "";
    /* Ours go last: for a setting given twice in the startup packet, the last one wins. */
    size_t len = strlen(user) + strlen(pinned_schema) + 64;
    char *out = malloc(len);
    if (out)
        snprintf(out, len, "%s%s-c search_path=%s%s,pg_temp", user, *user ? " " : "",
                 pinned_first ? "" : "pg_catalog,", pinned_schema);
    return out;
}

static void on_notice(void *arg, const char *message)
{
    char line[300], q[400];
    (void)arg;
    first_line(message, line, sizeof(line));
    log_debug("postgres notice", "message=%s", log_quote(line, q, sizeof(q)));
}

/* Whether the user sets keyword for a connection to opts' string: in the string, its service
 * file or envvar (NULL: libpq reads none for it), where libpq would take it from. */
static bool user_sets(const PQconninfoOption *opts, const char *keyword, const char *envvar)
{
    char *value = NULL, from[80];
    bool set = db_effective_value(opts, keyword, envvar, &value, from, sizeof(from));
    free(value);
    return set;
}

bool db_connect_params(const char *conninfo, const char *app, DbConnectParams *p, char *err,
                       size_t errlen)
{
    /* The keepalives and tcp_user_timeout make a silent network (a partition, a host gone) an
     * error within about 30 s instead of a wait of hours on the kernel's defaults, whether the
     * connection waits for an answer or for the acknowledgement of what it sent: a command
     * blocked that long would hold its transaction's locks, and the relays' claim floor, as long.
     * They are defaults: each goes only where neither the string, nor its service file, nor the
     * environment sets it, as the user's choice there is deliberate (entries given here beat the
     * service file's and the environment's in libpq, which fills those in only where nothing is
     * set: a service file's keepalives_idle=60 or a PGCONNECT_TIMEOUT=3 was silently ignored). */
    static const struct {
        const char *key, *envvar, *value;
    } defaults[] = {
        {"connect_timeout", "PGCONNECT_TIMEOUT", DB_CONNECT_TIMEOUT_DEFAULT},
        {"keepalives", NULL, "1"},
        {"keepalives_idle", NULL, "10"},
        {"keepalives_interval", NULL, "5"},
        {"keepalives_count", NULL, "3"},
        {"tcp_user_timeout", NULL, "30000"},
    };
    memset(p, 0, sizeof(*p));
    p->parsed = PQconninfoParse(conninfo, NULL);
    size_t nopts = 0;
    for (const PQconninfoOption *o = p->parsed; o && o->keyword; o++)
        nopts++;
    /* the string's + 6 defaults + fallback_application_name + connect_timeout + options +
     * host, hostaddr, port, target_session_attrs + terminator */
    p->keys = calloc(nopts + 16, sizeof(char *));
    p->values = calloc(nopts + 16, sizeof(char *));
    /* One connection a host, each with that host's entries in place of the lists (a host of the
     * list that is an old server is passed over for the next, which libpq's own walk through the
     * list cannot do once it connected): the same hosts, pairing and order as the relay's own
     * connections (pg_plan.c). */
    p->nhosts = p->parsed ? db_hosts(p->parsed, &p->hosts) : 1;
    if (!p->parsed)
        p->hosts = calloc(1, sizeof(DbHost)); /* none given: libpq reads the string itself */
    if (!p->keys || !p->values || !p->hosts || p->nhosts == 0)
        return refuse(err, errlen, "out of memory");
    int n = 0;
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
        if (p->parsed && user_sets(p->parsed, defaults[i].key, defaults[i].envvar))
            continue;
        p->keys[n] = defaults[i].key;
        p->values[n++] = defaults[i].value;
    }
    /* A fallback: an application_name anywhere (string, service, PGAPPNAME) beats it in libpq. */
    if (app && !(p->parsed && user_sets(p->parsed, "fallback_application_name", NULL))) {
        p->keys[n] = "fallback_application_name";
        p->values[n++] = app;
    }
    if (!p->parsed) {
        /* Unparsable (the commands check it first, so rarely): libpq says why. */
        p->keys[n] = "dbname";
        p->values[n++] = conninfo;
        p->expand_dbname = 1;
    }
    /* The string's own settings, but its host, hostaddr and port, its dbname and its empty
     * settings: each connection gets those in its host's string (db_connect_params_host). */
    for (const PQconninfoOption *o = p->parsed; o && o->keyword; o++) {
        if (!db_setting_shared(o))
            continue;
        p->keys[n] = o->keyword;
        p->values[n++] = o->val;
    }
    char *value = NULL, from[80];
    long num;
    /* A connect_timeout of zero or less (the string's, the service file's or PGCONNECT_TIMEOUT) is
     * libpq's "wait for ever": a server that takes the connection and never answers would hold
     * the command for ever. It gets the default bound instead, as the relay's own connections
     * do (pg_plan_make); set after the string's, it wins over all three. */
    if (p->parsed &&
        db_effective_value(p->parsed, "connect_timeout", "PGCONNECT_TIMEOUT", &value, from,
                           sizeof(from)) &&
        libpq_int(value, strlen(value), &num) && num <= 0) {
        p->keys[n] = "connect_timeout";
        p->values[n++] = DB_CONNECT_TIMEOUT_DEFAULT;
    }
    free(value);
    value = NULL;
    if (p->parsed && db_effective_value(p->parsed, "target_session_attrs", "PGTARGETSESSIONATTRS",
                                        &value, from, sizeof(from)))
        p->prefer_standby = strcmp(value, "prefer-standby") == 0;
    free(value);
    value = NULL;
    /* The pinned search_path goes after the string's options, which it would otherwise lose to,
     * and carries the user's own options along (the string's, else the service file's, else
     * PGOPTIONS: an explicit options entry hides the other two). */
    if (pinned_schema[0]) {
        /* Whole, however long: cut, a "-c statement_timeout=10000" could go as "=1". */
        bool user = p->parsed && db_effective_value(p->parsed, "options", "PGOPTIONS", &value, from,
                                                    sizeof(from));
        p->options = db_startup_options(user ? value : NULL);
        free(value);
        if (!p->options)
            return refuse(err, errlen, "out of memory");
        p->keys[n] = "options";
        p->values[n++] = p->options;
    }
    p->nshared = n;
    p->keys[n] = NULL;
    p->values[n] = NULL;
    /* Room for the longest host's db_connect_params_host string. */
    size_t most = 0;
    for (int i = 0; i < p->nhosts; i++) {
        const DbHost *h = &p->hosts[i];
        size_t len = db_host_conninfo(p->parsed, h->host, h->hostaddr, h->port, NULL);
        most = len > most ? len : most;
    }
    if (!(p->target = malloc(most + 1)))
        return refuse(err, errlen, "out of memory");
    p->target_room = most + 1;
    return true;
}

/* Whether the string's setting o goes in the host's string (db_host_conninfo): its dbname, and
 * an empty setting (password='' with PGPASSWORD set), which is libpq's default in a string but
 * no setting at all as a parameter, where libpq takes the environment's. But options and
 * connect_timeout, which entries of the connection's own replace (db_connect_params, pg_plan.c):
 * the string, expanded after them, would undo those. */
static bool setting_in_host_string(const PQconninfoOption *o)
{
    if (!o->val)
        return false;
    if (strcmp(o->keyword, "dbname") == 0)
        return true;
    return !o->val[0] && strcmp(o->keyword, "options") != 0 &&
           strcmp(o->keyword, "connect_timeout") != 0;
}

bool db_setting_shared(const PQconninfoOption *o)
{
    return o->val && strcmp(o->keyword, "host") != 0 && strcmp(o->keyword, "hostaddr") != 0 &&
           strcmp(o->keyword, "port") != 0 && !setting_in_host_string(o);
}

/* Appends "key='value'" (a space before it but at the start) at out + at, quotes and
 * backslashes escaped, and returns the new length; nothing for a NULL value. out NULL: only
 * counts. */
static size_t conninfo_put(char *out, size_t at, const char *key, const char *value)
{
    if (!value)
        return at;
    if (out)
        at += (size_t)sprintf(out + at, "%s%s='", at ? " " : "", key);
    else
        at += (at ? 1 : 0) + strlen(key) + 2;
    for (; *value; value++) {
        if (*value == '\'' || *value == '\\') {
            if (out)
                out[at] = '\\';
            at++;
        }
        if (out)
            out[at] = *value;
        at++;
    }
    if (out) {
        out[at] = '\'';
        out[at + 1] = '\0';
    }
    return at + 1;
}

size_t db_host_conninfo(const PQconninfoOption *parsed, const char *host, const char *hostaddr,
                        const char *port, char *out)
{
    /* The dbname first: libpq expands the first dbname only (an unparsable string, passed whole
     * as one, has nothing here). */
    size_t at = 0;
    for (const PQconninfoOption *o = parsed; o && o->keyword; o++)
        if (o->val && strcmp(o->keyword, "dbname") == 0)
            at = conninfo_put(out, at, "dbname", o->val);
    for (const PQconninfoOption *o = parsed; o && o->keyword; o++)
        if (setting_in_host_string(o) && strcmp(o->keyword, "dbname") != 0)
            at = conninfo_put(out, at, o->keyword, o->val);
    at = conninfo_put(out, at, "host", host);
    at = conninfo_put(out, at, "hostaddr", hostaddr);
    at = conninfo_put(out, at, "port", port);
    if (out && at == 0)
        out[0] = '\0';
    return at;
}

void db_connect_params_host(DbConnectParams *p, int i, const char *session_attrs)
{
    /* Room for the host's own string was made by db_connect_params: this cannot fail. */
    bool ok = db_connect_params_addr(p, i, NULL, session_attrs);
    (void)ok;
}

bool db_connect_params_addr(DbConnectParams *p, int i, const char *hostaddr,
                            const char *session_attrs)
{
    /* An empty entry ("host=''", "port=,5433") is libpq's default (its socket directory, port
     * 5432), but an empty parameter is no entry for libpq, which then took PGHOST's or PGPORT's
     * (another server). The entries go as a connection string in the dbname, whose expansion
     * keeps an empty value (db_host_conninfo). Nothing to pass (an unparsable string, passed
     * whole): none. */
    const DbHost *h = &p->hosts[i];
    hostaddr = hostaddr ? hostaddr : h->hostaddr;
    int n = p->nshared;
    size_t len = db_host_conninfo(p->parsed, h->host, hostaddr, h->port, NULL);
    if (len + 1 > p->target_room) {
        /* An address of the name's own (db_connect_checked) may need more than the room made.
         * Grown only, never cut to this string: db_connect_params_host counts on the room for
         * every host's own (a short name's address, then a longer name of the list, overflowed). */
        char *grown = realloc(p->target, len + 1);
        if (!grown)
            return false;
        p->target = grown;
        p->target_room = len + 1;
    }
    if (db_host_conninfo(p->parsed, h->host, hostaddr, h->port, p->target) > 0) {
        p->keys[n] = "dbname", p->values[n++] = p->target;
        p->expand_dbname = 1;
    }
    p->keys[n] = "target_session_attrs", p->values[n++] = session_attrs;
    p->keys[n] = NULL, p->values[n] = NULL;
    return true;
}

void db_connect_params_free(DbConnectParams *p)
{
    free(p->options);
    free(p->target);
    free(p->keys);
    free(p->values);
    db_hosts_free(p->hosts, p->nhosts > 0 ? p->nhosts : 1);
    if (p->parsed)
        secrets_conninfo_free(p->parsed);
    memset(p, 0, sizeof(*p));
}

/* A server version (PQserverVersion's form) as people write it: "12.19", "9.6.24". */
static const char *version_shown(int v, char *out, size_t outlen)
{
    if (v >= 100000) /* 10 and later: major * 10000 + minor */
        snprintf(out, outlen, "%d.%d", v / 10000, v % 10000);
    else if (v > 0) /* before 10: major.minor.patch, two digits each after the first */
        snprintf(out, outlen, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else
        snprintf(out, outlen, "of an unknown version");
    return out;
}

bool db_version_supported(int v, char *err, size_t errlen)
{
    if (v >= DB_MIN_SERVER_VERSION)
        return true;
    char shown[32];
    snprintf(err, errlen, "PostgreSQL %d or later is required; the server is %s",
             DB_MIN_SERVER_VERSION / 10000, version_shown(v, shown, sizeof(shown)));
    return false;
}

PGconn *db_connect(const char *conninfo, const char *app, char *err, size_t errlen)
{
    return db_connect_checked(conninfo, app, NULL, err, errlen);
}

bool db_host_needs_lookup(const char *host)
{
    if (!host || !*host || host[0] == '/' || host[0] == '@')
        return false;
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) != 1 && inet_pton(AF_INET6, host, buf) != 1;
}

/* The most addresses of one name a command tries (as resolve.h's RESOLVE_MAX_ADDRS for run). */
#define DB_MAX_ADDRS 16

/* The addresses of host i of p, numeric, in getaddrinfo's order (libpq's), duplicates dropped,
 * when its name is one to look up (db_host_needs_lookup), no hostaddr is given and the lists are
 * single; into addrs (DB_MAX_ADDRS of NI_MAXHOST). Returns their number; 0 when there is nothing
 * to look up or the lookup fails. Blocking: for the commands, never the relay's loop. */
static int host_addresses(const DbConnectParams *p, int i, char (*addrs)[NI_MAXHOST])
{
    const DbHost *h = &p->hosts[i];
    if ((h->hostaddr && *h->hostaddr) || !db_host_needs_lookup(h->host) || strchr(h->host, ',') ||
        (h->port && strchr(h->port, ',')))
        return 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(h->host, NULL, &hints, &ai) != 0)
        return 0;
    int n = 0;
    for (const struct addrinfo *a = ai; a && n < DB_MAX_ADDRS; a = a->ai_next) {
        if (getnameinfo(a->ai_addr, a->ai_addrlen, addrs[n], NI_MAXHOST, NULL, 0, NI_NUMERICHOST))
            continue;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++)
            seen = strcmp(addrs[k], addrs[n]) == 0;
        n += !seen;
    }
    freeaddrinfo(ai);
    return n;
}

/* A connection to host i of p as it stands (db_connect_params_host or _addr), or NULL with why
 * (one line) filled, *old and *version set when the server answered but is older than
 * DB_MIN_SERVER_VERSION, the address libpq stopped at in answered (NULL: not wanted; "" when
 * libpq names none) and libpq's whole message in *tried (NULL: not wanted; replaced, owned by the
 * caller, NULL when out of memory): it names each address libpq tried and failed. */
static PGconn *attempt(const DbConnectParams *p, const char *conninfo, bool *old, int *version,
                       char *answered, char **tried, char *why, size_t whylen)
{
    PGconn *c = PQconnectdbParams(p->keys, p->values, p->expand_dbname);
    if (answered)
        snprintf(answered, NI_MAXHOST, "%s", PQhostaddr(c) ? PQhostaddr(c) : "");
    if (tried) {
        free(*tried);
        *tried = strdup(PQerrorMessage(c));
    }
    if (PQstatus(c) != CONNECTION_OK) {
        first_line(PQerrorMessage(c), why, whylen);
        db_hide_password_tail(why, conninfo);
    } else if (!db_version_supported(PQserverVersion(c), why, whylen)) {
        *old = true;
        *version = PQserverVersion(c);
    } else {
        return c;
    }
    PQfinish(c);
    return NULL;
}

/* Whether libpq's message (attempt's tried) names addr as one it tried: libpq writes each failed
 * address of a name as "\"NAME\" (ADDRESS), port P failed", in any language. */
static bool libpq_tried(const char *tried, const char *addr)
{
    char named[NI_MAXHOST + 4];
    snprintf(named, sizeof(named), "(%s),", addr);
    return tried && strstr(tried, named);
}

/* What happened at each host of a db_connect_checked: refused for its server's version (old,
 * version), or failed otherwise (why; "" when not tried); and whether one of its name's later
 * addresses (later_addresses) failed otherwise than for its version (later_other: a retry may
 * cure the host), with the first such one's line (later; "" when none). */
typedef struct HostOutcome {
    bool old;
    int version;
    char answered[NI_MAXHOST]; /* the address libpq stopped at ("": none) */
    char *tried;               /* owned: libpq's message there (attempt), or NULL */
    char why[300];
    bool later_other;
    char later[300];
} HostOutcome;

/* The address of host i of p that libpq stopped at (o->answered) passed over for the name's
 * other addresses that libpq left untried, each tried alone with the name beside it (o->later
 * and o->later_other set from them). libpq moves to a name's
 * next address when one refuses or times out, but not past one whose server is not the one
 * target_session_attrs asks for (libpq 15 moves to the next host then: a name whose first
 * address is a standby failed read-write), nor past a server only db_connect_checked refuses (an
 * old one), nor past a server's error after the start: the commands stopped at the first address
 * where run, which looks names up itself and tries each address alone (pg.c), moved on. Returns a
 * connection to a supported server, or NULL: the host then stays as libpq left it (its line
 * unchanged). */
static PGconn *later_addresses(DbConnectParams *p, int i, HostOutcome *o, const char *session_attrs,
                               const char *conninfo)
{
    char addrs[DB_MAX_ADDRS][NI_MAXHOST];
    int n = host_addresses(p, i, addrs), at = n;
    for (int k = 0; k < n; k++)
        if (strcmp(addrs[k], o->answered) == 0)
            at = k;
    /* This lookup's order need not be libpq's (a DNS server's round robin rotates a name's
     * addresses at each answer), so the addresses after the one libpq stopped at here are not
     * those it left untried. Where a server answered there (an old one, or one whose line libpq
     * wrote: a standby for read-write, an authentication failure, a refusal), every other address
     * is tried, from the one after it round to the one before, but those libpq's message names
     * as tried and failed. Where none did (a silent address, which libpq names in no line: it
     * stopped there as its last), only those after it here, as libpq's own order would have
     * them: a silent address costs its connect_timeout once in the same order, and at most once
     * more in another. */
    bool round = o->old || libpq_tried(o->tried, o->answered);
    PGconn *conn = NULL;
    o->later_other = false;
    o->later[0] = '\0';
    for (int j = 0; j < n && !conn; j++) {
        int k = at < n ? (at + 1 + j) % n : j;
        if (k == at || libpq_tried(o->tried, addrs[k]) || (!round && (at == n || k < at)))
            continue;
        bool old = false;
        int version = 0;
        char why[300];
        if (!db_connect_params_addr(p, i, addrs[k], session_attrs))
            break;
        conn = attempt(p, conninfo, &old, &version, NULL, NULL, why, sizeof(why));
        /* A later address that failed otherwise than for its version (down, a standby, ...)
         * makes the host one a retry may cure, old first address or not: the commands must not
         * exit 2 ("every host is an old server") and migrate --connect-wait must wait. Its line
         * goes beside the host's, the first such only (one line, bounded); an old server's
         * would only repeat the host's version line. */
        if (!conn && !old && !o->later_other) {
            o->later_other = true;
            snprintf(o->later, sizeof(o->later), "%s", why);
        }
    }
    return conn;
}

/* The one line of a db_connect_checked that no host of several served: the old servers first,
 * each named with its version, then the other hosts' failures, each host's with its name's later
 * address's (HostOutcome.later). */
static void hosts_failed(const DbConnectParams *p, const HostOutcome *out, char *err, size_t errlen)
{
    StrBuf line = {0};
    int old = 0;
    for (int i = 0; i < p->nhosts; i++) {
        if (!out[i].old)
            continue;
        char label[300], shown[32], head[64];
        db_host_label(&p->hosts[i], label, sizeof(label));
        if (old++ == 0) {
            snprintf(head, sizeof(head), "PostgreSQL %d or later is required; the server",
                     DB_MIN_SERVER_VERSION / 10000);
            strbuf_puts(&line, head);
        } else {
            strbuf_puts(&line, ",");
        }
        strbuf_puts(&line, " at ");
        strbuf_puts(&line, label);
        strbuf_puts(&line, " is ");
        strbuf_puts(&line, version_shown(out[i].version, shown, sizeof(shown)));
    }
    for (int i = 0; i < p->nhosts; i++) {
        const char *whys[2] = {out[i].old ? "" : out[i].why, out[i].later};
        for (int k = 0; k < 2; k++) {
            if (!whys[k][0])
                continue;
            if (line.len)
                strbuf_puts(&line, "; ");
            strbuf_puts(&line, whys[k]);
        }
    }
    snprintf(err, errlen, "%s", line.s ? line.s : "out of memory");
    strbuf_free(&line);
}

PGconn *db_connect_checked(const char *conninfo, const char *app, bool *unsupported, char *err,
                           size_t errlen)
{
    if (unsupported)
        *unsupported = false;
    DbConnectParams p;
    HostOutcome *out = NULL;
    PGconn *conn = NULL;
    if (!db_connect_params(conninfo, app, &p, err, errlen) ||
        !(out = calloc((size_t)p.nhosts, sizeof(*out)))) {
        if (!out)
            snprintf(err, errlen, "out of memory");
        db_connect_params_free(&p);
        return NULL;
    }
    /* libpq's prefer-standby, which one host at a time cannot ask for: every host as a standby,
     * then every host as any server. */
    for (int pass = 0; pass < (p.prefer_standby ? 2 : 1) && !conn; pass++) {
        for (int i = 0; i < p.nhosts && !conn; i++) {
            if (out[i].old) {
                /* It stays old; prefer-standby's second round asks the name's later addresses
                 * for any server. */
                if (pass == 1 && out[i].answered[0])
                    conn = later_addresses(&p, i, &out[i], "any", conninfo);
                continue;
            }
            const char *attrs = !p.prefer_standby ? NULL : pass == 0 ? "standby" : "any";
            db_connect_params_host(&p, i, attrs);
            conn = attempt(&p, conninfo, &out[i].old, &out[i].version, out[i].answered,
                           &out[i].tried, out[i].why, sizeof(out[i].why));
            out[i].later_other = false;
            out[i].later[0] = '\0';
            if (!conn && out[i].answered[0])
                conn = later_addresses(&p, i, &out[i], attrs, conninfo);
        }
    }
    if (!conn) {
        bool all_old = true;
        for (int i = 0; i < p.nhosts; i++)
            all_old = all_old && out[i].old && !out[i].later_other;
        if (unsupported)
            *unsupported = all_old;
        /* One host: its own line, as libpq or db_version_supported wrote it (and its name's
         * later address's, when one was tried). */
        if (p.nhosts == 1)
            snprintf(err, errlen, "%s%s%s", out[0].why, out[0].later[0] ? "; " : "", out[0].later);
        else
            hosts_failed(&p, out, err, errlen);
    } else {
        PQsetNoticeProcessor(conn, on_notice, NULL);
    }
    for (int i = 0; i < p.nhosts; i++)
        free(out[i].tried);
    free(out);
    db_connect_params_free(&p);
    return conn;
}

PGconn *db_connect_once(const char *conninfo, const char *app)
{
    char err[300], q[400];
    PGconn *conn = db_connect(conninfo, app, err, sizeof(err));
    if (!conn)
        log_error("postgres unreachable", "error=%s", log_quote(err, q, sizeof(q)));
    return conn;
}

static void fill_error(PGconn *conn, const PGresult *res, DbError *e)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    snprintf(e->sqlstate, sizeof(e->sqlstate), "%s", state ? state : "");
    const char *msg = res ? PQresultErrorMessage(res) : NULL;
    first_line(msg && *msg ? msg : PQerrorMessage(conn), e->message, sizeof(e->message));
    e->conn_lost = PQstatus(conn) != CONNECTION_OK;
}

PGresult *db_result(PGconn *conn, PGresult *res, DbError *e)
{
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
        return res;
    fill_error(conn, res, e);
    PQclear(res);
    return NULL;
}

PGresult *db_query_bin(PGconn *conn, const char *sql, int nparams, const char *const *values,
                       const int *lengths, const int *formats, DbError *e)
{
    return db_result(conn, PQexecParams(conn, sql, nparams, NULL, values, lengths, formats, 0), e);
}

PGresult *db_query(PGconn *conn, const char *sql, int nparams, const char *const *values,
                   DbError *e)
{
    return db_query_bin(conn, sql, nparams, values, NULL, NULL, e);
}

PGresult *db_run_script(PGconn *conn, const char *sql, DbError *e)
{
    return db_result(conn, PQexec(conn, sql), e);
}

bool db_exec(PGconn *conn, const char *sql, DbError *e)
{
    PGresult *res = db_query(conn, sql, 0, NULL, e);
    PQclear(res);
    return res != NULL;
}

void db_rollback(PGconn *conn)
{
    if (PQstatus(conn) == CONNECTION_OK && PQtransactionStatus(conn) != PQTRANS_IDLE)
        PQclear(PQexec(conn, "ROLLBACK"));
}

bool db_apply_schema(PGconn *conn, const char *lock_name, const char *sql, DbError *e)
{
    const char *params[1] = {lock_name};
    PGresult *res;
    if (!db_exec(conn, "BEGIN", e))
        return false;
    /* The two-int form keeps these locks apart from single-bigint ones (the relay's migrate). */
    res = db_query(conn, "SELECT pg_catalog.pg_advisory_xact_lock(20240, pg_catalog.hashtext($1))",
                   1, params, e);
    if (!res)
        goto failed;
    PQclear(res);
    /* PQexec runs a multi-statement script, inside the open transaction. */
    res = PQexec(conn, sql);
    if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK) {
        fill_error(conn, res, e);
        PQclear(res);
        goto failed;
    }
    PQclear(res);
    if (!db_exec(conn, "COMMIT", e))
        goto failed;
    char q[200];
    log_info("schema up to date", "schema=%s", log_quote(lock_name, q, sizeof(q)));
    return true;
failed:
    db_rollback(conn);
    return false;
}

const char *db_error_text(const DbError *e)
{
    static _Thread_local char buf[sizeof(e->message) + 16];
    if (e->sqlstate[0])
        snprintf(buf, sizeof(buf), "%s: %s", e->sqlstate, e->message);
    else
        snprintf(buf, sizeof(buf), "%s", e->message);
    return buf;
}

bool db_identity(PGconn *conn, char *out, size_t outlen, DbError *e)
{
    PGresult *res = db_query(conn,
                             "SELECT d.oid::text || '.' || d.datname"
                             " FROM pg_database d WHERE d.datname = pg_catalog.current_database()",
                             0, NULL, e);
    if (!res)
        return false;
    snprintf(out, outlen, "%s", PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : "?");
    PQclear(res);
    /* Readable by default since PostgreSQL 9.6 unless revoked: without it, the oid and name. */
    DbError ignored;
    res = db_query(conn, "SELECT system_identifier::text FROM pg_catalog.pg_control_system()", 0,
                   NULL, &ignored);
    if (res && PQntuples(res) == 1) {
        size_t n = strlen(out);
        snprintf(out + n, outlen - n, "@%s", PQgetvalue(res, 0, 0));
    }
    PQclear(res);
    return true;
}
