/* server: producer-demo's HTTP front end on libmicrohttpd.
 *
 * One thread per connection (libmicrohttpd's own), bounded by max_connections: a handler blocks
 * on PostgreSQL, and a thread of its own keeps that from stalling other clients. Database
 * connections come from the pool, so max_connections only bounds idle or slow clients.
 * Bodies over ORDER_BODY_MAX bytes get 413. Every request is logged on one line. */
#ifndef PRODUCER_SERVER_H
#define PRODUCER_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "api.h"

typedef struct Server Server;

/* Binds listen and starts serving api. Returns NULL with one line in err when the address cannot
 * be resolved or bound. */
Server *server_start(Api *api, const char *listen, int max_connections, char *err, size_t errlen);

/* The bound port (useful with port 0). */
unsigned server_port(const Server *s);

/* Stops accepting, lets the requests in progress finish, and frees the server. */
void server_stop(Server *s);

#endif
