#include "opts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "manpage.h"
#include "optval.h"
#include "secrets.h"

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (!q) {
        perror("out of memory");
        exit(1);
    }
    return q;
}

/* A copy of the first n bytes of s, or the process ends as xrealloc's does: a NULL key or value
 * would read later as an option never given. */
static char *xstrndup(const char *s, size_t n)
{
    char *copy = strndup(s, n);
    if (!copy) {
        perror("out of memory");
        exit(1);
    }
    return copy;
}

const OptDef *opts_find(const OptSpec *spec, const char *name, size_t len)
{
    for (size_t i = 0; i < spec->nopts; i++)
        if (strlen(spec->opts[i].name) == len && strncmp(spec->opts[i].name, name, len) == 0)
            return &spec->opts[i];
    for (size_t i = 0; i < spec->naliases; i++)
        if (strlen(spec->aliases[i].alias) == len &&
            strncmp(spec->aliases[i].alias, name, len) == 0)
            return opts_find(spec, spec->aliases[i].name, strlen(spec->aliases[i].name));
    return NULL;
}

static const CmdDef *find_command(const OptSpec *spec, int id)
{
    for (size_t i = 0; i < spec->ncmds; i++)
        if (spec->cmds[i].id == id)
            return &spec->cmds[i];
    return NULL;
}

static bool applies(const OptDef *opt, int cmd)
{
    return opt->commands == 0 || ((opt->commands >> cmd) & 1u);
}

/* Whether cmd takes opt from flags, the environment and its default (see commands_shown). */
static bool accepts(const OptSpec *spec, const OptDef *opt, int cmd)
{
    return spec->commands_shown || applies(opt, cmd);
}

bool opts_list_append(OptList *list, const char *text)
{
    const char *eq = strchr(text, '=');
    if (!eq || eq == text)
        return false;
    list->items = xrealloc(list->items, (list->len + 1) * sizeof(*list->items));
    list->items[list->len++] =
        (OptPair){xstrndup(text, (size_t)(eq - text)), xstrndup(eq + 1, strlen(eq + 1))};
    return true;
}

/* The longest duration taken, in days (ten years): named in the errors, since "at least 1s" alone
 * read as though 10000d were too short. */
#define OPTS_DURATION_MAX_DAYS 3650L

bool opts_parse_duration(const char *text, long *seconds)
{
    /* Zero needs no unit, written with any number of digits as "00s" is: "00" is "0". */
    if (strcmp(text, "off") == 0 || (*text == '0' && text[strspn(text, "0")] == '\0')) {
        *seconds = 0;
        return true;
    }
    /* A digit first: strtol would also take leading blanks and a sign (" -1h" as -3600). */
    if (*text < '0' || *text > '9')
        return false;
    char *end;
    errno = 0;
    long n = strtol(text, &end, 10);
    if (errno != 0 || end[0] == '\0' || end[1] != '\0')
        return false;
    long unit = end[0] == 's'   ? 1
                : end[0] == 'm' ? 60
                : end[0] == 'h' ? 3600
                : end[0] == 'd' ? 86400
                                : 0;
    if (unit == 0 || n > OPTS_DURATION_MAX_DAYS * 86400 / unit)
        return false;
    *seconds = n * unit;
    return true;
}

static bool set_choice(int *field, const OptDef *opt, const char *value, const char *source,
                       char *err, size_t errlen)
{
    char expected[128] = "";
    for (int i = 0; opt->choices[i]; i++) {
        if (strcmp(value, opt->choices[i]) == 0) {
            *field = i;
            return true;
        }
        snprintf(expected + strlen(expected), sizeof(expected) - strlen(expected), "%s%s",
                 i == 0                ? ""
                 : opt->choices[i + 1] ? ", "
                                       : " or ",
                 opt->choices[i]);
    }
    return optval_fail(err, errlen, "%s: expected %s, got '%s'", source, expected, value);
}

/* seconds as the largest whole unit a duration flag takes: "86400" -> "1d", "90" -> "90s". */
static const char *duration_text(long seconds, char *buf, size_t len)
{
    static const struct {
        long unit;
        char name;
    } units[] = {{86400, 'd'}, {3600, 'h'}, {60, 'm'}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (seconds >= units[i].unit && seconds % units[i].unit == 0) {
            snprintf(buf, len, "%ld%c", seconds / units[i].unit, units[i].name);
            return buf;
        }
    snprintf(buf, len, "%lds", seconds);
    return buf;
}

bool opts_set(const OptDef *opt, void *out, const char *value, const char *source, char *err,
              size_t errlen)
{
    void *field = (char *)out + opt->offset;
    switch (opt->type) {
    case OPT_STRING:
        return optval_string(field, value, source, err, errlen);
    case OPT_INT:
        return optval_long(field, value, opt->min, opt->max, source, err, errlen);
    case OPT_CHOICE:
        return set_choice(field, opt, value, source, err, errlen);
    case OPT_BOOL:
        if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0)
            *(bool *)field = true;
        else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0)
            *(bool *)field = false;
        else
            return optval_fail(err, errlen, "%s: expected true or false, got '%s'", source, value);
        return true;
    case OPT_DURATION:
        if (opt->min > 0 && opt->max > 0 &&
            (!opts_parse_duration(value, (long *)field) || *(long *)field < opt->min ||
             *(long *)field > opt->max)) {
            char lo[24], hi[24];
            return optval_fail(err, errlen,
                               "%s: expected a duration from %s to %s such as 90s, 30m or 2h, "
                               "got '%s'",
                               source, duration_text(opt->min, lo, sizeof(lo)),
                               duration_text(opt->max, hi, sizeof(hi)), value);
        }
        if (opt->min > 0 &&
            (!opts_parse_duration(value, (long *)field) || *(long *)field < opt->min))
            return optval_fail(err, errlen,
                               "%s: expected a duration from %lds to %ldd such as 90s, 30m, 72h or "
                               "7d, got '%s'",
                               source, opt->min, OPTS_DURATION_MAX_DAYS, value);
        if (!opts_parse_duration(value, (long *)field))
            return optval_fail(err, errlen,
                               "%s: expected a duration of at most %ldd such as 90s, 30m, 72h or "
                               "7d (or 0/off), got '%s'",
                               source, OPTS_DURATION_MAX_DAYS, value);
        return true;
    case OPT_LOG_LEVEL:
        if (!log_level_parse(value, (LogLevel *)field))
            return optval_fail(err, errlen, "%s: expected debug, info, warn or error, got '%s'",
                               source, value);
        return true;
    case OPT_LIST:
        /* The text is not echoed: without its '=', a value cannot be told from its key, and
         * values may be secrets. */
        if (!opts_list_append(field, value))
            return optval_fail(err, errlen, "%s: expected KEY=VALUE (a non-empty key, then '=')",
                               source);
        return true;
    }
    return optval_fail(err, errlen, "%s: unsupported option type", source);
}

static bool is_set(const void *out, const OptDef *opt)
{
    const void *field = (const char *)out + opt->offset;
    switch (opt->type) {
    case OPT_STRING:
        return *(char *const *)field != NULL;
    case OPT_LIST:
        return ((const OptList *)field)->len > 0;
    default:
        return true; /* numbers, choices and switches always have a value */
    }
}

/* A flag from the command line, applied after everything else so that it wins. */
typedef struct Flag {
    const OptDef *opt;
    const char *value;
    const char *spelling; /* the name as given (an alias or the option's), spelling_len bytes */
    size_t spelling_len;
} Flag;

/* arg as an error line may show it, before any secret is registered for a scrub: an option's
 * name without its "=VALUE" ("--database-url=postgresql://u:pw@h/d" is "--database-url=..."); a
 * librdkafka property whose value is a secret (secrets_kafka_key_sensitive) without its value
 * ("sasl.password=...": a second --kafka forgotten); a text without a scheme holding '@' up to
 * its last '@' (the tail of a URL's password cut at a blank, "postgresql://u:pa ss@h/d");
 * anything else masked as a connection string is (log_mask_conninfo: a URL's user info
 * password, password=). Returns out. */
static const char *shown_arg(const char *arg, char *out, size_t outlen)
{
    const char *eq = strchr(arg, '=');
    const char *at = strstr(arg, "://") ? NULL : strrchr(arg, '@');
    char key[256];
    bool sensitive = false;
    /* A property's name: no URL's text ("postgresql://u:pw-secret@h/d?sslmode=" is a URL). */
    if (eq && (size_t)(eq - arg) < sizeof(key) && !strstr(arg, "://") &&
        !memchr(arg, '@', (size_t)(eq - arg))) {
        snprintf(key, sizeof(key), "%.*s", (int)(eq - arg), arg);
        sensitive = secrets_kafka_key_sensitive(key);
    }
    if (eq && (strncmp(arg, "--", 2) == 0 || sensitive))
        snprintf(out, outlen, "%.*s=...", (int)(eq - arg), arg);
    else if (at)
        snprintf(out, outlen, "***%s", at);
    else
        log_mask_conninfo(arg, out, outlen);
    return out;
}

/* Finds the command in argv[1]; sets *first to the first argument after it. Returns false with
 * err set when there is none and the program has no default. */
static bool parse_command(const OptSpec *spec, int *cmd, int *first, int argc, char **argv,
                          char *err, size_t errlen)
{
    *cmd = spec->help_cmd;
    *first = 1;
    const char *arg1 = argc > 1 ? argv[1] : NULL;
    const CmdDef *named = NULL;
    for (size_t i = 0; arg1 && arg1[0] != '-' && i < spec->ncmds; i++)
        if (strcmp(arg1, spec->cmds[i].name) == 0)
            named = &spec->cmds[i];
    char shown[512];
    if (arg1 && arg1[0] != '-' && !named)
        return optval_fail(err, errlen, "unknown command '%s': try '%s --help'",
                           shown_arg(arg1, shown, sizeof(shown)), spec->prog);
    bool help = (arg1 && (strcmp(arg1, "--help") == 0 || strcmp(arg1, "-h") == 0)) ||
                (named && named->id == spec->help_cmd);
    bool version = (arg1 && (strcmp(arg1, "--version") == 0 || strcmp(arg1, "-V") == 0)) ||
                   (named && named->id == spec->version_cmd);
    if (help || version) {
        /* Nothing may follow them: "version --bogus" or "help foo" would be ignored. One
         * command's help is "PROG COMMAND --help". */
        if (argc > 2)
            return optval_fail(err, errlen,
                               "%s takes no arguments, got '%s': try '%s --help' or '%s COMMAND "
                               "--help'",
                               arg1, shown_arg(argv[2], shown, sizeof(shown)), spec->prog,
                               spec->prog);
        *cmd = help ? spec->help_cmd : spec->version_cmd;
        return true;
    }
    if (named) {
        *cmd = named->id;
        *first = 2;
        return true;
    }
    if (spec->default_cmd >= 0) {
        *cmd = spec->default_cmd;
        return true;
    }
    if (arg1)
        return optval_fail(err, errlen, "expected a command before '%s': try '%s --help'",
                           shown_arg(arg1, shown, sizeof(shown)), spec->prog);
    return optval_fail(err, errlen, "missing command: try '%s --help'", spec->prog);
}

/* The error for an argument that is no option's value, shown without the secrets it may hold,
 * before any is registered for a scrub: after an argument ending in '=' (an option given an
 * empty value, "--database-url= postgresql://u:pw@h/d", or a KEY=VALUE list entry given an empty
 * one, "--kafka sasl.password= hunter2" or "--kafka=sasl.password= hunter2": a blank after the
 * '='), most likely that value, which could be a bare password or token: not shown at all;
 * otherwise as shown_arg shows it. */
static bool stray_argument(const OptSpec *spec, const char *prev, const char *arg, char *err,
                           size_t errlen)
{
    size_t prev_len = prev ? strlen(prev) : 0;
    char shown[512];
    if (prev_len > 0 && prev[prev_len - 1] == '=') {
        /* "--opt=" or "KEY=" as it is (no value there); anything else ("--kafka=KEY=", a URL
         * ending in "?sslmode=") may hold a secret itself and is shown as shown_arg shows it. */
        bool no_value =
            strchr(prev, '=') == prev + prev_len - 1 && !strchr(prev, '@') && !strstr(prev, "://");
        return optval_fail(err, errlen,
                           "unexpected argument after '%s' (not shown: it may be that option's "
                           "value, with a blank after the '='): try '%s --help'",
                           no_value ? prev : shown_arg(prev, shown, sizeof(shown)), spec->prog);
    }
    /* "--kafka sasl.password S3CRET": a KEY=VALUE list's sensitive key whose value came after a
     * blank, not after an '=': the stray argument is that secret, a bare word no masking
     * recognises. */
    size_t key_len = prev && strncmp(prev, "--", 2) != 0 ? strcspn(prev, "=") : 0;
    if (key_len > 0 && key_len == prev_len) {
        char key[128];
        snprintf(key, sizeof(key), "%.*s", (int)key_len, prev);
        if (secrets_kafka_key_sensitive(key))
            return optval_fail(err, errlen,
                               "unexpected argument after '%s' (not shown: it may be that key's "
                               "value, with a blank instead of the '='): try '%s --help'",
                               key, spec->prog);
    }
    return optval_fail(err, errlen, "unexpected argument '%s': try '%s --help'",
                       shown_arg(arg, shown, sizeof(shown)), spec->prog);
}

/* Collects the flags of argv[first..] into flags (values are applied later, last). Sets *cmd to
 * help_cmd on --help. */
static bool collect_flags(const OptSpec *spec, int *cmd, int first, int argc, char **argv,
                          Flag *flags, size_t *n_flags, char *err, size_t errlen)
{
    const char *cmd_name = find_command(spec, *cmd)->name;
    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            *cmd = spec->help_cmd;
            return true;
        }
        if (strncmp(arg, "--", 2) != 0)
            return stray_argument(spec, i > first ? argv[i - 1] : NULL, arg, err, errlen);
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const OptDef *opt = opts_find(spec, name, name_len);
        if (!opt) {
            /* The name up to a character no option name holds: "--database-url:postgresql://u:
             * pw@h/d" (a ':' typed for the '=') is a value, maybe a secret, none registered yet. */
            size_t shown = strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_.");
            if (shown > name_len)
                shown = name_len;
            return optval_fail(err, errlen, "unknown option '--%.*s%s': try '%s --help'",
                               (int)shown, name, shown < name_len ? "..." : "", spec->prog);
        }
        if (!accepts(spec, opt, *cmd))
            return optval_fail(err, errlen, "option --%s does not apply to '%s'", opt->name,
                               cmd_name);
        /* One option under two names (a Debezium alias and its own): which one was meant? The
         * same name twice is a later flag overriding an earlier one, as scripts do. */
        for (size_t j = 0; j < *n_flags; j++)
            if (flags[j].opt == opt && (flags[j].spelling_len != name_len ||
                                        strncmp(flags[j].spelling, name, name_len) != 0))
                return optval_fail(err, errlen, "--%.*s and --%.*s both set %s: give one of them",
                                   (int)flags[j].spelling_len, flags[j].spelling, (int)name_len,
                                   name, opt->name);
        const char *value = eq ? eq + 1 : NULL;
        if (!value && opt->type == OPT_BOOL)
            value = "true"; /* a bare switch */
        if (!value) {
            if (i + 1 >= argc)
                return optval_fail(err, errlen, "option --%s needs a value (%s)", opt->name,
                                   opt->metavar);
            value = argv[++i];
        }
        flags[(*n_flags)++] = (Flag){opt, value, name, name_len};
    }
    return true;
}

bool opts_parse(const OptSpec *spec, void *out, int *cmd, int argc, char **argv, char *err,
                size_t errlen)
{
    return opts_parse_traced(spec, out, cmd, NULL, argc, argv, err, errlen);
}

bool opts_parse_traced(const OptSpec *spec, void *out, int *cmd, OptSource *sources, int argc,
                       char **argv, char *err, size_t errlen)
{
    int first;
    if (!parse_command(spec, cmd, &first, argc, argv, err, errlen))
        return false;
    if (*cmd == spec->help_cmd || *cmd == spec->version_cmd)
        return true;

    Flag *flags = calloc((size_t)argc + 1, sizeof(*flags));
    OptSource *from = calloc(spec->nopts + 1, sizeof(*from));
    size_t n_flags = 0;
    if (!flags || !from) {
        perror("out of memory");
        exit(1);
    }
    bool ok = collect_flags(spec, cmd, first, argc, argv, flags, &n_flags, err, errlen);
    if (!ok || *cmd == spec->help_cmd)
        goto out;

    /* Defaults, then the config file, then the environment, then the flags. */
    for (size_t i = 0; i < spec->nopts && ok; i++) {
        const OptDef *opt = &spec->opts[i];
        if (accepts(spec, opt, *cmd) && opt->def) {
            ok = opts_set(opt, out, opt->def, "default", err, errlen);
            from[i] = OPT_FROM_DEFAULT;
        }
    }
    const char *file = NULL;
    for (size_t i = 0; i < n_flags; i++)
        if (spec->file_option && strcmp(flags[i].opt->name, spec->file_option) == 0)
            file = flags[i].value;
    if (ok && file)
        ok = spec->load_file(spec, out, file, from, err, errlen);
    for (size_t i = 0; i < spec->nopts && ok; i++) {
        const OptDef *opt = &spec->opts[i];
        const char *env = opt->env && accepts(spec, opt, *cmd) ? getenv(opt->env) : NULL;
        if (env && *env) {
            ok = opts_set(opt, out, env, opt->env, err, errlen);
            from[i] = OPT_FROM_ENV;
        }
    }
    for (size_t i = 0; i < n_flags && ok; i++) {
        char source[128];
        snprintf(source, sizeof(source), "--%s", flags[i].opt->name);
        ok = opts_set(flags[i].opt, out, flags[i].value, source, err, errlen);
        from[flags[i].opt - spec->opts] = OPT_FROM_FLAG;
    }
    for (size_t i = 0; i < spec->nopts && ok; i++) {
        const OptDef *opt = &spec->opts[i];
        if (!((opt->required >> *cmd) & 1u) || is_set(out, opt))
            continue;
        if (opt->env)
            ok = optval_fail(err, errlen, "missing --%s (or set %s)", opt->name, opt->env);
        else
            ok = optval_fail(err, errlen, "missing --%s", opt->name);
    }
    if (sources)
        memcpy(sources, from, spec->nopts * sizeof(*from));
out:
    free(flags);
    free(from);
    return ok;
}

void opts_free(const OptSpec *spec, void *out)
{
    for (size_t i = 0; i < spec->nopts; i++) {
        void *field = (char *)out + spec->opts[i].offset;
        if (spec->opts[i].type == OPT_STRING) {
            char **slot = field;
            secrets_free_zeroed(*slot); /* values may be secrets: zeroed, not left in the heap */
            *slot = NULL;
        } else if (spec->opts[i].type == OPT_LIST) {
            OptList *list = field;
            for (size_t j = 0; j < list->len; j++) {
                free(list->items[j].key);
                secrets_free_zeroed(list->items[j].value);
            }
            free(list->items);
            list->items = NULL;
            list->len = 0;
        }
    }
}

static void print_option(const OptSpec *spec, const OptDef *o, bool with_cmds, FILE *out);

void opts_print_help(const OptSpec *spec, FILE *out)
{
    fprintf(out, "Usage: %s COMMAND [OPTIONS]\n\n%s\n\nCommands:\n", spec->prog, spec->summary);
    for (size_t i = 0; i < spec->ncmds; i++)
        fprintf(out, "  %-10s %s\n", spec->cmds[i].name, spec->cmds[i].help);
    fprintf(out, "\nOptions (precedence: flag > environment > %sdefault):\n",
            spec->file_option ? "config file > " : "");
    for (size_t i = 0; i < spec->nopts; i++)
        print_option(spec, &spec->opts[i], true, out);

    if (spec->help_footer)
        fputs(spec->help_footer, out);
    fprintf(out, "\nExit status: 0 on success, 1 on a runtime failure, 2 on bad input.\n");
}

int opts_help_command(const OptSpec *spec, int argc, char **argv)
{
    if (argc < 3 || argv[1][0] == '-')
        return -1;
    for (size_t i = 0; i < spec->ncmds; i++) {
        const CmdDef *c = &spec->cmds[i];
        if (strcmp(argv[1], c->name) != 0 || c->id == spec->help_cmd || c->id == spec->version_cmd)
            continue;
        for (int a = 2; a < argc; a++)
            if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0)
                return c->id;
    }
    return -1;
}

/* One option's line of --help; with_cmds adds the commands it is limited to. */
static void print_option(const OptSpec *spec, const OptDef *o, bool with_cmds, FILE *out)
{
    char lhs[64], cmds[128] = "";
    size_t used = 0;
    snprintf(lhs, sizeof(lhs), "--%s %s", o->name, o->metavar);
    for (size_t c = 0; with_cmds && o->commands && c < spec->ncmds; c++)
        if (applies(o, spec->cmds[c].id) && used < sizeof(cmds))
            used += (size_t)snprintf(cmds + used, sizeof(cmds) - used, "%s%s", used ? "," : "",
                                     spec->cmds[c].name);
    fprintf(out, "  %-28s %s", lhs, o->help);
    if (o->env)
        fprintf(out, " [env %s]", o->env);
    if (o->def)
        fprintf(out, " [default %s]", o->def);
    if (o->reloadable)
        fprintf(out, " [SIGHUP]");
    if (cmds[0])
        fprintf(out, " (%s)", cmds);
    fputc('\n', out);
}

void opts_print_command_help(const OptSpec *spec, int cmd, FILE *out)
{
    const CmdDef *c = find_command(spec, cmd);
    fprintf(
        out,
        "Usage: %s %s [OPTIONS]\n\n%s.\n\nOptions (precedence: flag > environment > %sdefault):\n",
        spec->prog, c->name, c->help, spec->file_option ? "config file > " : "");
    for (size_t i = 0; i < spec->nopts; i++)
        if (applies(&spec->opts[i], cmd))
            print_option(spec, &spec->opts[i], false, out);
    if (spec->help_footer)
        fputs(spec->help_footer, out);
    fprintf(out,
            "\nEvery command and option: %s --help. Exit status: 0 on success, 1 on a runtime "
            "failure, 2 on bad input.\n",
            spec->prog);
}

void opts_print_man(const OptSpec *spec, FILE *out)
{
    manpage_section(out, "COMMANDS");
    for (size_t i = 0; i < spec->ncmds; i++)
        manpage_command(out, spec->cmds[i].name, spec->cmds[i].help);
    manpage_section(out, "OPTIONS");
    char text[200];
    snprintf(text, sizeof(text), "Precedence: flag > environment > %sdefault.%s%s%s\n",
             spec->file_option ? "config file > " : "",
             spec->file_option ? " Every option is also a key of the config file (--" : "",
             spec->file_option ? spec->file_option : "",
             spec->file_option ? "), spelled the same." : "");
    manpage_text(out, text);
    for (size_t i = 0; i < spec->nopts; i++) {
        const OptDef *o = &spec->opts[i];
        /* The notes --help gives as [SIGHUP] and (commands), as sentences. */
        char note[200] = "";
        size_t used = 0;
        if (o->reloadable)
            used += (size_t)snprintf(note, sizeof(note),
                                     "A running %s takes a new value over on SIGHUP.", spec->prog);
        for (size_t c = 0; o->commands && c < spec->ncmds && used < sizeof(note); c++)
            if (applies(o, spec->cmds[c].id))
                used += (size_t)snprintf(note + used, sizeof(note) - used, "%s%s",
                                         strstr(note, "Taken by:") ? " "
                                         : used                    ? " Taken by: "
                                                                   : "Taken by: ",
                                         spec->cmds[c].name);
        if (o->commands && used < sizeof(note))
            snprintf(note + used, sizeof(note) - used, ".");
        ManOption m = {o->name, o->metavar, o->help, o->env, o->def, note[0] ? note : NULL};
        manpage_option(out, &m);
    }
    manpage_section(out, "ENVIRONMENT");
    for (size_t i = 0; i < spec->nopts; i++)
        if (spec->opts[i].env)
            manpage_env(out, spec->opts[i].env, spec->opts[i].name);
}

/* One field of opts_print_table: tabs and newlines would split the row, so they become spaces. */
static void table_field(FILE *out, const char *text, bool last)
{
    for (const char *p = text ? text : ""; *p; p++)
        fputc(*p == '\t' || *p == '\n' ? ' ' : *p, out);
    fputc(last ? '\n' : '\t', out);
}

void opts_print_table(const OptSpec *spec, FILE *out)
{
    static const char *const type_names[] = {"string",   "integer",   "choice", "bool",
                                             "duration", "log-level", "list"};
    fputs("name\tmetavar\ttype\tdefault\tmin\tmax\tenv\treloadable\tcommands\taliases\tchoices\t"
          "help\n",
          out);
    for (size_t i = 0; i < spec->nopts; i++) {
        const OptDef *o = &spec->opts[i];
        char lo[32] = "", hi[32] = "", cmds[256] = "", names[256] = "", choices[256] = "";
        if (o->type == OPT_INT) {
            snprintf(lo, sizeof(lo), "%ld", o->min);
            snprintf(hi, sizeof(hi), "%ld", o->max);
        } else if (o->type == OPT_DURATION && o->min > 0) {
            snprintf(lo, sizeof(lo), "%ld", o->min); /* seconds; 0/off then refused */
            if (o->max > 0)                          /* seconds; none when 0 */
                snprintf(hi, sizeof(hi), "%ld", o->max);
        }
        size_t used = 0;
        for (size_t c = 0; o->commands && c < spec->ncmds && used < sizeof(cmds); c++)
            if (applies(o, spec->cmds[c].id))
                used += (size_t)snprintf(cmds + used, sizeof(cmds) - used, "%s%s", used ? "," : "",
                                         spec->cmds[c].name);
        used = 0;
        for (size_t a = 0; a < spec->naliases && used < sizeof(names); a++)
            if (strcmp(spec->aliases[a].name, o->name) == 0)
                used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
                                         used ? "," : "", spec->aliases[a].alias);
        used = 0;
        for (size_t c = 0; o->choices && o->choices[c] && used < sizeof(choices); c++)
            used += (size_t)snprintf(choices + used, sizeof(choices) - used, "%s%s",
                                     used ? "|" : "", o->choices[c]);
        table_field(out, o->name, false);
        table_field(out, o->metavar, false);
        table_field(out, type_names[o->type], false);
        table_field(out, o->def, false);
        table_field(out, lo, false);
        table_field(out, hi, false);
        table_field(out, o->env, false);
        table_field(out, o->reloadable ? "yes" : "no", false);
        table_field(out, o->commands ? cmds : "all", false);
        table_field(out, names, false);
        table_field(out, choices, false);
        table_field(out, o->help, true);
    }
}
