#include "sigmask.h"

#include <pthread.h>
#include <stddef.h>

void sigmask_block_async(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    static const int synchronous[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
    for (size_t i = 0; i < sizeof(synchronous) / sizeof(synchronous[0]); i++)
        sigdelset(&all, synchronous[i]);
    pthread_sigmask(SIG_SETMASK, &all, old);
}
