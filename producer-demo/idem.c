#include "idem.h"

#include "sha256.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Advisory lock class of idempotency keys (the two-int form; the schema lock uses 20240). */
#define IDEM_LOCK_CLASS "20241"

static bool is_visible(unsigned char c)
{
    return c >= 0x21 && c <= 0x7e;
}

static bool bad_key(char *err, size_t errlen, const char *why)
{
    snprintf(err, errlen, "Idempotency-Key %s", why);
    return false;
}

bool idem_key_parse(const char *value, char out[IDEM_KEY_MAX + 1], char *err, size_t errlen)
{
    const char *p = value, *end = value + strlen(value);
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
        end--;

    size_t n = 0;
    if (p < end && *p == '"') {
        /* RFC 8941 sf-string: DQUOTE *(unescaped / "\" ( DQUOTE / "\" )) DQUOTE, and nothing
         * may follow the closing quote. */
        bool closed = false;
        for (p++; p < end; p++) {
            unsigned char c = (unsigned char)*p;
            if (c == '"') {
                closed = p + 1 == end;
                if (!closed)
                    return bad_key(err, errlen, "has text after its closing quote");
                break;
            }
            if (c == '\\') {
                if (p + 1 >= end || (p[1] != '"' && p[1] != '\\'))
                    return bad_key(err, errlen, "has an invalid escape (only \\\" and \\\\)");
                c = (unsigned char)*++p;
            }
            if (!is_visible(c))
                return bad_key(err, errlen, "must be visible ASCII characters only");
            if (n == IDEM_KEY_MAX)
                return bad_key(err, errlen, "must be at most 255 characters");
            out[n++] = (char)c;
        }
        if (!closed)
            return bad_key(err, errlen, "has no closing quote");
    } else {
        for (; p < end; p++) {
            if (!is_visible((unsigned char)*p))
                return bad_key(err, errlen, "must be visible ASCII characters only");
            if (n == IDEM_KEY_MAX)
                return bad_key(err, errlen, "must be at most 255 characters");
            out[n++] = *p;
        }
    }
    if (n == 0)
        return bad_key(err, errlen, "must not be empty");
    out[n] = '\0';
    return true;
}

/* "METHOD PATH\nBODY": what the fingerprint covers, hashed by the server with sha256(). */
static char *fingerprint_input(const IdemRequest *req, int *len)
{
    size_t head = strlen(req->method) + 1 + strlen(req->path) + 1;
    char *buf = malloc(head + req->body_len + 1);
    if (!buf)
        return NULL;
    snprintf(buf, head + 1, "%s %s\n", req->method, req->path);
    memcpy(buf + head, req->body, req->body_len);
    *len = (int)(head + req->body_len);
    return buf;
}

/* A live record of the key: whether the fingerprint matches, the response, and the time it has
 * left. now() is the start of the claim's transaction, just before: the same instant the
 * take-over of an expired record below compares with. */
#define SELECT_STORED                                                                              \
    "SELECT request_hash = sha256($3::bytea), response_status, response_body,"                     \
    " response_location, response_etag,"                                                           \
    " (extract(epoch FROM expires_at - now()) * 1000)::bigint"                                     \
    " FROM idempotency_keys"                                                                       \
    " WHERE endpoint = $1 AND key = $2 AND expires_at > now()"

IdemOutcome idem_stored_read(const PGresult *res, IdemStored *stored, DbError *e)
{
    memset(stored, 0, sizeof(*stored));
    if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
        return IDEM_MISMATCH;
    stored->status = atoi(PQgetvalue(res, 0, 1));
    stored->body = strdup(PQgetvalue(res, 0, 2));
    stored->location = PQgetisnull(res, 0, 3) ? NULL : strdup(PQgetvalue(res, 0, 3));
    stored->etag = PQgetisnull(res, 0, 4) ? NULL : strdup(PQgetvalue(res, 0, 4));
    stored->left_ms = atoll(PQgetvalue(res, 0, 5));
    /* A copy that failed must not be replayed as an empty body (or without its Location): the
     * client would take a 201 with nothing in it for the stored answer. Failing the request
     * rolls the claim back; the client's retry with the same key replays it whole. */
    if (!stored->body || (!PQgetisnull(res, 0, 3) && !stored->location) ||
        (!PQgetisnull(res, 0, 4) && !stored->etag)) {
        idem_stored_free(stored);
        memset(stored, 0, sizeof(*stored));
        *e = (DbError){.message = "out of memory copying the stored response"};
        return IDEM_FAILED;
    }
    return IDEM_REPLAY;
}

IdemOutcome idem_lookup(PGconn *conn, const IdemRequest *req, IdemStored *stored, DbError *e)
{
    memset(stored, 0, sizeof(*stored));
    int fp_len = 0;
    char *fp = fingerprint_input(req, &fp_len);
    if (!fp) {
        *e = (DbError){.message = "out of memory"};
        return IDEM_FAILED;
    }
    const char *values[3] = {req->endpoint, req->key, fp};
    const int lengths[3] = {0, 0, fp_len};
    const int formats[3] = {0, 0, 1};
    IdemOutcome out = IDEM_FAILED;
    PGresult *res = db_query_bin(conn, SELECT_STORED, 3, values, lengths, formats, e);
    if (res) {
        out = PQntuples(res) == 1 ? idem_stored_read(res, stored, e) : IDEM_NEW;
        PQclear(res);
    }
    free(fp);
    return out;
}

IdemOutcome idem_claim(PGconn *conn, const IdemRequest *req, IdemStored *stored, DbError *e)
{
    memset(stored, 0, sizeof(*stored));
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%ld", req->ttl_s);
    int fp_len = 0;
    char *fp = fingerprint_input(req, &fp_len);
    if (!fp) {
        *e = (DbError){.message = "out of memory"};
        return IDEM_FAILED;
    }
    const char *values[4] = {req->endpoint, req->key, fp, ttl};
    const int lengths[4] = {0, 0, fp_len, 0};
    const int formats[4] = {0, 0, 1, 0};
    IdemOutcome out = IDEM_FAILED;

    /* Not waiting is the point: the holder may run for a while, and the client is better told
     * to come back (409 + Retry-After) than left hanging on a lock. The lock is named by a 32-bit
     * hash: two different keys in flight at the same moment may collide, which costs one
     * spurious 409 (a retry), never a wrong answer. */
    PGresult *res = db_query(
        conn, "SELECT pg_try_advisory_xact_lock(" IDEM_LOCK_CLASS ", hashtext($1 || ' ' || $2))", 2,
        values, e);
    if (!res)
        goto done;
    bool locked = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    if (!locked) {
        out = IDEM_BUSY;
        goto done;
    }

    res = db_query_bin(conn, SELECT_STORED, 3, values, lengths, formats, e);
    if (!res)
        goto done;
    if (PQntuples(res) == 1) {
        out = idem_stored_read(res, stored, e);
        PQclear(res);
        goto done;
    }
    PQclear(res);

    /* An expired record that the cleanup has not reached yet is taken over. RETURNING nothing
     * would mean a live record appeared although we hold the key's lock; answer "busy" rather
     * than run the request twice. */
    res = db_query_bin(conn,
                       "INSERT INTO idempotency_keys (endpoint, key, request_hash, expires_at)"
                       " VALUES ($1, $2, sha256($3::bytea), now() + $4 * interval '1 second')"
                       " ON CONFLICT (endpoint, key) DO UPDATE"
                       " SET request_hash = EXCLUDED.request_hash, created_at = now(),"
                       " expires_at = EXCLUDED.expires_at, response_status = NULL,"
                       " response_body = NULL, response_location = NULL, response_etag = NULL"
                       " WHERE idempotency_keys.expires_at <= now()"
                       " RETURNING 1",
                       4, values, lengths, formats, e);
    if (!res)
        goto done;
    out = PQntuples(res) == 1 ? IDEM_NEW : IDEM_BUSY;
    PQclear(res);
done:
    free(fp);
    return out;
}

bool idem_complete(PGconn *conn, const IdemRequest *req, int status, const char *body,
                   const char *location, const char *etag, DbError *e)
{
    char status_text[16];
    snprintf(status_text, sizeof(status_text), "%d", status);
    char ttl[32];
    snprintf(ttl, sizeof(ttl), "%ld", req->ttl_s);
    const char *values[7] = {req->endpoint, req->key, status_text, body, location, etag, ttl};
    /* The key's lifetime counts from here, the request's completion (clock_timestamp(): now()
     * is the transaction's start): a slow request never commits a record that has already
     * expired, which an immediate retry would then run again. */
    PGresult *res = db_query(conn,
                             "UPDATE idempotency_keys SET response_status = $3,"
                             " response_body = $4, response_location = $5, response_etag = $6,"
                             " expires_at = clock_timestamp() + $7 * interval '1 second'"
                             " WHERE endpoint = $1 AND key = $2",
                             7, values, e);
    if (!res)
        return false;
    bool one = strcmp(PQcmdTuples(res), "1") == 0;
    PQclear(res);
    if (!one)
        *e = (DbError){.message = "idempotency record vanished before its response was stored"};
    return one;
}

void idem_stored_free(IdemStored *s)
{
    free(s->body);
    free(s->location);
    free(s->etag);
    s->body = s->location = s->etag = NULL;
}

void idem_fingerprint(const IdemRequest *req, char out[65])
{
    Sha256 h;
    sha256_init(&h);
    sha256_update(&h, req->method, strlen(req->method));
    sha256_update(&h, " ", 1);
    sha256_update(&h, req->path, strlen(req->path));
    sha256_update(&h, "\n", 1);
    sha256_update(&h, req->body, req->body_len);
    unsigned char d[32];
    sha256_final(&h, d);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

long idem_cleanup_batch(PGconn *conn, long batch, DbError *e)
{
    char limit[32];
    snprintf(limit, sizeof(limit), "%ld", batch);
    const char *values[1] = {limit};
    PGresult *res = db_query(conn,
                             "DELETE FROM idempotency_keys WHERE (endpoint, key) IN ("
                             " SELECT endpoint, key FROM idempotency_keys"
                             " WHERE expires_at <= now() ORDER BY expires_at LIMIT $1"
                             " FOR UPDATE SKIP LOCKED)",
                             1, values, e);
    if (!res)
        return -1;
    long n = atol(PQcmdTuples(res));
    PQclear(res);
    return n;
}
