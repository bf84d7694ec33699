#include "log_json.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef struct Out {
    char *s;
    size_t len, cap;
    bool full; /* something did not fit */
} Out;

static void put(Out *o, const char *text, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (o->len + 1 >= o->cap) {
            o->full = true;
            break;
        }
        o->s[o->len++] = text[i];
    }
    o->s[o->len] = '\0';
}

static void put_str(Out *o, const char *text)
{
    put(o, text, strlen(text));
}

/* One byte of a string value, escaped for JSON (bytes from 0x80 pass as they are). */
static void put_json_char(Out *o, unsigned char c)
{
    char esc[8];
    if (c == '"' || c == '\\') {
        esc[0] = '\\';
        esc[1] = (char)c;
        put(o, esc, 2);
    } else if (c == '\n') {
        put_str(o, "\\n");
    } else if (c < 0x20 || c == 0x7f) {
        snprintf(esc, sizeof(esc), "\\u%04x", c);
        put_str(o, esc);
    } else {
        put(o, (const char *)&c, 1);
    }
}

static int hex(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Whether text starts with n hex digits. */
static bool hex_run(const char *text, int n)
{
    for (int i = 0; i < n; i++)
        if (hex(text[i]) < 0)
            return false;
    return true;
}

static unsigned long hex_value(const char *text, int n)
{
    unsigned long v = 0;
    for (int i = 0; i < n; i++)
        v = v * 16 + (unsigned long)hex(text[i]);
    return v;
}

/* A code point as a JSON escape: \uXXXX, or a surrogate pair above U+FFFF. */
static void put_json_codepoint(Out *o, unsigned long cp)
{
    char esc[16];
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        cp = 0xfffd;
    if (cp > 0xffff)
        snprintf(esc, sizeof(esc), "\\u%04lx\\u%04lx", 0xd800 + ((cp - 0x10000) >> 10),
                 0xdc00 + ((cp - 0x10000) & 0x3ff));
    else
        snprintf(esc, sizeof(esc), "\\u%04lx", cp);
    put_str(o, esc);
}

/* Copies the value at *p (quoted the way log_quote writes it, or bare up to the next space) as a
 * JSON value; advances *p past it. */
static void put_value(Out *o, const char **p)
{
    const char *v = *p;
    if (*v == '"') {
        put_str(o, "\"");
        for (v++; *v && *v != '"'; v++) {
            if (*v == '\\' && v[1] == 'n') {
                put_json_char(o, '\n');
                v++;
            } else if (*v == '\\' && v[1] == 'x' && hex(v[2]) >= 0 && hex(v[3]) >= 0) {
                /* log_quote writes a byte of invalid UTF-8 this way too: copied back as it is,
                 * it would make the line invalid JSON (RFC 8259 requires UTF-8), and collectors
                 * drop such a line; it is U+FFFD then, as strict decoders show it. */
                unsigned char c = (unsigned char)(hex(v[2]) * 16 + hex(v[3]));
                if (c >= 0x80)
                    put_json_codepoint(o, 0xfffd);
                else
                    put_json_char(o, c);
                v += 3;
            } else if (*v == '\\' && (v[1] == 'u' || v[1] == 'U') &&
                       hex_run(v + 2, v[1] == 'u' ? 4 : 8)) {
                /* A character log_quote escaped (U+2028, a bidi control...): the same escape in
                 * JSON, which gives the reader the character and keeps the line one line. */
                put_json_codepoint(o, hex_value(v + 2, v[1] == 'u' ? 4 : 8));
                v += v[1] == 'u' ? 5 : 9;
            } else if (*v == '\\' && v[1]) {
                put_json_char(o, (unsigned char)*++v);
            } else {
                put_json_char(o, (unsigned char)*v);
            }
        }
        if (*v == '"')
            v++;
        put_str(o, "\"");
        *p = v;
        return;
    }
    size_t n = strcspn(v, " ");
    /* A plain integer (no sign but '-', no leading zero, at most 15 digits: exact in a double)
     * is a number; anything else a string. */
    size_t digits = v[0] == '-' ? 1 : 0;
    bool number = n > digits && n - digits <= 15 && !(v[digits] == '0' && n - digits > 1);
    for (size_t i = digits; number && i < n; i++)
        number = v[i] >= '0' && v[i] <= '9';
    if (number) {
        put(o, v, n);
    } else {
        put_str(o, "\"");
        for (size_t i = 0; i < n; i++)
            put_json_char(o, (unsigned char)v[i]);
        put_str(o, "\"");
    }
    *p = v + n;
}

/* What ends a line whose fields did not all fit: the object stays valid JSON and says so. */
static const char cut_mark[] = ",\"cut\":true}";

size_t log_json_line(const char *logfmt, char *out, size_t outlen)
{
    if (outlen == 0)
        return 0;
    out[0] = '\0';
    if (outlen < 64)
        return 0; /* not even the timestamp and the mark */
    /* Fields go in while they fit whole, with room kept for the mark: a cut inside a value
     * would leave no valid JSON, and a collector drops such a line altogether. */
    Out o = {out, 0, outlen - (sizeof(cut_mark) - 1), false};
    const char *p = logfmt;
    size_t ts = strcspn(p, " ");
    put_str(&o, "{\"ts\":\"");
    for (size_t i = 0; i < ts; i++)
        put_json_char(&o, (unsigned char)p[i]);
    put_str(&o, "\"");
    if (o.full || o.len + 2 > o.cap) { /* not a timestamp: an empty one, and the mark */
        o = (Out){out, 0, outlen, false};
        put_str(&o, "{\"ts\":\"\"");
        put_str(&o, cut_mark);
        return o.len;
    }
    p += ts;
    while (*p) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        size_t key = strcspn(p, "= "), before = o.len;
        put_str(&o, ",\"");
        for (size_t i = 0; i < key; i++)
            put_json_char(&o, (unsigned char)p[i]);
        put_str(&o, "\":");
        p += key;
        if (*p == '=') {
            p++;
            put_value(&o, &p);
        } else {
            put_str(&o, "true"); /* a bare word: a flag */
        }
        /* "}" must fit after the field, too. */
        if (o.full || o.len + 2 > o.cap) {
            o.len = before;
            o.cap = outlen;
            put_str(&o, cut_mark);
            return o.len;
        }
    }
    o.cap = outlen;
    put_str(&o, "}");
    return o.len;
}
