#include "strbuf.h"

#include "utf8.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void strbuf_reset(StrBuf *b)
{
    b->len = 0;
    if (b->s)
        b->s[0] = '\0';
}

void strbuf_free(StrBuf *b)
{
    free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
}

void strbuf_append(StrBuf *b, const char *s, size_t n)
{
    /* A size past SIZE_MAX would wrap (the copy then runs off the buffer) and doubling past it
     * would reach 0 and never end: no memory can hold it, so it is out of memory. */
    bool too_big = n > SIZE_MAX - 1 - b->len;
    if (too_big || b->len + n + 1 > b->cap) {
        size_t need = too_big ? 0 : b->len + n + 1, cap = b->cap ? b->cap : 256;
        while (!too_big && need > cap)
            cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        char *grown = too_big ? NULL : realloc(b->s, cap);
        if (!grown) {
            /* Nothing sensible to do half way through building a statement. */
            fputs("outbox-relay: out of memory\n", stderr);
            abort();
        }
        b->s = grown;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void strbuf_puts(StrBuf *b, const char *s)
{
    strbuf_append(b, s, strlen(s));
}

void strbuf_array_begin(StrBuf *b)
{
    strbuf_reset(b);
    strbuf_append(b, "{", 1);
}

static void separate(StrBuf *b)
{
    if (b->len > 1)
        strbuf_append(b, ",", 1);
}

void strbuf_array_int(StrBuf *b, long long v)
{
    char num[32];
    separate(b);
    strbuf_append(b, num, (size_t)snprintf(num, sizeof(num), "%lld", v));
}

void strbuf_array_text(StrBuf *b, const char *s)
{
    separate(b);
    if (!s) {
        strbuf_append(b, "NULL", 4);
        return;
    }
    strbuf_append(b, "\"", 1);
    for (const char *p = s; *p;) {
        int32_t cp;
        size_t n = utf8_decode(p, &cp);
        if (cp < 0) {
            /* Error texts are cut to fit buffers and quote whatever a row or a library said, so
             * one can end inside a character or hold bytes that are not UTF-8 at all; the server
             * would reject the whole statement for it. Each such byte becomes U+FFFD. */
            strbuf_append(b, "\xEF\xBF\xBD", 3);
            p++;
            continue;
        }
        if (*p == '"' || *p == '\\')
            strbuf_append(b, "\\", 1);
        strbuf_append(b, p, n);
        p += n;
    }
    strbuf_append(b, "\"", 1);
}

void strbuf_array_end(StrBuf *b)
{
    strbuf_append(b, "}", 1);
}

int strbuf_array_empty(const StrBuf *b)
{
    return b->len <= 2;
}
