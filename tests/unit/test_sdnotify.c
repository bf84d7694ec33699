/* Unit tests for sdnotify.c's sender: the addresses NOTIFY_SOCKET may hold, sent to real sockets
 * (a path and the abstract namespace). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sdnotify.h"

/* A datagram socket bound to addr in sdnotify_send's notation ('@' for the abstract namespace). */
static int listen_on(const char *addr)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len = strlen(addr);
    assert_true(len <= sizeof(sa.sun_path));
    memcpy(sa.sun_path, addr, len);
    if (addr[0] == '@')
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (bind(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)))
        fail_msg("bind %s: %s", addr, strerror(errno));
    return fd;
}

static void assert_received(int fd, const char *msg)
{
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
    assert_true(n >= 0);
    buf[n] = '\0';
    assert_string_equal(buf, msg);
}

/* An abstract name may fill sun_path (108 bytes with the '@'), as systemd allows: it was refused
 * with EAFNOSUPPORT, and a relay given such a socket never told systemd it was ready. */
static void test_abstract_names(void **state)
{
    /* A short one, and one that fills sun_path: 108 bytes with the '@'. */
    char name[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
    size_t lengths[] = {24, sizeof(name) - 1};
    for (size_t k = 0; k < 2; k++) {
        snprintf(name, sizeof(name), "@outbox-relay-test-%06d", (int)getpid() % 1000000);
        for (size_t i = strlen(name); i < lengths[k]; i++)
            name[i] = 'a';
        name[lengths[k]] = '\0';
        int fd = listen_on(name);
        if (!sdnotify_send(name, "READY=1\n"))
            fail_msg("%zu-byte abstract name refused: %s", lengths[k], strerror(errno));
        assert_received(fd, "READY=1\n");
        close(fd);
    }
}

static void test_path(void **state)
{
    char dir[] = "/tmp/outbox-relay-test-sd-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[200];
    snprintf(path, sizeof(path), "%s/notify", dir);
    int fd = listen_on(path);
    assert_true(sdnotify_send(path, "WATCHDOG=1\n"));
    assert_received(fd, "WATCHDOG=1\n");
    close(fd);
    unlink(path);
    rmdir(dir);
}

/* What cannot be sent says why: a path with no room for its NUL is too long, not an address
 * family the relay does not speak. */
static void test_refused(void **state)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
    memset(path, 'a', sizeof(path) - 1);
    path[0] = '/';
    path[sizeof(path) - 1] = '\0';
    errno = 0;
    assert_false(sdnotify_send(path, "READY=1\n"));
    assert_int_equal(errno, ENAMETOOLONG);
    errno = 0;
    assert_false(sdnotify_send("vsock:2:1234", "READY=1\n"));
    assert_int_equal(errno, EAFNOSUPPORT);
    errno = 0;
    assert_false(sdnotify_send("@", "READY=1\n"));
    assert_int_equal(errno, EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abstract_names),
        cmocka_unit_test(test_path),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
