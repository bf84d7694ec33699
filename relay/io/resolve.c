/* resolve: host names looked up on threads of their own, reported back on the loop (resolve.h).
 *
 * A Lookup (one name, one thread) is shared by the loop's thread, which hands its answer to the
 * waiters (a Resolve each), and the lookup's thread, which fills it in. One mutex orders the
 * hand-over, and guards the list of lookups running and the late answers:
 * - the lookup's thread, once getaddrinfo returns, takes the lookup off the running list; if no
 *   one waits any more (orphaned) it keeps a successful answer among the late ones and frees the
 *   lookup, touching nothing of the loop's; else it marks the lookup done and wakes the loop, and
 *   touches it no more;
 * - the loop's thread hands a done lookup's answer to its waiters and frees it; a request that
 *   finds the name's lookup still running waits on it (and takes it back from orphanhood).
 * Waiter lists and the late answers' delivery timers are the loop thread's alone. */
#include "resolve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "monotime.h"
#include "sigmask.h"

/* A numeric address: an IPv6 one with a scope id is the longest, well under this. */
#define ADDR_LEN 80
#define ADDRS_LEN (RESOLVE_MAX_ADDRS * ADDR_LEN)

typedef struct Lookup Lookup;

struct Resolve {
    struct ev_loop *loop;
    Lookup *lookup;   /* the lookup waited on; NULL while a late answer is delivered */
    ev_timer deliver; /* hands a late answer over from the loop, not from resolve_start */
    ResolveFn fn;
    void *arg;
    Resolve *next; /* among the lookup's waiters */
    int naddrs;    /* the late answer */
    char addrs[ADDRS_LEN];
};

struct Lookup {
    struct ev_loop *loop;
    ev_async done_async; /* started while someone waits */
    char *host;
    Resolve *waiters;
    bool delivering;     /* its answer is being handed out: the waiters' cancels free nothing */
    Lookup *next;        /* in the running list (under lock) */
    bool done, orphaned; /* under lock */
    int naddrs;          /* written by the lookup's thread before done */
    char addrs[ADDRS_LEN];
    char error[160];
};

typedef struct {
    char *host; /* NULL: a free slot */
    double at;  /* when the answer came */
    int naddrs;
    char addrs[ADDRS_LEN];
} Late;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Lookup *running;                /* under lock */
static int nrunning;                   /* under lock */
static Late late[RESOLVE_MAX_RUNNING]; /* under lock */

bool resolve_needed(const char *host)
{
    return db_host_needs_lookup(host); /* one rule for run and the commands */
}

/* Keeps a late answer for host (under lock): its own slot, a free one, or the oldest. */
static void late_keep(const char *host, const char *addrs, int naddrs)
{
    Late *slot = NULL;
    for (int i = 0; i < RESOLVE_MAX_RUNNING && !slot; i++)
        if (late[i].host && strcmp(late[i].host, host) == 0)
            slot = &late[i];
    for (int i = 0; i < RESOLVE_MAX_RUNNING && !slot; i++)
        if (!late[i].host)
            slot = &late[i];
    if (!slot) {
        slot = &late[0];
        for (int i = 1; i < RESOLVE_MAX_RUNNING; i++)
            if (late[i].at < slot->at)
                slot = &late[i];
    }
    char *copy = strdup(host);
    if (!copy)
        return; /* a late answer is a nicety: without memory, the next request asks again */
    free(slot->host);
    slot->host = copy;
    slot->at = monotime_now();
    slot->naddrs = naddrs;
    snprintf(slot->addrs, sizeof(slot->addrs), "%s", addrs);
}

/* Copies host's late answer, if a fresh one is kept, into r (under lock). It stays for the
 * name's other requests (its sessions, its upkeep, other databases on the host) until
 * RESOLVE_LATE_TTL_S is up: each of them would otherwise start a lookup that outlasts
 * connect_timeout again. */
static bool late_copy(const char *host, Resolve *r)
{
    for (int i = 0; i < RESOLVE_MAX_RUNNING; i++) {
        if (!late[i].host || strcmp(late[i].host, host) != 0)
            continue;
        if (monotime_now() - late[i].at > RESOLVE_LATE_TTL_S) {
            free(late[i].host);
            late[i].host = NULL;
            return false;
        }
        r->naddrs = late[i].naddrs;
        memcpy(r->addrs, late[i].addrs, sizeof(r->addrs));
        return true;
    }
    return false;
}

/* Takes l off the running list (under lock). */
static void running_remove(Lookup *l)
{
    for (Lookup **at = &running; *at; at = &(*at)->next) {
        if (*at == l) {
            *at = l->next;
            nrunning--;
            return;
        }
    }
}

static void lookup_free(Lookup *l)
{
    free(l->host);
    free(l);
}

/* The addresses of ai as numeric strings joined by commas into l, duplicates dropped. */
static void keep_addresses(Lookup *l, const struct addrinfo *ai)
{
    size_t len = 0;
    for (; ai && l->naddrs < RESOLVE_MAX_ADDRS; ai = ai->ai_next) {
        char one[NI_MAXHOST];
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, one, sizeof(one), NULL, 0, NI_NUMERICHOST) ||
            strlen(one) >= ADDR_LEN)
            continue;
        bool seen = false;
        size_t n = strlen(one);
        for (const char *p = l->addrs; *p && !seen; p += strcspn(p, ","), p += *p == ',')
            seen = strncmp(p, one, n) == 0 && (p[n] == ',' || p[n] == '\0');
        if (seen)
            continue;
        len += (size_t)snprintf(l->addrs + len, sizeof(l->addrs) - len, "%s%s",
                                l->naddrs ? "," : "", one);
        l->naddrs++;
    }
}

static void *lookup_thread(void *p)
{
    Lookup *l = p;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int rc = getaddrinfo(l->host, NULL, &hints, &ai);
    char why[128];
    if (rc == 0)
        keep_addresses(l, ai);
    else
        snprintf(l->error, sizeof(l->error), "%s",
                 rc == EAI_SYSTEM ? strerror_r(errno, why, sizeof(why)) : gai_strerror(rc));
    if (rc == 0 && l->naddrs == 0)
        snprintf(l->error, sizeof(l->error), "the name has no address");
    if (ai)
        freeaddrinfo(ai);

    pthread_mutex_lock(&lock);
    running_remove(l);
    if (l->orphaned) {
        if (l->naddrs)
            late_keep(l->host, l->addrs, l->naddrs);
        pthread_mutex_unlock(&lock);
        lookup_free(l);
        return NULL;
    }
    l->done = true;
    ev_async_send(l->loop, &l->done_async);
    pthread_mutex_unlock(&lock); /* l is the loop's from here: not touched again */
    return NULL;
}

static void on_done(struct ev_loop *loop, ev_async *w, int revents)
{
    Lookup *l = w->data;
    ev_async_stop(loop, w);
    pthread_mutex_lock(&lock); /* the lookup's thread has let go of l */
    pthread_mutex_unlock(&lock);
    /* One waiter at a time off the list: a callback may cancel another waiter. */
    l->delivering = true;
    Resolve *r;
    while ((r = l->waiters) != NULL) {
        l->waiters = r->next;
        r->lookup = NULL;
        r->fn(r->arg, l->naddrs ? l->addrs : NULL, l->naddrs, l->naddrs ? NULL : l->error);
        free(r);
    }
    lookup_free(l);
}

static void on_deliver(struct ev_loop *loop, ev_timer *w, int revents)
{
    Resolve *r = w->data;
    ev_timer_stop(loop, w);
    r->fn(r->arg, r->addrs, r->naddrs, NULL);
    free(r);
}

/* Starts a thread for l, which takes no signals but the synchronous ones (sigmask.h: a fault
 * inside getaddrinfo must still crash with its report): the loop's signal watchers are the
 * process's. The default stack size is kept: NSS modules (LDAP, sssd) may want more than a small
 * one, and only the pages a lookup touches cost memory. Returns pthread_create's result. */
static int start_thread(Lookup *l)
{
    sigset_t old;
    sigmask_block_async(&old);
    pthread_attr_t attr;
    pthread_t thread;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&thread, &attr, lookup_thread, l);
        pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

Resolve *resolve_start(struct ev_loop *loop, const char *host, ResolveFn fn, void *arg, char *err,
                       size_t errlen)
{
    Resolve *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->loop = loop;
    r->fn = fn;
    r->arg = arg;
    ev_timer_init(&r->deliver, on_deliver, 0, 0);
    r->deliver.data = r;

    pthread_mutex_lock(&lock);
    if (late_copy(host, r)) {
        pthread_mutex_unlock(&lock);
        ev_timer_start(loop, &r->deliver);
        return r;
    }
    /* A lookup no one waits for any more is taken over whichever loop started it (the
     * registry's start-up probe looks names up on a loop of its own): its thread reads l->loop
     * only under the lock, and its watcher was stopped on the other loop. */
    Lookup *l = running;
    while (l && ((l->loop != loop && !l->orphaned) || strcmp(l->host, host) != 0))
        l = l->next;
    if (l && l->orphaned) { /* waited on again: its answer comes to the loop after all */
        l->orphaned = false;
        if (l->loop != loop) {
            l->loop = loop;
            ev_async_init(&l->done_async, on_done);
            l->done_async.data = l;
        }
        ev_async_start(loop, &l->done_async);
    }
    if (!l && nrunning >= RESOLVE_MAX_RUNNING) {
        pthread_mutex_unlock(&lock);
        snprintf(err, errlen,
                 "host name %s not looked up: %d other names are still waiting for a "
                 "nameserver",
                 host, RESOLVE_MAX_RUNNING);
        free(r);
        return NULL;
    }
    bool fresh = !l;
    if (fresh && (l = calloc(1, sizeof(*l))) != NULL && !(l->host = strdup(host))) {
        free(l);
        l = NULL;
    }
    if (fresh && l) {
        l->loop = loop;
        ev_async_init(&l->done_async, on_done);
        l->done_async.data = l;
        ev_async_start(loop, &l->done_async);
        l->next = running;
        running = l;
        nrunning++;
    }
    pthread_mutex_unlock(&lock);
    if (!l) {
        snprintf(err, errlen, "out of memory");
        free(r);
        return NULL;
    }
    int rc = fresh ? start_thread(l) : 0;
    if (rc != 0) {
        pthread_mutex_lock(&lock);
        running_remove(l);
        pthread_mutex_unlock(&lock);
        ev_async_stop(loop, &l->done_async);
        lookup_free(l);
        snprintf(err, errlen, "cannot start a host name lookup: %s", strerror(rc));
        free(r);
        return NULL;
    }
    r->lookup = l;
    r->next = l->waiters;
    l->waiters = r;
    return r;
}

void resolve_cancel(Resolve *r)
{
    if (!r)
        return;
    Lookup *l = r->lookup;
    if (!l) {
        ev_timer_stop(r->loop, &r->deliver);
        free(r);
        return;
    }
    for (Resolve **at = &l->waiters; *at; at = &(*at)->next) {
        if (*at == r) {
            *at = r->next;
            break;
        }
    }
    free(r);
    if (l->waiters || l->delivering)
        return;
    pthread_mutex_lock(&lock); /* ordered with the thread's ev_async_send */
    ev_async_stop(l->loop, &l->done_async);
    if (!l->done) {
        l->orphaned = true; /* its thread keeps the answer and frees it */
        pthread_mutex_unlock(&lock);
        return;
    }
    /* Done, its report not handled yet: the answer is kept as a late one. */
    if (l->naddrs)
        late_keep(l->host, l->addrs, l->naddrs);
    pthread_mutex_unlock(&lock);
    lookup_free(l);
}
