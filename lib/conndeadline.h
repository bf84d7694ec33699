/* conndeadline: a deadline for each connection's request, for servers that run a thread per
 * connection (producer-demo's libmicrohttpd server; the relay's metrics port does the same on its
 * event loop, relay/io/http.c).
 *
 * An idle timeout never fires for a client that trickles a byte every few seconds; a deadline
 * does. A connection is "on the clock" from its start (or from the previous response on a
 * kept-alive connection) until its request has fully arrived (line, headers and body); one that
 * is still on the clock after `seconds` is shut down (shutdown(2), SHUT_RDWR), so the thread
 * serving it sees end-of-file and closes it. The descriptor itself is never closed here: its
 * owner closes it after conndeadline_remove, so a number reused meanwhile is never touched.
 *
 * All deadlines are "now + the same constant", so the list is kept in order by appending: adding,
 * pausing and removing are O(1). One thread of its own sleeps until the earliest deadline.
 * Thread-safe.
 *
 * With a room bound, a connection added past it shuts down the oldest one on the clock (one that
 * has not sent its whole request): at the server's own connection limit libmicrohttpd stops
 * accepting, and a client with a quick request (a health probe) waited in the kernel's backlog
 * behind a flood of slow ones until their deadline, for ever against a flood that reconnects.
 * A new one whose socket holds unread bytes is passed over: its thread has not read its request
 * yet; so is one never served for its first half second, whose request may not have arrived
 * (libmicrohttpd tells of a connection as it accepts it). When none can go, the watcher shuts one
 * down as soon as one can (a newcomer may not come: the server stops accepting at its own limit).
 */
#ifndef OUTBOX_CONNDEADLINE_H
#define OUTBOX_CONNDEADLINE_H

#include <stddef.h>

/* How long a new connection is spared when room is made: its client sends the request right after
 * its connect, and a connection closed before that came was a probe turned away unread. Both
 * servers (producer-demo's, the relay's metrics port) use it. */
#define CONNDEADLINE_YOUNG_S 0.5

/* The connections a server with this connection limit keeps open before each new one shuts
 * down an older one: all but a sixteenth of the limit (at least one less). The rest is room for
 * the connections shut down until the server reaps them: were the room the limit itself, the
 * server would stop accepting meanwhile, and a probe waited behind them. One rule for both HTTP
 * servers: producer-demo's (conndeadline_new's room) and the relay's metrics port
 * (relay/io/http.c, which keeps its own deadlines on its loop). */
static inline long conndeadline_room(long limit)
{
    return limit - (limit / 16 > 0 ? limit / 16 : 1);
}

typedef struct ConnDeadlines ConnDeadlines;
typedef struct ConnDeadline ConnDeadline;

/* Starts the watcher (seconds > 0). room: the most connections kept open (added, not removed,
 * not shut down), 0 for no bound; keep it under the server's own limit, so that connections shut
 * down but not yet closed do not fill that. NULL with one line in err when no thread or
 * memory. */
ConnDeadlines *conndeadline_new(double seconds, long room, char *err, size_t errlen);

/* Stops the watcher and frees d; entries still registered are freed too (their connections
 * must be gone: call after the server stopped). NULL is allowed. */
void conndeadline_free(ConnDeadlines *d);

/* Registers connection fd, on the clock from now; past the room bound, shuts down the oldest
 * connection on the clock (not fd's) that was paused before, or that is past its first half
 * second and whose socket holds no unread bytes, if one of the oldest few is such (else none:
 * the server's own limit holds meanwhile, and the watcher looks again).
 * NULL when out of memory (then the
 * caller should refuse the connection: without an entry it would escape the deadline). */
ConnDeadline *conndeadline_add(ConnDeadlines *d, int fd);

/* The request has fully arrived: off the clock (handling it may take as long as it takes). */
void conndeadline_pause(ConnDeadlines *d, ConnDeadline *e);

/* A response was sent on a kept-alive connection: on the clock again, from now, for the next
 * request. */
void conndeadline_restart(ConnDeadlines *d, ConnDeadline *e);

/* The connection is closing (before its descriptor is closed): forgets and frees e. */
void conndeadline_remove(ConnDeadlines *d, ConnDeadline *e);

/* How many connections were cut at their deadline so far. */
long conndeadline_cut(ConnDeadlines *d);

/* How many connections were shut down to make room for new ones so far. */
long conndeadline_evicted(ConnDeadlines *d);

#endif
