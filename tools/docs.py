#!/usr/bin/env python3
"""The documents' generated parts, and the checks of the rest (docs/development.md, "Documents").

    python3 tools/docs.py gen     # `make docs`: rewrite every generated part in place
    python3 tools/docs.py check   # `make docs-check` (run by `make test`): exit 1 on any finding

Generated where the code is the source, between `<!-- generated:NAME -->` and
`<!-- end generated:NAME -->` lines of a document (edit the code, then run `make docs`):
  options     docs/configuration.md  bin/outbox-relay --help-table (the option table)
  reloadable  docs/configuration.md  the same table's reloadable flag
  metrics     docs/operations.md     the HELP/TYPE definitions of relay/*/metrics.c
  sql         docs/schema.md         the CREATE/ADD COLUMN statements of migrations/*.sql
and whole files: man/outbox-relay.conf.5.in (from docs/configuration.md) and
man/outbox-relay-guarantees.7.in (from docs/guarantees.md), whose @DATE@ and @VERSION@ the
Makefile fills in for bin/man/.

Checked where it cannot be generated (README.md and docs/*.md):
  - each docs/*.md starts with "# Title", a blank line and a purpose line; README <= 250 lines;
  - every log line quoted as msg="..." is printed by the code (a string literal holds it);
  - an example log line of a fenced block (level=L msg="..." key=...) has the level and the
    fields, in order, of a log call of that message;
  - every --option named is one of the three programs' (--help) or listed in
    tools/docs-foreign-options.txt with the tool it belongs to;
  - every outbox_* name is a metric, or an object, column or role the migrations create, or
    listed in tools/docs-foreign-names.txt;
  - every relative link resolves, and so does its #anchor;
  - every test named, [NN_name] or "test NN", is one script of tests/it/;
  - the floors of docs/architecture.md name every module (.c) of lib/ and of relay/'s floors;
  - no C comment, nor a comment of a shell script of tests/, bench/ or tools/, points at a README
    heading or an issue number, and every docs/x.md#anchor they name resolves
    (tools/docs-comment-pending.txt lists files whose fix is pending elsewhere).
Python 3 standard library only (python3 is in tools/packages.txt [test]).
"""
import difflib
import glob
import os
import re
import subprocess
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELAY = os.environ.get("DOCS_RELAY_BIN", os.path.join(ROOT, "bin", "outbox-relay"))
DEMOS = [os.path.join(ROOT, "bin", n) for n in ("producer-demo", "consumer-demo")]
# The relay's floors (the Makefile's RELAY_DIRS), whose modules docs/architecture.md maps.
RELAY_FLOORS = ["relay", "relay/outbox", "relay/io", "relay/engine", "relay/service", "relay/cmd"]


def path(*p):
    return os.path.join(ROOT, *p)


def read(p):
    with open(path(p), encoding="utf-8") as f:
        return f.read()


# ---- sources ------------------------------------------------------------------------------------

def option_table():
    """The relay's options, from the table --help, the man page and the parser share."""
    out = subprocess.run([RELAY, "--help-table"], check=True, capture_output=True, text=True).stdout
    lines = out.rstrip("\n").split("\n")
    keys = lines[0].split("\t")
    return [dict(zip(keys, l.split("\t"))) for l in lines[1:]]


def c_string_literals(text):
    """Every string literal of a C file, adjacent ones joined (as the compiler does)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"'(\\.|[^'\\])'", "' '", text)
    out = []
    for m in re.finditer(r'"(?:\\.|[^"\\\n])*"(?:\s*"(?:\\.|[^"\\\n])*")*', text):
        parts = re.findall(r'"((?:\\.|[^"\\\n])*)"', m.group(0))
        s = "".join(parts)
        s = s.replace('\\"', '"').replace("\\\\", "\\").replace("\\n", "\n")
        out.append(s)
    return out


def log_calls(files):
    """{message: [(levels, keys)]} of the log calls whose message is a string literal (or
    `cond ? "a" : "b"`, both) and whose format is one: log_LEVEL(message, format, ...), and
    log_write(LEVEL, message, format, ...) with the levels its first argument names (all four
    when it names none: a variable). keys are the format's field names in order, with "*" where
    a conversion that is no field's value (a connection's tag, optional fields) may write any
    number of fields."""
    lit = r'((?:"(?:\\.|[^"\\])*"\s*)+)'
    join = lambda s: "".join(re.findall(r'"((?:\\.|[^"\\])*)"', s)).replace('\\"', '"')
    call = re.compile(r"\blog_(?:(debug|info|warn|error)\(|write\(((?:[^,;()]|\([^();]*\))*),)" +
                      r"\s*(?:[^\"(),;]*\?\s*" + lit + r"\s*:\s*)?" + lit + r",\s*" + lit)
    calls = {}
    for f in files:
        src = re.sub(r"/\*.*?\*/", " ", open(f, encoding="utf-8").read(), flags=re.S)
        for m in call.finditer(src):
            levels = {m.group(1)} if m.group(1) else \
                {l.lower() for l in re.findall(r"\bLOG_(DEBUG|INFO|WARN|ERROR)\b", m.group(2))} or \
                {"debug", "info", "warn", "error"}
            fmt = join(m.group(5))
            keys = []
            for t in re.finditer(r'([a-z_]+)="?(?=%)|%[-+ #0-9.*]*[lhz]*[a-zA-Z%]', fmt):
                if t.group(1):
                    keys.append(t.group(1))
                elif t.group(0) != "%%" and not re.search(r'=["]?$', fmt[:t.start()]):
                    keys.append("*")
            for msg in (m.group(3), m.group(4)):
                if msg:
                    calls.setdefault(join(msg), []).append((levels, keys))
    return calls


def metrics_file():
    found = sorted(glob.glob(path("relay", "*", "metrics.c")))
    if len(found) != 1:
        sys.exit(f"docs: expected one relay/*/metrics.c, found {found}")
    return found[0]


def metric_defs():
    """(name, type, labels, help) of every metric, in the order of the source."""
    src = open(metrics_file(), encoding="utf-8").read()
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    lit = r'((?:"(?:\\.|[^"\\])*"\s*)+)'
    join = lambda s: "".join(re.findall(r'"((?:\\.|[^"\\])*)"', s)).replace('\\"', '"')
    defs = []
    pat = re.compile(r'\b(header|gauge_int|gauge_seconds|render_histogram|family_counter|family_gauge|'
                     r'family_live)\(\s*out,\s*(?:&?set,\s*)?"([a-z_]+)",\s*(?:"([a-z]+)",\s*)?' + lit)
    for m in pat.finditer(src):
        fn, name, typ, help_ = m.group(1), m.group(2), m.group(3), join(m.group(4))
        typ = typ or {"gauge_int": "gauge", "gauge_seconds": "gauge", "family_gauge": "gauge",
                      "family_live": "gauge", "family_counter": "counter",
                      "render_histogram": "histogram"}[fn]
        labels = sorted(set(re.findall(re.escape(name) + r'\{([a-z_]+)=', src)) |
                        set(re.findall(r'series\(out, "' + re.escape(name) + r'", [^,]+, "([a-z_]+)=', src)))
        defs.append((name, typ, labels, help_))
    if len(defs) < 10:
        sys.exit(f"docs: only {len(defs)} metrics found in {metrics_file()}: has its form changed?")
    return defs


def sql_objects():
    """{(name, kind): (kind, detail, [migrations])} of what migrations/*.sql create (a trigger
    and its function may share a name)."""
    objs = {}

    def add(name, kind, detail, mig):
        key = (name, kind)
        if key in objs:
            if mig not in objs[key][2]:
                objs[key][2].append(mig)
        else:
            objs[key] = (kind, detail, [mig])

    for f in sorted(glob.glob(path("migrations", "*.sql"))):
        mig = os.path.basename(f)[:-4]
        text = open(f, encoding="utf-8").read()
        code = re.sub(r"--[^\n]*", "", text)
        for m in re.finditer(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\);", code, re.S):
            add(m.group(1), "table", "", mig)
            for line in m.group(2).split("\n"):
                c = re.match(r"\s+(\w+)\s+(\w+(?: \w+)?)", line)
                if c and c.group(1) not in ("CONSTRAINT", "PRIMARY"):
                    typ = c.group(2).split(" ")[0]
                    add(f"{m.group(1)}.{c.group(1)}", "column", typ, mig)
                k = re.match(r"\s+CONSTRAINT (\w+) (\w+)", line)
                if k:
                    add(k.group(1), "constraint", k.group(2).lower() + f" on {m.group(1)}", mig)
        for m in re.finditer(r"ALTER TABLE (\w+)(.*?);", code, re.S):
            for c in re.finditer(r"ADD COLUMN IF NOT EXISTS (\w+) (\w+)", m.group(2)):
                add(f"{m.group(1)}.{c.group(1)}", "column", c.group(2), mig)
        for m in re.finditer(r"CREATE (?:UNIQUE )?INDEX IF NOT EXISTS (\w+) ON (\w+)", code):
            add(m.group(1), "index", f"on {m.group(2)}", mig)
        for m in re.finditer(r"CREATE OR REPLACE FUNCTION (\w+)\(([^)]*)\)\s*RETURNS (\w+)", code):
            args = ", ".join(a.strip().split(" ")[-1] for a in m.group(2).split(",") if a.strip())
            add(m.group(1), "function", f"({args}) returns {m.group(3)}", mig)
        for m in re.finditer(r"CREATE TRIGGER (\w+) (BEFORE \w+|AFTER \w+)", code):
            add(m.group(1), "trigger", m.group(2).lower(), mig)
        if "CREATE ROLE %I" in code:
            for arr in re.findall(r"ARRAY\[('[^\]]*')\]", code):
                for r in re.findall(r"'(\w+)'", arr):
                    add(r, "role", "NOLOGIN", mig)
    return objs


# ---- generated parts ------------------------------------------------------------------------------

def md_cell(s):
    return s.replace("|", "\\|")


def duration_text(seconds):
    """Seconds as the largest whole unit a duration flag takes, as opts.c's refusal says them."""
    seconds = int(seconds)
    for unit, name in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= unit and seconds % unit == 0:
            return f"{seconds // unit}{name}"
    return f"{seconds}s"


def gen_options():
    rows = ["| option | default | range | environment | config file key | SIGHUP | Debezium name | used by | meaning |",
            "|---|---|---|---|---|---|---|---|---|"]
    for o in option_table():
        flag = f"`--{o['name']}" + (f" {o['metavar']}`" if o["metavar"] else "`")
        rng = ""
        if o["type"] == "integer":
            if o["max"] != str(2**63 - 1):
                rng = f"{o['min']}–{o['max']}"
            elif o["min"] != str(-2**63):
                rng = f"≥ {o['min']}"
            else:  # bounded by the type alone (--from-id): "≥ -9223372036854775808" said nothing
                rng = "any (64-bit)"
        elif o["choices"]:
            rng = ", ".join(f"`{c}`" for c in o["choices"].split("|"))
        elif o["type"] == "duration" and o["max"]:
            # A bounded duration (--statement-timeout: 1s to 1d): 72h and 7d would be refused.
            rng = f"`90s`, `30m`, `2h`; {duration_text(o['min'])} to {duration_text(o['max'])}"
        elif o["type"] == "duration":
            rng = "`90s`, `30m`, `72h`, `7d`; " + (f"at least {o['min']}s" if o["min"] else "`0`/`off`")
        elif o["type"] == "log-level":
            rng = "`debug`, `info`, `warn`, `error`"
        elif o["type"] == "bool":
            rng = "switch"
        # kafka-allow-unsafe: config.c refuses it from the file ("a flag only", its help says).
        if o["name"] == "config":
            key = "—"
        elif "a flag only" in o["help"]:
            key = "— (flag only)"
        else:
            key = f"`{o['name']}`" + (" (an object)" if o["type"] == "list" else "")
        deb = ", ".join(f"`{a}`" for a in o["aliases"].split(",") if a)
        rows.append("| " + " | ".join(md_cell(x) for x in [
            flag, f"`{o['default']}`" if o["default"] else "", rng,
            f"`{o['env']}`" if o["env"] else "", key,
            "**yes**" if o["reloadable"] == "yes" else "no", deb,
            "all" if o["commands"] == "all" else ", ".join(o["commands"].split(",")),
            o["help"]]) + " |")
    return "\n".join(rows)


def gen_reloadable():
    opts = option_table()
    yes = [f"- `--{o['name']}`: {o['help']}" for o in opts if o["reloadable"] == "yes"]
    return ("Reloaded on SIGHUP (the option table's reloadable options, `[SIGHUP]` in `--help`); "
            "every other option needs a restart:\n\n" + "\n".join(yes))


def gen_metrics():
    rows = ["| metric | type | labels | meaning (its HELP text) |", "|---|---|---|---|"]
    for name, typ, labels, help_ in metric_defs():
        rows.append(f"| `{name}` | {typ} | {', '.join('`'+l+'`' for l in labels)} | {md_cell(help_)} |")
    return "\n".join(rows)


def gen_sql():
    objs = sql_objects()
    rows = ["| object | kind | what | created by (then changed by) |", "|---|---|---|---|"]
    order = {"table": 0, "column": 1, "constraint": 2, "index": 3, "function": 4, "trigger": 5, "role": 6}
    for (name, _), (kind, detail, migs) in sorted(objs.items(), key=lambda kv: (order[kv[1][0]], kv[0][0] if kv[1][0] != "column" else "")):
        later = f" ({', '.join(migs[1:])})" if len(migs) > 1 else ""
        rows.append(f"| `{name}` | {kind} | {detail} | `{migs[0]}`{later} |")
    return "\n".join(rows)


REGIONS = {
    "options": ("docs/configuration.md", gen_options),
    "reloadable": ("docs/configuration.md", gen_reloadable),
    "metrics": ("docs/operations.md", gen_metrics),
    "sql": ("docs/schema.md", gen_sql),
}


def fill_regions(name_of_file, text, produce):
    """text with every generated region of this file rewritten (produce(region) -> body)."""
    pat = re.compile(r"(<!-- generated:(\w+) -->)\n(.*?)\n?(<!-- end generated:\2 -->)", re.S)
    found = set(m.group(2) for m in pat.finditer(text))

    # A region of a name this script does not know belongs to another generator: kept as it is.
    def body(m):
        if m.group(2) not in REGIONS:
            return m.group(0)
        return f"{m.group(1)}\n{produce(m.group(2))}\n{m.group(4)}"
    return pat.sub(body, text), found


# ---- Markdown to man(7) -----------------------------------------------------------------------------
# The subset the documents use: headings, paragraphs, lists (two levels), fenced code, tables (each
# row a tagged paragraph: first cell the tag, the others "header: cell"), `code`, **bold**, *italic*,
# [links](target) (the text only). Every non-ASCII character is written as \[uXXXX], so the page is
# ASCII and groff needs no preconv.

def roff_escape(s):
    s = s.replace("\\", "\\e")
    out = []
    for ch in s:
        if ord(ch) > 127:
            out.append("\\[u%04X]" % ord(ch))
        elif ch == "-":
            out.append("\\-")
        else:
            out.append(ch)
    return "".join(out)


def roff_inline(s):
    # Links: the text only; a link to another document names it.
    s = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", lambda m: m.group(1), s)
    parts = re.split(r"(`[^`]*`)", s)
    out = []
    for p in parts:
        if p.startswith("`") and p.endswith("`") and len(p) >= 2:
            out.append("\\fB" + roff_escape(p[1:-1]) + "\\fR")
            continue
        p = roff_escape(p)
        p = re.sub(r"\*\*(.+?)\*\*", r"\\fB\1\\fR", p)
        p = re.sub(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])", r"\\fI\1\\fR", p)
        out.append(p)
    return "".join(out)


def roff_line(s):
    s = roff_inline(s)
    return "\\&" + s if s.startswith((".", "'")) else s


def md_to_man(md, name, section, title, date, version):
    lines = md.split("\n")
    out = [f'.\\" Generated by tools/docs.py from the Markdown document; edit that, then run make docs.',
           f'.TH {name.upper()} {section} "{date}" "outbox-relay {version}" "{title}"', ".nh", ".ad l"]
    i = 0
    # The title line and the purpose line make NAME.
    head = lines[0].lstrip("# ").strip()
    purpose = lines[2].lstrip("> ").strip() if len(lines) > 2 else ""
    out += [".SH NAME", f"{name} \\- {roff_inline(head)}"]
    if purpose:
        out += [".SH DESCRIPTION", roff_line(purpose)]
    i = 3
    in_list = 0
    def para_break():
        nonlocal in_list
        while in_list > 1:
            out.append(".RE")
            in_list -= 1
        in_list = 0
    while i < len(lines):
        l = lines[i]
        if l.startswith("<!--"):
            while i < len(lines) and "-->" not in lines[i]:
                i += 1
            i += 1
            continue
        if l.startswith("```"):
            para_break()
            out += [".PP", ".nf", ".RS 4"]
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                out.append("\\&" + roff_escape(lines[i]))
                i += 1
            out += [".RE", ".fi"]
            i += 1
            continue
        m = re.match(r"^(#{2,4}) (.*)", l)
        if m:
            para_break()
            t = roff_inline(m.group(2))
            out.append((".SH " if len(m.group(1)) == 2 else ".SS ") + (t.upper() if len(m.group(1)) == 2 else t))
            i += 1
            continue
        if l.startswith("|"):
            para_break()
            header = [c.strip() for c in l.strip().strip("|").split(" | ")]
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in re.split(r"(?<!\\) \| ", lines[i].strip()[1:-1].strip())]
                cells = [c.replace("\\|", "|") for c in cells]
                out += [".TP", roff_line(cells[0])]
                rest = []
                for h, c in zip(header[1:], cells[1:]):
                    if c:
                        rest.append(f"{h}: {c}" if h else c)
                out.append(roff_line("; ".join(rest)) if rest else "\\&")
                i += 1
            continue
        m = re.match(r"^( *)(?:- |\d+\. )(.*)", l)
        if m:
            level = 1 if len(m.group(1)) < 2 else 2
            if level == 2 and in_list == 1:
                out.append(".RS 2")
                in_list = 2
            elif level == 1 and in_list == 2:
                out.append(".RE")
                in_list = 1
            in_list = max(in_list, level)
            text = [m.group(2)]
            i += 1
            # A comment line (a generated region's end marker) ends the item: it is not text.
            while i < len(lines) and lines[i].strip() and not re.match(r"^ *(?:- |\d+\. )", lines[i]) \
                    and not lines[i].startswith(("```", "|", "#", "<!--")):
                text.append(lines[i].strip())
                i += 1
            out += [".IP \\(bu 2", roff_line(" ".join(text))]
            continue
        if not l.strip():
            i += 1
            continue
        para_break()
        text = []
        while i < len(lines) and lines[i].strip() and not lines[i].startswith(("```", "|", "#", "<!--")) \
                and not re.match(r"^ *(?:- |\d+\. )", lines[i]):
            text.append(lines[i].strip())
            i += 1
        out += [".PP", roff_line(" ".join(text))]
    para_break()
    return "\n".join(out) + "\n"


MAN_PAGES = [
    # (page, source document, man name, section, title)
    ("man/outbox-relay.conf.5.in", "docs/configuration.md", "outbox-relay.conf", 5, "File Formats"),
    ("man/outbox-relay-guarantees.7.in", "docs/guarantees.md", "outbox-relay-guarantees", 7, "Miscellaneous"),
]


def man_page(src, name, section, title):
    # @DATE@ and @VERSION@ stay: the Makefile fills them in when it builds bin/man/ (as
    # tools/gen-man.sh does for section 1), so the committed page changes only with its source.
    return md_to_man(read(src), name, section, title, "@DATE@", "@VERSION@")


def generated():
    """{file: expected content} of every file with a generated part."""
    want = {}
    cache = {}
    def produce(region):
        if region not in cache:
            cache[region] = REGIONS[region][1]()
        return cache[region]
    for f in sorted(set(r[0] for r in REGIONS.values())):
        text, found = fill_regions(f, read(f), produce)
        missing = [r for r, (ff, _) in REGIONS.items() if ff == f and r not in found]
        if missing:
            sys.exit(f"docs: {f} has no <!-- generated:{missing[0]} --> region")
        want[f] = text
    return want


def gen():
    for f, text in generated().items():
        if read(f) != text:
            open(path(f), "w", encoding="utf-8").write(text)
            print(f"docs: wrote {f}")
    for page, src, name, section, title in MAN_PAGES:
        text = man_page(src, name, section, title)
        if not os.path.exists(path(page)) or read(page) != text:
            open(path(page), "w", encoding="utf-8").write(text)
            print(f"docs: wrote {page}")


# ---- checks ---------------------------------------------------------------------------------------

def slug(heading):
    """GitHub's anchor for a heading."""
    h = re.sub(r"`|\*\*|\*", "", heading.strip().lower())
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)
    h = "".join(ch for ch in h if ch.isalnum() or ch in " -_" or unicodedata.category(ch).startswith("L"))
    return h.replace(" ", "-")


def anchors(md):
    seen, out = {}, set()
    fence = False
    for l in md.split("\n"):
        if l.startswith("```"):
            fence = not fence
        if fence:
            continue
        m = re.match(r"^#{1,6} (.*)", l)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
        for a in re.findall(r'<a (?:id|name)="([^"]+)"', l):
            out.add(a)
    return out


def prose(md):
    """The document with its fenced code blanked out, line numbers kept (for links and prose)."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), md, flags=re.S | re.M)


def names_in_file(p):
    return [l.split()[0] for l in read(p).split("\n") if l.strip() and not l.startswith("#")]


def program_options():
    opts = set()
    for prog in [RELAY] + DEMOS:
        out = subprocess.run([prog, "--help"], capture_output=True, text=True).stdout
        opts |= set(re.findall(r"^  --([a-z0-9.-]+)", out, re.M))
    return opts


def check():
    problems = []
    say = lambda msg: problems.append(msg)
    docs = ["README.md"] + sorted(os.path.relpath(f, ROOT) for f in glob.glob(path("docs", "*.md")))

    # Generated parts as the code would write them.
    for f, text in generated().items():
        if read(f) != text:
            diff = difflib.unified_diff(read(f).split("\n"), text.split("\n"), "as written", "as the code gives",
                                        n=0, lineterm="")
            say(f"{f}: a generated part differs from what the code gives: run `make docs` (and commit)\n    "
                + "\n    ".join(list(diff)[:12]))
    for page, src, name, section, title in MAN_PAGES:
        if not os.path.exists(path(page)) or read(page) != man_page(src, name, section, title):
            say(f"{page}: differs from what {src} gives: run `make docs` (and commit)")
        # Markdown's comments (the generated regions' markers) are not text: a page showing one
        # ("<!-- end generated:reloadable -->" after a list item) was converted wrongly.
        for ln, l in enumerate(man_page(src, name, section, title).split("\n"), 1):
            if re.search(r"<!\\?-\\?-|\\?-\\?->", l):
                say(f"{page}:{ln}: shows a Markdown comment as text: {l.strip()[:100]}")

    # An option's range is what an operator may give: a 64-bit integer's own limits are no
    # limit to state (the options table showed "≥ -9223372036854775808" for --from-id).
    for o in option_table():
        if o["type"] == "integer" and (o["min"] == str(-2**63) or o["max"] == str(2**63 - 1)):
            row = next((l for l in gen_options().split("\n") if l.startswith(f"| `--{o['name']}")), "")
            if str(2**63 - 1) in row or str(-2**63) in row:
                say(f"docs/configuration.md: --{o['name']}'s range states a 64-bit integer's limit: {row[:120]}")

    # Shape.
    n = read("README.md").count("\n")
    if n > 250:
        say(f"README.md: {n} lines, more than 250: move detail to docs/")
    for f in docs[1:]:
        ls = read(f).split("\n")
        if len(ls) < 3 or not ls[0].startswith("# ") or ls[1] or not ls[2].strip():
            say(f"{f}:1: no '# Title', blank line, purpose line at the top")

    # Log lines.
    literals = []
    for f in glob.glob(path("relay", "**", "*.c"), recursive=True) + glob.glob(path("lib", "*.c")) + \
            glob.glob(path("producer-demo", "*.[ch]")) + glob.glob(path("consumer-demo", "*.[ch]")):
        literals += c_string_literals(open(f, encoding="utf-8").read())
    # A message built with printf: its conversions stand for any text in the quote.
    formats = [re.compile("".join(".*?" if re.match(r"%[-+ #0-9.]*[lhz]*[a-zA-Z]", t) else re.escape(t)
                                  for t in re.split(r"(%[-+ #0-9.]*[lhz]*[a-zA-Z])", s.replace("%%", "%"))))
               for s in literals if "%" in s and len(s) > 20]
    for f in docs:
        for ln, l in enumerate(read(f).split("\n"), 1):
            for q in re.findall(r'msg="([^"]+)"', l):
                pieces = [p for p in re.split(r"…|\.\.\.", q) if p.strip()]
                if not any(all(p in s for p in pieces) for s in literals) and \
                        not any(r.search(q) for r in formats):
                    say(f'{f}:{ln}: log line msg="{q}" is not printed by the code')

    # Example log lines (a line of a fenced block: [TIME ]level=LEVEL msg="…" key=value …) show
    # what the code prints: a message logged at that level, with the fields of one of its calls,
    # in order (a conversion of the format that is no field's value, a connection's tag, may
    # stand for any fields). A message no call names whole is left to the check above.
    calls = log_calls(glob.glob(path("relay", "**", "*.c"), recursive=True) + glob.glob(path("lib", "*.c")) +
                      glob.glob(path("producer-demo", "*.c")) + glob.glob(path("consumer-demo", "*.c")))
    for f in docs:
        fence = False
        for ln, l in enumerate(read(f).split("\n"), 1):
            if l.startswith("```"):
                fence = not fence
                continue
            m = re.match(r'^(?:\S+Z )?level=([a-z]+) msg="((?:\\.|[^"\\])*)"(.*)$', l) if fence else None
            if not m or m.group(2) not in calls:
                continue
            keys = re.findall(r' ([a-z_]+)=(?:"(?:\\.|[^"\\])*"|\S*)', m.group(3))
            shown = "".join(k + " " for k in keys)
            if not any(m.group(1) in levels and
                       re.fullmatch("".join(r"(?:[a-z_]+ )*" if k == "*" else re.escape(k + " ") for k in ks), shown)
                       for levels, ks in calls[m.group(2)]):
                said = "; ".join("level=" + "|".join(sorted(levels)) + " " +
                                 " ".join(k if k == "*" else k + "=" for k in ks)
                                 for levels, ks in calls[m.group(2)])
                say(f'{f}:{ln}: example log line msg="{m.group(2)}" shows level={m.group(1)} '
                    f"{' '.join(k + '=' for k in keys)}, the code prints {said}")

    # Log lines quoted in prose: a code span of three or more lower-case words (fields such as
    # `key=…` may follow) is taken for a message and must be printed by the code, unless
    # tools/docs-foreign-text.txt says whose text it is (PostgreSQL's, a shell's).
    foreign = [l.strip() for l in read("tools/docs-foreign-text.txt").split("\n")
               if l.strip() and not l.startswith("#")]
    for f in docs:
        text = prose(read(f))
        for m in re.finditer(r"`([^`]+)`", text):
            span = re.sub(r"\s+", " ", m.group(1))
            head = re.split(r" [a-z_]+=", span)[0]
            if not re.fullmatch(r"[a-z][a-z' ,:;()]*[a-z)…]", head.replace(" …", "…")) or len(head.split()) < 3:
                continue
            pieces = [p.strip() for p in head.split("…") if p.strip()]
            if any(all(p in s for p in pieces) for s in literals) or any(r.search(head) for r in formats):
                continue
            if head not in foreign:
                ln = text[:m.start()].count("\n") + 1
                say(f"{f}:{ln}: `{span}` reads as a log line the code does not print "
                    f"(or add it to tools/docs-foreign-text.txt with whose text it is)")

    # Options.
    known = program_options() | set(names_in_file("tools/docs-foreign-options.txt"))
    for f in docs:
        for ln, l in enumerate(read(f).split("\n"), 1):
            for o in re.findall(r"(?<![\w/.-])--([a-z][a-z0-9.-]*[a-z0-9])", l):
                if o not in known:
                    say(f"{f}:{ln}: --{o} is an option of none of the programs (nor listed in tools/docs-foreign-options.txt)")

    # outbox_* names: metrics (with their _bucket/_sum/_count series), SQL objects, roles.
    names = set()
    for name, typ, _, _ in metric_defs():
        names.add(name)
        if typ == "histogram":
            names |= {name + s for s in ("_bucket", "_sum", "_count")}
    for name, _ in sql_objects():
        names.add(name.split(".")[-1])
    names |= set(names_in_file("tools/docs-foreign-names.txt"))
    for f in docs:
        for ln, l in enumerate(read(f).split("\n"), 1):
            for nm in re.findall(r"(?<![\w.-])(outbox_[a-z0-9_]*[a-z0-9])(?![\w-])", l):
                if nm not in names:
                    say(f"{f}:{ln}: {nm} is no metric, no object of migrations/ (nor in tools/docs-foreign-names.txt)")

    # The floors of architecture.md name every module: each .c of lib/ and of relay/ and its
    # floors is a word of its directory's entry (a module added without a word there is a part of
    # the code the map does not show).
    arch = read("docs/architecture.md")
    m = re.search(r"^## Floors\n.*?^```\n(.*?)^```", arch, flags=re.S | re.M)
    entries = {}
    for block in re.split(r"\n(?=\S)", m.group(1) if m else ""):
        label = block.split()[0] if block.strip() else ""
        folder = label.rstrip("/") if label.endswith("/") else os.path.dirname(label)
        entries[folder] = entries.get(folder, "") + " " + block
    if not m:
        say("docs/architecture.md: no code block under '## Floors' to check the modules against")
    for folder in ["lib"] + RELAY_FLOORS:
        for c in sorted(glob.glob(path(folder, "*.c"))):
            name = os.path.basename(c)[:-2]
            if m and not re.search(r"(?<![\w])" + re.escape(name) + r"(?![\w])", entries.get(folder, "")):
                say(f"docs/architecture.md: the floors do not name {folder}/{name}.c (under {folder}/)")

    # Tests named in the documents: [NN_name] (the failure modes' measurements) is a script of
    # tests/it/, and "test NN" names exactly one (two groups may share a number).
    scripts = [os.path.basename(t)[:-3] for t in glob.glob(path("tests", "it", "*", "*.sh"))]
    for f in docs:
        for ln, l in enumerate(prose(read(f)).split("\n"), 1):
            for t in re.findall(r"\[(\d\d_[a-z0-9_]+)\](?!\()", l):
                if t not in scripts:
                    say(f"{f}:{ln}: [{t}] is no test of tests/it/")
            for n in re.findall(r"\btest (\d\d)\b(?! ?(?:ms|s|%))", l):
                named = sorted(t for t in scripts if t.startswith(n + "_"))
                if len(named) != 1:
                    say(f"{f}:{ln}: 'test {n}' names " + (" and ".join(named) if named else "no test of tests/it/")
                        + ": name it as [NN_name]")

    # Links and anchors.
    for f in docs:
        base = os.path.dirname(path(f))
        for ln, l in enumerate(prose(read(f)).split("\n"), 1):
            l = re.sub(r"`[^`]*`", "", l)
            for target in re.findall(r"\]\(([^)\s]+)\)", l):
                if re.match(r"^[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(base, file)) if file else path(f)
                if not os.path.exists(dest):
                    say(f"{f}:{ln}: link ({target}): no such file")
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors(open(dest, encoding="utf-8").read()):
                    say(f"{f}:{ln}: link ({target}): no heading gives #{anchor}")

    # Comments point at docs/, not at README headings or issue numbers. C files are read whole (a
    # string literal citing an issue is as stale as a comment); a shell script's comments are its
    # lines whose first non-blank character is '#' (the shebang aside), each read with the start
    # of the next comment line, so "issue" at the end of one line and "45" on the next is found.
    # README.md as a file name is the current README; "README" alone, or README.md#anchor, is a
    # heading of it (the old README's, whose content is in docs/ now).
    pending = set(names_in_file("tools/docs-comment-pending.txt"))
    cited = re.compile(r"\bREADME\b(?!\.md(?!#))|\(issues? \d+|\bissues? \d+\)|\bissue #?\d+\b")

    def comment(rel, ln, l, text):
        for doc, _, anchor in re.findall(r"\b(docs/[\w.-]+\.md)(#([\w-]+))?", l):
            if not os.path.exists(path(doc)):
                say(f"{rel}:{ln}: points at {doc}, which does not exist")
            elif anchor and anchor not in anchors(read(doc)):
                say(f"{rel}:{ln}: points at {doc}#{anchor}, which no heading gives")
        if any(m.start() < len(l) for m in cited.finditer(text)):
            if rel in pending:
                print(f"docs-check: pending (tools/docs-comment-pending.txt): {rel}:{ln}: {l.strip()}")
            else:
                say(f"{rel}:{ln}: points at the README or an issue number, not at docs/: {l.strip()}")

    for f in sorted(glob.glob(path("relay", "**", "*.[ch]"), recursive=True) + glob.glob(path("lib", "*.[ch]")) +
                    glob.glob(path("producer-demo", "*.[ch]")) + glob.glob(path("consumer-demo", "*.[ch]"))):
        rel = os.path.relpath(f, ROOT)
        for ln, l in enumerate(open(f, encoding="utf-8").read().split("\n"), 1):
            comment(rel, ln, l, l)
    for f in sorted(glob.glob(path("tests", "**", "*.sh"), recursive=True) + glob.glob(path("bench", "*.sh")) +
                    glob.glob(path("tools", "*.sh"))):
        rel = os.path.relpath(f, ROOT)
        lines = open(f, encoding="utf-8").read().split("\n")
        notes = [(ln, l) for ln, l in enumerate(lines, 1)
                 if l.lstrip().startswith("#") and not (ln == 1 and l.startswith("#!"))]
        for i, (ln, l) in enumerate(notes):
            nxt = notes[i + 1] if i + 1 < len(notes) else (0, "")
            after = nxt[1].lstrip().lstrip("#").lstrip() if nxt[0] == ln + 1 else ""
            comment(rel, ln, l, l.rstrip() + " " + after[:20])

    for p in problems:
        print(f"docs-check: {p}", file=sys.stderr)
    if problems:
        print(f"docs-check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"docs-check: {len(docs)} documents: generated parts current, log lines, options, names, links and comments checked")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("gen", "check"):
        sys.exit("usage: tools/docs.py gen|check")
    if sys.argv[1] == "gen":
        gen()
    else:
        sys.exit(check())
