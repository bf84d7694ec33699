/* opts: command lines driven by one table per program — the relay's and the demos' alike.
 *
 * Each option is named once with its type, range, environment variable, default, the commands
 * that accept it and its help text; parsing, validation, --help and the man pages all come from
 * that table. Precedence is flag > environment > config file (for a program that has one) >
 * default. Errors are one line, naming where the bad value came from ("--batch-size",
 * "DATABASE_URL", "config file x.json: key ..."), and never echo a KEY=VALUE list item (its value
 * may be a secret). */
#ifndef OUTBOX_OPTS_H
#define OUTBOX_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum {
    OPT_STRING,    /* char *, non-empty */
    OPT_INT,       /* long within [min, max] */
    OPT_CHOICE,    /* int: the index of the value in choices */
    OPT_BOOL,      /* bool: true/false/1/0; a bare flag means true */
    OPT_DURATION,  /* long seconds: 90s, 30m, 72h, 7d, or 0/off (refused with a min above 0) */
    OPT_LOG_LEVEL, /* LogLevel (log.h) */
    OPT_LIST,      /* OptList of KEY=VALUE pairs (non-empty KEY), repeatable */
} OptType;

/* One KEY=VALUE item of a list option (a librdkafka property, say); both owned. */
typedef struct OptPair {
    char *key;
    char *value;
} OptPair;

/* A repeatable option's values, in the order given (config file, environment, then flags). */
typedef struct OptList {
    OptPair *items;
    size_t len;
} OptList;

typedef struct OptDef {
    const char *name; /* flag without "--"; also the config file key */
    OptType type;
    const char *env;     /* environment fallback, or NULL */
    const char *def;     /* default as text, or NULL for none */
    long min, max;       /* inclusive range of an OPT_INT; an OPT_DURATION's seconds (max 0: the
                          * general limit of OPTS_DURATION_MAX_DAYS) */
    size_t offset;       /* field in the program's options struct */
    unsigned commands;   /* bit (1u << command id) for each command that accepts it; 0: all */
    unsigned required;   /* commands for which it must be set */
    const char *metavar; /* placeholder shown in --help ("" for a switch) */
    const char *help;
    const char *const *choices; /* OPT_CHOICE: NULL-terminated names, stored as their index */
    bool reloadable;            /* taken over by a running program on SIGHUP: [SIGHUP] in help */
} OptDef;

typedef struct CmdDef {
    const char *name;
    int id; /* 0..31, also the bit in OptDef.commands */
    const char *help;
} CmdDef;

/* Another name an option is also known by (as a flag and as a config file key). */
typedef struct OptAlias {
    const char *alias;
    const char *name;
} OptAlias;

/* Where an option's value came from, in precedence order. */
typedef enum {
    OPT_FROM_NOWHERE,
    OPT_FROM_DEFAULT,
    OPT_FROM_FILE,
    OPT_FROM_ENV,
    OPT_FROM_FLAG
} OptSource;

typedef struct OptSpec OptSpec;

/* Reads a config file into out (with opts_set_by_name for each entry, marking sources[] with
 * OPT_FROM_FILE). Returns false with one line in err. */
typedef bool (*OptFileFn)(const OptSpec *spec, void *out, const char *path, OptSource *sources,
                          char *err, size_t errlen);

struct OptSpec {
    const char *prog;    /* program name, for messages and --help */
    const char *summary; /* one paragraph for --help */
    const CmdDef *cmds;
    size_t ncmds;
    int default_cmd; /* command when argv[1] is an option or missing; -1 for none */
    int help_cmd;    /* command id that means "print help" */
    int version_cmd; /* command id that means "print the version" */
    const OptDef *opts;
    size_t nopts;
    const OptAlias *aliases;
    size_t naliases;
    const char *file_option; /* the option naming a config file, or NULL for none */
    OptFileFn load_file;     /* reads it (required with file_option) */
    const char *help_footer; /* printed after the options, or NULL */
    /* OptDef.commands only says which commands use an option (`PROG COMMAND --help` lists those,
     * the man page notes them); every command still takes every option, so one set of flags or
     * environment serves all of a program's commands. false: a flag for another command is
     * refused. */
    bool commands_shown;
};

/* Parses argv (argv[1] may be a command) into out, a zeroed struct the table's offsets point
 * into, and sets *cmd. On bad input returns false with one line (no newline) in err; out must
 * still be released with opts_free. --help/-h and --version/-V select help_cmd/version_cmd. */
bool opts_parse(const OptSpec *spec, void *out, int *cmd, int argc, char **argv, char *err,
                size_t errlen) __attribute__((warn_unused_result));

/* opts_parse that also tells, in sources (one per option of the table), where each value came
 * from: for settings with two spellings, where the stronger source wins. */
bool opts_parse_traced(const OptSpec *spec, void *out, int *cmd, OptSource *sources, int argc,
                       char **argv, char *err, size_t errlen) __attribute__((warn_unused_result));

/* The option called name (or one of its aliases), len bytes of it; NULL if there is none. */
const OptDef *opts_find(const OptSpec *spec, const char *name, size_t len);

/* Checks one textual value and stores it in out, as opts_parse does; source names where it came
 * from for the error. For config file loaders and list files. */
bool opts_set(const OptDef *opt, void *out, const char *value, const char *source, char *err,
              size_t errlen) __attribute__((warn_unused_result));

/* Appends KEY=VALUE (split at the first '=') to list. False when text has no '=' or an empty
 * key (the text is not echoed anywhere). */
bool opts_list_append(OptList *list, const char *text) __attribute__((warn_unused_result));

/* Parses a duration: 0 (any number of zeros) or off, or a count (digits, no sign or blanks) with s,
 * m, h or d (at most ten years). */
bool opts_parse_duration(const char *text, long *seconds) __attribute__((warn_unused_result));

/* Releases the strings and lists opts_parse stored in out. */
void opts_free(const OptSpec *spec, void *out);

/* Writes the usage text, generated from the tables. */
void opts_print_help(const OptSpec *spec, FILE *out);

/* The command whose help argv asks for ("PROG COMMAND ... --help" or "-h"), or -1 when argv asks
 * for the whole program's (or names no command). */
int opts_help_command(const OptSpec *spec, int argc, char **argv);

/* Writes the usage text of one command: its summary and only the options it takes. */
void opts_print_command_help(const OptSpec *spec, int cmd, FILE *out);

/* Writes the COMMANDS, OPTIONS and ENVIRONMENT sections of the program's man page (roff), from
 * the same tables as opts_print_help (manpage.h); tools/gen-man.sh adds the rest. */
void opts_print_man(const OptSpec *spec, FILE *out);

/* Writes every option of the table as one tab-separated line (a header line first: name,
 * metavar, type, default, min, max, env, reloadable, commands, aliases, choices, help), for
 * tools/docs.py to generate the configuration reference from; nothing is allocated. */
void opts_print_table(const OptSpec *spec, FILE *out);

#endif
