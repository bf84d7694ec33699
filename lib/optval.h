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

/* Replaces *slot with a copy of value (the old one freed zeroed: secrets_free_zeroed, an
 * option's value may be a secret); an empty value is an error naming source. */
bool optval_string(char **slot, const char *value, const char *source, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Parses a decimal integer in [min, max] into *out: digits only (no plus sign, no blanks), with
 * a leading minus sign only when min is negative (replay's --from-id and --to-id: an outbox id
 * may be 0 or negative); anything else is an error naming source. */
bool optval_long(long *out, const char *value, long min, long max, const char *source, char *err,
                 size_t errlen) __attribute__((warn_unused_result));

/* Opens, read-only and close-on-exec, the file at path that option names. While the event loop
 * runs (running: a SIGHUP reload, a database added by one) only a regular file, opened
 * O_NONBLOCK: a FIFO's open waits for a writer and a device's read may never end, either one
 * freezing every database. Before it runs, anything readable but a directory (a pipe given at
 * start-up: --database-url-file <(...)). Returns the descriptor, which the caller closes, or -1
 * with one line naming option and path in err. */
int optval_open_file(const char *option, const char *path, bool running, char *err, size_t errlen);

#endif
