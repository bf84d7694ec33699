/* Random text around a secret, for the unit tests that look for a password leaking through
 * what the relay shows of a connection string (test_log: the mask; test_secrets: the scrub and
 * the connect errors). Header-only: each test keeps its own generator state, so its sequence of
 * strings does not depend on the other's. */
#ifndef SECRET_TEXT_H
#define SECRET_TEXT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* The password the random strings carry: 8 characters none of the generators' alphabets make. */
static const char SECRET_TEXT[] = "Zq9xK7wV";

/* xorshift64: the next number below n from *state (seeded by the caller, never 0). */
static inline unsigned secret_text_next(uint64_t *state, unsigned n)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (unsigned)(*state % n);
}

/* s shows the secret: any 4 of its characters in a row. */
static inline bool secret_text_shown(const char *s)
{
    for (size_t i = 0; i + 4 <= strlen(SECRET_TEXT); i++)
        if (memmem(s, strlen(s), SECRET_TEXT + i, 4))
            return true;
    return false;
}

#endif
