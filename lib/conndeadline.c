#include "conndeadline.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

struct ConnDeadline {
    ConnDeadline *prev, *next;
    int fd;
    double deadline; /* monotonic seconds */
    bool linked;     /* on the clock */
    bool shut;       /* shut down here (deadline or room): not counted in live */
    bool served;     /* a request of its has arrived (paused once): its thread is reading */
    double added;    /* monotonic seconds of conndeadline_add */
};

struct ConnDeadlines {
    double seconds;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t thread;
    bool stop;
    ConnDeadline *head, *tail; /* on the clock, earliest deadline first */
    long cut;
    long room;    /* the most kept open, 0 for no bound */
    long live;    /* added, not removed, not shut down */
    long evicted; /* shut down for room */
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void unlink_entry(ConnDeadlines *d, ConnDeadline *e)
{
    if (!e->linked)
        return;
    if (e->prev)
        e->prev->next = e->next;
    else
        d->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        d->tail = e->prev;
    e->prev = e->next = NULL;
    e->linked = false;
}

/* Takes e off the clock and shuts its connection down (the owner closes it): from here it
 * counts in no bound. Under d->mu: conndeadline_remove, which comes before the owner closes the
 * descriptor, cannot run meanwhile, so the number is still the connection's. */
static void shut_entry(ConnDeadlines *d, ConnDeadline *e)
{
    unlink_entry(d, e);
    e->shut = true;
    d->live--;
    shutdown(e->fd, SHUT_RDWR);
}

/* Appends e with a deadline from now; the list stays sorted (one constant for all). A connection
 * already shut down stays off. */
static void link_entry(ConnDeadlines *d, ConnDeadline *e)
{
    unlink_entry(d, e);
    if (e->shut)
        return;
    e->deadline = mono_s() + d->seconds;
    e->prev = d->tail;
    if (d->tail)
        d->tail->next = e;
    else
        d->head = e;
    d->tail = e;
    e->linked = true;
    if (d->head == e)
        pthread_cond_signal(&d->wake); /* the watcher sleeps without a deadline */
}

/* Entries looked at for one room-making shutdown (pick_for_room): a bound on the work done under
 * the lock for each new connection. */
#define ROOM_SCAN_MAX 32

/* Past the room with nothing to shut down (pick_for_room), how often the watcher looks again. */
#define ROOM_RECHECK_S 0.05

/* How long a new connection that was never served is passed over for room whatever its socket
 * holds: libmicrohttpd tells of a connection as it accepts it, and the client's request may not
 * have arrived yet (it sends it after its connect returns), so an empty socket then is a request
 * on its way, not a slow sender's bytes read. Without it the watcher, woken by that very add,
 * shut down the newcomer itself when every older one was being handled or had its request
 * unread: a probe closed before its request came. A slow or silent sender is older than this. */

/* The connection to shut down for newcomer e's room: the oldest on the clock, other than e, that
 * has had a request arrive, or that is older than CONNDEADLINE_YOUNG_S and whose socket holds no
 * unread bytes. A new one with unread bytes is a connection whose thread has not yet read its
 * request (libmicrohttpd starts that thread after this add): with every older slot in a handler, a
 * burst's newcomers shut one another down, a probe among them closed with its request unread. A
 * slow sender's thread reads each byte as it comes, so its socket is empty between them; a
 * kept-alive connection's socket may hold the next requests of a client that pipelines them and
 * reads no answer, which is why one that was served stays a candidate. NULL when none of the
 * first ROOM_SCAN_MAX qualifies: libmicrohttpd's own limit then holds until they have been read
 * (the watcher looks again). Under d->mu. */
static ConnDeadline *pick_for_room(ConnDeadlines *d, const ConnDeadline *e, double now)
{
    int looked = 0;
    for (ConnDeadline *o = d->head; o && looked < ROOM_SCAN_MAX; o = o->next, looked++) {
        if (o == e)
            continue;
        if (o->served)
            return o;
        int unread = 0;
        if (now - o->added >= CONNDEADLINE_YOUNG_S && ioctl(o->fd, FIONREAD, &unread) == 0 &&
            unread == 0)
            return o;
    }
    return NULL;
}

static void *watch(void *arg)
{
    ConnDeadlines *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        double now = mono_s();
        while (d->head && d->head->deadline <= now) {
            shut_entry(d, d->head);
            d->cut++;
        }
        /* Past the room, the newcomers that found nothing to shut down (their own requests
         * unread) are looked at again until one can go: their threads read them within moments,
         * and at the server's own limit no newcomer comes to do it, so a burst of whole requests
         * (a client pipelining, reading nothing) held every slot until the deadline. */
        bool over = d->room > 0 && d->live > d->room;
        ConnDeadline *victim = over ? pick_for_room(d, NULL, now) : NULL;
        if (victim) {
            shut_entry(d, victim);
            d->evicted++;
            continue;
        }
        if (!d->head) {
            pthread_cond_wait(&d->wake, &d->mu); /* link_entry signals the first one linked */
            continue;
        }
        double at = d->head->deadline;
        if (over && at > now + ROOM_RECHECK_S)
            at = now + ROOM_RECHECK_S;
        struct timespec ts = {(time_t)at, (long)((at - (double)(time_t)at) * 1e9)};
        pthread_cond_timedwait(&d->wake, &d->mu, &ts);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

ConnDeadlines *conndeadline_new(double seconds, long room, char *err, size_t errlen)
{
    ConnDeadlines *d = calloc(1, sizeof(*d));
    if (!d) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    d->seconds = seconds;
    d->room = room;
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&d->wake, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&d->thread, NULL, watch, d) != 0) {
        snprintf(err, errlen, "cannot start the request deadline thread");
        pthread_cond_destroy(&d->wake);
        pthread_mutex_destroy(&d->mu);
        free(d);
        return NULL;
    }
    return d;
}

void conndeadline_free(ConnDeadlines *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    while (d->head) {
        ConnDeadline *e = d->head;
        unlink_entry(d, e);
        free(e);
    }
    pthread_cond_destroy(&d->wake);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

ConnDeadline *conndeadline_add(ConnDeadlines *d, int fd)
{
    ConnDeadline *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->fd = fd;
    e->added = mono_s();
    pthread_mutex_lock(&d->mu);
    d->live++;
    link_entry(d, e);
    /* The oldest on the clock has had the longest to send its request; a quick client's is
     * never the oldest, unless its thread has not read it yet (pick_for_room). */
    ConnDeadline *victim = d->room > 0 && d->live > d->room ? pick_for_room(d, e, e->added) : NULL;
    if (victim) {
        shut_entry(d, victim);
        d->evicted++;
    } else if (d->room > 0 && d->live > d->room) {
        pthread_cond_signal(&d->wake); /* the watcher looks again until one can go */
    }
    pthread_mutex_unlock(&d->mu);
    return e;
}

void conndeadline_pause(ConnDeadlines *d, ConnDeadline *e)
{
    pthread_mutex_lock(&d->mu);
    unlink_entry(d, e);
    e->served = true;
    pthread_mutex_unlock(&d->mu);
}

void conndeadline_restart(ConnDeadlines *d, ConnDeadline *e)
{
    pthread_mutex_lock(&d->mu);
    link_entry(d, e);
    pthread_mutex_unlock(&d->mu);
}

void conndeadline_remove(ConnDeadlines *d, ConnDeadline *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&d->mu);
    unlink_entry(d, e);
    if (!e->shut)
        d->live--;
    pthread_mutex_unlock(&d->mu);
    free(e);
}

long conndeadline_cut(ConnDeadlines *d)
{
    pthread_mutex_lock(&d->mu);
    long n = d->cut;
    pthread_mutex_unlock(&d->mu);
    return n;
}

long conndeadline_evicted(ConnDeadlines *d)
{
    pthread_mutex_lock(&d->mu);
    long n = d->evicted;
    pthread_mutex_unlock(&d->mu);
    return n;
}
