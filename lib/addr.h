/* addr: the HOST:PORT addresses that listening options take (the relay's --metrics-listen, the
 * producer demo's --listen), parsed one way for every program. */
#ifndef OUTBOX_ADDR_H
#define OUTBOX_ADDR_H

#include <stdbool.h>
#include <stddef.h>

/* Splits text, "HOST:PORT" or "[IPv6]:PORT", into host (copied, without brackets) and port
 * (0-65535; 0 picks a free port). HOST must be written out: 0.0.0.0 listens on every IPv4
 * interface and [::] on every IPv6 one (the relay's endpoint sets IPV6_V6ONLY: [::] takes no
 * IPv4 connections), so exposing a port is never an accident of an empty string. Returns false with
 * one line in err, which starts with option ("--listen: expected HOST:PORT ..."). */
bool addr_parse_host_port(const char *option, const char *text, char *host, size_t hostlen,
                          unsigned *port, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* The path of an HTTP request-target as libmicrohttpd hands it over (query already cut): target
 * itself in origin-form ("/healthz"), the part from the path on in absolute-form
 * ("http://host:port/healthz", scheme in any case; "/" when there is no path), which RFC 9112
 * 3.2.2 says a server must accept although clients send it to proxies only. The authority is
 * ignored, as the Host header is. Returns a pointer into target, or to a static "/". */
const char *addr_request_path(const char *target);

/* Whether method is one HTTP defines (RFC 9110 section 9: GET, HEAD, POST, PUT, DELETE, CONNECT,
 * OPTIONS, TRACE; RFC 5789: PATCH), compared case-sensitively as RFC 9110 9.1 says. The servers
 * answer another (an unknown token, "get") 501 on any path, and a known one a path does not take
 * 405 with Allow, or 404 when no such path is served (RFC 9110 15.5.6, 15.6.2). */
bool addr_request_method_known(const char *method);

/* Whether a request line's method and target are well formed (RFC 9112 section 3): the method a
 * token (RFC 9110 5.6.2: letters, digits and !#$%&'*+-.^_`|~) and the target one of the forms
 * of RFC 9112 3.2 its method takes: "*" (the asterisk-form) with OPTIONS only, host:port (the
 * authority-form) with CONNECT only, else a path (the origin-form: target as addr_request_path
 * gives it) or an absolute URI ("scheme:..."). libmicrohttpd 0.9.75 hands any run of non-space
 * bytes over as either; the servers answer a malformed line 400 (RFC 9112 3: an invalid
 * request-line), where a method that is no token was 501, "not implemented", as if it could be,
 * "GET *" and "GET healthz" 404, and "CONNECT /healthz" 405 with Allow. OPTIONS * asks about the
 * server in general (RFC 9110 9.3.7): each server answers it 200 with Allow. */
bool addr_request_line_valid(const char *method, const char *target);

#endif
