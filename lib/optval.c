#include "optval.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "secrets.h"

bool optval_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    log_one_line(err); /* values are echoed back and may hold newlines */
    return false;
}

bool optval_string(char **slot, const char *value, const char *source, char *err, size_t errlen)
{
    if (*value == '\0')
        return optval_fail(err, errlen, "%s: value must not be empty", source);
    secrets_free_zeroed(*slot);
    *slot = strdup(value);
    return true;
}

bool optval_long(long *out, const char *value, long min, long max, const char *source, char *err,
                 size_t errlen)
{
    /* Digits only: strtol would also take leading blanks and a sign (" -1", "+5"); a minus sign
     * where the range has negative numbers (replay's --from-id: an outbox id may be one). */
    const char *first = min < 0 && *value == '-' ? value + 1 : value;
    bool digits = *first >= '0' && *first <= '9';
    char *end = NULL;
    errno = 0;
    long n = digits ? strtol(value, &end, 10) : 0;
    if (!digits || *end != '\0' || errno != 0 || n < min || n > max)
        return optval_fail(err, errlen, "%s: expected an integer from %ld to %ld, got '%s'", source,
                           min, max, value);
    *out = n;
    return true;
}

int optval_open_file(const char *option, const char *path, bool running, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | (running ? O_NONBLOCK : 0));
    if (fd < 0) {
        optval_fail(err, errlen, "%s %s: %s", option, path, strerror(errno));
        return -1;
    }
    struct stat st;
    const char *why = fstat(fd, &st) != 0   ? strerror(errno)
                      : S_ISDIR(st.st_mode) ? strerror(EISDIR)
                      : running && !S_ISREG(st.st_mode)
                          ? "not a regular file (a pipe or device is read at start-up only: the "
                            "running relay must not wait on it)"
                          : NULL;
    if (why) {
        optval_fail(err, errlen, "%s %s: %s", option, path, why);
        close(fd);
        return -1;
    }
    return fd;
}
