#!/bin/bash
# Proves that librdkafka properties which load code or run commands are refused unless the
# operator allows them by name (relay/kafka_guard.c, docs/security.md):
#  1. --kafka plugin.library.paths=LIB exits 2 with one line, and LIB is not loaded (its
#     constructor would create a file); the same from --kafka-file, from the config file's
#     "kafka" object (the line names the file, and the --kafka-file's line), and with the name
#     in another case;
#  2. --kafka sasl.kerberos.kinit.cmd=CMD (with GSSAPI) exits 2 with one line and CMD never runs;
#     ssl.engine.location and ssl.providers are refused too;
#  3. --kafka-allow-unsafe is honoured from flags only (from the config file: exit 2), and a name
#     it does not guard is an error (a typo must not silently allow nothing);
#  4. with --kafka-allow-unsafe NAME the property is passed on: the library is loaded, the
#     command runs.
# No PostgreSQL or broker is needed: every refusal happens before the relay touches the network.
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../../lib.sh"
t_setup

cat >"$T/evil.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void loaded(void)
{
    FILE *f = fopen(getenv("EVIL_MARK"), "w");
    if (f)
        fclose(f);
}
C
cc -shared -fPIC -o "$T/evil.so" "$T/evil.c" || fail "build the test plugin"
export EVIL_MARK=$T/loaded
COMMON=(--database-url "postgresql://nobody@127.0.0.1:1/none" --brokers 127.0.0.1:1)

# refused DESC ARGS...: the relay exits 2 with exactly one line on stderr, naming the property.
refused() {
    local desc=$1 rc
    shift
    timeout -s KILL 10 "$RELAY_BIN" run "${COMMON[@]}" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    check_eq "$desc: exit 2" 2 "$rc"
    check_eq "$desc: one line on stderr" 1 "$(wc -l <"$T/err")"
    check "$desc: the line says refused or names the rule" grep -qE 'refused|only as a flag|not a guarded' "$T/err"
}

refused "1: plugin.library.paths" --kafka "plugin.library.paths=$T/evil.so"
check "1: the plugin was not loaded" test ! -e "$T/loaded"
printf 'linger.ms=1\nplugin.library.paths = %s\n' "$T/evil.so" >"$T/kafka.properties"
refused "1: plugin.library.paths from --kafka-file" --kafka-file "$T/kafka.properties"
check "1: the refusal names the file and line, not --kafka" \
    grep -qF "kafka-file $T/kafka.properties line 2: plugin.library.paths: refused" "$T/err"
printf '{"kafka": {"plugin.library.paths": "%s"}}\n' "$T/evil.so" >"$T/config.json"
refused "1: plugin.library.paths from the config file" --config "$T/config.json"
check "1: the refusal names the config file, not --kafka" \
    grep -qF "config file $T/config.json: kafka plugin.library.paths: refused" "$T/err"
refused "1: Plugin.Library.Paths (another case)" --kafka "Plugin.Library.Paths=$T/evil.so"
check "1: the plugin was never loaded" test ! -e "$T/loaded"

refused "2: sasl.kerberos.kinit.cmd" --kafka security.protocol=SASL_PLAINTEXT \
    --kafka sasl.mechanisms=GSSAPI --kafka "sasl.kerberos.kinit.cmd=touch $T/ran"
refused "2: sasl.kerberos.principal (pasted into the kinit command)" \
    --kafka 'sasl.kerberos.principal=x;touch /tmp/never'
refused "2: ssl.engine.location" --kafka "ssl.engine.location=$T/evil.so"
refused "2: ssl.providers" --kafka "ssl.providers=legacy"
check "2: the command never ran" test ! -e "$T/ran"
check "2: the plugin was never loaded" test ! -e "$T/loaded"

printf '{"kafka-allow-unsafe": "plugin.library.paths"}\n' >"$T/allow.json"
refused "3: --kafka-allow-unsafe from the config file" --config "$T/allow.json" \
    --kafka "plugin.library.paths=$T/evil.so"
refused "3: --kafka-allow-unsafe with a name it does not guard" \
    --kafka-allow-unsafe plugin.library.pathz --kafka "plugin.library.paths=$T/evil.so"
refused "3: allowing one property does not allow another" \
    --kafka-allow-unsafe ssl.providers --kafka "plugin.library.paths=$T/evil.so"
check "3: the plugin was never loaded" test ! -e "$T/loaded"

# --- 4. the override ---
# The test library has no conf_init, so librdkafka fails after dlopen(): the relay exits 2 with
# librdkafka's reason, but the constructor has run, which is what "allowed" means here.
"$RELAY_BIN" run "${COMMON[@]}" --kafka-allow-unsafe plugin.library.paths \
    --kafka "plugin.library.paths=$T/evil.so" >"$T/out" 2>"$T/err"
check "4: with --kafka-allow-unsafe plugin.library.paths the library is loaded" test -e "$T/loaded"
check "4: and the refusal is gone (librdkafka's own error about conf_init instead)" \
    grep -q conf_init "$T/err"

relay_start "${COMMON[@]}" --kafka-allow-unsafe sasl.kerberos.kinit.cmd \
    --kafka security.protocol=SASL_PLAINTEXT --kafka sasl.mechanisms=GSSAPI \
    --kafka "sasl.kerberos.kinit.cmd=touch $T/ran"
wait_for "4: with --kafka-allow-unsafe sasl.kerberos.kinit.cmd the command runs" 15 \
    test -e "$T/ran"
relay_kill
