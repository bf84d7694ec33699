#include "log.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log_json.h"
#include "secrets.h"
#include "utf8.h"

static LogLevel min_level = LOG_INFO;
static LogFormat line_format = LOG_FORMAT_TEXT;
static _Thread_local const char *context;

void log_set_context(const char *fields)
{
    context = fields;
}

const char *log_context(void)
{
    return context;
}

void log_set_format(LogFormat format)
{
    line_format = format;
}

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(LogLevel level)
{
    min_level = level;
}

LogLevel log_get_level(void)
{
    return min_level;
}

bool log_level_parse(const char *name, LogLevel *out)
{
    for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (LogLevel)i;
            return true;
        }
    }
    return false;
}

const char *log_level_name(LogLevel level)
{
    return level_names[level];
}

/* What an escaper leaves alone besides plain text: log_quote escapes quotes and backslashes (its
 * output is a quoted string), log_escape backslashes only (a terminal shows no quotes, but a
 * reader must tell an escape from text), and the line pass of log_write neither (it runs over a
 * line whose quoted values are already escaped, and must not escape them twice). */
typedef enum { ESC_QUOTED, ESC_BARE, ESC_LINE } EscapeMode;

/* Escapes the character at p (p[0] != '\0') into esc: C0 controls and DEL as \xNN (\n for a
 * newline), each byte of invalid UTF-8 as \xNN, characters utf8_unsafe names (C1 controls, line
 * and paragraph separators, bidi and zero-width characters) as \uXXXX or \UXXXXXXXX; the rest
 * as they are. Sets *used to the bytes consumed; returns the length of esc. */
static size_t escape_unit(const char *p, EscapeMode mode, char esc[16], size_t *used)
{
    unsigned char c = (unsigned char)*p;
    int32_t cp;
    size_t n = utf8_decode(p, &cp);
    *used = n;
    if ((c == '"' && mode == ESC_QUOTED) || (c == '\\' && mode != ESC_LINE)) {
        esc[0] = '\\';
        esc[1] = (char)c;
        return 2;
    }
    if (c == '\n') {
        memcpy(esc, "\\n", 2);
        return 2;
    }
    if (cp < 0 || cp < 0x20 || cp == 0x7f)
        return (size_t)snprintf(esc, 16, "\\x%02x", c);
    if (utf8_unsafe(cp))
        return (size_t)snprintf(esc, 16, cp > 0xffff ? "\\U%08x" : "\\u%04x", (unsigned)cp);
    memcpy(esc, p, n);
    return n;
}

/* Writes value escaped into out (outlen > 6), between quote characters when quote is set; a
 * value that does not fit is cut at a character boundary and ends with "...". */
static void escape_into(const char *value, EscapeMode mode, char *out, size_t outlen)
{
    bool quote = mode == ESC_QUOTED;
    char esc[16];
    size_t total = 0, used;
    for (const char *p = value; *p; p += used)
        total += escape_unit(p, mode, esc, &used);
    /* The quotes and the NUL; a value that does not fit also needs room for "...". */
    size_t extra = quote ? 3 : 1;
    bool cut = total + extra > outlen;
    size_t limit = cut ? outlen - extra - 3 : total;

    size_t o = 0;
    if (quote)
        out[o++] = '"';
    for (const char *p = value; *p; p += used) {
        size_t n = escape_unit(p, mode, esc, &used);
        if (o - (quote ? 1 : 0) + n > limit)
            break;
        memcpy(out + o, esc, n);
        o += n;
    }
    if (cut) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    if (quote)
        out[o++] = '"';
    out[o] = '\0';
}

/* Scrubs registered secrets from a copy of value before escaping and cutting: escaping would
 * hide a secret holding a quote or a backslash from a later scrub, and a cut could leave part of
 * one behind. */
static const char *escape_scrubbed(const char *value, EscapeMode mode, char *out, size_t outlen)
{
    if (outlen < 8) {
        if (outlen)
            out[0] = '\0';
        return out;
    }
    char stack[1024];
    char *copy = NULL;
    const char *v = value ? value : "";
    if (secrets_found(v)) {
        size_t n = strlen(v) + 1;
        copy = n <= sizeof(stack) ? stack : malloc(n);
        if (!copy) {
            snprintf(out, outlen, mode == ESC_QUOTED ? "\"***\"" : "***");
            return out;
        }
        memcpy(copy, v, n);
        secrets_scrub(copy);
        v = copy;
    }
    escape_into(v, mode, out, outlen);
    if (copy != stack)
        free(copy);
    return out;
}

/* The longest text line, without its newline. */
#define LINE_MAX_TEXT 2046

/* The length of the escaped unit at p (p[0] != '\0') as escape_unit writes it: "\xNN",
 * "\uXXXX", "\UXXXXXXXX", a backslash and one character, or one UTF-8 character. Never past
 * the string's end. */
static size_t unit_len(const char *p)
{
    size_t n = 1;
    if (p[0] == '\\' && p[1]) {
        n = p[1] == 'x' ? 4 : p[1] == 'u' ? 6 : p[1] == 'U' ? 10 : 2;
    } else {
        int32_t cp;
        n = utf8_decode(p, &cp);
    }
    size_t have = strnlen(p, n);
    return have ? have : 1;
}

/* Ends a line that did not fit (or was cut on the way) so that it stays key=value text: cut
 * anywhere, it could end inside a quoted value (an unclosed quote makes a logfmt reader take the
 * rest as one value, or drop the line) or inside a key or an escape. Reads the line as
 * log_json_line does (fields split by blanks; a value that starts with a quote runs to the
 * closing one). The field that crosses the limit is kept cut at a character (or escape) boundary
 * with "..." (and its closing quote) when its key and part of its value fit, else dropped; then
 * " cut" marks the line (a bare word: "cut":true in JSON, as log_json_line marks its own cuts).
 * s is at most LINE_MAX_TEXT bytes afterwards. */
static void end_cut_line(char *s)
{
    static const char mark[] = " cut";
    /* Room kept for "...\"" and the mark. */
    size_t limit = LINE_MAX_TEXT - 4 - (sizeof(mark) - 1);
    size_t i = 0, kept = 0; /* kept: the end of the last field that fits whole */
    while (s[i]) {
        while (s[i] == ' ')
            i++;
        if (!s[i])
            break;
        size_t start = i, key_end = start + strcspn(s + start, "= ");
        size_t end = key_end;
        bool quoted = s[key_end] == '=' && s[key_end + 1] == '"', open = false;
        if (s[key_end] == '=') {
            end = key_end + 1;
            if (quoted) {
                for (end++; s[end] && s[end] != '"'; end += unit_len(s + end))
                    ;
                open = s[end] != '"'; /* the line ends inside the value */
                if (!open)
                    end++;
            } else {
                end += strcspn(s + end, " ");
            }
        }
        if (end <= limit && !open) {
            kept = end;
            i = end;
            continue;
        }
        /* This field crosses the limit (or its quote is never closed). */
        size_t value = key_end + 1 + (quoted ? 1 : 0);
        size_t o = value;
        if (s[key_end] == '=' && value < limit) {
            while (s[o] && s[o] != (quoted ? '"' : ' ') && o + unit_len(s + o) <= limit)
                o += unit_len(s + o);
        }
        if (o > value) {
            memcpy(s + o, quoted ? "...\"" : "...", quoted ? 5 : 4);
            kept = o + (quoted ? 4 : 3);
        }
        break;
    }
    memcpy(s + kept, mark, sizeof(mark));
}

void log_write(LogLevel level, const char *msg, const char *fields_fmt, ...)
{
    if (level < min_level)
        return;

    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);

    char quoted[512];
    /* Build the whole line first so concurrent writers (librdkafka's threads log through us)
     * never interleave within a line. */
    char line[2048];
    int len =
        snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s msg=%s",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 now.tv_nsec / 1000000, level_names[level], log_quote(msg, quoted, sizeof(quoted)));
    bool cut = false; /* the line did not fit: end_cut_line ends it */
    if (context && *context && len > 0 && len < (int)sizeof(line) - 1) {
        int n = snprintf(line + len, sizeof(line) - (size_t)len, " %s", context);
        if (n >= (int)(sizeof(line) - (size_t)len))
            cut = true;
        if (n > 0)
            len += n;
    }
    if (fields_fmt && *fields_fmt && len < (int)sizeof(line) - 2) {
        line[len++] = ' ';
        /* Up to sizeof(line) - 2, where the line is cut below: a cut here, not there, comes
         * after the scrub. */
        size_t room = sizeof(line) - 1 - (size_t)len;
        va_list ap, again;
        va_start(ap, fields_fmt);
        va_copy(again, ap);
        int n = vsnprintf(line + len, room, fields_fmt, ap);
        if (n >= (int)room) {
            cut = true;
            /* Cut: the scrub below would see only the start of a secret that spans the cut,
             * and leave it. Scrub the whole text, then cut; without memory for it, the fields
             * are dropped rather than risked. */
            char *full = malloc((size_t)n + 1);
            if (full) {
                vsnprintf(full, (size_t)n + 1, fields_fmt, again);
                secrets_scrub(full);
                n = snprintf(line + len, room, "%s", full);
                free(full);
            } else {
                n = snprintf(line + len, room, "...");
            }
        }
        va_end(again);
        va_end(ap);
        if (n > 0)
            len += n;
    }
    if (len > (int)sizeof(line) - 2) {
        len = (int)sizeof(line) - 2;
        cut = true;
    }
    line[len] = '\0';
    secrets_scrub(line); /* values a caller did not quote (see log_quote) */
    /* The same values may hold a newline, ESC or U+2028 (an event id, a prepared transaction's
     * name: text anyone with INSERT chooses). Escaping what is left over keeps the line one line
     * for every reader; quoted values are already escaped and pass unchanged. Room for every
     * byte escaped (at most four times as long): end_cut_line, not the escaper, cuts. */
    char escaped[4 * sizeof(line)];
    escape_into(line, ESC_LINE, escaped, sizeof(escaped));
    if (cut || strlen(escaped) > LINE_MAX_TEXT)
        end_cut_line(escaped);
    if (line_format == LOG_FORMAT_JSON) {
        /* From the finished, scrubbed, escaped line: one place formats and scrubs either way. */
        char json[4096];
        size_t n = log_json_line(escaped, json, sizeof(json) - 1);
        json[n++] = '\n';
        fwrite(json, 1, n, stderr);
        return;
    }
    len = (int)strlen(escaped);
    escaped[len++] = '\n';
    fwrite(escaped, 1, (size_t)len, stderr);
}

const char *log_quote(const char *value, char *out, size_t outlen)
{
    return escape_scrubbed(value, ESC_QUOTED, out, outlen);
}

const char *log_escape(const char *value, char *out, size_t outlen)
{
    return escape_scrubbed(value, ESC_BARE, out, outlen);
}

void log_one_line(char *s)
{
    char *o = s;
    for (const char *p = s; *p;) {
        int32_t cp;
        size_t n = utf8_decode(p, &cp);
        if (cp < 0 || utf8_unsafe(cp)) {
            *o++ = '?';
        } else {
            memmove(o, p, n);
            o += n;
        }
        p += n;
    }
    *o = '\0';
}

/* A stretch of the connection string to show as "***": [start, end). */
typedef struct {
    size_t start, end;
} MaskSpan;

typedef struct {
    MaskSpan *spans;
    size_t n, cap;
    bool overflow; /* more spans than cap: nothing of the string is shown */
} MaskSpans;

static void mask_add(MaskSpans *m, size_t start, size_t end)
{
    if (m->n < m->cap) /* cap counts every span a reading can find (log_mask_conninfo) */
        m->spans[m->n++] = (MaskSpan){start, end};
    else
        m->overflow = true;
}

/* Whether s starts with a URL scheme and "://" (RFC 3986: a letter, then letters, digits, '+',
 * '-', '.'), after any blanks. */
static bool has_scheme(const char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    if (!isalpha((unsigned char)*s))
        return false;
    while (isalnum((unsigned char)*s) || *s == '+' || *s == '-' || *s == '.')
        s++;
    return strncmp(s, "://", 3) == 0;
}

/* The user info's password as meant: from the first ':' to where secrets_url_userinfo_end ends
 * the user info (the last '@' before the query, or before the first '/' when that is later;
 * one after the first '/' only when a ':' comes before it, so "h/p@th" is a path),
 * which covers libpq's (to the first '@' before any '/', so '?' and '#' may be part of it:
 * "u:pa?ss@h"), a password holding an '@' or '#' not percent-encoded ("u:p@ss@h", "u@x:#pw@h")
 * and one holding a '/' ("u:pa/ss@h", where libpq reads no password but host "u" and port
 * "pa"), at the cost of hiding text that only looks like user info: an '@' in the query of a URL
 * without a path ("u:pw@h?options=a@b" shows "u:***@b") or in its database name
 * ("h:5432/db@x" shows "h:***@x"). bare_token: a user info without ':' is masked whole, as in
 * any scheme but libpq's (http://APIKEY@host, redis://TOKEN@host pass a token so), where it
 * is a user name. Returns where libpq's user info ends (after its first '@' before any '/'),
 * or auth when there is none. */
static const char *mask_user_info(const char *s, const char *auth, bool bare_token, MaskSpans *m)
{
    const char *at = secrets_url_userinfo_end(auth);
    if (!at)
        return auth;
    const char *colon = memchr(auth, ':', (size_t)(at - auth));
    if (colon)
        mask_add(m, (size_t)(colon + 1 - s), (size_t)(at - s));
    else if (bare_token && at > auth)
        mask_add(m, (size_t)(auth - s), (size_t)(at - s));
    /* libpq's user info ends at the first '@' before any '/'; its query begins after that. */
    const char *first_at = memchr(auth, '@', strcspn(auth, "/"));
    return first_at ? first_at + 1 : auth;
}

/* Query parameters from params on, as libpq's conninfo_uri_parse_params reads them: separated
 * by '&' alone, the name up to the first '=' and percent-decoded ("%70assword"), the value the
 * rest (blanks, quotes and backslashes included). */
static void mask_query(const char *s, const char *params, MaskSpans *m)
{
    for (const char *p = params;; p++) {
        size_t len = strcspn(p, "&");
        const char *eq = memchr(p, '=', len);
        if (eq && secrets_encoded_password_key(p, (size_t)(eq - p)))
            mask_add(m, (size_t)(eq + 1 - s), (size_t)(p + len - s));
        p += len;
        if (!*p)
            break;
    }
}

/* Where libpq's conninfo_uri_parse_options starts the query of the URL whose hosts begin at p
 * (after the user info), or NULL for none; an address libpq refuses (an IPv6 '[' unclosed or
 * followed by other than ":/?,") counts as ending at the next '?'. */
static const char *uri_query(const char *p)
{
    char prev;
    for (;;) {
        if (*p == '[') {
            const char *close = strchr(p, ']');
            if (!close || close == p + 1 || (close[1] && !strchr(":/?,", close[1]))) {
                const char *q = strchr(p, '?');
                return q ? q + 1 : NULL;
            }
            p = close + 1;
        } else {
            p += strcspn(p, ":/?,");
        }
        prev = *p;
        if (prev == ':') {
            p++;
            p += strcspn(p, "/?,");
            prev = *p;
        }
        if (prev != ',')
            break;
        p++;
    }
    if (prev && prev != '?') {
        p++; /* the database name runs to the first '?' */
        p += strcspn(p, "?");
        prev = *p;
    }
    return prev ? p + 1 : NULL;
}

/* Key=value form as libpq's conninfo_parse reads it: a name runs to '=' or a blank (blanks may
 * come before and after the '='), a value is quoted ('...' with backslash escapes, and the next
 * pair may follow the closing quote at once) or runs to a blank (backslash escapes too). A name
 * without '=' (libpq refuses the string) is skipped and reading goes on, so a password after it
 * is still masked. An unclosed quote runs to the end. */
static void mask_keywords(const char *s, MaskSpans *m)
{
    const char *cp = s;
    while (*cp) {
        if (isspace((unsigned char)*cp)) {
            cp++;
            continue;
        }
        const char *name = cp;
        while (*cp && *cp != '=' && !isspace((unsigned char)*cp))
            cp++;
        size_t name_len = (size_t)(cp - name);
        while (isspace((unsigned char)*cp))
            cp++;
        if (*cp != '=')
            continue;
        cp++;
        while (isspace((unsigned char)*cp))
            cp++;
        const char *value = cp;
        if (*cp == '\'') {
            for (cp++; *cp && *cp != '\''; cp++)
                if (*cp == '\\' && cp[1])
                    cp++;
            if (*cp)
                cp++;
        } else {
            for (; *cp && !isspace((unsigned char)*cp); cp++)
                if (*cp == '\\' && cp[1])
                    cp++;
        }
        if ((name_len == 8 && strncmp(name, "password", 8) == 0) ||
            (name_len == 11 && strncmp(name, "sslpassword", 11) == 0))
            mask_add(m, (size_t)(value - s), (size_t)(cp - s));
    }
}

static int span_cmp(const void *a, const void *b)
{
    const MaskSpan *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Finds the passwords of s into m, reading s as libpq does: a URL only when it starts with
 * postgresql:// or postgres:// (uri_prefix_length), else key=value form, whatever "://" it
 * holds ("host=h://:x password=..." is two pairs). Another scheme (the Schema Registry's
 * http://user:password@host) is not libpq's: read both as a URL and as key=value pairs. */
static void mask_find(const char *s, MaskSpans *m)
{
    const char *auth = NULL;
    if (strncmp(s, "postgresql://", 13) == 0)
        auth = s + 13;
    else if (strncmp(s, "postgres://", 11) == 0)
        auth = s + 11;
    if (auth) {
        const char *params = uri_query(mask_user_info(s, auth, false, m));
        if (params)
            mask_query(s, params, m);
        return;
    }
    mask_keywords(s, m);
    if (has_scheme(s)) {
        auth = strstr(s, "://") + 3;
        const char *after = mask_user_info(s, auth, true, m);
        const char *q = strchr(after, '?');
        if (q)
            mask_query(s, q + 1, m);
    }
}

const char *log_mask_conninfo(const char *conninfo, char *out, size_t outlen)
{
    if (outlen == 0)
        return out;
    /* Mask a full copy first and cut afterwards, so a cut can never expose part of a password
     * or split the text the masker looks for. */
    const char *src = conninfo ? conninfo : "";
    size_t len = strlen(src);
    /* Every span a reading finds follows an '=' (a pair or a query parameter) or is the user
     * info's; a query has one more parameter than '&'. */
    size_t cap = 2;
    for (const char *p = src; *p; p++)
        cap += *p == '=' || *p == '&';
    MaskSpans m = {malloc(cap * sizeof(MaskSpan)), 0, cap, false};
    char *buf = m.spans ? malloc(len + 3 * cap + 1) : NULL;
    if (buf)
        mask_find(src, &m);
    if (!buf || m.overflow) {
        free(buf);
        free(m.spans);
        snprintf(out, outlen, "***");
        return out;
    }
    /* The readings' spans in order, overlapping ones joined: each becomes one "***". */
    qsort(m.spans, m.n, sizeof(MaskSpan), span_cmp);
    size_t from = 0, o = 0;
    for (size_t i = 0; i < m.n;) {
        size_t start = m.spans[i].start, end = m.spans[i].end;
        for (i++; i < m.n && m.spans[i].start <= end; i++)
            if (m.spans[i].end > end)
                end = m.spans[i].end;
        if (start < from)
            start = from;
        memcpy(buf + o, src + from, start - from);
        o += start - from;
        memcpy(buf + o, "***", 3);
        o += 3;
        from = end > from ? end : from;
    }
    memcpy(buf + o, src + from, len - from + 1);
    snprintf(out, outlen, "%s", buf);
    explicit_bzero(buf, len + 3 * cap + 1);
    free(buf);
    free(m.spans);
    return out;
}

void log_warn_short_secrets(size_t count)
{
    if (count > 0)
        log_warn("secret too short to scrub",
                 "count=%zu min_length=%d hint=\"a password or secret shorter than %d characters "
                 "is masked in connection strings but not scrubbed from other text (errors of "
                 "libpq or librdkafka that echo it): use a longer one\"",
                 count, SECRETS_MIN_LEN, SECRETS_MIN_LEN);
}
