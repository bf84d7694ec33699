/* sha256: SHA-256 (FIPS 180-4), for the demos' digests checked outside PostgreSQL:
 * producer-demo's Idempotency-Key fingerprints and consumer-demo's payload digests.
 *
 * What PostgreSQL stores is sha256() of the same bytes; computing it here lets an entry cached in
 * Redis be checked without a database round trip, and without linking a crypto library for one
 * function. Not constant-time: it hashes bytes a client or a producer sent, nothing secret. */
#ifndef OUTBOX_SHA256_H
#define OUTBOX_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct Sha256 {
    uint32_t h[8];
    uint64_t bytes; /* message length so far */
    unsigned char block[64];
    size_t used; /* bytes in block */
} Sha256;

/* Starts a digest. */
void sha256_init(Sha256 *s);

/* Adds len bytes of data (any length, any number of calls). */
void sha256_update(Sha256 *s, const void *data, size_t len);

/* Writes the 32-byte digest to out; s must be initialised again before reuse. */
void sha256_final(Sha256 *s, unsigned char out[32]);

/* The digest of data[0..len) in one call, as 64 lower-case hex characters and a NUL in out. */
void sha256_hex(const void *data, size_t len, char out[65]);

#endif
