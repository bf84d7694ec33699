/* db_connect_checked and a host name with several addresses whose order changes between two
 * lookups (a DNS server's round robin): libpq looks the name up, then db_connect_checked looks
 * it up again for the addresses after the one libpq stopped at. The name here is answered by a
 * stand-in getaddrinfo (the executable's symbol, which libpq's calls take too) that rotates its
 * two loopback addresses at each lookup; behind them, two stand-in servers on one port (trust, no
 * TLS), each answering the startup with the version and hot standby state its test gives it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "db.h"

static int lookups; /* of the rotating name */

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **) =
        (int (*)(const char *, const char *, const struct addrinfo *, struct addrinfo **))dlsym(
            RTLD_NEXT, "getaddrinfo");
    if (!node || strcmp(node, "pg-rotating.test") != 0)
        return real(node, service, hints, res);
    const char *addrs[2] = {"127.0.0.1", "127.0.0.2"};
    int first = __atomic_fetch_add(&lookups, 1, __ATOMIC_SEQ_CST) % 2;
    struct addrinfo h = {
        .ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
    struct addrinfo *a = NULL, *b = NULL;
    int rc = real(addrs[first], service, &h, &a);
    if (rc == 0 && (rc = real(addrs[1 - first], service, &h, &b)) != 0)
        freeaddrinfo(a);
    if (rc != 0)
        return rc;
    a->ai_next = b; /* glibc frees each entry alone: a list of two lists is one list */
    *res = a;
    return 0;
}

/* The stand-in servers: fds[k] listens on 127.0.0.(k+1), its server says versions[k] and
 * in_hot_standby standby[k]. */
static int fds[2];
static const char *versions[2], *standby[2];
static volatile int stop;

static void put32(unsigned char *p, uint32_t v)
{
    v = htonl(v);
    memcpy(p, &v, 4);
}

/* Appends a ParameterStatus message (name, value) at out + at; returns the new length. */
static size_t put_param(unsigned char *out, size_t at, const char *name, const char *value)
{
    size_t nl = strlen(name) + 1, vl = strlen(value) + 1;
    out[at] = 'S', put32(out + at + 1, (uint32_t)(4 + nl + vl)), at += 5;
    memcpy(out + at, name, nl), at += nl;
    memcpy(out + at, value, vl), at += vl;
    return at;
}

/* Answers one startup (no TLS, no GSS, trust): AuthenticationOk, server_version, in_hot_standby
 * and default_transaction_read_only (with both, libpq 14+ decides target_session_attrs without a
 * query), ReadyForQuery. */
static void serve(int c, int k)
{
    unsigned char len[4], buf[1024];
    if (recv(c, len, 4, MSG_WAITALL) != 4)
        return;
    uint32_t n;
    memcpy(&n, len, 4);
    n = ntohl(n);
    if (n < 8 || n - 4 > sizeof(buf) || recv(c, buf, n - 4, MSG_WAITALL) != (ssize_t)(n - 4))
        return;
    size_t at = 0;
    unsigned char out[256];
    out[at] = 'R', put32(out + at + 1, 8), put32(out + at + 5, 0), at += 9;
    at = put_param(out, at, "server_version", versions[k]);
    at = put_param(out, at, "in_hot_standby", standby[k]);
    at = put_param(out, at, "default_transaction_read_only", "off");
    out[at] = 'Z', put32(out + at + 1, 5), out[at + 5] = 'I', at += 6;
    if (send(c, out, at, MSG_NOSIGNAL) != (ssize_t)at)
        return;
    struct pollfd p = {.fd = c, .events = POLLIN};
    if (poll(&p, 1, 2000) > 0) /* the client's Terminate, or its close */
        (void)recv(c, buf, sizeof(buf), 0);
}

static void *servers(void *arg)
{
    (void)arg;
    while (!stop) {
        struct pollfd p[2] = {{.fd = fds[0], .events = POLLIN}, {.fd = fds[1], .events = POLLIN}};
        if (poll(p, 2, 100) <= 0)
            continue;
        for (int k = 0; k < 2; k++) {
            if (!(p[k].revents & POLLIN))
                continue;
            int c = accept(fds[k], NULL, NULL);
            if (c >= 0) {
                serve(c, k);
                close(c);
            }
        }
    }
    return NULL;
}

/* Listens on 127.0.0.(k+1) at *port (0: any, then set). */
static int listen_at(int k, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)*port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK + (uint32_t)k)};
    socklen_t alen = sizeof(a);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 8), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* db_connect_checked(the rotating name on the servers' port, then extra) with the servers of
 * versions and standby, the name's first lookup (libpq's) giving 127.0.0.1 first and the next
 * (db_connect_checked's own) 127.0.0.2 first. The connection, or a failed test. */
static PGconn *connect_rotating(const char *extra, const char *v0, const char *s0, const char *v1,
                                const char *s1)
{
    unsetenv("PGSERVICE");
    unsetenv("PGHOST");
    unsetenv("PGHOSTADDR");
    unsetenv("PGPORT");
    unsetenv("PGTARGETSESSIONATTRS");
    versions[0] = v0, standby[0] = s0, versions[1] = v1, standby[1] = s1;
    lookups = 0;
    stop = 0;
    int port = 0;
    fds[0] = listen_at(0, &port);
    fds[1] = listen_at(1, &port);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, servers, NULL), 0);
    char conninfo[256], err[600];
    snprintf(conninfo, sizeof(conninfo),
             "host=pg-rotating.test port=%d dbname=x user=u sslmode=disable gssencmode=disable "
             "connect_timeout=5 %s",
             port, extra);
    bool unsupported = false;
    PGconn *conn = db_connect_checked(conninfo, "test_db_addrs", &unsupported, err, sizeof(err));
    stop = 1;
    pthread_join(t, NULL);
    close(fds[0]);
    close(fds[1]);
    if (!conn)
        fail_msg("no connection after %d lookups: %s (unsupported %d)", lookups, err, unsupported);
    assert_string_equal(PQhostaddr(conn), "127.0.0.2");
    return conn;
}

/* libpq stopped at the old server (127.0.0.1, its first address), which is the second of the
 * other lookup, so none came after it: the supported server (127.0.0.2) was never tried, exit 2
 * ("the server is 12.19"). */
static void test_rotating_name_past_old(void **state)
{
    (void)state;
    PGconn *conn = connect_rotating("", "12.19", "off", "15.4", "off");
    assert_int_equal(PQserverVersion(conn), 150004);
    PQfinish(conn);
}

/* The same with a standby first, read-write asked: "session is read-only", exit 1. */
static void test_rotating_name_past_standby(void **state)
{
    (void)state;
    PGconn *conn = connect_rotating("target_session_attrs=read-write", "15.4", "on", "15.4", "off");
    PQfinish(conn);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotating_name_past_old),
        cmocka_unit_test(test_rotating_name_past_standby),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
