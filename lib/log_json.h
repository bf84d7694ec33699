/* log_json: the log's lines as JSON objects (--log-format json), for collectors that parse JSON
 * rather than logfmt.
 *
 * log.c builds every line in logfmt first (one place formats fields, quotes values and scrubs
 * secrets); this turns such a finished line into one JSON object with the same keys: "ts",
 * "level", "msg", then each field in order. Quoted values are unescaped from log_quote's form and
 * escaped again for JSON (a byte of invalid UTF-8, \xNN from 80 up, becomes U+FFFD: JSON text is
 * UTF-8); a bare integer becomes a JSON number, every other value a string. */
#ifndef OUTBOX_LOG_JSON_H
#define OUTBOX_LOG_JSON_H

#include <stddef.h>

/* Writes the JSON object for logfmt (a line as log_write builds it, without its newline) into out,
 * NUL-terminated, one line and valid JSON: the fields that do not fit whole are left out, and
 * "cut":true ends the object then. outlen under 64 writes "" (returns 0). Returns its length. */
size_t log_json_line(const char *logfmt, char *out, size_t outlen);

#endif
