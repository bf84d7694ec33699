#!/bin/sh
# Checks that the code's floors hold (docs/architecture.md#floors): every #include "x.h" of a source
# file must resolve to a floor that file may depend on. Headers are included by bare name, so x.h
# is looked up in the includer's own directory first, then in every floor. Prints one line per
# violation and exits 1 if there is any; run by `make test` (and so by CI).
#
#   lib/            depends on nothing of ours
#   relay/outbox/   lib
#   relay/          (config) lib, outbox            relay/main.c: anything
#   relay/io/       lib, relay (config)
#   relay/engine/   lib, relay, outbox, io           and service/metrics.h alone (below)
#   relay/service/  lib, relay, outbox, io, engine   (metrics, ops, readiness, reload, sdnotify, upkeep)
#   relay/cmd/      lib, relay, outbox, io           never the engine nor the service
#   producer-demo/, consumer-demo/   lib
#
# The one header that reaches up: the engine counts what happens where it happens (a call each,
# like a Prometheus client's default registry), so its files include relay/service/metrics.h.
# The registry and its rendering stay one module beside the endpoint that serves them (ops);
# the engine calls the counting functions and reads nothing back. Any other service header in
# the engine is a violation.
set -eu
cd "$(dirname "$0")/.."

FLOORS="lib relay relay/outbox relay/io relay/engine relay/service relay/cmd producer-demo consumer-demo"

allowed() { # allowed DIR: the floors DIR may include from, besides itself
    case "$1" in
    lib) echo "" ;;
    relay/outbox) echo "lib" ;;
    relay) echo "lib relay/outbox" ;;
    relay/io) echo "lib relay" ;;
    relay/engine) echo "lib relay relay/outbox relay/io" ;;
    relay/service) echo "lib relay relay/outbox relay/io relay/engine" ;;
    relay/cmd) echo "lib relay relay/outbox relay/io" ;;
    producer-demo | consumer-demo) echo "lib" ;;
    esac
}

where() { # where DIR HEADER: the floor that provides HEADER for a file of DIR, or "" if none
    if [ -f "$1/$2" ]; then
        echo "$1"
        return
    fi
    for floor in $FLOORS; do
        if [ -f "$floor/$2" ]; then
            echo "$floor"
            return
        fi
    done
    echo ""
}

bad=0
for dir in $FLOORS; do
    for file in "$dir"/*.c "$dir"/*.h; do
        [ -f "$file" ] || continue
        [ "$file" = relay/main.c ] && continue
        for header in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$file"); do
            floor=$(where "$dir" "$header")
            [ -z "$floor" ] && continue # generated (bin/gen) or system
            [ "$floor" = "$dir" ] && continue
            # The engine's counting calls (see the top of this file).
            [ "$dir/$floor/$header" = relay/engine/relay/service/metrics.h ] && continue
            case " $(allowed "$dir") " in
            *" $floor "*) ;;
            *)
                echo "check-floors: $file includes $floor/$header, but $dir/ may depend only on: $(allowed "$dir")" >&2
                bad=1
                ;;
            esac
        done
    done
done
if [ "$bad" -eq 0 ]; then
    echo "check-floors: every include respects the floors"
fi
exit "$bad"
