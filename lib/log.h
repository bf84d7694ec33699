/* log: one line per event on stderr, "TIMESTAMP level=LEVEL msg="..." key=value ...".
 *
 * Messages are plain text; fields are passed preformatted as "key=value" pairs in the format
 * string, so a call reads like the line it prints:
 *     log_info("claimed batch", "rows=%d", n);
 * Values that may hold spaces or quotes go through log_quote(); whatever a caller leaves
 * unquoted is still escaped (control, line-separator and bidi characters) before the line is
 * written, so no value can start a line of its own. Connection strings must go
 * through log_mask_conninfo() first: no password is ever written. */
#ifndef OUTBOX_LOG_H
#define OUTBOX_LOG_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR } LogLevel;

/* The lines' format: logfmt (the default) or one JSON object per line (log_json.h). */
typedef enum { LOG_FORMAT_TEXT, LOG_FORMAT_JSON } LogFormat;

/* Sets the format of every later line (default LOG_FORMAT_TEXT). */
void log_set_format(LogFormat format);

/* Sets the lowest level written (default LOG_INFO). */
void log_set_level(LogLevel level);
LogLevel log_get_level(void);

/* Parses "debug", "info", "warn" or "error". Returns false for anything else. */
bool log_level_parse(const char *name, LogLevel *out);
const char *log_level_name(LogLevel level);

/* Writes one line: msg is the human message, fields_fmt a printf format for the key=value part
 * (may be NULL or ""). A line longer than 2,046 characters is cut after the last field that fits
 * (the crossing one cut at a character with "..." and its closing quote, or dropped) and ends
 * with the bare word "cut". */
void log_write(LogLevel level, const char *msg, const char *fields_fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fields ("database=NAME") every later line written by this thread carries after msg, until
 * set again; NULL for none. The string is not copied: it must outlive its use. A process serving
 * several databases sets it as each database's work starts (relay_enter), so a line says whose
 * it is; librdkafka's threads have none of their own. */
void log_set_context(const char *fields);
/* The fields set by log_set_context for this thread, or NULL. */
const char *log_context(void);

#define log_debug(...) log_write(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_write(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_write(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)

/* Quotes a field value for a log line: wraps it in double quotes and escapes quotes and
 * backslashes (\" \\), C0 controls and DEL (\n, \xNN), invalid UTF-8 (\xNN per byte) and the
 * characters utf8_unsafe names (C1 controls, U+2028/U+2029, bidi and zero-width characters:
 * \uXXXX); registered secrets become "***". A value longer than the buffer is cut at a
 * character boundary with "...". Returns out (never more than outlen bytes with the NUL). Any
 * value from outside the relay's own code goes through this or log_escape before it is shown. */
const char *log_quote(const char *value, char *out, size_t outlen);

/* log_quote without the quotes (a quote character stays as it is): for text shown on a
 * terminal, such as the rows `outbox-relay dead` prints. Returns out. */
const char *log_escape(const char *value, char *out, size_t outlen);

/* Replaces control characters (newlines included), invalid UTF-8 and the characters
 * utf8_unsafe names with '?' in place, so text that echoes user input stays on one line for
 * every reader (the text only shrinks). */
void log_one_line(char *s);

/* Copies a libpq connection string (URL or key=value form) into out with any password replaced
 * by "***", read as libpq reads it: a URL only when it starts with postgresql:// or postgres://
 * (its user info's password as meant, from the first ':' to where secrets_url_userinfo_end
 * ends the user info: the last '@' before the query, which may lie past a '/' of the password;
 * password and sslpassword query parameters, names percent-decoded, each value to the next
 * '&'), else key=value pairs (password= and sslpassword=, quoted or not). A string starting
 * with another scheme (a Schema Registry URL, http://user:password@host) is read both ways,
 * and its user info is masked whole when it holds no ':' (http://APIKEY@host: a token).
 * Masked in full before it is cut to outlen; "***" alone when out of memory. Returns out. */
const char *log_mask_conninfo(const char *conninfo, char *out, size_t outlen);

/* Logs the warning that count secrets (secrets_too_short(), or a reload's own count) are too
 * short to be scrubbed from text: masked in connection strings only, so where they can still show
 * is said once rather than left to be found. Nothing when count is 0. */
void log_warn_short_secrets(size_t count);

#endif
