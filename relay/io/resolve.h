/* resolve: host names looked up off the event loop. getaddrinfo waits for the nameservers for as
 * long as resolv.conf lets it (5 s a try by default, up to minutes), and libpq calls it inside
 * PQconnectPoll: on the loop, one database whose nameserver stopped answering would stop every
 * other connection, timer, delivery report and the health endpoint with it. Each lookup here runs
 * on a thread of its own and reports back on the loop (ev_async). */
#ifndef OUTBOX_RESOLVE_H
#define OUTBOX_RESOLVE_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

/* Addresses kept of one name (getaddrinfo's order; the rest are dropped). */
#define RESOLVE_MAX_ADDRS 16
/* Lookups whose threads are still waiting, given up on or not. A nameserver that never answers
 * keeps a thread until resolv.conf's timeouts end it; past this many such threads a new lookup
 * is refused (the connection retries later) instead of starting threads without bound. */
#define RESOLVE_MAX_RUNNING 64

typedef struct Resolve Resolve;

/* The end of a lookup, called on the loop: addrs holds n (1..RESOLVE_MAX_ADDRS) numeric
 * addresses joined by commas, or n is 0 and error says why (gai_strerror's words). Both strings
 * are valid only during the call. */
typedef void (*ResolveFn)(void *arg, const char *addrs, int n, const char *error);

/* Pure: whether libpq would look host up in the DNS: a name, not a numeric IPv4 or IPv6
 * address, not a Unix-domain socket directory ("/...") or abstract name ("@..."), not empty. */
bool resolve_needed(const char *host);

/* Starts looking host (copied) up for TCP connections. fn is called once, on loop, when the
 * lookup ends, unless resolve_cancel comes first; the caller keeps the handle until one of the
 * two. Returns NULL, with why in err, when RESOLVE_MAX_RUNNING lookups are still waiting or no
 * thread can be started. */
Resolve *resolve_start(struct ev_loop *loop, const char *host, ResolveFn fn, void *arg, char *err,
                       size_t errlen);

/* Gives a lookup up (NULL is fine): fn is not called, and the handle is gone. A thread still
 * waiting for a nameserver frees what it holds when getaddrinfo returns. Call on the loop's
 * thread, before the loop is destroyed. */
void resolve_cancel(Resolve *r);

#endif
