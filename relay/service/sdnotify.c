#include "sdnotify.h"

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

struct SdNotify {
    struct ev_loop *loop;
    SdStatusFn status_fn; /* the state and the STATUS= text (ops_sd_status, databases_sd_status) */
    const void *status_arg;
    char *addr;
    bool watchdog;      /* WATCHDOG_USEC set for this process */
    bool ready_sent;    /* READY=1 goes once */
    bool stopping_sent; /* and so does STOPPING=1 */
    bool send_failed;   /* the last send failed: the next failure is not logged again */
    char status[256];   /* the last STATUS= sent: a new one only when it changes */
    ev_timer tick;
    ev_signal term, intr; /* beside the relay's own watchers: STOPPING=1 at once */
};

bool sdnotify_send(const char *addr, const char *msg)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len = strlen(addr);
    if (addr[0] != '/' && addr[0] != '@') {
        errno = EAFNOSUPPORT; /* e.g. vsock: addresses, which no systemd of Debian 12 gives */
        return false;
    }
    /* As systemd reads the variable: an abstract name ('@', which becomes a NUL) may fill
     * sun_path, a path must leave room for its terminating NUL. */
    if (len < 2 || len > sizeof(sa.sun_path) - (addr[0] == '/' ? 1 : 0)) {
        errno = len < 2 ? EINVAL : ENAMETOOLONG;
        return false;
    }
    memcpy(sa.sun_path, addr, len);
    if (addr[0] == '@')
        sa.sun_path[0] = '\0'; /* abstract namespace: the name is the bytes after the NUL */
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    /* MSG_DONTWAIT: a full socket buffer (systemd busy) must not stall the loop; the next tick
     * sends the state again. */
    ssize_t n =
        sendto(fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, salen);
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(msg);
}

/* Sends msg; a failure is logged once per streak of failures (a socket that is gone stays gone,
 * and the relay goes on without systemd hearing from it). */
static bool send_state(SdNotify *n, const char *msg)
{
    if (sdnotify_send(n->addr, msg)) {
        n->send_failed = false;
        return true;
    }
    if (!n->send_failed) {
        int e = errno; /* log_quote below may change it */
        char q[300];
        log_warn("cannot notify systemd", "socket=%s error=\"%s\"",
                 log_quote(n->addr, q, sizeof(q)), strerror(e));
    }
    n->send_failed = true;
    return false;
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    SdNotify *n = w->data;
    /* The process's, not a database's: the context is whatever the last callback set (a
     * database's session, with --databases), and a warning here would name that database. */
    log_set_context(NULL);
    RelayStatus st;
    char status[sizeof(n->status)];
    status[0] = '\0';
    n->status_fn(n->status_arg, &st, status, sizeof(status));

    /* What changed is recorded only once systemd has it: a datagram that could not be sent
     * (its socket buffer full) is composed again at the next tick, READY=1 included. */
    char msg[320];
    int len = 0;
    bool stopping = st.stopping && !n->stopping_sent;
    bool ready = !st.stopping && st.postgres_up && !n->ready_sent;
    bool new_status = strcmp(status, n->status) != 0;
    if (stopping)
        len += snprintf(msg + len, sizeof(msg) - (size_t)len, "STOPPING=1\n");
    else if (ready)
        len += snprintf(msg + len, sizeof(msg) - (size_t)len, "READY=1\n");
    if (new_status)
        len += snprintf(msg + len, sizeof(msg) - (size_t)len, "STATUS=%s\n", status);
    /* Sent from the loop itself: if the loop stops turning, systemd stops hearing this and
     * kills and restarts the relay after WatchdogSec=. */
    if (n->watchdog)
        len += snprintf(msg + len, sizeof(msg) - (size_t)len, "WATCHDOG=1\n");
    if (len == 0 || !send_state(n, msg))
        return;
    n->stopping_sent |= stopping;
    n->ready_sent |= ready;
    if (new_status)
        snprintf(n->status, sizeof(n->status), "%s", status);
}

/* SIGTERM or SIGINT: the relay's own watchers start the shutdown; this one tells systemd at once,
 * so `systemctl status` shows "deactivating" while in-flight rows are acknowledged and marked. */
static void on_stop_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    SdNotify *n = w->data;
    log_set_context(NULL); /* the process's (on_tick) */
    if (n->stopping_sent || !send_state(n, "STOPPING=1\nSTATUS=shutting down\n"))
        return; /* not sent: the next tick sends it (the relay is stopping by then) */
    n->stopping_sent = true;
    snprintf(n->status, sizeof(n->status), "shutting down");
}

/* WATCHDOG_USEC is meant for us only when WATCHDOG_PID is unset or names this process. Returns
 * the interval in microseconds, 0 when there is no watchdog. */
static unsigned long long watchdog_usec(void)
{
    const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    if (!usec || !*usec)
        return 0;
    if (pid && *pid && strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(usec, &end, 10);
    return errno || *end || v == 0 ? 0 : v;
}

SdNotify *sdnotify_start(struct ev_loop *loop, SdStatusFn fn, const void *arg)
{
    const char *addr = getenv("NOTIFY_SOCKET");
    if (!addr || !*addr)
        return NULL;
    SdNotify *n = calloc(1, sizeof(*n));
    if (!n || !(n->addr = strdup(addr))) {
        free(n);
        log_warn("cannot notify systemd", "error=\"out of memory\"");
        return NULL;
    }
    n->loop = loop;
    n->status_fn = fn;
    n->status_arg = arg;
    /* Once a second is often enough for readiness and status; a watchdog gets at least two
     * pings per interval, as sd_watchdog_enabled(3) advises. */
    unsigned long long wd = watchdog_usec();
    n->watchdog = wd > 0;
    double period = 1.0;
    if (wd > 0 && wd / 2e6 < period)
        period = wd / 2e6;
    ev_timer_init(&n->tick, on_tick, 0., period);
    n->tick.data = n;
    ev_timer_start(loop, &n->tick);
    ev_signal_init(&n->term, on_stop_signal, SIGTERM);
    ev_signal_init(&n->intr, on_stop_signal, SIGINT);
    n->term.data = n->intr.data = n;
    ev_signal_start(loop, &n->term);
    ev_signal_start(loop, &n->intr);
    /* The relay stops its loop with ev_break, so these watchers do not hold the loop up; unref
     * them all the same so they never keep ev_run going on their own. */
    ev_unref(loop);
    ev_unref(loop);
    ev_unref(loop);
    char q[300];
    log_info("notifying systemd", "socket=%s watchdog_ms=%llu", log_quote(n->addr, q, sizeof(q)),
             wd / 1000);
    return n;
}

void sdnotify_free(SdNotify *n)
{
    if (!n)
        return;
    ev_ref(n->loop);
    ev_ref(n->loop);
    ev_ref(n->loop);
    ev_timer_stop(n->loop, &n->tick);
    ev_signal_stop(n->loop, &n->term);
    ev_signal_stop(n->loop, &n->intr);
    free(n->addr);
    free(n);
}
