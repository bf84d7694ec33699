/* sigmask: the signals a thread of ours takes, set as it is created.
 *
 * A process's signals go to any thread that does not block them. The relay's are the event
 * loop's (libev's handlers feed its loop, and ops_free blocks SIGHUP in the main thread while it
 * ignores it, libev having just given it back its default): a thread of ours that took them would
 * die of a signal in that instant, and nothing of what it does (a name lookup, a producer's
 * destroy) needs one. The synchronous ones stay: a fault inside a library must still crash with
 * its report. librdkafka blocks every signal in its own threads the same way. */
#ifndef OUTBOX_SIGMASK_H
#define OUTBOX_SIGMASK_H

#include <signal.h>

/* Blocks every signal but the synchronous ones (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
 * SIGSYS) in the calling thread, for pthread_create to hand on to the thread it makes; *old
 * receives the mask to restore (pthread_sigmask(SIG_SETMASK, old, NULL)) right after. */
void sigmask_block_async(sigset_t *old);

#endif
