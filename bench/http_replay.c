/*
 * http-replay: retried POST /orders requests against producer-demo, for bench/redis_bench.sh.
 *
 *   http-replay --port P --prefix STR --keys K --requests N --threads C
 *
 * Each of C threads keeps one HTTP/1.1 keep-alive connection to 127.0.0.1:P and sends its share
 * of N requests, cycling over its own share of the K keys STR-0 .. STR-(K-1), each with a fixed
 * body: after a first pass (N = K) every later request is a retry the server answers from its
 * stored response.
 * Prints one JSON line: {"requests","errors","replayed","seconds","per_second","p50_ms",
 * "p99_ms"}; errors counts answers other than 201 and broken connections (a broken connection
 * ends its thread). Every socket operation is bounded by a 10 s timeout. Exit 0 when no error,
 * 1 otherwise, 2 on bad flags.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef struct Worker {
    pthread_t thread;
    int port;
    const char *prefix;
    long kfrom, kto; /* keys [kfrom, kto): this thread's own, so no two threads send one key at
                        once (that would be a legitimate 409, not a replay) */
    long from, to;   /* requests [from, to) */
    double *lat_ms;  /* one per request, -1 when not done */
    long errors, replayed;
} Worker;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n <= 0)
            return false;
        buf += n;
        len -= (size_t)n;
    }
    return true;
}

/* Reads one response; returns its status (0 on a broken connection), whether it was a replay
 * and whether the server closes the connection after it (producer-demo does after 1,000 answers:
 * KEEPALIVE_REQUESTS). Needs Content-Length (producer-demo always sends it). */
static int read_response(int fd, char *buf, size_t cap, bool *replayed, bool *closing)
{
    size_t len = 0;
    char *end = NULL;
    while (!end) {
        if (len + 1 >= cap)
            return 0;
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n <= 0)
            return 0;
        len += (size_t)n;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    size_t head = (size_t)(end + 4 - buf);
    const char *cl = strcasestr(buf, "\r\nContent-Length:");
    if (!cl || cl > end)
        return 0;
    size_t body = strtoul(cl + 17, NULL, 10);
    *replayed = strcasestr(buf, "\r\nIdempotency-Replayed: true") != NULL;
    const char *conn = strcasestr(buf, "\r\nConnection: close");
    *closing = conn && conn < end;
    int status = atoi(buf + 9);
    size_t have = len - head;
    while (have < body) {
        char skip[4096];
        size_t want = body - have < sizeof(skip) ? body - have : sizeof(skip);
        ssize_t n = recv(fd, skip, want, 0);
        if (n <= 0)
            return 0;
        have += (size_t)n;
    }
    return status;
}

static void *run(void *arg)
{
    Worker *w = arg;
    int fd = connect_to(w->port);
    char req[1024], body[256], buf[16384];
    for (long i = w->from; i < w->to; i++) {
        if (fd < 0) {
            w->errors += w->to - i;
            break;
        }
        long k = w->kfrom + (i - w->from) % (w->kto - w->kfrom);
        int blen =
            snprintf(body, sizeof(body),
                     "{\"customer_id\":\"bench-%s\",\"amount_cents\":%ld,\"currency\":\"EUR\"}",
                     w->prefix, 100 + k);
        int rlen = snprintf(req, sizeof(req),
                            "POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            "Idempotency-Key: %s-%ld\r\nContent-Type: application/json\r\n"
                            "Content-Length: %d\r\n\r\n%s",
                            w->prefix, k, blen, body);
        double t0 = now_ms();
        bool replayed = false, closing = false;
        int status = send_all(fd, req, (size_t)rlen)
                         ? read_response(fd, buf, sizeof(buf), &replayed, &closing)
                         : 0;
        w->lat_ms[i] = now_ms() - t0;
        if (status != 201)
            w->errors++;
        if (replayed)
            w->replayed++;
        if (status == 0) {
            close(fd);
            fd = -1;
        } else if (closing) { /* as a client must: the next request on a new connection */
            close(fd);
            fd = connect_to(w->port);
        }
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int port = 0;
    long keys = 1000, requests = 10000, threads = 4;
    const char *prefix = "k";
    static const struct option longopts[] = {{"port", 1, NULL, 'p'},    {"prefix", 1, NULL, 'x'},
                                             {"keys", 1, NULL, 'k'},    {"requests", 1, NULL, 'n'},
                                             {"threads", 1, NULL, 'c'}, {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'p':
            port = atoi(optarg);
            break;
        case 'x':
            prefix = optarg;
            break;
        case 'k':
            keys = atol(optarg);
            break;
        case 'n':
            requests = atol(optarg);
            break;
        case 'c':
            threads = atol(optarg);
            break;
        default:
            return 2;
        }
    }
    if (port < 1 || port > 65535 || keys < 1 || requests < 1 || threads < 1 || threads > 256 ||
        keys < threads || strlen(prefix) > 64) {
        fprintf(stderr, "http-replay: need --port 1-65535, --keys/--requests >= 1, "
                        "--threads 1-256 (at most --keys), --prefix of at most 64 bytes\n");
        return 2;
    }
    double *lat = malloc((size_t)requests * sizeof(*lat));
    Worker *w = calloc((size_t)threads, sizeof(*w));
    if (!lat || !w) {
        fprintf(stderr, "http-replay: out of memory\n");
        return 1;
    }
    double t0 = now_ms();
    for (long t = 0; t < threads; t++) {
        w[t] = (Worker){.port = port,
                        .prefix = prefix,
                        .kfrom = keys * t / threads,
                        .kto = keys * (t + 1) / threads,
                        .from = requests * t / threads,
                        .to = requests * (t + 1) / threads,
                        .lat_ms = lat};
        if (pthread_create(&w[t].thread, NULL, run, &w[t]) != 0) {
            fprintf(stderr, "http-replay: cannot start a thread\n");
            return 1;
        }
    }
    long errors = 0, replayed = 0;
    for (long t = 0; t < threads; t++) {
        pthread_join(w[t].thread, NULL);
        errors += w[t].errors;
        replayed += w[t].replayed;
    }
    double seconds = (now_ms() - t0) / 1e3;
    qsort(lat, (size_t)requests, sizeof(*lat), cmp_double);
    /* Nearest-rank percentiles. */
    double p50 = lat[(requests * 50 + 99) / 100 - 1], p99 = lat[(requests * 99 + 99) / 100 - 1];
    printf("{\"requests\":%ld,\"errors\":%ld,\"replayed\":%ld,\"seconds\":%.3f,"
           "\"per_second\":%.0f,\"p50_ms\":%.3f,\"p99_ms\":%.3f}\n",
           requests, errors, replayed, seconds, (double)requests / seconds, p50, p99);
    free(lat);
    free(w);
    return errors ? 1 : 0;
}
