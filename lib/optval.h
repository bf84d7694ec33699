/* optval: checking and storing one textual option value, with the one-line errors every program
 * gives for bad values. Used by the option engine (opts.c) and the checks around it (the
 * relay's config.c and table.c). */
#ifndef OUTBOX_OPTVAL_H
#define OUTBOX_OPTVAL_H

#include <stdbool.h>
#include <stddef.h>

/* Formats one line into err (control characters replaced, since values are echoed back) and
 * returns false, so callers can `return optval_fail(...)`. */
bool optval_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Replaces *slot with a copy of value; an empty value is an error naming source. */
bool optval_string(char **slot, const char *value, const char *source, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Parses a decimal integer in [min, max] into *out: digits only (no sign, no blanks), since no
 * option takes a negative number; anything else is an error naming source. */
bool optval_long(long *out, const char *value, long min, long max, const char *source, char *err,
                 size_t errlen) __attribute__((warn_unused_result));

#endif
