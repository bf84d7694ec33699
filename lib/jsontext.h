/* jsontext: steps over the tokens of JSON text that a parser (jansson) has already accepted, to
 * find where a value's text starts and ends: what a parser's tree does not keep (a number as
 * it was written, the offset of a member's value). It checks nothing: on text that is not
 * well-formed JSON each function still returns a position in [p, end] (p itself when p >= end)
 * and never reads at or past end, but which position is unspecified. Used by the reader of
 * the headers column (relay/outbox/route.c) and the serializer's walk beside jansson's tree
 * (relay/io/serializer.c). */
#ifndef OUTBOX_JSONTEXT_H
#define OUTBOX_JSONTEXT_H

/* Past the JSON white space (space, tab, LF, CR) at p; end at the most. Inline: the headers
 * column's fast reader calls it a few times per row. */
static inline const char *jsontext_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Past the closing quote of the JSON string whose opening quote is at p (backslash escapes
 * stepped over); end when the text ends first. */
const char *jsontext_string(const char *p, const char *end);

/* Past the JSON value at p (no white space before it): a string; an object or array with all
 * it holds, at any depth without recursion (no stack for deep nesting); else a number or a
 * literal, up to the next white space, ',', '}', ']' or NUL. end at the most. */
const char *jsontext_value(const char *p, const char *end);

#endif
