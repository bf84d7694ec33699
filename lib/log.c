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

/* Replaces s[start, end) with "***"; s has room for the (at most 3 bytes) longer result. */
static void mask_span(char *s, size_t start, size_t end)
{
    memmove(s + start + 3, s + end, strlen(s + end) + 1);
    memcpy(s + start, "***", 3);
}

/* Masks in place; buf holds the conninfo and has room for 3 more bytes per password. */
static void mask_in_place(char *buf)
{
    /* URL form: scheme://user:password@host... -> mask between ':' and '@' of the authority. */
    char *scheme = strstr(buf, "://");
    if (scheme) {
        char *auth = scheme + 3;
        size_t auth_len = strcspn(auth, "/?#");
        char *at = memrchr(auth, '@', auth_len);
        if (!at) {
            /* libpq ends the user info at the first '@' before any '/', so a password may hold
             * '?' or '#' ("u:pa?ss@h"): look that far before deciding there is none. */
            auth_len = strcspn(auth, "/");
            at = memrchr(auth, '@', auth_len);
        }
        if (at) {
            char *colon = memchr(auth, ':', (size_t)(at - auth));
            if (colon)
                mask_span(buf, (size_t)(colon + 1 - buf), (size_t)(at - buf));
        }
        /* Parameters named in percent-encoding, which the search for "password" below misses. */
        for (char *param = strchr(auth, '?'); param; param = strchr(param, '&')) {
            param++;
            size_t plen = strcspn(param, "&");
            char *eq = memchr(param, '=', plen);
            if (eq && memchr(param, '%', (size_t)(eq - param)) &&
                secrets_encoded_password_key(param, (size_t)(eq - param)))
                mask_span(buf, (size_t)(eq + 1 - buf), (size_t)(param + plen - buf));
        }
    }

    /* password=... and sslpassword=... (the client key's passphrase) in key=value form (pairs
     * separated by any whitespace) or in a URL query string (?password=...&...). */
    for (char *p = buf; (p = strstr(p, "password")) != NULL;) {
        const char *key = p - buf >= 3 && strncmp(p - 3, "ssl", 3) == 0 ? p - 3 : p;
        /* Only a URL's query string separates parameters with '&'; in key=value form it is
         * part of the value ("password=abc&def" is the password abc&def). */
        bool in_query = key != buf && (key[-1] == '?' || key[-1] == '&');
        bool at_key_start = key == buf || isspace((unsigned char)key[-1]) || in_query;
        char *q = p + strlen("password");
        while (isspace((unsigned char)*q))
            q++;
        if (!at_key_start || *q != '=') {
            p += strlen("password");
            continue;
        }
        q++;
        while (isspace((unsigned char)*q))
            q++;
        size_t start = (size_t)(q - buf), end = start;
        if (in_query) {
            /* libpq (conninfo_uri_parse_params) ends a query value at '&' alone: blanks, quotes
             * and backslashes are part of it ("?password=correct horse"). */
            end += strcspn(buf + start, "&");
        } else if (buf[end] == '\'') {
            for (end++; buf[end] && buf[end] != '\''; end++)
                if (buf[end] == '\\' && buf[end + 1])
                    end++;
            if (buf[end] == '\'')
                end++;
        } else {
            /* libpq honours backslash escapes in unquoted values too ("se\ cret"). */
            for (; buf[end] && !isspace((unsigned char)buf[end]); end++)
                if (buf[end] == '\\' && buf[end + 1])
                    end++;
        }
        mask_span(buf, start, end);
        p = buf + start + 3;
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
    size_t passwords = 1; /* the URL userinfo */
    for (const char *p = src; (p = strstr(p, "password")) != NULL; p++)
        passwords++;
    for (const char *p = src; (p = strchr(p, '%')) != NULL; p++)
        passwords++; /* a query parameter named in percent-encoding */
    char *buf = malloc(len + 3 * passwords + 1);
    if (!buf) {
        snprintf(out, outlen, "***");
        return out;
    }
    memcpy(buf, src, len + 1);
    mask_in_place(buf);
    snprintf(out, outlen, "%s", buf);
    free(buf);
    return out;
}
