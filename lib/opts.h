/* opts: command-line options of the demo programs, driven by one table per program.
 *
 * The same shape as the relay's config module (relay/config.c), without the config file: each
 * option is named once with its type, range, environment variable, default, the commands that
 * accept it and its help text; parsing, validation and --help all come from that table.
 * Precedence is flag > environment > default. */
#ifndef DEMO_OPTS_H
#define DEMO_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "log.h"

typedef enum {
    OPT_STRING,    /* char *, non-empty */
    OPT_INT,       /* long within [min, max] */
    OPT_LOG_LEVEL, /* LogLevel */
    OPT_LIST,      /* OptList of "KEY=VALUE" strings (non-empty KEY), repeatable */
} OptType;

/* A repeatable option's values, in the order given (environment first, then flags). */
typedef struct OptList {
    char **items;
    size_t len;
} OptList;

typedef struct OptDef {
    const char *name; /* flag without "--" */
    OptType type;
    const char *env;     /* environment fallback, or NULL */
    const char *def;     /* default as text, or NULL for none */
    long min, max;       /* inclusive range of an OPT_INT */
    size_t offset;       /* field in the program's options struct */
    unsigned commands;   /* bit (1u << command id) for each command that accepts it */
    unsigned required;   /* commands for which it must be set */
    const char *metavar; /* placeholder shown in --help */
    const char *help;
} OptDef;

typedef struct CmdDef {
    const char *name;
    int id; /* 0..31, also the bit in OptDef.commands */
    const char *help;
} CmdDef;

typedef struct OptSpec {
    const char *prog;    /* program name, for messages and --help */
    const char *summary; /* one paragraph for --help */
    const CmdDef *cmds;
    size_t ncmds;
    int default_cmd; /* command when argv[1] is an option or missing; -1 for none */
    int help_cmd;    /* command id that means "print help" */
    int version_cmd; /* command id that means "print the version" */
    const OptDef *opts;
    size_t nopts;
} OptSpec;

/* Parses argv (argv[1] may be a command) into out, a zeroed struct the table's offsets point
 * into, and sets *cmd. On bad input returns false with one line (no newline) in err; out must
 * still be released with opts_free. --help/-h and --version/-V select help_cmd/version_cmd. */
bool opts_parse(const OptSpec *spec, void *out, int *cmd, int argc, char **argv, char *err,
                size_t errlen) __attribute__((warn_unused_result));

/* Releases the strings and lists opts_parse stored in out. */
void opts_free(const OptSpec *spec, void *out);

/* Writes the usage text, generated from the tables. */
void opts_print_help(const OptSpec *spec, FILE *out);

#endif
