#include "server.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "addr.h"
#include "conndeadline.h"
#include "log.h"
#include "order.h"

#define CONNECTION_TIMEOUT_S 30 /* idle keep-alive connections are closed after this */
/* A request answered before its body (declared over ORDER_BODY_MAX, or its framing refused):
 * libmicrohttpd stops reading, sends the answer and closes. Closed with the client's body still
 * arriving, the socket sent a reset: a client that sends its whole body before it reads
 * (Python's http.client, requests) failed its send with EPIPE/ECONNRESET and never saw the 413
 * or 400. After the answer, the rest of the body is read and dropped on the connection's own
 * thread (a lingering close, as nginx and Apache do) until the client closes, the declared
 * length is in, or these bounds: then the connection is closed (reset if the client still
 * sends). */
#define LINGER_S 5.0
#define LINGER_BYTES (64L * 1024 * 1024)
/* The answers a kept-alive connection carries: the last says "Connection: close", and the
 * connection closes once it is sent (nginx's keepalive_requests, 1000 too). A client that
 * pipelines requests and reads the answers slowly is never idle (the 30 s timeout) nor late
 * with a request (the request deadline: each comes at once), so it held its connection, and the
 * thread serving it, for as long as it went on: measured open after 100 s with 16 KB read every
 * half second. A client that reads nothing is closed by the idle timeout once the socket buffers
 * are full (measured: 31.5 s). */
#define KEEPALIVE_REQUESTS 1000

/* Limits against hostile or broken clients (docs/demos.md#producer-demo-the-order-api), as on the
 * relay's metrics port (relay/io/http.c). One thread serves each connection, so every connection
 * held open costs a thread and a slot of max_connections:
 *  - per address: a flood from one address is closed at accept and leaves the other addresses'
 *    slots free (libmicrohttpd's per-IP limit);
 *  - in all: max_connections; past all but a sixteenth of them, each new connection shuts down
 *    the oldest one still sending its request (lib/conndeadline.h): at the limit itself
 *    libmicrohttpd stops accepting, and /healthz waited in the kernel's backlog behind a flood
 *    from two addresses (the per-address limit is half the total by default) until the request
 *    deadline cut it, for ever against a flood that reconnects. The sixteenth
 *    (conndeadline_room) is room for the connections shut down until their threads close them;
 *  - a request's line, headers and body must arrive within the request deadline of the
 *    connection's start (or of the previous response on a kept-alive connection): a client that
 *    trickles a byte at a time never trips the idle timeout, this deadline it does
 *    (lib/conndeadline.h). */

struct Server {
    struct MHD_Daemon *daemon;
    Api *api;
    ConnDeadlines *deadlines;
    long max_connections;
    /* The request lines (an access log: one a answer, whoever asks) of the current second and
     * the ones held back since the last "held back" line (request_line_due). */
    long log_rate;
    pthread_mutex_t log_mu;
    double log_second; /* mono_s() when the current second began, 0 before any */
    long logged, held;
    /* Connections shut down for room as of the last warning, and its time (0: none yet): only
     * on_connection's start, on libmicrohttpd's one accepting thread, touches them. */
    long evicted_warned;
    double evict_warned_at;
};

#define EVICT_WARN_S 60.0 /* at most one "connection limit reached" line this often */

/* One connection's state (libmicrohttpd's socket context), touched by its own thread only. */
typedef struct Conn {
    ConnDeadline *deadline;
    unsigned long answers; /* queued so far (KEEPALIVE_REQUESTS) */
} Conn;

/* One request's state across the access handler's calls (headers, body chunks, end). */
typedef struct Request {
    char *body;
    size_t len, cap;
    bool too_large;
    bool answered_early; /* answered before its body: linger() drops the body after the answer */
    unsigned long long declared; /* the Content-Length, 0 when none or not a number */
    struct timespec start;
} Request;

/* libmicrohttpd's messages, most of them about one connection ("Server reached connection
 * limit.", "Connection was closed by remote side with incomplete request."): logged one a
 * connection, a flood of N connections wrote N warnings (a client could fill the log as fast as it
 * could connect). Each message (its format, a literal of libmicrohttpd's, so one pointer a call
 * site) is logged at its first occurrence and then at most every MHD_LOG_EVERY_S, with the number
 * held back meanwhile; MHD_LOG_KINDS kinds are tracked, the one logged longest ago giving way. */
#define MHD_LOG_EVERY_S 60.0
#define MHD_LOG_KINDS 16

static struct {
    const char *fmt;
    double logged_at;
    long held_back;
} mhd_log_kinds[MHD_LOG_KINDS];
static pthread_mutex_t mhd_log_mu = PTHREAD_MUTEX_INITIALIZER;

static double mono_s(void);

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    double now = mono_s();
    long held_back = 0;
    pthread_mutex_lock(&mhd_log_mu);
    int k = 0;
    for (int i = 0; i < MHD_LOG_KINDS; i++) {
        if (mhd_log_kinds[i].fmt == fmt) {
            k = i;
            break;
        }
        if (mhd_log_kinds[i].logged_at < mhd_log_kinds[k].logged_at)
            k = i; /* an empty slot (0) or the one logged longest ago, unless fmt is found */
    }
    if (mhd_log_kinds[k].fmt == fmt && now - mhd_log_kinds[k].logged_at < MHD_LOG_EVERY_S) {
        mhd_log_kinds[k].held_back++;
        pthread_mutex_unlock(&mhd_log_mu);
        return;
    }
    if (mhd_log_kinds[k].fmt == fmt)
        held_back = mhd_log_kinds[k].held_back;
    mhd_log_kinds[k].fmt = fmt;
    mhd_log_kinds[k].logged_at = now;
    mhd_log_kinds[k].held_back = 0;
    pthread_mutex_unlock(&mhd_log_mu);
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    log_one_line(msg);
    if (held_back > 0)
        log_warn(msg, "repeated=%ld", held_back); /* held back since its last line */
    else
        log_warn(msg, NULL);
}

/* Counts the headers called name, keeping the first value. */
typedef struct KeyHeaders {
    const char *name;
    int count;
    const char *first;
} KeyHeaders;

static enum MHD_Result count_keys(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    KeyHeaders *k = cls;
    (void)kind;
    if (strcasecmp(key, k->name) == 0) {
        if (k->count++ == 0)
            k->first = value ? value : "";
    }
    return MHD_YES;
}

/* The values of the header lines called name joined into one list value with ", ": RFC 9110
 * section 5.3 makes several lines of a list header (If-Match) the same as one line holding
 * their values in order. joined stays NULL when no such line came; its size is bounded by
 * libmicrohttpd's per-connection memory, which holds the headers. */
typedef struct ListHeader {
    const char *name;
    char *joined; /* malloc'd */
    size_t len;
    bool no_memory;
} ListHeader;

static enum MHD_Result join_list(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    ListHeader *h = cls;
    (void)kind;
    if (strcasecmp(key, h->name) != 0 || h->no_memory)
        return MHD_YES;
    size_t add = strlen(value ? value : "");
    char *grown = realloc(h->joined, h->len + add + 3);
    if (!grown) {
        h->no_memory = true;
        return MHD_YES;
    }
    if (h->joined) {
        memcpy(grown + h->len, ", ", 2);
        h->len += 2;
    }
    memcpy(grown + h->len, value ? value : "", add);
    h->len += add;
    grown[h->len] = '\0';
    h->joined = grown;
    return MHD_YES;
}

/* Whether the request's length is told in more than one way: more than one Content-Length
 * header, more than one Transfer-Encoding header, or both kinds. Such a request is refused
 * (RFC 9112 section 6.3: differing lengths are unrecoverable, and Transfer-Encoding with
 * Content-Length is a smuggling attempt or a broken client). libmicrohttpd 0.9.75 frames the
 * body by the first Content-Length (or by Transfer-Encoding, ignoring Content-Length) without
 * looking for others; a proxy in front that reads another one would see a different request
 * boundary, and the rest of the body would be taken here as the next pipelined request. */
static bool length_ambiguous(struct MHD_Connection *c)
{
    KeyHeaders length = {"Content-Length", 0, NULL}, encoding = {"Transfer-Encoding", 0, NULL};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_keys, &length);
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_keys, &encoding);
    return length.count > 1 || encoding.count > 1 || (length.count > 0 && encoding.count > 0);
}

/* Whether the request's Transfer-Encoding is one libmicrohttpd cannot frame: anything but
 * "chunked" alone (compared as libmicrohttpd compares it). libmicrohttpd 0.9.75 takes any
 * other value ("gzip", "gzip, chunked", "identity") as a body of unknown length that is not
 * chunked, and reads it until the client closes the connection: the client waits for an
 * answer that never comes until the request deadline cuts it. RFC 9112 section 6.1: a request
 * whose final transfer coding is not chunked gets 400 and the connection closed; one with a
 * coding the server does not implement should get 501. Returns 0 when fine, else the status
 * and the detail in *detail. */
static int transfer_coding_refused(struct MHD_Connection *c, const char *version,
                                   const char **detail)
{
    KeyHeaders te = {"Transfer-Encoding", 0, NULL};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_keys, &te);
    if (te.count == 0)
        return 0;
    /* HTTP/1.0 has no Transfer-Encoding: RFC 9112 section 6.1 makes such a request's framing
     * faulty (a 1.0 proxy in front would frame it otherwise); libmicrohttpd decodes it all the
     * same. */
    if (strcmp(version, MHD_HTTP_VERSION_1_0) == 0) {
        *detail = "Transfer-Encoding needs HTTP/1.1; send Content-Length";
        return 400;
    }
    if (strcasecmp(te.first, "chunked") == 0)
        return 0;
    const char *last = strrchr(te.first, ',');
    last = last ? last + 1 : te.first;
    last += strspn(last, " \t");
    size_t n = strcspn(last, " \t");
    if (n == 7 && strncasecmp(last, "chunked", 7) == 0 &&
        last[n + strspn(last + n, " \t")] == '\0') {
        *detail = "Transfer-Encoding: only chunked alone is implemented (no gzip or other "
                  "transfer coding)";
        return 501;
    }
    *detail = "Transfer-Encoding must be chunked (or left out, with Content-Length)";
    return 400;
}

/* Whether the request breaks RFC 9112 section 3.2: a server must answer 400 to an HTTP/1.1
 * request without a Host header and to any request with more than one. libmicrohttpd 0.9.75
 * checks neither. Nothing here reads Host, but a proxy or cache in front may key on one of two
 * values, and a client that sends no Host is broken in a way it should be told about. */
static bool host_invalid(struct MHD_Connection *c, const char *version)
{
    KeyHeaders host = {"Host", 0, NULL};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_keys, &host);
    return host.count > 1 || (host.count == 0 && strcmp(version, MHD_HTTP_VERSION_1_1) == 0);
}

static bool is_get(const char *method)
{
    return strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
}

static void not_allowed(ApiResponse *r, const char *allow)
{
    api_problem(r, 405, "method not allowed on this resource");
    r->allow = allow;
}

/* Whether the body comes in a content coding (gzip, deflate, ...): it is read as it arrives, so
 * such a body would be refused as "not JSON" (400), which blames the JSON rather than the
 * coding. RFC 9110 section 15.5.16: 415. "identity" is no coding. */
static bool body_encoded(struct MHD_Connection *c)
{
    KeyHeaders coding = {"Content-Encoding", 0, NULL};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_keys, &coding);
    return coding.count > 1 || (coding.count == 1 && strcasecmp(coding.first, "identity") != 0);
}

static void unsupported_coding(ApiResponse *r)
{
    api_problem(r, 415,
                "send the body without Content-Encoding (no gzip, deflate or other coding)");
}

/* Routes a complete request to its handler. */
static void route(Server *s, struct MHD_Connection *c, const char *url, const char *method,
                  Request *rq, ApiResponse *r)
{
    bool is_order = strncmp(url, "/orders/", 8) == 0 && url[8] && !strchr(url + 8, '/');
    /* RFC 9110 15.6.2: a method the server does not know is 501 on any path (it was 405 on a
     * path of the API, "not allowed" as if known, and 404 elsewhere), as the relay's server
     * answers it; a known one a path does not take is 405 with Allow below, and 404 where no
     * such path is. */
    if (!addr_request_method_known(method)) {
        api_problem(r, 501, "method not implemented");
    } else if (strcmp(url, "*") == 0) {
        /* OPTIONS * (addr_request_line_valid let no other method through): the server in
         * general, a ping (RFC 9110 9.3.7); it was 404. Allow: every method some path takes. */
        free(r->body);
        r->body = NULL;
        r->status = 200;
        r->content_type = "text/plain; charset=utf-8";
        r->allow = "GET, HEAD, POST, PATCH";
    } else if (strcmp(url, "/orders") == 0 && strcmp(method, "POST") != 0) {
        not_allowed(r, "POST");
    } else if (strcmp(url, "/orders") == 0 && rq->too_large) {
        char detail[64];
        snprintf(detail, sizeof(detail), "the body must be at most %d bytes", ORDER_BODY_MAX);
        api_problem(r, 413, detail);
    } else if (strcmp(url, "/orders") == 0 && body_encoded(c)) {
        unsupported_coding(r);
    } else if (strcmp(url, "/orders") == 0) {
        KeyHeaders keys = {"Idempotency-Key", 0, NULL};
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_keys, &keys);
        api_create_order(s->api, keys.first, keys.count, rq->body ? rq->body : "", rq->len, r);
    } else if (is_order && strcmp(method, "PATCH") == 0 && rq->too_large) {
        char detail[64];
        snprintf(detail, sizeof(detail), "the body must be at most %d bytes", ORDER_BODY_MAX);
        api_problem(r, 413, detail);
    } else if (is_order && strcmp(method, "PATCH") == 0 && body_encoded(c)) {
        unsupported_coding(r);
    } else if (is_order && strcmp(method, "PATCH") == 0) {
        KeyHeaders keys = {"Idempotency-Key", 0, NULL};
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_keys, &keys);
        ListHeader match = {"If-Match", NULL, 0, false};
        MHD_get_connection_values(c, MHD_HEADER_KIND, join_list, &match);
        if (match.no_memory)
            api_problem(r, 500, "out of memory");
        else
            api_update_order(s->api, url + 8, match.joined, keys.first, keys.count,
                             rq->body ? rq->body : "", rq->len, r);
        free(match.joined);
    } else if (is_order && !is_get(method)) {
        not_allowed(r, "GET, HEAD, PATCH");
    } else if (strcmp(url, "/healthz") == 0 && !is_get(method)) {
        not_allowed(r, "GET, HEAD");
    } else if (is_order) {
        api_get_order(s->api, url + 8, r);
    } else if (strcmp(url, "/healthz") == 0) {
        api_health(s->api, r);
    } else {
        api_problem(r, 404, "no such resource");
    }
}

static double elapsed_ms(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) * 1e3 +
           (double)(now.tv_nsec - start->tv_nsec) / 1e6;
}

/* Whether this answer's request line is logged: at most s->log_rate in a second. Any client
 * writes one with each request it makes, and a client pipelining GET /healthz wrote 300 a second
 * (39,000 lines, 4.7 MB in 130 s from one connection) into a log kept on a disk or in the journal
 * with the server's other lines. The lines past the rate are counted, and the count is said in
 * one line when a later second's first request comes (*held_before) or at the stop. */
static bool request_line_due(Server *s, long *held_before)
{
    *held_before = 0;
    if (s->log_rate == 0)
        return false;
    double now = mono_s();
    pthread_mutex_lock(&s->log_mu);
    if (s->log_second == 0 || now - s->log_second >= 1.0) {
        *held_before = s->held;
        s->held = s->logged = 0;
        s->log_second = now;
    }
    bool due = s->logged < s->log_rate;
    if (due)
        s->logged++;
    else
        s->held++;
    pthread_mutex_unlock(&s->log_mu);
    return due;
}

static enum MHD_Result respond(Server *s, struct MHD_Connection *c, const char *method,
                               const char *url, const Request *rq, ApiResponse *r)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    Conn *conn = ci ? ci->socket_context : NULL;
    if (conn && ++conn->answers >= KEEPALIVE_REQUESTS)
        r->close = true;
    const char *body = r->body ? r->body : "";
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    char num[16];
    MHD_add_response_header(resp, "Content-Type", r->content_type);
    /* Location names what a success created; a failure (rolled back) created nothing. */
    if (r->location[0] && r->status >= 200 && r->status < 300)
        MHD_add_response_header(resp, "Location", r->location);
    if (r->replayed)
        MHD_add_response_header(resp, "Idempotency-Replayed", "true");
    /* An ETag names the order's version: on a success, and on the 412/409 that tell a client
     * which version it is up against. */
    if (r->etag[0] &&
        ((r->status >= 200 && r->status < 300) || r->status == 412 || r->status == 409))
        MHD_add_response_header(resp, "ETag", r->etag);
    if (r->retry_after > 0) {
        snprintf(num, sizeof(num), "%d", r->retry_after);
        MHD_add_response_header(resp, "Retry-After", num);
    }
    if (r->allow)
        MHD_add_response_header(resp, "Allow", r->allow);
    if (r->close) /* libmicrohttpd closes the connection after this response */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)r->status, resp);
    MHD_destroy_response(resp);

    /* The method is the client's word as much as the path (any token libmicrohttpd takes, as
     * long as the request line): quoted and cut like it, or a quote in it left the line one no
     * logfmt reader parses, and a long one made the line as long. */
    long held = 0;
    bool due = request_line_due(s, &held);
    if (held > 0)
        log_info("request lines held back", "count=%ld limit=%ld", held, s->log_rate);
    if (!due)
        return ret;
    char qpath[160], qmethod[40];
    log_info("request", "method=%s path=%s status=%d replayed=%s redis=%s ms=%.1f",
             log_quote(method, qmethod, sizeof(qmethod)), log_quote(url, qpath, sizeof(qpath)),
             r->status, r->replayed ? "true" : "false", r->from_redis ? "hit" : "no",
             elapsed_ms(&rq->start));
    return ret;
}

/* The request has fully arrived (or is answered before its body): off the deadline's clock. */
static void request_arrived(Server *s, struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci && ci->socket_context)
        conndeadline_pause(s->deadlines, ((Conn *)ci->socket_context)->deadline);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    Server *s = cls;
    Request *rq = *con_cls;
    url = addr_request_path(url); /* absolute-form: its path (was 404) */
    if (!rq) {
        /* First call: headers only. */
        rq = calloc(1, sizeof(*rq));
        if (!rq)
            return MHD_NO;
        clock_gettime(CLOCK_MONOTONIC, &rq->start);
        *con_cls = rq;
        const char *refused = NULL;
        int refused_status = 400;
        if (!addr_request_line_valid(method, url))
            refused = "malformed request line: the method must be a token, and the target a path "
                      "or an absolute URI (\"*\" comes with OPTIONS only, host:port with CONNECT "
                      "only)";
        else if (length_ambiguous(c))
            refused = "send one Content-Length header, or Transfer-Encoding without "
                      "Content-Length";
        else if (host_invalid(c, version))
            refused = "send exactly one Host header";
        else
            refused_status =
                transfer_coding_refused(c, version, &refused); /* refused stays NULL on 0 */
        if (refused) {
            /* Answered before the body is read, and the connection closed after the answer:
             * nothing after these headers is taken as a request. */
            rq->answered_early = true;
            request_arrived(s, c);
            ApiResponse r = {0};
            api_problem(&r, refused_status, refused);
            r.close = true;
            enum MHD_Result ret = respond(s, c, method, url, rq, &r);
            api_response_free(&r);
            return ret;
        }
        /* A declared oversized body is refused before it is read (and before "100 Continue"). */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > ORDER_BODY_MAX) {
            rq->too_large = rq->answered_early = true;
            rq->declared = strtoull(cl, NULL, 10);
            request_arrived(s, c);
            ApiResponse r = {0};
            route(s, c, url, method, rq, &r);
            enum MHD_Result ret = respond(s, c, method, url, rq, &r);
            api_response_free(&r);
            return ret;
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        /* Keep reading an oversized body (and drop it) so the client gets a proper 413. */
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (rq->too_large || rq->len + n > ORDER_BODY_MAX) {
            rq->too_large = true;
            free(rq->body);
            rq->body = NULL;
            rq->len = rq->cap = 0;
            return MHD_YES;
        }
        if (rq->len + n + 1 > rq->cap) {
            size_t cap = rq->cap ? rq->cap : 1024;
            while (cap < rq->len + n + 1)
                cap *= 2;
            char *grown = realloc(rq->body, cap);
            if (!grown)
                return MHD_NO;
            rq->body = grown;
            rq->cap = cap;
        }
        memcpy(rq->body + rq->len, upload_data, n);
        rq->len += n;
        rq->body[rq->len] = '\0';
        return MHD_YES;
    }
    request_arrived(s, c);
    ApiResponse r = {0};
    route(s, c, url, method, rq, &r);
    enum MHD_Result ret = respond(s, c, method, url, rq, &r);
    api_response_free(&r);
    return ret;
}

static double mono_s(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/* The lingering close of a request answered before its body (LINGER_S), or of a kept-alive
 * connection's last answer (KEEPALIVE_REQUESTS): its answer is sent (libmicrohttpd closes such a
 * connection after it), so the write side is shut, and what the client still sends (the body,
 * pipelined requests) is read and dropped until it closes, the declared length (when told, else
 * LINGER_BYTES) is in, or LINGER_S pass. Runs on the connection's own thread, with a fixed
 * buffer. At SIGTERM it ends at once: MHD_stop_daemon shuts the socket down (the poll wakes and
 * recv reads end-of-file) before it joins this thread (docs/demos.md). */
static void linger(struct MHD_Connection *c, const Request *rq)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci || ci->connect_fd == MHD_INVALID_SOCKET)
        return;
    int fd = ci->connect_fd;
    shutdown(fd, SHUT_WR); /* the answer is out: tell the client so (FIN) */
    unsigned long long left = rq->declared && rq->declared < (unsigned long long)LINGER_BYTES
                                  ? rq->declared
                                  : (unsigned long long)LINGER_BYTES;
    double until = mono_s() + LINGER_S;
    char sink[16384];
    while (left > 0) {
        double wait = until - mono_s();
        if (wait <= 0)
            break;
        struct pollfd p = {fd, POLLIN, 0};
        int n = poll(&p, 1, (int)(wait * 1000) + 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        ssize_t got = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (got <= 0)
            break; /* the client closed (or reset) */
        left = (unsigned long long)got >= left ? 0 : left - (unsigned long long)got;
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    Server *s = cls;
    Request *rq = *con_cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    Conn *conn = ci ? ci->socket_context : NULL;
    /* The last answer of a kept-alive connection (KEEPALIVE_REQUESTS) closes it too, and a
     * client that pipelines has more requests on their way, unread: closed at once, the socket
     * sent a reset, which drops the answers still in its send buffer, the closing one among them
     * (RFC 9112 9.6). Measured: 5,000 pipelined GET /healthz read slowly got 33 answers and a
     * reset instead of 1,000 and the end of the stream. It lingers as a request answered before
     * its body does: the client reads every answer, then the end. */
    bool last = conn && conn->answers >= KEEPALIVE_REQUESTS;
    if (rq && (rq->answered_early || last) && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
        linger(c, rq);
    if (rq) {
        free(rq->body);
        free(rq);
        *con_cls = NULL;
    }
    /* A kept-alive connection now waits for its next request: on the clock again. (A closing
     * one is removed by on_connection right after.) */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && conn)
        conndeadline_restart(s->deadlines, conn->deadline);
}

/* Puts each new connection on the request deadline's clock; forgets it when it closes (before
 * libmicrohttpd closes the descriptor). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    Server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        Conn *conn = ci ? calloc(1, sizeof(*conn)) : NULL;
        if (conn && !(conn->deadline = conndeadline_add(s->deadlines, ci->connect_fd))) {
            free(conn);
            conn = NULL;
        }
        *socket_context = conn;
        if (ci && !conn) /* it would escape the deadline: refuse it */
            shutdown(ci->connect_fd, SHUT_RDWR);
        long evicted = conndeadline_evicted(s->deadlines);
        if (evicted > s->evicted_warned &&
            (s->evict_warned_at == 0 || mono_s() - s->evict_warned_at >= EVICT_WARN_S)) {
            log_warn("connection limit reached",
                     "limit=%ld closed=%ld reason=\"the oldest connections still sending their "
                     "request are closed to admit new ones\"",
                     s->max_connections, evicted - s->evicted_warned);
            s->evicted_warned = evicted;
            s->evict_warned_at = mono_s();
        }
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        Conn *conn = *socket_context;
        if (conn)
            conndeadline_remove(s->deadlines, conn->deadline);
        free(conn);
        *socket_context = NULL;
    }
}

Server *server_start(Api *api, const char *listen, const ServerLimits *limits, char *err,
                     size_t errlen)
{
    char host[256], port_text[8];
    unsigned port;
    if (!addr_parse_host_port("--listen", listen, host, sizeof(host), &port, err, errlen))
        return NULL;
    snprintf(port_text, sizeof(port_text), "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, port_text, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "--listen: cannot resolve '%.100s': %s", host, gai_strerror(gai));
        return NULL;
    }
    Server *s = calloc(1, sizeof(*s));
    if (!s) {
        freeaddrinfo(ai);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->api = api;
    s->max_connections = limits->max_connections;
    s->log_rate = limits->request_log_rate;
    pthread_mutex_init(&s->log_mu, NULL);
    s->deadlines = conndeadline_new((double)limits->request_deadline_s,
                                    conndeadline_room(limits->max_connections), err, errlen);
    if (!s->deadlines) {
        freeaddrinfo(ai);
        free(s);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_AUTO | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* The logger goes first so that MHD reports problems with later options through it. */
    s->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)limits->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)limits->max_per_address, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)CONNECTION_TIMEOUT_S, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        snprintf(err, errlen, "cannot listen on %.100s (address in use or not local?)", listen);
        conndeadline_free(s->deadlines);
        free(s);
        return NULL;
    }
    return s;
}

unsigned server_port(const Server *s)
{
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info ? info->port : 0;
}

void server_stop(Server *s)
{
    if (!s)
        return;
    /* Stop accepting first; MHD_stop_daemon then waits for the connection threads. */
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    MHD_stop_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    long cut = conndeadline_cut(s->deadlines);
    if (cut > 0)
        log_info("connections cut at the request deadline", "count=%ld", cut);
    long evicted = conndeadline_evicted(s->deadlines);
    if (evicted > 0)
        log_info("connections closed at the connection limit", "count=%ld", evicted);
    if (s->held > 0) /* the connection threads are gone: no lock needed */
        log_info("request lines held back", "count=%ld limit=%ld", s->held, s->log_rate);
    conndeadline_free(s->deadlines);
    pthread_mutex_destroy(&s->log_mu);
    free(s);
}
