/* fuzz_text: text from writers and the database on its way to a log line, a terminal or a header
 * name (lib/log.c, lib/utf8.c, relay/outbox/route.c; issue 46). Any bytes, NUL-terminated.
 *
 * Checks that log_quote and log_escape, at every buffer size, stay in bounds and produce valid
 * UTF-8 with no control byte and no character utf8_unsafe names (so no reader splits the line or
 * lets a terminal act on it); that log_one_line leaves the same guarantees; and that for plain
 * printable ASCII names route_header_reserved is exactly the old case-insensitive rule. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "route.h"
#include "utf8.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_ERROR + 1);
    return 0;
}

/* Aborts unless s is valid UTF-8 free of controls and unsafe characters. */
static void check_clean(const char *s)
{
    for (const char *p = s; *p;) {
        int32_t cp;
        size_t n = utf8_decode(p, &cp);
        if (cp < 0 || utf8_unsafe(cp))
            abort();
        p += n;
    }
}

static bool old_reserved(const char *name, bool identity)
{
    return strcasecmp(name, "id") == 0 || strncasecmp(name, "dlq.", 4) == 0 ||
           (identity &&
            (strcasecmp(name, "event_type") == 0 || strcasecmp(name, "aggregate_type") == 0));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *in = malloc(size + 1);
    memcpy(in, data, size);
    in[size] = '\0';

    static const size_t sizes[] = {1, 7, 8, 9, 16, 33, 64, 300};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        char *out = malloc(sizes[i]); /* exact size: ASan sees a one-byte overrun */
        log_quote(in, out, sizes[i]);
        if (strnlen(out, sizes[i]) >= sizes[i])
            abort();
        check_clean(out);
        log_escape(in, out, sizes[i]);
        if (strnlen(out, sizes[i]) >= sizes[i])
            abort();
        check_clean(out);
        free(out);
    }

    char *copy = strdup(in);
    log_one_line(copy);
    check_clean(copy);
    free(copy);

    bool ascii = true;
    for (const char *p = in; *p && ascii; p++)
        ascii = *p >= 0x20 && *p < 0x7f;
    for (int identity = 0; identity < 2; identity++) {
        bool r = route_header_reserved(in, identity);
        if (ascii && r != old_reserved(in, identity))
            abort();
    }
    free(in);
    return 0;
}
