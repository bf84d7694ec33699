/* rcache: the demos' Redis client — a fast first check in front of PostgreSQL, never the
 * source of truth.
 *
 * Blocking hiredis contexts with a timeout on connect, send and receive, so no call waits longer
 * than timeout_ms (plus name resolution: give an address, not a slow DNS name). A call that
 * fails for any reason returns NULL and the caller goes on as if Redis were not configured:
 * every answer still comes from PostgreSQL, Redis only makes some of them cheaper. After a
 * failure the connection is dropped and Redis is left alone for RCACHE_RETRY_MS (calls return
 * NULL at once, without waiting), then tried again; each change of state (up -> down,
 * down -> up) is logged once and counted.
 *
 * Thread-safe: up to `size` calls run at once, each on a context of its own; a call that finds
 * every context busy does not wait and returns NULL (counted as skipped). */
#ifndef DEMO_RCACHE_H
#define DEMO_RCACHE_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>

#define RCACHE_RETRY_MS 1000 /* how long Redis is left alone after a failure */

typedef struct RCache RCache;

/* What happened so far; a snapshot (rcache_stats). */
typedef struct RCacheStats {
    bool up;        /* the last call reached Redis */
    long calls;     /* calls that got a reply */
    long failures;  /* calls that failed (timeout, connection, error reply) */
    long skipped;   /* calls not tried: Redis down since less than RCACHE_RETRY_MS, or busy */
    long outages;   /* up -> down changes */
    long recovered; /* down -> up changes */
} RCacheStats;

/* Parses "redis://HOST:PORT[/DB]" (HOST a name, an IPv4 address or [IPV6]; PORT 1-65535; DB
 * 0-15, default 0). Returns false with one line in err. */
bool rcache_parse_url(const char *url, char *host, size_t hostlen, int *port, int *db, char *err,
                      size_t errlen) __attribute__((warn_unused_result));

/* Creates a client for url (checked with rcache_parse_url) with size contexts (>= 1), each call
 * bounded by timeout_ms. Nothing connects yet: a Redis that is down at start is just down. NULL
 * with one line in err on a bad URL or no memory. */
RCache *rcache_new(const char *url, int size, int timeout_ms, char *err, size_t errlen);

/* Runs one command (hiredis format: %s for a C string, %b for pointer + length). Returns the
 * reply, to be freed with freeReplyObject, or NULL when Redis is unavailable, too slow, or
 * answered with an error; never waits longer than the timeout. */
redisReply *rcache_command(RCache *c, const char *fmt, ...) __attribute__((warn_unused_result));

/* rcache_command with two more controls, for calls that settle state a reply may have been
 * lost for. force: try even while Redis is resting after a failure (a late reply that made it
 * "down" says nothing about the next call; the bound is still the timeout). sent (may be NULL):
 * set to true when the command went out on a connection, so Redis may have run it although NULL
 * is returned (a timeout); false when it surely did not run (resting, busy, no connection). */
redisReply *rcache_command_ex(RCache *c, bool force, bool *sent, const char *fmt, ...)
    __attribute__((warn_unused_result));

/* The counters so far. */
RCacheStats rcache_stats(RCache *c);

/* Closes every context; no call may be running. NULL is allowed. */
void rcache_free(RCache *c);

#endif
