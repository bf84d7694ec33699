/* fake_resolver: a getaddrinfo for unit tests of code that looks names up through resolve.c. The
 * executable's symbol comes first, so it takes resolve.c's calls (and curl's, through it): a name
 * ending in ".held" waits until held_release (at most 20 s, so that a test that forgets to release
 * it still ends), as a nameserver that has not answered yet, then is looked up as localhost; any
 * other name goes to the C library's. Included by one test file each (it defines getaddrinfo). */
#ifndef OUTBOX_FAKE_RESOLVER_H
#define OUTBOX_FAKE_RESOLVER_H

#include <dlfcn.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_cond = PTHREAD_COND_INITIALIZER;
static bool held_released;
static int held_lookups; /* getaddrinfo calls for a ".held" name */

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **) =
        (int (*)(const char *, const char *, const struct addrinfo *, struct addrinfo **))dlsym(
            RTLD_NEXT, "getaddrinfo");
    size_t n = node ? strlen(node) : 0;
    if (n > 5 && strcmp(node + n - 5, ".held") == 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 20;
        pthread_mutex_lock(&held_lock);
        held_lookups++;
        while (!held_released && pthread_cond_timedwait(&held_cond, &held_lock, &until) == 0)
            ;
        pthread_mutex_unlock(&held_lock);
        node = "localhost";
    }
    return real(node, service, hints, res);
}

/* Lets every held lookup, and every one after, go on. */
static inline void held_release(void)
{
    pthread_mutex_lock(&held_lock);
    held_released = true;
    pthread_cond_broadcast(&held_cond);
    pthread_mutex_unlock(&held_lock);
}

/* How many ".held" names were looked up so far. */
static inline int held_count(void)
{
    pthread_mutex_lock(&held_lock);
    int n = held_lookups;
    pthread_mutex_unlock(&held_lock);
    return n;
}

#endif
