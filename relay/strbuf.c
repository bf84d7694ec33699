#include "strbuf.h"

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
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *grown = realloc(b->s, cap);
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
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\')
            strbuf_append(b, "\\", 1);
        strbuf_append(b, p, 1);
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
