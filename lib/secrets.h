/* secrets: values that must never be written anywhere — database passwords, sensitive librdkafka
 * properties — and the scrubbing that enforces it on everything the process writes.
 *
 * Masking connection strings (log_mask_conninfo) covers the places we know hold a password.
 * This is the second line of defence for the places we do not control: libpq, librdkafka and
 * jansson error texts that may echo a value back. Every secret the configuration holds is
 * registered once it is loaded; log_write and log_quote replace each occurrence with "***" before
 * a line is written. The registry only grows (a lock-free list), so librdkafka's threads, which
 * log through log_write, can read it while the loop thread registers the secrets of a reloaded
 * configuration. */
#ifndef OUTBOX_SECRETS_H
#define OUTBOX_SECRETS_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

/* Shorter secrets are not registered: scrubbing every "abc" from the log would mangle ordinary
 * text, and so short a password can be guessed anyway. Connection strings still mask them by
 * position, and the relay warns at start-up that one was given (secrets_too_short). */
#define SECRETS_MIN_LEN 4

/* Registers value (copied) as a secret. Duplicates are ignored; a value shorter than
 * SECRETS_MIN_LEN is not registered but counted (secrets_too_short) unless empty. */
void secrets_add(const char *value);

/* How many distinct values secrets_add (and the password and sslpassword that
 * secrets_add_conninfo finds as libpq reads them) got that were too short to register, since the
 * start or secrets_clear (a value given again counts once):
 * each can show in text the process writes (an error of libpq's or librdkafka's echoing it). The
 * pieces of a URL's password cut by other readings (secrets_add_conninfo) do not count: they are
 * fragments, not a password given. */
size_t secrets_too_short(void);

/* From now on a too-short value counts in secrets_too_short even when it was counted before: a
 * SIGHUP registers the whole configuration again, and its warning counts the reloaded
 * configuration's short secrets, each once. */
void secrets_count_short_anew(void);

/* Registers the passwords of a libpq connection string: password and sslpassword as libpq
 * parses them, and the raw (percent-encoded or quoted) text of each, which is what libpq echoes
 * when it cannot parse the string. In a URL, the password as meant (from the user info's ':' to
 * where secrets_url_userinfo_end ends it); when libpq ends the user info elsewhere (at an
 * earlier '@', or nowhere for a '/' in the password), also its pieces cut at "@,:/?#&=", raw
 * and decoded: libpq takes them for hosts, ports, a database name or its query, showing pieces
 * no other reading registers.
 * A URL query's password as libpq reads it: to the next '&', blanks and quotes included.
 * In a URL of another scheme (http://, redis://), a user info without ':' whole: a token. */
void secrets_add_conninfo(const char *conninfo);

/* Where the user info of a URL whose text after "scheme://" starts at auth ends: its last '@'
 * before the query, or NULL when there is none. Anything that looks like user info is a
 * password from its first ':' to that '@', whatever libpq makes of it (over-masking is safe):
 * libpq ends the user info at the first '@' before any '/', so an unencoded '/' in the password
 * ("u:pa/ss@h") makes it read host "u", port "pa" and database "ss@h", and no password at all.
 * The query is taken to start at the first '?' that opens a parameter ("?name=", the name
 * without "@/&?#=") after the first '@' or '/': a '?' in the password opens none ("u:pa?ss/x@h",
 * "u:a?x=1/b@h"). When an '@' before the first '/' comes later (a password "p@x?a=b",
 * "u:p@x?a=b@h"), the user info runs to that one. An '@' after the first '/' counts only when
 * the text before it holds a ':' (outside a leading IPv6 "[...]"): in "h/p@th" it is the path's
 * (a bare token holding an unencoded '/' is therefore shown; curl reads host "TO" in
 * "http://TO/KEN@h" anyway), while "h:8081/x@b" still counts (a port cannot be told from a
 * password "8081/x"). What still escapes: a password holding an
 * '@', then "?name=", then a '/' ("u:p@x?a=b/c@h" masks "p" alone). Shared by log_mask_conninfo
 * (masking) and secrets_add_conninfo (registering), which must agree on what a password is. */
const char *secrets_url_userinfo_end(const char *auth);

/* Whether the len bytes at key, a URL query parameter's name holding a percent-encoded byte,
 * decode to password or sslpassword: libpq decodes names too, so "%70assword" is one. Shared by
 * the masking of log_mask_conninfo and the registering of secrets_add_conninfo, which must agree
 * on what a password is. */
bool secrets_encoded_password_key(const char *key, size_t len);

/* Frees s (NULL is fine) after zeroing it, for a string that may hold a secret (an option's
 * value, a copy of a connection string or URL): a freed block keeps its bytes for the next
 * allocation or a memory dump to find. */
void secrets_free_zeroed(char *s);

/* PQconninfoFree(opts) (opts from PQconninfoParse, PQconndefaults or PQconninfo; NULL is
 * fine), after zeroing every value: libpq frees its copies unzeroed, which left the password
 * (and sslpassword, PGPASSWORD's for PQconndefaults) in freed heap blocks for any later
 * allocation or a memory dump to find. Every value, not only the passwords': a password libpq
 * cuts elsewhere ("u:pa/ss@h") lies in its host, port or database name. (libpq's own scratch
 * copy of the whole string, freed inside PQconninfoParse, is out of any caller's reach.) */
void secrets_conninfo_free(PQconninfoOption *opts);

/* While on (calls nest: each true needs its false), jansson zeroes every block it frees:
 * for JSON text that holds secrets (the config file, --databases), whose copies jansson makes
 * (its lexer's buffer, string values, object keys, json_dumps' growing buffer) and frees
 * unzeroed. Only around such text: every free then writes the block's whole usable size, a
 * cost the serializer's hot path must not pay. jansson's malloc must be malloc's (the default;
 * the serializer's noting wrapper is). Loop thread only: jansson's allocator is global. */
void secrets_json_wipe(bool on);

/* True for librdkafka properties whose values are secrets (passwords, private keys, OAuth
 * client secrets and configs, tokens). */
bool secrets_kafka_key_sensitive(const char *key);

struct OptSpec;

/* Overwrites, in place, the secrets on a command line that spec parsed, so that
 * /proc/PID/cmdline (ps, top: every local user) no longer shows them: the whole value of each
 * option named in whole (a NULL-terminated list: connection strings, where a password may hide in
 * several places), the user info of each URL of an option named in url_lists (NULL-terminated,
 * or NULL: comma-separated URL lists, overwritten with '*' by position, so that a password too
 * short to be registered goes too and the hosts stay readable), the VALUE of each KEY=VALUE of a
 * list option (--kafka) whose KEY is sensitive (secrets_kafka_key_sensitive), then any registered
 * secret in any argument (register them first). Values become "***" and NULs, their lengths
 * kept. argv[0] is left alone. */
void secrets_scrub_argv(const struct OptSpec *spec, int argc, char **argv, const char *const *whole,
                        const char *const *url_lists);

/* Turns core dumps off for the process, as the relay does at start (relay/main.c): a core holds
 * every credential in memory. RLIMIT_CORE 0 stops the kernel writing one; PR_SET_DUMPABLE 0
 * stops core pipes (systemd-coredump) too and keeps other processes of the same user out of its
 * memory. Failures are ignored: a sandbox that forbids them forbids dumps too. */
void secrets_no_core_dumps(void);

/* Replaces every registered secret in the NUL-terminated s with "***", in place (the text only
 * shrinks). Returns the new length. */
size_t secrets_scrub(char *s);

/* True when s contains a registered secret. */
bool secrets_found(const char *s);

/* Forgets every secret (unit tests only: not safe while other threads may read the registry). */
void secrets_clear(void);

#endif
