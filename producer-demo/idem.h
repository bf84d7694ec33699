/* idem: Idempotency-Key records (draft-ietf-httpapi-idempotency-key-header, and the seed designs).
 *
 * A key is scoped to one endpoint ("POST /orders") and lives in idempotency_keys with the
 * fingerprint of the request that first used it (SHA-256 of method, path and body) and the
 * response that request got. The record is written in the same transaction as the business
 * change it stands for, so a key and its effect are either both committed or both absent: a
 * crash leaves no half-done "in progress" row behind, and a retry after any failure simply runs
 * again. While that transaction is open its requests hold a transaction-level advisory lock on
 * the key; a concurrent request with the same key fails to take it and is told to retry (409).
 * The primary key on (endpoint, key) backs this up: two requests can never both claim a key. */
#ifndef PRODUCER_IDEM_H
#define PRODUCER_IDEM_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#include "db.h"

#define IDEM_KEY_MAX 255

/* Validates an Idempotency-Key header value and copies the key to out. Both the draft's form, a
 * Structured Field string ("..." with \" and \\ escapes), and the bare form most clients send
 * are accepted; either way the key itself must be 1-255 visible ASCII characters (0x21-0x7e).
 * Whitespace around the value is not part of it. On failure writes one line to err. */
bool idem_key_parse(const char *value, char out[IDEM_KEY_MAX + 1], char *err, size_t errlen)
    __attribute__((warn_unused_result));

typedef enum {
    IDEM_NEW,      /* the key is ours: do the work, then idem_complete, then COMMIT */
    IDEM_REPLAY,   /* same request seen before: answer with the stored response */
    IDEM_MISMATCH, /* the key was used for a different request: 422 */
    IDEM_BUSY,     /* a request with this key is still running: 409, retry later */
    IDEM_FAILED,   /* database error, see the DbError */
} IdemOutcome;

/* The request a key is presented with. */
typedef struct IdemRequest {
    const char *endpoint; /* method and path template, e.g. "POST /orders" */
    const char *key;
    const char *method;
    const char *path;
    const char *body;
    size_t body_len;
    long ttl_s; /* how long the record is kept */
} IdemRequest;

/* A stored response, malloc'd (idem_stored_free). */
typedef struct IdemStored {
    int status;
    char *body;
    char *location;    /* NULL when the response had no Location */
    char *etag;        /* NULL when the response had no ETag */
    long long left_ms; /* how long the record has left to live */
} IdemStored;

/* Must run first inside an open transaction on conn. Takes the key's lock without waiting, then
 * looks the key up (an expired record counts as absent) and, when it is new, claims it by
 * inserting its record with the request's fingerprint. On IDEM_REPLAY fills stored. */
IdemOutcome idem_claim(PGconn *conn, const IdemRequest *req, IdemStored *stored, DbError *e);

/* Reads req's committed record without claiming anything (no lock, no transaction needed), for
 * a duplicate that Redis's guard turned away: IDEM_REPLAY (stored filled, as for idem_claim),
 * IDEM_MISMATCH, IDEM_NEW when there is no live record (the key is in progress, or free), or
 * IDEM_FAILED with e filled. */
IdemOutcome idem_lookup(PGconn *conn, const IdemRequest *req, IdemStored *stored, DbError *e);

/* Stores the response of a claimed key, in the same transaction, and starts its lifetime:
 * expires_at = completion + req->ttl_s. location and etag may be NULL. */
bool idem_complete(PGconn *conn, const IdemRequest *req, int status, const char *body,
                   const char *location, const char *etag, DbError *e)
    __attribute__((warn_unused_result));

/* The request's fingerprint as 64 lower-case hex digits (SHA-256 of "METHOD PATH\nBODY", the
 * value idem_claim stores as request_hash), computed here so that a response cached outside
 * PostgreSQL (rcache.h) can be checked without it. */
void idem_fingerprint(const IdemRequest *req, char out[65]);

/* Reads row 0 of a SELECT_STORED result (idem.c): IDEM_MISMATCH when the fingerprint differs,
 * IDEM_REPLAY with stored filled (the caller frees it), or IDEM_FAILED with e filled when a copy
 * could not be made (out of memory), stored then empty: never a partial answer to replay.
 * Exported for the unit tests. */
IdemOutcome idem_stored_read(const PGresult *res, IdemStored *stored, DbError *e);

void idem_stored_free(IdemStored *s);

/* Deletes up to batch expired records in one short transaction; rows locked by a request that is
 * reusing an expired key are skipped. Returns how many were deleted, or -1 with e. */
long idem_cleanup_batch(PGconn *conn, long batch, DbError *e);

#endif
