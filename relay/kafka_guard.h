/* kafka_guard: librdkafka properties that load code, run commands or write files.
 *
 * --kafka, --kafka-file and the config file's "kafka" object pass properties through to
 * librdkafka. A few of them turn configuration into code execution: plugin.library.paths
 * dlopen()s libraries at start-up, sasl.kerberos.kinit.cmd is a shell command, and
 * sasl.kerberos.keytab / sasl.kerberos.principal are pasted into that command's text. Whoever
 * may write the config file or the relay's environment could then run code as the relay (Kafka
 * Connect's CVE-2023-25194 is the same pattern). They are refused unless the operator names
 * them with --kafka-allow-unsafe (docs/security.md). */
#ifndef OUTBOX_KAFKA_GUARD_H
#define OUTBOX_KAFKA_GUARD_H

#include <stdbool.h>
#include <stddef.h>

/* Checks one property. allow is the value of --kafka-allow-unsafe (comma-separated property
 * names, or NULL); origin says where the property was set (config_kafka_origin: the flag, or the
 * file and line) and starts the error. Returns false with one line in err (naming the property
 * and where it was set, never its value: it may be a secret) when key is refused; true
 * otherwise. Keys are compared ignoring case and surrounding blanks. */
bool kafka_guard_check(const char *key, const char *value, const char *allow, const char *origin,
                       char *err, size_t errlen) __attribute__((warn_unused_result));

/* Checks --kafka-allow-unsafe itself: every name must be one of the guarded properties (a typo
 * must not silently allow nothing). Returns false with one line in err. */
bool kafka_guard_check_allow(const char *allow, char *err, size_t errlen)
    __attribute__((warn_unused_result));

#endif
