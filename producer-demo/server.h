/* server: producer-demo's HTTP front end on libmicrohttpd.
 *
 * One thread per connection (libmicrohttpd's own), bounded by max_connections: a handler blocks
 * on PostgreSQL, and a thread of its own keeps that from stalling other clients. Database
 * connections come from the pool, so max_connections only bounds idle or slow clients.
 * Bodies over ORDER_BODY_MAX bytes get 413. Each answer is logged on one line ("request"), up
 * to request_log_rate lines a second; the rest are counted ("request lines held back"). */
#ifndef PRODUCER_SERVER_H
#define PRODUCER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "api.h"

typedef struct Server Server;

/* Bounds on what clients may hold (server.c says why). */
typedef struct ServerLimits {
    long max_connections;    /* connections served at once, in all */
    long max_per_address;    /* connections from one client address at once */
    long request_deadline_s; /* a request's line, headers and body must arrive within this */
    long request_log_rate;   /* "request" lines a second at most (0: none) */
} ServerLimits;

/* Binds listen and starts serving api within limits. Returns NULL with one line in err when the
 * address cannot be resolved or bound, or no thread could be started. */
Server *server_start(Api *api, const char *listen, const ServerLimits *limits, char *err,
                     size_t errlen);

/* The bound port (useful with port 0). */
unsigned server_port(const Server *s);

/* Stops accepting, lets the requests in progress finish, and frees the server. */
void server_stop(Server *s);

#endif
