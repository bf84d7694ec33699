#include "opts.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "optval.h"

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (!q) {
        perror("out of memory");
        exit(1);
    }
    return q;
}

static const OptDef *find_option(const OptSpec *spec, const char *name, size_t len)
{
    for (size_t i = 0; i < spec->nopts; i++)
        if (strlen(spec->opts[i].name) == len && strncmp(spec->opts[i].name, name, len) == 0)
            return &spec->opts[i];
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
    return (opt->commands >> cmd) & 1u;
}

/* Checks one textual value and stores it; source names where it came from ("--rate",
 * "DATABASE_URL", "default") so the error says exactly what to fix. */
static bool set_value(void *out, const OptDef *opt, const char *value, const char *source,
                      char *err, size_t errlen)
{
    void *field = (char *)out + opt->offset;
    switch (opt->type) {
    case OPT_STRING:
        return optval_string(field, value, source, err, errlen);
    case OPT_INT:
        return optval_long(field, value, opt->min, opt->max, source, err, errlen);
    case OPT_LOG_LEVEL:
        if (!log_level_parse(value, (LogLevel *)field))
            return optval_fail(err, errlen, "%s: expected debug, info, warn or error, got '%s'",
                               source, value);
        return true;
    case OPT_LIST: {
        OptList *list = field;
        const char *eq = strchr(value, '=');
        if (!eq || eq == value)
            return optval_fail(err, errlen, "%s: expected KEY=VALUE, got '%s'", source, value);
        list->items = xrealloc(list->items, (list->len + 1) * sizeof(*list->items));
        list->items[list->len++] = strdup(value);
        return true;
    }
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
        return true; /* numbers and levels always have a default */
    }
}

/* A flag from the command line, applied after defaults and the environment so that it wins. */
typedef struct Flag {
    const OptDef *opt;
    const char *value;
} Flag;

bool opts_parse(const OptSpec *spec, void *out, int *cmd, int argc, char **argv, char *err,
                size_t errlen)
{
    *cmd = spec->help_cmd;
    int first = 1;
    const char *arg1 = argc > 1 ? argv[1] : NULL;
    if (arg1 && (strcmp(arg1, "--help") == 0 || strcmp(arg1, "-h") == 0))
        return true;
    if (arg1 && (strcmp(arg1, "--version") == 0 || strcmp(arg1, "-V") == 0)) {
        *cmd = spec->version_cmd;
        return true;
    }
    if (arg1 && arg1[0] != '-') {
        const CmdDef *found = NULL;
        for (size_t i = 0; i < spec->ncmds; i++)
            if (strcmp(arg1, spec->cmds[i].name) == 0)
                found = &spec->cmds[i];
        if (!found)
            return optval_fail(err, errlen, "unknown command '%s': try '%s --help'", arg1,
                               spec->prog);
        *cmd = found->id;
        first = 2;
    } else if (spec->default_cmd >= 0) {
        *cmd = spec->default_cmd;
    } else if (arg1) {
        return optval_fail(err, errlen, "expected a command before '%s': try '%s --help'", arg1,
                           spec->prog);
    } else {
        return optval_fail(err, errlen, "missing command: try '%s --help'", spec->prog);
    }
    if (*cmd == spec->help_cmd || *cmd == spec->version_cmd)
        return true;
    const char *cmd_name = find_command(spec, *cmd)->name;

    Flag *flags = calloc((size_t)argc + 1, sizeof(*flags));
    size_t n_flags = 0;
    bool ok = true;
    if (!flags) {
        perror("out of memory");
        exit(1);
    }
    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            *cmd = spec->help_cmd;
            goto out;
        }
        if (strncmp(arg, "--", 2) != 0) {
            ok = optval_fail(err, errlen, "unexpected argument '%s': try '%s --help'", arg,
                             spec->prog);
            goto out;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const OptDef *opt = find_option(spec, name, name_len);
        if (!opt) {
            ok = optval_fail(err, errlen, "unknown option '--%.*s': try '%s --help'", (int)name_len,
                             name, spec->prog);
            goto out;
        }
        if (!applies(opt, *cmd)) {
            ok =
                optval_fail(err, errlen, "option --%s does not apply to '%s'", opt->name, cmd_name);
            goto out;
        }
        const char *value = eq ? eq + 1 : NULL;
        if (!value) {
            if (i + 1 >= argc) {
                ok = optval_fail(err, errlen, "option --%s needs a value (%s)", opt->name,
                                 opt->metavar);
                goto out;
            }
            value = argv[++i];
        }
        flags[n_flags++] = (Flag){opt, value};
    }

    for (size_t i = 0; i < spec->nopts && ok; i++) {
        const OptDef *opt = &spec->opts[i];
        if (!applies(opt, *cmd))
            continue;
        if (opt->def)
            ok = set_value(out, opt, opt->def, "default", err, errlen);
        const char *env = opt->env ? getenv(opt->env) : NULL;
        if (ok && env && *env)
            ok = set_value(out, opt, env, opt->env, err, errlen);
    }
    for (size_t i = 0; i < n_flags && ok; i++) {
        char source[128];
        snprintf(source, sizeof(source), "--%s", flags[i].opt->name);
        ok = set_value(out, flags[i].opt, flags[i].value, source, err, errlen);
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
out:
    free(flags);
    return ok;
}

void opts_free(const OptSpec *spec, void *out)
{
    for (size_t i = 0; i < spec->nopts; i++) {
        void *field = (char *)out + spec->opts[i].offset;
        if (spec->opts[i].type == OPT_STRING) {
            char **slot = field;
            free(*slot);
            *slot = NULL;
        } else if (spec->opts[i].type == OPT_LIST) {
            OptList *list = field;
            for (size_t j = 0; j < list->len; j++)
                free(list->items[j]);
            free(list->items);
            list->items = NULL;
            list->len = 0;
        }
    }
}

void opts_print_help(const OptSpec *spec, FILE *out)
{
    fprintf(out, "Usage: %s COMMAND [OPTIONS]\n\n%s\n\nCommands:\n", spec->prog, spec->summary);
    for (size_t i = 0; i < spec->ncmds; i++)
        fprintf(out, "  %-10s %s\n", spec->cmds[i].name, spec->cmds[i].help);
    fprintf(out, "\nOptions (precedence: flag > environment > default):\n");
    for (size_t i = 0; i < spec->nopts; i++) {
        const OptDef *o = &spec->opts[i];
        char lhs[64], cmds[128] = "";
        size_t used = 0;
        snprintf(lhs, sizeof(lhs), "--%s %s", o->name, o->metavar);
        for (size_t c = 0; c < spec->ncmds; c++)
            if (applies(o, spec->cmds[c].id) && used < sizeof(cmds))
                used += (size_t)snprintf(cmds + used, sizeof(cmds) - used, "%s%s", used ? "," : "",
                                         spec->cmds[c].name);
        fprintf(out, "  %-26s %s", lhs, o->help);
        if (o->env)
            fprintf(out, " [env %s]", o->env);
        if (o->def)
            fprintf(out, " [default %s]", o->def);
        fprintf(out, " (%s)\n", cmds);
    }
    fprintf(out, "\nExit status: 0 on success, 1 on a runtime failure, 2 on bad input.\n");
}
