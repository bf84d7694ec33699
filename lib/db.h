/* db: blocking libpq helpers, shared by the relay's one-shot commands (relay/cmd) and the demos.
 *
 * The demos are an HTTP request/response server, a load generator and a Kafka consumer loop, and
 * the commands run a few statements and exit: each runs one statement at a time on a connection
 * it owns, so plain blocking libpq is the simple, correct choice there (unlike the relay's event
 * loop, relay/io/pg.h). */
#ifndef OUTBOX_DB_H
#define OUTBOX_DB_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

/* What a failed statement left behind. */
typedef struct DbError {
    char sqlstate[6]; /* "" when the server sent none (e.g. the connection broke) */
    bool conn_lost;   /* the connection is unusable: reconnect before the next try */
    char message[300];
} DbError;

/* Checks the syntax of a connection string before anything connects, so a typo is bad input
 * (exit 2) rather than a runtime failure: "database URL: invalid connection string: ..." in err,
 * which never echoes the string (it may hold a password). The values of the service file's group
 * that the string or PGSERVICE names are checked too where the string does not set them
 * ("service NAME: port: ..."). Reads files: a start-up (or reload) check. */
bool db_check_conninfo(const char *conninfo, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* db_check_conninfo, for a command that writes: also refuses a target_session_attrs (in the
 * string, or PGTARGETSESSIONATTRS) that picks a read-only server (read-only, standby,
 * prefer-standby), where every write would fail with "read-only transaction" and the command retry
 * or fail for ever. Same err contract as db_check_conninfo. */
bool db_check_writer_conninfo(const char *conninfo, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Whether two connection strings may reach the same server and database: host (the hostaddr
 * when one is given), port and dbname, each the string's, else its service file's, else the
 * environment's (libpq's order), else libpq's default (its compiled port; the user's name, or the
 * operating system user's, for the dbname). Every spelling of this machine's own server is one
 * host (none: libpq's socket directory; a socket directory; localhost, 127.0.0.1, ::1: one server
 * listens on a port of a host), a name compares in any case and without a trailing dot, and two
 * host lists are the same when one host and port of each agree (libpq may pick it for both).
 * Names are not looked up (a name and its address differ), so false means "not shown the same",
 * and an unparsable string is never the same as anything. Reads the service file. */
bool db_same_database(const char *a, const char *b) __attribute__((warn_unused_result));

/* Pins the search_path of every later connection of this process (db_connect and the relay's
 * non-blocking connections alike), sent in the startup packet (libpq "options", after the
 * connection string's own options), so no statement of ours is resolved through a schema
 * someone else put earlier on the path (the CVE-2018-1058 pattern), and ALTER ROLE/DATABASE ...
 * SET search_path cannot change it either. The path is "pg_catalog, SCHEMA, pg_temp": built-in
 * functions and operators with exact argument types cannot be shadowed even by objects in SCHEMA
 * (one that needs a cast can: our SQL qualifies or casts those, migrations/0009_hardening.sql).
 * With creates (migrate), it is "SCHEMA, pg_temp" instead, because PostgreSQL creates
 * unqualified objects in the first schema listed; pg_catalog, left out, is then searched before
 * it, so built-ins, catalogs and type names resolve as for the relay (with pg_catalog listed
 * after SCHEMA, a look-alike of the same signature in SCHEMA would win). NULL unpins (the demos
 * never pin). Returns false with one line in err when schema is not a plain lower-case identifier
 * ([a-z_][a-z0-9_]*, at most 63 characters). Call before connecting; not thread-safe. */
bool db_pin_search_path(const char *schema, bool creates, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* The "options" value a connection sends: user_options (NULL or the connection string's own)
 * followed by the pin of db_pin_search_path. NULL when nothing is pinned (then send the user's
 * options as they are). The caller frees the result. */
char *db_startup_options(const char *user_options);

/* The value of keyword (host, target_session_attrs...) in the group service of the service file
 * libpq reads for it: PGSERVICEFILE, else ~/.pg_service.conf, and only when the group is in
 * neither, pg_service.conf in PGSYSCONFDIR (else libpq's sysconfdir). Into out (at most
 * outlen - 1 bytes); false when no file sets it. Reads files: for start-up checks, not the loop. */
bool db_service_value(const char *service, const char *keyword, char *out, size_t outlen);

/* The value libpq connects with for keyword, given opts (PQconninfoParse of the connection
 * string): the string's own, else the service file's (its service=, else PGSERVICE: see
 * db_service_value), else the environment's (envvar, may be NULL). *out is a whole copy (never
 * cut: a cut "-c statement_timeout=10000" could go as "=1"), the caller's to free; false when
 * none sets it, or out of memory (*out NULL either way). from (fromlen bytes) says where it came
 * from: "" the string, else "service NAME" or the variable's name, for errors. Reads files: not
 * for the loop's turns (a connection's set-up once, as libpq itself reads the service file, is
 * fine). */
bool db_effective_value(const PQconninfoOption *opts, const char *keyword, const char *envvar,
                        char **out, char *from, size_t fromlen);

/* One host of a connection string's host list. NULL fields: not given (libpq's default). */
typedef struct DbHost {
    char *host, *hostaddr, *port;
} DbHost;

/* Pure: pairs libpq's comma-separated host, hostaddr and port lists (each may be NULL) into one
 * entry per host, as libpq does: element i of each list, a single port for every host. Lists
 * libpq would reject (counts that differ) give one entry holding them whole, for libpq to
 * report. Returns the number of entries (>= 1) with a new array in *out (db_hosts_free), or 0
 * when out of memory. */
int db_hosts_split(const char *host, const char *hostaddr, const char *port, DbHost **out)
    __attribute__((warn_unused_result));

/* The hosts libpq tries, in order, for a connection to opts (PQconninfoParse of the string;
 * NULL: none given): db_hosts_split of the host, hostaddr and port it connects with, each the
 * string's, else its service file's, else PGHOST, PGHOSTADDR, PGPORT (db_effective_value).
 * Returns their number (>= 1) with a new array in *out (db_hosts_free), or 0 when out of
 * memory. Reads the service file: a connection's set-up, not the loop's turns. */
int db_hosts(const PQconninfoOption *opts, DbHost **out) __attribute__((warn_unused_result));

/* Frees what db_hosts_split or db_hosts returned (n entries); NULL is fine. */
void db_hosts_free(DbHost *hosts, int n);

/* "HOST:PORT" for the logs and errors: the host as db_host_shown shows it, else the hostaddr,
 * else "(default)", an IPv6 address in brackets ("[::1]:5432"); the port as given ("" when
 * none). Into out (cut to outlen); returns out. */
const char *db_host_label(const DbHost *h, char *out, size_t outlen);

/* Whether the files libpq opens itself while it connects are each a regular file, a directory
 * (whose open and read fail at once) or absent, not a FIFO, a device or a socket. Checked as
 * libpq would open them: the service file when the string or PGSERVICE gives a service, even an
 * empty name (the system's only when the first lacks the group: libpq reads no further file); and,
 * unless sslmode is disable or every host is a Unix socket (libpq uses no TLS there), sslrootcert,
 * sslcert, sslkey (not an engine's "engine:id"; only when sslcert is a regular file: libpq reads
 * no key without a certificate) and sslcrl (only when sslrootcert is a regular file, which libpq
 * loads first; its default only without sslcrldir), each the string's, else its service's, else
 * the environment's, else libpq's default under the home directory. libpq opens them on the
 * caller's thread, the relay's event loop, at every connection (the TLS files during
 * PQconnectPoll), where a FIFO's open waits for a writer. False with one line in err naming the
 * setting, where it came from and the path (never a value that could be secret). The TLS files
 * are stat'ed only; the first service file is read, opened without blocking, to find the group.
 * A file swapped in after the check is still opened by libpq (a window this narrows, not
 * closes; db_check_files_pinned closes it for the TLS files). The password file needs no check:
 * libpq skips one that is not a plain file. */
bool db_check_files(const PQconninfoOption *opts, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* The TLS files db_check_files_pinned opened for one connection attempt: fd[i] open on path[i]
 * (owned), handed to libpq as keyword[i]=alias[i] ("/proc/self/fd/N"). Zeroed: none. */
#define DB_PINS_MAX 4
typedef struct DbPins {
    int n;
    int fd[DB_PINS_MAX];
    const char *keyword[DB_PINS_MAX]; /* "sslrootcert", "sslcert", "sslkey" or "sslcrl" */
    char *path[DB_PINS_MAX];
    char alias[DB_PINS_MAX][32];
} DbPins;

/* db_check_files, and closes the window it leaves for the TLS files: each one libpq would open
 * that is a regular file (by the rules above) is opened here with O_NONBLOCK (never waits) and
 * recorded in *pins, whose keyword=alias pairs the caller appends to the connection's parameters
 * (after the others: libpq takes the last value of a keyword). libpq then opens
 * /proc/self/fd/N, the very file checked, its content and permissions (libpq's sslkey mode
 * check sees the file's), not whatever the path names by then; each attempt opens the paths
 * anew (rotation). Left to the stat's window: the service file (libpq 15 takes its path only from
 * PGSERVICEFILE and the home directory), absent files, a directory, and all when /proc is not
 * mounted. pins is zeroed first, and left empty on false; the caller closes it (db_pins_close)
 * once libpq has set TLS up (the connection made) or the attempt is over, never before. */
bool db_check_files_pinned(const PQconninfoOption *opts, DbPins *pins, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Closes the files of pins and frees their paths; pins is left empty (a no-op on an empty one). */
void db_pins_close(DbPins *pins);

/* text (a libpq error) into out with each alias of pins written back as its path: libpq names
 * the file it opened, /proc/self/fd/N, which says nothing to an operator. Cut to outlen. */
void db_pins_text(const DbPins *pins, const char *text, char *out, size_t outlen);

/* The connect_timeout db_connect and the relay's connections use when none is set, or when the
 * one set (in the string, the service file or PGCONNECT_TIMEOUT) is zero or less, which libpq
 * would take as no limit. */
#define DB_CONNECT_TIMEOUT_DEFAULT "10"

/* What db_connect hands PQconnectdbParams, one host of the list at a time: keys and values
 * NULL-terminated, for expand_dbname. */
typedef struct DbConnectParams {
    const char **keys, **values;
    int expand_dbname;
    DbHost *hosts; /* the hosts to try, in order (db_hosts; one entry for a single host) */
    int nhosts;
    bool prefer_standby; /* target_session_attrs=prefer-standby, from wherever libpq takes it */
    int nshared;         /* entries every host's connection shares, before the host's own */
    PQconninfoOption *parsed; /* owns the strings of values, or NULL (an unparsable string) */
    char *options;            /* owned: the user's options and the pinned search_path, or NULL */
    char *target; /* owned: the host's string (db_host_conninfo), for db_connect_params_host */
    size_t target_room; /* bytes of target: never less than the longest host's own string */
} DbConnectParams;

/* Fills p for connections to conninfo (which, like app, must outlive p): the string's own
 * settings, connect_timeout=10 (also for a connect_timeout of zero or less), keepalives (after
 * 10 s idle, every 5 s, 3 unanswered), tcp_user_timeout=30000 and fallback_application_name=app
 * (NULL: none), each unless the string, its service file or the environment sets it, and the
 * pinned options (db_pin_search_path); no host yet (db_connect_params_host). An unparsable
 * string is passed whole, for libpq to report. Reads the service file. False with one line in
 * err when out of memory; db_connect_params_free releases p either way. */
bool db_connect_params(const char *conninfo, const char *app, DbConnectParams *p, char *err,
                       size_t errlen) __attribute__((warn_unused_result));

/* Points p's parameters at host i of p->hosts (its host, hostaddr and port, in place of the
 * whole list; an empty one is libpq's default, as in the list), with target_session_attrs set to
 * session_attrs (NULL: as the user set it). */
void db_connect_params_host(DbConnectParams *p, int i, const char *session_attrs);

/* db_connect_params_host with hostaddr (one numeric address of the host's name, which goes
 * beside it: TLS verification and the password file match on the name) in place of the host's
 * own hostaddr (NULL: the host's own). False only when out of memory. */
bool db_connect_params_addr(DbConnectParams *p, int i, const char *hostaddr,
                            const char *session_attrs) __attribute__((warn_unused_result));

/* Whether host is a name to look up: not empty, not a socket directory ("/...", "@..."), not a
 * numeric IPv4 or IPv6 address. Pure. */
bool db_host_needs_lookup(const char *host);

/* Whether the connection string's setting o (from PQconninfoParse) goes to libpq as a parameter
 * every host's connection shares: a setting given, but the host's entries (host, hostaddr, port)
 * and those that go in the host's string (db_host_conninfo). Pure. */
bool db_setting_shared(const PQconninfoOption *o);

/* The connection string for one host's connection, to pass as a dbname parameter with
 * expand_dbname, after the shared ones (db_setting_shared): parsed's dbname (NULL parsed: none),
 * its empty settings but options and connect_timeout, and host, hostaddr and port (NULL: none),
 * each quoted. libpq takes an empty parameter for none, and then the environment's (PGHOST,
 * PGPORT, PGPASSWORD...), but an empty value in a string for its default, as the user's string
 * does. Written into out (NULL: only counted), which must hold the length returned plus one;
 * returns that length, 0 when there is nothing to pass (out then ""). Pure. */
size_t db_host_conninfo(const PQconninfoOption *parsed, const char *host, const char *hostaddr,
                        const char *port, char *out);

/* Releases what db_connect_params allocated. */
void db_connect_params_free(DbConnectParams *p);

/* The oldest PostgreSQL the relay works with (PQserverVersion's form): 13, for
 * gen_random_uuid() built in (migrations/0001) and pg_current_snapshot() (the claim's recheck).
 * On an older server migrate fails half-way and every claim fails, so each connection refuses it
 * up front instead (db_connect, and the relay's own in relay/io/pg.c). */
#define DB_MIN_SERVER_VERSION 130000

/* Whether a server of server_version (PQserverVersion: 120019 for 12.19, 90624 for 9.6.24) is
 * one the relay supports. False with one line in err naming both versions ("PostgreSQL 13 or
 * later is required; the server is 12.19"). Pure: the one rule for every connection. */
bool db_version_supported(int server_version, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Connects with db_connect_params's parameters, to each host of the list in turn until one
 * connects and is recent enough, as the relay's own connections do (pg.c): target_session_attrs
 * checked at each host, prefer-standby as libpq's two rounds (every host as a standby first,
 * then as any server), and any failure moving on to the next host (libpq stops at a server's
 * error after the start, an authentication failure say), so that a server older than
 * DB_MIN_SERVER_VERSION among the hosts is passed over for the next one (libpq would have
 * stopped at the first that answered). A host name is tried whole by libpq first; when that
 * fails or finds an old server, the name is looked up here (blocking: for the commands) and its
 * addresses after the one libpq stopped at are tried one at a time, the name beside each, as run
 * does (a name whose first address is a standby, read-write asked, or an old server). Server
 * notices go to the debug log.
 * Returns NULL with one line in err when none is usable: with one host, libpq's first line (any
 * quoted text of the string holding an '@' hidden: the tail of a password whose '@' was not
 * percent-encoded) or db_version_supported's; with several, the old servers named with their
 * versions ("...; the server at HOST:PORT is 12.19, at ...") and each other host's failure after
 * them, "; " between; a name's later address that failed otherwise adds its line after its
 * host's. *unsupported is set true when every host was refused for its version and no later
 * address of a name failed otherwise: bad input for a command, exit status 2, not a failure a
 * retry cures. unsupported may be NULL. */
PGconn *db_connect_checked(const char *conninfo, const char *app, bool *unsupported, char *err,
                           size_t errlen);

/* db_connect_checked without the out-parameter. */
PGconn *db_connect(const char *conninfo, const char *app, char *err, size_t errlen);

/* db_connect for a one-shot command: on failure logs "postgres unreachable" as an error and
 * returns NULL. */
PGconn *db_connect_once(const char *conninfo, const char *app);

/* Runs one statement with text parameters (values[i] NULL = SQL NULL). Returns the result when
 * it succeeded (the caller PQclears it), or NULL with e filled in. */
PGresult *db_query(PGconn *conn, const char *sql, int nparams, const char *const *values,
                   DbError *e);

/* Like db_query, with explicit lengths and formats (1 = binary, for bytea) per parameter. */
PGresult *db_query_bin(PGconn *conn, const char *sql, int nparams, const char *const *values,
                       const int *lengths, const int *formats, DbError *e);

/* Runs a script of one or more statements without parameters (a migration, say) in one round
 * trip; returns the last statement's result, or NULL with e filled in. */
PGresult *db_run_script(PGconn *conn, const char *sql, DbError *e);

/* SQL that sets the setting name (a duration: lock_timeout, statement_timeout) to bound, for the
 * transaction when local is "true" (else "false": the session), unless the value in force is
 * already a non-zero one at most as long: a stricter one the connection string set stays. name,
 * bound and local are string literals; bound may be a printf conversion ("%ldms") the caller
 * fills, twice. */
#define DB_BOUND_SETTING_SQL(name, bound, local)                                                   \
    "SELECT pg_catalog.set_config('" name "', '" bound "', " local ")"                             \
    " WHERE pg_catalog.current_setting('" name "')::interval"                                      \
    " NOT BETWEEN interval '1 ms' AND interval '" bound "'"

/* A statement's result res (NULL: none came, the connection says why) when it succeeded (the
 * caller PQclears it); else NULL, with e filled in and res cleared. For callers that send and
 * wait themselves (PQsendQuery...); db_query and the rest end with it. */
PGresult *db_result(PGconn *conn, PGresult *res, DbError *e);

/* Runs a statement whose result is not needed; true on success. */
bool db_exec(PGconn *conn, const char *sql, DbError *e) __attribute__((warn_unused_result));

/* Ends an open transaction, ignoring failures (the server rolls back when the connection is
 * gone anyway). */
void db_rollback(PGconn *conn);

/* Applies an idempotent schema script (CREATE ... IF NOT EXISTS) in one transaction, under a
 * transaction-level advisory lock named by lock_name so that several instances starting at
 * once do not race on the catalog. Logs the outcome. */
bool db_apply_schema(PGconn *conn, const char *lock_name, const char *sql, DbError *e)
    __attribute__((warn_unused_result));

/* The database's identity, for keys other systems hold about it (the demos' Redis keys): its
 * oid and name, and "@" + the cluster's system identifier when the role may read it
 * (pg_control_system). Two databases never share an identity; a copy made from a base backup of
 * this cluster does. Writes at most outlen - 1 characters to out. False with e filled. */
bool db_identity(PGconn *conn, char *out, size_t outlen, DbError *e)
    __attribute__((warn_unused_result));

/* The first line of a libpq message (they end in newlines, some span several), "unknown error"
 * for none, in a buffer of the calling thread that the next call overwrites. */
const char *db_error_line(const char *message);

/* Hides, in place, each double-quoted span of line that occurs in conninfo (as written or
 * percent-decoded) and holds an '@' or lies in a URL's password as meant (to where
 * secrets_url_userinfo_end ends the user info, when libpq ends it elsewhere): the tail of a
 * password whose '@' or '/' was not percent-encoded, which libpq takes for the start of the host
 * name (or a list of hosts) and quotes in its connect errors. Other quoted spans (real host names)
 * stay. line only shrinks. The rule of db_connect's errors, for every caller that shows libpq's
 * connect errors (the relay's connections). */
void db_hide_password_tail(char *line, const char *conninfo);

/* host as the logs show it: "..." for one holding an '@', which is no host name but the tail of
 * a password whose '@' was not percent-encoded (postgresql://u:pw@s3c@db: libpq's host
 * "s3c@db"); the scrub of registered secrets misses a tail shorter than SECRETS_MIN_LEN.
 * NULL stays NULL. */
const char *db_host_shown(const char *host);

/* "SQLSTATE: first line of the message" for logs and errors. */
const char *db_error_text(const DbError *e);

#endif
