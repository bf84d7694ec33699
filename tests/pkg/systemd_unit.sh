#!/bin/bash
# Proves the installed unit works under a real systemd, sandbox and all: a Debian 12 minbase
# container (systemd-nspawn -b; this machine's PID 1 is not systemd) with systemd and the built
# .deb installed, its relay reaching this test's PostgreSQL and broker over the shared network.
#  1. with /etc/outbox-relay/database-url missing, the unit is skipped, not failed
#     (ConditionPathExists=);
#  2. with it: the start job completes (Type=notify: READY=1), as the dynamic user, with
#     STATUS= and the watchdog set; 300 rows are delivered; /readyz answers on relay.json's address;
#     `systemctl reload` (ExecReload=/bin/kill, which only procps ships: the package must depend
#     on it, as minbase lacks it) makes the relay re-read relay.json;
#  3. `systemctl stop`: exit 0, Result=success;
#  4. a configuration the relay refuses (exit 2), or a credential file gone (kafka.properties:
#     LoadCredential= fails, exit 243), leaves the unit failed, not restarting
#     (RestartPreventExitStatus=2 243);
#  5. the template outbox-relay@second, with /etc/outbox-relay/second.json and
#     second.database-url, starts (READY=1) and stops like the unit;
#  6. the install said why the unit stays skipped (postinst), and `dpkg --purge` leaves nothing in
#     /etc/outbox-relay: not relay.json, not the database URL files (a password), not the rest.
# Not part of `make test`: root, systemd-nspawn, and the .deb in bin/deb (make package-test).
# The Debian base is the one `make fresh-test` caches (debootstrap when there is none yet).
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || fail "runs as root (systemd-nspawn)"
DEB=$(ls "$ROOT"/bin/deb/outbox-relay_*.deb 2>/dev/null | head -n 1)
[ -n "$DEB" ] || fail "a built package in bin/deb (make package)"
CACHE=/var/cache/outbox-relay
BASE=$CACHE/bookworm-minbase.tar.gz
MIRROR=http://deb.debian.org/debian
t_setup

if [ ! -s "$BASE" ]; then
    echo "# no cached Debian base: debootstrap --variant=minbase bookworm (a few minutes, once)"
    debootstrap --variant=minbase bookworm "$T/base" "$MIRROR" >"$T/debootstrap.log" 2>&1 ||
        fail "debootstrap" "$(tail -n 3 "$T/debootstrap.log")"
    mkdir -p "$CACHE/debs"
    tar -C "$T/base" --numeric-owner -czf "$BASE.tmp" . && mv "$BASE.tmp" "$BASE"
    rm -rf "$T/base"
fi
C=$T/container
mkdir -p "$C" "$CACHE/debs"
tar -C "$C" --numeric-owner -xzf "$BASE" || fail "unpack the Debian base"
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
    "$MIRROR" "$MIRROR" "$MIRROR" >"$C/etc/apt/sources.list"
cp "$DEB" "$C/root/"
# apt inside the base, with the .deb files fresh-chroot keeps (downloaded once) and /proc; both
# unmounted again before the container boots.
mount --bind "$CACHE/debs" "$C/var/cache/apt/archives" && mount -t proc proc "$C/proc" ||
    fail "mount /proc and the .deb cache into the container root"
# The .deb cache is shared with make fresh-test's chroots, whose apt may hold its lock for minutes:
# wait for it (bounded: 30 tries, 10 s apart) rather than fail at once.
for try in $(seq 1 30); do
    # shellcheck disable=SC2016 # expanded inside the chroot
    chroot "$C" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends \
            systemd systemd-sysv dbus /root/'"$(basename "$DEB")" >"$T/apt.log" 2>&1
    apt_rc=$?
    [ "$apt_rc" != 0 ] && grep -q 'Could not get lock' "$T/apt.log" || break
    echo "# the shared .deb cache is locked by another apt (try $try of 30), waiting 10 s"
    sleep 10
done
umount "$C/proc" "$C/var/cache/apt/archives"
[ "$apt_rc" = 0 ] || fail "install systemd and the package in the container" "$(tail -n 3 "$T/apt.log")"
ok "container root: systemd and $(basename "$DEB") installed"
check "6: the install says the unit stays skipped until the database URL file exists" grep -q \
    'the service stays skipped (not failed) until /etc/outbox-relay/database-url' "$T/apt.log"

pg_start
broker_start 1
relay_migrate 2>"$T/migrate.log" || fail "migrate"
psql_q "CREATE ROLE relay_login LOGIN IN ROLE outbox_relay" || fail "create the relay's login role"
psql_q "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'order', 'o-' || (g % 10), 'x', jsonb_build_object('seq', g)
        FROM generate_series(1, 300) AS g"
printf 'KAFKA_BROKERS=%s\n' "$BROKERS" >"$C/etc/outbox-relay/environment"
metrics=$(jq -r '."metrics-listen"' "$C/etc/outbox-relay/relay.json")

# --register=no --keep-unit: there is no systemd on this side to register with.
systemd-nspawn -D "$C" -b --register=no --keep-unit -q >"$T/nspawn.log" 2>&1 &
NSPAWN=$!
_t_track "$NSPAWN"
container_init() { pgrep -P "$NSPAWN" | head -n 1; }
booted() {
    local pid
    pid=$(container_init)
    [ -n "$pid" ] && nsenter -t "$pid" -m -u -i -n -p -- systemctl is-system-running 2>/dev/null |
        grep -qE '^(running|degraded)$'
}
wait_for "the container's systemd has booted" 90 booted || { tail -n 20 "$T/nspawn.log"; exit 1; }
INIT=$(container_init)
inside() { nsenter -t "$INIT" -m -u -i -n -p -- "$@"; }
prop() { inside systemctl show outbox-relay -P "$1"; }

# --- 1. ---
check_eq "1: no database-url file: the unit is skipped (ConditionPathExists=)" "inactive no" \
    "$(inside systemctl is-active outbox-relay) $(prop ConditionResult)"

# --- 2. ---
printf 'postgresql://relay_login@127.0.0.1:%s/outbox\n' "$PGPORT" >"$C/etc/outbox-relay/database-url"
chmod 600 "$C/etc/outbox-relay/database-url"
check "2: systemctl start returns once the relay sent READY=1" \
    timeout 120 nsenter -t "$INIT" -m -u -i -n -p -- systemctl start outbox-relay
check_eq "2: active, running" "active running" "$(prop ActiveState) $(prop SubState)"
check_eq "2: the dynamic user, no capabilities" "outbox-relay " "$(prop User) $(prop CapabilityBoundingSet)"
check_eq "2: the watchdog is armed" 30s "$(prop WatchdogUSec)"
status_ready() { prop StatusText | grep -qE '^ready: [0-9]+ lanes owned'; }
wait_for "2: STATUS= in systemctl status: ready" 30 status_ready
wait_for "2: every row gets sent_at" 60 no_unsent_rows
check_eq "2: /readyz on relay.json's address" ready "$(curl -fsS "http://$metrics/readyz")"
inside journalctl -u outbox-relay --no-pager -o cat -n 200 >"$T/journal.log" 2>&1
check "2: no sandbox denial in the log (EPERM, Operation not permitted)" \
    lacks "$T/journal.log" "Operation not permitted"
check "2: systemctl reload (ExecReload= sends SIGHUP)" inside systemctl reload outbox-relay
reloaded() {
    inside journalctl -u outbox-relay --no-pager -o cat -n 200 2>/dev/null |
        grep -q 'msg="configuration reloaded"'
}
wait_for "2: the relay re-read relay.json (configuration reloaded)" 30 reloaded
check_eq "2: still active after the reload" active "$(prop ActiveState)"

# --- 3. ---
check "3: systemctl stop" inside systemctl stop outbox-relay
check_eq "3: stopped cleanly: exit 0, Result=success" "0 success inactive" \
    "$(prop ExecMainStatus) $(prop Result) $(prop ActiveState)"

# --- 4. ---
cp "$C/etc/outbox-relay/relay.json" "$T/relay.json"
echo '{"no-such-option": 1}' >"$C/etc/outbox-relay/relay.json"
inside systemctl start outbox-relay >/dev/null 2>&1
check_eq "4: a refused configuration (exit 2) fails the unit, which does not restart" \
    "2 failed 0" "$(prop ExecMainStatus) $(prop ActiveState) $(prop NRestarts)"
cp "$T/relay.json" "$C/etc/outbox-relay/relay.json"
mv "$C/etc/outbox-relay/kafka.properties" "$T/kafka.properties"
inside systemctl start outbox-relay >/dev/null 2>&1
check_eq "4: a credential file gone (kafka.properties: exit 243) fails the unit, which does not restart" \
    "243 failed 0" "$(prop ExecMainStatus) $(prop ActiveState) $(prop NRestarts)"
mv "$T/kafka.properties" "$C/etc/outbox-relay/kafka.properties"

# --- 5. ---
port2=$(free_port) || fail "a free port for the second relay's metrics"
printf '{"brokers": "%s", "metrics-listen": "127.0.0.1:%s"}\n' "$BROKERS" "$port2" \
    >"$C/etc/outbox-relay/second.json"
cp "$C/etc/outbox-relay/database-url" "$C/etc/outbox-relay/second.database-url"
check "5: systemctl start outbox-relay@second returns once it sent READY=1" \
    timeout 120 nsenter -t "$INIT" -m -u -i -n -p -- systemctl start outbox-relay@second
check_eq "5: active, running" "active running" \
    "$(inside systemctl show outbox-relay@second -P ActiveState) $(inside systemctl show outbox-relay@second -P SubState)"
# READY=1 comes with the sessions; /readyz waits for lanes too (as part 2 waits for STATUS=).
second_ready() { [ "$(curl -fsS "http://127.0.0.1:$port2/readyz" 2>/dev/null)" = ready ]; }
wait_for "5: /readyz on second.json's address says ready" 30 second_ready
check "5: systemctl stop outbox-relay@second" inside systemctl stop outbox-relay@second
check_eq "5: stopped cleanly" "0 success" \
    "$(inside systemctl show outbox-relay@second -P ExecMainStatus) $(inside systemctl show outbox-relay@second -P Result)"

# --- 6. ---
check "6: dpkg --purge" inside env DEBIAN_FRONTEND=noninteractive dpkg --purge outbox-relay
check_eq "6: nothing left in /etc/outbox-relay" "" "$(ls -A "$C/etc/outbox-relay" 2>/dev/null)"
check "6: not even the directory" test ! -e "$C/etc/outbox-relay"

inside systemctl poweroff >/dev/null 2>&1
_poll 60 _t_dead "$NSPAWN" || not_ok "the container powers off within 60s"
