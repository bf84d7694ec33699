#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "addr.h"
#include "conndeadline.h"
#include "log.h"
#include "monotime.h"

/* Limits against hostile neighbours (docs/security.md). The endpoints exist for probes and a
 * scraper: a handful of connections from a few addresses. Anyone who reaches the port could
 * otherwise hold every slot with idle or trickling connections, and an orchestrator whose
 * /healthz probe gets no answer restarts a healthy relay.
 *  - per address: HTTP_PER_IP_CONNECTIONS, and as many lingering closes (linger_start); a flood
 *    from one address is closed at accept and leaves the other addresses' slots free;
 *  - in all: HTTP_MAX_CONNECTIONS (lowered to half the descriptor limit when that is smaller,
 *    so a flood from many addresses cannot take the descriptors PostgreSQL and Kafka need);
 *    past conndeadline_room of them (all but a sixteenth), each new connection closes the
 *    oldest one that has not sent its request (else the oldest being answered). At the limit
 *    itself libmicrohttpd stops accepting, and a probe waited in the kernel's backlog behind the
 *    flood until the header deadline freed slots, for ever when the flood reconnects: a flood
 *    from 64 addresses (a few more than the limit over the per-address one; any host with an
 *    IPv6 prefix has as many) took the probes down. A probe sends its request at once, so it is
 *    never the oldest without one (nor counted as without one before libmicrohttpd could read
 *    it: make_room); the reserve leaves room for the closed ones until libmicrohttpd reaps them;
 *  - a request's line and headers must arrive within HTTP_HEADER_DEADLINE_S of the connection's
 *    start: a client that trickles a byte at a time never trips the idle timeout, this deadline
 *    it does. A connection carries one request: every answer is queued on the handler's first
 *    call, and libmicrohttpd 0.9.75 then closes the connection after it (MHD_queue_response
 *    before the request's end discards the rest of the connection: "Connection: close"); a body
 *    or pipelined requests the client still sends after it are read and dropped for a while
 *    (linger_start);
 *  - a client that sends nothing for HTTP_IDLE_TIMEOUT_S is dropped;
 *  - request line + headers must fit in HTTP_MEMORY_LIMIT bytes (else 431 or 414, and close);
 *  - an answer must be sent within HTTP_RESPONSE_DEADLINE_S of its request (http.h): a client that
 *    reads a byte now and then resets the idle timeout with every write it lets through, and so
 *    held its answer (and its share of the budget below) for as long as it liked;
 *  - large response bodies held for clients still reading them: HTTP_RESPONSE_BUDGET, at most
 *    HTTP_PER_IP_LARGE of them read by one address at once (so that one address's slow readers
 *    cannot take the whole budget from the scrapers), and one rendering of a large answer serves
 *    its path's requests for HTTP_SHARE_S (http.h). */
#define HTTP_MAX_CONNECTIONS 1024
#define HTTP_PER_IP_CONNECTIONS 16
#define HTTP_HEADER_DEADLINE_S 3.0
#define HTTP_IDLE_TIMEOUT_S 10
#define HTTP_MEMORY_LIMIT (16 * 1024)
#define HTTP_EVICT_WARN_S 60.0 /* at most one warning this often while connections are closed */
/* The lingering close (linger_start): an answer sent before the request's body was read is
 * followed by reading and dropping what the client still sends, for at most this long and this
 * many bytes (the declared length when smaller), as producer-demo does (docs/demos.md). */
#define HTTP_LINGER_S 5.0
#define HTTP_LINGER_BYTES (64ULL * 1024 * 1024)
/* What all lingering closes together read and drop in one turn of the loop (on_linger_io); the
 * rest waits for the next turn. Each may read 64 KiB a wake-up, and 1,024 of them from many
 * addresses (the connection limit) read 64 MiB in one turn before the loop got back to
 * PostgreSQL and Kafka. */
#define HTTP_LINGER_TURN_BYTES (256u * 1024)
/* A connection newer than CONNDEADLINE_YOUNG_S (conndeadline.h) is never "waiting for its
 * request" (make_room): its client may not have sent it yet. */

/* Connections under a deadline, in deadline order: every deadline of one queue is "now + the
 * same span", so appending keeps it sorted. */
typedef struct DeadlineQueue {
    struct Pending *head, *tail;
} DeadlineQueue;

/* A connection: waiting for its request's headers (the header queue), being answered (the
 * response queue), or neither (between a request's headers and its answer, in the handler). */
typedef struct Pending {
    struct Pending *prev, *next;
    struct HttpServer *server;
    DeadlineQueue *queue; /* the queue it is in, NULL when in none */
    int fd;
    bool closing; /* shut down by us (deadline, or closed to admit another): not counted in live */
    unsigned long accepted_run; /* the server's runs when it was accepted (make_room) */
    ev_tstamp accepted_at;      /* monotime of its accept (make_room) */
    ev_tstamp deadline;
    /* The large answer it is being sent (HTTP_PER_IP_LARGE), NULL for a small one: libmicrohttpd
     * keeps the response while any connection sends it, so the pointer names one rendering. */
    const struct MHD_Response *reading;
    struct sockaddr_storage addr; /* the client's address (its port ignored) */
    bool body_unread;             /* its request declared a body, which no answer waits for */
    bool answered;                /* its answer was sent whole (on_completed) */
    unsigned long long declared;  /* the body's declared length, 0 when not told (chunked) */
} Pending;

/* A connection in its lingering close (linger_start): its answer sent and its write side shut,
 * the client's further bytes read and dropped on the loop until it closes, left bytes are read
 * or HTTP_LINGER_S pass. Holds a duplicate of the descriptor libmicrohttpd closed. */
typedef struct Linger {
    struct Linger *prev, *next;
    struct HttpServer *server;
    ev_io io;
    ev_timer timer;
    unsigned long long left;
    struct sockaddr_storage addr; /* the client's (HTTP_PER_IP_CONNECTIONS holds for lingers too) */
    unsigned int round;           /* the last linger_round it read in (on_linger_io) */
    bool owed;                    /* found the turn's reads spent in this round: reads first */
} Linger;

/* How libmicrohttpd shares the loop.
 *
 * It is started without MHD_USE_INTERNAL_POLLING_THREAD, i.e. in "external polling" mode: it
 * creates no thread and does work only inside MHD_run, which we call from the loop, so the
 * handler runs on the loop thread and may read the relay's state without locks. (0.9.75 has no
 * MHD_USE_NO_THREAD_SAFETY flag; without an internal thread there is nothing to be safe from.)
 *
 * With MHD_USE_EPOLL, the listening socket and every connection live in one epoll set of
 * libmicrohttpd's, and the epoll descriptor itself (MHD_DAEMON_INFO_EPOLL_FD) becomes readable
 * whenever any of them has an event: epoll sets nest. So the loop watches that single
 * descriptor with one ev_io, whatever the number of connections, instead of re-collecting an
 * fd_set (MHD_get_fdset2) and re-arming a watcher per socket before every loop iteration.
 *
 * libmicrohttpd also has deadlines (idle connections to close) and may leave work pending that
 * no new event will announce (it reads edge-triggered sockets only so far per call).
 * MHD_get_timeout reports both: after every MHD_run the timer is set to it, 0 meaning "run
 * again right away". One more thing MHD_get_timeout does not report: a run that closed
 * connections is followed by another at once, which puts the listening socket back into the epoll
 * set if a run at the connection limit took it out (drive). An ev_io on the epoll descriptor plus
 * that timer is the whole contract. */
struct HttpServer {
    struct ev_loop *loop;
    struct MHD_Daemon *daemon;
    ev_io io;
    ev_timer timer;
    ev_timer deadline_timer;  /* fires at the earlier head of the two queues */
    DeadlineQueue headers;    /* connections waiting for their headers, oldest first */
    DeadlineQueue responses;  /* connections being answered, oldest first */
    double response_deadline; /* HTTP_RESPONSE_DEADLINE_S (tests shorten it) */
    double header_deadline;   /* HTTP_HEADER_DEADLINE_S (tests lengthen it) */
    unsigned int limit;       /* connection_limit(), libmicrohttpd's own */
    unsigned int live;        /* connections open and not closing */
    unsigned int open;        /* connections open, closing ones included (drive) */
    unsigned long evicted;    /* connections closed to admit others, since the last warning */
    double evict_warned_at;   /* monotime of that warning, 0 before any */
    unsigned long runs;       /* MHD_run calls so far (make_room) */
    HttpHandlerFn fn;
    void *arg;
    const char *const *paths; /* the paths fn serves (405 or 404 for another method) */
    size_t held; /* bytes of large bodies not yet freed by libmicrohttpd (HTTP_RESPONSE_BUDGET) */
    /* The last large answer, shared by the requests for its path for HTTP_SHARE_S (http.h). */
    struct MHD_Response *shared;
    unsigned int shared_status;
    double shared_until;
    char shared_path[64];
    char large_path[64]; /* the path of the last large answer shared, kept after its time */
    size_t large_len;    /* and its length */
    Linger *lingers, *lingers_tail;    /* lingering closes, oldest first (linger_start) */
    unsigned int lingering;            /* their number: counted against limit with the open ones */
    bool stopping;                     /* http_server_free: no new lingering close */
    unsigned int linger_turn;          /* ev_iteration of the turn linger_budget is for */
    size_t linger_budget;              /* bytes lingering closes may still read in that turn */
    unsigned long long linger_dropped; /* bytes they read and dropped, in all */
    unsigned int linger_round; /* the round of reads in which each reads once (linger_read) */
    unsigned int linger_owed;  /* lingers owed a read in it (Linger.owed) */
    char address[128];
};

/* A large body given to libmicrohttpd: counted in held until it frees the response (sent, or its
 * connection gone). */
typedef struct Held {
    HttpServer *server;
    size_t len;
    char *body;
} Held;

static void held_free(void *cls)
{
    Held *h = cls;
    h->server->held -= h->len;
    free(h->body);
    free(h);
}

/* Opens a non-blocking listening socket on host:port; writes the bound address to out. */
static int open_listener(const char *host, const char *port, char *out, size_t outlen, char *err,
                         size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai;
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "--metrics-listen %s:%s: %s", host, port, gai_strerror(rc));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (a->ai_family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 256) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        snprintf(err, errlen, "--metrics-listen %s:%s: cannot listen: %s", host, port,
                 strerror(saved));
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";
    int bound = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &s6->sin6_addr, ip, sizeof(ip));
            bound = ntohs(s6->sin6_port);
        } else {
            struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &s4->sin_addr, ip, sizeof(ip));
            bound = ntohs(s4->sin_port);
        }
    }
    snprintf(out, outlen, ss.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", ip, bound);
    return fd;
}

static void arm_deadline(HttpServer *s)
{
    ev_timer_stop(s->loop, &s->deadline_timer);
    Pending *first = s->headers.head;
    if (!first || (s->responses.head && s->responses.head->deadline < first->deadline))
        first = s->responses.head;
    if (!first)
        return;
    double at = first->deadline;
    /* Past the room with only new connections waiting for their requests (make_room): at the
     * limit no newcomer may come to close one, so the oldest is looked at again when it is no
     * longer new (on_deadline). */
    Pending *head = s->headers.head;
    if ((long)s->live > conndeadline_room((long)s->limit) && head &&
        head->accepted_at + CONNDEADLINE_YOUNG_S < at)
        at = head->accepted_at + CONNDEADLINE_YOUNG_S;
    double in = at - monotime_now();
    ev_timer_set(&s->deadline_timer, in > 0 ? in : 0, 0);
    ev_timer_start(s->loop, &s->deadline_timer);
}

static void pending_unlink(Pending *p)
{
    DeadlineQueue *q = p->queue;
    if (!q)
        return;
    if (p->prev)
        p->prev->next = p->next;
    else
        q->head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        q->tail = p->prev;
    p->prev = p->next = NULL;
    p->queue = NULL;
    p->reading = NULL;
}

/* Starts p's deadline in q, span seconds from now: the header deadline (a new connection) or the
 * response deadline (an answer queued). */
static void pending_link(Pending *p, DeadlineQueue *q, double span)
{
    HttpServer *s = p->server;
    pending_unlink(p);
    p->deadline = monotime_now() + span;
    p->prev = q->tail;
    if (q->tail)
        q->tail->next = p;
    else
        q->head = p;
    q->tail = p;
    p->queue = q;
    if (q->head == p)
        arm_deadline(s);
}

static bool same_address(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return false;
}

/* Whether p's address may be sent the large answer resp (NULL: a new rendering): it is already
 * reading resp (which then costs nothing more), or fewer than HTTP_PER_IP_LARGE other renderings.
 * Connections sharing a rendering count once: memory is held per rendering. */
static bool address_may_read(const Pending *p, const struct MHD_Response *resp)
{
    const struct MHD_Response *seen[HTTP_PER_IP_LARGE];
    int n = 0;
    for (const Pending *o = p->server->responses.head; o; o = o->next) {
        if (!o->reading || !same_address(&o->addr, &p->addr))
            continue;
        if (o->reading == resp)
            return true;
        bool counted = false;
        for (int i = 0; i < n && !counted; i++)
            counted = seen[i] == o->reading;
        if (counted)
            continue;
        if (n == HTTP_PER_IP_LARGE)
            return false;
        seen[n++] = o->reading;
    }
    return n < HTTP_PER_IP_LARGE;
}

static void drive(HttpServer *s);

/* Shuts p's connection down: libmicrohttpd owns the descriptor and sees end-of-file on its next
 * run, closes the connection and tells on_connection, which frees p. Closing it here would let
 * the number be reused under libmicrohttpd. From here p counts in no limit and is in no queue. */
static void pending_close(Pending *p)
{
    pending_unlink(p);
    if (p->closing)
        return;
    p->closing = true;
    p->server->live--;
    shutdown(p->fd, SHUT_RDWR);
}

/* Says that connections were closed to admit others, at most every HTTP_EVICT_WARN_S. */
static void warn_evicted(HttpServer *s)
{
    double now = monotime_now();
    if (s->evict_warned_at == 0 || now - s->evict_warned_at >= HTTP_EVICT_WARN_S) {
        log_warn("http connection limit reached",
                 "open=%u limit=%u closed=%lu reason=\"the oldest connections without a complete "
                 "request (else the oldest being answered) are closed to admit new ones; a flood "
                 "from many addresses?\"",
                 s->live, s->limit, s->evicted);
        s->evicted = 0;
        s->evict_warned_at = now;
    }
}

/* l has its read of the round: when it was the last one owed, the next round begins, in which
 * every lingering close may read again. */
static void linger_read(Linger *l)
{
    HttpServer *s = l->server;
    l->round = s->linger_round;
    if (l->owed) {
        l->owed = false;
        if (--s->linger_owed == 0)
            s->linger_round++;
    }
}

static void linger_end(Linger *l)
{
    HttpServer *s = l->server;
    if (l->owed)
        linger_read(l); /* no longer owed: the round may end without it */
    ev_io_stop(s->loop, &l->io);
    ev_timer_stop(s->loop, &l->timer);
    close(l->io.fd);
    if (l->prev)
        l->prev->next = l->next;
    else
        s->lingers = l->next;
    if (l->next)
        l->next->prev = l->prev;
    else
        s->lingers_tail = l->prev;
    s->lingering--;
    free(l);
}

/* Reads and drops what the client sends, a few buffers a wake-up and at most what is left of the
 * turn's HTTP_LINGER_TURN_BYTES (the loop has other work; the watcher is level-triggered and
 * comes back on the next turn), until it closes, errs, or left bytes are in.
 * The turn's reads go round: libev calls ready watchers in the same order turn after turn, so the
 * first few spent every turn's budget and the rest read nothing until their 5 s ran out (their
 * clients, still sending, then got a reset instead of the answer). So one that finds the budget
 * spent is owed a read, and until every one owed has had it (a round), one that has read in the
 * round lets them go first. */
static void on_linger_io(struct ev_loop *loop, ev_io *w, int revents)
{
    Linger *l = w->data;
    HttpServer *s = l->server;
    static char sink[16384]; /* dropped bytes: the loop's one thread is the only reader */
    if (s->linger_turn != ev_iteration(loop)) {
        s->linger_turn = ev_iteration(loop);
        s->linger_budget = HTTP_LINGER_TURN_BYTES;
    }
    if (!l->owed && l->round == s->linger_round && s->linger_owed > 0)
        return; /* it has read in this round: those owed read first */
    if (s->linger_budget == 0) {
        if (!l->owed) {
            l->owed = true;
            s->linger_owed++;
        }
        return; /* the turn's reads are spent: it reads in a next turn, before the others */
    }
    linger_read(l);
    for (int i = 0; i < 4; i++) {
        if (s->linger_budget == 0)
            return; /* the turn's reads are spent: the next turn reads on */
        size_t want = s->linger_budget < sizeof(sink) ? s->linger_budget : sizeof(sink);
        ssize_t got = recv(w->fd, sink, want, MSG_DONTWAIT);
        if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (got <= 0)
            break; /* the client closed (or reset) */
        s->linger_budget -= (size_t)got;
        s->linger_dropped += (unsigned long long)got;
        l->left = (unsigned long long)got >= l->left ? 0 : l->left - (unsigned long long)got;
        if (l->left == 0)
            break;
        if (i == 3)
            return; /* more may come: the next wake-up reads on */
    }
    linger_end(l);
}

static void on_linger_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    linger_end(w->data);
}

/* Whether bytes the client sent wait unread in fd's socket: requests pipelined behind the one
 * answered (libmicrohttpd answers one a connection), which a close would answer with a reset. */
static bool bytes_unread(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 && n > 0;
}

/* The lingering close of p, whose answer was sent before its request's body was read (every
 * answer is: see the limits at the top), called while libmicrohttpd closes it. Closed with the
 * body unread, the socket sends a reset, and a reset drops what the client has not yet read, the
 * answer among them: a client that sends its body before reading (1 MiB to POST /metrics) got a
 * reset or a broken pipe instead of its 405 (RFC 9112 9.6 asks for a half-close), and so did a
 * client that sends GET requests pipelined before it reads (bytes_unread: only the first is
 * answered, and the rest was unread at the close). So a
 * duplicate of the descriptor outlives libmicrohttpd's close (which shut the write side: the
 * client reads the end), and the loop reads and drops the client's bytes without ever waiting
 * on them. Bounded: HTTP_LINGER_S, HTTP_LINGER_BYTES (or the declared length), and counted
 * against the connection limit with the open connections (none when they fill it; make_room
 * ends the oldest first). libmicrohttpd takes the descriptor out of its epoll set itself before
 * closing it (0.9.75 MHD_cleanup_connections), so the duplicate raises no event there. */
static void linger_start(HttpServer *s, const Pending *p)
{
    if (s->stopping || s->open + s->lingering >= s->limit)
        return;
    /* libmicrohttpd's per-address limit counts its open connections only, and a lingering one is
     * no longer its: one address that posted again and again held up to the limit in all of
     * them (each reading up to 64 MiB on the loop). At HTTP_PER_IP_CONNECTIONS lingering, the
     * address's oldest, whose client has had its answer longest, makes way. */
    Linger *oldest = NULL;
    unsigned int mine = 0;
    for (Linger *o = s->lingers; o; o = o->next)
        if (same_address(&o->addr, &p->addr) && mine++ == 0)
            oldest = o;
    if (mine >= HTTP_PER_IP_CONNECTIONS)
        linger_end(oldest);
    Linger *l = calloc(1, sizeof(*l));
    int fd = l ? fcntl(p->fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (fd < 0) {
        free(l); /* closed at once, as before: a reset at worst */
        return;
    }
    shutdown(fd, SHUT_WR); /* done by libmicrohttpd (mark_closed) unless in turbo mode */
    l->server = s;
    l->addr = p->addr;
    l->left = p->declared && p->declared < HTTP_LINGER_BYTES ? p->declared : HTTP_LINGER_BYTES;
    l->round = s->linger_round - 1; /* not read in this round */
    ev_io_init(&l->io, on_linger_io, fd, EV_READ);
    l->io.data = l;
    ev_timer_init(&l->timer, on_linger_timer, HTTP_LINGER_S, 0);
    l->timer.data = l;
    ev_io_start(s->loop, &l->io);
    ev_timer_start(s->loop, &l->timer);
    l->prev = s->lingers_tail;
    if (s->lingers_tail)
        s->lingers_tail->next = l;
    else
        s->lingers = l;
    s->lingers_tail = l;
    s->lingering++;
}

/* Makes room for the connection just accepted when the live ones are past conndeadline_room of
 * the limit (all but a sixteenth): closes the oldest one waiting for its request, else the
 * oldest being answered (a slow reader). Says so at most every HTTP_EVICT_WARN_S.
 * A connection accepted in this run or the previous one is never "waiting for its request":
 * libmicrohttpd accepts up to eleven connections in one run and reads from them on the next one
 * (after that run's own accepts), so until then a request already sent is unread. Counting them
 * let the newcomers of a burst close one another when every older connection was being answered:
 * a probe that came with a flood was closed by the next connection with its request unread. Nor
 * is one accepted less than CONNDEADLINE_YOUNG_S ago: its client sends the request after its
 * connect returns, so it may arrive runs later, and a probe a few milliseconds late was closed by
 * the next newcomer before it came; a slow or silent sender is older than that. The queue is in
 * order of acceptance, so when its head is that young, all of it is. */
static void make_room(HttpServer *s)
{
    /* A lingering close has sent its answer: the first to make way. */
    if ((long)(s->live + s->lingering) > conndeadline_room((long)s->limit) && s->lingers)
        linger_end(s->lingers);
    if ((long)s->live <= conndeadline_room((long)s->limit))
        return;
    Pending *victim = s->headers.head;
    if (victim && (victim->accepted_run + 1 >= s->runs ||
                   monotime_now() - victim->accepted_at < CONNDEADLINE_YOUNG_S))
        victim = NULL;
    if (!victim)
        victim = s->responses.head;
    if (!victim) {
        arm_deadline(s); /* libmicrohttpd's own limit holds until the oldest is not new */
        return;
    }
    pending_close(victim);
    s->evicted++;
    warn_evicted(s);
}

/* Connections past their deadline are shut down (pending_close). */
static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    HttpServer *s = w->data;
    log_set_context(NULL); /* the process's line, not the last database's (drive) */
    ev_tstamp now = monotime_now();
    int cut = 0, slow = 0;
    while (s->headers.head && s->headers.head->deadline <= now) {
        pending_close(s->headers.head);
        cut++;
    }
    while (s->responses.head && s->responses.head->deadline <= now) {
        pending_close(s->responses.head);
        slow++;
    }
    if (cut)
        log_debug("http connections cut", "count=%d reason=\"no complete request within %gs\"", cut,
                  s->header_deadline);
    if (slow)
        log_debug("http connections cut", "count=%d reason=\"answer not read within %gs\"", slow,
                  s->response_deadline);
    if ((long)s->live > conndeadline_room((long)s->limit) && s->headers.head) {
        /* Past the room, the connections make_room passed over as new: once the requests that
         * have arrived are read (this run), the oldest still waiting for theirs make way, since
         * at libmicrohttpd's limit no newcomer comes to do it. */
        drive(s);
        now = monotime_now();
        while ((long)s->live > conndeadline_room((long)s->limit) && s->headers.head &&
               now - s->headers.head->accepted_at >= CONNDEADLINE_YOUNG_S) {
            pending_close(s->headers.head);
            s->evicted++;
        }
        if (s->evicted)
            warn_evicted(s);
    }
    arm_deadline(s);
    drive(s);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    HttpServer *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        s->open++; /* libmicrohttpd's count too, record or not: it tells each start and close */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ca =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        Pending *p = calloc(1, sizeof(*p));
        if (!p || !ci) {
            /* Without its record the connection would escape the deadline: refuse it. */
            free(p);
            if (ci)
                shutdown(ci->connect_fd, SHUT_RDWR);
            *socket_context = NULL;
            return;
        }
        p->server = s;
        p->fd = ci->connect_fd;
        if (ca && ca->client_addr) {
            size_t len = ca->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                : sizeof(struct sockaddr_in);
            memcpy(&p->addr, ca->client_addr, len);
        }
        *socket_context = p;
        p->accepted_run = s->runs;
        p->accepted_at = monotime_now();
        s->live++;
        pending_link(p, &s->headers, s->header_deadline);
        make_room(s);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        s->open--;
        Pending *p = *socket_context;
        if (p) {
            pending_unlink(p);
            if (!p->closing && p->answered && (p->body_unread || bytes_unread(p->fd)))
                linger_start(s, p);
            if (!p->closing)
                s->live--;
            free(p);
            *socket_context = NULL;
        }
        arm_deadline(s);
    }
}

/* A request completed (answered, or ended by an error). With libmicrohttpd 0.9.75 the connection
 * closes next (one request a connection: see the limits at the top), so this links it to the
 * header queue only until on_connection's NOTIFY_CLOSED frees it; were a connection kept alive,
 * its next request would be under the header deadline here, as the first one was. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci && ci->socket_context) {
        Pending *p = ci->socket_context;
        p->answered = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
        if (!p->closing)
            pending_link(p, &p->server->headers, p->server->header_deadline);
    }
}

/* The total connection limit: HTTP_MAX_CONNECTIONS, or half the descriptor limit if lower. */
static unsigned int connection_limit(void)
{
    struct rlimit rl;
    unsigned int limit = HTTP_MAX_CONNECTIONS;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur / 2 < limit)
        limit = rl.rlim_cur / 2 > 8 ? (unsigned int)(rl.rlim_cur / 2) : 8;
    return limit;
}

static void drive(HttpServer *s)
{
    /* Its lines (on_mhd_log) are the process's: the log context is whatever the loop's last
     * callback set, a database's session with --databases. */
    log_set_context(NULL);
    s->runs++;
    /* Counted in on_connection rather than asked of libmicrohttpd: in 0.9.75, without an
     * internal thread, MHD_DAEMON_INFO_CURRENT_CONNECTIONS first cleans up the closed
     * connections, so asking before and after each run cleaned up twice more per wake-up. */
    unsigned int before = s->open;
    MHD_run(s->daemon);
    MHD_UNSIGNED_LONG_LONG ms;
    ev_timer_stop(s->loop, &s->timer);
    if (s->open < before) {
        /* A run that begins at the connection limit (or after an accept failed for want of
         * descriptors) takes the listening socket out of libmicrohttpd's epoll set, and only the
         * start of a run that begins below the limit puts it back. When this run closed every
         * connection, nothing would wake the loop (no socket, no timeout) and the port accepted
         * nothing for ever: a flood that filled the limit and left took the probes down. So a
         * run that closed connections is followed by another at once. */
        ev_timer_set(&s->timer, 0, 0);
        ev_timer_start(s->loop, &s->timer);
    } else if (MHD_get_timeout(s->daemon, &ms) == MHD_YES) {
        ev_timer_set(&s->timer, (double)ms / 1000.0, 0);
        ev_timer_start(s->loop, &s->timer);
    }
}

static void on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    drive(w->data);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    drive(w->data);
}

static void on_mhd_log(void *arg, const char *fmt, va_list ap)
{
    char text[512], q[600];
    vsnprintf(text, sizeof(text), fmt, ap);
    log_debug("http server", "text=%s", log_quote(text, q, sizeof(q)));
}

/* Keeps resp (a large answer to path, just rendered) for the requests of the next HTTP_SHARE_S,
 * dropping the one kept before (libmicrohttpd frees it once no connection still sends it).
 * Returns whether it was kept: then the caller's reference is the keeper's (not destroyed). */
static bool share(HttpServer *s, const char *path, unsigned int status, struct MHD_Response *resp,
                  size_t len)
{
    if (s->shared)
        MHD_destroy_response(s->shared);
    s->shared = NULL;
    if (strlen(path) >= sizeof(s->shared_path))
        return false;
    s->shared = resp;
    s->shared_status = status;
    s->shared_until = monotime_now() + HTTP_SHARE_S;
    snprintf(s->shared_path, sizeof(s->shared_path), "%s", path);
    snprintf(s->large_path, sizeof(s->large_path), "%s", path);
    s->large_len = len;
    return true;
}

/* Queues the answer on conn; a large 200 is shared (share) and recorded as what p reads. */
static enum MHD_Result reply(HttpServer *s, struct MHD_Connection *conn, Pending *p,
                             const char *path, int status, StrBuf *body, const char *content_type,
                             bool allow_header)
{
    struct MHD_Response *resp = NULL;
    Held *h = NULL;
    if (body->s && body->len > HTTP_LARGE_RESPONSE) {
        h = malloc(sizeof(*h));
        if (h) {
            *h = (Held){.server = s, .len = body->len, .body = body->s};
            resp = MHD_create_response_from_buffer_with_free_callback_cls(body->len, body->s,
                                                                          held_free, h);
            if (resp)
                s->held += h->len;
            else
                free(h);
        }
    } else {
        resp = body->s ? MHD_create_response_from_buffer(body->len, body->s, MHD_RESPMEM_MUST_FREE)
                       : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    }
    if (!resp) {
        strbuf_free(body);
        return MHD_NO;
    }
    body->s = NULL; /* the response owns it now (freed by MHD, or by held_free) */
    strbuf_free(body);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (allow_header)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    bool kept = h && status == MHD_HTTP_OK && share(s, path, (unsigned int)status, resp, h->len);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned int)status, resp);
    if (h && p && ret == MHD_YES)
        p->reading = resp;
    if (!kept)
        MHD_destroy_response(resp);
    return ret;
}

/* Whether p's address reads HTTP_PER_IP_LARGE other large answers (address_may_read); if so,
 * body is the 503's. */
static bool address_busy(const Pending *p, const struct MHD_Response *resp, const char *url,
                         StrBuf *body)
{
    if (!p || address_may_read(p, resp))
        return false;
    char q[300];
    log_debug("http response refused",
              "path=%s reason=\"this address is still reading %d large responses\"",
              log_quote(url, q, sizeof(q)), HTTP_PER_IP_LARGE);
    strbuf_free(body);
    strbuf_puts(body, "busy: this address is still reading other large responses; try again\n");
    return true;
}

/* Whether a large answer of len bytes would take the held bodies past HTTP_RESPONSE_BUDGET (one
 * is always served when none is held); if so, body is the 503's. */
static bool budget_busy(const HttpServer *s, const char *url, size_t len, StrBuf *body)
{
    if (s->held == 0 || s->held + len <= HTTP_RESPONSE_BUDGET)
        return false;
    char q[300];
    log_debug("http response refused",
              "path=%s bytes=%zu held=%zu reason=\"large responses still being read\"",
              log_quote(url, q, sizeof(q)), len, s->held);
    strbuf_free(body);
    strbuf_puts(body, "busy: other large responses are still being read; try again\n");
    return true;
}

static enum MHD_Result answer(HttpServer *s, struct MHD_Connection *conn, const char *url,
                              const char *method, Pending *p);

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    HttpServer *s = cls;
    url = addr_request_path(url); /* absolute-form: its path (was 404) */
    /* The headers are complete: the connection is out of the header deadline until the
     * response is done (on_completed). */
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    Pending *p = ci ? ci->socket_context : NULL;
    if (p) {
        pending_unlink(p);
        /* The answer is queued now, before any body: one declared is left unread (linger_start). */
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        p->declared = cl ? strtoull(cl, NULL, 10) : 0;
        p->body_unread =
            p->declared > 0 ||
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    }
    enum MHD_Result ret = answer(s, conn, url, method, p);
    /* From here the answer must be sent within the response deadline: the idle timeout does not
     * bound a reader that takes a byte now and then. */
    if (p && ret == MHD_YES && !p->closing) {
        const struct MHD_Response *reading = p->reading;
        pending_link(p, &s->responses, s->response_deadline);
        p->reading = reading;
    }
    return ret;
}

/* The answer to one request; sets p->reading when it is a large one. */
static enum MHD_Result answer(HttpServer *s, struct MHD_Connection *conn, const char *url,
                              const char *method, Pending *p)
{
    StrBuf body = {0};
    /* HEAD is GET without the body (libmicrohttpd drops it), as HTTP requires of servers.
     * Another method is answered before any request body is read; libmicrohttpd then closes the
     * connection. RFC 9110: 501 for a method the server does not know (15.6.2), 405 with Allow
     * for a known one the resource does not take (15.5.6), 404 where there is no resource: 405
     * everywhere said that every path exists, and named an unknown token "not allowed", as the
     * producer demo did not. */
    if (!addr_request_line_valid(method, url)) {
        strbuf_puts(&body, "bad request line\n");
        return reply(s, conn, p, url, MHD_HTTP_BAD_REQUEST, &body, "text/plain; charset=utf-8",
                     false);
    }
    if (strcmp(url, "*") == 0) /* OPTIONS *: the server in general, a ping (RFC 9110 9.3.7) */
        return reply(s, conn, p, url, MHD_HTTP_OK, &body, "text/plain; charset=utf-8", true);
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        bool served = false;
        for (const char *const *path = s->paths; path && *path && !served; path++)
            served = strcmp(url, *path) == 0;
        int status = !addr_request_method_known(method) ? MHD_HTTP_NOT_IMPLEMENTED
                     : served                           ? MHD_HTTP_METHOD_NOT_ALLOWED
                                                        : MHD_HTTP_NOT_FOUND;
        strbuf_puts(&body, status == MHD_HTTP_NOT_IMPLEMENTED ? "method not implemented\n"
                           : served                           ? "method not allowed\n"
                                                              : "not found\n");
        return reply(s, conn, p, url, status, &body, "text/plain; charset=utf-8",
                     status == MHD_HTTP_METHOD_NOT_ALLOWED);
    }
    if (s->shared && monotime_now() >= s->shared_until) {
        /* Released before the budget is looked at: kept, it would count against the next
         * rendering, and an answer larger than half the budget would be refused for ever. */
        MHD_destroy_response(s->shared);
        s->shared = NULL;
    }
    bool shared = s->shared && strcmp(url, s->shared_path) == 0;
    /* Shared or not, a large answer read slowly holds a body: one address reads a few at once. */
    if (shared && address_busy(p, s->shared, url, &body))
        return reply(s, conn, p, url, MHD_HTTP_SERVICE_UNAVAILABLE, &body,
                     "text/plain; charset=utf-8", false);
    /* A path whose answer was large is refused to such an address, or while the budget has no
     * room for it (at its last length: a scrape changes little from one to the next), before it
     * is rendered again: else each request would cost the loop a rendering (0.1 s for 10 MB)
     * only to be refused, and a client asking again and again kept the loop from its work. */
    if (!shared && strcmp(url, s->large_path) == 0 &&
        (address_busy(p, NULL, url, &body) || budget_busy(s, url, s->large_len, &body)))
        return reply(s, conn, p, url, MHD_HTTP_SERVICE_UNAVAILABLE, &body,
                     "text/plain; charset=utf-8", false);
    if (shared) {
        enum MHD_Result ret = MHD_queue_response(conn, s->shared_status, s->shared);
        if (p && ret == MHD_YES)
            p->reading = s->shared;
        return ret;
    }
    const char *content_type = "text/plain; charset=utf-8";
    int status = s->fn(url, &body, &content_type, s->arg);
    if (status == MHD_HTTP_OK && body.len > HTTP_LARGE_RESPONSE &&
        address_busy(p, NULL, url, &body)) {
        status = MHD_HTTP_SERVICE_UNAVAILABLE;
        content_type = "text/plain; charset=utf-8";
    }
    /* One large body is always served when none is held, however large: the budget bounds what
     * readers that do not read can pile up, not what one scrape may be. Only a 200 is refused:
     * another status is the answer itself (a /readyz 503 with a line per database must never
     * turn into "busy"), and such bodies are small. */
    if (status == MHD_HTTP_OK && body.len > HTTP_LARGE_RESPONSE &&
        budget_busy(s, url, body.len, &body)) {
        status = MHD_HTTP_SERVICE_UNAVAILABLE;
        content_type = "text/plain; charset=utf-8";
    }
    return reply(s, conn, p, url, status, &body, content_type, false);
}

HttpServer *http_server_new(struct ev_loop *loop, const char *listen, const char *const *paths,
                            HttpHandlerFn fn, void *arg, char *err, size_t errlen)
{
    char host[256], port[16];
    unsigned port_number;
    if (!addr_parse_host_port("--metrics-listen", listen, host, sizeof(host), &port_number, err,
                              errlen))
        return NULL;
    snprintf(port, sizeof(port), "%u", port_number);
    HttpServer *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    int fd = open_listener(host, port, s->address, sizeof(s->address), err, errlen);
    if (fd < 0) {
        free(s);
        return NULL;
    }
    s->loop = loop;
    s->paths = paths;
    s->response_deadline = HTTP_RESPONSE_DEADLINE_S;
    s->header_deadline = HTTP_HEADER_DEADLINE_S;
    s->limit = connection_limit();
    s->fn = fn;
    s->arg = arg;
    s->daemon = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
        on_mhd_log, s, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, s->limit,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)HTTP_PER_IP_CONNECTIONS,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)HTTP_IDLE_TIMEOUT_S,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_MEMORY_LIMIT, MHD_OPTION_NOTIFY_CONNECTION,
        on_connection, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    const union MHD_DaemonInfo *info =
        s->daemon ? MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (!info) {
        snprintf(err, errlen, "--metrics-listen %s: cannot start the HTTP server", listen);
        if (s->daemon)
            MHD_stop_daemon(s->daemon);
        else
            close(fd);
        free(s);
        return NULL;
    }
    ev_io_init(&s->io, on_io, info->epoll_fd, EV_READ);
    s->io.data = s;
    ev_io_start(loop, &s->io);
    ev_init(&s->timer, on_timer);
    s->timer.data = s;
    ev_init(&s->deadline_timer, on_deadline);
    s->deadline_timer.data = s;
    drive(s);
    return s;
}

void http_server_set_response_deadline(HttpServer *s, double seconds)
{
    s->response_deadline = seconds;
}

void http_server_set_header_deadline(HttpServer *s, double seconds)
{
    s->header_deadline = seconds;
}

unsigned int http_server_connection_limit(const HttpServer *s)
{
    return s->limit;
}

unsigned long long http_server_linger_dropped(const HttpServer *s)
{
    return s->linger_dropped;
}

const char *http_server_address(const HttpServer *s)
{
    return s->address;
}

void http_server_free(HttpServer *s)
{
    if (!s)
        return;
    ev_io_stop(s->loop, &s->io);
    ev_timer_stop(s->loop, &s->timer);
    if (s->shared)
        MHD_destroy_response(s->shared); /* its free callback needs s */
    s->stopping = true;                  /* the connections MHD_stop_daemon closes do not linger */
    MHD_stop_daemon(s->daemon); /* closes the connections (on_connection frees each Pending) */
    while (s->lingers)
        linger_end(s->lingers);
    ev_timer_stop(s->loop, &s->deadline_timer); /* after: on_connection may have re-armed it */
    free(s);
}
