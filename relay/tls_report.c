#include "tls_report.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"

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
 * 127.0.0.0/8 or ::1 (written as such: nothing is resolved). */
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
    return strcasecmp(h, "localhost") == 0 || strncmp(h, "127.", 4) == 0 || strcmp(h, "::1") == 0 ||
           strcasecmp(h, "localhost.") == 0;
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

/* Marks side remote when some entry of the comma-separated list is not local; strip_port drops
 * a ":PORT" (and a "SCHEME://" prefix), as in Kafka's broker lists. */
static void judge_hosts(TlsSide *side, const char *list, bool kafka)
{
    for (const char *p = list ? list : "";;) {
        size_t len = strcspn(p, ",");
        const char *h = p;
        size_t hl = len;
        while (hl > 0 && (*h == ' ' || *h == '\t'))
            h++, hl--;
        while (hl > 0 && (h[hl - 1] == ' ' || h[hl - 1] == '\t'))
            hl--;
        if (kafka) {
            for (size_t i = 0; i + 2 < hl; i++)
                if (h[i] == ':' && h[i + 1] == '/' && h[i + 2] == '/') {
                    h += i + 3;
                    hl -= i + 3;
                    break;
                }
            /* HOST:PORT, [V6]:PORT */
            const char *colon = NULL;
            for (size_t i = 0; i < hl; i++)
                if (h[i] == ':')
                    colon = h + i;
            if (colon && (h[0] != '[' || colon[-1] == ']'))
                hl = (size_t)(colon - h);
        }
        if ((kafka ? hl > 0 : true) && !host_local(h, hl) && !side->remote) {
            side->remote = true;
            snprintf(side->first_remote, sizeof(side->first_remote), "%.*s",
                     (int)(hl < 120 ? hl : 120), h);
        }
        if (p[len] == '\0')
            break;
        p += len + 1;
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
    /* hostaddr, when given, is where libpq connects; host then only names the server. */
    const char *hostaddr = pq_value(parsed, defaults, "hostaddr");
    judge_hosts(side, hostaddr ? hostaddr : pq_value(parsed, defaults, "host"), false);
    PQconninfoFree(parsed);
    PQconninfoFree(defaults);
}

/* The last value of a --kafka property (later entries win, as in librdkafka). */
static const char *kafka_value(const Config *cfg, const char *key)
{
    const char *v = NULL;
    for (size_t i = 0; i < cfg->kafka.len; i++)
        if (strcasecmp(cfg->kafka.items[i].key, key) == 0)
            v = cfg->kafka.items[i].value;
    return v;
}

static void judge_kafka(const Config *cfg, TlsSide *side)
{
    memset(side, 0, sizeof(*side));
    const char *proto = kafka_value(cfg, "security.protocol");
    if (!proto)
        proto = "plaintext";
    snprintf(side->mode, sizeof(side->mode), "%s", proto);
    bool tls = strcasecmp(proto, "ssl") == 0 || strcasecmp(proto, "sasl_ssl") == 0;
    const char *verify = kafka_value(cfg, "enable.ssl.certificate.verification");
    const char *ident = kafka_value(cfg, "ssl.endpoint.identification.algorithm");
    bool verified = !(verify && (strcasecmp(verify, "false") == 0 || strcmp(verify, "0") == 0)) &&
                    !(ident && strcasecmp(ident, "none") == 0);
    side->level = !tls ? TLS_PLAINTEXT : verified ? TLS_VERIFIED : TLS_UNVERIFIED;
    const char *servers = kafka_value(cfg, "bootstrap.servers");
    if (!servers)
        servers = kafka_value(cfg, "metadata.broker.list");
    judge_hosts(side, servers ? servers : cfg->brokers, true);
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
                 "sslmode=verify-full and sslrootcert)",
                 pg.first_remote, pg.mode);
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
    if (kafka.remote && kafka.level != TLS_VERIFIED)
        log_warn("kafka connection not verified",
                 "broker=%s security_protocol=%s hint=\"anyone on the network path can read or "
                 "pose as the broker; use ssl or sasl_ssl with verification (or --require-tls to "
                 "refuse)\"",
                 log_quote(kafka.first_remote, q, sizeof(q)), qk);
}
