/* A free() that counts the blocks freed holding a secret, for the unit tests that check that a
 * secret is zeroed before its memory is freed (test_config_wipe: the relay's configuration;
 * test_demo_pool: the producer-demo's pool). Header-only, as secret_text.h, so that a demo test
 * links none of the relay's objects for it: included by one file of a test binary, it gives that
 * binary this free(). While free_armed, each block freed is looked through, then handed to the
 * allocator's own free (the sanitizer's): a block freed with the secret still in it is a secret
 * left in the heap for whatever reuses it (a core file, another allocation's uninitialised
 * bytes). */
#ifndef COUNTING_FREE_H
#define COUNTING_FREE_H

#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

static bool free_armed;
/* What a block freed while armed may not hold: free_marker anywhere in it, free_alone as its
 * whole text (a value copied whole); NULL: not looked for. */
static const char *free_marker, *free_alone;
static size_t freed_with_marker, freed_alone; /* the blocks that held them */

/* The sanitizer's free, which this one stands in front of (libasan names it so; without it,
 * the next free in line, looked up once: dlsym may itself free). */
extern void __interceptor_free(void *p) __attribute__((weak));

void free(void *p)
{
    static void (*real_free)(void *);
    if (!real_free)
        real_free =
            __interceptor_free ? __interceptor_free : (void (*)(void *))dlsym(RTLD_NEXT, "free");
    if (p && free_armed) {
        free_armed = false; /* memmem, malloc_usable_size and strcmp must not recurse into this */
        size_t size = malloc_usable_size(p);
        if (free_marker && memmem(p, size, free_marker, strlen(free_marker)))
            freed_with_marker++;
        if (free_alone && size > strlen(free_alone) && strcmp(p, free_alone) == 0)
            freed_alone++;
        free_armed = true;
    }
    real_free(p);
}

#endif
