#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static LogLevel min_level = LOG_INFO;

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
    if (fields_fmt && *fields_fmt && len < (int)sizeof(line) - 1) {
        line[len++] = ' ';
        va_list ap;
        va_start(ap, fields_fmt);
        int n = vsnprintf(line + len, sizeof(line) - (size_t)len, fields_fmt, ap);
        va_end(ap);
        if (n > 0)
            len += n;
    }
    if (len > (int)sizeof(line) - 2)
        len = (int)sizeof(line) - 2;
    line[len++] = '\n';
    fwrite(line, 1, (size_t)len, stderr);
}

const char *log_quote(const char *value, char *out, size_t outlen)
{
    size_t o = 0;
    if (outlen < 8) {
        if (outlen)
            out[0] = '\0';
        return out;
    }
    out[o++] = '"';
    for (const char *p = value ? value : ""; *p; p++) {
        unsigned char c = (unsigned char)*p;
        char esc[8];
        size_t n;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            n = 2;
        } else if (c == '\n') {
            memcpy(esc, "\\n", 2);
            n = 2;
        } else if (c < 0x20 || c == 0x7f) {
            n = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", c);
        } else {
            esc[0] = (char)c;
            n = 1;
        }
        /* Keep room for "..." plus the closing quote and NUL. */
        if (o + n + 5 > outlen) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(out + o, esc, n);
        o += n;
    }
    out[o++] = '"';
    out[o] = '\0';
    return out;
}

/* Replaces [start, end) of out (a copy of the conninfo) with "***". */
static void mask_span(char *out, size_t outlen, size_t start, size_t end)
{
    size_t tail = strlen(out + end);
    if (start + 3 + tail + 1 > outlen)
        tail = outlen - start - 4;
    memmove(out + start + 3, out + end, tail);
    memcpy(out + start, "***", 3);
    out[start + 3 + tail] = '\0';
}

const char *log_mask_conninfo(const char *conninfo, char *out, size_t outlen)
{
    if (outlen == 0)
        return out;
    snprintf(out, outlen, "%s", conninfo ? conninfo : "");

    /* URL form: scheme://user:password@host... -> mask between ':' and '@' of the authority. */
    char *scheme = strstr(out, "://");
    if (scheme) {
        char *auth = scheme + 3;
        size_t auth_len = strcspn(auth, "/?#");
        char *at = memrchr(auth, '@', auth_len);
        if (at) {
            char *colon = memchr(auth, ':', (size_t)(at - auth));
            if (colon)
                mask_span(out, outlen, (size_t)(colon + 1 - out), (size_t)(at - out));
        }
    }

    /* password=... in key=value form or in a URL query string (?password=...&...). */
    for (char *p = out; (p = strstr(p, "password")) != NULL;) {
        bool at_key_start = p == out || p[-1] == ' ' || p[-1] == '?' || p[-1] == '&';
        char *q = p + strlen("password");
        while (*q == ' ')
            q++;
        if (!at_key_start || *q != '=') {
            p += strlen("password");
            continue;
        }
        q++;
        while (*q == ' ')
            q++;
        size_t start = (size_t)(q - out), end = start;
        if (out[end] == '\'') {
            for (end++; out[end] && out[end] != '\''; end++)
                if (out[end] == '\\' && out[end + 1])
                    end++;
            if (out[end] == '\'')
                end++;
        } else {
            while (out[end] && out[end] != ' ' && out[end] != '&')
                end++;
        }
        mask_span(out, outlen, start, end);
        p = out + start + 3;
    }
    return out;
}
