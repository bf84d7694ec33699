/*
 * http-flood: hostile HTTP clients for tests (tests/it/security/89_http_abuse.sh).
 *
 *   http-flood --target IP:PORT --from IP[,IP...] --count N --mode idle|trickle|garbage
 *              --seconds S
 *
 * Opens N TCP connections to the target, spread round-robin over the source addresses (any of
 * 127.0.0.0/8 works on Linux without configuration), then for S seconds:
 *   idle     sends half a request ("GET /healthz HTTP/1.1\r\nHost: x\r\n") and nothing more;
 *   trickle  sends the same, then one more header byte every 200 ms on every connection, so an
 *            idle timeout never fires;
 *   garbage  sends 512 bytes that are not HTTP, then idles.
 * Connections the server refuses, does not accept within 1 s, or closes are counted, not
 * reopened.
 * Output, one line on stdout: "opened O refused R closed_by_server C open_at_end E".
 * Exit: 0 after S seconds, 2 on bad flags or a source address that cannot be bound.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_SOURCES 256

static void usage_error(const char *msg)
{
    fprintf(stderr, "http-flood: %s\n", msg);
    exit(2);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sends all of buf or reports the connection gone (-1). */
static int send_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Connects within ms milliseconds: a server that stopped accepting leaves its backlog full,
 * and a blocking connect would then wait for minutes of SYN retries. Leaves fd blocking. */
static int connect_within(int fd, const struct sockaddr_in *dst, int ms)
{
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = connect(fd, (const struct sockaddr *)dst, sizeof(*dst));
    if (rc != 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len = sizeof(err);
        rc = poll(&p, 1, ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                     err == 0
                 ? 0
                 : -1;
    }
    fcntl(fd, F_SETFL, flags);
    return rc == 0;
}

/* True when the peer closed fd (or reset it); drains whatever it sent. */
static int peer_closed(int fd)
{
    char buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n == 0)
            return 1;
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : 1;
    }
}

int main(int argc, char **argv)
{
    const char *target = NULL, *from = "127.0.0.1", *mode = "idle";
    int count = 100;
    double seconds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--target"))
            target = argv[i + 1];
        else if (!strcmp(argv[i], "--from"))
            from = argv[i + 1];
        else if (!strcmp(argv[i], "--count"))
            count = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mode"))
            mode = argv[i + 1];
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
        else
            usage_error("unknown flag");
    }
    if (!target || count <= 0 || seconds <= 0)
        usage_error("--target IP:PORT --count N>0 --seconds S>0 needed");
    int trickle = !strcmp(mode, "trickle"), garbage = !strcmp(mode, "garbage");
    if (!trickle && !garbage && strcmp(mode, "idle") != 0)
        usage_error("--mode: idle, trickle or garbage");

    char host[64];
    const char *colon = strrchr(target, ':');
    if (!colon || (size_t)(colon - target) >= sizeof(host))
        usage_error("--target: IP:PORT");
    memcpy(host, target, (size_t)(colon - target));
    host[colon - target] = '\0';
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &dst.sin_addr) != 1)
        usage_error("--target: an IPv4 address");

    struct in_addr src[MAX_SOURCES];
    int nsrc = 0;
    char list[4096];
    snprintf(list, sizeof(list), "%s", from);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && nsrc < MAX_SOURCES;
         tok = strtok_r(NULL, ",", &save))
        if (inet_pton(AF_INET, tok, &src[nsrc++]) != 1)
            usage_error("--from: IPv4 addresses, comma-separated");

    int *fds = calloc((size_t)count, sizeof(int));
    if (!fds)
        usage_error("out of memory");
    int opened = 0, refused = 0, closed = 0;
    static const char half[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for (int i = 0; i < count; i++) {
        fds[i] = -1;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            refused++;
            continue;
        }
        struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr = src[i % nsrc]};
        if (bind(fd, (struct sockaddr *)&me, sizeof(me)) != 0) {
            perror("http-flood: bind");
            exit(2);
        }
        if (!connect_within(fd, &dst, 1000)) {
            close(fd);
            refused++;
            continue;
        }
        opened++;
        if (garbage) {
            char junk[512];
            for (size_t k = 0; k < sizeof(junk); k++)
                junk[k] = (char)(k * 7 + 1);
            junk[0] = '\x01';
            if (send_all(fd, junk, sizeof(junk)) != 0) {
                close(fd);
                closed++;
                continue;
            }
        } else if (send_all(fd, half, sizeof(half) - 1) != 0) {
            close(fd);
            closed++;
            continue;
        }
        fds[i] = fd;
    }

    double end = now_s() + seconds;
    while (now_s() < end) {
        struct timespec tick = {0, 200 * 1000 * 1000};
        nanosleep(&tick, NULL);
        for (int i = 0; i < count; i++) {
            if (fds[i] < 0)
                continue;
            if (peer_closed(fds[i]) || (trickle && send_all(fds[i], "a", 1) != 0)) {
                close(fds[i]);
                fds[i] = -1;
                closed++;
            }
        }
    }
    int open_at_end = 0;
    for (int i = 0; i < count; i++)
        if (fds[i] >= 0) {
            open_at_end++;
            close(fds[i]);
        }
    printf("opened %d refused %d closed_by_server %d open_at_end %d\n", opened, refused, closed,
           open_at_end);
    free(fds);
    return 0;
}
