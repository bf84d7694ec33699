/* http: a small read-only HTTP server (libmicrohttpd) driven by the relay's libev loop.
 *
 * GET (and HEAD) requests are answered by one handler from the loop thread, synchronously; any
 * other method gets 405. libmicrohttpd runs in "external polling" mode and starts no thread of
 * its own (see http.c for how it is wired into the loop). */
#ifndef OUTBOX_HTTP_H
#define OUTBOX_HTTP_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

#include "strbuf.h"

typedef struct HttpServer HttpServer;

/* Bytes of large response bodies (over HTTP_LARGE_RESPONSE: /metrics of many databases or
 * topics) held at once for clients still reading them. A slow reader holds its response until it
 * has read it all, so without this bound every connection could hold a /metrics body of several
 * MB. Past it a large answer is 503 (one is always served when none is held, whatever its size):
 * room for several scrapers reading 10 MB answers at once; readers that hold it all make the
 * scrape fail visibly (503, up=0) until they finish or time out, rather than the relay's memory
 * grow with them.
 * Smaller ones, /healthz and /readyz (under 50 KB with the most databases and reasons), are
 * bounded by the connection limits and always served, and so is an answer of any other status
 * than 200, whatever its size: a probe never reads "busy" as not ready. */
#define HTTP_LARGE_RESPONSE (64u << 10)
#define HTTP_RESPONSE_BUDGET (64u << 20)

/* A large answer (200) is rendered once and served to every request of its path for this long:
 * rendering /metrics of 100 databases of 1000 topics each (10 MB) takes the loop ~0.1 s, and
 * each request rendering its own would let a few connections asking again and again (or many
 * asking at once, all answered in one turn of the loop) keep the loop from everything else. A
 * scrape may be this much older than its request; small answers are always fresh. */
#define HTTP_SHARE_S 1.0

/* An answer must be sent within this many seconds of its request, or the connection is cut. A
 * scraper gives up long before (Prometheus: scrape_timeout, 10 s by default), and a 10 MB
 * /metrics takes well under a second on any network a scraper uses; a reader slower than that
 * held the answer, and a large one's share of HTTP_RESPONSE_BUDGET, for as long as it kept
 * reading a little (every write it lets through resets the idle timeout). */
#define HTTP_RESPONSE_DEADLINE_S 30.0

/* Large answers one client address may be reading at once; its next is 503 until one is read:
 * its slow readers then take at most this many of the budget's bodies, not all of them. A
 * scraper reads one at a time. */
#define HTTP_PER_IP_LARGE 2

/* Answers GET path (without the query string): appends the body to body, may point
 * *content_type at a static string (default text/plain), returns the HTTP status. */
typedef int (*HttpHandlerFn)(const char *path, StrBuf *body, const char **content_type, void *arg);

/* Listens on `listen` (HOST:PORT, see addr.h) and serves requests through fn on loop: GET and
 * HEAD go to fn. Another method HTTP defines is answered 405 with Allow: GET, HEAD on one of
 * paths (the paths fn serves, NULL-terminated, kept by pointer: static), 404 on any other; a
 * method HTTP does not define, 501 on any path (addr_request_method_known); a malformed request
 * line (a method that is no token, the target "*" with another method than OPTIONS) 400, and
 * OPTIONS * 200 with Allow (addr_request_line_valid). Returns NULL with one line in err when the
 * address is malformed or cannot be bound. */
HttpServer *http_server_new(struct ev_loop *loop, const char *listen, const char *const *paths,
                            HttpHandlerFn fn, void *arg, char *err, size_t errlen);

/* Sets the response deadline (HTTP_RESPONSE_DEADLINE_S by default) for requests answered from
 * now on: the tests shorten it. */
void http_server_set_response_deadline(HttpServer *s, double seconds);

/* Sets the header deadline (HTTP_HEADER_DEADLINE_S in http.c by default) for connections
 * started or answered from now on: the tests lengthen it. */
void http_server_set_header_deadline(HttpServer *s, double seconds);

/* The connection limit s was started with: HTTP_MAX_CONNECTIONS in http.c, or half the
 * descriptor limit if lower. Past all but a reserve of it, each new connection closes the oldest
 * one that has not sent its request (http.c says why). */
unsigned int http_server_connection_limit(const HttpServer *s);

/* Bytes the lingering closes of s (http.c: linger_start) have read and dropped since it started;
 * the tests count them per turn of the loop. */
unsigned long long http_server_linger_dropped(const HttpServer *s);

/* The address actually bound, "HOST:PORT" (the real port when 0 was asked for). */
const char *http_server_address(const HttpServer *s);

/* Closes the listening socket and every connection; frees s (NULL is fine). */
void http_server_free(HttpServer *s);

#endif
