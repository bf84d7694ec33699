# shellcheck shell=bash
# free_port: prints a TCP port on 127.0.0.1 that nothing listens on, picked at random from
# FREE_PORT_BASE (default 20000) to FREE_PORT_BASE + FREE_PORT_SPAN - 1 (default 12000 ports, below
# the kernel's ephemeral range, so clients cannot hold one); fails after 50 tries. The tests give
# each parallel slot a range of its own (tests/lib.sh); random within it, so a port another
# process has just taken is rarely picked again. Sourced by scripts/demo.sh and tests/lib.sh.
free_port() {
    local port
    for _ in $(seq 1 50); do
        port=$((${FREE_PORT_BASE:-20000} + RANDOM % ${FREE_PORT_SPAN:-12000}))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return 0
        fi
    done
    return 1
}
