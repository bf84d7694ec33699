/* resolve: host names looked up off the event loop. getaddrinfo waits for the nameservers for as
 * long as resolv.conf lets it (5 s a try by default, up to minutes), and libpq calls it inside
 * PQconnectPoll: on the loop, one database whose nameserver stopped answering would stop every
 * other connection, timer, delivery report and the health endpoint with it. A lookup here runs on
 * a thread of its own and reports back on the loop (ev_async).
 *
 * One lookup of a name runs at a time: every connection that needs the name while it runs waits
 * on that one, so a nameserver that never answers costs one thread per name, however many
 * sessions retry. A lookup every waiter gave up on runs on; a successful answer it gets late is
 * kept for RESOLVE_LATE_TTL_S and given to every request for the name meanwhile, at once, so
 * that a nameserver slower than connect_timeout still lets the next attempts connect. The Schema
 * Registry's client (registry.c) looks its URLs' host names up here too, and hands curl the
 * addresses, so that curl starts no lookup thread of its own. */
#ifndef OUTBOX_RESOLVE_H
#define OUTBOX_RESOLVE_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

/* Addresses kept of one name (getaddrinfo's order; the rest are dropped). */
#define RESOLVE_MAX_ADDRS 16
/* Names being looked up at once in the process. Past this many (each a thread waiting for a
 * nameserver) a request for another name is refused, and its connection retries later. */
#define RESOLVE_MAX_RUNNING 64
/* How long an answer that came after its waiters gave up is kept for the next request. */
#define RESOLVE_LATE_TTL_S 30

typedef struct Resolve Resolve;

/* The end of a lookup, called on the loop: addrs holds n (1..RESOLVE_MAX_ADDRS) numeric
 * addresses joined by commas, or n is 0 and error says why (gai_strerror's words). Both strings
 * are valid only during the call; the handle is gone when it returns (and must not be given to
 * resolve_cancel from inside it). */
typedef void (*ResolveFn)(void *arg, const char *addrs, int n, const char *error);

/* Pure: whether libpq would look host up in the DNS: a name, not a numeric IPv4 or IPv6
 * address, not a Unix-domain socket directory ("/...") or abstract name ("@..."), not empty. */
bool resolve_needed(const char *host);

/* Asks for host's addresses (host copied) for TCP connections: a late answer kept for it, the
 * lookup of it already running (on this loop, or one every waiter gave up, whichever loop started
 * it: it reports to this one from then on), or a new one. fn is called once, on loop and never from
 * inside this call, unless resolve_cancel comes first; the caller keeps the handle until one of the
 * two. Returns NULL, with why in err, when RESOLVE_MAX_RUNNING other names are being looked up
 * or no thread can be started. */
Resolve *resolve_start(struct ev_loop *loop, const char *host, ResolveFn fn, void *arg, char *err,
                       size_t errlen);

/* Gives a request up (NULL is fine): fn is not called, and the handle is gone. The lookup runs on
 * for the name's other waiters, or alone (resolve.h's top). Call on the loop's thread. */
void resolve_cancel(Resolve *r);

#endif
