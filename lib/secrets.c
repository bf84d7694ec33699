#include "secrets.h"

#include <ctype.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include "opts.h"

typedef struct Secret {
    struct Secret *_Atomic next;
    size_t len;
    char value[];
} Secret;

/* Longest first, so a secret that contains another is scrubbed whole. Nodes are linked in with a
 * release store once complete and never change or go away afterwards (except in secrets_clear);
 * readers need no lock. Only the loop thread adds secrets. */
static Secret *_Atomic head;

static Secret *first(void)
{
    return atomic_load_explicit(&head, memory_order_acquire);
}

static Secret *next_of(const Secret *s)
{
    return atomic_load_explicit(&s->next, memory_order_acquire);
}

static void add_span(const char *value, size_t len)
{
    if (len < SECRETS_MIN_LEN)
        return;
    for (Secret *s = first(); s; s = next_of(s))
        if (s->len == len && memcmp(s->value, value, len) == 0)
            return;
    Secret *s = malloc(sizeof(*s) + len + 1);
    if (!s)
        return;
    memcpy(s->value, value, len);
    s->value[len] = '\0';
    s->len = len;
    /* Find the link to insert at, then publish: readers see the list with or without s. */
    Secret *_Atomic *link = &head;
    Secret *at;
    while ((at = atomic_load_explicit(link, memory_order_acquire)) != NULL && at->len >= len)
        link = &at->next;
    atomic_store_explicit(&s->next, at, memory_order_relaxed);
    atomic_store_explicit(link, s, memory_order_release);
}

/* Values given to secrets_add too short to register (secrets_too_short), each counted once:
 * the same value comes more than once (--databases registers the file's --kafka properties with
 * each database's, a SIGHUP registers all again), and the warning's count must say how many
 * passwords to change, not how often one was read. The distinct ones are remembered to tell
 * (SHORT_SEEN_MAX of them; past that each further one counts, duplicate or not) until
 * secrets_count_short_anew. Only the loop thread adds secrets. */
#define SHORT_SEEN_MAX 64
static char short_seen[SHORT_SEEN_MAX][SECRETS_MIN_LEN];
static size_t n_short_seen;
static atomic_size_t too_short;

static bool short_seen_before(const char *value)
{
    for (size_t i = 0; i < n_short_seen; i++)
        if (strcmp(short_seen[i], value) == 0)
            return true;
    if (n_short_seen < SHORT_SEEN_MAX)
        memcpy(short_seen[n_short_seen++], value, strlen(value) + 1);
    return false;
}

void secrets_count_short_anew(void)
{
    explicit_bzero(short_seen, sizeof(short_seen));
    n_short_seen = 0;
}

void secrets_add(const char *value)
{
    if (!value)
        return;
    size_t len = strlen(value);
    if (len > 0 && len < SECRETS_MIN_LEN && !short_seen_before(value))
        atomic_fetch_add(&too_short, 1);
    add_span(value, len);
}

size_t secrets_too_short(void)
{
    return atomic_load(&too_short);
}

/* Whether the text from auth to at (a URL's text up to an '@' after its first '/') is shaped
 * like "user:pass" with a '/' in either, so that the '@' may end the user info: it holds a ':'
 * after any leading "[...]" IPv6 address. A host alone ("h/p@th", "[::1]/a@b") holds none: the '@'
 * is its path's. A host with a port ("h:8081/subjects/a@b") still counts: it cannot be told
 * from a password of digits holding a '/' ("u:8081/pw@h"), and over-masking is the safe side. */
static bool userinfo_shaped(const char *auth, const char *at)
{
    const char *p = auth;
    if (p < at && *p == '[') {
        /* an IPv6 address's ':'s are no password's; a '[' in a user name ("[u:pw/x@h") is */
        const char *close = memchr(p, ']', (size_t)(at - p));
        if (close && strspn(p + 1, "0123456789abcdefABCDEF:.") == (size_t)(close - p - 1))
            p = close + 1;
    }
    return memchr(p, ':', (size_t)(at - p)) != NULL;
}

const char *secrets_url_userinfo_end(const char *auth)
{
    /* The query: the first '?' that opens a parameter ("?name=") after an '@' or a '/' (a
     * host or user info comes first: in "u:a?x=1/b@h" the '?' is the password's). */
    const char *query = NULL;
    const char *from = auth + strcspn(auth, "@/");
    for (const char *q = strchr(from, '?'); q && !query; q = strchr(q + 1, '?')) {
        size_t name = strcspn(q + 1, "@/&?#=");
        if (name > 0 && q[1 + name] == '=')
            query = q;
    }
    size_t len = query ? (size_t)(query - auth) : strlen(auth);
    const char *at = memrchr(auth, '@', len);
    size_t before_path = strcspn(auth, "/");
    const char *by_path = memrchr(auth, '@', before_path);
    /* An '@' after the first '/' ends user info only when the text up to it could be
     * "user:pass" (a '/' in either): in "h/p@th" it is the path's, and taking it for a bare
     * token's would mask the host and register it as a secret. */
    if (at && at > auth + before_path && !userinfo_shaped(auth, at))
        at = NULL;
    return by_path && (!at || by_path > at) ? by_path : at;
}

/* Where a reading of a URL other than the password as meant may end or cut its password. */
static const char PASSWORD_CUTS[] = "@,:/?#&=";

/* Registers the text from start to end, and each piece of it between the characters of cuts. */
static void add_pieces(const char *start, const char *end, const char *cuts)
{
    add_span(start, (size_t)(end - start));
    for (const char *piece = start; piece < end;) {
        const char *cut = piece;
        while (cut < end && !strchr(cuts, *cut))
            cut++;
        add_span(piece, (size_t)(cut - piece));
        piece = cut + 1;
    }
}

/* add_pieces for the text as written and, when it holds a %XX escape, percent-decoded: libpq
 * decodes a URL's parts before it splits a host list at ',' ("a%2Cb" is hosts a and b). %00
 * stays as it is: libpq refuses it. */
static void add_password_pieces(const char *start, const char *end)
{
    size_t len = (size_t)(end - start);
    add_pieces(start, end, PASSWORD_CUTS);
    if (!memchr(start, '%', len))
        return;
    char *decoded = malloc(len + 1);
    if (!decoded)
        return;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (start[i] == '%' && i + 2 < len && isxdigit((unsigned char)start[i + 1]) &&
            isxdigit((unsigned char)start[i + 2])) {
            char hex[3] = {start[i + 1], start[i + 2], '\0'};
            char c = (char)strtol(hex, NULL, 16);
            if (c) {
                decoded[n++] = c;
                i += 2;
                continue;
            }
        }
        decoded[n++] = start[i];
    }
    add_pieces(decoded, decoded + n, PASSWORD_CUTS);
    explicit_bzero(decoded, len + 1);
    free(decoded);
}

/* The raw text of every password in a connection string, found by position like
 * log_mask_conninfo does, so that a string libpq refuses to parse is covered too. */
static void add_raw_passwords(const char *conninfo)
{
    /* A URL only when the string starts with a scheme (libpq's postgresql:// or postgres://, a
     * Schema Registry's http://), as log_mask_conninfo reads it: a key=value string's "://" is
     * in some value (application_name=x://app:relay-main@prod), whose words are no password. */
    const char *start = conninfo + strspn(conninfo, " \t\n\v\f\r"), *scheme = start;
    if (isalpha((unsigned char)*scheme))
        scheme +=
            strspn(scheme, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.");
    else
        scheme = NULL;
    if (scheme && strncmp(scheme, "://", 3) != 0)
        scheme = NULL;
    if (scheme) {
        const char *auth = scheme + 3;
        /* The user info as secrets_url_userinfo_end reads it (masked so by log_mask_conninfo). */
        const char *at = secrets_url_userinfo_end(auth);
        const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
        if (colon)
            add_span(colon + 1, (size_t)(at - colon - 1));
        /* A user info without ':' is a token in any scheme but libpq's (http://APIKEY@host,
         * redis://TOKEN@host), masked whole by log_mask_conninfo; in libpq's, a user name. */
        size_t scheme_len = (size_t)(scheme - start);
        bool libpq = (scheme_len == 8 && strncmp(start, "postgres", 8) == 0) ||
                     (scheme_len == 10 && strncmp(start, "postgresql", 10) == 0);
        if (at && !colon && !libpq)
            add_span(auth, (size_t)(at - auth));
        /* libpq itself ends the user info at the first '@' before any '/' (the masking above
         * may take a later one, masking more): its password, when that differs, is registered
         * too. */
        const char *first_at = memchr(auth, '@', strcspn(auth, "/"));
        const char *first_colon = first_at ? memchr(auth, ':', (size_t)(first_at - auth)) : NULL;
        if (first_colon && first_at != at)
            add_span(first_colon + 1, (size_t)(first_at - first_colon - 1));
        /* When libpq ends the user info elsewhere (at an earlier '@', or nowhere: an unencoded
         * '/' in the password), the text of the password as meant is shown cut elsewhere:
         * libpq takes what follows its '@' (or the scheme) for hosts and ports (cut at ',', ':',
         * '/' and '?'; "t-pw@db" for u:p@t-pw@db, port "pa" for u:pa/ss@h), its database name
         * or its query ('&', '='), which the relay shows (its connection security warning,
         * "postgres host failed", the lookup's and libpq's errors). None of the passwords
         * above occurs in those: the password as meant is registered whole and in pieces cut
         * at each of those characters, as written and percent-decoded (libpq decodes a URL's
         * parts). Only then: a password "a:b:c" that every reading ends alike is not cut into
         * words that would be scrubbed everywhere. */
        if (colon && first_at != at)
            add_password_pieces(colon + 1, at);
        /* Parameters named in percent-encoding, which the search for "password" below misses
         * (after the user info: its password may hold a '?'). */
        for (const char *param = strchr(at ? at : auth, '?'); param; param = strchr(param, '&')) {
            param++;
            size_t plen = strcspn(param, "&");
            const char *eq = memchr(param, '=', plen);
            if (eq && memchr(param, '%', (size_t)(eq - param)) &&
                secrets_encoded_password_key(param, (size_t)(eq - param)))
                add_span(eq + 1, (size_t)(param + plen - eq - 1));
        }
    }
    for (const char *p = conninfo; (p = strstr(p, "password")) != NULL;) {
        const char *key = p;
        if (key - conninfo >= 3 && strncmp(key - 3, "ssl", 3) == 0)
            key -= 3;
        /* '&' ends a value only in a URL's query string (as in log_mask_conninfo). */
        bool in_query = key != conninfo && (key[-1] == '?' || key[-1] == '&');
        bool at_key_start = key == conninfo || isspace((unsigned char)key[-1]) || in_query;
        const char *q = p + strlen("password");
        p = q;
        while (isspace((unsigned char)*q))
            q++;
        if (!at_key_start || *q != '=')
            continue;
        q++;
        while (isspace((unsigned char)*q))
            q++;
        const char *end = q;
        if (in_query) {
            /* libpq ends a query value at '&' alone (blanks, quotes and backslashes are part of
             * it), as log_mask_conninfo does: the whole value is registered, never its words (a
             * password "correct horse" must not make every "correct" the relay writes "***"). */
            end = q + strcspn(q, "&");
        } else if (*q == '\'') {
            for (end = ++q; *end && *end != '\''; end++)
                if (*end == '\\' && end[1])
                    end++;
        } else {
            /* libpq honours backslash escapes in unquoted values too ("se\ cret"), as
             * log_mask_conninfo knows: the raw value runs past an escaped blank. */
            for (; *end && !isspace((unsigned char)*end); end++)
                if (*end == '\\' && end[1])
                    end++;
        }
        add_span(q, (size_t)(end - q));
    }
}

void secrets_add_conninfo(const char *conninfo)
{
    if (!conninfo)
        return;
    add_raw_passwords(conninfo);
    PQconninfoOption *opts = PQconninfoParse(conninfo, NULL);
    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        if (o->val &&
            (strcmp(o->keyword, "password") == 0 || strcmp(o->keyword, "sslpassword") == 0))
            secrets_add(o->val);
    secrets_conninfo_free(opts);
}

void secrets_free_zeroed(char *s)
{
    if (s)
        explicit_bzero(s, strlen(s));
    free(s);
}

void secrets_conninfo_free(PQconninfoOption *opts)
{
    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        if (o->val)
            explicit_bzero(o->val, strlen(o->val));
    PQconninfoFree(opts);
}

static json_malloc_t json_malloc_saved;
static json_free_t json_free_saved;
static int json_wipe_depth;

static void json_free_zeroed(void *p)
{
    if (p)
        explicit_bzero(p, malloc_usable_size(p));
    json_free_saved(p);
}

void secrets_json_wipe(bool on)
{
    if (on && json_wipe_depth++ == 0) {
        json_get_alloc_funcs(&json_malloc_saved, &json_free_saved);
        json_set_alloc_funcs(json_malloc_saved, json_free_zeroed);
    } else if (!on && json_wipe_depth > 0 && --json_wipe_depth == 0) {
        json_set_alloc_funcs(json_malloc_saved, json_free_saved);
    }
}

bool secrets_kafka_key_sensitive(const char *key)
{
    /* librdkafka's own list of sensitive properties (those it redacts itself) is ssl.key.password,
     * ssl.key.pem, ssl_key, ssl.keystore.password, sasl.password, sasl.oauthbearer.config and
     * sasl.oauthbearer.client.secret, and since 2.10 sasl.oauthbearer.assertion.private.key.pem
     * and .passphrase (a relay built against it takes them); the patterns cover them and any
     * future ones named alike. */
    return strstr(key, "password") || strstr(key, "secret") || strstr(key, "token") ||
           strstr(key, "passphrase") || strstr(key, "private.key.pem") ||
           strcmp(key, "ssl.key.pem") == 0 || strcmp(key, "ssl_key") == 0 ||
           strcmp(key, "sasl.oauthbearer.config") == 0;
}

size_t secrets_scrub(char *s)
{
    size_t len = strlen(s);
    for (Secret *sec = first(); sec; sec = next_of(sec)) {
        char *p = s;
        while ((p = strstr(p, sec->value)) != NULL) {
            size_t tail = len - (size_t)(p - s) - sec->len;
            memcpy(p, "***", 3);
            memmove(p + 3, p + sec->len, tail + 1);
            len -= sec->len - 3;
            p += 3;
        }
    }
    return len;
}

bool secrets_found(const char *s)
{
    for (Secret *sec = first(); sec; sec = next_of(sec))
        if (strstr(s, sec->value))
            return true;
    return false;
}

void secrets_clear(void)
{
    atomic_store(&too_short, 0);
    secrets_count_short_anew();
    Secret *s = atomic_exchange(&head, NULL);
    while (s) {
        Secret *next = next_of(s);
        free(s);
        s = next;
    }
}

bool secrets_encoded_password_key(const char *key, size_t len)
{
    char name[16];
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (n == sizeof(name) - 1)
            return false;
        if (key[i] == '%' && i + 2 < len && isxdigit((unsigned char)key[i + 1]) &&
            isxdigit((unsigned char)key[i + 2])) {
            char hex[3] = {key[i + 1], key[i + 2], '\0'};
            name[n++] = (char)strtol(hex, NULL, 16);
            i += 2;
        } else {
            name[n++] = key[i];
        }
    }
    name[n] = '\0';
    return strcmp(name, "password") == 0 || strcmp(name, "sslpassword") == 0;
}

/* Overwrites value with "***" and NULs (its length kept: the argument area stays as laid out). */
static void wipe_value(char *value)
{
    size_t len = strlen(value);
    explicit_bzero(value, len);
    memcpy(value, "***", len < 3 ? len : 3);
}

/* Overwrites in place with '*' the user info (user and password, up to where
 * secrets_url_userinfo_end ends it) of each URL of a comma-separated list: a password shorter
 * than SECRETS_MIN_LEN is never registered, so the scrub of registered secrets would leave it;
 * the hosts stay readable. */
static void mask_url_list_userinfo(char *value)
{
    for (char *u = value; *u;) {
        size_t len = strcspn(u, ",");
        char saved = u[len];
        u[len] = '\0';
        char *sep = strstr(u, "://");
        char *auth = sep ? sep + 3 : u;
        const char *at = secrets_url_userinfo_end(auth);
        if (at)
            memset(auth, '*', (size_t)(at - auth));
        u[len] = saved;
        u += len + (saved != '\0');
    }
}

/* Whether name is one of the NULL-terminated names (NULL: none). */
static bool named_in(const char *name, const char *const *names)
{
    for (size_t i = 0; names && names[i]; i++)
        if (strcmp(name, names[i]) == 0)
            return true;
    return false;
}

void secrets_scrub_argv(const OptSpec *spec, int argc, char **argv, const char *const *whole,
                        const char *const *url_lists)
{
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0)
            continue;
        char *name = arg + 2, *eq = strchr(name, '=');
        const OptDef *opt = opts_find(spec, name, eq ? (size_t)(eq - name) : strlen(name));
        if (!opt || opt->type == OPT_BOOL)
            continue;
        char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value)
            break;
        if (named_in(opt->name, whole)) {
            wipe_value(value);
        } else if (named_in(opt->name, url_lists)) {
            mask_url_list_userinfo(value);
        } else if (opt->type == OPT_LIST) {
            char *sep = strchr(value, '=');
            if (sep) {
                *sep = '\0';
                bool sensitive = secrets_kafka_key_sensitive(value);
                *sep = '=';
                if (sensitive)
                    wipe_value(sep + 1);
            }
        }
    }
    /* Whatever else holds a registered secret (a value pasted into another option). */
    for (int i = 1; i < argc; i++) {
        size_t len = strlen(argv[i]);
        if (!secrets_found(argv[i]))
            continue;
        size_t n = secrets_scrub(argv[i]);
        explicit_bzero(argv[i] + n, len - n);
    }
}

void secrets_no_core_dumps(void)
{
    struct rlimit none = {0, 0};
    (void)setrlimit(RLIMIT_CORE, &none);
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}
