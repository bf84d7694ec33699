/* strbuf: a growing text buffer, and PostgreSQL array literals built in it.
 *
 * The relay passes lists (row ids, error texts, lanes) to the server as one text parameter in
 * array-literal form ('{1,2,3}', '{"a","b"}'), so one statement covers a whole batch. */
#ifndef OUTBOX_STRBUF_H
#define OUTBOX_STRBUF_H

#include <stddef.h>

typedef struct StrBuf {
    char *s; /* NUL-terminated once anything was added; NULL before */
    size_t len, cap;
} StrBuf;

void strbuf_reset(StrBuf *b);
void strbuf_free(StrBuf *b);
void strbuf_append(StrBuf *b, const char *s, size_t n);
void strbuf_puts(StrBuf *b, const char *s);

/* Array literals: strbuf_array_begin, then any number of elements, then strbuf_array_end. */
void strbuf_array_begin(StrBuf *b);
void strbuf_array_int(StrBuf *b, long long v);
/* Appends s quoted ("..." with " and \ escaped); NULL appends the SQL NULL element. The element is
 * always well-formed UTF-8, whatever s holds: a byte that is not part of a well-formed sequence
 * (a character cut in two, Latin-1 text) is replaced by U+FFFD, so a text can never make the
 * server reject the statement that carries it. */
void strbuf_array_text(StrBuf *b, const char *s);
void strbuf_array_end(StrBuf *b);

/* True when the array literal in b has no element ("{}"). */
int strbuf_array_empty(const StrBuf *b);

#endif
