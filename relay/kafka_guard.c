#include "kafka_guard.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* From librdkafka's CONFIGURATION.md (2.0.2), every property that loads code, runs a command
 * or writes a file. Properties of type "see dedicated API" (callbacks, interceptors) cannot be
 * set from strings at all; the rest only read files (CA, keys, CRL), which the relay's user may
 * read anyway. */
typedef struct {
    const char *name;
    const char *why;
} Guarded;

static const Guarded guarded[] = {
    {"plugin.library.paths", "loads shared libraries (dlopen) into the relay"},
    {"sasl.kerberos.kinit.cmd", "is a shell command the relay runs"},
    {"sasl.kerberos.keytab", "is pasted into the kinit shell command"},
    {"sasl.kerberos.principal", "is pasted into the kinit shell command"},
    {"ssl.engine.location", "loads an OpenSSL engine library into the relay"},
    {"ssl.engine.id", "loads an OpenSSL engine (a shared library) into the relay"},
    {"ssl.providers", "loads OpenSSL provider modules into the relay"},
    {"offset.store.path", "writes offset files"},
    {"offset.store.method", "file: writes offset files"},
};
#define N_GUARDED (sizeof(guarded) / sizeof(guarded[0]))

/* The name of s, with the blanks around it skipped: *len bytes from the returned pointer. */
static const char *trimmed(const char *s, size_t *len)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    *len = n;
    return s;
}

static const Guarded *find(const char *name, size_t len)
{
    for (size_t i = 0; i < N_GUARDED; i++)
        if (strlen(guarded[i].name) == len && strncasecmp(guarded[i].name, name, len) == 0)
            return &guarded[i];
    return NULL;
}

/* True when allow (comma-separated names) names g. */
static bool allowed(const Guarded *g, const char *allow)
{
    if (!allow)
        return false;
    size_t want = strlen(g->name);
    for (const char *p = allow; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len > 0 && (*p == ' ' || *p == '\t'))
            p++, len--;
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
            len--;
        if (len == want && strncasecmp(p, g->name, len) == 0)
            return true;
        if (!comma)
            break;
        p = comma + 1;
    }
    return false;
}

bool kafka_guard_check(const char *key, const char *value, const char *allow, const char *origin,
                       char *err, size_t errlen)
{
    (void)value;
    size_t len;
    const char *name = trimmed(key, &len);
    const Guarded *g = find(name, len);
    if (!g || allowed(g, allow))
        return true;
    snprintf(err, errlen, "%s: refused, it %s; allow it with --kafka-allow-unsafe %s if you must",
             origin, g->why, g->name);
    return false;
}

bool kafka_guard_check_allow(const char *allow, char *err, size_t errlen)
{
    for (const char *p = allow; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *q = p;
        while (len > 0 && (*q == ' ' || *q == '\t'))
            q++, len--;
        while (len > 0 && (q[len - 1] == ' ' || q[len - 1] == '\t'))
            len--;
        if (!find(q, len)) {
            char names[512] = "";
            size_t used = 0;
            for (size_t i = 0; i < N_GUARDED && used < sizeof(names); i++)
                used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s", i ? ", " : "",
                                         guarded[i].name);
            /* The name is echoed only when it is plain text (the error stays one line). */
            bool plain = len > 0 && len <= 64;
            for (size_t i = 0; plain && i < len; i++)
                plain = q[i] > ' ' && q[i] < 127;
            snprintf(err, errlen, "--kafka-allow-unsafe: \"%.*s\" is not a guarded property (%s)",
                     plain ? (int)len : 0, q, names);
            return false;
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    return true;
}
