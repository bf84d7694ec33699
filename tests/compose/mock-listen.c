/*
 * mock-listen.so: makes the project's mock broker (tests/tools/mock-broker.c) reachable from other
 * containers, for tests/compose/compose_up.sh only. Loaded with LD_PRELOAD in the test's Kafka
 * image (tests/compose/Dockerfile); the test tools themselves are unchanged.
 *
 * Why: librdkafka 2.0.2's mock cluster binds each broker to 127.0.0.1 on an ephemeral port and
 * advertises exactly that address in its metadata, with no API to change either. A client in
 * another container bootstraps, reads "broker 1 is at 127.0.0.1:PORT" and connects to its own
 * loopback. This library moves those listeners, and only those (AF_INET, 127.0.0.1, port 0),
 * to all interfaces on fixed ports (MOCK_FIRST_PORT, then +1 per broker) and makes
 * getsockname() on them report MOCK_ADVERTISE_IP, which the mock then advertises. So clients
 * reach broker 1 at kafka:MOCK_FIRST_PORT (the compose file's KAFKA_BROKERS) and follow the
 * metadata to the container's own address.
 *
 *   MOCK_ADVERTISE_IP=172.18.0.3 MOCK_FIRST_PORT=9092 LD_PRELOAD=mock-listen.so mock-broker ...
 *
 * Without MOCK_ADVERTISE_IP it changes nothing.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_LISTENERS 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int moved_fds[MAX_LISTENERS];
static int n_moved;
static int next_port;

static int (*real_bind)(int, const struct sockaddr *, socklen_t);
static int (*real_getsockname)(int, struct sockaddr *, socklen_t *);

static void resolve(void)
{
    if (!real_bind)
        real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    if (!real_getsockname)
        real_getsockname =
            (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "getsockname");
}

static bool is_moved(int fd)
{
    bool found = false;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_moved; i++)
        if (moved_fds[i] == fd)
            found = true;
    pthread_mutex_unlock(&lock);
    return found;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
    resolve();
    const char *ip = getenv("MOCK_ADVERTISE_IP");
    const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
    if (!ip || !addr || addr->sa_family != AF_INET || len < sizeof(*in) ||
        in->sin_addr.s_addr != htonl(INADDR_LOOPBACK) || in->sin_port != 0)
        return real_bind(fd, addr, len);

    struct sockaddr_in any = *in;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    pthread_mutex_lock(&lock);
    if (!next_port) {
        const char *first = getenv("MOCK_FIRST_PORT");
        next_port = first ? atoi(first) : 9092;
    }
    int port = next_port++;
    pthread_mutex_unlock(&lock);
    any.sin_port = htons((unsigned short)port);
    int rc = real_bind(fd, (const struct sockaddr *)&any, sizeof(any));
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&lock);
    if (n_moved < MAX_LISTENERS)
        moved_fds[n_moved++] = fd;
    pthread_mutex_unlock(&lock);
    fprintf(stderr, "mock-listen: broker listener on 0.0.0.0:%d, advertised as %s:%d\n", port, ip,
            port);
    return 0;
}

int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
    resolve();
    int rc = real_getsockname(fd, addr, len);
    const char *ip = getenv("MOCK_ADVERTISE_IP");
    if (rc == 0 && ip && addr->sa_family == AF_INET && is_moved(fd)) {
        struct in_addr a;
        if (inet_pton(AF_INET, ip, &a) == 1)
            ((struct sockaddr_in *)addr)->sin_addr = a;
    }
    return rc;
}
