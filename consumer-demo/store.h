/* store: consumer-demo's writes to PostgreSQL (blocking libpq, one connection).
 *
 * The dedupe contract: an event's id goes into processed_events in the same transaction as its
 * effect. Either both commit or neither does, so after a crash the redelivered event is applied
 * exactly once, and a duplicate (the id is already there) changes nothing. The id's row also
 * keeps the digest of the payload that was applied, so a message that reuses the id for another
 * payload is told apart from a redelivery (a conflict) instead of passing as a duplicate. */
#ifndef CONSUMER_STORE_H
#define CONSUMER_STORE_H

#include <libpq-fe.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "db.h"
#include "event.h"

typedef enum {
    STORE_APPLIED,   /* the event's effect is committed */
    STORE_DUPLICATE, /* already applied earlier (same payload, or one recorded without a
                        digest): nothing written */
    STORE_CONFLICT,  /* the id was applied earlier with another payload: nothing written, the
                        first copy stays the truth */
    STORE_STALE,     /* recorded as processed, but the shipment holds this version or a newer
                        one: its state is unchanged */
    STORE_FAILED,    /* database error (e); nothing committed, retry the message */
    STORE_STOPPED,   /* asked to stop while a statement waited for the server: nothing
                        committed, and the connection is still busy with it (close it) */
} StoreResult;

/* Where a message came from. */
typedef struct MessagePos {
    const char *topic;
    int32_t partition;
    int64_t offset;
} MessagePos;

/* Bounds the session's waits for locks: lock_timeout 5 s, unless the connection string set a
 * stricter one. Call once on every new connection. False with e on failure. */
bool store_prepare_session(PGconn *conn, DbError *e) __attribute__((warn_unused_result));

/* In one transaction: records ev's id and payload digest in processed_events, then brings the
 * order's shipment to ev's state if ev's version is newer than the one the shipment holds:
 * creates it when there is none (either event type carries the whole order), updates it when
 * the version is higher, leaves it alone otherwise (STORE_STALE). The id is kept until now() +
 * ttl_s (expires_at), then swept. When the id is already there the transaction is rolled back
 * untouched: STORE_DUPLICATE when the recorded digest is ev's or unknown (NULL: a row from before
 * digests were kept), else STORE_CONFLICT with the recorded digest (64 hex characters) in
 * applied_sha256, which is left alone otherwise.
 *
 * Each statement runs at most 10 s (statement_timeout, 57014; less when the session is set
 * stricter) and, on a session prepared by store_prepare_session, waits for a lock at most 5 s
 * (55P03): STORE_FAILED then, like any outage. While a statement waits, *stop is looked at every
 * 100 ms: once it is set the wait is abandoned (STORE_STOPPED) and the caller must close conn. */
StoreResult store_apply(PGconn *conn, const OrderEvent *ev, const MessagePos *pos, long ttl_s,
                        const volatile sig_atomic_t *stop, char applied_sha256[65], DbError *e);

/* Deletes up to batch processed_events rows whose expires_at has passed, oldest first, skipping
 * rows locked by an apply in progress, in a transaction of its own. Bounded like store_apply: the
 * DELETE runs at most 10 s (57014) and waits for a lock at most 5 s (55P03), and a set *stop
 * abandons it (*stopped, the caller must close conn). Returns the rows deleted, or -1 with e
 * filled (or *stopped). */
long store_sweep(PGconn *conn, long batch, const volatile sig_atomic_t *stop, bool *stopped,
                 DbError *e);

/* An unusable message, as it came (key and payload may be absent: NULL). headers_json is a
 * JSON array of [name, value] pairs. */
typedef struct ParkedMessage {
    MessagePos pos;
    const char *key;
    size_t key_len;
    const char *payload;
    size_t payload_len;
    const char *headers_json;
    const char *reason;
} ParkedMessage;

/* Records m in parked_messages, once per topic/partition/offset (a redelivery changes nothing).
 * Bounded like store_apply (10 s per statement, 5 s per lock wait), and a set *stop abandons the
 * wait (*stopped: the caller must close conn). Returns false with e on a database error (or
 * *stopped). */
bool store_park(PGconn *conn, const ParkedMessage *m, const volatile sig_atomic_t *stop,
                bool *stopped, DbError *e) __attribute__((warn_unused_result));

#endif
