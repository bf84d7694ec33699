/* manpage: the generated part of a man page (man(7) roff), written from an option table.
 *
 * `outbox-relay --help-man` (and the demos' same hidden flag) prints the COMMANDS, OPTIONS and
 * ENVIRONMENT sections from the very table --help is printed from (opts_print_man in opts.c), so
 * the installed man pages cannot drift from --help; tools/gen-man.sh wraps them in the
 * hand-written prose of man/NAME.1.in. */
#ifndef OUTBOX_MANPAGE_H
#define OUTBOX_MANPAGE_H

#include <stdio.h>

/* One option as a man page shows it. Every text is plain (escaped here); NULL means none. */
typedef struct ManOption {
    const char *name;    /* without "--" */
    const char *metavar; /* "" or NULL for a flag without value */
    const char *help;
    const char *env;  /* environment variable read when the flag is absent */
    const char *def;  /* default, as text */
    const char *note; /* one more sentence (which commands take it, reload on SIGHUP) */
} ManOption;

/* Writes text with roff's special characters escaped: a backslash, '-' (so options stay
 * copy-pastable as ASCII hyphens) and a '.' or '\'' that would start a line (a request). The
 * caller is at the start of a line; each newline in text starts a new one. */
void manpage_text(FILE *out, const char *text);

/* Starts a section (.SH); title is upper-case ASCII, written as it is. */
void manpage_section(FILE *out, const char *title);

/* A tagged paragraph: bold name, then help. */
void manpage_command(FILE *out, const char *name, const char *help);

/* A tagged paragraph for one option: --name METAVAR, help, then environment, default and note. */
void manpage_option(FILE *out, const ManOption *o);

/* A tagged paragraph for an environment variable that stands in for --option. */
void manpage_env(FILE *out, const char *env, const char *option);

#endif
