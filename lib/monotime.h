/* monotime: the monotonic clock, for every duration and deadline the relay compares by hand.
 *
 * libev's ev_now() is wall-clock time: it jumps with an NTP step or a resumed VM, and a deadline
 * or an idle time computed from it jumps too (a clock stepped back an hour once kept a session
 * polling every 2 ms for that hour, believing rows had just come). libev's own timers already run
 * on the monotonic clock; values computed here must too. Wall-clock time is only for what is
 * shown to people or stored. */
#ifndef OUTBOX_MONOTIME_H
#define OUTBOX_MONOTIME_H

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC): only differences mean anything.
 * Never fails (CLOCK_MONOTONIC is always there on Linux); cheap (vDSO, no system call). */
double monotime_now(void);

#endif
