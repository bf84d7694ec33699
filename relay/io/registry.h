/* registry: a Confluent Schema Registry client for the event loop.
 *
 * It fetches the schema a subject holds (GET /subjects/{subject}/versions/{latest|N}) and keeps
 * it for the life of the process, as Confluent's serializers with use.latest.version cache the
 * version they found; a subject it lacks is asked again after 5 s, and at most 1,000 such
 * subjects are remembered (the least recently looked up forgotten first). Requests for subjects
 * without a schema at hand are budgeted (lookup_burst at once, then lookup_rate a second, from
 * --schema-registry-lookup-rate; 100 and 20 by default): beyond it a new subject's
 * lookup is PENDING (no request, no entry; the ready callback comes when the budget allows one), a
 * subject known missing stays MISSING, and one line a minute at most says lookups are held back, so
 * rows naming many subjects the registry lacks cannot flood it. Requests go through libcurl's multi
 * interface driven by libev (curl_multi_socket_action from ev_io and ev_timer watchers), so the
 * loop never waits for the registry; each request is bounded by the configured timeout. Several
 * base URLs are tried in turn after a failure. A registry that fails (no answer, timeout, 5xx,
 * 401/403, a 404 that is not its own "not found") is "down": no request for a subject is sent
 * again before its backoff (1 s doubling to 10 s) is over, nor any request to a URL that
 * answered a 429 or a 503 with Retry-After before that wait is over (at most 60 s; another URL
 * is asked meanwhile, or none), and one log line says each change between up and down. While it
 * is down the client asks again by itself, one request at a time:
 * the failed subject due first among those a row still looks up, at its backoff, else GET
 * /subjects at a backoff of its own (once in its place after a 404 or 403 there, a subject the
 * registry served, status alone: a 200 or its own "not found" is up), so that it comes back up when
 * the registry does though no row looks a subject up any more, or only a subject the registry
 * refuses alone (a 403 for it). The basic-auth password is registered with lib/secrets.h and never
 * logged.
 */
#ifndef OUTBOX_REGISTRY_H
#define OUTBOX_REGISTRY_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct Registry Registry;

typedef struct RegistryOptions {
    const char *urls;      /* base URLs, comma-separated: a path prefix and trailing slashes
                            * are kept, a query or fragment is refused (registry_new) */
    const char *auth_file; /* USER:PASSWORD on one line, or NULL: no authentication */
    const char *ca_file;   /* PEM CA bundle for https, or NULL: the system's; read once by
                            * registry_new (at most CONFIG_CA_FILE_MAX bytes) */
    long timeout_ms;       /* bound on each request, connection included */
    long version;          /* the subject's version to use; 0: the latest */
    double lookup_rate;    /* requests a second for subjects without a schema; 0: 20 */
    double lookup_burst;   /* ... and at once; 0: 100 */
} RegistryOptions;

/* What registry_lookup found. */
typedef enum {
    REGISTRY_OK,      /* *schema is filled */
    REGISTRY_PENDING, /* a request is in flight: the ready callback says when to ask again */
    REGISTRY_DOWN,    /* the registry failed and its backoff is not over; the ready callback
                       * comes when a retry succeeds */
    REGISTRY_MISSING, /* the registry answered that the subject (or version) does not exist */
} RegistryStatus;

typedef enum { REGISTRY_AVRO, REGISTRY_JSON, REGISTRY_PROTOBUF } RegistrySchemaType;

/* A schema as the registry holds it. The strings live as long as the registry. parsed is the
 * serializer's slot: it may set it (once) on the cached schema, and registry_free frees it. */
typedef struct RegistrySchema {
    int id;
    int version;
    RegistrySchemaType type;
    const char *subject;
    const char *text;
    void *parsed;
} RegistrySchema;

/* Called on the loop when a lookup that answered PENDING or DOWN may now give another answer. */
typedef void (*RegistryReadyFn)(void *arg);

/* Creates the client. Reads the auth file (its password becomes a registered secret). Returns
 * NULL with one line in err (unreadable or malformed file, no URL, a URL with a query or a
 * fragment, curl failing to start). */
Registry *registry_new(struct ev_loop *loop, const RegistryOptions *o, RegistryReadyFn ready,
                       void *arg, char *err, size_t errlen);

/* Cancels what is in flight and frees everything, calling free_parsed on each parsed schema. */
void registry_free(Registry *r, void (*free_parsed)(void *));

/* The schema of subject, from the cache or by a request started now (then PENDING; PENDING too,
 * without a request, when the lookup budget is spent). On MISSING, err says what the registry
 * answered. Never blocks. */
RegistryStatus registry_lookup(Registry *r, const char *subject, const RegistrySchema **schema,
                               char *err, size_t errlen);

/* How many subjects the client keeps (with a schema, without one, or in flight): those without a
 * schema are bounded (the least recently looked up are dropped beyond 1,000), so that subjects
 * made from rows' text cannot grow it without end. For tests and the curious. */
size_t registry_cached(const Registry *r);

/* Whether the client keeps an entry for subject (for tests: no lookup, nothing changes). */
bool registry_knows(const Registry *r, const char *subject);

/* Whether a 404's body (len bytes, need not be NUL-terminated; NULL: none) is the registry's
 * own "not found" ({"error_code": 40401 | 40402 | ..., "message": ...}, as Confluent's registry
 * and the ones compatible with it answer): only then does the subject or version not exist. Any
 * other 404 (a proxy's page, a wrong base URL) is a failure of the registry, as a 5xx. */
bool registry_not_found(const char *body, size_t len);

/* True unless the last request failed for the registry's sake (down, 5xx, auth, a 429's or 503's
 * Retry-After). An answer that comes while every URL is held by such a wait leaves it as it is:
 * the rechecks bring it up once the wait is over. */
bool registry_up(const Registry *r);

/* Start-up check, before the loop runs: GET /subjects on every URL at once, blocking until the
 * first answer (a 404, a 429 or a 3xx on /subjects is none; a 429's or 503's Retry-After holds
 * its URL as a lookup's does) and at most one --schema-registry-timeout however many URLs are
 * down; of the URLs answered by then, the first in order becomes the current one. Returns false
 * with one line in err when the registry refuses the credentials (401) or the CA file cannot verify
 * it, or when no URL answered but with a redirect (3xx: lookups follow none, so the URL is wrong;
 * err says where it points); true otherwise (a registry that is down at start-up is not an error:
 * rows wait for it), with a warning line in warn when none answered, when the first answer in order
 * was a 403 on /subjects (the credentials taken, listing refused: warn begins with "HTTP 403"; that
 * URL becomes the current one), or when the best answer was a 404 on /subjects (a base URL without
 * the registry's path, or a proxy routing only some paths: warn begins with "HTTP 404"; that URL
 * becomes the current one only when no other answered), or when a URL was passed over for a later
 * one that answered (it failed, answered 5xx, 429, 404 or a redirect, or had not answered yet: warn
 * begins with "passed over for URL: " and names each with why; after a 403's warning, "; passed
 * over: " does). It does not mark the registry down: only a lookup a row needs does (and
 * recheck_down, registry.c, brings it back up while down), so an idle relay never stays "down" on
 * the strength of its start-up. */
bool registry_probe(Registry *r, char *err, size_t errlen, char *warn, size_t warnlen)
    __attribute__((warn_unused_result));

/* After registry_probe on from: to, a registry of the same URLs that was not probed (another
 * database's of a --databases list, which one probe serves, or one a SIGHUP adds, from a running
 * database's), starts as from stands: the same current URL and the same URLs held for a 429's or
 * 503's Retry-After (until the same monotonic times). Returns whether it did: false, with
 * nothing done, when their URLs differ (or to is from). Before the loop runs, or on it before
 * to's first lookup. */
bool registry_take_probe(Registry *to, const Registry *from);

#endif
