#include "backoff.h"

#include <time.h>
#include <unistd.h>

void backoff_init(Backoff *b, double base_s, double cap_s, uint64_t seed)
{
    b->base_s = base_s;
    b->cap_s = cap_s;
    b->failures = 0;
    if (seed == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
    }
    b->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
}

static double next_unit(Backoff *b)
{
    /* xorshift64*: good enough to spread retries, no global state. */
    uint64_t x = b->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    b->rng = x;
    return (double)((x * 0x2545f4914f6cdd1dull) >> 11) / (double)(1ull << 53);
}

double backoff_next(Backoff *b)
{
    double delay = b->base_s;
    for (unsigned i = 0; i < b->failures && delay < b->cap_s; i++)
        delay *= 2;
    if (delay > b->cap_s)
        delay = b->cap_s;
    if (b->failures < 64)
        b->failures++;
    return delay / 2 + next_unit(b) * delay / 2;
}

void backoff_reset(Backoff *b)
{
    b->failures = 0;
}
