/* sdnotify: the relay's side of systemd's service notification protocol (sd_notify(3)), for a
 * unit of Type=notify (debian/outbox-relay.service).
 *
 * READY=1 once the relay is up and its PostgreSQL sessions are connected (every start-up check
 * passed: a bad configuration exits before, a database that cannot be reached keeps the start
 * job waiting, and TimeoutStartSec= fails it); STATUS= mirrors /readyz, so `systemctl status`
 * says whether PostgreSQL and Kafka are reachable; WATCHDOG=1 from the event loop while it
 * turns (the liveness /healthz proves), when the unit sets WatchdogSec=; STOPPING=1 on SIGTERM.
 *
 * The protocol is written here rather than taken from libsystemd: it is one datagram on a unix
 * socket, documented as a stable interface (newer sd_notify(3) pages print an implementation to
 * copy), and linking libsystemd would bring its compression and crypto libraries into the
 * relay's process for it (the route of the 2024 xz backdoor into sshd, after which OpenSSH did
 * the same). docs/packaging.md has the details. */
#ifndef OUTBOX_SDNOTIFY_H
#define OUTBOX_SDNOTIFY_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

#include "relay.h"

typedef struct SdNotify SdNotify;

/* What the process reports (ops_sd_status for one relay, databases_sd_status for a list): fills
 * st (stopping, and postgres_up: READY=1 then) and the STATUS= text. */
typedef void (*SdStatusFn)(const void *arg, RelayStatus *st, char *status, size_t len);

/* Starts reporting what fn(arg) says on loop when NOTIFY_SOCKET is set; returns NULL (nothing to
 * do) when it is not. arg must outlive the returned SdNotify. */
SdNotify *sdnotify_start(struct ev_loop *loop, SdStatusFn fn, const void *arg);

/* Stops the timer and frees n; NULL is fine. */
void sdnotify_free(SdNotify *n);

/* Sends msg ("KEY=VALUE\n..."), one datagram, to the socket named by addr (a path, or "@name"
 * for the abstract namespace). Returns false with errno set when it cannot. */
bool sdnotify_send(const char *addr, const char *msg);

#endif
