#include "fastpath.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Key names: one namespace per role; the endpoint scopes the key as in idempotency_keys. The
 * separator cannot occur in an endpoint name ("PATCH /orders/{id}"). */
#define CACHE_PREFIX "producer-demo:idem:"
#define GUARD_PREFIX "producer-demo:busy:"

static char ns[160] = "-"; /* the database's identity (fastpath_set_namespace) */

void fastpath_set_namespace(const char *name)
{
    snprintf(ns, sizeof(ns), "%s", name);
    for (char *p = ns; *p; p++)
        if (*p == ':' || *p == '|' || (unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7f)
            *p = '_';
}

static void redis_key(char *out, size_t outlen, const char *prefix, const IdemRequest *req)
{
    snprintf(out, outlen, "%s%s:%s|%s", prefix, ns, req->endpoint, req->key);
}

FastOutcome fastpath_lookup(RCache *rc, const IdemRequest *req, const char *fp, IdemStored *stored)
{
    memset(stored, 0, sizeof(*stored));
    char key[600];
    redis_key(key, sizeof(key), CACHE_PREFIX, req);
    redisReply *r = rcache_command(rc, "GET %s", key);
    if (!r)
        return FAST_MISS;
    FastOutcome out = FAST_MISS;
    json_t *o = r->type == REDIS_REPLY_STRING ? json_loadb(r->str, r->len, 0, NULL) : NULL;
    json_t *jfp = json_object_get(o, "fp"), *jst = json_object_get(o, "status"),
           *jbody = json_object_get(o, "body"), *jloc = json_object_get(o, "location"),
           *jetag = json_object_get(o, "etag");
    /* An entry this code did not write (or a truncated one) is a miss, never an answer. */
    if (!json_is_string(jfp) || !json_is_integer(jst) || !json_is_string(jbody) ||
        (jloc && !json_is_string(jloc)) || (jetag && !json_is_string(jetag)))
        goto done;
    if (strcmp(json_string_value(jfp), fp) != 0) {
        out = FAST_MISMATCH;
        goto done;
    }
    stored->status = (int)json_integer_value(jst);
    stored->body = strdup(json_string_value(jbody));
    stored->location = jloc ? strdup(json_string_value(jloc)) : NULL;
    stored->etag = jetag ? strdup(json_string_value(jetag)) : NULL;
    if (!stored->body || (jloc && !stored->location) || (jetag && !stored->etag)) {
        idem_stored_free(stored);
        goto done;
    }
    out = FAST_HIT;
done:
    json_decref(o);
    freeReplyObject(r);
    return out;
}

void fastpath_store(RCache *rc, const IdemRequest *req, const char *fp, int status,
                    const char *body, const char *location, const char *etag, long long ttl_ms,
                    bool force)
{
    if (ttl_ms < 1)
        return;
    json_t *o = json_pack("{s:s, s:i, s:s}", "fp", fp, "status", status, "body", body);
    if (o && location && location[0])
        json_object_set_new(o, "location", json_string(location));
    if (o && etag && etag[0])
        json_object_set_new(o, "etag", json_string(etag));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return;
    char key[600];
    redis_key(key, sizeof(key), CACHE_PREFIX, req);
    redisReply *r = rcache_command_ex(rc, force, NULL, "SET %s %s PX %lld", key, text, ttl_ms);
    if (r)
        freeReplyObject(r);
    free(text);
}

GuardOutcome fastpath_guard(RCache *rc, const IdemRequest *req, long guard_ms, char token[33])
{
    /* Unique per request: process id, a counter and the clock. */
    static atomic_long seq;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(token, 33, "%08x%08lx%016llx", (unsigned)getpid(),
             (unsigned long)atomic_fetch_add(&seq, 1),
             (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec);
    char key[600];
    redis_key(key, sizeof(key), GUARD_PREFIX, req);
    bool sent = false;
    redisReply *r =
        rcache_command_ex(rc, false, &sent, "SET %s %s NX PX %ld", key, token, guard_ms);
    if (!r)
        return sent ? GUARD_UNKNOWN : GUARD_UNAVAILABLE;
    GuardOutcome out = r->type == REDIS_REPLY_NIL ? GUARD_BUSY : GUARD_TAKEN;
    freeReplyObject(r);
    return out;
}

void fastpath_release(RCache *rc, const IdemRequest *req, const char token[33])
{
    char key[600];
    redis_key(key, sizeof(key), GUARD_PREFIX, req);
    /* Compare and delete in one step: between a GET and a DEL the guard may expire and be taken
     * by another request, whose guard a plain DEL would remove. */
    redisReply *r = rcache_command_ex(
        rc, true, NULL, "EVAL %s 1 %s %s",
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
        "return 0",
        key, token);
    if (r)
        freeReplyObject(r);
}
