#include "registry.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "monotime.h"
#include "optval.h"
#include "resolve.h"
#include "secrets.h"
#include "strbuf.h"

/* A registry answer larger than this is not a schema we can use (Confluent's default limit on a
 * schema is far below it); reading stops there, so a hostile endpoint cannot fill memory. */
#define RESPONSE_MAX (4 * 1024 * 1024)
#define BACKOFF_FIRST_S 1.0
#define BACKOFF_MAX_S 10.0
/* A 429 or 503 with Retry-After: that URL is asked again no sooner than it says, but no later
 * than this after the answer (a gateway's "Retry-After: 86400", or a date a wrong clock put far
 * ahead, would otherwise hold every row for a day; asked again, a registry still shedding load
 * says so again). */
#define RETRY_AFTER_MAX_S 60.0
/* A subject the registry says does not exist is asked again after this. */
#define MISSING_RETRY_S 5.0
#define MAX_URLS 8
/* Subjects kept without a schema (the registry said 404, or failed): at most this many. They only
 * spare the registry a request per row; subjects come from the rows (an event type, a topic made
 * of an aggregate type), so a writer's bug that makes one per row would otherwise grow the cache
 * by one entry per row for the life of the process. The least recently looked up go first, so a
 * subject rows keep naming is not forgotten (and asked again) for others named once. Subjects
 * with a schema are not counted: there are as many as the registry holds. */
#define NEGATIVE_MAX 1000
/* Requests for subjects without a schema at hand (new ones, and those whose "not found" or failure
 * is over its retry time): at most LOOKUP_BURST at once, then LOOKUP_RATE a second. Subjects come
 * from the rows: a writer's bug that names a new subject per row (or more subjects than
 * NEGATIVE_MAX in turn, each forgotten before its retry time) would otherwise send the registry a
 * request per row, and the cache only remembers answers. Beyond the budget a new subject waits
 * (its row with it, order kept) and a subject known missing stays missing until a request may go.
 */
#define LOOKUP_BURST 100.0
#define LOOKUP_RATE 20.0
/* The line saying lookups are held back is logged at most this often. */
#define THROTTLE_LOG_S 60.0
/* A registry host's addresses (looked up by resolve.h) are used for this long, then looked up
 * again for the next request: curl's own DNS cache keeps a name 60 s by default. */
#define HOST_TTL_S 60.0

typedef enum { ENTRY_EMPTY, ENTRY_FETCHING, ENTRY_OK, ENTRY_MISSING, ENTRY_FAILED } EntryState;

typedef struct Entry {
    /* The cache's entries from the most recently looked up (r->entries) to the least (r->last). */
    struct Entry *next, *prev;
    struct Entry *hnext; /* the next in its hash bucket */
    uint32_t hash;
    char *subject;
    EntryState state;
    double retry_at; /* monotonic: MISSING and FAILED entries are asked again from then on */
    double backoff_s;
    double failed_at; /* monotonic: when its last request failed (entry_failed) */
    double wanted_at; /* monotonic: when a row last looked it up (registry_lookup) */
    char *missing_why;
    RegistrySchema schema; /* valid in ENTRY_OK */
    char *schema_text;
} Entry;

typedef struct Request {
    struct Request *next; /* the registry's requests in flight */
    Registry *r;
    /* NULL: one of recheck_down's requests whose status alone is read, GET /subjects (list) or
     * a subject the registry served */
    Entry *entry;
    bool list;
    CURL *easy;
    int url_index; /* which of r->urls it went to: a failure moves r->current on from there only */
    StrBuf body;
    bool due; /* on_host_resolved's mark */
    bool too_large;
    /* Its body was cut (cut_body): GET /subjects at its first bytes, an error's past
     * ERROR_BODY_MAX (on_body); the transfer's write error is taken for the answer. */
    bool cut;
    /* Waiting for its URL's host name to be looked up (UrlHost): not yet in the multi handle.
     * wait bounds the wait by the request's own timeout, which started at started. */
    bool waiting;
    ev_timer wait;
    double started;             /* monotonic */
    struct curl_slist *resolve; /* CURLOPT_RESOLVE's list: curl reads it when it starts */
    char errbuf[CURL_ERROR_SIZE];
} Request;

/* The host of one of the registry's URLs. A name is looked up by the relay's own resolver
 * (resolve.h), and curl is handed the addresses (CURLOPT_RESOLVE, "host:port:addr,...") so that it
 * never starts a lookup of its own: curl 7.88's threaded resolver either joins its thread when a
 * request ends while the lookup waits for a nameserver (the loop, every database's, stood still
 * until getaddrinfo gave up), or with CURLOPT_QUICK_EXIT detaches it, one thread per request, in
 * a detach that races with the thread's end (curl PR #17320: a use after free). The URL's name
 * stays curl's, for the Host header, SNI and the certificate's check. */
typedef struct UrlHost {
    struct Registry *r;
    int index;  /* of the URL, in r->urls */
    char *name; /* NULL: numeric, localhost, or not parsed: curl needs no lookup of its own */
    long port;  /* the URL's, or its scheme's */
    Resolve *resolving; /* the lookup the URL's waiting requests wait for */
    char *entry;        /* "name:port:addr,...", of the last answer; NULL: none */
    double answered_at; /* monotonic: when entry came */
} UrlHost;

typedef struct SockWatch {
    ev_io io;
    Registry *r;
} SockWatch;

struct Registry {
    struct ev_loop *loop;
    /* The log context current when the registry was made (its database's, when a process serves
     * several): made current again by each of its watchers, whose lines would otherwise carry
     * whichever database's watcher ran last. */
    const char *log_context;
    CURLM *multi;
    ev_timer timer;
    ev_timer retry_timer; /* fires when the earliest entry in backoff may be asked again */
    char *urls[MAX_URLS];
    /* Each URL as the log and errors show it: a password in it masked by position (log.h),
     * whatever its length (the secrets registry skips short ones). */
    char *shown[MAX_URLS];
    int n_urls;
    UrlHost hosts[MAX_URLS];
    int current; /* the URL requests go to; moves on after a failure */
    /* Monotonic, by URL: not asked before then (a 429 or 503's Retry-After; 0: no such wait).
     * Requests go to another URL meanwhile, or wait (url_held). */
    double held_until[MAX_URLS];
    long held_status[MAX_URLS]; /* the answer that asked for the wait (429, 503), for messages */
    char *userpwd;
    char *ca_file; /* the bundle's path, for messages */
    char *ca_pem;  /* its contents, read once by registry_new (read_ca_file) */
    size_t ca_len;
    long timeout_ms;
    long version;
    Entry *entries, *last; /* most recently looked up first */
    /* The entries by subject: lookups come once per row, and the cache holds up to NEGATIVE_MAX
     * subjects without a schema besides those with one. Chained, n_buckets a power of two. */
    Entry **buckets;
    size_t n_buckets, n_entries;
    uint32_t hash_seed; /* subjects come from rows: a seed of its own makes collisions unforeseen */
    Request *requests;  /* in flight, freed by registry_free if still there */
    RegistryReadyFn ready;
    void *arg;
    bool up;
    bool logged_down; /* the last state change logged was "down" */
    /* recheck_down's GET /subjects, while no row waits for a failed subject: its own backoff
     * (BACKOFF_FIRST_S doubling to BACKOFF_MAX_S, monotonic), reset when the registry is up. */
    double list_backoff_s, list_retry_at;
    /* GET /subjects answered 404 (a proxy that routes the lookups' paths alone, as the start-up
     * probe allows) or 403 (Confluent's ACL authorizer asks GLOBAL_SUBJECTS_READ for the list,
     * which a user granted SUBJECT_READ on its subjects lacks, or lost it): the next recheck asks a
     * subject the registry served instead (or, with none, the failed subject, though no row wants
     * it), and clears this. Kept, one 404 (a proxy's page while the registry restarts) sent every
     * recheck to that subject for good, and a failure of its own (a 403 for it) kept the registry
     * down while /subjects answered 200 again. */
    bool list_refused;
    int in_flight;
    double lookup_rate, lookup_burst; /* the request budget (LOOKUP_RATE, LOOKUP_BURST) */
    double tokens;                    /* requests the budget allows now, as of tokens_at */
    double tokens_at;
    double throttle_logged_at; /* monotonic; 0: never */
    unsigned long throttled;   /* lookups held back since the last line said so */
};

/* ---- curl driven by libev ----------------------------------------------------------------- */

static void finish_request(Request *q, CURLcode code);

static void check_done(Registry *r)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(r->multi, &left))) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        Request *q = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&q);
        CURLcode code = msg->data.result;
        curl_multi_remove_handle(r->multi, msg->easy_handle);
        finish_request(q, code);
    }
}

static void on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    /* The action may remove the socket, and free sw with it (socket_cb): keep r first. */
    Registry *r = ((SockWatch *)w)->r;
    log_set_context(r->log_context);
    int running;
    int action =
        (revents & EV_READ ? CURL_CSELECT_IN : 0) | (revents & EV_WRITE ? CURL_CSELECT_OUT : 0);
    curl_multi_socket_action(r->multi, w->fd, action, &running);
    check_done(r);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Registry *r = w->data;
    log_set_context(r->log_context);
    int running;
    curl_multi_socket_action(r->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    check_done(r);
}

static int socket_cb(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    Registry *r = userp;
    SockWatch *sw = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (sw) {
            ev_io_stop(r->loop, &sw->io);
            free(sw);
            curl_multi_assign(r->multi, s, NULL);
        }
        return 0;
    }
    int events = (what & CURL_POLL_IN ? EV_READ : 0) | (what & CURL_POLL_OUT ? EV_WRITE : 0);
    if (!sw) {
        sw = calloc(1, sizeof(*sw));
        if (!sw)
            return -1;
        sw->r = r;
        curl_multi_assign(r->multi, s, sw);
    } else {
        ev_io_stop(r->loop, &sw->io);
    }
    ev_io_init(&sw->io, on_io, s, events);
    ev_io_start(r->loop, &sw->io);
    return 0;
}

static int timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
    Registry *r = userp;
    ev_timer_stop(r->loop, &r->timer);
    if (timeout_ms >= 0) {
        ev_timer_set(&r->timer, (double)timeout_ms / 1000.0, 0.0);
        ev_timer_start(r->loop, &r->timer);
    }
    return 0;
}

/* ---- requests ----------------------------------------------------------------------------- */

static size_t cut_body(char *data, size_t size, size_t n, void *userp);

/* The most of a lookup's answer other than a 200 that is read: its body is read for the
 * registry's {"error_code", "message"} alone (finish_request), far smaller. */
#define ERROR_BODY_MAX (64 * 1024)

static size_t on_body(char *data, size_t size, size_t n, void *userp)
{
    Request *q = userp;
    size_t len = size * n;
    /* An error's body beyond ERROR_BODY_MAX (a gateway's page, a stack trace) is cut, the status
     * kept: read to RESPONSE_MAX, a 503 with a large page failed as "answer too large", its
     * status and its Retry-After (url_hold) lost, and each such lookup held megabytes. */
    long status = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200 && q->body.len + len > ERROR_BODY_MAX)
        return cut_body(data, size, n, &q->cut);
    if (q->body.len + len > RESPONSE_MAX) {
        q->too_large = true;
        return 0; /* curl fails the transfer (CURLE_WRITE_ERROR) */
    }
    strbuf_append(&q->body, data, len);
    return len;
}

/* The most of a 404's body read where the status alone is wanted: the registry's own "not found"
 * ({"error_code": 40401, "message": ...}) is far smaller. */
#define NOT_FOUND_BODY_MAX 4096

/* Where the status alone is wanted (userp: a bool set here): the body (GET /subjects: every
 * subject's name, megabytes in a large registry) is not read; the transfer ends at its first
 * bytes, which come after the status (curl's write error, taken for the answer). Read, the list
 * was cut at RESPONSE_MAX and the start-up probe said the registry did not answer ("Failure
 * writing output"), or it took longer than the timeout to come. */
static size_t cut_body(char *data, size_t size, size_t n, void *userp)
{
    *(bool *)userp = true;
    return 0;
}

/* GET /subjects (recheck_down) wants the status alone, as the start-up probe: cut_body. So does
 * the recheck's request for a subject the registry served, in its place, but for a 404's body (up
 * to NOT_FOUND_BODY_MAX): that subject may have been deleted since, and the registry's own "not
 * found" then says it answers (list_answered). */
static size_t on_list_body(char *data, size_t size, size_t n, void *userp)
{
    Request *q = userp;
    size_t len = size * n;
    long status = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    if (!q->list && status == 404 && q->body.len + len <= NOT_FOUND_BODY_MAX) {
        strbuf_append(&q->body, data, len);
        return len;
    }
    return cut_body(data, size, n, &q->cut);
}

/* A 3xx: lookups and the probe follow none (CURLOPT_FOLLOWLOCATION 0). */
static bool is_redirect(long status)
{
    return status >= 300 && status < 400;
}

/* Applies what every request shares: timeouts, auth, TLS, no redirects, no signals. */
static void easy_setup(Registry *r, CURL *easy, const char *url, struct curl_slist *hdrs)
{
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, r->timeout_ms);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, r->timeout_ms);
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075700
    /* The registry's host names never reach curl's resolver (UrlHost), but a proxy's from the
     * environment (http_proxy, https_proxy) does: curl 7.88 joins its lookup thread when a
     * request ends while the lookup waits for a nameserver, which stood the loop, every
     * database's, still until getaddrinfo gave up. Left to end alone, the thread frees what it
     * holds (racing with the detach in 7.88: curl PR #17320), one per request, which the lookup
     * budget bounds: the lesser harm, for a configuration the relay does not set itself. */
    curl_easy_setopt(easy, CURLOPT_QUICK_EXIT, 1L);
#endif
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, hdrs);
    if (r->userpwd) {
        curl_easy_setopt(easy, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
        curl_easy_setopt(easy, CURLOPT_USERPWD, r->userpwd);
    }
    if (r->ca_pem) {
        /* From memory: curl would reopen a path at each TLS handshake, on the loop, where a FIFO
         * swapped in after the reload's check blocks every database. Only this bundle is
         * trusted, as with CURLOPT_CAINFO: the system's file and directory are not loaded. */
        struct curl_blob blob = {.data = r->ca_pem, .len = r->ca_len, .flags = CURL_BLOB_NOCOPY};
        curl_easy_setopt(easy, CURLOPT_CAINFO_BLOB, &blob);
        curl_easy_setopt(easy, CURLOPT_CAINFO, NULL);
        curl_easy_setopt(easy, CURLOPT_CAPATH, NULL);
    }
}

static struct curl_slist *accept_headers(void)
{
    return curl_slist_append(NULL, "Accept: application/vnd.schemaregistry.v1+json, "
                                   "application/json");
}

/* The version requests ask for, as the URL path and messages write it. */
static void version_text(const Registry *r, char *buf, size_t n)
{
    if (r->version > 0)
        snprintf(buf, n, "%ld", r->version);
    else
        snprintf(buf, n, "latest");
}

/* base (one of r->urls) joined to path ("/subjects..."): the base's trailing slashes dropped, a
 * path prefix kept, as Confluent's clients join them. NULL when out of memory; the caller frees
 * it with secrets_free_zeroed (the base may hold USER:PASSWORD@). */
static char *url_join(const char *base, const char *path)
{
    size_t blen = strlen(base);
    while (blen > 0 && base[blen - 1] == '/')
        blen--;
    /* Built in one allocation of its exact size: glibc's asprintf grows the text through working
     * buffers it frees unzeroed, which left copies of USER:PASSWORD@ on the heap. */
    size_t plen = strlen(path);
    char *url = malloc(blen + plen + 1);
    if (url) {
        memcpy(url, base, blen);
        memcpy(url + blen, path, plen + 1);
    }
    return url;
}

/* The subject's URL at the current base URL, the subject percent-encoded (subjects hold dots, and
 * may hold anything). */
static char *subject_url(Registry *r, CURL *easy, const char *subject)
{
    char *escaped = curl_easy_escape(easy, subject, 0);
    if (!escaped)
        return NULL;
    char version[24];
    version_text(r, version, sizeof(version));
    char *path = NULL, *url = NULL;
    if (asprintf(&path, "/subjects/%s/versions/%s", escaped, version) >= 0) {
        url = url_join(r->urls[r->current], path);
        free(path);
    }
    curl_free(escaped);
    return url;
}

static void set_up(Registry *r, bool up, const char *why)
{
    r->up = up;
    if (up)
        r->list_backoff_s = r->list_retry_at = 0;
    if (!up && !r->logged_down) {
        char qw[400]; /* curl's text or the registry's: quoted, a '"' in it cannot end it */
        log_warn("schema registry unavailable: rows wait for it (no attempt counted)",
                 "url=%s error=%s", r->shown[r->current], log_quote(why, qw, sizeof(qw)));
        r->logged_down = true;
    } else if (up && r->logged_down) {
        log_info("schema registry available again", "url=%s", r->shown[r->current]);
        r->logged_down = false;
    }
}

static void arm_retry(Registry *r, double at);

/* The registry answered (a schema, its own "not found", the recheck's 200): up, unless every URL
 * is held by a 429's or 503's Retry-After. Such an answer was asked before the wait was (requests
 * in flight together, one shed): it tells nothing of the wait, and meanwhile no lookup can be
 * sent, so a row with a new subject waits as it would while down. Taken for "up", the registry
 * read up (/readyz 200, outbox_schema_registry_up 1, "available again" logged) or down by the
 * order two answers came in, and "unavailable" came again at the next row's lookup. Held, it
 * stays as it is, and the retry timer is armed for the hold's end: recheck_down then asks, row
 * or not. */
static void answered_up(Registry *r)
{
    double now = monotime_now(), first = 0;
    for (int i = 0; i < r->n_urls; i++) {
        if (r->held_until[i] <= now) {
            set_up(r, true, NULL);
            return;
        }
        if (first == 0 || r->held_until[i] < first)
            first = r->held_until[i];
    }
    arm_retry(r, first);
}

/* The wait a 429 Too Many Requests or a 503 asks for in its Retry-After (seconds, or an HTTP date
 * that curl turns into seconds from now), cut to RETRY_AFTER_MAX_S; 0 when there is none, or it
 * is over (a date past). */
static double retry_after_s(CURL *easy, long status)
{
    curl_off_t s = 0;
    if ((status != 429 && status != 503) ||
        curl_easy_getinfo(easy, CURLINFO_RETRY_AFTER, &s) != CURLE_OK || s <= 0)
        return 0;
    return s > RETRY_AFTER_MAX_S ? RETRY_AFTER_MAX_S : (double)s;
}

/* URL index is not asked again for wait_s from answered_at (monotonic: when the answer came;
 * wait_s is retry_after_s of an answer of status): the registry, or its gateway, sheds load, and
 * the relay's own backoff (1 s, then 2 s) would ask sooner than it said. */
static void url_hold(Registry *r, int index, double answered_at, double wait_s, long status)
{
    double until = answered_at + wait_s;
    if (wait_s > 0 && until > r->held_until[index]) {
        r->held_until[index] = until;
        r->held_status[index] = status;
    }
}

/* Whether a request may go now: 0 when the current URL is not held (url_hold), or another is not
 * (it becomes the current one, as after a failure); else the time (monotonic) the first held
 * URL may be asked again, for which the retry timer is armed: the caller sends nothing. */
static double url_held(Registry *r, double now)
{
    double first = 0;
    for (int k = 0; k < r->n_urls; k++) {
        int i = (r->current + k) % r->n_urls;
        if (r->held_until[i] <= now) {
            r->current = i;
            return 0;
        }
        if (first == 0 || r->held_until[i] < first)
            first = r->held_until[i];
    }
    arm_retry(r, first);
    return first;
}

/* url_index: the URL the failed request went to. Requests fail together when a URL hangs, and
 * each moving r->current on would move it past the next URL and back: only the first moves it.
 * The retry timer is armed for e even when no row asks for it again: on_retry then asks for it
 * itself while the registry is down, so that it comes back up once the registry answers. */
static void entry_failed(Registry *r, Entry *e, int url_index, const char *why)
{
    e->state = ENTRY_FAILED;
    e->backoff_s = e->backoff_s <= 0 ? BACKOFF_FIRST_S : e->backoff_s * 2;
    if (e->backoff_s > BACKOFF_MAX_S)
        e->backoff_s = BACKOFF_MAX_S;
    e->failed_at = monotime_now();
    e->retry_at = e->failed_at + e->backoff_s;
    arm_retry(r, e->retry_at);
    set_up(r, false, why);
    if (r->n_urls > 1 && r->current == url_index)
        r->current = (r->current + 1) % r->n_urls;
}

static RegistrySchemaType schema_type(const char *name)
{
    if (name && strcmp(name, "JSON") == 0)
        return REGISTRY_JSON;
    if (name && strcmp(name, "PROTOBUF") == 0)
        return REGISTRY_PROTOBUF;
    return REGISTRY_AVRO; /* the registry leaves schemaType out for Avro */
}

/* Fills e from a 200 answer: {"subject", "version", "id", "schema", "schemaType"?}. */
static bool entry_fill(Entry *e, const char *body, char *why, size_t whylen)
{
    json_error_t jerr;
    json_t *root = json_loads(body, 0, &jerr);
    json_t *id = json_object_get(root, "id"), *version = json_object_get(root, "version"),
           *schema = json_object_get(root, "schema"), *type = json_object_get(root, "schemaType");
    /* The wire format has 4 bytes for the id: one beyond them (or negative) would be sent as
     * another schema's. */
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > INT32_MAX ||
        !json_is_string(schema) || (type && !json_is_string(type))) {
        snprintf(why, whylen, "the registry's answer is not a schema");
        json_decref(root);
        return false;
    }
    free(e->schema_text);
    e->schema_text = strdup(json_string_value(schema));
    e->schema.id = (int)json_integer_value(id);
    e->schema.version = json_is_integer(version) ? (int)json_integer_value(version) : 0;
    e->schema.type = schema_type(type ? json_string_value(type) : NULL);
    e->schema.subject = e->subject;
    e->schema.text = e->schema_text;
    json_decref(root);
    return e->schema_text != NULL;
}

/* Takes e out of the cache's list (not out of its hash bucket). */
static void entry_unlink(Registry *r, Entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        r->entries = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        r->last = e->prev;
    e->prev = e->next = NULL;
}

/* Puts e, which is in no list, at the front of the cache's list: the most recently looked up. */
static void entry_push_front(Registry *r, Entry *e)
{
    e->prev = NULL;
    e->next = r->entries;
    if (r->entries)
        r->entries->prev = e;
    else
        r->last = e;
    r->entries = e;
}

/* Unlinks e from the cache (its list and its bucket) and frees it. */
static void entry_drop(Registry *r, Entry *e)
{
    for (Entry **p = &r->buckets[e->hash & (r->n_buckets - 1)]; *p; p = &(*p)->hnext)
        if (*p == e) {
            *p = e->hnext;
            break;
        }
    entry_unlink(r, e);
    r->n_entries--;
    free(e->subject);
    free(e->schema_text);
    free(e->missing_why);
    free(e);
}

/* Drops the least recently looked up entries without a schema (MISSING, FAILED) beyond
 * NEGATIVE_MAX. An entry in flight has a request pointing at it and an OK one may be in use:
 * neither is touched. */
static void trim_negative(Registry *r)
{
    size_t negative = 0;
    for (Entry *e = r->entries; e; e = e->next)
        negative += e->state == ENTRY_MISSING || e->state == ENTRY_FAILED;
    for (Entry *e = r->last, *prev; e && negative > NEGATIVE_MAX; e = prev) {
        prev = e->prev;
        if (e->state == ENTRY_MISSING || e->state == ENTRY_FAILED) {
            entry_drop(r, e);
            negative--;
        }
    }
}

/* The registry's error body ({"error_code": 40401, "message": "Subject 'x' not found."}, as
 * Confluent's registry and those compatible with it answer), len bytes (NULL: none): its code in
 * *code (0: none) and its message in msg (cut to msglen). Returns whether it has a message. */
static bool registry_error(const char *body, size_t len, json_int_t *code, char *msg, size_t msglen)
{
    json_t *root = body ? json_loadb(body, len, 0, NULL) : NULL;
    const char *said = json_string_value(json_object_get(root, "message"));
    *code = json_integer_value(json_object_get(root, "error_code"));
    if (msg && msglen > 0)
        snprintf(msg, msglen, "%s", said ? said : "");
    json_decref(root);
    return said != NULL;
}

/* Whether a registry's error_code is its own "not found" (40401 subject, 40402 version, ...). */
static bool not_found_code(json_int_t code)
{
    return code >= 40400 && code <= 40499;
}

bool registry_not_found(const char *body, size_t len)
{
    json_int_t code;
    (void)registry_error(body, len, &code, NULL, 0);
    return not_found_code(code);
}

/* The answer to recheck_down's GET /subjects, or to its request for a subject the registry served
 * (its status alone, as for the list): a 200 is the registry answering (up), and so is the
 * registry's own "not found" for that subject (deleted since it was served: taken for no answer,
 * where /subjects is refused the recheck went /subjects, the subject, /subjects... and the
 * registry stayed down for good); anything else leaves it down, asked again after the list's own
 * backoff (and on the next URL, as a lookup's failure moves it on). The failure was logged when
 * the registry went down: nothing is logged. The served subject's schema is kept: the cache
 * holds a schema for the life of the process, as a deleted subject's rows were encoded with it. */
static void list_answered(Registry *r, const Request *q, CURLcode code, long status)
{
    bool answered = code == CURLE_OK || (code == CURLE_WRITE_ERROR && q->cut);
    if (answered && (status == 200 ||
                     (status == 404 && !q->list && registry_not_found(q->body.s, q->body.len)))) {
        answered_up(r);
        return;
    }
    if (answered && (status == 404 || status == 403) && q->list)
        r->list_refused = true;
    if (answered)
        url_hold(r, q->url_index, monotime_now(), retry_after_s(q->easy, status), status);
    r->list_backoff_s = r->list_backoff_s <= 0 ? BACKOFF_FIRST_S : r->list_backoff_s * 2;
    if (r->list_backoff_s > BACKOFF_MAX_S)
        r->list_backoff_s = BACKOFF_MAX_S;
    r->list_retry_at = monotime_now() + r->list_backoff_s;
    arm_retry(r, r->list_retry_at);
    if (r->n_urls > 1 && r->current == q->url_index)
        r->current = (r->current + 1) % r->n_urls;
}

/* The registry's own "not found" for e's subject ({"error_code": 40401, "message": "Subject 'x'
 * not found."}; msg its message, NULL: none): the registry is up, the subject missing, asked
 * again after MISSING_RETRY_S. */
static void entry_missing(Registry *r, Entry *e, const char *msg)
{
    /* A pinned version the subject lacks answers "Version not found." alone: say which. */
    char version[24], why[300];
    version_text(r, version, sizeof(version));
    /* The subject (up to 599 characters) and the registry's message (which may quote it) cut,
     * so that the version, the part a pinned --schema-version makes the answer, fits the 300
     * bytes: whole, a long subject pushed it out of the row's error. */
    snprintf(why, sizeof(why), "schema registry: %.100s (subject %.120s%s, version %s)",
             msg ? msg : "subject not found", e->subject, strlen(e->subject) > 120 ? "..." : "",
             version);
    free(e->missing_why);
    e->missing_why = strdup(why);
    e->state = ENTRY_MISSING;
    e->retry_at = monotime_now() + MISSING_RETRY_S;
    answered_up(r);
}

static void finish_request(Request *q, CURLcode code)
{
    Registry *r = q->r;
    Entry *e = q->entry;
    long status = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    char why[300] = "";
    if (!e) {
        list_answered(r, q, code, status);
    } else if (code != CURLE_OK && !(code == CURLE_WRITE_ERROR && q->cut)) {
        snprintf(why, sizeof(why), "%s",
                 q->too_large ? "answer too large"
                 : *q->errbuf ? q->errbuf
                              : curl_easy_strerror(code));
        entry_failed(r, e, q->url_index, why);
    } else if (status == 200) {
        strbuf_append(&q->body, "", 1); /* NUL-terminated */
        if (entry_fill(e, q->body.s, why, sizeof(why))) {
            e->state = ENTRY_OK;
            e->backoff_s = 0;
            answered_up(r);
            /* The subject comes from a row: quoted, it cannot forge fields. */
            char qs[160];
            log_info("schema found", "subject=%s id=%d version=%d",
                     log_quote(e->subject, qs, sizeof(qs)), e->schema.id, e->schema.version);
        } else {
            entry_failed(r, e, q->url_index, why);
        }
    } else if (status == 404) {
        json_int_t said_code;
        char msg[128];
        bool has_msg = registry_error(q->body.s, q->body.len, &said_code, msg, sizeof(msg));
        if (not_found_code(said_code)) {
            entry_missing(r, e, has_msg ? msg : NULL);
        } else {
            /* A 404 that is not the registry's (a proxy's page, a base URL with a wrong path)
             * says nothing of the subject: every row would count an attempt against a subject
             * that may well be registered. It is the registry's failure, as a 5xx. */
            snprintf(why, sizeof(why),
                     "HTTP 404 without a Schema Registry error (check --schema-registry-url)");
            entry_failed(r, e, q->url_index, why);
        }
    } else {
        /* The registry says why in its body ({"error_code": 40301, "message": "User is denied
         * operation Read on Subject: orders-value"}, a 5xx's "Error while forwarding the request
         * to the leader"): "HTTP 403 (check --schema-registry-auth-file)" alone sent the operator
         * to credentials that were right. Cut, so the hint fits; quoted where it is logged. */
        json_int_t said_code;
        char msg[128], said[200] = "";
        bool has_msg = registry_error(q->body.s, q->body.len, &said_code, msg, sizeof(msg));
        if (has_msg && said_code)
            snprintf(said, sizeof(said), ": %.120s (error_code %lld)", msg, (long long)said_code);
        else if (has_msg)
            snprintf(said, sizeof(said), ": %.120s", msg);
        double wait_s = retry_after_s(q->easy, status);
        char asked[48] = "";
        if (wait_s > 0) {
            url_hold(r, q->url_index, monotime_now(), wait_s, status);
            snprintf(asked, sizeof(asked), " (Retry-After: %.0f s)", wait_s);
        }
        snprintf(why, sizeof(why), "HTTP %ld%s%s%s", status, said, asked,
                 status == 401 ? " (check --schema-registry-auth-file)"
                 : status == 403
                     ? " (check --schema-registry-auth-file and that user's access to the subject)"
                 : is_redirect(status) ? " (a redirect, not followed: check --schema-registry-url)"
                                       : "");
        entry_failed(r, e, q->url_index, why);
    }
    r->in_flight--;
    for (Request **p = &r->requests; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            break;
        }
    ev_timer_stop(r->loop, &q->wait);
    curl_easy_cleanup(q->easy);
    curl_slist_free_all(q->resolve);
    strbuf_free(&q->body);
    free(q);
    trim_negative(r);
    if (r->ready)
        r->ready(r->arg);
}

/* ---- the URLs' host names (UrlHost) -------------------------------------------------------- */

/* Whether curl may send the requests through a proxy the environment names: it then connects to
 * the proxy, whose name it looks up itself, and the registry's name may resolve only there. */
static bool proxy_in_env(void)
{
    static const char *const vars[] = {"http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy",
                                       "ALL_PROXY"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return true;
    }
    return false;
}

/* Fills h from url: the port (the URL's, or its scheme's), and the host's name when it needs a
 * lookup: not a numeric address (an IPv6 one comes in brackets) nor localhost, which curl answers
 * itself without a thread, and no proxy in the environment (proxy_in_env: curl looks names up as
 * it did). A URL curl cannot parse keeps no name: curl refuses it at once. */
static void host_parse(UrlHost *h, const char *url)
{
    if (proxy_in_env())
        return;
    CURLU *u = curl_url();
    char *host = NULL, *port = NULL;
    if (u &&
        curl_url_set(u, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME) ==
            CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        size_t n = strlen(host);
        bool local = strcasecmp(host, "localhost") == 0 ||
                     (n > 10 && strcasecmp(host + n - 10, ".localhost") == 0);
        h->port = strtol(port, NULL, 10);
        if (host[0] != '[' && !local && resolve_needed(host))
            h->name = strdup(host); /* out of memory: curl looks it up, as it did */
    }
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
}

/* Keeps the addresses a lookup of h's name found (addrs: numeric, comma-separated) as the entry
 * curl is handed. An IPv6 address goes in brackets; one with a zone id ("fe80::1%eth0") is left
 * out, as curl refuses the whole entry for it. False when none is left, or out of memory. */
static bool host_keep(UrlHost *h, const char *addrs)
{
    size_t n = strlen(h->name) + 32 + strlen(addrs) + 2 * RESOLVE_MAX_ADDRS;
    char *entry = malloc(n);
    if (!entry)
        return false;
    size_t len = (size_t)snprintf(entry, n, "%s:%ld:", h->name, h->port), head = len;
    for (const char *p = addrs; *p; p += *p == ',') {
        size_t alen = strcspn(p, ",");
        bool v6 = memchr(p, ':', alen) != NULL;
        if (!memchr(p, '%', alen))
            len += (size_t)snprintf(entry + len, n - len, "%s%s%.*s%s", len > head ? "," : "",
                                    v6 ? "[" : "", (int)alen, p, v6 ? "]" : "");
        p += alen;
    }
    if (len == head) {
        free(entry);
        return false;
    }
    free(h->entry);
    h->entry = entry;
    h->answered_at = monotime_now();
    return true;
}

/* Hands q's transfer to curl: for a URL with a name, with its addresses (h->entry) and what is
 * left of its timeout after the wait for them. */
static bool request_send(Registry *r, Request *q)
{
    const UrlHost *h = &r->hosts[q->url_index];
    if (h->name) {
        curl_slist_free_all(q->resolve);
        q->resolve = curl_slist_append(NULL, h->entry);
        if (!q->resolve)
            return false;
        long left = r->timeout_ms - (long)((monotime_now() - q->started) * 1000.0);
        left = left < 1 ? 1 : left;
        curl_easy_setopt(q->easy, CURLOPT_RESOLVE, q->resolve);
        curl_easy_setopt(q->easy, CURLOPT_TIMEOUT_MS, left);
        curl_easy_setopt(q->easy, CURLOPT_CONNECTTIMEOUT_MS, left);
    }
    return curl_multi_add_handle(r->multi, q->easy) == CURLM_OK;
}

/* Whether a request other than skip waits for URL index's host. */
static bool host_waited(const Registry *r, int index, const Request *skip)
{
    for (const Request *q = r->requests; q; q = q->next)
        if (q != skip && q->waiting && q->url_index == index)
            return true;
    return false;
}

/* The end of a lookup of h's name: each request that waited for it is sent, or fails as curl's
 * own failed lookup did. Finishing one calls the ready callback, which may start requests (sent
 * at once with this answer, or waiting for a lookup of their own): those that waited for this one
 * are marked first. */
static void on_host_resolved(void *arg, const char *addrs, int n, const char *error)
{
    UrlHost *h = arg;
    Registry *r = h->r;
    h->resolving = NULL; /* gone after this call */
    log_set_context(r->log_context);
    bool ok = n > 0 && host_keep(h, addrs);
    for (Request *q = r->requests; q; q = q->next)
        q->due = q->waiting && q->url_index == h->index;
    for (;;) {
        Request *q = r->requests;
        while (q && !q->due)
            q = q->next;
        if (!q)
            break;
        q->due = q->waiting = false;
        ev_timer_stop(r->loop, &q->wait);
        if (ok && request_send(r, q))
            continue;
        snprintf(q->errbuf, sizeof(q->errbuf), "Could not resolve host: %s (%s)", h->name,
                 n == 0 ? error
                 : ok   ? "out of memory"
                        : "no address curl can use");
        finish_request(q, CURLE_COULDNT_RESOLVE_HOST);
    }
}

/* A request's timeout came while it waited for its host's lookup: it fails as curl's own
 * lookup's timeout did, and the lookup is given up when no other request waits for it (it runs
 * on in resolve.h, which keeps a late answer for the next request). */
static void on_wait(struct ev_loop *loop, ev_timer *w, int revents)
{
    Request *q = w->data;
    Registry *r = q->r;
    UrlHost *h = &r->hosts[q->url_index];
    log_set_context(r->log_context);
    q->waiting = false;
    if (!host_waited(r, q->url_index, q)) {
        resolve_cancel(h->resolving);
        h->resolving = NULL;
    }
    snprintf(q->errbuf, sizeof(q->errbuf),
             "Could not resolve host: %s (no answer within %ld ms, --schema-registry-timeout)",
             h->name, r->timeout_ms);
    finish_request(q, CURLE_OPERATION_TIMEDOUT);
}

/* Sends the request for e's subject; e NULL: for the status alone, the request for the subject
 * status_of (a copy of the string is not kept), or GET /subjects when that is NULL too. */
static bool start_request(Registry *r, Entry *e, const char *status_of)
{
    Request *q = calloc(1, sizeof(*q));
    CURL *easy = q ? curl_easy_init() : NULL;
    char *url = !easy       ? NULL
                : e         ? subject_url(r, easy, e->subject)
                : status_of ? subject_url(r, easy, status_of)
                            : url_join(r->urls[r->current], "/subjects");
    if (!url) {
        if (easy)
            curl_easy_cleanup(easy);
        free(q);
        return false;
    }
    static struct curl_slist *hdrs;
    if (!hdrs)
        hdrs = accept_headers();
    q->r = r;
    q->entry = e;
    q->list = !e && !status_of;
    q->easy = easy;
    q->url_index = r->current; /* subject_url used it */
    easy_setup(r, easy, url, hdrs);
    secrets_free_zeroed(url); /* curl copies CURLOPT_URL; it may hold USER:PASSWORD@ */
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, e ? on_body : on_list_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, q->errbuf);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, q);
    q->started = monotime_now();
    ev_timer_init(&q->wait, on_wait, (double)r->timeout_ms / 1000.0, 0.0);
    q->wait.data = q;
    UrlHost *h = &r->hosts[q->url_index];
    if (!h->name || (h->entry && q->started - h->answered_at < HOST_TTL_S)) {
        if (!request_send(r, q)) {
            curl_easy_cleanup(easy);
            curl_slist_free_all(q->resolve);
            free(q);
            return false;
        }
    } else {
        char why[300];
        if (!h->resolving)
            h->resolving = resolve_start(r->loop, h->name, on_host_resolved, h, why, sizeof(why));
        if (!h->resolving) {
            curl_easy_cleanup(easy);
            free(q);
            set_up(r, false, why); /* too many names hanging, or no thread: one line */
            return false;
        }
        q->waiting = true;
        ev_timer_start(r->loop, &q->wait);
    }
    if (e)
        e->state = ENTRY_FETCHING;
    r->in_flight++;
    q->next = r->requests;
    r->requests = q;
    return true;
}

static bool budget_take(Registry *r, const char *subject, double now);

/* While the registry is down, and no request is out to tell, it is asked again here, whether or
 * not a row still needs a schema. "Down" was left to the lookups rows make: when the rows that met
 * the failure went away (deleted, their lanes taken by another relay) and every other subject was
 * cached, no lookup came, and /readyz said 503 "schema registry unavailable" and
 * outbox_schema_registry_up 0 for good while every row was delivered. What is asked: the failed
 * subject due first among those a row looked up since they failed (each failure's ready callback
 * wakes the sessions waiting, which look their subject up again), at its backoff; when no row
 * wants any, GET /subjects, as the start-up probe, at a backoff of its own. Once in its place
 * after each 404 or 403 on /subjects (a proxy may route the lookups' paths alone, or answer so
 * for a moment; a user may read its subjects but not list them): for its status alone, a subject
 * the registry served, else the failed subject. Asking a subject no row wants would keep the
 * registry down for good when the failure was that subject's alone (a 403 for a subject the user
 * may not read, a schema over RESPONSE_MAX) and its rows were deleted. One request at a time, at
 * most one per BACKOFF_MAX_S once the backoff is full, and within the lookup budget. */
static void recheck_down(Registry *r)
{
    if (r->up || r->in_flight > 0)
        return;
    Entry *due = NULL, *first = NULL, *served = NULL;
    for (Entry *e = r->entries; e; e = e->next) {
        if (e->state == ENTRY_OK && !served)
            served = e; /* the most recently looked up */
        if (e->state != ENTRY_FAILED)
            continue;
        if (!first || e->retry_at < first->retry_at)
            first = e;
        if (e->wanted_at >= e->failed_at && (!due || e->retry_at < due->retry_at))
            due = e;
    }
    /* Down with no failed subject (a lookup held by the start-up probe's Retry-After sent
     * nothing): GET /subjects, as when no row wants a failed one; returning here kept the
     * registry down for good once no row asked again.
     * GET /subjects is no registry's path here, or not the user's, or was not a moment ago. A
     * subject the registry served tells as well whether it answers; the failed one, with no row
     * wanting it, may be refused alone for good (a 403 for it). */
    bool instead = !due && r->list_refused;
    const char *status_of = instead && served ? served->subject : NULL;
    if (instead && !served)
        due = first;
    double now = monotime_now();
    double at = due                                           ? due->retry_at
                : first && first->retry_at > r->list_retry_at ? first->retry_at
                                                              : r->list_retry_at;
    if (now < at) {
        arm_retry(r, at); /* the timer came a little early (ev_now lags) */
        return;
    }
    if (url_held(r, now) > 0)
        return; /* the retry timer is armed for when a URL may be asked */
    if (!budget_take(r, due ? due->subject : first ? first->subject : "/subjects", now))
        return; /* the retry timer is armed for when the budget allows one */
    if (start_request(r, due, status_of)) {
        if (instead)
            r->list_refused = false; /* /subjects again next time */
    } else {
        if (due)
            due->retry_at = now + BACKOFF_FIRST_S;
        else
            r->list_retry_at = now + BACKOFF_FIRST_S;
        arm_retry(r, now + BACKOFF_FIRST_S);
    }
}

/* A waiter whose entry is in backoff must hear when it may ask again: the registry's timer
 * (each database of a --databases list has a registry of its own, which SIGHUP may remove) fires
 * at the earliest retry time and calls the ready callback. */
static void on_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    Registry *r = w->data;
    log_set_context(r->log_context);
    recheck_down(r);
    if (r->ready)
        r->ready(r->arg);
}

static void arm_retry(Registry *r, double at)
{
    double in = at - monotime_now();
    if (in < 0.01)
        in = 0.01;
    if (ev_is_active(&r->retry_timer) && ev_timer_remaining(r->loop, &r->retry_timer) <= in)
        return;
    ev_timer_stop(r->loop, &r->retry_timer);
    ev_timer_set(&r->retry_timer, in, 0.0);
    ev_timer_start(r->loop, &r->retry_timer);
}

/* Takes one request from the budget, refilled at lookup_rate up to lookup_burst. False when
 * there is none: the ready callback then comes when there is (the retry timer), and one line at
 * most every THROTTLE_LOG_S says how many lookups were held back. */
static bool budget_take(Registry *r, const char *subject, double now)
{
    r->tokens += (now - r->tokens_at) * r->lookup_rate;
    if (r->tokens > r->lookup_burst)
        r->tokens = r->lookup_burst;
    r->tokens_at = now;
    if (r->tokens >= 1.0) {
        r->tokens -= 1.0;
        return true;
    }
    r->throttled++;
    if (r->throttle_logged_at == 0 || now - r->throttle_logged_at >= THROTTLE_LOG_S) {
        char q[160]; /* the subject comes from a row: quoted, it cannot forge fields */
        log_warn("schema registry lookups held back: too many subjects without a schema",
                 "subject=%s held=%lu rate=%g/s", log_quote(subject, q, sizeof(q)), r->throttled,
                 r->lookup_rate);
        r->throttle_logged_at = now;
        r->throttled = 0;
    }
    arm_retry(r, now + (1.0 - r->tokens) / r->lookup_rate);
    return false;
}

/* ---- public ------------------------------------------------------------------------------- */

/* url with its password masked (a URL without a scheme is curl's http://); NULL when out of
 * memory. */
static char *shown_url(const char *url)
{
    bool bare = !strstr(url, "://");
    const char *scheme = bare ? "http://" : "";
    /* One exact allocation, not asprintf: see url_join. */
    char *with_scheme = malloc(strlen(scheme) + strlen(url) + 1);
    if (!with_scheme)
        return NULL;
    strcpy(with_scheme, scheme);
    strcat(with_scheme, url);
    /* Masking turns each password into "***": at most 3 bytes more each, and each takes more
     * than 3 bytes of the text ("password=" or the userinfo's ':' and '@'). */
    size_t n = 2 * strlen(with_scheme) + 16;
    char *out = malloc(n);
    if (out) {
        log_mask_conninfo(with_scheme, out, n);
        /* Out of memory, the masker writes "***" alone. */
        if (bare && strncmp(out, "http://", strlen("http://")) == 0)
            memmove(out, out + strlen("http://"), strlen(out + strlen("http://")) + 1);
    }
    explicit_bzero(with_scheme, strlen(with_scheme));
    free(with_scheme);
    return out;
}

/* Opens a file the registry reads (optval_open_file): on the running loop (a database a SIGHUP
 * adds: ev_depth > 0) only a regular file, without waiting, as the reload's own reading of the
 * configuration (config.c, open_input); the configuration's check saw a regular file, but the
 * path is opened again here. Before the loop runs, anything readable but a directory. */
static int open_read(Registry *r, const char *option, const char *path, char *err, size_t errlen)
{
    return optval_open_file(option, path, ev_depth(r->loop) > 0, err, errlen);
}

/* Reads the CA bundle at path into r->ca_pem, once: curl is handed it from memory, so nothing
 * opens the file on the loop again. At most CONFIG_CA_FILE_MAX bytes are read, and the copy kept
 * is the file's size, so memory stays bounded. Returns false with one line in err. */
static bool read_ca_file(Registry *r, const char *path, char *err, size_t errlen)
{
    int fd = open_read(r, "schema-registry-ca-file", path, err, errlen);
    if (fd < 0)
        return false;
    const char *why = NULL;
    char *buf = malloc(CONFIG_CA_FILE_MAX + 1);
    size_t len = 0;
    if (!buf)
        why = "out of memory";
    while (!why) {
        ssize_t n = read(fd, buf + len, CONFIG_CA_FILE_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            why = strerror(errno);
        else if (n == 0)
            break;
        else if ((len += (size_t)n) > CONFIG_CA_FILE_MAX)
            why = "larger than " CONFIG_CA_FILE_MAX_TEXT;
    }
    close(fd);
    if (!why && len == 0)
        why = "empty";
    if (why) {
        snprintf(err, errlen, "schema-registry-ca-file %s: %s", path, why);
        free(buf);
        return false;
    }
    char *fit = realloc(buf, len);
    r->ca_pem = fit ? fit : buf;
    r->ca_len = len;
    return true;
}

/* Reads the auth file (opened as open_read says). */
static bool read_auth_file(Registry *r, const char *path, char *err, size_t errlen)
{
    int fd = open_read(r, "schema-registry-auth-file", path, err, errlen);
    if (fd < 0)
        return false;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        snprintf(err, errlen, "schema-registry-auth-file %s: %s", path, strerror(errno));
        close(fd);
        return false;
    }
    /* stdio reads the file into its buffer, which fclose would free unzeroed (the password in
     * it): this one is on the stack, zeroed once the file is closed. */
    char buffer[BUFSIZ];
    setvbuf(f, buffer, _IOFBF, sizeof(buffer));
    /* The first line ends at a CR or an LF, and holds at most CONFIG_AUTH_LINE_MAX - 2 bytes: the
     * configuration's check (config.c, registry_files_check) reads it by the same rule. The
     * buffer has room for that, a CR, an LF and the NUL; a longer line fills it. */
    char line[CONFIG_AUTH_LINE_MAX + 1];
    bool got = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    explicit_bzero(buffer, sizeof(buffer));
    size_t n = got ? strcspn(line, "\r\n") : 0;
    if (n > CONFIG_AUTH_LINE_MAX - 2)
        got = false;
    line[n] = '\0';
    char *colon = strchr(line, ':');
    if (!got || !colon || colon == line) {
        explicit_bzero(line, sizeof(line));
        snprintf(err, errlen,
                 "schema-registry-auth-file %s: expected USER:PASSWORD on one line of at most %d "
                 "bytes",
                 path, CONFIG_AUTH_LINE_MAX - 2);
        return false;
    }
    if (colon[1])
        secrets_add(colon + 1);
    r->userpwd = strdup(line);
    explicit_bzero(line, sizeof(line));
    return r->userpwd != NULL;
}

Registry *registry_new(struct ev_loop *loop, const RegistryOptions *o, RegistryReadyFn ready,
                       void *arg, char *err, size_t errlen)
{
    static bool curl_ready;
    if (!curl_ready && curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(err, errlen, "cannot initialise libcurl");
        return NULL;
    }
    curl_ready = true;
    Registry *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->loop = loop;
    r->log_context = log_context();
    r->ready = ready;
    r->arg = arg;
    r->up = true;
    r->timeout_ms = o->timeout_ms;
    r->version = o->version;
    r->lookup_rate = o->lookup_rate > 0 ? o->lookup_rate : LOOKUP_RATE;
    r->lookup_burst = o->lookup_burst >= 1 ? o->lookup_burst : LOOKUP_BURST;
    r->tokens = r->lookup_burst;
    r->tokens_at = monotime_now();
    r->n_buckets = 64;
    r->buckets = calloc(r->n_buckets, sizeof(*r->buckets));
    if (!r->buckets) {
        snprintf(err, errlen, "out of memory");
        free(r);
        return NULL;
    }
    r->hash_seed = (uint32_t)((uintptr_t)r >> 4) ^ (uint32_t)(uint64_t)(r->tokens_at * 1e9);
    char *copy = strdup(o->urls ? o->urls : "");
    size_t copy_len = copy ? strlen(copy) : 0; /* strtok_r cuts it: zeroed to this length */
    char *save = NULL;
    int given = 0;
    for (char *u = copy ? strtok_r(copy, ",", &save) : NULL; u; u = strtok_r(NULL, ",", &save)) {
        while (*u == ' ')
            u++;
        if (*u && given++ < MAX_URLS) {
            r->shown[r->n_urls] = shown_url(u);
            r->urls[r->n_urls++] = strdup(u);
            /* Requests append /subjects/... to the URL as written (a path prefix and trailing
             * slashes are kept, as Confluent's clients join them): after a query or a fragment
             * that text would land in the query (?tenant=a/subjects/...) and every lookup fail
             * as a 404. Confluent's clients do not take one either: refused here, in one line. */
            if (strpbrk(u, "?#") && r->shown[r->n_urls - 1]) {
                /* Named without its query, which may hold a key the masking does not know. */
                const char *shown = r->shown[r->n_urls - 1];
                snprintf(err, errlen,
                         "schema-registry-url %.*s: a query or fragment ('?', '#') is not "
                         "supported: give the registry's base URL (a path prefix is fine)",
                         (int)strcspn(shown, "?#"), shown);
                explicit_bzero(copy, copy_len);
                free(copy);
                registry_free(r, NULL);
                return NULL;
            }
        }
    }
    if (copy)
        explicit_bzero(copy, copy_len); /* USER:PASSWORD@ perhaps */
    free(copy);
    if (given > MAX_URLS) {
        snprintf(err, errlen, "schema-registry-url: at most %d URLs, %d given", MAX_URLS, given);
        registry_free(r, NULL);
        return NULL;
    }
    for (int i = 0; i < r->n_urls; i++) {
        if (!r->urls[i] || !r->shown[i]) {
            snprintf(err, errlen, "out of memory");
            registry_free(r, NULL);
            return NULL;
        }
    }
    if (r->n_urls == 0) {
        snprintf(err, errlen, "schema-registry-url: no URL given");
        registry_free(r, NULL);
        return NULL;
    }
    for (int i = 0; i < r->n_urls; i++) {
        r->hosts[i].r = r;
        r->hosts[i].index = i;
        host_parse(&r->hosts[i], r->urls[i]);
    }
    if ((o->auth_file && !read_auth_file(r, o->auth_file, err, errlen)) ||
        (o->ca_file &&
         (!read_ca_file(r, o->ca_file, err, errlen) || !(r->ca_file = strdup(o->ca_file))))) {
        registry_free(r, NULL);
        return NULL;
    }
    r->multi = curl_multi_init();
    if (!r->multi) {
        snprintf(err, errlen, "cannot initialise libcurl's multi interface");
        registry_free(r, NULL);
        return NULL;
    }
    curl_multi_setopt(r->multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
    curl_multi_setopt(r->multi, CURLMOPT_SOCKETDATA, r);
    curl_multi_setopt(r->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
    curl_multi_setopt(r->multi, CURLMOPT_TIMERDATA, r);
    ev_init(&r->timer, on_timer);
    r->timer.data = r;
    ev_init(&r->retry_timer, on_retry);
    r->retry_timer.data = r;
    return r;
}

void registry_free(Registry *r, void (*free_parsed)(void *))
{
    if (!r)
        return;
    if (r->multi) {
        for (Request *q = r->requests, *next; q; q = next) {
            next = q->next;
            if (!q->waiting)
                curl_multi_remove_handle(r->multi, q->easy);
            ev_timer_stop(r->loop, &q->wait);
            curl_easy_cleanup(q->easy);
            curl_slist_free_all(q->resolve);
            strbuf_free(&q->body);
            free(q);
        }
        curl_multi_cleanup(r->multi);
    }
    for (int i = 0; i < r->n_urls; i++) {
        resolve_cancel(r->hosts[i].resolving); /* its thread runs on alone (resolve.h) */
        free(r->hosts[i].name);
        free(r->hosts[i].entry);
    }
    ev_timer_stop(r->loop, &r->timer);
    ev_timer_stop(r->loop, &r->retry_timer);
    for (Entry *e = r->entries, *next; e; e = next) {
        next = e->next;
        if (free_parsed && e->schema.parsed)
            free_parsed(e->schema.parsed);
        free(e->subject);
        free(e->schema_text);
        free(e->missing_why);
        free(e);
    }
    free(r->buckets);
    for (int i = 0; i < r->n_urls; i++) {
        secrets_free_zeroed(r->urls[i]); /* USER:PASSWORD@ perhaps */
        free(r->shown[i]);
    }
    if (r->userpwd)
        explicit_bzero(r->userpwd, strlen(r->userpwd));
    free(r->userpwd);
    free(r->ca_file);
    free(r->ca_pem);
    free(r);
}

/* FNV-1a, from the registry's seed. */
static uint32_t subject_hash(const Registry *r, const char *subject)
{
    uint32_t h = 2166136261u ^ r->hash_seed;
    for (const unsigned char *p = (const unsigned char *)subject; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

/* subject's entry, made the most recently looked up; NULL when the cache has none. */
static Entry *entry_find(Registry *r, const char *subject)
{
    uint32_t h = subject_hash(r, subject);
    Entry *e = r->buckets[h & (r->n_buckets - 1)];
    while (e && (e->hash != h || strcmp(e->subject, subject) != 0))
        e = e->hnext;
    if (e && e != r->entries) {
        entry_unlink(r, e);
        entry_push_front(r, e);
    }
    return e;
}

static Entry *entry_add(Registry *r, const char *subject)
{
    /* At most two entries a bucket on average: twice the buckets beyond that. Out of memory,
     * the chains only grow longer. */
    if (r->n_entries >= 2 * r->n_buckets) {
        size_t n = 2 * r->n_buckets;
        Entry **b = calloc(n, sizeof(*b));
        if (b) {
            for (Entry *e = r->entries; e; e = e->next) {
                e->hnext = b[e->hash & (n - 1)];
                b[e->hash & (n - 1)] = e;
            }
            free(r->buckets);
            r->buckets = b;
            r->n_buckets = n;
        }
    }
    Entry *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->subject = strdup(subject);
    if (!e->subject) {
        free(e);
        return NULL;
    }
    e->hash = subject_hash(r, subject);
    e->hnext = r->buckets[e->hash & (r->n_buckets - 1)];
    r->buckets[e->hash & (r->n_buckets - 1)] = e;
    entry_push_front(r, e);
    r->n_entries++;
    return e;
}

bool registry_knows(const Registry *r, const char *subject)
{
    uint32_t h = subject_hash(r, subject);
    for (const Entry *e = r->buckets[h & (r->n_buckets - 1)]; e; e = e->hnext)
        if (e->hash == h && strcmp(e->subject, subject) == 0)
            return true;
    return false;
}

RegistryStatus registry_lookup(Registry *r, const char *subject, const RegistrySchema **schema,
                               char *err, size_t errlen)
{
    double now = monotime_now();
    Entry *e = entry_find(r, subject);
    if (e)
        e->wanted_at = now; /* a row wants it: recheck_down asks for it while down */
    /* A lookup that would send a request, while every URL is held (a 429 or 503's Retry-After):
     * nothing is sent, and the retry timer's ready callback comes when one may be asked. The
     * lookup budget is not spent on it. */
    bool asks = !e || e->state == ENTRY_EMPTY ||
                ((e->state == ENTRY_MISSING || e->state == ENTRY_FAILED) && now >= e->retry_at);
    double held_to = asks ? url_held(r, now) : 0;
    if (held_to > 0) {
        /* A row waits on a registry that asked for time: it is down, as after a lookup's own 429
         * or 503 (entry_failed). Held by the start-up probe's answer, it stayed "up" (/readyz 200,
         * outbox_schema_registry_up 1, no "unavailable" line) for up to RETRY_AFTER_MAX_S while
         * rows waited; recheck_down brings it back up once a URL may be asked, row or not. A
         * subject known missing keeps its answer (below): no row waits on it. */
        if (r->up && !(e && e->state == ENTRY_MISSING)) {
            char why[96];
            snprintf(why, sizeof(why), "HTTP %ld (Retry-After: %.0f s)", r->held_status[r->current],
                     held_to - now);
            set_up(r, false, why);
        }
        if (e && e->state == ENTRY_MISSING) {
            snprintf(err, errlen, "%s", e->missing_why ? e->missing_why : "subject not found");
            return REGISTRY_MISSING; /* as when the budget is spent: its answer is kept */
        }
        return e && e->state == ENTRY_FAILED ? REGISTRY_DOWN : REGISTRY_PENDING;
    }
    if (!e) {
        /* A subject held back by the budget gets no entry: they would grow without bound. */
        if (!budget_take(r, subject, now))
            return REGISTRY_PENDING;
        e = entry_add(r, subject);
        if (!e) {
            snprintf(err, errlen, "out of memory");
            return REGISTRY_DOWN;
        }
        e->wanted_at = now;
    } else {
        switch (e->state) {
        case ENTRY_MISSING:
            /* Its answer is kept until a request may go: the row fails as it did, no wait. */
            if (now >= e->retry_at && !budget_take(r, subject, now)) {
                snprintf(err, errlen, "%s", e->missing_why ? e->missing_why : "subject not found");
                return REGISTRY_MISSING;
            }
            break;
        case ENTRY_FAILED:
        case ENTRY_EMPTY:
            if ((e->state == ENTRY_EMPTY || now >= e->retry_at) && !budget_take(r, subject, now))
                return e->state == ENTRY_EMPTY ? REGISTRY_PENDING : REGISTRY_DOWN;
            break;
        default:
            break;
        }
    }
    switch (e->state) {
    case ENTRY_OK:
        *schema = &e->schema;
        return REGISTRY_OK;
    case ENTRY_FETCHING:
        return REGISTRY_PENDING;
    case ENTRY_MISSING:
        if (now < e->retry_at) {
            snprintf(err, errlen, "%s", e->missing_why ? e->missing_why : "subject not found");
            return REGISTRY_MISSING;
        }
        break;
    case ENTRY_FAILED:
        if (now < e->retry_at) {
            arm_retry(r, e->retry_at);
            return REGISTRY_DOWN;
        }
        break;
    case ENTRY_EMPTY:
        break;
    }
    if (!start_request(r, e, NULL)) {
        e->retry_at = now + BACKOFF_FIRST_S;
        e->state = ENTRY_FAILED;
        arm_retry(r, e->retry_at);
        return REGISTRY_DOWN;
    }
    return REGISTRY_PENDING;
}

size_t registry_cached(const Registry *r)
{
    return r->n_entries;
}

bool registry_up(const Registry *r)
{
    return r->up;
}

/* One URL's answer to the start-up probe. */
typedef struct ProbeResult {
    CURLcode code;
    long status;
    bool cut;  /* the body's first bytes came: the transfer was ended there (cut_body) */
    bool late; /* still out (or its host's lookup) when another URL's answer ended the wait */
    /* A 429's or a 503's Retry-After (retry_after_s; 0: none): the URL is held (url_hold) from
     * the start, as after a lookup's answer, counted from answered_at (monotonic), when it came. */
    double retry_after;
    double answered_at;
    char errbuf[CURL_ERROR_SIZE];
    char location[256]; /* a 3xx's Location, cut, for the error ("" when none) */
    /* The URL's host name being looked up (UrlHost) on the probe's own loop; the transfer is
     * added to the multi handle once its addresses came. */
    UrlHost *host;
    Resolve *resolving;
    CURLM *multi;
    CURL *easy;
    struct curl_slist *resolve;
    int *pending; /* lookups the probe still waits for */
} ProbeResult;

/* The end of the probe's lookup of a URL's host name: its transfer starts, with the addresses, or
 * fails as curl's own lookup did. */
static void on_probe_resolved(void *arg, const char *addrs, int n, const char *error)
{
    ProbeResult *pr = arg;
    pr->resolving = NULL;
    (*pr->pending)--;
    bool ok = n > 0 && host_keep(pr->host, addrs);
    if (ok && (pr->resolve = curl_slist_append(NULL, pr->host->entry)) != NULL) {
        curl_easy_setopt(pr->easy, CURLOPT_RESOLVE, pr->resolve);
        if (curl_multi_add_handle(pr->multi, pr->easy) == CURLM_OK)
            return;
    }
    pr->code = CURLE_COULDNT_RESOLVE_HOST;
    snprintf(pr->errbuf, sizeof(pr->errbuf), "Could not resolve host: %s (%s)", pr->host->name,
             n == 0 ? error : "no address curl can use");
}

/* Whether a URL's answer to the probe is the registry answering: taken, when no URL before it
 * answered so, for the current one. A 429 is not: lookups take it for a failure, as a 5xx, and
 * taken at start-up, the relay's first lookups went to a URL shedding load (the registry "down"
 * at once, "unavailable" logged) while a later URL answered. */
static bool probe_answered(const ProbeResult *pr)
{
    return pr->code == CURLE_OK && pr->status < 500 && pr->status != 404 && pr->status != 429 &&
           !is_redirect(pr->status);
}

/* GET /subjects on every URL at once, on a multi handle of its own (the loop is not running yet):
 * the probe then waits one --schema-registry-timeout when every URL is down, not one per URL. A
 * host name is looked up first by resolve.h, on a loop of the probe's own (the relay's may hold
 * watchers that must not run yet), which the wait below turns along with curl. */
static void probe_all(Registry *r, ProbeResult *out)
{
    struct curl_slist *hdrs = accept_headers();
    CURLM *multi = curl_multi_init();
    CURL *easy[MAX_URLS] = {0};
    struct ev_loop *loop = NULL; /* made for the first name */
    int pending = 0;
    for (int i = 0; i < r->n_urls; i++) {
        out[i] = (ProbeResult){.code = CURLE_FAILED_INIT};
        easy[i] = multi ? curl_easy_init() : NULL;
        if (!easy[i])
            continue;
        char *url = url_join(r->urls[i], "/subjects");
        if (!url) {
            curl_easy_cleanup(easy[i]);
            easy[i] = NULL;
            continue;
        }
        easy_setup(r, easy[i], url, hdrs);
        secrets_free_zeroed(url);                                   /* curl copies CURLOPT_URL */
        curl_easy_setopt(easy[i], CURLOPT_WRITEFUNCTION, cut_body); /* the status alone */
        curl_easy_setopt(easy[i], CURLOPT_WRITEDATA, &out[i].cut);
        curl_easy_setopt(easy[i], CURLOPT_ERRORBUFFER, out[i].errbuf);
        curl_easy_setopt(easy[i], CURLOPT_PRIVATE, &out[i]);
        UrlHost *h = &r->hosts[i];
        if (h->name && h->entry && monotime_now() - h->answered_at < HOST_TTL_S) {
            out[i].resolve = curl_slist_append(NULL, h->entry);
            curl_easy_setopt(easy[i], CURLOPT_RESOLVE, out[i].resolve);
        } else if (h->name) {
            char why[300];
            out[i].host = h;
            out[i].multi = multi;
            out[i].easy = easy[i];
            out[i].pending = &pending;
            if (!loop)
                loop = ev_loop_new(EVFLAG_AUTO | EVFLAG_NOENV); /* as main.c's: not LIBEV_FLAGS */
            out[i].resolving =
                loop ? resolve_start(loop, h->name, on_probe_resolved, &out[i], why, sizeof(why))
                     : NULL;
            if (!out[i].resolving) {
                out[i].code = CURLE_COULDNT_RESOLVE_HOST;
                snprintf(out[i].errbuf, sizeof(out[i].errbuf),
                         "Could not resolve host: %s (%.200s)", h->name,
                         loop ? why : "out of memory");
            } else {
                pending++;
            }
            continue; /* added once its addresses come */
        }
        if (curl_multi_add_handle(multi, easy[i]) != CURLM_OK) {
            curl_easy_cleanup(easy[i]);
            easy[i] = NULL;
        }
    }
    /* Each transfer ends within the timeout (CURLOPT_TIMEOUT_MS); the deadline is a second
     * bound, should curl's own fail to fire. The first answer ends the wait: the URLs still out
     * (hung, or slower) count as not answering, as a lookup would find them. */
    double deadline = monotime_now() + r->timeout_ms / 1000.0 + 1.0;
    int running = multi ? 1 : 0;
    bool answered = false;
    while ((running > 0 || pending > 0) && !answered && monotime_now() < deadline) {
        if (pending > 0)
            ev_run(loop, EVRUN_NOWAIT); /* on_probe_resolved */
        if (curl_multi_perform(multi, &running) != CURLM_OK)
            break;
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(multi, &left)) != NULL) {
            if (m->msg != CURLMSG_DONE)
                continue;
            ProbeResult *pr = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&pr);
            pr->code = m->data.result == CURLE_WRITE_ERROR && pr->cut ? CURLE_OK : m->data.result;
            curl_easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &pr->status);
            pr->retry_after = retry_after_s(m->easy_handle, pr->status);
            pr->answered_at = monotime_now();
            const char *location = NULL;
            if (pr->status >= 300 && pr->status < 400 &&
                curl_easy_getinfo(m->easy_handle, CURLINFO_REDIRECT_URL, &location) == CURLE_OK &&
                location)
                /* curl resolves a relative Location against the URL, its user info
                 * included: masked, as every URL the relay shows. */
                log_mask_conninfo(location, pr->location, sizeof(pr->location));
            /* A 404 on /subjects is no registry's answer (it lists subjects), nor is a redirect
             * (lookups do not follow one), nor a 429 (a gateway shedding load, as a 503: a lookup
             * takes either for a failure): none ends the wait, another URL may answer. */
            answered |= probe_answered(pr);
        }
        /* A lookup's answer comes on the probe's loop, not on curl's sockets: a short wait. */
        if ((running > 0 || pending > 0) && !answered &&
            curl_multi_poll(multi, NULL, 0, pending > 0 ? 10 : 100, NULL) != CURLM_OK)
            break;
    }
    for (int i = 0; i < r->n_urls; i++) {
        if (out[i].resolving) { /* runs on alone; resolve.h keeps a late answer */
            resolve_cancel(out[i].resolving);
            out[i].resolving = NULL;
            out[i].code = CURLE_OPERATION_TIMEDOUT;
            out[i].late = answered;
            /* Another URL's answer ended the wait: the lookup had not failed, only not ended (a
             * nameserver slower than that answer), and "Could not resolve host" blamed it. */
            if (answered)
                snprintf(out[i].errbuf, sizeof(out[i].errbuf),
                         "no answer yet: the lookup of %s had not ended", r->hosts[i].name);
            else
                snprintf(out[i].errbuf, sizeof(out[i].errbuf),
                         "Could not resolve host: %s (no answer within %ld ms)", r->hosts[i].name,
                         r->timeout_ms);
        }
        if (easy[i]) {
            if (out[i].code == CURLE_FAILED_INIT) { /* still out when the wait ended */
                out[i].code = CURLE_OPERATION_TIMEDOUT;
                out[i].late = answered;
                out[i].errbuf[0] = '\0';
            }
            curl_multi_remove_handle(multi, easy[i]);
            curl_easy_cleanup(easy[i]);
        }
        curl_slist_free_all(out[i].resolve);
        out[i].resolve = NULL;
    }
    if (loop)
        ev_loop_destroy(loop);
    curl_multi_cleanup(multi);
    curl_slist_free_all(hdrs);
}

bool registry_take_probe(Registry *to, const Registry *from)
{
    if (to == from || to->n_urls != from->n_urls)
        return false;
    for (int i = 0; i < to->n_urls; i++)
        if (strcmp(to->urls[i], from->urls[i]) != 0)
            return false;
    /* Unprobed, each of the other databases' registries asked the URL the probe had passed over
     * or been told to wait by at its first lookup: N databases, N requests into a gateway that
     * had just asked for time. */
    to->current = from->current;
    for (int i = 0; i < to->n_urls; i++) {
        to->held_until[i] = from->held_until[i];
        to->held_status[i] = from->held_status[i];
    }
    return true;
}

/* A URL's HTTP answer to the probe, as a warning says it ("HTTP 503", "HTTP 429, Retry-After: 30
 * s"), in buf. */
static const char *probe_status(const ProbeResult *pr, char *buf, size_t len)
{
    if (pr->retry_after > 0)
        snprintf(buf, len, "HTTP %ld, Retry-After: %.0f s", pr->status, pr->retry_after);
    else
        snprintf(buf, len, "HTTP %ld", pr->status);
    return buf;
}

/* Appends to passed (len bytes, NUL-terminated) why the probe passed over URL index for a later
 * one: "URL (why)", after "; " when not the first. Cut at len. */
static void probe_passed(const Registry *r, const ProbeResult *pr, int index, char *passed,
                         size_t len)
{
    size_t at = strlen(passed);
    if (at + 1 >= len)
        return;
    char status[64];
    const char *why = pr->code != CURLE_OK ? (*pr->errbuf ? pr->errbuf
                                              : pr->late  ? "no answer yet"
                                                          : curl_easy_strerror(pr->code))
                      : pr->status == 404
                          ? "HTTP 404 on /subjects: not a Schema Registry's base URL?"
                      : is_redirect(pr->status) ? "a redirect, not followed"
                                                : NULL;
    if (why)
        snprintf(passed + at, len - at, "%s%s (%s)", at ? "; " : "", r->shown[index], why);
    else
        snprintf(passed + at, len - at, "%s%s (%s)", at ? "; " : "", r->shown[index],
                 probe_status(pr, status, sizeof(status)));
}

bool registry_probe(Registry *r, char *err, size_t errlen, char *warn, size_t warnlen)
{
    ProbeResult res[MAX_URLS];
    probe_all(r, res);
    *warn = '\0';
    /* A URL asking for time (a 429 or 503's Retry-After) gets it from the start: asked again at
     * once by the first lookup, a registry (or its gateway) shedding load as relays start was
     * asked sooner than it said. The wait counts from its answer, not from the probe's end: the
     * probe waits on for another URL (one hung: --schema-registry-timeout), and counted from
     * then, the URL was held that much longer than it asked, rows waiting. */
    for (int i = 0; i < r->n_urls; i++)
        url_hold(r, i, res[i].answered_at, res[i].retry_after, res[i].status);
    /* The URLs passed over for a later one (failed, 5xx, 404, redirect, or slower than it): the
     * relay then runs on a URL the operator did not list first, and said nothing of why. */
    char passed[400] = "";
    /* The answers are read in the URLs' order, as a failover walks them: the first that answers
     * becomes the current one, and a refusal before it is an error. A 404 on /subjects (a base
     * URL without the registry's path prefix, or a proxy routing only some paths) answered with
     * nothing a registry says: it was taken for an answer, silently, and every lookup then found
     * the registry "down". Only when no URL answers better does its URL become the current one,
     * with a warning naming it (a proxy that routes /subjects/{subject}/... alone still works). */
    int first_404 = -1, first_3xx = -1;
    for (int i = 0; i < r->n_urls; i++) {
        CURLcode code = res[i].code;
        long status = res[i].status;
        const char *errbuf = res[i].errbuf;
        if (code == CURLE_PEER_FAILED_VERIFICATION || code == CURLE_SSL_CACERT_BADFILE) {
            snprintf(err, errlen, "schema registry %s: TLS: %s", r->shown[i],
                     *errbuf ? errbuf : curl_easy_strerror(code));
            return false;
        }
        if (code == CURLE_OK && status == 401) {
            snprintf(err, errlen,
                     "schema registry %s refuses the credentials (HTTP 401): check "
                     "--schema-registry-auth-file",
                     r->shown[i]);
            return false;
        }
        /* A 403 is no refusal of the credentials: they were taken, and the user lacks the right
         * to list subjects (Confluent's ACL authorizer asks GLOBAL_SUBJECTS_READ for GET
         * /subjects, SUBJECT_READ alone for a subject's versions). A least-privilege user could
         * not start the relay at all. The registry answered: its URL is taken, with a warning;
         * the subjects' own lookups say if reading them is refused too. */
        if (code == CURLE_OK && status == 403) {
            r->current = i;
            snprintf(warn, warnlen,
                     "HTTP 403 on /subjects from %s: the credentials are taken, listing subjects "
                     "is refused (Confluent's GLOBAL_SUBJECTS_READ); the subjects' own lookups "
                     "will say if reading them is refused%s%s",
                     r->shown[i], *passed ? "; passed over: " : "", passed);
            return true;
        }
        if (code == CURLE_OK && status == 404) {
            first_404 = first_404 < 0 ? i : first_404;
            probe_passed(r, &res[i], i, passed, sizeof(passed));
            continue;
        }
        if (code == CURLE_OK && is_redirect(status)) {
            first_3xx = first_3xx < 0 ? i : first_3xx;
            probe_passed(r, &res[i], i, passed, sizeof(passed));
            continue;
        }
        if (probe_answered(&res[i])) {
            r->current = i;
            *warn = '\0';
            if (*passed)
                snprintf(warn, warnlen, "passed over for %s: %s", r->shown[i], passed);
            return true;
        }
        probe_passed(r, &res[i], i, passed, sizeof(passed));
        char said[64];
        snprintf(warn, warnlen, "schema registry %s does not answer (%s): rows wait for it",
                 r->shown[i],
                 code != CURLE_OK ? (*errbuf ? errbuf : curl_easy_strerror(code))
                                  : probe_status(&res[i], said, sizeof(said)));
    }
    /* A redirect on /subjects was taken for an answer, and every lookup then failed with "HTTP
     * 301" while the relay ran. Lookups do not follow redirects: one to another host would take
     * the basic-auth password along, and one the registry moves (http to https, a new path) is
     * the configuration's to say. Known now, it is the URL's fault: refused, with where it
     * points, when no URL answers as a registry. */
    if (first_3xx >= 0) {
        snprintf(err, errlen,
                 "schema registry %s answers /subjects with a redirect (HTTP %ld%s%.200s): "
                 "redirects are not followed; set --schema-registry-url to the registry itself",
                 r->shown[first_3xx], res[first_3xx].status, *res[first_3xx].location ? " to " : "",
                 res[first_3xx].location);
        return false;
    }
    if (first_404 >= 0) {
        r->current = first_404;
        snprintf(warn, warnlen,
                 "HTTP 404 on /subjects from %s: not a Schema Registry's base URL (a path prefix "
                 "missing?), or a proxy routing only some paths; check --schema-registry-url: "
                 "rows wait while lookups get a 404 that is not the registry's",
                 r->shown[first_404]);
    }
    return true;
}
