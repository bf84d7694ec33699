#include "tls_report.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "db.h"
#include "log.h"
#include "secrets.h"

const char *tls_level_name(TlsLevel level)
{
    switch (level) {
    case TLS_VERIFIED:
        return "verified";
    case TLS_UNVERIFIED:
        return "unverified";
    case TLS_OPTIONAL:
        return "optional";
    case TLS_PLAINTEXT:
        return "plaintext";
    }
    return "?";
}

/* True for a host that keeps the traffic on this machine: a Unix socket directory, localhost,
 * or an address literal in 127.0.0.0/8 or ::1 (also as ::ffff:127.x.x.x). Nothing is resolved,
 * so a name is local only when it is localhost: "127.attacker.example" is a name like any other,
 * and resolves wherever its owner wants. */
static bool host_local(const char *host, size_t len)
{
    char h[256];
    if (len == 0)
        return true; /* libpq's default: the Unix socket */
    if (len >= sizeof(h))
        return false;
    memcpy(h, host, len);
    h[len] = '\0';
    if (h[0] == '/' || h[0] == '@')
        return true;
    if (h[0] == '[' && len > 2 && h[len - 1] == ']') {
        memmove(h, h + 1, len - 2);
        h[len - 2] = '\0';
    }
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, h, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, h, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return strcasecmp(h, "localhost") == 0 || strcasecmp(h, "localhost.") == 0;
}

/* The value libpq would use for keyword: the string's own, else its environment default. */
static const char *pq_value(const PQconninfoOption *parsed, const PQconninfoOption *defaults,
                            const char *keyword)
{
    for (const PQconninfoOption *o = parsed; o && o->keyword; o++)
        if (strcmp(o->keyword, keyword) == 0 && o->val && *o->val)
            return o->val;
    for (const PQconninfoOption *o = defaults; o && o->keyword; o++)
        if (strcmp(o->keyword, keyword) == 0 && o->envvar && getenv(o->envvar) && o->val)
            return o->val;
    return NULL;
}

/* Marks side remote, naming the host, when the entry h[0, hl) is not local. */
static void judge_one(TlsSide *side, const char *h, size_t hl)
{
    if (!host_local(h, hl) && !side->remote) {
        side->remote = true;
        snprintf(side->first_remote, sizeof(side->first_remote), "%.*s", (int)(hl < 120 ? hl : 120),
                 h);
    }
}

/* The entry number idx of a comma-separated list, spaces around it dropped: sets *out and
 * *outlen, returns false past the end. */
static bool list_entry(const char *list, size_t idx, const char **out, size_t *outlen)
{
    const char *p = list ? list : "";
    for (size_t i = 0; i < idx; i++) {
        p = strchr(p, ',');
        if (!p)
            return false;
        p++;
    }
    size_t len = strcspn(p, ",");
    while (len > 0 && (*p == ' ' || *p == '\t'))
        p++, len--;
    while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
        len--;
    *out = p;
    *outlen = len;
    return true;
}

/* Kafka's broker list: [SCHEME://]HOST[:PORT] or [V6]:PORT entries, empty ones skipped (as
 * librdkafka does). */
static void judge_brokers(TlsSide *side, const char *list)
{
    const char *h;
    size_t hl;
    for (size_t i = 0; list_entry(list, i, &h, &hl); i++) {
        for (size_t j = 0; j + 2 < hl; j++)
            if (h[j] == ':' && h[j + 1] == '/' && h[j + 2] == '/') {
                h += j + 3;
                hl -= j + 3;
                break;
            }
        const char *colon = NULL;
        for (size_t j = 0; j < hl; j++)
            if (h[j] == ':')
                colon = h + j;
        if (colon && (h[0] != '[' || colon[-1] == ']'))
            hl = (size_t)(colon - h);
        if (hl > 0)
            judge_one(side, h, hl);
    }
}

/* libpq's host and hostaddr lists pair up entry by entry: where a hostaddr entry is given libpq
 * connects to it (host then only names the server for TLS), where it is empty libpq resolves
 * the host entry of the same position, and an empty host entry is the default Unix socket. */
static void judge_pg_hosts(TlsSide *side, const char *hosts, const char *addrs)
{
    const char *h, *a;
    size_t hl, al;
    for (size_t i = 0;; i++) {
        bool has_h = list_entry(hosts, i, &h, &hl), has_a = list_entry(addrs, i, &a, &al);
        if (!has_h && !has_a)
            break;
        if (has_a && al > 0)
            judge_one(side, a, al);
        else
            judge_one(side, has_h ? h : "", has_h ? hl : 0);
    }
    /* Named as pg.c names a host: a host holding an '@' is the tail of a password whose '@' was
     * not percent-encoded (postgresql://u:pw@s3c@db: libpq's host "s3c@db"), and a tail under
     * SECRETS_MIN_LEN escapes the scrub of registered secrets (db_host_shown). */
    const char *shown = db_host_shown(side->first_remote);
    if (shown != side->first_remote)
        snprintf(side->first_remote, sizeof(side->first_remote), "%s", shown);
}

/* "..." for a first remote host that is a piece of a URL's password as meant, cut off by libpq
 * at its first '@' and split at ',' (postgresql://u:x@abc,@127.0.0.1/d: hosts "abc" and
 * "@127.0.0.1"), as db_connect's errors hide it (db_hide_password_tail): a piece under
 * SECRETS_MIN_LEN escapes the scrub of registered secrets. */
static void hide_password_piece(TlsSide *side, const char *conninfo)
{
    char quoted[sizeof(side->first_remote) + 2], as_given[sizeof(quoted)];
    snprintf(quoted, sizeof(quoted), "\"%s\"", side->first_remote);
    memcpy(as_given, quoted, sizeof(quoted));
    db_hide_password_tail(quoted, conninfo);
    if (strcmp(quoted, as_given) != 0)
        snprintf(side->first_remote, sizeof(side->first_remote), "...");
}

/* A service (service=NAME in the string, or PGSERVICE) fills in, from pg_service.conf, whatever
 * the string leaves unset, ahead of the environment: host, hostaddr, sslmode. This parse does not
 * read that file, so what it would fill is unknown, and judged the worst it could be: an sslmode
 * the string does not set is only "optional" (not PGSSLMODE's, which the file's beats), and
 * unless the string gives every host its hostaddr the service may point it anywhere (a remote
 * host, "service NAME"). Setting them in the string makes the judgement exact again. */
static void judge_pg_service(TlsSide *side, const PQconninfoOption *parsed, const char *service)
{
    if (!pq_value(parsed, NULL, "sslmode")) {
        snprintf(side->mode, sizeof(side->mode), "unset (service)");
        if (side->level != TLS_PLAINTEXT)
            side->level = TLS_OPTIONAL;
    }
    const char *addrs = pq_value(parsed, NULL, "hostaddr");
    bool every_addr = addrs != NULL;
    const char *a;
    size_t al;
    for (size_t i = 0; every_addr && list_entry(addrs, i, &a, &al); i++)
        every_addr = al > 0;
    if (!every_addr && !side->remote) {
        side->remote = true;
        snprintf(side->first_remote, sizeof(side->first_remote), "service %.100s", service);
    }
}

static void judge_pg(const char *conninfo, TlsSide *side)
{
    memset(side, 0, sizeof(*side));
    PQconninfoOption *parsed = PQconninfoParse(conninfo, NULL);
    PQconninfoOption *defaults = PQconndefaults();
    const char *mode = pq_value(parsed, defaults, "sslmode");
    if (!mode)
        mode = "prefer";
    snprintf(side->mode, sizeof(side->mode), "%s", mode);
    side->level = strcmp(mode, "verify-full") == 0 ? TLS_VERIFIED
                  /* verify-ca checks the chain, not that the certificate names this server */
                  : strcmp(mode, "verify-ca") == 0 || strcmp(mode, "require") == 0 ? TLS_UNVERIFIED
                  : strcmp(mode, "disable") == 0                                   ? TLS_PLAINTEXT
                                                                                   : TLS_OPTIONAL;
    judge_pg_hosts(side, pq_value(parsed, defaults, "host"),
                   pq_value(parsed, defaults, "hostaddr"));
    if (side->remote)
        hide_password_piece(side, conninfo);
    const char *service = pq_value(parsed, defaults, "service");
    if (service)
        judge_pg_service(side, parsed, service);
    /* gssencmode=require: libpq connects only with GSSAPI encryption, or not at all (it never
     * falls back to sslmode's TLS or to clear text), and it asks Kerberos for mutual
     * authentication, so the server proves it holds the key of the service principal of the host
     * named (postgres/HOST): as private and as authenticated as verify-full. prefer (libpq's
     * default when built with GSSAPI) proves nothing before connecting and is judged by sslmode
     * as before. PGGSSENCMODE counts only without a service, whose file would beat it. */
    const char *gss = pq_value(parsed, service ? NULL : defaults, "gssencmode");
    if (gss && strcmp(gss, "require") == 0) {
        side->level = TLS_VERIFIED;
        snprintf(side->mode, sizeof(side->mode), "gssencmode=require");
    }
    secrets_conninfo_free(parsed);
    secrets_conninfo_free(defaults);
}

/* The value librdkafka holds for name in conf, canonical (bools as true/false, enums in lower
 * case, an alias's value under either name); "" when unset. */
static void kafka_get(const rd_kafka_conf_t *conf, const char *name, char *out, size_t outlen)
{
    size_t n = outlen;
    if (rd_kafka_conf_get(conf, name, out, &n) != RD_KAFKA_CONF_OK)
        out[0] = '\0';
}

/* librdkafka itself reads the properties: the brokers first, then every --kafka entry in order,
 * as kafka_conf_build does (relay/io/kafka.c). So every spelling it accepts (f, F, 0, False for
 * a bool; SSL for ssl), every alias (metadata.broker.list is bootstrap.servers) and the rule
 * that the last setting wins are the ones the producer will use, not a copy of them. Entries it
 * refuses are skipped here: kafka_conf_build refuses them before anything connects. */
static void judge_kafka(const Config *cfg, TlsSide *side)
{
    memset(side, 0, sizeof(*side));
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    char errstr[512];
    if (cfg->brokers)
        rd_kafka_conf_set(conf, "bootstrap.servers", cfg->brokers, errstr, sizeof(errstr));
    for (size_t i = 0; i < cfg->kafka.len; i++)
        rd_kafka_conf_set(conf, cfg->kafka.items[i].key, cfg->kafka.items[i].value, errstr,
                          sizeof(errstr));
    char proto[32], verify[16], ident[16];
    kafka_get(conf, "security.protocol", proto, sizeof(proto));
    kafka_get(conf, "enable.ssl.certificate.verification", verify, sizeof(verify));
    kafka_get(conf, "ssl.endpoint.identification.algorithm", ident, sizeof(ident));
    snprintf(side->mode, sizeof(side->mode), "%s", *proto ? proto : "plaintext");
    bool tls = strcmp(proto, "ssl") == 0 || strcmp(proto, "sasl_ssl") == 0;
    bool verified = strcmp(verify, "false") != 0 && strcmp(ident, "none") != 0;
    side->level = !tls ? TLS_PLAINTEXT : verified ? TLS_VERIFIED : TLS_UNVERIFIED;
    /* The value can be long (many brokers); ask for its size first. */
    size_t n = 0;
    if (rd_kafka_conf_get(conf, "bootstrap.servers", NULL, &n) == RD_KAFKA_CONF_OK && n > 0) {
        char *servers = malloc(n);
        if (servers &&
            rd_kafka_conf_get(conf, "bootstrap.servers", servers, &n) == RD_KAFKA_CONF_OK)
            judge_brokers(side, servers);
        else
            judge_one(side, "?", 1); /* unknown: judged remote */
        free(servers);
    }
    rd_kafka_conf_destroy(conf);
}

/* The host of one registry URL (u, ul bytes), as libcurl parses it for the registry client
 * (http:// when it names no scheme), into out ("[...]" for IPv6); "(unparsable URL)" when curl
 * cannot parse it (the registry client fails on it too). The URL's password goes nowhere. */
static void registry_host(const char *u, size_t ul, char *out, size_t outlen)
{
    char *url = strndup(u, ul), *host = NULL;
    CURLU *parsed = url ? curl_url() : NULL;
    bool ok = parsed &&
              curl_url_set(parsed, CURLUPART_URL, url,
                           CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK &&
              curl_url_get(parsed, CURLUPART_HOST, &host, 0) == CURLUE_OK && *host;
    snprintf(out, outlen, "%s", ok ? host : "(unparsable URL)");
    curl_free(host);
    curl_url_cleanup(parsed);
    if (url)
        explicit_bzero(url, ul);
    free(url);
}

/* The Schema Registry's URLs, when the payloads go through it (--value-format avro or
 * json-schema): an https URL is verified (the client never turns verification off), any other
 * is plain http (curl's default scheme), remote unless its host is loopback. The side's level
 * is the weakest URL's. */
static void judge_registry(const Config *cfg, TlsSide *side)
{
    memset(side, 0, sizeof(*side));
    side->level = TLS_VERIFIED;
    snprintf(side->mode, sizeof(side->mode), "https");
    if (cfg->value_format == VALUE_JSON || !cfg->schema_registry_url)
        return;
    const char *u;
    size_t ul;
    for (size_t i = 0; list_entry(cfg->schema_registry_url, i, &u, &ul); i++) {
        if (ul >= 8 && strncasecmp(u, "https://", 8) == 0)
            continue;
        side->level = TLS_PLAINTEXT;
        snprintf(side->mode, sizeof(side->mode), "http");
        char host[256];
        registry_host(u, ul, host, sizeof(host));
        judge_one(side, host, strlen(host));
    }
}

void tls_report_judge(const Config *cfg, TlsSide *pg, TlsSide *kafka)
{
    judge_pg(cfg->database_url, pg);
    judge_kafka(cfg, kafka);
}

bool tls_report_require(const Config *cfg, bool require_tls, char *err, size_t errlen)
{
    TlsSide pg, kafka;
    tls_report_judge(cfg, &pg, &kafka);
    if (require_tls && pg.remote && pg.level != TLS_VERIFIED) {
        snprintf(err, errlen,
                 "--require-tls: PostgreSQL host %s with sslmode=%s is not verified (use "
                 "sslmode=verify-full and sslrootcert, or gssencmode=require)",
                 pg.first_remote, pg.mode);
        log_one_line(err);
        return false;
    }
    TlsSide registry;
    judge_registry(cfg, &registry);
    if (require_tls && registry.remote && registry.level != TLS_VERIFIED) {
        snprintf(err, errlen,
                 "--require-tls: Schema Registry host %s over plain http is not encrypted (use an "
                 "https URL, with --schema-registry-ca-file for a private CA)",
                 registry.first_remote);
        log_one_line(err);
        return false;
    }
    if (require_tls && kafka.remote && kafka.level != TLS_VERIFIED) {
        snprintf(err, errlen,
                 "--require-tls: Kafka broker %s with security.protocol=%s is %s (use ssl or "
                 "sasl_ssl with certificate and hostname verification)",
                 kafka.first_remote, kafka.mode, tls_level_name(kafka.level));
        log_one_line(err);
        return false;
    }
    return true;
}

void tls_report_log(const Config *cfg)
{
    TlsSide pg, kafka;
    tls_report_judge(cfg, &pg, &kafka);
    char q[160], qm[80], qk[80];
    log_info("connection security",
             "postgres=%s postgres_sslmode=%s postgres_remote=%s kafka=%s "
             "kafka_security_protocol=%s kafka_remote=%s",
             tls_level_name(pg.level), log_quote(pg.mode, qm, sizeof(qm)), pg.remote ? "yes" : "no",
             tls_level_name(kafka.level), log_quote(kafka.mode, qk, sizeof(qk)),
             kafka.remote ? "yes" : "no");
    if (pg.remote && pg.level != TLS_VERIFIED)
        log_warn("postgres connection not verified",
                 "host=%s sslmode=%s hint=\"anyone on the network path can read or pose as the "
                 "server; use sslmode=verify-full (or --require-tls to refuse)\"",
                 log_quote(pg.first_remote, q, sizeof(q)), qm);
    TlsSide registry;
    judge_registry(cfg, &registry);
    if (registry.remote && registry.level != TLS_VERIFIED)
        log_warn("schema registry connection not encrypted",
                 "host=%s hint=\"anyone on the network path can read the schemas and any "
                 "password sent, or pose as the registry; use an https URL (or --require-tls to "
                 "refuse)\"",
                 log_quote(registry.first_remote, q, sizeof(q)));
    if (kafka.remote && kafka.level != TLS_VERIFIED)
        log_warn("kafka connection not verified",
                 "broker=%s security_protocol=%s hint=\"anyone on the network path can read or "
                 "pose as the broker; use ssl or sasl_ssl with verification (or --require-tls to "
                 "refuse)\"",
                 log_quote(kafka.first_remote, q, sizeof(q)), qk);
}
