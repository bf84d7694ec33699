#include "serializer.h"

#include <avro.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsontext.h"
#include "log.h"
#include "registry.h"
#include "utf8.h"

/* Confluent's wire format: magic byte 0, then the schema id as 4 bytes big-endian. */
#define WIRE_HEADER 5
/* Deeper payloads than this are refused rather than walked (the recursion's bound). */
#define DEPTH_MAX 64
/* What building an Avro value may take, as a multiple of the bound on its encoding (the
 * producer's message.max.bytes): a payload of that many bytes has at most half as many values, an
 * array's item a slot of 8 in avro-c, which keeps up to twice as many slots as items (Path.held
 * counts them so): 8 times the payload, and its strings' bytes besides, fit. A string's, an
 * array's or a map's slot is larger (avro_inline): many of them fit fewer. */
#define MEMORY_FACTOR 16

struct Serializer {
    Registry *registry;
    ValueFormat format;
    SubjectStrategy strategy;
    size_t max_len; /* the producer's message.max.bytes: no value is built beyond it */
    SerializerReadyFn ready;
    void *arg;
};

/* A decimal logical type of the schema (avro-c parses the schema but drops logicalType: it is
 * read from the schema's JSON text). Where it sits: a fixed by its own schema (index -1, each
 * fixed is one object), a bytes by its parent (record and field index, array or map and 0, union
 * and branch, NULL and 0 for the top level): avro-c shares one "bytes" schema among all. */
typedef struct Decimal {
    avro_schema_t at;
    int index;
    int precision;
    int scale;
} Decimal;

/* A record field's default (avro-c drops it too): the record, the field's index, and the value
 * in the schema's JSON tree (Parsed.avro_json), in Avro's JSON encoding. */
typedef struct FieldDefault {
    avro_schema_t record;
    int index;
    const json_t *value;
    /* The branch of the field's union the default is written in, found at its first use (-1:
     * not yet): it depends on the schema alone, and asked per record that lacks the field, a
     * union of 300 enums took 300 looks per "{}". */
    int branch;
} FieldDefault;

/* A schema as the serializer uses it, attached to the registry's cache entry. */
/* A JSON Schema enum's member and its value_hash. */
typedef struct EnumMember {
    uint64_t hash;
    const json_t *value;
} EnumMember;

/* A JSON Schema enum (its array, enm) and its members sorted by hash; kinds: a bit per
 * json_kind_bit of its members', so a value of no member's kind is refused without a hash. */
typedef struct EnumIndex {
    const json_t *enm;
    EnumMember *members;
    size_t n;
    unsigned kinds;
} EnumIndex;

/* A name an Avro-JSON wrapper may give a union's branch (a full name, or a named type's short
 * one; malloc'd), or a record branch's field name (avro-c's), and the branch. */
typedef struct UnionName {
    char *name;
    int branch;
} UnionName;

/* An Avro union's branches by name, built the first time a row meets the union: put_union
 * finds a wrapper's branch, and the branches a one-key object could be (its maps, the records
 * with a field of its key), by binary search instead of a look at every branch. Each array is
 * sorted by name, then branch. */
typedef struct UnionIndex {
    avro_schema_t us;
    UnionName *full, *shorts, *fields;
    size_t n_full, n_shorts, n_fields;
    int *maps; /* its map branches */
    size_t n_maps;
    UnionName *symbols; /* its enum branches' symbols (avro-c's) */
    size_t n_symbols;
    /* Its branches but enums, records, maps and fixeds that are no decimal, in order: the ones
     * a value not an object, not a symbol and not a fixed's bytes may be. */
    int *others;
    size_t n_others;
    int *objects; /* its record and map branches, in order: the ones an object may be */
    size_t n_objects;
    struct UnionFixed *fixeds; /* its fixeds that are no decimal, by size, then branch */
    size_t n_fixeds;
} UnionIndex;

/* A fixed branch of a union (not a decimal) and its size: a string is one when its bytes
 * (latin1_bytes) are that many. */
typedef struct UnionFixed {
    int64_t size;
    int branch;
} UnionFixed;

static void union_index_free(struct UnionIndex *ui)
{
    for (size_t i = 0; i < ui->n_full; i++)
        free(ui->full[i].name);
    for (size_t i = 0; i < ui->n_shorts; i++)
        free(ui->shorts[i].name);
    free(ui->full);
    free(ui->shorts);
    free(ui->fields);
    free(ui->maps);
    free(ui->symbols);
    free(ui->others);
    free(ui->objects);
    free(ui->fixeds);
}

/* An avro_inline result kept for the schema's life (Parsed.inline_memo, direct-mapped by the
 * schema node): it depends on the schema alone. */
#define INLINE_MEMO 16
typedef struct InlineMemo {
    avro_schema_t s;
    size_t n;
} InlineMemo;

typedef struct Parsed {
    ValueFormat format;
    /* The encoding of the row under way ran out of memory: nobody's fault, tried again later
     * (serializer_encode_schema answers SERIALIZER_RETRY_LATER, not a row fault). */
    bool oom;
    bool broken; /* the registry's schema cannot be parsed (logged once): every row fails */
    char broken_why[256];
    avro_schema_t avro;
    avro_value_iface_t *iface;
    avro_value_t value; /* reused for each row (avro_value_reset) */
    json_t *json;       /* the JSON Schema */
    Decimal *decimals;  /* the Avro schema's decimals (n_decimals) */
    size_t n_decimals;
    json_t *avro_json;      /* the Avro schema's JSON tree, which defaults point into */
    FieldDefault *defaults; /* its record fields' defaults (n_defaults) */
    size_t n_defaults;
    /* The JSON Schema's text (its own copy) and each of its numbers' tokens in it, for const
     * and enum: compared by their text, not by their doubles (schema_equal). */
    char *json_text;
    struct NumText *json_nums;
    size_t n_json_nums;
    /* Its enums, each with its members by value_hash (sorted by the enum's node, for
     * enum_index): a payload value is compared with the members of its hash alone. */
    struct EnumIndex *enums;
    size_t n_enums;
    /* The Avro schema's unions met so far, each with its branches by name (union_index), sorted
     * by the union's schema: at most one per union of the schema. */
    struct UnionIndex *unions;
    size_t n_unions, cap_unions;
    InlineMemo inline_memo[INLINE_MEMO]; /* inline_of's, by schema node */
} Parsed;

static void parsed_free(void *p)
{
    Parsed *ps = p;
    if (!ps)
        return;
    if (ps->iface) {
        avro_value_decref(&ps->value);
        avro_value_iface_decref(ps->iface);
    }
    if (ps->avro)
        avro_schema_decref(ps->avro);
    json_decref(ps->json);
    free(ps->decimals);
    json_decref(ps->avro_json);
    free(ps->defaults);
    free(ps->json_text);
    free(ps->json_nums);
    for (size_t i = 0; i < ps->n_enums; i++)
        free(ps->enums[i].members);
    free(ps->enums);
    for (size_t i = 0; i < ps->n_unions; i++)
        union_index_free(&ps->unions[i]);
    free(ps->unions);
    free(ps);
}

static void on_registry_ready(void *arg)
{
    Serializer *s = arg;
    if (s->ready)
        s->ready(s->arg);
}

Serializer *serializer_new(struct ev_loop *loop, const Config *cfg, SerializerReadyFn ready,
                           void *arg, char *err, size_t errlen)
{
    *err = '\0';
    if (cfg->value_format == VALUE_JSON)
        return NULL;
    Serializer *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->format = cfg->value_format;
    s->strategy = cfg->subject_name_strategy;
    /* The producer's message.max.bytes as librdkafka takes it (the last setting wins; it checks
     * the range at start-up): no value larger can be produced, so none is built. */
    s->max_len = 1000000; /* librdkafka's default */
    for (size_t i = 0; i < cfg->kafka.len; i++)
        if (strcmp(cfg->kafka.items[i].key, "message.max.bytes") == 0) {
            char *end;
            long v = strtol(cfg->kafka.items[i].value, &end, 10);
            if (v > 0 && *end == '\0')
                s->max_len = (size_t)v;
        }
    s->ready = ready;
    s->arg = arg;
    RegistryOptions o = {.urls = cfg->schema_registry_url,
                         .auth_file = cfg->schema_registry_auth_file,
                         .ca_file = cfg->schema_registry_ca_file,
                         .timeout_ms = cfg->schema_registry_timeout_ms,
                         .version = cfg->schema_version,
                         /* 5 s of requests at once: the burst the registry had before the flag
                          * (100 at the default 20 a second) */
                         .lookup_rate = (double)cfg->schema_registry_lookup_rate,
                         .lookup_burst = 5.0 * (double)cfg->schema_registry_lookup_rate};
    s->registry = registry_new(loop, &o, on_registry_ready, s, err, errlen);
    if (!s->registry) {
        free(s);
        return NULL;
    }
    return s;
}

void serializer_free(Serializer *s)
{
    if (!s)
        return;
    registry_free(s->registry, parsed_free);
    free(s);
}

bool serializer_up(const Serializer *s)
{
    return registry_up(s->registry);
}

bool serializer_probe(Serializer *s, char *warned, size_t warnedlen, char *err, size_t errlen)
{
    char warn[512];
    if (!registry_probe(s->registry, err, errlen, warn, sizeof(warn)))
        return false;
    if (warned && warnedlen > 0)
        snprintf(warned, warnedlen, "%s", warn);
    if (*warn) {
        char q[600]; /* curl's text: quoted, a '"' in it cannot end the field */
        if (strncmp(warn, "HTTP 404", 8) == 0) /* it answered, but not as a registry does */
            log_warn("schema registry URL answers 404 at start-up", "error=%s",
                     log_quote(warn, q, sizeof(q)));
        else if (strncmp(warn, "HTTP 403", 8) == 0) /* it answered, and took the credentials */
            log_warn("schema registry refuses to list subjects at start-up", "error=%s",
                     log_quote(warn, q, sizeof(q)));
        else if (strncmp(warn, "passed over", 11) == 0) /* a later URL answered */
            log_warn("schema registry URL passed over at start-up", "error=%s",
                     log_quote(warn, q, sizeof(q)));
        else
            log_warn("schema registry not reachable at start-up", "error=%s",
                     log_quote(warn, q, sizeof(q)));
    }
    return true;
}

bool serializer_take_probe(Serializer *to, const Serializer *from)
{
    return registry_take_probe(to->registry, from->registry);
}

/* ---- Avro: a JSON tree into an avro value, by its schema ----------------------------------- */

/* A step of the path: a record field's or a map key's name, or an array's index (name NULL).
 * The name points into the schema or the payload's tree, both alive while the row is written. */
typedef struct PathStep {
    const char *name;
    size_t index;
} PathStep;

/* Steps kept: every push is followed by a call one level down, and put_value and check_json
 * refuse a depth past DEPTH_MAX before pushing, so at most DEPTH_MAX + 1 are ever held. */
#define PATH_STEPS (DEPTH_MAX + 2)

/* The path of the field being written, for errors: "order.lines[2].sku". Kept as steps and
 * rendered into text only when an error names it (path_text): an snprintf per field written was
 * 12 % of the seed row's instructions (docs/benchmarks-serializer.md). */
typedef struct Path {
    PathStep steps[PATH_STEPS];
    size_t n_steps;     /* a failed write leaves its steps: the error's path is the deepest */
    char text[256];     /* path_text's rendering: what the old per-push text held, truncation too */
    const Parsed *ps;   /* for the decimals (NULL for JSON Schema) */
    bool decimals;      /* ps has decimals (value_decimal looks for one only then) */
    const json_t *root; /* the tree jansson made of payload */
    const char *payload;
    size_t payload_len;
    bool scanned;           /* inexact (n_inexact) holds inexact_reals(), once one was asked */
    const json_t **inexact; /* the caller frees it */
    size_t n_inexact;
    /* For JSON Schema's const and enum: the payload's numbers' tokens (number_texts), once one
     * was asked; the caller frees nums. */
    bool nums_scanned;
    struct NumText *nums;
    size_t n_nums;
    /* Writing a field's default: a decimal there is its bytes, as Avro's JSON encoding of a
     * default has it ("\u0000\u0096"), not a number. */
    bool in_default;
    bool oom; /* ran out of memory: not the payload's fault (Parsed.oom) */
    /* The Avro value's bound (serializer_encode_schema's max_len, wire header included): the
     * bytes its encoding takes at least, counted as it is built (used), and what avro-c holds for
     * it (held: its bytes, and the slots an array or a map adds, each at avro_inline's size: a
     * record's fields and a union's branches are in its slot, a null takes no byte). Defaults
     * repeat the schema's text per record, so what a payload builds is bounded by payload x
     * schema, not by the payload: either count past its bound refuses the row (too_big, charge)
     * before avro-c allocates much past it. */
    size_t max_len, used, held;
    bool too_big;
} Path;

/* A number of a JSON text and its token there: text + at, len bytes. */
typedef struct NumText {
    const json_t *node;
    size_t at, len;
} NumText;

/* Whether the number token text[0, len) is a real written with more significant digits than a
 * double keeps (DBL_DIG): such a text can read back as a shorter number (0.10000000000000000001
 * is the double 0.1, whose shortest text real_text would take). Integers are not: jansson keeps
 * them exactly. Trailing zeros and the exponent's digits are no significant digits. */
static bool token_inexact(const char *text, size_t len)
{
    size_t digit = 0, first = 0, last = 0;
    bool real = false, exponent = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '.' || c == 'e' || c == 'E') {
            real = true;
            exponent = exponent || c != '.';
        } else if (!exponent && c >= '0' && c <= '9') {
            digit++;
            if (c != '0') {
                first = first ? first : digit;
                last = digit;
            }
        }
    }
    return real && first && last - first + 1 > DBL_DIG;
}

/* The payload's text walked beside jansson's tree of it, to find which json_t reals were
 * written with more digits than a double keeps. They are found by identity, not by their double:
 * {"price": 0.1, "x": 0.10000000000000000001} has two reals of the double 0.1 and only x's is
 * inexact. payload is JSON jansson has read (only its structure is followed here). A key given
 * twice is jansson's last value: each occurrence is walked against that node and the last one's
 * verdict stands (mark overwrites), as jansson's own tree does. */
typedef struct Walk {
    const char *p;
    size_t len, i;
    /* The reals found inexact, by node: open addressing, cap a power of two (0: none yet), at
     * most half full, n used. A table, not a list searched per number: a row of many inexact
     * reals (a double array written with 17 digits) made the walk quadratic, seconds long. */
    struct Mark *marks;
    size_t n, cap;
    bool oom;
    bool want_nums; /* record every number's token in nums (number_texts) instead */
    int depth_max;  /* containers deeper than this are skipped, their numbers not looked at */
    NumText *nums;
    size_t n_nums, cap_nums;
} Walk;

static void walk_ws(Walk *w)
{
    w->i = (size_t)(jsontext_ws(w->p + w->i, w->p + w->len) - w->p);
}

/* Skips the string at w->i (its opening quote). */
static void walk_string(Walk *w)
{
    w->i = (size_t)(jsontext_string(w->p + w->i, w->p + w->len) - w->p);
}

/* Skips the value at w->i (jsontext_value: a string, a number, a literal, or a whole object or
 * array); returns its length. */
static size_t walk_skip(Walk *w)
{
    size_t at = w->i;
    w->i = (size_t)(jsontext_value(w->p + w->i, w->p + w->len) - w->p);
    return w->i - at;
}

typedef struct Mark {
    const json_t *node; /* NULL: a free slot */
    bool inexact;
} Mark;

/* Probes made of the walks' tables since start (serializer.h). */
static size_t mark_probes;

size_t serializer_walk_probes(void)
{
    return mark_probes;
}

/* node's slot in marks (cap slots): its own, or the free one where it would go. */
static size_t mark_slot(const Mark *marks, size_t cap, const json_t *node)
{
    uint64_t h = (uint64_t)(uintptr_t)node * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 32) & (cap - 1);
    for (mark_probes++; marks[i].node && marks[i].node != node; mark_probes++)
        i = (i + 1) & (cap - 1);
    return i;
}

/* node's verdict: inexact or not, the last one given standing. Only inexact reals take a slot
 * (an exact verdict matters only to a node marked inexact before: a key given twice). */
static void walk_mark(Walk *w, const json_t *node, bool inexact)
{
    if (!json_is_real(node) || w->oom)
        return;
    if (w->cap) {
        size_t i = mark_slot(w->marks, w->cap, node);
        if (w->marks[i].node) {
            w->marks[i].inexact = inexact;
            return;
        }
    }
    if (!inexact)
        return;
    if (2 * (w->n + 1) > w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        Mark *more = calloc(cap, sizeof(*more));
        if (!more) {
            w->oom = true;
            return;
        }
        for (size_t k = 0; k < w->cap; k++)
            if (w->marks[k].node)
                more[mark_slot(more, cap, w->marks[k].node)] = w->marks[k];
        free(w->marks);
        w->marks = more;
        w->cap = cap;
    }
    w->marks[mark_slot(w->marks, w->cap, node)] = (Mark){node, true};
    w->n++;
}

static int node_order(const void *a, const void *b)
{
    const json_t *const *x = a, *const *y = b;
    return (uintptr_t)*x < (uintptr_t)*y ? -1 : (uintptr_t)*x > (uintptr_t)*y;
}

/* Records node's token (n bytes at w->p + at). A key given twice records its node twice: the
 * later token is the one jansson kept (number_text takes the last). */
static void walk_num(Walk *w, const json_t *node, size_t at, size_t n)
{
    if (!json_is_number(node) || w->oom)
        return;
    if (w->n_nums == w->cap_nums) {
        size_t cap = w->cap_nums ? 2 * w->cap_nums : 16;
        NumText *more = realloc(w->nums, cap * sizeof(*more));
        if (!more) {
            w->oom = true;
            return;
        }
        w->nums = more;
        w->cap_nums = cap;
    }
    w->nums[w->n_nums++] = (NumText){node, at, n};
}

/* The value at w->i, node being jansson's node for it (NULL: none, as below a key another
 * occurrence replaced). Deeper than the questions go (w->depth_max), a value is skipped without
 * recursion: no question is asked of it. */
static void walk_value(Walk *w, const json_t *node, int depth)
{
    walk_ws(w);
    if (w->i >= w->len)
        return;
    char c = w->p[w->i];
    if ((c == '{' || c == '[') && depth > w->depth_max) {
        walk_skip(w);
        return;
    }
    if (c == '{') {
        w->i++;
        for (;;) {
            walk_ws(w);
            if (w->i >= w->len || w->p[w->i] == '}')
                break;
            size_t start = w->i;
            walk_string(w);
            const char *key = w->p + start + 1;
            size_t key_len = w->i - start - 2;
            const json_t *child = NULL;
            if (json_is_object(node) && w->i - start >= 2) {
                if (!memchr(key, '\\', key_len)) {
                    child = json_object_getn(node, key, key_len);
                } else {
                    /* An escaped key: jansson decodes it as it decoded the payload's. */
                    json_t *k = json_loadb(w->p + start, w->i - start, JSON_DECODE_ANY, NULL);
                    child = json_object_get(node, json_string_value(k) ? json_string_value(k) : "");
                    json_decref(k);
                }
            }
            walk_ws(w);
            w->i++; /* the ':' */
            walk_value(w, child, depth + 1);
            walk_ws(w);
            if (w->i < w->len && w->p[w->i] == ',')
                w->i++;
            else
                break;
        }
        w->i++; /* the '}' */
    } else if (c == '[') {
        w->i++;
        for (size_t index = 0;; index++) {
            walk_ws(w);
            if (w->i >= w->len || w->p[w->i] == ']')
                break;
            walk_value(w, json_array_get(node, index), depth + 1);
            walk_ws(w);
            if (w->i < w->len && w->p[w->i] == ',')
                w->i++;
            else
                break;
        }
        w->i++; /* the ']' */
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        size_t at = w->i, n = walk_skip(w);
        if (w->want_nums)
            walk_num(w, node, at, n);
        else
            walk_mark(w, node, token_inexact(w->p + at, n));
    } else {
        walk_skip(w); /* a string, true, false, null */
    }
}

/* The json_t reals of the payload (root its tree) whose text has more significant digits than a
 * double keeps, for the encoders to refuse where the digits matter (a decimal, a long, an
 * integer). A first pass over the text alone finds whether there is any (most rows have none);
 * only then is the text walked beside the tree. NULL with *n 0 when there are none, or when out
 * of memory (a check lost, never a row refused for it). Caller frees. */
static const json_t **inexact_reals(const char *payload, size_t len, const json_t *root, size_t *n)
{
    *n = 0;
    bool any = false;
    for (const char *p = payload, *end = payload + len; p < end && !any;) {
        if (*p == '"' || *p == '-' || (*p >= '0' && *p <= '9')) {
            const char *after = jsontext_value(p, end); /* a string or a number */
            any = *p != '"' && token_inexact(p, (size_t)(after - p));
            p = after;
        } else {
            p++;
        }
    }
    if (!any)
        return NULL;
    /* the encoders ask of values at most DEPTH_MAX (+ 1) levels down */
    Walk w = {.p = payload, .len = len, .depth_max = DEPTH_MAX + 1};
    walk_value(&w, root, 0);
    /* The nodes whose last verdict is inexact, sorted for real_inexact's binary search. */
    const json_t **found = w.oom || w.n == 0 ? NULL : malloc(w.n * sizeof(*found));
    size_t k = 0;
    for (size_t i = 0; found && i < w.cap; i++)
        if (w.marks[i].node && w.marks[i].inexact)
            found[k++] = w.marks[i].node;
    free(w.marks);
    if (k > 1)
        qsort(found, k, sizeof(*found), node_order);
    *n = found ? k : 0;
    return found;
}

static int numtext_order(const void *a, const void *b)
{
    const NumText *x = a, *y = b;
    if (x->node != y->node)
        return (uintptr_t)x->node < (uintptr_t)y->node ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at; /* a key given twice: the later token last */
}

/* Every number of text (len bytes, root jansson's tree of it) with its token, sorted by node for
 * number_text. NULL with *n 0 when there is none, or out of memory (numbers are then compared by
 * their doubles, as before). Caller frees. */
static NumText *number_texts(const char *text, size_t len, const json_t *root, size_t *n)
{
    /* const and enum compare numbers this deep: in the payload, a value checked DEPTH_MAX levels
     * down and a const's own DEPTH_MAX + 1 below it; in a schema, twice as many for the
     * subschemas' levels ("properties", then the name) above the const. Stopping at DEPTH_MAX
     * compared the numbers below by their doubles: 0.1 was 0.10000000000000000001. */
    Walk w = {.p = text, .len = len, .want_nums = true, .depth_max = 4 * (DEPTH_MAX + 1)};
    walk_value(&w, root, 0);
    if (w.oom) {
        free(w.nums);
        *n = 0;
        return NULL;
    }
    if (w.n_nums > 1)
        qsort(w.nums, w.n_nums, sizeof(*w.nums), numtext_order);
    *n = w.n_nums;
    return w.nums;
}

/* node's token in nums (sorted by number_texts), the last one given; NULL when not there. */
static const NumText *number_text(const NumText *nums, size_t n, const json_t *node)
{
    size_t lo = 0, hi = n;
    while (lo < hi) { /* the first entry above node */
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)nums[mid].node <= (uintptr_t)node)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && nums[lo - 1].node == node ? &nums[lo - 1] : NULL;
}

/* A number token in a normal form: its significant digits (no leading or trailing zeros) and
 * the power of ten of the first, so 1, 1.0, 1e0 and 10e-1 are all ("1", 0). saturated: the
 * exponent's text was beyond what is kept (|e| > 10^15: no double holds such a number but 0). */
typedef struct NumNorm {
    bool neg, zero, saturated;
    char *digits; /* malloc'd */
    size_t n_digits;
    long long exp;
} NumNorm;

static bool num_norm(const char *t, size_t len, NumNorm *out)
{
    *out = (NumNorm){0};
    out->digits = malloc(len + 1);
    if (!out->digits)
        return false;
    size_t i = 0, int_digits = 0;
    bool in_frac = false;
    if (i < len && t[i] == '-') {
        out->neg = true;
        i++;
    }
    for (; i < len && t[i] != 'e' && t[i] != 'E'; i++) {
        if (t[i] == '.') {
            in_frac = true;
            continue;
        }
        if (t[i] == '0' && out->n_digits == 0) { /* a leading zero */
            if (in_frac)
                out->exp--;
            continue;
        }
        out->digits[out->n_digits++] = t[i];
        int_digits += !in_frac;
    }
    long long e = 0;
    bool eneg = false;
    if (i < len) { /* the exponent */
        i++;
        if (i < len && (t[i] == '+' || t[i] == '-'))
            eneg = t[i++] == '-';
        for (; i < len; i++) {
            if (e > 1000000000000000LL) {
                out->saturated = true;
                break;
            }
            e = e * 10 + (t[i] - '0');
        }
    }
    while (out->n_digits > 0 && out->digits[out->n_digits - 1] == '0')
        out->n_digits--;
    out->zero = out->n_digits == 0;
    /* The first significant digit's power of ten: int_digits - 1 past the point, or the leading
     * zeros of the fraction (counted in exp) below it. */
    out->exp += (int_digits > 0 ? (long long)int_digits : 0) - 1 + (eneg ? -e : e);
    return true;
}

/* Whether two number tokens are the same number (JSON Schema's equality is mathematical: 1.0
 * is 1; 0.1 is not 0.10000000000000000001, whose double is the same). -1 when out of memory. */
static size_t token_compares; /* token_equal's calls since start (serializer.h) */

size_t serializer_token_compares(void)
{
    return token_compares;
}

static int token_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    token_compares++;
    NumNorm x, y;
    bool okx = num_norm(a, alen, &x), oky = num_norm(b, blen, &y);
    int eq = -1;
    if (okx && oky) {
        if (x.zero || y.zero)
            eq = x.zero && y.zero;           /* -0 is 0 */
        else if (x.saturated || y.saturated) /* beyond any double: only the same text */
            eq = alen == blen && memcmp(a, b, alen) == 0;
        else
            eq = x.neg == y.neg && x.exp == y.exp && x.n_digits == y.n_digits &&
                 memcmp(x.digits, y.digits, x.n_digits) == 0;
    }
    free(x.digits);
    free(y.digits);
    return eq;
}

/* Whether j, a real of the payload, was written with more digits than a double keeps (its
 * double may stand for another number than its text). The payload is scanned at the first
 * question only: most rows have no real that a long or a decimal takes. */
static bool real_inexact(Path *path, const json_t *j)
{
    if (!path->scanned) {
        path->inexact =
            inexact_reals(path->payload, path->payload_len, path->root, &path->n_inexact);
        path->scanned = true;
    }
    return path->n_inexact > 0 &&
           bsearch(&j, path->inexact, path->n_inexact, sizeof(*path->inexact), node_order);
}

/* The order of Parsed.decimals and Parsed.defaults (by the schema, then the index), which
 * parse_schema sorts them in, for the binary searches below: looked up per field written and per
 * field missing, a scan of them all made a record of n defaulted fields take n x n steps, rows of
 * many such records seconds on the loop. */
static int key_order(const void *a, int ai, const void *b, int bi)
{
    if (a != b)
        return (uintptr_t)a < (uintptr_t)b ? -1 : 1;
    return ai < bi ? -1 : ai > bi;
}

static size_t schema_probes; /* the steps of those searches since start (serializer.h) */

size_t serializer_schema_probes(void)
{
    return schema_probes;
}

static int decimal_order(const void *x, const void *y)
{
    const Decimal *a = x, *b = y;
    return key_order(a->at, a->index, b->at, b->index);
}

static int default_order(const void *x, const void *y)
{
    const FieldDefault *a = x, *b = y;
    return key_order(a->record, a->index, b->record, b->index);
}

static const Decimal *decimal_at(const Path *path, avro_schema_t at, int index)
{
    const Parsed *ps = path->in_default ? NULL : path->ps;
    size_t lo = 0, hi = ps ? ps->n_decimals : 0;
    while (lo < hi) { /* the first at or above (at, index) */
        size_t mid = lo + (hi - lo) / 2;
        schema_probes++;
        if (key_order(ps->decimals[mid].at, ps->decimals[mid].index, at, index) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return ps && lo < ps->n_decimals && ps->decimals[lo].at == at && ps->decimals[lo].index == index
               ? &ps->decimals[lo]
               : NULL;
}

/* The decimal a bytes or fixed value at (at, index) is, or NULL. */
static const Decimal *decimal_of(const Path *path, avro_schema_t s, avro_schema_t at, int index)
{
    if (is_avro_fixed(s))
        return decimal_at(path, s, -1);
    return is_avro_bytes(s) ? decimal_at(path, at, index) : NULL;
}

/* decimal_of for value v (its schema avro-c's, asked only when the schema has decimals: an
 * indirect call per value written, for nothing in most schemas). */
static inline const Decimal *value_decimal(const Path *path, avro_value_t *v, avro_schema_t at,
                                           int index)
{
    if (!path->decimals)
        return NULL;
    return decimal_of(path, avro_value_get_schema(v), at, index);
}

/* Appends a step: name, or "[index]" when name is NULL; *mark is what path_pop cuts it back to.
 * Nothing is formatted here: path_text does it when an error asks. */
static void path_push(Path *p, size_t *mark, const char *name, size_t index)
{
    *mark = p->n_steps;
    if (p->n_steps < PATH_STEPS)
        p->steps[p->n_steps] = (PathStep){.name = name, .index = index};
    p->n_steps++;
}

static void path_pop(Path *p, size_t mark)
{
    p->n_steps = mark;
}

/* The path as text ("order.lines[2].sku", "" at the top), in p->text until the next call:
 * each step appended as the text was built field by field before, ".name" (name alone while
 * the text is empty) or "[index]", cut at sizeof(p->text) - 1 bytes, so that every error's
 * text is what it was. */
static const char *path_text(Path *p)
{
    p->text[0] = '\0';
    size_t n = p->n_steps < PATH_STEPS ? p->n_steps : PATH_STEPS;
    for (size_t k = 0; k < n; k++) {
        size_t at = strlen(p->text);
        size_t room = sizeof(p->text) - at;
        if (p->steps[k].name)
            snprintf(p->text + at, room, "%s%s", at ? "." : "", p->steps[k].name);
        else
            snprintf(p->text + at, room, "[%zu]", p->steps[k].index);
    }
    return p->text;
}

/* path_text, or "(value)" for the top: an error's name for where it is. */
static const char *path_where(Path *p)
{
    const char *t = path_text(p);
    return *t ? t : "(value)";
}

static const char *json_kind(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    default:
        return "null";
    }
}

static const char *avro_kind(avro_type_t t)
{
    switch (t) {
    case AVRO_STRING:
        return "string";
    case AVRO_BYTES:
        return "bytes";
    case AVRO_INT32:
        return "int";
    case AVRO_INT64:
        return "long";
    case AVRO_FLOAT:
        return "float";
    case AVRO_DOUBLE:
        return "double";
    case AVRO_BOOLEAN:
        return "boolean";
    case AVRO_NULL:
        return "null";
    case AVRO_RECORD:
        return "record";
    case AVRO_ENUM:
        return "enum";
    case AVRO_FIXED:
        return "fixed";
    case AVRO_MAP:
        return "map";
    case AVRO_ARRAY:
        return "array";
    case AVRO_UNION:
        return "union";
    default:
        return "link";
    }
}

/* A JSON number with no fraction, as a long: an integer, or a real such as 100.0 (JSON does not
 * tell 100 from 100.0; PostgreSQL's jsonb keeps the ".0"). False for fractions and for reals
 * beyond a long's range (compared as doubles: 2^63 is exact, a cast beyond it undefined). */
static bool whole_number(const json_t *j, json_int_t *out)
{
    if (json_is_integer(j)) {
        *out = json_integer_value(j);
        return true;
    }
    if (!json_is_real(j))
        return false;
    double d = json_real_value(j);
    if (!isfinite(d) || floor(d) != d || d < -9223372036854775808.0 || d >= 9223372036854775808.0)
        return false;
    *out = (json_int_t)d;
    return true;
}

/* Whether a double is within a float's range once rounded to the nearest float: below 2^128 -
 * 2^103, halfway between FLT_MAX and 2^128, where rounding goes to infinity (3.4028235e38, as
 * Java prints FLT_MAX, is in; 1e39 is not). Converting a double beyond it would publish
 * Infinity for a finite number. */
static bool float_range(double d)
{
    return fabs(d) < 0x1.ffffffp127;
}

/* The bytes an Avro-JSON string stands for as a bytes or fixed value: each character one byte,
 * U+0000 to U+00FF, as the specification's JSON encoding has it (and Avro's own JsonDecoder, in
 * ISO-8859-1): "\u00ff" is the byte ff, not UTF-8's c3 bf. Writes them to out (room for
 * json_string_length bytes; NULL only counts) and returns how many, or -1 when a character is
 * beyond U+00FF. jansson's strings are valid UTF-8 without NUL (it refuses \u0000). */
static long latin1_bytes(const json_t *j, unsigned char *out)
{
    const char *p = json_string_value(j);
    long n = 0;
    while (*p) {
        int32_t cp;
        p += utf8_decode(p, &cp);
        if (cp < 0 || cp > 0xff)
            return -1;
        if (out)
            out[n] = (unsigned char)cp;
        n++;
    }
    return n;
}

/* Whether a JSON value could be written as a value of Avro type t (for choosing a union's
 * branch: no deeper check, the write itself does that). exact: only the JSON kind that is the
 * type's own (integer for int and long, in range; real for float and double), so that a union
 * ["long", "double"] takes 1.5 and 2.0 as doubles and 2 as a long. */
static bool fits(avro_type_t t, const json_t *j, bool exact)
{
    json_int_t i;
    switch (t) {
    case AVRO_NULL:
        return json_is_null(j);
    case AVRO_BOOLEAN:
        return json_is_boolean(j);
    case AVRO_INT32:
        return (exact ? json_is_integer(j) : json_is_number(j)) && whole_number(j, &i) &&
               i >= INT32_MIN && i <= INT32_MAX;
    case AVRO_INT64:
        return (exact ? json_is_integer(j) : json_is_number(j)) && whole_number(j, &i);
    case AVRO_FLOAT:
        return (exact ? json_is_real(j) : json_is_number(j)) && float_range(json_number_value(j));
    case AVRO_DOUBLE:
        return exact ? json_is_real(j) : json_is_number(j);
    case AVRO_STRING:
    case AVRO_BYTES:
    case AVRO_ENUM:
    case AVRO_FIXED:
        return json_is_string(j);
    case AVRO_ARRAY:
        return json_is_array(j);
    case AVRO_RECORD:
    case AVRO_MAP:
        return json_is_object(j);
    default:
        return false;
    }
}

static bool put_value(avro_value_t *v, const json_t *j, const Decimal *dec, Path *path, int depth,
                      char *err, size_t errlen);

static bool mismatch(Path *path, avro_type_t t, const json_t *j, char *err, size_t errlen)
{
    snprintf(err, errlen, "field %s: expected %s, got %s", path_where(path), avro_kind(t),
             json_kind(j));
    return false;
}

/* What avro-c's generic value of schema s holds in place, at least: a fixed its whole size, a
 * record its fields, a union its largest branch (all allocated with the value, whatever is set
 * later), anything else a slot (8: content such as a string's is counted as it is written). A
 * named type used by reference (a link) counts a slot: its definition is counted where it
 * stands. Saturates far below SIZE_MAX. */
static size_t inline_steps; /* the nodes avro_inline looked at since start (serializer.h) */

size_t serializer_inline_steps(void)
{
    return inline_steps;
}

/* What avro-c's generic value holds in place for a string or bytes (its wrapped buffer), and
 * beside it for each string or bytes set (the header of the copy it allocates); for an array
 * (its raw array); for a map (its raw map, and the hash table of its keys, 11 bins, which avro-c
 * allocates as the map is made, empty or not). Counted at 8 like a long, an array of 990,000
 * empty maps (3 MB of JSON, 1 MB encoded) had avro-c hold 158 MB, not 16 MB; of empty strings,
 * 72 MB. */
#define STRING_SLOT sizeof(avro_raw_string_t)
#define STRING_COPY 16
#define ARRAY_SLOT sizeof(avro_raw_array_t)
#define MAP_SLOT (sizeof(avro_raw_map_t) + 128)

static size_t avro_inline(avro_schema_t s, int depth)
{
    const size_t cap = SIZE_MAX / 64;
    inline_steps++;
    if (!s || depth > DEPTH_MAX)
        return 8;
    size_t n = 0;
    if (is_avro_fixed(s)) {
        int64_t size = avro_schema_fixed_size(s);
        return size < 0 || (uint64_t)size > cap ? cap : (size_t)size + STRING_SLOT;
    }
    if (is_avro_string(s) || is_avro_bytes(s))
        return STRING_SLOT;
    if (is_avro_array(s))
        return ARRAY_SLOT;
    if (is_avro_map(s))
        return MAP_SLOT;
    if (is_avro_link(s)) /* an avro_value_t: its target is allocated apart (link_held) */
        return sizeof(avro_value_t);
    if (is_avro_record(s)) {
        for (size_t i = 0; i < avro_schema_record_size(s) && n < cap; i++)
            n += avro_inline(avro_schema_record_field_get_by_index(s, (int)i), depth + 1);
    } else if (is_avro_union(s)) {
        for (size_t b = 0; b < avro_schema_union_size(s); b++) {
            size_t k = avro_inline(avro_schema_union_branch(s, (int)b), depth + 1);
            n = k > n ? k : n;
        }
    }
    n += 8;
    return n > cap ? cap : n;
}

/* avro_inline of an array's items or a map's values, looked up once per schema node for the
 * schema's life: asked per array, it walked the items' schema for each of a payload's arrays (a
 * union of a thousand branches, a thousand steps a "[null]"), payload x schema steps on the
 * loop; kept for the row only, it walked them again for every row (430 of the seed row's 66,000
 * instructions, docs/benchmarks-serializer.md). */
static size_t inline_of(Path *path, avro_schema_t s)
{
    if (!path->ps)
        return avro_inline(s, 0);
    InlineMemo *m = &((Parsed *)path->ps)->inline_memo[((uintptr_t)s >> 4) % INLINE_MEMO];
    if (m->s != s) {
        m->s = s;
        m->n = avro_inline(s, 0);
    }
    return m->n;
}

/* What avro-c allocates apart for a value of schema s as it is made: for a reference to a
 * recursive type (a link: ["null", "Node"] inside Node, an array of "Node"), a whole value of
 * the type, which a slot's size (avro_inline) does not count. Uncounted, a row of nested nodes of
 * unions of strings had avro-c hold 47 times max_len. */
static size_t link_held(Path *path, avro_schema_t s)
{
    return is_avro_link(s) ? inline_of(path, avro_schema_link_target(s)) : 0;
}

/* Counts a value about to be written: bytes, what its encoding takes at least (varints one byte
 * each), and held, what avro-c allocates for it beyond that (an array's or a map's new slots).
 * False, the row refused, once the encoding (wire header included) would pass Path.max_len, or
 * what avro-c holds MEMORY_FACTOR times it. Called before the value is set or its slot added, so
 * avro-c never holds much more than the bounds, whatever a payload's empty records, the schema's
 * defaults or a fixed's size multiply. */
static bool charge(Path *path, size_t bytes, size_t held, char *err, size_t errlen)
{
    path->used += bytes;
    path->held += bytes + held;
    if (path->used + WIRE_HEADER > path->max_len) {
        path->too_big = true;
        snprintf(err, errlen,
                 "field %.120s: the encoded value would be over %zu bytes (the producer's "
                 "message.max.bytes)",
                 path_where(path), path->max_len);
        return false;
    }
    if (path->held / MEMORY_FACTOR > path->max_len) {
        path->too_big = true;
        snprintf(err, errlen,
                 "field %.120s: the value would take avro-c over %d x %zu bytes to build (%d x "
                 "the producer's message.max.bytes; it holds each fixed and each union's largest "
                 "branch in full)",
                 path_where(path), MEMORY_FACTOR, path->max_len, MEMORY_FACTOR);
        return false;
    }
    return true;
}

/* Branch b of union us, a reference to a named type defined elsewhere (["null", "shop.Addr"],
 * which avro-c parses as a link) resolved to the type. */
static avro_schema_t union_branch(avro_schema_t us, int b)
{
    avro_schema_t bs = avro_schema_union_branch(us, b);
    for (int hops = 0; is_avro_link(bs) && hops < 8; hops++)
        bs = avro_schema_link_target(bs);
    return bs;
}

/* Whether text is a decimal number as put_decimal reads it: an optional '-', digits, and a
 * fraction of at least one digit after a '.' ("12.34", "-0.5", ".5", "7"; not "12.", "1e3",
 * "+1", " 1"). */
static bool decimal_syntax(const char *text)
{
    const char *p = text + (*text == '-');
    size_t int_len = strspn(p, "0123456789");
    const char *frac = p + int_len;
    if (*frac != '.')
        return int_len > 0 && *frac == '\0';
    size_t frac_len = strspn(frac + 1, "0123456789");
    return frac_len > 0 && frac[1 + frac_len] == '\0';
}

/* A decimal value as Avro writes it: the two's-complement big-endian unscaled integer, its n
 * bytes ending at mag[sizeof(mag) - 1], and the text of a JSON number it was read from (a
 * string is read in place, of any length). 250 digits
 * (the most find_decimals lets through) take 105 bytes; a fixed larger than mag is sign-extended
 * to its size by put_decimal. */
typedef struct DecimalBytes {
    char text[400];
    unsigned char mag[160];
    size_t n;
    bool negative;
} DecimalBytes;

static bool decimal_read(const json_t *j, const Decimal *dec, avro_schema_t s, Path *path,
                         DecimalBytes *db, char *err, size_t errlen);

static bool schema_fits(Path *path, avro_schema_t bs, const Decimal *dec, const json_t *j,
                        bool exact);

static size_t union_probes; /* put_union's looks at a branch, a name or a record's field since start
                               (serializer.h) */

size_t serializer_union_probes(void)
{
    return union_probes;
}

/* Whether branch b of union us could take j: fits, or for a decimal, a number or numeric string
 * that is exactly a value of it (its scale and precision, its fixed's size). Another string
 * ("n/a", "12.345" at scale 2) is not the decimal's: in [decimal, "string"] it is the string
 * branch's, not a row refused by the decimal, as a string beyond an enum's symbols is. */
static inline bool branch_fits(Path *path, avro_schema_t us, int b, const json_t *j, bool exact)
{
    avro_schema_t bs = union_branch(us, b);
    return schema_fits(path, bs, decimal_of(path, bs, us, b), j, exact);
}

/* Whether a value of schema bs (dec its decimal, or NULL) could take j, as branch_fits asks it of
 * a union's branch: a union (a map's values, a record's field) takes what one of its branches
 * takes. */
static bool schema_fits(Path *path, avro_schema_t bs, const Decimal *dec, const json_t *j,
                        bool exact)
{
    for (int hops = 0; is_avro_link(bs) && hops < 8; hops++)
        bs = avro_schema_link_target(bs);
    if (is_avro_union(bs)) {
        for (size_t b = 0; b < avro_schema_union_size(bs); b++)
            if (branch_fits(path, bs, (int)b, j, false))
                return true;
        return false;
    }
    if (dec) {
        DecimalBytes db;
        char why[8];
        return decimal_read(j, dec, bs, path, &db, why, sizeof(why));
    }
    /* Only strings that are bytes: [fixed 16, "string"] takes "n/a" as the string, as
     * ["bytes", "string"] takes "日本" (beyond U+00FF). */
    if (is_avro_fixed(bs))
        return json_is_string(j) && latin1_bytes(j, NULL) == avro_schema_fixed_size(bs);
    if (is_avro_bytes(bs))
        return json_is_string(j) && latin1_bytes(j, NULL) >= 0;
    /* Only its symbols: [enum, "string"] takes another string as the string. */
    if (is_avro_enum(bs))
        return json_is_string(j) && avro_schema_enum_get_by_name(bs, json_string_value(j)) >= 0;
    return fits(avro_typeof(bs), j, exact);
}

/* The name an Avro-JSON union wrapper gives branch bs: the full name ("shop.Addr") of a named
 * type, the type name ("string", "array") of the others; returned as its namespace (*ns, "" when
 * none) and its name, which the callers join as they need, so that no buffer bounds it: a full
 * name cut at a buffer's size (512 bytes) made two long names one, and the wrapper of either,
 * written in full, no branch's name. */
static const char *branch_name(avro_schema_t bs, const char **ns)
{
    const char *name = avro_schema_type_name(bs);
    *ns = is_avro_named_type(bs) && avro_schema_namespace(bs) ? avro_schema_namespace(bs) : "";
    return name ? name : "";
}

/* Whether key is branch bs's full name (branch_name's parts joined by a '.'). */
static bool branch_name_is(avro_schema_t bs, const char *key)
{
    const char *ns, *name = branch_name(bs, &ns);
    size_t k = strlen(ns);
    if (k == 0)
        return strcmp(name, key) == 0;
    return strncmp(key, ns, k) == 0 && key[k] == '.' && strcmp(key + k + 1, name) == 0;
}

/* Branch bs's full name, malloc'd (NULL when out of memory). */
static char *branch_name_dup(avro_schema_t bs)
{
    const char *ns, *name = branch_name(bs, &ns);
    size_t k = strlen(ns), n = strlen(name);
    char *full = malloc(k + 1 + n + 1);
    if (full)
        sprintf(full, "%s%s%s", ns, k ? "." : "", name);
    return full;
}

/* Whether branch b of union us, a map or a record, could take the one-key object j as it is
 * (not as a wrapper): a map whose values take its value, a record with a field of that name
 * that takes it and no other field that a missing value would fail (one without null).
 * others_null: the union's index found the other fields taking null already (union_index_build
 * keeps a record's field for this reading only then), so only the key's field is asked. */
static bool object_reading_fits(Path *path, avro_schema_t us, int b, const json_t *j,
                                bool others_null)
{
    avro_schema_t bs = union_branch(us, b);
    const char *key = json_object_iter_key(json_object_iter((json_t *)j));
    const json_t *value = json_object_iter_value(json_object_iter((json_t *)j));
    if (is_avro_map(bs)) {
        avro_schema_t vs = avro_schema_map_values(bs);
        return schema_fits(path, vs, decimal_of(path, vs, bs, 0), value, false);
    }
    if (!is_avro_record(bs))
        return false;
    int field = avro_schema_record_field_get_index(bs, key);
    if (field < 0)
        return false;
    if (others_null) {
        avro_schema_t fs = avro_schema_record_field_get_by_index(bs, field);
        return schema_fits(path, fs, decimal_of(path, fs, bs, field), value, false);
    }
    for (size_t i = 0; i < avro_schema_record_size(bs); i++) {
        avro_schema_t fs = avro_schema_record_field_get_by_index(bs, (int)i);
        union_probes++;
        if ((int)i == field ? !schema_fits(path, fs, decimal_of(path, fs, bs, (int)i), value, false)
                            : !schema_fits(path, fs, NULL, json_null(), false))
            return false;
    }
    return true;
}

/* ---- unions, indexed by name ------------------------------------------------------------- */

static int union_name_order(const void *a, const void *b)
{
    const UnionName *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->branch > y->branch) - (x->branch < y->branch);
}

/* The first entry of names (n, sorted) named key, or n when none is. */
static size_t union_name_find(const UnionName *names, size_t n, const char *key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        union_probes++;
        if (strcmp(names[mid].name, key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && strcmp(names[lo].name, key) == 0 ? lo : n;
}

static int union_fixed_order(const void *a, const void *b)
{
    const UnionFixed *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    return (x->branch > y->branch) - (x->branch < y->branch);
}

/* The first entry of fixeds (n, sorted) of size, or n when none is. */
static size_t union_fixed_find(const UnionFixed *fixeds, size_t n, int64_t size)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        union_probes++;
        if (fixeds[mid].size < size)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && fixeds[lo].size == size ? lo : n;
}

/* The next branch, in the union's order, of the enums having str for a symbol (from *at) and the
 * fixeds of bytes bytes (from *fat), advanced past; INT_MAX when none is left. */
static int union_next_extra(const UnionIndex *ui, const char *str, size_t *at, long bytes,
                            size_t *fat)
{
    int sb = *at < ui->n_symbols && strcmp(ui->symbols[*at].name, str) == 0
                 ? ui->symbols[*at].branch
                 : INT_MAX;
    int fb =
        *fat < ui->n_fixeds && ui->fixeds[*fat].size == bytes ? ui->fixeds[*fat].branch : INT_MAX;
    if (sb < fb) {
        (*at)++;
        return sb;
    }
    *fat += fb != INT_MAX;
    return fb;
}

static bool union_index_build(UnionIndex *ui, Path *path, avro_schema_t us)
{
    const Parsed *ps = path->ps;
    size_t n = avro_schema_union_size(us), n_fields = 0, n_symbols = 0;
    for (size_t b = 0; b < n; b++) {
        avro_schema_t bs = union_branch(us, (int)b);
        n_fields += is_avro_record(bs) ? avro_schema_record_size(bs) : 0;
        n_symbols += is_avro_enum(bs) ? (size_t)avro_schema_enum_number_of_symbols(bs) : 0;
    }
    *ui = (UnionIndex){.us = us};
    ui->full = calloc(n ? n : 1, sizeof(*ui->full));
    ui->shorts = calloc(n ? n : 1, sizeof(*ui->shorts));
    ui->fields = calloc(n_fields ? n_fields : 1, sizeof(*ui->fields));
    ui->maps = calloc(n ? n : 1, sizeof(*ui->maps));
    ui->symbols = calloc(n_symbols ? n_symbols : 1, sizeof(*ui->symbols));
    ui->others = calloc(n ? n : 1, sizeof(*ui->others));
    ui->objects = calloc(n ? n : 1, sizeof(*ui->objects));
    ui->fixeds = calloc(n ? n : 1, sizeof(*ui->fixeds));
    if (!ui->full || !ui->shorts || !ui->fields || !ui->maps || !ui->symbols || !ui->others ||
        !ui->objects || !ui->fixeds)
        return false;
    for (size_t b = 0; b < n; b++) {
        avro_schema_t bs = union_branch(us, (int)b);
        const char *ns;
        branch_name(bs, &ns);
        if (!(ui->full[ui->n_full].name = branch_name_dup(bs)))
            return false;
        ui->full[ui->n_full++].branch = (int)b;
        /* A short name put_union takes when no full name matched: a named type's, when it is
         * not its full name already (that one matched first). */
        if (is_avro_named_type(bs) && *ns) {
            if (!(ui->shorts[ui->n_shorts].name = strdup(avro_schema_type_name(bs))))
                return false;
            ui->shorts[ui->n_shorts++].branch = (int)b;
        }
        if (is_avro_map(bs))
            ui->maps[ui->n_maps++] = (int)b;
        /* A record reads a one-key object only when every other field takes null: kept under
         * each field when all do, under the one that does not when one does not, under none
         * when more do not (asked per row, each record of the key was walked field by field:
         * 100 records of 53 fields, 5,300 looks per value). */
        size_t n_rf = is_avro_record(bs) ? avro_schema_record_size(bs) : 0, required = 0;
        int req_at = -1;
        for (size_t f = 0; f < n_rf && required < 2; f++)
            if (!schema_fits(path, avro_schema_record_field_get_by_index(bs, (int)f), NULL,
                             json_null(), false)) {
                required++;
                req_at = (int)f;
            }
        for (size_t f = 0; required < 2 && f < n_rf; f++)
            if (required == 0 || (int)f == req_at)
                ui->fields[ui->n_fields++] =
                    (UnionName){(char *)avro_schema_record_field_name(bs, (int)f), (int)b};
        /* An enum branch takes its symbols alone (schema_fits), exact or not */
        int syms = is_avro_enum(bs) ? avro_schema_enum_number_of_symbols(bs) : 0;
        for (int k = 0; k < syms; k++)
            ui->symbols[ui->n_symbols++] = (UnionName){(char *)avro_schema_enum_get(bs, k), (int)b};
        /* Only a record or a map takes an object (schema_fits), and any object; a fixed that
         * is no decimal only a string of its size (a decimal's is read as a number: it stays
         * among the others, as it does where a default ignores decimals). */
        if (is_avro_record(bs) || is_avro_map(bs))
            ui->objects[ui->n_objects++] = (int)b;
        else if (is_avro_fixed(bs) &&
                 !(ps->n_decimals && bsearch(&(Decimal){.at = bs, .index = -1}, ps->decimals,
                                             ps->n_decimals, sizeof(Decimal), decimal_order)))
            ui->fixeds[ui->n_fixeds++] = (UnionFixed){avro_schema_fixed_size(bs), (int)b};
        else if (!is_avro_enum(bs))
            ui->others[ui->n_others++] = (int)b;
    }
    qsort(ui->fixeds, ui->n_fixeds, sizeof(*ui->fixeds), union_fixed_order);
    qsort(ui->symbols, ui->n_symbols, sizeof(*ui->symbols), union_name_order);
    qsort(ui->full, ui->n_full, sizeof(*ui->full), union_name_order);
    qsort(ui->shorts, ui->n_shorts, sizeof(*ui->shorts), union_name_order);
    qsort(ui->fields, ui->n_fields, sizeof(*ui->fields), union_name_order);
    return true;
}

/* Union us's index, built on first use; NULL when out of memory (put_union then looks at every
 * branch, as before). The Parsed is the loop's alone: the cache is written through its path. */
static const UnionIndex *union_index(Path *path, avro_schema_t us)
{
    Parsed *ps = (Parsed *)path->ps;
    if (!ps)
        return NULL;
    size_t lo = 0, hi = ps->n_unions;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        union_probes++;
        if ((uintptr_t)ps->unions[mid].us < (uintptr_t)us)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < ps->n_unions && ps->unions[lo].us == us)
        return &ps->unions[lo];
    if (ps->n_unions == ps->cap_unions) {
        size_t cap = ps->cap_unions ? 2 * ps->cap_unions : 8;
        UnionIndex *grown = realloc(ps->unions, cap * sizeof(*grown));
        if (!grown)
            return NULL;
        ps->unions = grown;
        ps->cap_unions = cap;
    }
    UnionIndex ui;
    if (!union_index_build(&ui, path, us)) {
        union_index_free(&ui);
        return NULL;
    }
    memmove(&ps->unions[lo + 1], &ps->unions[lo], (ps->n_unions - lo) * sizeof(*ps->unions));
    ps->unions[lo] = ui;
    ps->n_unions++;
    return &ps->unions[lo];
}

/* A union's branch: the one an Avro-JSON wrapper {"full.Name": value} names (the short name is
 * taken too when one branch alone has it); else the one branch that can take the JSON value,
 * preferring the value's own kind (an integer goes to int or long before double). An object that
 * more than one record or map branch could take is refused without a wrapper: taking the first
 * would publish another record than the one meant.
 * A one-key object whose key names a branch may also be a map (or record) of the union as it is:
 * {"string": "x"} in ["string", {"type": "map", "values": "string"}] is the string "x" wrapped,
 * or the map {string: x}; Avro's own JSON decoder reads the first, a writer of plain JSON (which
 * the relay takes too, unwrapped) means the second. Whichever the relay took, the other writer's
 * events would go out as something else: when both readings fit the row is refused, the error
 * saying how to write each (the value unwrapped, the map or record wrapped). A wrapper that names
 * a map or record branch and whose value is an object is read as the wrapper (it is how the map
 * is written unambiguously); a wrapper whose value does not fit the branch it names is the map
 * or record it can be (refused as ambiguous when several can). */
/* Not inlined: put_value's only call, inlined there it made put_value's frame larger for every
 * value written, a union or not (+180 instructions per row of bench/serializer_cpu.c's seed,
 * which has none: docs/benchmarks-serializer.md). */
__attribute__((noinline)) static bool put_union(avro_value_t *v, const json_t *j, Path *path,
                                                int depth, char *err, size_t errlen)
{
    avro_schema_t us = avro_value_get_schema(v);
    const json_t *inner = j;
    int chosen = -1;
    /* Valid until put_value below: only put_union adds to the indexes. */
    const UnionIndex *ui = union_index(path, us);
    size_t n = ui ? 0 : avro_schema_union_size(us); /* the branches, for the walks without it */
    if (json_is_object(j) && json_object_size(j) == 1) {
        const char *key = json_object_iter_key(json_object_iter((json_t *)j));
        int by_short = -1, shorts = 0;
        if (ui) {
            size_t at = union_name_find(ui->full, ui->n_full, key);
            chosen = at < ui->n_full ? ui->full[at].branch : -1;
            for (at = union_name_find(ui->shorts, ui->n_shorts, key);
                 chosen < 0 && at < ui->n_shorts && strcmp(ui->shorts[at].name, key) == 0; at++) {
                by_short = ui->shorts[at].branch;
                shorts++;
            }
        }
        for (size_t b = 0; !ui && b < n && chosen < 0; b++) {
            avro_schema_t bs = union_branch(us, (int)b);
            union_probes++;
            if (branch_name_is(bs, key))
                chosen = (int)b;
            else if (is_avro_named_type(bs) && strcmp(avro_schema_type_name(bs), key) == 0) {
                by_short = (int)b;
                shorts++;
            }
        }
        if (chosen < 0 && shorts == 1)
            chosen = by_short;
        else if (chosen < 0 && shorts > 1) {
            snprintf(err, errlen,
                     "field %s: wrapper '%.60s' names more than one branch of its union: use the "
                     "full name",
                     path_where(path), key);
            return false;
        }
        if (chosen >= 0)
            inner = json_object_iter_value(json_object_iter((json_t *)j));
        avro_schema_t cs = chosen >= 0 ? union_branch(us, chosen) : NULL;
        if (chosen >= 0) {
            bool as_wrapper = branch_fits(path, us, chosen, inner, false);
            /* {"map": {...}} wrapping a map or a record is how it is written unambiguously */
            bool explicit_object = is_avro_map(cs) || is_avro_record(cs);
            int as_object = -1, objects = 0;
            /* Read as an object only where it decides something (a map's or a record's wrapper
             * is the wrapper, whatever else could read it), and up to two readings: one is the
             * branch taken or named in the error (the lowest of the maps and the first record,
             * the records coming in the union's order), two are ambiguous. */
            bool read = !(as_wrapper && explicit_object);
            if (ui && read) { /* only a map, or a record with a field of that name, can read it */
                for (size_t m = 0; m < ui->n_maps; m++) {
                    union_probes++;
                    if (object_reading_fits(path, us, ui->maps[m], j, false)) {
                        as_object =
                            as_object < 0 || ui->maps[m] < as_object ? ui->maps[m] : as_object;
                        objects++;
                    }
                }
                for (size_t at = union_name_find(ui->fields, ui->n_fields, key);
                     at < ui->n_fields && strcmp(ui->fields[at].name, key) == 0 && objects < 2;
                     at++) {
                    union_probes++;
                    int b = ui->fields[at].branch;
                    if (object_reading_fits(path, us, b, j, true)) {
                        as_object = as_object < 0 || b < as_object ? b : as_object;
                        objects++;
                    }
                }
            }
            for (size_t b = 0; !ui && b < n; b++) {
                union_probes++;
                if (object_reading_fits(path, us, (int)b, j, false)) {
                    as_object = as_object < 0 ? (int)b : as_object;
                    objects++;
                }
            }
            if (as_wrapper && objects > 0 && !explicit_object) {
                avro_schema_t os = union_branch(us, as_object);
                const char *ck = avro_kind(avro_typeof(cs)), *ok = avro_kind(avro_typeof(os));
                const char *ons, *oname = branch_name(os, &ons);
                snprintf(err, errlen,
                         "field %.100s: {\"%.40s\": ...} is ambiguous (a wrapped %s, or a %s "
                         "with that key): write the %s unwrapped, or the %s as {\"%.60s%s%.60s\": "
                         "{...}}",
                         path_where(path), key, ck, ok, ck, ok, ons, *ons ? "." : "", oname);
                return false;
            }
            if (!as_wrapper && objects > 0) { /* not this branch's value: the object's own */
                chosen = objects == 1 ? as_object : -1; /* several: ambiguous, below */
                inner = j;
            }
        }
    }
    if (chosen < 0 && json_is_object(j)) {
        int objects = 0;
        /* by the index, the records and maps alone: no other branch takes an object */
        for (size_t k = 0; k < (ui ? ui->n_objects : n) && objects < 2; k++) {
            union_probes++;
            objects += branch_fits(path, us, ui ? ui->objects[k] : (int)k, j, false);
        }
        if (objects > 1) {
            snprintf(err, errlen,
                     "field %s: object is ambiguous among its union's record and map branches: "
                     "wrap it as {\"full.Name\": {...}}",
                     path_where(path));
            return false;
        }
    }
    /* The first branch that takes it: by the index, for an object its records and maps, for
     * another value the others (union_index_build), the enums that have it for a symbol and the
     * fixeds of its size, merged in the union's order (each by a look at every branch, a string
     * against a union of 200 enums took 0.8 s for 50,000 values; against 200 fixeds, a look at
     * every fixed read the string's bytes again). */
    const char *str = json_is_string(j) ? json_string_value(j) : NULL;
    if (ui && chosen < 0) {
        bool object = json_is_object(j);
        const int *list = object ? ui->objects : ui->others;
        size_t n_list = object ? ui->n_objects : ui->n_others;
        size_t at0 = str ? union_name_find(ui->symbols, ui->n_symbols, str) : ui->n_symbols;
        /* read only when the union has such fixeds: a string in ["null", "string"] is not read
         * twice */
        long bytes = str && ui->n_fixeds ? latin1_bytes(j, NULL) : -1;
        size_t fat0 = bytes >= 0 ? union_fixed_find(ui->fixeds, ui->n_fixeds, bytes) : ui->n_fixeds;
        for (int exact = 1; exact >= 0 && chosen < 0; exact--) {
            size_t k = 0, at = at0, fat = fat0;
            int xb = at < ui->n_symbols || fat < ui->n_fixeds
                         ? union_next_extra(ui, str, &at, bytes, &fat)
                         : INT_MAX;
            while (chosen < 0) {
                int b;
                if (k < n_list && list[k] < xb)
                    b = list[k++];
                else if (xb != INT_MAX) {
                    b = xb;
                    xb = union_next_extra(ui, str, &at, bytes, &fat);
                } else
                    break;
                union_probes++;
                if (branch_fits(path, us, b, j, exact))
                    chosen = b;
            }
        }
    }
    for (int exact = 1; !ui && exact >= 0 && chosen < 0; exact--)
        for (size_t b = 0; b < n && chosen < 0; b++) {
            union_probes++;
            if (branch_fits(path, us, (int)b, j, exact))
                chosen = (int)b;
        }
    /* None takes it: the first of its kind writes it anyway, for that branch's own reason
     * ("'Z' is not a symbol of its enum", "'n/a' is not a decimal number", "decimal 12.345 has
     * more fractional digits than its scale 2"); a decimal's kind is a number or a string. */
    for (size_t b = 0; b < avro_schema_union_size(us) && chosen < 0; b++) {
        avro_schema_t bs = union_branch(us, (int)b);
        if (decimal_of(path, bs, us, (int)b) ? json_is_number(j) || json_is_string(j)
                                             : fits(avro_typeof(bs), j, false))
            chosen = (int)b;
    }
    if (chosen < 0) {
        snprintf(err, errlen, "field %s: %s fits no branch of its union", path_where(path),
                 json_kind(j));
        return false;
    }
    avro_value_t branch;
    if (!charge(path, 0, link_held(path, avro_schema_union_branch(us, chosen)), err, errlen))
        return false;
    if (avro_value_set_branch(v, chosen, &branch) != 0) {
        snprintf(err, errlen, "field %s: %s", path_text(path), avro_strerror());
        return false;
    }
    return put_value(&branch, inner, value_decimal(path, &branch, us, chosen), path, depth + 1, err,
                     errlen);
}

/* The default of field index of record rs, or NULL. The Parsed is the loop's alone: its branch
 * is written through the path (as union_index writes the unions' indexes). */
static FieldDefault *field_default(const Parsed *ps, avro_schema_t rs, int index)
{
    size_t lo = 0, hi = ps ? ps->n_defaults : 0;
    while (lo < hi) { /* the first at or above (rs, index): decimal_at's search */
        size_t mid = lo + (hi - lo) / 2;
        schema_probes++;
        if (key_order(ps->defaults[mid].record, ps->defaults[mid].index, rs, index) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return ps && lo < ps->n_defaults && ps->defaults[lo].record == rs &&
                   ps->defaults[lo].index == index
               ? &((Parsed *)ps)->defaults[lo]
               : NULL;
}

static bool put_record(avro_value_t *v, const json_t *j, Path *path, int depth, char *err,
                       size_t errlen)
{
    size_t n = 0;
    avro_value_get_size(v, &n);
    avro_schema_t rs = avro_value_get_schema(v);
    for (size_t i = 0; i < n; i++) {
        avro_value_t field;
        const char *name = NULL;
        if (avro_value_get_by_index(v, i, &field, &name) != 0)
            return mismatch(path, AVRO_RECORD, j, err, errlen);
        size_t mark;
        path_push(path, &mark, name, 0);
        const json_t *fj = json_object_get(j, name);
        FieldDefault *fd = fj ? NULL : field_default(path->ps, rs, (int)i);
        const json_t *def = fd ? fd->value : NULL;
        bool ok;
        if (def) {
            /* The schema's default, as avsc (Confluent's JavaScript client's Avro) writes it for
             * a field left undefined: a field added with a default is the compatible way to
             * evolve a schema, and the rows of writers not knowing it yet were all refused. */
            bool was = path->in_default;
            path->in_default = true;
            avro_value_t branch, *target = &field;
            ok = true;
            if (avro_value_get_type(&field) == AVRO_UNION) {
                /* The first branch (the specification until 1.11), or since 1.11.3 (AVRO-3649)
                 * the first the default is a value of: the first that takes it, else the first. */
                avro_schema_t us = avro_value_get_schema(&field);
                int b = fd->branch;
                for (b = b < 0 ? 0 : b; fd->branch < 0 && (size_t)b < avro_schema_union_size(us);
                     b++) {
                    union_probes++;
                    if (branch_fits(path, us, b, def, false))
                        break;
                }
                b = (size_t)b < avro_schema_union_size(us) ? b : 0;
                fd->branch = b;
                if (!charge(path, 0, link_held(path, avro_schema_union_branch(us, b)), err,
                            errlen)) {
                    path->in_default = was;
                    return false;
                }
                ok = avro_value_set_branch(&field, b, &branch) == 0;
                target = &branch;
                if (!ok)
                    snprintf(err, errlen, "%s", avro_strerror());
            }
            ok = ok && put_value(target, def, NULL, path, depth + 1, err, errlen);
            path->in_default = was;
            if (!ok && !path->too_big) {
                char why[200];
                snprintf(why, sizeof(why), "%s", err);
                snprintf(err, errlen, "field %.120s: missing, and its default does not fit: %s",
                         path_text(path), why);
            }
        } else if (!fj) {
            /* A missing field is null where its type allows null. */
            json_t *null = json_null();
            avro_type_t ft = avro_value_get_type(&field);
            ok = (ft == AVRO_NULL || ft == AVRO_UNION) &&
                 put_value(&field, null, NULL, path, depth + 1, err, errlen);
            if (!ok && !path->too_big)
                snprintf(err, errlen, "field %s: missing (its type has no null)", path_text(path));
        } else {
            ok = put_value(&field, fj, value_decimal(path, &field, rs, (int)i), path, depth + 1,
                           err, errlen);
        }
        if (!ok)
            return false;
        path_pop(path, mark);
    }
    return true;
}

/* The decimal text ("12.34", "0.0000001", "150000000000000000000") a JSON real stands for: the
 * shortest that reads back as the same double, when it has at most DBL_DIG (15) significant
 * digits. Any decimal of up to 15 digits survives a double and comes back as itself; a longer one
 * may not (99999999999999.99 is the double 99999999999999.984375, whose text at scale 2 is .98,
 * at scale 4 .9844; 0.1 at scale 20 would be 0.10000000000000000555): false then, rather than
 * publish digits the row never held. out has room for 330 characters (a double's exponent is at
 * most 308). */
static bool real_text(double d, char *out, size_t outlen)
{
    char e[40];
    int digits = 1;
    if (!isfinite(d))
        return false;
    for (; digits <= DBL_DIG; digits++) {
        snprintf(e, sizeof(e), "%.*e", digits - 1, d);
        if (strtod(e, NULL) == d)
            break;
    }
    if (digits > DBL_DIG)
        return false;
    /* e is [-]D[.DDD]e±X: the digits, and where the point goes among them. */
    const char *p = e;
    size_t o = 0;
    if (*p == '-')
        out[o++] = *p++;
    char mant[DBL_DIG + 1];
    int m = 0;
    for (; *p != 'e'; p++)
        if (*p != '.')
            mant[m++] = *p;
    int point = atoi(p + 1) + 1;
    if ((size_t)(abs(point) + m + 4) > outlen)
        return false;
    if (point <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -point; i++)
            out[o++] = '0';
        for (int i = 0; i < m; i++)
            out[o++] = mant[i];
    } else {
        for (int i = 0; i < m || i < point; i++) {
            if (i == point)
                out[o++] = '.';
            out[o++] = i < m ? mant[i] : '0';
        }
    }
    out[o] = '\0';
    return true;
}

/* Reads j as the decimal dec of Avro schema s (bytes or fixed) into *db: the two's-complement
 * big-endian unscaled integer (Avro's decimal: 12.34 at scale 2 is 1234, 04 d2), the fewest bytes
 * for bytes, sign-extended to the size of a fixed. From a JSON integer, a real or a numeric string
 * ("-12.34"); more fractional digits than the scale (other than trailing zeros) or more digits
 * than the precision are refused, never rounded. False with err saying why: j is not this decimal
 * (put_union asks it to choose a branch, put_decimal to write it). */
static bool decimal_read(const json_t *j, const Decimal *dec, avro_schema_t s, Path *path,
                         DecimalBytes *db, char *err, size_t errlen)
{
    /* A string is read where it is, whatever its length: its leading zeros, and its trailing
     * zeros beyond the scale, are no digits of the value ("000...01.5" is 1.5; refused past 399
     * characters, it was said to have more digits than its precision). */
    const char *text = db->text;
    if (json_is_string(j)) {
        text = json_string_value(j);
    } else if (json_is_integer(j)) {
        snprintf(db->text, sizeof(db->text), "%" JSON_INTEGER_FORMAT, json_integer_value(j));
    } else if (json_is_real(j)) {
        if (real_inexact(path, j) || !real_text(json_real_value(j), db->text, sizeof(db->text))) {
            char shortest[32]; /* the double's own text: at most 24 characters */
            snprintf(shortest, sizeof(shortest), "%.17g", json_real_value(j));
            snprintf(err, errlen,
                     "field %s: decimal %s: over %d digits, not exact as a JSON number (a double): "
                     "send it as a string",
                     path_where(path), shortest, DBL_DIG);
            return false;
        }
    } else {
        snprintf(err, errlen, "field %s: expected decimal (a number or a numeric string), got %s",
                 path_where(path), json_kind(j));
        return false;
    }
    if (!decimal_syntax(text)) {
        snprintf(err, errlen, "field %s: '%.60s' is not a decimal number", path_where(path), text);
        return false;
    }
    const char *p = text;
    bool negative = *p == '-';
    p += negative;
    size_t int_len = strspn(p, "0123456789");
    const char *frac = p + int_len;
    size_t frac_len = 0;
    if (*frac == '.') {
        frac++;
        frac_len = strspn(frac, "0123456789");
    }
    /* Trailing zeros beyond the scale change nothing; other digits would be lost. */
    while (frac_len > (size_t)dec->scale && frac[frac_len - 1] == '0')
        frac_len--;
    if (frac_len > (size_t)dec->scale) {
        snprintf(err, errlen,
                 "field %s: decimal %.60s has more fractional digits than its scale %d",
                 path_where(path), text, dec->scale);
        return false;
    }
    /* The unscaled integer's digits: the integer part, the fraction padded to the scale. */
    char digits[300];
    size_t nd = 0;
    for (size_t i = 0; i < int_len && nd < sizeof(digits); i++)
        if (nd || p[i] != '0')
            digits[nd++] = p[i];
    for (int i = 0; i < dec->scale && nd < sizeof(digits); i++)
        if (nd || ((size_t)i < frac_len && frac[i] != '0'))
            digits[nd++] = (size_t)i < frac_len ? frac[i] : '0';
    if (nd > (size_t)dec->precision || nd >= sizeof(digits)) {
        snprintf(err, errlen, "field %s: decimal %.60s has more digits than its precision %d",
                 path_where(path), text, dec->precision);
        return false;
    }
    /* Base 10 to base 256, big-endian, right-aligned in mag: n bytes end at mag[sizeof - 1]. */
    unsigned char *mag = db->mag;
    const size_t magsize = sizeof(db->mag);
    memset(mag, 0, magsize);
    size_t n = 0;
    for (size_t i = 0; i < nd; i++) {
        unsigned carry = (unsigned)(digits[i] - '0');
        for (size_t k = 0; k < n; k++) {
            unsigned char *b = &mag[magsize - 1 - k];
            unsigned x = *b * 10u + carry;
            *b = (unsigned char)x;
            carry = x >> 8;
        }
        while (carry) {
            mag[magsize - 1 - n++] = (unsigned char)carry;
            carry >>= 8;
        }
    }
    if (negative && n > 0) {
        unsigned carry = 1;
        for (size_t k = 0; k < n; k++) {
            unsigned char *b = &mag[magsize - 1 - k];
            unsigned x = (unsigned char)~*b + carry;
            *b = (unsigned char)x;
            carry = x >> 8;
        }
    } else {
        negative = false; /* -0 is 0 */
    }
    /* A sign byte when the top bit does not already say the sign (and for 0: one byte). */
    unsigned char top = n ? mag[magsize - n] : 0;
    if (n == 0 || (!negative && (top & 0x80)) || (negative && !(top & 0x80)))
        mag[magsize - 1 - n++] = negative ? 0xff : 0x00;
    if (is_avro_fixed(s)) {
        size_t size = (size_t)avro_schema_fixed_size(s);
        if (n > size) {
            /* Only when the schema's precision is beyond what the fixed holds: the specification
             * calls such a decimal invalid (Avro's Java library then reads a plain fixed), but
             * a JSON number has no bytes of its own to go out as, so the relay keeps it a decimal
             * and refuses what does not fit, naming the true bound, never wrapping it. */
            snprintf(err, errlen,
                     "field %s: decimal %.60s does not fit its fixed of %zu bytes (at most %d "
                     "digits; the schema's precision %d is beyond it)",
                     path_where(path), text, size,
                     (int)floor((8.0 * (double)size - 1) * 0.3010299956639812), dec->precision);
            return false;
        }
        /* A fixed larger than mag (valid: the specification bounds the precision by the size,
         * not the size) keeps n, the bytes that matter: put_decimal widens it. */
        if (size <= magsize) {
            memset(mag + magsize - size, negative ? 0xff : 0x00, size - n);
            n = size;
        }
    }
    db->n = n;
    db->negative = negative;
    return true;
}

static bool put_decimal(avro_value_t *v, const json_t *j, const Decimal *dec, Path *path, char *err,
                        size_t errlen)
{
    avro_schema_t s = avro_value_get_schema(v);
    DecimalBytes db;
    if (!decimal_read(j, dec, s, path, &db, err, errlen))
        return false;
    /* Before a fixed's bytes are allocated: its size is the schema's, however small the value. */
    if (!charge(path, is_avro_fixed(s) ? (size_t)avro_schema_fixed_size(s) : db.n + 1, 0, err,
                errlen))
        return false;
    const unsigned char *bytes = db.mag + sizeof(db.mag) - db.n;
    size_t n = db.n;
    unsigned char *wide = NULL; /* a fixed larger than db.mag, sign-extended */
    if (is_avro_fixed(s) && (size_t)avro_schema_fixed_size(s) > n) {
        n = (size_t)avro_schema_fixed_size(s);
        wide = malloc(n);
        if (!wide) {
            path->oom = true;
            snprintf(err, errlen, "out of memory");
            return false;
        }
        memset(wide, db.negative ? 0xff : 0x00, n - db.n);
        memcpy(wide + n - db.n, bytes, db.n);
        bytes = wide;
    }
    int rc = is_avro_fixed(s) ? avro_value_set_fixed(v, (void *)bytes, n)
                              : avro_value_set_bytes(v, (void *)bytes, n); /* both copy */
    free(wide);
    if (rc != 0) {
        snprintf(err, errlen, "field %s: %s", path_where(path), avro_strerror());
        return false;
    }
    return true;
}

static bool put_value(avro_value_t *v, const json_t *j, const Decimal *dec, Path *path, int depth,
                      char *err, size_t errlen)
{
    if (depth > DEPTH_MAX) {
        snprintf(err, errlen, "field %s: nested deeper than %d levels", path_text(path), DEPTH_MAX);
        return false;
    }
    avro_type_t t = avro_value_get_type(v);
    if (dec)
        return put_decimal(v, j, dec, path, err, errlen);
    json_int_t whole = 0;
    if (t == AVRO_INT32 || t == AVRO_INT64) {
        /* 100.0 is a long (whole_number); 2.5 and "1" are not. */
        if (!whole_number(j, &whole)) {
            double d = json_is_real(j) ? json_real_value(j) : 0.5;
            if (!isfinite(d) || floor(d) != d)
                return mismatch(path, t, j, err, errlen);
            snprintf(err, errlen, "field %s: %.0f is out of %s range", path_text(path), d,
                     t == AVRO_INT32 ? "an int's" : "a long's");
            return false;
        }
        /* 1000000000000000001.0 is the double 1e18, 5.0000000000000001 is 5: not the row's. */
        if (json_is_real(j) && real_inexact(path, j)) {
            snprintf(err, errlen,
                     "field %s: %.17g: over %d digits, not exact as a JSON real (a double): "
                     "write the integer without a fraction",
                     path_text(path), json_real_value(j), DBL_DIG);
            return false;
        }
    } else if (t == AVRO_FLOAT && json_is_number(j) && !float_range(json_number_value(j))) {
        snprintf(err, errlen, "field %s: %g is out of a float's range", path_where(path),
                 json_number_value(j));
        return false;
    } else if (t != AVRO_UNION && !fits(t, j, false)) {
        return mismatch(path, t, j, err, errlen);
    }
    int rc = 0;
    switch (t) {
    case AVRO_NULL:
        if (!charge(path, 0, 0, err, errlen))
            return false;
        rc = avro_value_set_null(v);
        break;
    case AVRO_BOOLEAN:
        if (!charge(path, 1, 0, err, errlen))
            return false;
        rc = avro_value_set_boolean(v, json_is_true(j));
        break;
    case AVRO_INT32: {
        json_int_t i = whole;
        if (i < INT32_MIN || i > INT32_MAX) {
            snprintf(err, errlen, "field %s: %" JSON_INTEGER_FORMAT " is out of an int's range",
                     path_text(path), i);
            return false;
        }
        if (!charge(path, 1, 0, err, errlen))
            return false;
        rc = avro_value_set_int(v, (int32_t)i);
        break;
    }
    case AVRO_INT64:
        if (!charge(path, 1, 0, err, errlen))
            return false;
        rc = avro_value_set_long(v, whole);
        break;
    case AVRO_FLOAT:
        if (!charge(path, 4, 0, err, errlen))
            return false;
        rc = avro_value_set_float(v, (float)json_number_value(j));
        break;
    case AVRO_DOUBLE:
        if (!charge(path, 8, 0, err, errlen))
            return false;
        rc = avro_value_set_double(v, json_number_value(j));
        break;
    case AVRO_STRING:
        /* avro-c counts the terminating NUL in a string's size. */
        if (!charge(path, json_string_length(j) + 1, STRING_COPY, err, errlen))
            return false;
        rc = avro_value_set_string_len(v, json_string_value(j), json_string_length(j) + 1);
        break;
    case AVRO_BYTES:
    case AVRO_FIXED: {
        /* json_string_length bytes bound the result (a character is at least one byte). */
        unsigned char *bytes = malloc(json_string_length(j) + 1);
        long n = bytes ? latin1_bytes(j, bytes) : 0;
        if (!bytes) {
            path->oom = true;
            snprintf(err, errlen, "out of memory");
            return false;
        }
        avro_schema_t fs = avro_value_get_schema(v);
        if (n < 0) {
            snprintf(err, errlen,
                     "field %s: %s holds a character beyond U+00FF (Avro's JSON encoding of "
                     "bytes: one character, U+0000 to U+00FF, per byte)",
                     path_where(path), avro_kind(t));
        } else if (t == AVRO_FIXED && n != avro_schema_fixed_size(fs)) {
            snprintf(err, errlen, "field %s: fixed of %lld bytes, got %ld", path_text(path),
                     (long long)avro_schema_fixed_size(fs), n);
            n = -1;
        } else if (!charge(path, (size_t)n + (t == AVRO_BYTES), STRING_COPY, err, errlen)) {
            n = -1;
        } else {
            rc = t == AVRO_FIXED ? avro_value_set_fixed(v, bytes, (size_t)n)
                                 : avro_value_set_bytes(v, bytes, (size_t)n);
        }
        free(bytes);
        if (n < 0)
            return false;
        break;
    }
    case AVRO_ENUM: {
        int sym = avro_schema_enum_get_by_name(avro_value_get_schema(v), json_string_value(j));
        if (sym < 0) {
            snprintf(err, errlen, "field %s: '%.60s' is not a symbol of its enum", path_text(path),
                     json_string_value(j));
            return false;
        }
        if (!charge(path, 1, 0, err, errlen))
            return false;
        rc = avro_value_set_enum(v, sym);
        break;
    }
    case AVRO_ARRAY: {
        avro_schema_t container = avro_value_get_schema(v);
        if (!charge(path, 1, 0, err, errlen)) /* the block count or the end */
            return false;
        /* avro-c keeps the items in place, 10 at first, then twice as many each time */
        avro_schema_t items = avro_schema_array_items(container);
        size_t slot = json_array_size(j) ? inline_of(path, items) : 0;
        size_t apart = json_array_size(j) ? link_held(path, items) : 0;
        size_t i;
        const json_t *item;
        json_array_foreach(j, i, item)
        {
            avro_value_t child;
            size_t mark;
            path_push(path, &mark, NULL, i);
            if (!charge(path, 0, (i == 0 ? 12 : 2) * slot + apart, err, errlen))
                return false;
            if (avro_value_append(v, &child, NULL) != 0 ||
                !put_value(&child, item, value_decimal(path, &child, container, 0), path, depth + 1,
                           err, errlen))
                return false;
            path_pop(path, mark);
        }
        break;
    }
    case AVRO_MAP: {
        avro_schema_t container = avro_value_get_schema(v);
        if (!charge(path, 1, 0, err, errlen)) /* the block count or the end */
            return false;
        /* avro-c keeps the values in place, as an array's items */
        avro_schema_t values = avro_schema_map_values(container);
        size_t slot = json_object_size(j) ? inline_of(path, values) : 0;
        size_t apart = json_object_size(j) ? link_held(path, values) : 0;
        size_t i = 0;
        const char *key;
        const json_t *item;
        json_object_foreach((json_t *)j, key, item)
        {
            avro_value_t child;
            size_t mark;
            path_push(path, &mark, key, 0);
            /* and its key's entry in avro-c's hash table */
            if (!charge(path, strlen(key) + 1, (i++ == 0 ? 12 : 2) * slot + 32 + apart, err,
                        errlen))
                return false;
            if (avro_value_add(v, key, &child, NULL, NULL) != 0 ||
                !put_value(&child, item, value_decimal(path, &child, container, 0), path, depth + 1,
                           err, errlen))
                return false;
            path_pop(path, mark);
        }
        break;
    }
    case AVRO_RECORD:
        return charge(path, 0, 0, err, errlen) && put_record(v, j, path, depth, err, errlen);
    case AVRO_UNION:
        /* its branch's index: a varint */
        return charge(path, 1, 0, err, errlen) && put_union(v, j, path, depth, err, errlen);
    default:
        return mismatch(path, t, j, err, errlen);
    }
    if (rc != 0) {
        snprintf(err, errlen, "field %s: %s", path_text(path), avro_strerror());
        return false;
    }
    return true;
}

/* What a schema's reused value may keep between rows (Path.held): beyond it the value is made
 * anew after the row. avro_value_reset frees strings and bytes but keeps an array's or a map's
 * slots (10, doubling), so a schema's value kept what its largest row needed, for the life of the
 * process, per subject. */
#define RETAIN_MAX (64 * 1024)

/* Builds the value of root into ps->value and writes it after the wire header (id). */
static bool avro_build_write(Parsed *ps, Path *path, const json_t *root, size_t max_len, char **out,
                             size_t *out_len, int id, char *err, size_t errlen)
{
    bool ok =
        put_value(&ps->value, root, decimal_of(path, ps->avro, NULL, 0), path, 0, err, errlen);
    if (!ok)
        return false;
    size_t size = 0;
    if (avro_value_sizeof(&ps->value, &size) != 0) {
        snprintf(err, errlen, "%s", avro_strerror());
        return false;
    }
    if (size > max_len - WIRE_HEADER) { /* the count above is a lower bound; this is exact */
        snprintf(err, errlen,
                 "the encoded value is %zu bytes, over %zu (the producer's message.max.bytes)",
                 WIRE_HEADER + size, max_len);
        return false;
    }
    char *buf = malloc(WIRE_HEADER + size);
    if (!buf) {
        ps->oom = true;
        snprintf(err, errlen, "out of memory");
        return false;
    }
    avro_writer_t w = avro_writer_memory(buf + WIRE_HEADER, (int64_t)size);
    int rc = avro_value_write(w, &ps->value);
    avro_writer_free(w);
    if (rc != 0) {
        free(buf);
        snprintf(err, errlen, "%s", avro_strerror());
        return false;
    }
    buf[0] = 0;
    buf[1] = (char)((uint32_t)id >> 24);
    buf[2] = (char)((uint32_t)id >> 16);
    buf[3] = (char)((uint32_t)id >> 8);
    buf[4] = (char)id;
    *out = buf;
    *out_len = WIRE_HEADER + size;
    return true;
}

static bool avro_encode_noted(Parsed *ps, const json_t *root, const char *payload,
                              size_t payload_len, size_t max_len, char **out, size_t *out_len,
                              int id, char *err, size_t errlen)
{
    Path path = {.ps = ps,
                 .decimals = ps->n_decimals > 0,
                 .root = root,
                 .payload = payload,
                 .payload_len = payload_len,
                 .max_len = max_len};
    bool ok = avro_build_write(ps, &path, root, max_len, out, out_len, id, err, errlen);
    free((void *)path.inexact);
    ps->oom = ps->oom || path.oom;
    /* Nothing of the row is kept once written (a schema's value lives as long as its subject):
     * its strings freed, and its slots too when they were many. Out of memory for a new value,
     * the old one, reset, is as good. */
    avro_value_reset(&ps->value);
    avro_value_t fresh;
    if (path.held > RETAIN_MAX && avro_generic_value_new(ps->iface, &fresh) == 0) {
        avro_value_decref(&ps->value);
        ps->value = fresh;
    }
    return ok;
}

/* avro-c's allocations that fail come back as errors of the field being written ("Cannot
 * allocate ..."), or with no error said at all (avro_value_add): the encoding notes them through
 * its allocator, wrapped for the time of one row (on the loop's thread, as every use of avro-c
 * here), so that running out of memory is not taken for the payload's fault. */
static struct avro_allocator_state encode_allocator;
static bool encode_alloc_failed;

static void *noting_avro_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    void *p = encode_allocator.alloc(encode_allocator.user_data, ptr, osize, nsize);
    if (!p && nsize > 0)
        encode_alloc_failed = true;
    return p;
}

static bool avro_encode(Parsed *ps, const json_t *root, const char *payload, size_t payload_len,
                        size_t max_len, char **out, size_t *out_len, int id, char *err,
                        size_t errlen)
{
    encode_allocator = AVRO_CURRENT_ALLOCATOR;
    avro_set_allocator(noting_avro_alloc, NULL);
    encode_alloc_failed = false;
    bool ok =
        avro_encode_noted(ps, root, payload, payload_len, max_len, out, out_len, id, err, errlen);
    avro_set_allocator(encode_allocator.alloc, encode_allocator.user_data);
    if (encode_alloc_failed)
        ps->oom = true;
    return ok;
}

/* ---- JSON Schema: the keywords checked ------------------------------------------------------ */

static bool type_matches(const char *type, const json_t *j, Path *path)
{
    if (strcmp(type, "object") == 0)
        return json_is_object(j);
    if (strcmp(type, "array") == 0)
        return json_is_array(j);
    if (strcmp(type, "string") == 0)
        return json_is_string(j);
    if (strcmp(type, "integer") == 0)
        /* JSON Schema's integer is a number without a fraction: 1.0 is one (floor, not a cast
         * to an integer type, which is undefined for 1e300). */
        return json_is_integer(j) ||
               (json_is_real(j) && isfinite(json_real_value(j)) &&
                floor(json_real_value(j)) == json_real_value(j) &&
                /* 5.0000000000000001 is the double 5, but the text that goes out is no integer */
                !real_inexact(path, j));
    if (strcmp(type, "number") == 0)
        return json_is_number(j);
    if (strcmp(type, "boolean") == 0)
        return json_is_boolean(j);
    if (strcmp(type, "null") == 0)
        return json_is_null(j);
    return true; /* an unknown type name: not ours to refuse */
}

/* JSON Schema's equality (enum, const): numbers by value, so 1.0 (as jsonb keeps it) is 1, which
 * jansson's json_equal tells apart (an integer and a real), and exactly, by their text (a the
 * schema's node, b the payload's, path giving both texts); the rest as json_equal, element by
 * element. */
static bool schema_equal(const json_t *a, const json_t *b, Path *path, int depth)
{
    if (json_is_number(a) && json_is_number(b)) {
        /* a is the schema's, b the payload's: both by their text where it is known, since their
         * doubles may be equal when the numbers are not (0.1 and 0.10000000000000000001; a long
         * above 2^53 and a real), and it is the payload's text that goes out. */
        /* Two equal numbers read as the same double (each text rounds to the nearest): numbers
         * whose doubles differ are not equal, and their texts need no look. Looked at first, an
         * enum of 1,000 numbers took each of a payload's 80,000 numbers through 1,000 text
         * comparisons (two allocations each): 8.8 s on the loop for 480 KB. */
        if (json_number_value(a) != json_number_value(b))
            return false;
        const Parsed *ps = path->ps;
        if (!path->nums_scanned) {
            path->nums = number_texts(path->payload, path->payload_len, path->root, &path->n_nums);
            path->nums_scanned = true;
        }
        const NumText *ta = ps ? number_text(ps->json_nums, ps->n_json_nums, a) : NULL;
        const NumText *tb = number_text(path->nums, path->n_nums, b);
        int eq = ta && tb
                     ? token_equal(ps->json_text + ta->at, ta->len, path->payload + tb->at, tb->len)
                     : -1;
        if (eq >= 0)
            return eq;
        json_int_t x, y;
        if (json_is_integer(a) || json_is_integer(b))
            return whole_number(a, &x) && whole_number(b, &y) && x == y;
        return json_real_value(a) == json_real_value(b);
    }
    if (depth > DEPTH_MAX || json_typeof(a) != json_typeof(b))
        return false;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!schema_equal(json_array_get(a, i), json_array_get(b, i), path, depth + 1))
                return false;
        return true;
    }
    if (json_is_object(a)) {
        const char *key;
        const json_t *value;
        if (json_object_size(a) != json_object_size(b))
            return false;
        json_object_foreach((json_t *)a, key, value)
        {
            const json_t *other = json_object_get(b, key);
            if (!other || !schema_equal(value, other, path, depth + 1))
                return false;
        }
        return true;
    }
    return json_equal((json_t *)a, (json_t *)b);
}

/* ---- JSON Schema's enums, indexed ------------------------------------------------------- */

static size_t enum_compares; /* schema_equal's calls for enums since start (serializer.h) */

size_t serializer_enum_compares(void)
{
    return enum_compares;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t bytes_hash(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
    return mix64(h);
}

/* A bit per kind as schema_equal tells them apart: an integer and a real are one (1.0 is 1). */
static unsigned json_kind_bit(const json_t *j)
{
    return json_is_number(j) ? 1u << JSON_REAL : 1u << json_typeof(j);
}

/* A hash of j that values schema_equal finds equal share: a number by its double (equal numbers
 * are equal doubles; -0 is 0), an object whatever its keys' order; below DEPTH_MAX, where
 * schema_equal finds no container equal, one value for all. */
static uint64_t value_hash(const json_t *j, int depth)
{
    if (json_is_number(j)) {
        double d = json_number_value(j);
        uint64_t bits;
        d = d == 0 ? 0.0 : d;
        memcpy(&bits, &d, sizeof(bits));
        return mix64(bits ^ 1);
    }
    if (json_is_string(j))
        return bytes_hash(json_string_value(j), json_string_length(j)) ^ 2;
    if (depth > DEPTH_MAX)
        return mix64(3);
    if (json_is_array(j)) {
        uint64_t h = mix64(4 ^ json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++)
            h = mix64(h * 31 + value_hash(json_array_get(j, i), depth + 1));
        return h;
    }
    if (json_is_object(j)) {
        uint64_t h = 0;
        const char *key;
        const json_t *value;
        json_object_foreach((json_t *)j, key, value) h +=
            mix64(bytes_hash(key, strlen(key)) ^ value_hash(value, depth + 1));
        return mix64(h ^ mix64(5 ^ json_object_size(j)));
    }
    return mix64(6 + (uint64_t)json_typeof(j)); /* true, false, null */
}

static int member_order(const void *a, const void *b)
{
    const EnumMember *x = a, *y = b;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

static int enum_order(const void *a, const void *b)
{
    const EnumIndex *x = a, *y = b;
    return (uintptr_t)x->enm < (uintptr_t)y->enm ? -1 : (uintptr_t)x->enm > (uintptr_t)y->enm;
}

/* Indexes every "enum" array of the JSON Schema tree js (as deep as check_json can reach one).
 * False when out of memory (the enums not indexed are then walked member by member). */
static bool index_enums(Parsed *ps, const json_t *js, size_t *cap, int depth)
{
    if (depth > 4 * (DEPTH_MAX + 1))
        return true;
    if (json_is_array(js)) {
        for (size_t i = 0; i < json_array_size(js); i++)
            if (!index_enums(ps, json_array_get(js, i), cap, depth + 1))
                return false;
        return true;
    }
    if (!json_is_object(js))
        return true;
    const json_t *enm = json_object_get(js, "enum");
    if (json_is_array(enm) && json_array_size(enm) > 0) {
        if (ps->n_enums == *cap) {
            size_t ncap = *cap ? 2 * *cap : 8;
            EnumIndex *grown = realloc(ps->enums, ncap * sizeof(*grown));
            if (!grown)
                return false;
            ps->enums = grown;
            *cap = ncap;
        }
        EnumIndex *e = &ps->enums[ps->n_enums];
        *e = (EnumIndex){.enm = enm, .n = json_array_size(enm)};
        e->members = malloc(e->n * sizeof(*e->members));
        if (!e->members)
            return false;
        for (size_t i = 0; i < e->n; i++) {
            const json_t *m = json_array_get(enm, i);
            e->members[i] = (EnumMember){.hash = value_hash(m, 0), .value = m};
            e->kinds |= json_kind_bit(m);
        }
        qsort(e->members, e->n, sizeof(*e->members), member_order);
        ps->n_enums++;
    }
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)js, key, value)
    {
        if (!index_enums(ps, value, cap, depth + 1))
            return false;
    }
    return true;
}

/* enm's index in ps, or NULL (not indexed: out of memory, or deeper than index_enums goes). */
static const EnumIndex *enum_index(const Parsed *ps, const json_t *enm)
{
    size_t lo = 0, hi = ps ? ps->n_enums : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)ps->enums[mid].enm < (uintptr_t)enm)
            lo = mid + 1;
        else
            hi = mid;
    }
    return ps && lo < ps->n_enums && ps->enums[lo].enm == enm ? &ps->enums[lo] : NULL;
}

/* Whether j is one of enum enm's members (schema_equal): by its index, the members of j's hash
 * alone; member by member when enm has none. An enum of 1,000 members took each of a payload's
 * 80,000 values through 1,000 comparisons, 1.5 s on the loop. */
static bool enum_has(const Parsed *ps, const json_t *enm, const json_t *j, Path *path)
{
    const EnumIndex *e = enum_index(ps, enm);
    if (!e) {
        size_t i;
        const json_t *m;
        json_array_foreach(enm, i, m)
        {
            enum_compares++;
            if (schema_equal(m, j, path, 0))
                return true;
        }
        return false;
    }
    if (!(e->kinds & json_kind_bit(j)))
        return false;
    uint64_t h = value_hash(j, 0);
    size_t lo = 0, hi = e->n;
    while (lo < hi) { /* the first member of hash h or above */
        size_t mid = lo + (hi - lo) / 2;
        if (e->members[mid].hash < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < e->n && e->members[lo].hash == h; lo++) {
        enum_compares++;
        if (schema_equal(e->members[lo].value, j, path, 0))
            return true;
    }
    return false;
}

static bool check_json(const json_t *schema, const json_t *j, Path *path, int depth, char *err,
                       size_t errlen)
{
    if (!json_is_object(schema))
        return true; /* true / {} / a boolean schema: anything goes (false is rare: not checked) */
    if (depth > DEPTH_MAX) {
        snprintf(err, errlen, "field %s: nested deeper than %d levels", path_text(path), DEPTH_MAX);
        return false;
    }
    const json_t *type = json_object_get(schema, "type");
    if (json_is_string(type) && !type_matches(json_string_value(type), j, path)) {
        snprintf(err, errlen, "field %s: expected %s, got %s", path_where(path),
                 json_string_value(type), json_kind(j));
        return false;
    }
    if (json_is_array(type)) {
        bool any = false;
        size_t i;
        const json_t *t;
        json_array_foreach(type, i, t) any =
            any || (json_is_string(t) && type_matches(json_string_value(t), j, path));
        if (!any) {
            snprintf(err, errlen, "field %s: a %s is none of its types", path_where(path),
                     json_kind(j));
            return false;
        }
    }
    const json_t *cnst = json_object_get(schema, "const");
    if (cnst && !schema_equal(cnst, j, path, 0)) {
        snprintf(err, errlen, "field %s: not the constant its schema requires", path_where(path));
        return false;
    }
    const json_t *enm = json_object_get(schema, "enum");
    if (json_is_array(enm)) {
        if (!enum_has(path->ps, enm, j, path)) {
            snprintf(err, errlen, "field %s: not one of its enum's values", path_where(path));
            return false;
        }
    }
    if (json_is_object(j)) {
        const json_t *props = json_object_get(schema, "properties");
        const json_t *required = json_object_get(schema, "required");
        /* additionalProperties is for the names neither properties nor patternProperties
         * take; the patterns (ECMA 262 regular expressions) are not evaluated here, so with
         * any, a name outside properties is not judged at all rather than refused. */
        const json_t *patterns = json_object_get(schema, "patternProperties");
        const json_t *additional = json_is_object(patterns) && json_object_size(patterns) > 0
                                       ? NULL
                                       : json_object_get(schema, "additionalProperties");
        size_t i;
        const json_t *name;
        json_array_foreach(required, i, name)
        {
            if (json_is_string(name) && !json_object_get(j, json_string_value(name))) {
                const char *at = path_text(path);
                snprintf(err, errlen, "field %s%s%s: required, missing", at, *at ? "." : "",
                         json_string_value(name));
                return false;
            }
        }
        const char *key;
        const json_t *value;
        json_object_foreach((json_t *)j, key, value)
        {
            const json_t *sub = json_object_get(props, key);
            size_t mark;
            path_push(path, &mark, key, 0);
            if (!sub && json_is_false(additional)) {
                snprintf(err, errlen, "field %s: not allowed (additionalProperties false)",
                         path_text(path));
                return false;
            }
            if (!sub && json_is_object(additional))
                sub = additional;
            if (sub && !check_json(sub, value, path, depth + 1, err, errlen))
                return false;
            path_pop(path, mark);
        }
    }
    const json_t *items = json_object_get(schema, "items");
    if (json_is_array(j) && json_is_object(items)) {
        size_t i;
        const json_t *item;
        json_array_foreach(j, i, item)
        {
            size_t mark;
            path_push(path, &mark, NULL, i);
            if (!check_json(items, item, path, depth + 1, err, errlen))
                return false;
            path_pop(path, mark);
        }
    }
    return true;
}

/* ---- encode --------------------------------------------------------------------------------- */

/* Finds the decimals of an Avro schema, and its record fields' defaults (pointing into js, which
 * the caller keeps): walks its JSON text (js) beside avro-c's parse of it (s),
 * at (at, index) as decimal_at keys them. A named type's reference is a string and carries no
 * logical type: only definitions are walked. An invalid decimal (no precision, scale beyond it)
 * is its underlying type, as the specification says. False when out of memory, or with
 * ps->broken_why for a decimal beyond the 250 digits put_decimal writes. */
static bool find_decimals(Parsed *ps, const json_t *js, avro_schema_t s, avro_schema_t at,
                          int index, int depth)
{
    if (depth > DEPTH_MAX || !s || is_avro_link(s))
        return true;
    if (json_is_array(js)) {
        for (size_t b = 0;
             is_avro_union(s) && b < json_array_size(js) && b < avro_schema_union_size(s); b++)
            if (!find_decimals(ps, json_array_get(js, b), avro_schema_union_branch(s, (int)b), s,
                               (int)b, depth + 1))
                return false;
        return true;
    }
    if (!json_is_object(js))
        return true;
    const json_t *type = json_object_get(js, "type");
    if (json_is_object(type) || json_is_array(type))
        return find_decimals(ps, type, s, at, index, depth + 1);
    const char *logical = json_string_value(json_object_get(js, "logicalType"));
    if ((is_avro_bytes(s) || is_avro_fixed(s)) && logical && strcmp(logical, "decimal") == 0) {
        const json_t *precision = json_object_get(js, "precision");
        const json_t *scale = json_object_get(js, "scale");
        json_int_t p = json_integer_value(precision), sc = scale ? json_integer_value(scale) : 0;
        if (!json_is_integer(precision) || (scale && !json_is_integer(scale)) || p <= 0 || sc < 0 ||
            sc > p)
            return true;
        /* A valid decimal the relay cannot write: taken as its bytes, a value would go out as
         * its characters, which a consumer decodes as another number. The schema is unusable. */
        if (p > 250) {
            snprintf(ps->broken_why, sizeof(ps->broken_why),
                     "decimal of precision %" JSON_INTEGER_FORMAT
                     ": the relay writes at most 250 digits",
                     p);
            return false;
        }
        Decimal *d = realloc(ps->decimals, (ps->n_decimals + 1) * sizeof(*d));
        if (!d)
            return false;
        ps->decimals = d;
        d[ps->n_decimals++] = (Decimal){.at = is_avro_fixed(s) ? s : at,
                                        .index = is_avro_fixed(s) ? -1 : index,
                                        .precision = (int)p,
                                        .scale = (int)sc};
        return true;
    }
    if (is_avro_record(s)) {
        const json_t *fields = json_object_get(js, "fields");
        for (size_t i = 0; i < json_array_size(fields); i++) {
            avro_schema_t fs = avro_schema_record_field_get_by_index(s, (int)i);
            const json_t *def = json_object_get(json_array_get(fields, i), "default");
            if (fs && def) {
                FieldDefault *d = realloc(ps->defaults, (ps->n_defaults + 1) * sizeof(*d));
                if (!d)
                    return false;
                ps->defaults = d;
                d[ps->n_defaults++] =
                    (FieldDefault){.record = s, .index = (int)i, .value = def, .branch = -1};
            }
            if (fs && !find_decimals(ps, json_object_get(json_array_get(fields, i), "type"), fs, s,
                                     (int)i, depth + 1))
                return false;
        }
    } else if (is_avro_array(s)) {
        return find_decimals(ps, json_object_get(js, "items"), avro_schema_array_items(s), s, 0,
                             depth + 1);
    } else if (is_avro_map(s)) {
        return find_decimals(ps, json_object_get(js, "values"), avro_schema_map_values(s), s, 0,
                             depth + 1);
    }
    return true;
}

/* Parses the registry's schema once; a schema we cannot use fails every row of its subject with
 * the reason (logged once). NULL when out of memory: nothing kept, the next row tries again. */
static Parsed *parse_schema(const RegistrySchema *rs, ValueFormat format, size_t max_len)
{
    Parsed *ps = calloc(1, sizeof(*ps));
    if (!ps)
        return NULL;
    ps->format = format;
    bool want_avro = format == VALUE_AVRO;
    if ((rs->type == REGISTRY_AVRO) != want_avro || rs->type == REGISTRY_PROTOBUF) {
        /* a subject may be 599 characters: cut, so that what is wrong fits the line */
        snprintf(ps->broken_why, sizeof(ps->broken_why),
                 "subject %.120s%s holds a %s schema, not %s", rs->subject,
                 strlen(rs->subject) > 120 ? "..." : "",
                 rs->type == REGISTRY_AVRO   ? "AVRO"
                 : rs->type == REGISTRY_JSON ? "JSON"
                                             : "PROTOBUF",
                 want_avro ? "AVRO" : "JSON");
        ps->broken = true;
    } else if (want_avro) {
        size_t held = 0;
        if (avro_schema_from_json_length(rs->text, strlen(rs->text), &ps->avro) == 0 &&
            (held = avro_inline(ps->avro, 0)) / MEMORY_FACTOR > max_len) {
            /* avro-c would allocate it with the value, before any row: a fixed of 1 GB took 1
             * GB, or failed as out of memory, row after row */
            snprintf(ps->broken_why, sizeof(ps->broken_why),
                     "schema id %d: a value of it takes avro-c %zu bytes before any field is set "
                     "(its fixeds and its unions' largest branches), over %d x %zu (the "
                     "producer's message.max.bytes)",
                     rs->id, held, MEMORY_FACTOR, max_len);
            ps->broken = true;
        } else if (!ps->avro || !(ps->iface = avro_generic_class_from_schema(ps->avro)) ||
                   avro_generic_value_new(ps->iface, &ps->value) != 0) {
            snprintf(ps->broken_why, sizeof(ps->broken_why), "schema id %d: avro: %s", rs->id,
                     avro_strerror());
            if (ps->iface)
                avro_value_iface_decref(ps->iface);
            ps->iface = NULL;
            ps->broken = true;
        } else {
            /* avro-c read the same text: NULL is out of memory. Without the decimals, a
             * decimal's value would be written as its characters ("12.34" as 5 bytes): nothing
             * is kept, the next row parses the schema again. So with find_decimals out of
             * memory (false, no reason given). */
            json_t *js = json_loads(rs->text, JSON_DECODE_ANY, NULL);
            bool ok = js && find_decimals(ps, js, ps->avro, NULL, 0, 0);
            ps->avro_json = js;           /* the defaults point into it */
            if (ok && ps->n_decimals > 1) /* for decimal_at's and field_default's searches */
                qsort(ps->decimals, ps->n_decimals, sizeof(*ps->decimals), decimal_order);
            if (ok && ps->n_defaults > 1)
                qsort(ps->defaults, ps->n_defaults, sizeof(*ps->defaults), default_order);
            if (!ok && !*ps->broken_why) {
                parsed_free(ps);
                return NULL;
            }
            if (!ok) {
                free(ps->decimals);
                ps->decimals = NULL;
                ps->n_decimals = 0;
                free(ps->defaults);
                ps->defaults = NULL;
                ps->n_defaults = 0;
                char why[sizeof(ps->broken_why)];
                snprintf(why, sizeof(why), "%s", ps->broken_why);
                snprintf(ps->broken_why, sizeof(ps->broken_why), "schema id %d: %.200s", rs->id,
                         why);
                ps->broken = true;
            }
        }
    } else {
        json_error_t jerr;
        ps->json = json_loads(rs->text, 0, &jerr);
        /* An integer beyond jansson's 64 bits (a const or an enum's 12345678901234567890, valid
         * JSON Schema) made the schema unusable and every row of its subject fail: read as a
         * real, as the payload's are; const and enum compare numbers by their text anyway. */
        if (!ps->json && json_error_code(&jerr) == json_error_numeric_overflow)
            ps->json = json_loads(rs->text, JSON_DECODE_INT_AS_REAL, &jerr);
        if (!ps->json) {
            snprintf(ps->broken_why, sizeof(ps->broken_why), "schema id %d: not JSON: %s", rs->id,
                     jerr.text);
            ps->broken = true;
        } else if ((ps->json_text = strdup(rs->text)) != NULL) {
            /* Out of memory, const and enum compare numbers by their doubles, as before. */
            ps->json_nums =
                number_texts(ps->json_text, strlen(ps->json_text), ps->json, &ps->n_json_nums);
        }
        size_t cap = 0;
        if (ps->json && !index_enums(ps, ps->json, &cap, 0)) {
            /* Out of memory: the enums are walked member by member, as before. */
            for (size_t i = 0; i < ps->n_enums; i++)
                free(ps->enums[i].members);
            free(ps->enums);
            ps->enums = NULL;
            ps->n_enums = 0;
        } else if (ps->n_enums > 1) {
            qsort(ps->enums, ps->n_enums, sizeof(*ps->enums), enum_order);
        }
    }
    if (ps->broken) {
        /* The subject comes from a row, the reason may quote the schema: both quoted, neither
         * can forge fields. */
        char qs[160], qw[sizeof(ps->broken_why) + 64];
        log_error("the registry's schema cannot be used: its rows fail",
                  "subject=%s id=%d error=%s", log_quote(rs->subject, qs, sizeof(qs)), rs->id,
                  log_quote(ps->broken_why, qw, sizeof(qw)));
    }
    return ps;
}

SerializerOutcome serializer_encode(Serializer *s, const char *topic, const char *record,
                                    const char *payload, size_t payload_len, char **out,
                                    size_t *out_len, char *err, size_t errlen)
{
    /* A topic has at most 249 characters, an event type any number: a subject cut to fit would
     * be another one (two long event types with the same first 600 characters would share a
     * schema), so a subject that does not fit is the row's fault. */
    char subject[600];
    int n;
    switch (s->strategy) {
    case SUBJECT_RECORD:
        n = snprintf(subject, sizeof(subject), "%s", record);
        break;
    case SUBJECT_TOPIC_RECORD:
        n = snprintf(subject, sizeof(subject), "%s-%s", topic, record);
        break;
    default:
        n = snprintf(subject, sizeof(subject), "%s-value", topic);
    }
    if (n < 0 || (size_t)n >= sizeof(subject)) {
        snprintf(err, errlen, "subject of %d characters (event type '%.40s...'): at most %zu", n,
                 record, sizeof(subject) - 1);
        return SERIALIZER_ROW_FAULT;
    }
    /* An empty event type (the column allows it) with --subject-name-strategy record: asked for,
     * /subjects//versions/latest is no subject's URL, and its 404 is not the registry's own
     * "not found", so the registry would be taken for down and the session would wait for it. */
    if (n == 0) {
        snprintf(err, errlen,
                 "subject is empty: the event type is empty (subject-name-strategy "
                 "record)");
        return SERIALIZER_ROW_FAULT;
    }
    const RegistrySchema *rs = NULL;
    switch (registry_lookup(s->registry, subject, &rs, err, errlen)) {
    case REGISTRY_PENDING:
        snprintf(err, errlen, "waiting for the schema of subject %s", subject);
        return SERIALIZER_WAIT;
    case REGISTRY_DOWN:
        snprintf(err, errlen, "schema registry unavailable");
        return SERIALIZER_UNAVAILABLE;
    case REGISTRY_MISSING:
        return SERIALIZER_RETRY_LATER;
    case REGISTRY_OK:
        break;
    }
    /* The cache entry is the registry's; its parsed slot is ours (registry.h). */
    return serializer_encode_schema(s->format, (RegistrySchema *)rs, subject, payload, payload_len,
                                    s->max_len, out, out_len, err, errlen);
}

void serializer_schema_release(RegistrySchema *rs)
{
    parsed_free(rs->parsed);
    rs->parsed = NULL;
}

/* jansson reports an allocation that fails inside its lexer as a syntax error ("string or '}'
 * expected"), or with no text at all (its buffer, lex_init): a payload read while memory ran out
 * looked malformed, a rejection of a good event. So its allocator is wrapped for the one call,
 * to note a failure. jansson is called on the loop's thread only (the HTTP server has no thread
 * of its own; the process's other threads, name lookups and producers being destroyed, never
 * call it), so the swap is seen by no one else. */
static json_malloc_t load_malloc;
static bool load_failed;

static void *noting_malloc(size_t n)
{
    void *p = load_malloc(n);
    if (!p)
        load_failed = true;
    return p;
}

static json_t *load_noting_oom(const char *text, size_t len, size_t flags, json_error_t *jerr,
                               bool *oom)
{
    json_free_t load_free;
    json_get_alloc_funcs(&load_malloc, &load_free);
    json_set_alloc_funcs(noting_malloc, load_free);
    load_failed = false;
    json_t *root = json_loadb(text, len, flags, jerr);
    json_set_alloc_funcs(load_malloc, load_free);
    *oom = !root && load_failed;
    return root;
}

SerializerOutcome serializer_encode_schema(ValueFormat format, RegistrySchema *rs,
                                           const char *subject, const char *payload,
                                           size_t payload_len, size_t max_len, char **out,
                                           size_t *out_len, char *err, size_t errlen)
{
    if (max_len <= WIRE_HEADER)
        max_len = WIRE_HEADER + 1; /* no value fits: every row refused, none built */
    if (!rs->parsed)
        rs->parsed = parse_schema(rs, format, max_len);
    Parsed *ps = rs->parsed;
    if (!ps) {
        snprintf(err, errlen, "out of memory");
        return SERIALIZER_RETRY_LATER;
    }
    if (ps->broken) {
        snprintf(err, errlen, "%s", ps->broken_why);
        return SERIALIZER_RETRY_LATER;
    }
    ps->oom = false;
    /* jansson drops a raw NUL after a literal ("[null\0\r,1]" loads as [null,1]), so the walks
     * of the text below and jansson's tree would be out of step, and JSON Schema would send the
     * NUL it never checked. A text column cannot hold one, but a payload may come from elsewhere
     * (--payload-format binary): refused here, whatever the config allows. */
    if (memchr(payload, '\0', payload_len)) {
        snprintf(err, errlen,
                 "payload is not JSON (schema id %d): it holds a NUL byte at offset %zu", rs->id,
                 (size_t)((const char *)memchr(payload, '\0', payload_len) - payload));
        return SERIALIZER_ROW_FAULT;
    }
    json_error_t jerr;
    /* JSON Schema checks the payload and sends its text as it is: a key given twice (a json or
     * text column keeps both; jsonb keeps the last) would be checked by its last value while a
     * consumer may read the first, so it is refused. Avro writes the value it checked. */
    size_t flags = JSON_DECODE_ANY | (format == VALUE_JSON_SCHEMA ? JSON_REJECT_DUPLICATES : 0);
    bool load_oom = false;
    json_t *root = load_noting_oom(payload, payload_len, flags, &jerr, &load_oom);
    /* JSON Schema only checks the payload and sends its text as it is: an integer beyond
     * jansson's long long (12345678901234567890, which jsonb accepts) is checked as a real.
     * Not for Avro: there every integer would become a double, rounding longs above 2^53. */
    if (!root && format == VALUE_JSON_SCHEMA &&
        json_error_code(&jerr) == json_error_numeric_overflow)
        root = load_noting_oom(payload, payload_len, flags | JSON_DECODE_INT_AS_REAL, &jerr,
                               &load_oom);
    if (!root && load_oom) {
        /* Not the payload's fault: as a row fault it counted a rejection against a good
         * event, and could dead-letter it. */
        snprintf(err, errlen, "out of memory");
        return SERIALIZER_RETRY_LATER;
    }
    if (!root && json_error_code(&jerr) == json_error_duplicate_key) {
        snprintf(err, errlen,
                 "payload has a key twice (schema id %d): %s; JSON Schema would check one value "
                 "and the text sent holds both",
                 rs->id, jerr.text);
        return SERIALIZER_ROW_FAULT;
    }
    if (!root && json_error_code(&jerr) == json_error_numeric_overflow) {
        /* Valid JSON (jsonb takes it): say what is wrong with it, not that it is no JSON. */
        snprintf(err, errlen,
                 "payload has a number beyond %s (schema id %d): %s; send it as a string",
                 strstr(jerr.text, "integer") ? "a 64-bit integer" : "a double", rs->id, jerr.text);
        return SERIALIZER_ROW_FAULT;
    }
    if (!root) {
        snprintf(err, errlen, "payload is not JSON (schema id %d): %s", rs->id, jerr.text);
        return SERIALIZER_ROW_FAULT;
    }
    char why[400];
    bool ok;
    if (format == VALUE_AVRO) {
        ok = avro_encode(ps, root, payload, payload_len, max_len, out, out_len, rs->id, why,
                         sizeof(why));
    } else {
        Path path = {.ps = ps, .root = root, .payload = payload, .payload_len = payload_len};
        ok = check_json(ps->json, root, &path, 0, why, sizeof(why));
        ps->oom = path.oom;
        free((void *)path.inexact);
        free(path.nums);
        char *buf = ok ? malloc(WIRE_HEADER + payload_len) : NULL;
        if (ok && !buf) {
            ps->oom = true;
            snprintf(why, sizeof(why), "out of memory");
            ok = false;
        } else if (ok) {
            buf[0] = 0;
            buf[1] = (char)((uint32_t)rs->id >> 24);
            buf[2] = (char)((uint32_t)rs->id >> 16);
            buf[3] = (char)((uint32_t)rs->id >> 8);
            buf[4] = (char)rs->id;
            memcpy(buf + WIRE_HEADER, payload, payload_len);
            *out = buf;
            *out_len = WIRE_HEADER + payload_len;
        }
    }
    json_decref(root);
    if (!ok && ps->oom) {
        snprintf(err, errlen, "out of memory");
        return SERIALIZER_RETRY_LATER;
    }
    if (!ok) {
        /* The subject cut: whole (up to 599 characters) it pushed the reason out of the row's
         * last_error, leaving "payload does not fit" and no field. The id names the schema. */
        snprintf(err, errlen, "payload does not fit schema id %d (subject %.120s%s): %s", rs->id,
                 subject, strlen(subject) > 120 ? "..." : "", why);
        return SERIALIZER_ROW_FAULT;
    }
    return SERIALIZER_OK;
}
