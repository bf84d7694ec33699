/* Unit tests for ops.c's SIGHUP handling: the disposition ops_free leaves behind, and the moment
 * it changes it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <ev.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "ops.h"

/* Set while ops_free runs: a SIGHUP is then raised right after anything gives SIGHUP back its
 * default action, as if one had been sent at that instant. */
static volatile sig_atomic_t raise_on_default;

/* signal(), as libev's ev_signal_stop calls it (this program's definition comes before libc's
 * for the shared libraries too): the real one, then the SIGHUP above when it is due. */
sighandler_t signal(int sig, sighandler_t handler)
{
    sighandler_t (*real)(int, sighandler_t) =
        (sighandler_t(*)(int, sighandler_t))dlsym(RTLD_NEXT, "signal");
    sighandler_t old = real(sig, handler);
    if (raise_on_default && sig == SIGHUP && handler == SIG_DFL)
        raise(SIGHUP);
    return old;
}

/* What the child of test_ops_free_sighup says by its exit status. */
enum { CHILD_OK = 0, CHILD_NOT_IGNORED = 3, CHILD_STILL_BLOCKED = 4, CHILD_NO_OPS = 5 };

/* The relay's start and end as far as SIGHUP goes (main.c blocks it first thing, ops_start lets
 * it through with the reload handler in, ops_free ends reloads), a SIGHUP arriving as libev's
 * ev_signal_stop restores its default. Runs in a child: the old code died of it. */
static int ops_cycle(void)
{
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    sigprocmask(SIG_BLOCK, &hup, NULL);
    struct ev_loop *loop = ev_default_loop(EVFLAG_AUTO);
    Config cfg;
    memset(&cfg, 0, sizeof(cfg));
    char err[256];
    Ops *ops = loop ? ops_new(loop, &cfg, 0, NULL, err, sizeof(err)) : NULL;
    if (!ops)
        return CHILD_NO_OPS;
    ops_start_databases(ops, NULL);
    raise_on_default = 1;
    ops_free(ops);
    raise_on_default = 0;
    struct sigaction now;
    sigset_t mask;
    sigaction(SIGHUP, NULL, &now);
    sigprocmask(SIG_BLOCK, NULL, &mask);
    if (now.sa_handler != SIG_IGN)
        return CHILD_NOT_IGNORED;
    if (sigismember(&mask, SIGHUP))
        return CHILD_STILL_BLOCKED;
    return CHILD_OK;
}

/* ops_free ignores SIGHUP from then on (the loop is over), and a SIGHUP sent in the instant
 * between libev's ev_signal_stop restoring the default action and that ignore no longer ends the
 * relay: it ended it by signal (exit 129) in place of its own status and last lines. */
static void test_ops_free_sighup(void **state)
{
    (void)state;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(ops_cycle());
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        fail_msg("ops_free: the process died of signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), CHILD_OK);
}

/* From review9 s21: libev takes LIBEV_FLAGS from the environment over ev_default_loop's flags
 * (main.c's loop passes EVFLAG_NOENV now, but ops takes any caller's loop: this one's flags come
 * from the environment), and with EVFLAG_SIGNALFD among them its SIGHUP watcher installs no
 * handler: it keeps the signal blocked and reads it from a signalfd. ops_start unblocked it after
 * the start, so any SIGHUP, a reload, ended the relay by its default action (exit 129); and
 * ev_signal_stop unblocks it rather than give back a default it never took away, so ops_free's
 * block was undone by the stop and one pending then was delivered with that default. The SIGHUP
 * here is sent with the watcher in and the loop not run, as one sent after its last turn. */
static int ops_cycle_signalfd(void)
{
    char flags[16];
    snprintf(flags, sizeof(flags), "%u", (unsigned)EVFLAG_SIGNALFD);
    setenv("LIBEV_FLAGS", flags, 1);
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    sigprocmask(SIG_BLOCK, &hup, NULL);
    struct ev_loop *loop = ev_default_loop(EVFLAG_AUTO);
    Config cfg;
    memset(&cfg, 0, sizeof(cfg));
    char err[256];
    Ops *ops = loop ? ops_new(loop, &cfg, 0, NULL, err, sizeof(err)) : NULL;
    if (!ops)
        return CHILD_NO_OPS;
    ops_start_databases(ops, NULL);
    kill(getpid(), SIGHUP);
    ops_free(ops);
    struct sigaction now;
    sigset_t mask;
    sigaction(SIGHUP, NULL, &now);
    sigprocmask(SIG_BLOCK, NULL, &mask);
    if (now.sa_handler != SIG_IGN)
        return CHILD_NOT_IGNORED;
    if (sigismember(&mask, SIGHUP))
        return CHILD_STILL_BLOCKED;
    return CHILD_OK;
}

static void test_ops_free_sighup_signalfd(void **state)
{
    (void)state;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(ops_cycle_signalfd());
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        fail_msg("ops_free under LIBEV_FLAGS=signalfd: the process died of signal %d (%s)",
                 WTERMSIG(status), strsignal(WTERMSIG(status)));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), CHILD_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_free_sighup),
        cmocka_unit_test(test_ops_free_sighup_signalfd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
