/* tls_report: what protects the relay's connections, stated at start (docs/security.md).
 *
 * libpq's default sslmode=prefer falls back to plaintext without a word, and librdkafka's default
 * security.protocol is plaintext. At start the relay says, from its configuration, whether its
 * PostgreSQL and Kafka connections will be encrypted and whether the server's identity is
 * verified; a connection to a host other than loopback (or a Unix socket) that is not verified
 * gets a warning, and with --require-tls is refused before anything connects. No name is
 * resolved here: a host is loopback when it is localhost or an address literal in 127.0.0.0/8
 * or ::1 (a name starting "127." is not). The configuration is read as the libraries read it:
 * libpq's own parser and environment defaults (host and hostaddr lists paired entry by entry; a
 * service file, which is not read, judged the worst it could be: remote, sslmode optional),
 * and librdkafka's own configuration object for the Kafka properties (its bool spellings, its
 * aliases such as metadata.broker.list, the last setting winning). */
#ifndef OUTBOX_TLS_REPORT_H
#define OUTBOX_TLS_REPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"

/* How one side's connections are protected. */
typedef enum {
    TLS_VERIFIED,   /* encrypted, and the server's certificate and name are checked */
    TLS_UNVERIFIED, /* encrypted, but anyone in the path could pose as the server */
    TLS_OPTIONAL,   /* encrypted only if the server offers it (sslmode prefer/allow) */
    TLS_PLAINTEXT,  /* never encrypted */
} TlsLevel;

typedef struct TlsSide {
    TlsLevel level;
    char mode[32];          /* sslmode, or security.protocol */
    bool remote;            /* some host is neither loopback nor a Unix socket */
    char first_remote[128]; /* the first such host, for the warning */
} TlsSide;

/* Judges the configuration: database URL (with libpq's environment defaults, PGSSLMODE,
 * PGHOST and PGHOSTADDR) and the brokers with the --kafka properties applied after them in order
 * (security.protocol, enable.ssl.certificate.verification,
 * ssl.endpoint.identification.algorithm, bootstrap.servers / metadata.broker.list). */
void tls_report_judge(const Config *cfg, TlsSide *pg, TlsSide *kafka);

/* The word for a level in the log: verified, unverified, optional or plaintext. */
const char *tls_level_name(TlsLevel level);

/* With require_tls, a side that reaches a remote host without verification is an error:
 * returns false with one line in err (naming the host), logging nothing. True otherwise. Call
 * before anything connects. */
bool tls_report_require(const Config *cfg, bool require_tls, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Logs one "connection security" line, and a warning per side that reaches a remote host
 * without verification. */
void tls_report_log(const Config *cfg);

#endif
