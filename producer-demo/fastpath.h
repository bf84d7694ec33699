/* fastpath: Idempotency-Key responses cached in Redis, in front of idempotency_keys.
 *
 * PostgreSQL stays the source of truth: a response goes into Redis only after the transaction
 * that stored it committed (or after PostgreSQL replayed it), with a TTL no longer than the
 * key's remaining lifetime there, so Redis never knows a key PostgreSQL has forgotten or holds an
 * answer PostgreSQL would not give. The cached entry carries the request's fingerprint: a retry
 * with another body still gets 422. A miss, a malformed entry or an unreachable Redis all mean
 * "ask PostgreSQL"; nothing here can change an answer, only how fast it comes.
 *
 * The in-progress guard (SET NX PX) turns a concurrent duplicate away before it takes a
 * transaction: a guard found taken is checked against PostgreSQL's record with one SELECT (a
 * finished request replays; only a key with no committed record gets 409), so a guard whose
 * release was lost (a late reply, Redis dropping between take and release) never blocks a
 * finished request. The PostgreSQL advisory lock (idem.h) remains the real exclusion: the
 * guard may be missing (Redis down, flushed) at no cost but a database round trip. A guard left
 * by a crashed process expires after guard_ms: that is the bound on how long a key can look "in
 * progress" after a crash (PostgreSQL's own in-progress state ends with the transaction, when the
 * server sees the connection close). */
#ifndef PRODUCER_FASTPATH_H
#define PRODUCER_FASTPATH_H

#include <stdbool.h>

#include "idem.h"
#include "rcache.h"

typedef enum {
    FAST_MISS,     /* not cached, or Redis unavailable: go to PostgreSQL */
    FAST_HIT,      /* same request seen before: stored is filled */
    FAST_MISMATCH, /* the key was used with a different request: 422 */
} FastOutcome;

/* Looks req's key up; fp is idem_fingerprint(req). On FAST_HIT fills stored (idem_stored_free;
 * left_ms is 0). */
FastOutcome fastpath_lookup(RCache *rc, const IdemRequest *req, const char *fp, IdemStored *stored);

/* Scopes every key by the database's identity (its oid and name, and the cluster's system
 * identifier when readable), so a producer pointed at another database never answers from
 * responses cached for this one. Call once before serving; characters that would blur the key's
 * structure become '_'. */
void fastpath_set_namespace(const char *name);

/* Caches a committed response for ttl_ms (nothing when ttl_ms < 1). etag and location may be
 * NULL. force: write even while Redis rests after a failure (rcache_command_ex), for the
 * response of a request whose guard Redis may hold. Failures are ignored: the next retry asks
 * PostgreSQL. */
void fastpath_store(RCache *rc, const IdemRequest *req, const char *fp, int status,
                    const char *body, const char *location, const char *etag, long long ttl_ms,
                    bool force);

typedef enum {
    GUARD_TAKEN,       /* ours: release it with fastpath_release */
    GUARD_BUSY,        /* another request with this key holds it: 409 */
    GUARD_UNAVAILABLE, /* not sent (Redis resting or unreachable): go on without a guard */
    GUARD_UNKNOWN,     /* sent, but no reply in time: Redis may hold it; go on, release it after */
} GuardOutcome;

/* Takes the key's in-progress guard for guard_ms; token (33 bytes) receives the value that
 * proves ownership at release. */
GuardOutcome fastpath_guard(RCache *rc, const IdemRequest *req, long guard_ms, char token[33]);

/* Deletes the guard if it is still ours (a guard that expired and was taken by another request
 * is left alone). Tried even while Redis rests after a failure: a guard left behind would turn
 * retries of a finished request away until it expires. */
void fastpath_release(RCache *rc, const IdemRequest *req, const char token[33]);

#endif
