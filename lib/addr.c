#include "addr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"

bool addr_parse_host_port(const char *option, const char *text, char *host, size_t hostlen,
                          unsigned *port, char *err, size_t errlen)
{
    const char *h = text, *colon;
    size_t hlen;
    if (*text == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':')
            goto bad;
        h = text + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(text, ':');
        if (!colon || memchr(text, ':', (size_t)(colon - text)))
            goto bad; /* an IPv6 address needs brackets */
        hlen = (size_t)(colon - text);
    }
    const char *p = colon + 1;
    char *end;
    errno = 0;
    long n = strtol(p, &end, 10);
    if (hlen == 0 || hlen >= hostlen || *p < '0' || *p > '9' || *end != '\0' || errno || n > 65535)
        goto bad;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (unsigned)n;
    return true;
bad:
    snprintf(err, errlen,
             "%s: expected HOST:PORT such as 127.0.0.1:9187 or [::1]:9187 (0.0.0.0 or [::] for "
             "every interface of that family), got '%.100s'",
             option, text);
    log_one_line(err); /* text is the user's: keep the error on one line */
    return false;
}

const char *addr_request_path(const char *target)
{
    const char *rest = NULL;
    if (strncasecmp(target, "http://", 7) == 0)
        rest = target + 7;
    else if (strncasecmp(target, "https://", 8) == 0)
        rest = target + 8;
    if (!rest)
        return target;
    const char *path = strchr(rest, '/');
    return path ? path : "/";
}

bool addr_request_method_known(const char *method)
{
    static const char *const known[] = {"GET",     "HEAD",    "POST",  "PUT",  "DELETE",
                                        "CONNECT", "OPTIONS", "TRACE", "PATCH"};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strcmp(method, known[i]) == 0)
            return true;
    return false;
}

bool addr_request_line_valid(const char *method, const char *target)
{
    if (!*method)
        return false;
    for (const char *c = method; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              strchr("!#$%&'*+-.^_`|~", *c)))
            return false;
    if (strcmp(target, "*") == 0)
        return strcmp(method, "OPTIONS") == 0;
    if (strcmp(method, "CONNECT") == 0) /* authority-form, host:port (RFC 9112 3.2.3) */
        return *target != '/' && strchr(target, ':') && !strchr(target, '/');
    if (*target == '/')
        return true; /* origin-form (an http or https absolute-form is its path by now) */
    /* absolute-form with another scheme (RFC 3986 3.1: a letter, then letters, digits, + - .) */
    const char *c = target;
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')))
        return false;
    while ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
           (*c && strchr("+-.", *c)))
        c++;
    return *c == ':';
}
