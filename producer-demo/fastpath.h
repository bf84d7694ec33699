/* fastpath: Idempotency-Key responses cached in Redis, in front of idempotency_keys.
 *
 * PostgreSQL stays the source of truth: a response goes into Redis only after the transaction
 * that stored it committed (or after PostgreSQL replayed it), with a TTL no longer than the
 * key's remaining lifetime there, so Redis never knows a key PostgreSQL has forgotten or holds an
 * answer PostgreSQL would not give. The cached entry carries the request's fingerprint: a retry
 * with another body still gets 422. A miss, a malformed entry or an unreachable Redis all mean
 * "ask PostgreSQL"; nothing here can change an answer, only how fast it comes.
 *
 * The in-progress guard (SET NX PX) answers 409 to a concurrent duplicate before it takes a
 * database connection. The PostgreSQL advisory lock (idem.h) remains the real exclusion: the
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

/* Caches a committed response for ttl_ms (nothing when ttl_ms < 1). etag and location may be
 * NULL. Failures are ignored: the next retry asks PostgreSQL. */
void fastpath_store(RCache *rc, const IdemRequest *req, const char *fp, int status,
                    const char *body, const char *location, const char *etag, long long ttl_ms);

typedef enum {
    GUARD_TAKEN,       /* ours: release it with fastpath_release */
    GUARD_BUSY,        /* another request with this key holds it: 409 */
    GUARD_UNAVAILABLE, /* Redis did not answer: go on without a guard */
} GuardOutcome;

/* Takes the key's in-progress guard for guard_ms; token (33 bytes) receives the value that
 * proves ownership at release. */
GuardOutcome fastpath_guard(RCache *rc, const IdemRequest *req, long guard_ms, char token[33]);

/* Deletes the guard if it is still ours (a guard that expired and was taken by another request
 * is left alone). */
void fastpath_release(RCache *rc, const IdemRequest *req, const char token[33]);

#endif
