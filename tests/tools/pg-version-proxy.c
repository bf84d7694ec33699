/*
 * pg-version-proxy: a TCP proxy on loopback in front of PostgreSQL that makes the server look
 * older than it is, for the tests of the relay's minimum server version (there is no
 * PostgreSQL 12 to test against).
 *
 *   pg-version-proxy --listen PORT --to PORT --version TEXT
 *
 * Accepts on 127.0.0.1:PORT, connects each client to 127.0.0.1:--to (one child process per
 * connection) and forwards both directions as they are, except the server's ParameterStatus
 * message for server_version, whose value becomes TEXT (libpq's PQserverVersion reads it). The
 * server's stream is read message by message (type byte, length), so the client must not ask
 * for TLS or GSSAPI encryption (sslmode=disable gssencmode=disable). Prints "listening" once
 * ready; runs until killed, its children with it (they end when either side closes).
 * Exit: 2 on bad flags or a port it cannot listen on.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* Writes all of buf, or ends the child (the other side went away). */
static void put(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n <= 0)
            _exit(0);
        p += n;
        len -= (size_t)n;
    }
}

/* Reads exactly len bytes, or ends the child. */
static void get(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n <= 0)
            _exit(0);
        p += n;
        len -= (size_t)n;
    }
}

/* Forwards one message of the server's stream, rewriting server_version's ParameterStatus. */
static void server_message(int server, int client, const char *version)
{
    unsigned char head[5];
    get(server, head, sizeof(head));
    uint32_t len;
    memcpy(&len, head + 1, 4);
    len = ntohl(len);
    if (len < 4 || len > (1u << 30))
        _exit(1);
    char *body = malloc(len - 4 + 1);
    if (!body)
        _exit(1);
    get(server, body, len - 4);
    body[len - 4] = '\0';
    static const char name[] = "server_version";
    if (head[0] == 'S' && len - 4 >= sizeof(name) && memcmp(body, name, sizeof(name)) == 0) {
        uint32_t out = htonl((uint32_t)(4 + sizeof(name) + strlen(version) + 1));
        put(client, head, 1);
        put(client, &out, 4);
        put(client, name, sizeof(name));
        put(client, version, strlen(version) + 1);
    } else {
        put(client, head, sizeof(head));
        put(client, body, len - 4);
    }
    free(body);
}

static void serve(int client, int to_port, const char *version)
{
    int server = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)to_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (server < 0 || connect(server, (struct sockaddr *)&a, sizeof(a)) != 0)
        _exit(1);
    for (;;) {
        struct pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
        if (poll(p, 2, -1) < 0)
            _exit(1);
        if (p[0].revents) {
            char buf[65536];
            ssize_t n = read(client, buf, sizeof(buf));
            if (n <= 0)
                _exit(0);
            put(server, buf, (size_t)n);
        }
        if (p[1].revents) /* whole messages: a client waits for the rest of one anyway */
            server_message(server, client, version);
    }
}

int main(int argc, char **argv)
{
    int listen_port = 0, to_port = 0;
    const char *version = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--listen") == 0)
            listen_port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--to") == 0)
            to_port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--version") == 0)
            version = argv[i + 1];
    }
    if (listen_port <= 0 || listen_port > 65535 || to_port <= 0 || to_port > 65535 || !version ||
        argc != 7) {
        fprintf(stderr, "usage: pg-version-proxy --listen PORT --to PORT --version TEXT\n");
        return 2;
    }
    signal(SIGCHLD, SIG_IGN); /* children are reaped by the kernel */
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)listen_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 64) != 0) {
        perror("pg-version-proxy: listen");
        return 2;
    }
    printf("listening\n");
    fflush(stdout);
    pid_t parent = getpid();
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0)
            continue;
        pid_t pid = fork();
        if (pid == 0) {
            /* Ends with the proxy, so a test that kills the proxy leaves no child behind. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(0);
            close(l);
            serve(c, to_port, version);
        }
        close(c);
    }
}
