#include "rcache.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "log.h"
#include "secrets.h"

struct RCache {
    char host[256];
    int port, db, timeout_ms, size;
    redisContext **ctx; /* NULL: not connected */
    bool *busy;
    pthread_mutex_t mu; /* guards everything below and the busy flags */
    bool down;
    double retry_at; /* monotonic seconds: while down, no call before this */
    RCacheStats stats;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The URL as an error shows it: anything that looks like user info (redis://:PASSWORD@,
 * redis://USER:PASSWORD@, a scheme mistyped or left out) is "***" whole, the demos registering no
 * secrets for a scrub to catch (secrets_url_userinfo_end: up to the last '@' before a query). */
static bool bad_url(char *err, size_t errlen, const char *url, const char *why)
{
    const char *sep = strstr(url, "://");
    const char *auth = sep ? sep + 3 : url;
    const char *at = secrets_url_userinfo_end(auth);
    snprintf(err, errlen, "--redis-url: %s (expected redis://HOST:PORT[/DB], got '%.*s%s%.100s')",
             why, (int)(auth - url), url, at ? "***" : "", at ? at : auth);
    return false;
}

bool rcache_parse_url(const char *url, char *host, size_t hostlen, int *port, int *db, char *err,
                      size_t errlen)
{
    const char *p = url;
    if (strncmp(p, "redis://", 8) != 0)
        return bad_url(err, errlen, url, "the scheme must be redis://");
    p += 8;
    const char *hs = p, *he;
    if (*p == '[') {
        hs = ++p;
        he = strchr(p, ']');
        if (!he)
            return bad_url(err, errlen, url, "no closing ] after an IPv6 address");
        p = he + 1;
    } else {
        if (strchr(p, '@'))
            return bad_url(err, errlen, url, "passwords in the URL are not supported");
        he = p + strcspn(p, ":/");
        p = he;
    }
    if (he == hs || (size_t)(he - hs) >= hostlen)
        return bad_url(err, errlen, url, "the host is empty or too long");
    if (*p != ':')
        return bad_url(err, errlen, url, "the port is missing");
    char *end;
    errno = 0;
    long pt = strtol(p + 1, &end, 10);
    if (end == p + 1 || errno || pt < 1 || pt > 65535 || (*end && *end != '/'))
        return bad_url(err, errlen, url, "the port must be 1 to 65535");
    long d = 0;
    if (*end == '/' && end[1]) {
        const char *ds = end + 1;
        d = strtol(ds, &end, 10);
        if (end == ds || *end || d < 0 || d > 15)
            return bad_url(err, errlen, url, "the database must be 0 to 15");
    } else if (*end == '/') {
        end++;
    }
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    *port = (int)pt;
    *db = (int)d;
    return true;
}

RCache *rcache_new(const char *url, int size, int timeout_ms, char *err, size_t errlen)
{
    RCache *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!rcache_parse_url(url, c->host, sizeof(c->host), &c->port, &c->db, err, errlen)) {
        free(c);
        return NULL;
    }
    c->size = size < 1 ? 1 : size;
    c->timeout_ms = timeout_ms;
    c->ctx = calloc((size_t)c->size, sizeof(*c->ctx));
    c->busy = calloc((size_t)c->size, sizeof(*c->busy));
    if (!c->ctx || !c->busy) {
        free(c->ctx);
        free(c->busy);
        free(c);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    /* Counted as up until a call fails, so the first failure is logged as an outage. */
    c->stats.up = true;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

/* Takes a free slot, or -1 when Redis is resting after a failure (unless force) or every slot
 * is busy. */
static int take_slot(RCache *c, bool force)
{
    int slot = -1;
    pthread_mutex_lock(&c->mu);
    if (force || !c->down || now_s() >= c->retry_at) {
        for (int i = 0; i < c->size && slot < 0; i++)
            if (!c->busy[i])
                slot = i;
        if (slot >= 0) {
            c->busy[slot] = true;
            /* While down, one call at a time probes; the others keep skipping. */
            if (c->down)
                c->retry_at = now_s() + RCACHE_RETRY_MS / 1000.0;
        }
    }
    if (slot < 0)
        c->stats.skipped++;
    pthread_mutex_unlock(&c->mu);
    return slot;
}

/* Gives the slot back and records the outcome; logs a change of state, once. */
static void put_slot(RCache *c, int slot, bool reached, bool failed, const char *why)
{
    pthread_mutex_lock(&c->mu);
    c->busy[slot] = false;
    bool was_down = c->down;
    if (failed)
        c->stats.failures++;
    else
        c->stats.calls++;
    if (!reached) {
        c->down = true;
        c->retry_at = now_s() + RCACHE_RETRY_MS / 1000.0;
        if (!was_down)
            c->stats.outages++;
    } else {
        c->down = false;
        if (was_down)
            c->stats.recovered++;
    }
    c->stats.up = !c->down;
    RCacheStats s = c->stats;
    pthread_mutex_unlock(&c->mu);
    char q[400];
    if (!reached && !was_down)
        log_warn("redis down: answering from postgres only", "host=%s port=%d error=%s outages=%ld",
                 c->host, c->port, log_quote(why ? why : "unknown", q, sizeof(q)), s.outages);
    else if (reached && was_down)
        log_info("redis up again", "host=%s port=%d outages=%ld", c->host, c->port, s.outages);
}

static redisContext *connect_ctx(RCache *c, char *why, size_t whylen)
{
    struct timeval tv = {c->timeout_ms / 1000, (c->timeout_ms % 1000) * 1000};
    redisContext *ctx = redisConnectWithTimeout(c->host, c->port, tv);
    if (!ctx) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    if (ctx->err || redisSetTimeout(ctx, tv) != REDIS_OK) {
        snprintf(why, whylen, "%s", ctx->err ? ctx->errstr : "cannot set the timeout");
        redisFree(ctx);
        return NULL;
    }
    if (c->db != 0) {
        redisReply *r = redisCommand(ctx, "SELECT %d", c->db);
        bool ok = r && r->type == REDIS_REPLY_STATUS;
        snprintf(why, whylen, "SELECT %d: %s", c->db,
                 r && r->type == REDIS_REPLY_ERROR ? r->str : ctx->errstr);
        if (r)
            freeReplyObject(r);
        if (!ok) {
            redisFree(ctx);
            return NULL;
        }
    }
    return ctx;
}

/* True when a failed call on a reused context failed because that connection was already dead
 * (Redis restarted, or closed an idle client): the command never reached a live server, so one
 * more try on a fresh connection is safe and keeps a restart from looking like an outage per
 * idle context. A timeout is not retried: that would double the bound. */
static bool stale_connection(const redisContext *ctx)
{
    return ctx->err == REDIS_ERR_EOF ||
           (ctx->err == REDIS_ERR_IO && (errno == ECONNRESET || errno == EPIPE));
}

static redisReply *vcommand(RCache *c, bool force, bool *sent, const char *fmt, va_list args)
{
    if (sent)
        *sent = false;
    int slot = take_slot(c, force);
    if (slot < 0)
        return NULL;
    char why[300] = "";
    redisReply *r = NULL;
    for (int attempt = 0; attempt < 2 && !r; attempt++) {
        bool fresh = !c->ctx[slot];
        if (fresh)
            c->ctx[slot] = connect_ctx(c, why, sizeof(why));
        redisContext *ctx = c->ctx[slot];
        if (!ctx) {
            put_slot(c, slot, false, true, why);
            return NULL;
        }
        va_list ap;
        va_copy(ap, args);
        r = redisvCommand(ctx, fmt, ap);
        va_end(ap);
        /* Written to a live connection: Redis may have run it even if no reply comes. */
        if (sent && (r || !stale_connection(ctx)))
            *sent = true;
        if (!r) {
            /* Timeout, reset, EOF: the context cannot be reused (a late reply would be read as
             * the answer to the next command). */
            bool retry = !fresh && stale_connection(ctx);
            snprintf(why, sizeof(why), "%s", ctx->errstr[0] ? ctx->errstr : "no reply");
            redisFree(ctx);
            c->ctx[slot] = NULL;
            if (!retry)
                break;
        }
    }
    if (!r) {
        put_slot(c, slot, false, true, why);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        /* Redis answered (it is up) but refused, e.g. OOM or a loading dataset. */
        char q[300];
        log_debug("redis error reply", "error=%s", log_quote(r->str, q, sizeof(q)));
        freeReplyObject(r);
        put_slot(c, slot, true, true, NULL);
        return NULL;
    }
    put_slot(c, slot, true, false, NULL);
    return r;
}

redisReply *rcache_command(RCache *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcommand(c, false, NULL, fmt, ap);
    va_end(ap);
    return r;
}

redisReply *rcache_command_ex(RCache *c, bool force, bool *sent, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = vcommand(c, force, sent, fmt, ap);
    va_end(ap);
    return r;
}

RCacheStats rcache_stats(RCache *c)
{
    pthread_mutex_lock(&c->mu);
    RCacheStats s = c->stats;
    pthread_mutex_unlock(&c->mu);
    return s;
}

void rcache_free(RCache *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->size; i++)
        if (c->ctx[i])
            redisFree(c->ctx[i]);
    pthread_mutex_destroy(&c->mu);
    free(c->ctx);
    free(c->busy);
    free(c);
}
