#include "manpage.h"

#include <stdbool.h>

void manpage_text(FILE *out, const char *text)
{
    bool line_start = true;
    for (const char *p = text; *p; p++) {
        /* A line starting with '.' or '\'' would be read as a request: \& is a zero-width
         * character that keeps it text. */
        if (line_start && (*p == '.' || *p == '\''))
            fputs("\\&", out);
        line_start = *p == '\n';
        if (*p == '\\')
            fputs("\\e", out);
        else if (*p == '-')
            fputs("\\-", out);
        else
            fputc(*p, out);
    }
}

void manpage_section(FILE *out, const char *title)
{
    fprintf(out, ".SH %s\n", title);
}

void manpage_command(FILE *out, const char *name, const char *help)
{
    fputs(".TP\n\\fB", out);
    manpage_text(out, name);
    fputs("\\fR\n", out);
    manpage_text(out, help);
    fputc('\n', out);
}

void manpage_option(FILE *out, const ManOption *o)
{
    fputs(".TP\n\\fB\\-\\-", out);
    manpage_text(out, o->name);
    fputs("\\fR", out);
    if (o->metavar && *o->metavar) {
        fputs(" \\fI", out);
        manpage_text(out, o->metavar);
        fputs("\\fR", out);
    }
    fputc('\n', out);
    manpage_text(out, o->help);
    fputs(".\n", out);
    if (o->env) {
        fputs("Environment: \\fB", out);
        manpage_text(out, o->env);
        fputs("\\fR.\n", out);
    }
    if (o->def) {
        fputs("Default: \\fB", out);
        manpage_text(out, o->def);
        fputs("\\fR.\n", out);
    }
    if (o->note) {
        manpage_text(out, o->note);
        fputc('\n', out);
    }
}

void manpage_env(FILE *out, const char *env, const char *option)
{
    fputs(".TP\n\\fB", out);
    manpage_text(out, env);
    fputs("\\fR\n", out);
    fputs("Read when \\fB\\-\\-", out);
    manpage_text(out, option);
    fputs("\\fR is not on the command line.\n", out);
}
