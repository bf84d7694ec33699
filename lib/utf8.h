/* utf8: decoding one character at a time, and the characters that must never reach a log line,
 * a terminal or a name a consumer compares (docs/security.md).
 *
 * Byte-wise escaping (control bytes below 0x20) is not enough for readers that decode text:
 * Java, JavaScript and Unicode-aware log viewers split lines at U+0085, U+2028 and U+2029;
 * terminals act on C1 controls (0x9b is CSI); bidi overrides and isolates reorder what a person
 * sees; zero-width and other format characters make two different names look the same; and
 * invalid UTF-8 decodes differently in each reader (a lone 0x85 byte is NEL in Latin-1). */
#ifndef OUTBOX_UTF8_H
#define OUTBOX_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Decodes the character at s (s[0] != '\0'). Returns its length in bytes (1 to 4) and sets *cp
 * to the code point; a byte that does not start a valid shortest-form sequence of a scalar
 * value (overlong forms, surrogates, above U+10FFFF, cut sequences) is returned alone with
 * *cp = -1. Never reads past a NUL. */
size_t utf8_decode(const char *s, int32_t *cp);

/* Whether s (NUL-terminated) is well-formed UTF-8 throughout, as utf8_decode reads it: what
 * strbuf_array_text passes through unchanged (it writes each other byte as U+FFFD). */
bool utf8_valid(const char *s);

/* True for code points that are invisible or steer the display rather than show a glyph: C0
 * and C1 controls, DEL, U+2028/U+2029, bidi marks, embeddings, overrides and isolates
 * (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069), zero-width and other format characters
 * (U+00AD, U+034F, U+200B-U+200D, U+2060-U+2064, U+FEFF, variation selectors, tags, Hangul
 * fillers). Such a character never belongs in a log line, a terminal or a header name. */
bool utf8_unsafe(int32_t cp);

/* True for combining marks (U+0300-U+036F and the other combining blocks): drawn on the
 * preceding letter, so "i" + U+0307 looks like a plain "i". */
bool utf8_combining(int32_t cp);

#endif
