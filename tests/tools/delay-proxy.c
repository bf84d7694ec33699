/*
 * delay-proxy: a TCP proxy on loopback that delays everything it forwards, for `make bench`'s
 * runs with the database "on another host" (bench/bench.sh, BENCH_PG_RTT_US). This kernel has no
 * netem, so a round trip's network time is made here instead.
 *
 *   delay-proxy --listen PORT --to PORT --delay-us N [--only-after TEXT [--times N]]
 *
 * Accepts on 127.0.0.1:PORT, connects each client to 127.0.0.1:--to, and forwards every chunk it
 * reads in either direction N microseconds after it arrived, in order: a request and its answer
 * each take N µs longer, so a round trip takes 2N µs longer. Each direction holds at most
 * MAX_QUEUED bytes (it stops reading until they are written), and at most MAX_CONNS connections
 * are open at once (more are refused). Prints "listening" once ready; runs until killed.
 *
 * With --only-after, only answers are delayed, and only the answer that follows a client chunk
 * containing TEXT (a request/response protocol such as Redis's, one command at a time: "NX"
 * delays the replies to SET ... NX, so the client times out although the command took effect);
 * --times bounds how many answers are delayed in all (default: no bound). Everything else passes
 * at once (a later answer still waits behind a delayed one: order is kept).
 * Exit: 2 on bad flags or a port it cannot listen on.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 64
#define MAX_QUEUED (4 << 20)
#define CHUNK 65536

typedef struct Chunk {
    struct Chunk *next;
    double due; /* monotonic seconds */
    size_t len, off;
    char data[];
} Chunk;

/* One direction: bytes read from `from`, written to `to` once due. */
typedef struct {
    int from, to;
    Chunk *head, *tail;
    size_t queued;
    bool eof;
} Flow;

typedef struct {
    bool used;
    bool armed;    /* --only-after: the last client chunk held the text */
    Flow up, down; /* client -> server, server -> client */
} Pair;

static Pair pairs[MAX_CONNS];
static double delay_s;
static const char *only_after; /* NULL: delay everything */
static long times_left = -1;   /* answers still to delay with --only-after; -1: no bound */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage_error(const char *msg)
{
    fprintf(stderr, "delay-proxy: %s\n", msg);
    exit(2);
}

static void close_pair(Pair *p)
{
    Flow *flows[2] = {&p->up, &p->down};
    for (int i = 0; i < 2; i++) {
        for (Chunk *c = flows[i]->head, *next; c; c = next) {
            next = c->next;
            free(c);
        }
    }
    close(p->up.from);
    close(p->down.from);
    memset(p, 0, sizeof(*p));
}

/* The delay of a chunk just read on pair p's flow f. */
static double chunk_delay(Pair *p, const Flow *f, const char *data, size_t len)
{
    if (!only_after)
        return delay_s;
    if (f == &p->up) {
        p->armed = memmem(data, len, only_after, strlen(only_after)) != NULL;
        return 0;
    }
    if (!p->armed || times_left == 0)
        return 0;
    p->armed = false;
    if (times_left > 0)
        times_left--;
    return delay_s;
}

/* Reads what arrived on f (of pair p) into a new chunk; false when the connection is done. */
static bool flow_read(Pair *p, Flow *f)
{
    Chunk *c = malloc(sizeof(Chunk) + CHUNK);
    if (!c)
        return false;
    ssize_t n = recv(f->from, c->data, CHUNK, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        free(c);
        return true;
    }
    if (n <= 0) {
        free(c);
        f->eof = true;
        return f->head != NULL; /* what is queued still goes out */
    }
    c->next = NULL;
    c->due = now_s() + chunk_delay(p, f, c->data, (size_t)n);
    c->len = (size_t)n;
    c->off = 0;
    if (f->tail)
        f->tail->next = c;
    else
        f->head = c;
    f->tail = c;
    f->queued += (size_t)n;
    return true;
}

/* Writes the chunks that are due; false when the peer is gone. */
static bool flow_write(Flow *f, double now)
{
    while (f->head && f->head->due <= now) {
        Chunk *c = f->head;
        ssize_t n = send(f->to, c->data + c->off, c->len - c->off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return true;
        if (n <= 0)
            return false;
        c->off += (size_t)n;
        f->queued -= (size_t)n;
        if (c->off < c->len)
            return true;
        f->head = c->next;
        if (!f->head)
            f->tail = NULL;
        free(c);
    }
    return !(f->eof && !f->head);
}

static int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 64) != 0)
        usage_error("cannot listen on the --listen port");
    return fd;
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void accept_one(int lfd, int to_port)
{
    int c = accept(lfd, NULL, NULL), one = 1;
    if (c < 0)
        return;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Pair *p = NULL;
    for (int i = 0; i < MAX_CONNS && !p; i++)
        if (!pairs[i].used)
            p = &pairs[i];
    int s = p ? connect_to(to_port) : -1;
    if (s < 0) {
        close(c);
        return;
    }
    *p = (Pair){.used = true, .up = {.from = c, .to = s}, .down = {.from = s, .to = c}};
}

int main(int argc, char **argv)
{
    int listen_port = 0, to_port = 0;
    long delay_us = -1;
    const char *usage = "usage: delay-proxy --listen PORT --to PORT --delay-us N "
                        "[--only-after TEXT [--times N]]";
    if (argc % 2 != 1)
        usage_error(usage);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--only-after") == 0) {
            if (!argv[i + 1][0])
                usage_error("--only-after needs a non-empty text");
            only_after = argv[i + 1];
            continue;
        }
        char *end;
        long v = strtol(argv[i + 1], &end, 10);
        /* Up to an hour: a held answer may need to outlast a client's own deadline. */
        if (*end || v < 0 || v > 3600000000L)
            usage_error("flag values are integers from 0 to 3600000000");
        if (strcmp(argv[i], "--listen") == 0)
            listen_port = (int)v;
        else if (strcmp(argv[i], "--to") == 0)
            to_port = (int)v;
        else if (strcmp(argv[i], "--delay-us") == 0)
            delay_us = v;
        else if (strcmp(argv[i], "--times") == 0)
            times_left = v;
        else
            usage_error(usage);
    }
    if (listen_port < 1 || listen_port > 65535 || to_port < 1 || to_port > 65535 || delay_us < 0 ||
        (times_left >= 0 && !only_after))
        usage_error(usage);
    delay_s = (double)delay_us / 1e6;
    signal(SIGPIPE, SIG_IGN);
    int lfd = listen_on(listen_port);
    printf("listening\n");
    fflush(stdout);

    for (;;) {
        /* Per flow: its source when it may read, its destination when a due write blocked. */
        struct pollfd fds[1 + 4 * MAX_CONNS];
        Flow *of[1 + 4 * MAX_CONNS];
        Pair *op[1 + 4 * MAX_CONNS];
        int nfds = 0;
        double now = now_s(), next_due = -1;
        fds[nfds++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < MAX_CONNS; i++) {
            if (!pairs[i].used)
                continue;
            Flow *flows[2] = {&pairs[i].up, &pairs[i].down};
            for (int k = 0; k < 2; k++) {
                Flow *f = flows[k];
                if (!f->eof && f->queued < MAX_QUEUED) {
                    of[nfds] = f;
                    op[nfds] = &pairs[i];
                    fds[nfds++] = (struct pollfd){.fd = f->from, .events = POLLIN};
                }
                if (f->head && f->head->due > now) {
                    if (next_due < 0 || f->head->due < next_due)
                        next_due = f->head->due;
                } else if (f->head) {
                    of[nfds] = NULL;
                    fds[nfds++] = (struct pollfd){.fd = f->to, .events = POLLOUT};
                }
            }
        }
        struct timespec ts = {0, 0}, *tsp = NULL;
        if (next_due >= 0) {
            double wait = next_due - now;
            if (wait > 0) {
                ts.tv_sec = (time_t)wait;
                ts.tv_nsec = (long)((wait - (double)ts.tv_sec) * 1e9);
            }
            tsp = &ts;
        }
        if (ppoll(fds, (nfds_t)nfds, tsp, NULL) < 0 && errno != EINTR)
            return 1;
        if (fds[0].revents & POLLIN)
            accept_one(lfd, to_port);
        for (int j = 1; j < nfds; j++)
            if (of[j] && (fds[j].revents & (POLLIN | POLLHUP | POLLERR)))
                if (!flow_read(op[j], of[j]))
                    of[j]->eof = true;
        now = now_s();
        for (int i = 0; i < MAX_CONNS; i++) {
            if (!pairs[i].used)
                continue;
            bool up = flow_write(&pairs[i].up, now), down = flow_write(&pairs[i].down, now);
            if (!up || !down)
                close_pair(&pairs[i]);
        }
    }
}
