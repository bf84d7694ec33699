/* resolve: host names looked up on threads of their own, reported back on the loop (resolve.h).
 *
 * A lookup is shared by two threads: the loop's, which started it and may give it up, and the
 * lookup's, which fills it in. One mutex orders the hand-over: the lookup's thread, once
 * getaddrinfo returns, either frees a lookup given up on or marks it done and wakes the loop,
 * and touches it no more after that; the loop's thread frees it after calling fn, or at once when
 * it gives up a lookup already done. */
#include "resolve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct Resolve {
    struct ev_loop *loop;
    ev_async done_async;
    ResolveFn fn;
    void *arg;
    char *host;
    bool done, cancelled; /* under lock */
    /* Written by the lookup's thread before done, read by the loop's after. */
    int naddrs;
    char addrs[RESOLVE_MAX_ADDRS * (NI_MAXHOST + 1)];
    char error[160];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int running; /* lookups whose threads have not returned (under lock) */

bool resolve_needed(const char *host)
{
    if (!host || !*host || host[0] == '/' || host[0] == '@')
        return false;
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) != 1 && inet_pton(AF_INET6, host, buf) != 1;
}

static void resolve_free(Resolve *r)
{
    free(r->host);
    free(r);
}

/* The addresses of ai as numeric strings joined by commas into r, duplicates dropped. */
static void keep_addresses(Resolve *r, const struct addrinfo *ai)
{
    size_t len = 0;
    for (; ai && r->naddrs < RESOLVE_MAX_ADDRS; ai = ai->ai_next) {
        char one[NI_MAXHOST];
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, one, sizeof(one), NULL, 0, NI_NUMERICHOST))
            continue;
        bool seen = false;
        size_t n = strlen(one);
        for (const char *p = r->addrs; *p && !seen; p += strcspn(p, ","), p += *p == ',')
            seen = strncmp(p, one, n) == 0 && (p[n] == ',' || p[n] == '\0');
        if (seen)
            continue;
        len += (size_t)snprintf(r->addrs + len, sizeof(r->addrs) - len, "%s%s",
                                r->naddrs ? "," : "", one);
        r->naddrs++;
    }
}

static void *lookup(void *p)
{
    Resolve *r = p;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(r->host, NULL, &hints, &ai);
    if (rc == 0)
        keep_addresses(r, ai);
    else
        snprintf(r->error, sizeof(r->error), "%s",
                 rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    if (rc == 0 && r->naddrs == 0)
        snprintf(r->error, sizeof(r->error), "the name has no address");
    if (ai)
        freeaddrinfo(ai);

    pthread_mutex_lock(&lock);
    running--;
    if (r->cancelled) {
        pthread_mutex_unlock(&lock);
        resolve_free(r);
        return NULL;
    }
    r->done = true;
    ev_async_send(r->loop, &r->done_async);
    pthread_mutex_unlock(&lock); /* r is the loop's from here: not touched again */
    return NULL;
}

static void on_done(struct ev_loop *loop, ev_async *w, int revents)
{
    Resolve *r = w->data;
    ev_async_stop(loop, w);
    pthread_mutex_lock(&lock); /* the lookup's thread has let go of r */
    pthread_mutex_unlock(&lock);
    r->fn(r->arg, r->naddrs ? r->addrs : NULL, r->naddrs, r->naddrs ? NULL : r->error);
    resolve_free(r);
}

Resolve *resolve_start(struct ev_loop *loop, const char *host, ResolveFn fn, void *arg, char *err,
                       size_t errlen)
{
    Resolve *r = calloc(1, sizeof(*r));
    if (!r || !(r->host = strdup(host))) {
        free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->loop = loop;
    r->fn = fn;
    r->arg = arg;
    ev_async_init(&r->done_async, on_done);
    r->done_async.data = r;
    ev_async_start(loop, &r->done_async);

    pthread_mutex_lock(&lock);
    bool room = running < RESOLVE_MAX_RUNNING;
    if (room)
        running++;
    pthread_mutex_unlock(&lock);
    if (!room) {
        snprintf(err, errlen,
                 "%d host name lookups are still waiting for a nameserver; not starting another",
                 RESOLVE_MAX_RUNNING);
        ev_async_stop(loop, &r->done_async);
        resolve_free(r);
        return NULL;
    }

    /* The thread takes no signals: the loop's signal watchers are the process's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_t thread;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&thread, &attr, lookup, r);
        pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_mutex_lock(&lock);
        running--;
        pthread_mutex_unlock(&lock);
        snprintf(err, errlen, "cannot start a host name lookup: %s", strerror(rc));
        ev_async_stop(loop, &r->done_async);
        resolve_free(r);
        return NULL;
    }
    return r;
}

void resolve_cancel(Resolve *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&lock); /* ordered with the thread's ev_async_send */
    ev_async_stop(r->loop, &r->done_async);
    bool done = r->done;
    r->cancelled = true;
    pthread_mutex_unlock(&lock);
    if (done)
        resolve_free(r); /* its thread has returned; else that thread frees it */
}
