#include "route.h"

#include "jsontext.h"
#include "log.h"
#include "utf8.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static bool topic_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

/* Expands {aggregate_type} (or ${routedByValue}) and {event_type}; returns false on an unknown
 * placeholder or overflow. Character legality is checked separately so the error can say which rule
 * broke. */
static bool expand(const char *tmpl, const char *aggregate_type, const char *event_type, char *out,
                   size_t outlen, char *err, size_t errlen)
{
    size_t o = 0;
    for (const char *p = tmpl; *p;) {
        const char *sub = NULL;
        size_t skip = 1;
        if (strncmp(p, "${routedByValue}", 16) == 0) {
            sub = aggregate_type;
            skip = 16;
        } else if (*p == '{') {
            if (strncmp(p, "{aggregate_type}", 16) == 0) {
                sub = aggregate_type;
                skip = 16;
            } else if (strncmp(p, "{event_type}", 12) == 0) {
                sub = event_type;
                skip = 12;
            } else {
                snprintf(err, errlen,
                         "unknown placeholder in topic template at '%.20s' (use {aggregate_type} "
                         "or {event_type})",
                         p);
                return false;
            }
        }
        size_t n = sub ? strlen(sub) : 1;
        if (o + n >= outlen) {
            snprintf(err, errlen, "topic name longer than %d characters", ROUTE_TOPIC_MAX);
            return false;
        }
        memcpy(out + o, sub ? sub : p, n);
        o += n;
        p += skip;
    }
    out[o] = '\0';
    return true;
}

static bool topic_legal(const char *topic, char *err, size_t errlen)
{
    size_t len = strlen(topic);
    if (len == 0) {
        snprintf(err, errlen, "topic name is empty");
        return false;
    }
    if (len > ROUTE_TOPIC_MAX) {
        snprintf(err, errlen, "topic name longer than %d characters", ROUTE_TOPIC_MAX);
        return false;
    }
    if (strcmp(topic, ".") == 0 || strcmp(topic, "..") == 0) {
        snprintf(err, errlen, "topic name '%s' is not allowed", topic);
        return false;
    }
    for (const char *p = topic; *p; p++) {
        if (!topic_char_ok(*p)) {
            snprintf(err, errlen,
                     "topic name '%.64s' has a character outside [a-zA-Z0-9._-] at offset %zu",
                     topic, (size_t)(p - topic));
            return false;
        }
    }
    return true;
}

bool route_template_check(const char *tmpl, bool per_topic_order, char *err, size_t errlen)
{
    char topic[ROUTE_TOPIC_MAX + 2];
    char why[256];
    if (!per_topic_order && strstr(tmpl, "{event_type}")) {
        snprintf(err, errlen,
                 "--topic-template '%.64s': {event_type} sends one aggregate's events to several "
                 "topics, where their order cannot be kept; add --order-scope topic to accept "
                 "order per aggregate within each topic only",
                 tmpl);
        log_one_line(err);
        return false;
    }
    /* Placeholders stand for one legal character so only the template's own text is judged. */
    if (!expand(tmpl, "x", "x", topic, sizeof(topic), why, sizeof(why)) ||
        !topic_legal(topic, why, sizeof(why))) {
        snprintf(err, errlen, "--topic-template '%.64s': %s", tmpl, why);
        log_one_line(err);
        return false;
    }
    return true;
}

/* True when tmpl[ti...] can expand to topic[k...]: literal text must match, and each
 * placeholder stands for any text (a writer chooses aggregate_type and event_type). */
static bool template_matches(const char *t, const char *topic)
{
    if (*t == '\0')
        return *topic == '\0';
    size_t skip = strncmp(t, "${routedByValue}", 16) == 0   ? 16
                  : strncmp(t, "{aggregate_type}", 16) == 0 ? 16
                  : strncmp(t, "{event_type}", 12) == 0     ? 12
                                                            : 0;
    if (skip) {
        for (const char *rest = topic;; rest++) {
            if (template_matches(t + skip, rest))
                return true;
            if (*rest == '\0')
                return false;
        }
    }
    return *t == *topic && template_matches(t + 1, topic + 1);
}

bool route_dead_letter_check(const char *tmpl, const char *dead_letter_topic, char *err,
                             size_t errlen)
{
    if (!dead_letter_topic || !template_matches(tmpl, dead_letter_topic))
        return true;
    snprintf(err, errlen,
             "--topic-template '%.64s' can produce the dead-letter topic '%.64s' (a row's "
             "aggregate or event type chooses the placeholder's text): give the template a fixed "
             "part the dead-letter topic does not match, or choose another --dead-letter-topic",
             tmpl, dead_letter_topic);
    log_one_line(err);
    return false;
}

bool route_topic(const char *tmpl, const OutboxRow *row, char *out, size_t outlen, char *err,
                 size_t errlen)
{
    char topic[ROUTE_TOPIC_MAX + 2];
    if (!expand(tmpl, row->aggregate_type, row->event_type, topic, sizeof(topic), err, errlen) ||
        !topic_legal(topic, err, errlen))
        return false;
    if (strlen(topic) >= outlen) {
        snprintf(err, errlen, "topic buffer too small");
        return false;
    }
    memcpy(out, topic, strlen(topic) + 1);
    return true;
}

/* True for characters of the blocks that hold letters and punctuation looking like ASCII ones:
 * Latin (with IPA and modifiers), Greek, Cyrillic, Armenian, Cherokee, Coptic, Lisu, general
 * punctuation (dot leaders, hyphens), letterlike symbols (the Kelvin sign), number forms (ⅰ),
 * enclosed, fullwidth and mathematical letters. Scripts far from Latin (CJK, Arabic, ...) are
 * not: a two-character Japanese name is not "id" to anyone. */
static bool lookalike_script(int32_t cp)
{
    return cp < 0x0590 || (cp >= 0x1c80 && cp <= 0x1c8f) || (cp >= 0x13a0 && cp <= 0x13ff) ||
           (cp >= 0x1d00 && cp <= 0x1fff) || (cp >= 0x2000 && cp <= 0x24ff) ||
           (cp >= 0x2c60 && cp <= 0x2cff) || (cp >= 0x2de0 && cp <= 0x2dff) ||
           (cp >= 0xa640 && cp <= 0xa69f) || (cp >= 0xa4d0 && cp <= 0xa4ff) ||
           (cp >= 0xa720 && cp <= 0xa7ff) || (cp >= 0xab30 && cp <= 0xab6f) ||
           (cp >= 0xfe50 && cp <= 0xfe6f) || (cp >= 0xff00 && cp <= 0xffef) ||
           (cp >= 0x1d400 && cp <= 0x1d7ff);
}

/* True when name could be read as `reserved` (or, with prefix, as a name starting with it) by a
 * consumer or a person. Plain ASCII letters compare ignoring case. A name with any other
 * character is judged by its shape instead: invisible characters and combining marks are left
 * out (a person does not see them: "id" + U+200B, "i" + U+0307 + "d"), and every other
 * non-ASCII character of a script with Latin lookalikes (lookalike_script) stands for any one
 * character of the reserved name. That covers what
 * Java's equalsIgnoreCase folds to ASCII (U+0130 İ and U+0131 ı to i, U+212A to k, U+017F to s)
 * and the confusables of every script (Cyrillic е, Greek ο, fullwidth forms) without a table
 * that would always miss one; the price is that a few harmless names of a reserved name's
 * shape ("ïd") are dropped too. */
static bool name_shaped_like(const char *name, const char *reserved, bool prefix)
{
    size_t len = strlen(reserved), k = 0;
    for (const char *p = name; *p;) {
        int32_t cp;
        size_t n = utf8_decode(p, &cp);
        p += n;
        if (cp >= 0x80 && (utf8_unsafe(cp) || utf8_combining(cp)))
            continue; /* not seen */
        if (k == len)
            return prefix;
        char want = reserved[k++];
        if (cp < 0x80 ? tolower(cp) != want : !lookalike_script(cp))
            return false;
    }
    return k == len;
}

/* True for a name no legitimate producer writes: a control character, invalid UTF-8 or a
 * character utf8_unsafe names (zero-width, bidi, line separators). Such a name exists to look
 * like another one, or to break the logs and terminals it reaches. */
static bool name_has_unsafe(const char *name)
{
    for (const char *p = name; *p;) {
        int32_t cp;
        p += utf8_decode(p, &cp);
        if (cp < 0 || utf8_unsafe(cp))
            return true;
    }
    return false;
}

/* Names the relay sets itself. Kafka header names are case-sensitive bytes, but consumers (and
 * people) often look them up ignoring case (Java's equalsIgnoreCase folds some non-ASCII
 * letters to ASCII ones too), so a row's `ID` or `İd` must not stand beside the relay's `id`:
 * the row's headers come first, and a consumer taking the first match would read the row's
 * value. The prefix `dlq.` is the relay's own for dead letters. */
bool route_header_reserved(const char *name, bool identity_headers)
{
    return name_has_unsafe(name) || name_shaped_like(name, "id", false) ||
           name_shaped_like(name, "dlq.", true) ||
           (identity_headers && (name_shaped_like(name, "event_type", false) ||
                                 name_shaped_like(name, "aggregate_type", false)));
}

/* The entries a flat headers object may have for flat_headers to take it (more go to jansson). */
#define FLAT_MAX 16
/* The longest name flat_headers takes (a longer one goes to jansson). */
#define FLAT_NAME_MAX 128

/* jsontext_ws for flat_headers, which reads up to the NUL: bounded by an end, the fast reader
 * would first need the text's strlen, 1.5 % more instructions per row (bench/route_headers_cpu.c
 * under callgrind). */
static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* A JSON string at p (after its opening quote) of printable ASCII without escapes: its length,
 * with *end past the closing quote; -1 for any other string (jansson then reads it). */
static long plain_string(const char *p, const char **end)
{
    const char *q = p;
    while (*q >= 0x20 && *q < 0x7f && *q != '"' && *q != '\\')
        q++;
    if (*q != '"')
        return -1;
    *end = q + 1;
    return q - p;
}

/* The usual headers column, read without jansson: a JSON object whose names and values are all
 * strings of printable ASCII without escapes ({"traceparent": "00-…"}), at most FLAT_MAX entries,
 * no name twice. jansson's parse of it was 7-8 % of the relay's CPU on a drain (a hash table,
 * a copy of every name and value and their frees, per row). Adds its entries exactly as the
 * jansson path would (same order, same limits, same reserved names) and returns 1, or returns 0
 * without touching anything when the text has any other shape (numbers, nesting, escapes,
 * non-ASCII, duplicates, an error): the jansson path then reads it, and says what is wrong. -1:
 * a limit was exceeded, err says which. */
static int flat_headers(rd_kafka_headers_t *hdrs, const char *json, bool identity_headers,
                        size_t *count, size_t *bytes, char *err, size_t errlen)
{
    struct {
        const char *name, *value;
        long name_len, value_len;
    } e[FLAT_MAX];
    size_t n = 0;
    const char *p = skip_ws(json);
    if (*p++ != '{')
        return 0;
    p = skip_ws(p);
    if (*p == '}') {
        p++;
    } else {
        for (;;) {
            if (n == FLAT_MAX || *p++ != '"')
                return 0;
            e[n].name = p;
            if ((e[n].name_len = plain_string(p, &p)) < 0 || e[n].name_len > FLAT_NAME_MAX)
                return 0;
            p = skip_ws(p);
            if (*p++ != ':')
                return 0;
            p = skip_ws(p);
            if (*p++ != '"')
                return 0;
            e[n].value = p;
            if ((e[n].value_len = plain_string(p, &p)) < 0)
                return 0;
            for (size_t i = 0; i < n; i++)
                if (e[i].name_len == e[n].name_len &&
                    memcmp(e[i].name, e[n].name, (size_t)e[n].name_len) == 0)
                    return 0; /* jansson keeps the last value, in the first one's place */
            n++;
            p = skip_ws(p);
            if (*p == '}') {
                p++;
                break;
            }
            if (*p++ != ',')
                return 0;
            p = skip_ws(p);
        }
    }
    if (*skip_ws(p) != '\0')
        return 0;
    *count += n;
    if (*count > ROUTE_HEADERS_MAX) {
        snprintf(err, errlen, "headers: %zu entries, more than the limit of %d", *count,
                 ROUTE_HEADERS_MAX);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        char name[FLAT_NAME_MAX + 1];
        memcpy(name, e[i].name, (size_t)e[i].name_len);
        name[e[i].name_len] = '\0';
        if (route_header_reserved(name, identity_headers))
            continue;
        *bytes += (size_t)e[i].name_len + (size_t)e[i].value_len;
        if (*bytes > ROUTE_HEADERS_MAX_BYTES) {
            snprintf(err, errlen, "headers: more than the limit of %d bytes (names and values)",
                     ROUTE_HEADERS_MAX_BYTES);
            return -1;
        }
        rd_kafka_header_add(hdrs, name, e[i].name_len, e[i].value, e[i].value_len);
    }
    return 1;
}

/* Where each member's value starts in json (end its terminating NUL), a JSON object jansson
 * has read: an object of the members' names (as jansson decodes them; the last of a name, as
 * jansson keeps it) to offsets into json. NULL when out of memory. */
static json_t *value_offsets(const char *json, const char *end)
{
    json_t *at = json_object();
    const char *p = jsontext_ws(jsontext_ws(json, end) + 1, end);
    while (at && *p == '"') {
        const char *name = p;
        p = jsontext_string(p, end);
        json_t *key = json_loadb(name, (size_t)(p - name), JSON_DECODE_ANY, NULL);
        p = jsontext_ws(jsontext_ws(p, end) + 1, end); /* past the ':' */
        if (!json_is_string(key) ||
            json_object_setn_new(at, json_string_value(key), json_string_length(key),
                                 json_integer((json_int_t)(p - json))) != 0) {
            json_decref(at);
            at = NULL;
        }
        json_decref(key);
        p = jsontext_ws(jsontext_value(p, end), end);
        if (*p == ',')
            p = jsontext_ws(p + 1, end);
    }
    return at;
}

/* The value at json[offset] (json_end its terminating NUL) as compact JSON text: the column's
 * own text (PostgreSQL's jsonb output) without its white space, so numbers stay as written
 * (0.1, 12345678901234567890), not as a double prints them (jansson's dump:
 * 0.10000000000000001). Caller frees; NULL when out of memory. */
static char *compact_value(const char *json, const char *json_end, json_int_t offset)
{
    const char *v = json + offset, *end = jsontext_value(v, json_end);
    char *text = malloc((size_t)(end - v) + 1), *o = text;
    if (!text)
        return NULL;
    while (v < end) {
        if (*v == '"') {
            const char *close = jsontext_string(v, end);
            memcpy(o, v, (size_t)(close - v));
            o += close - v;
            v = close;
        } else if (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') {
            v++;
        } else {
            *o++ = *v++;
        }
    }
    *o = '\0';
    return text;
}

static bool digit(char c)
{
    return c >= '0' && c <= '9';
}

/* True when p[0, n) is one JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool number_token(const char *p, size_t n)
{
    size_t i = p[0] == '-';
    if (i >= n || !digit(p[i]))
        return false;
    if (p[i++] != '0')
        while (i < n && digit(p[i]))
            i++;
    if (i < n && p[i] == '.') {
        if (++i >= n || !digit(p[i]))
            return false;
        while (i < n && digit(p[i]))
            i++;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-'))
            i++;
        if (i >= n || !digit(p[i]))
            return false;
        while (i < n && digit(p[i]))
            i++;
    }
    return i == n;
}

/* json (end its NUL) read by jansson with each of its numbers written as 0 padded with spaces to
 * the number's length: for a text whose numbers jansson cannot hold (an integer beyond a long
 * long, a real beyond a double: jsonb takes both), where only the object's shape and names are
 * wanted from jansson. The offsets stay those of json. A token that is not a JSON number is left
 * as it is, for jansson to refuse. NULL with jerr set when jansson refuses the copy or out of
 * memory. */
static json_t *loads_numbers_zeroed(const char *json, const char *end, json_error_t *jerr)
{
    size_t len = (size_t)(end - json);
    char *copy = malloc(len + 1);
    if (!copy) {
        snprintf(jerr->text, sizeof(jerr->text), "out of memory");
        return NULL;
    }
    memcpy(copy, json, len + 1);
    for (char *p = copy, *e = copy + len; p < e;) {
        if (*p != '"' && *p != '-' && !digit(*p)) {
            p++;
            continue;
        }
        char *after = (char *)jsontext_value(p, e); /* a string or a number */
        if (*p != '"' && number_token(p, (size_t)(after - p))) {
            *p = '0';
            memset(p + 1, ' ', (size_t)(after - p - 1));
        }
        p = after;
    }
    json_t *obj = json_loads(copy, 0, jerr);
    free(copy);
    return obj;
}

/* Adds the entries of one JSON object of headers; *count and *bytes carry the totals over the
 * row's objects, so the limits hold for the row as a whole. */
static bool add_row_headers(rd_kafka_headers_t *hdrs, const char *json, bool identity_headers,
                            size_t *count, size_t *bytes, char *err, size_t errlen)
{
    int flat = flat_headers(hdrs, json, identity_headers, count, bytes, err, errlen);
    if (flat != 0)
        return flat > 0;
    const char *end = json + strlen(json); /* for value_offsets and compact_value */
    json_error_t jerr;
    json_t *obj = json_loads(json, 0, &jerr);
    /* A number jansson cannot hold (12345678901234567890, 1e400) is only read here: its header
     * is the column's text (compact_value), so jansson's reading of it does not matter. */
    if (!obj && json_error_code(&jerr) == json_error_numeric_overflow)
        obj = loads_numbers_zeroed(json, end, &jerr);
    if (!obj || !json_is_object(obj)) {
        snprintf(err, errlen, "headers column is not a JSON object%s%s", obj ? "" : ": ",
                 obj ? "" : jerr.text);
        json_decref(obj);
        return false;
    }
    /* Checked before any header is built: a row of 10,000 entries costs one parse, no more. */
    *count += json_object_size(obj);
    if (*count > ROUTE_HEADERS_MAX) {
        snprintf(err, errlen, "headers: %zu entries, more than the limit of %d", *count,
                 ROUTE_HEADERS_MAX);
        json_decref(obj);
        return false;
    }
    const char *name;
    json_t *value;
    json_t *offsets = NULL; /* value_offsets, at the first value that is not a string */
    json_object_foreach(obj, name, value)
    {
        if (route_header_reserved(name, identity_headers))
            continue;
        char *text = NULL;
        const char *v = NULL;
        size_t vlen = 0;
        if (json_is_string(value)) {
            v = json_string_value(value);
            vlen = json_string_length(value);
        } else if (!json_is_null(value)) {
            if (!offsets)
                offsets = value_offsets(json, end);
            json_t *at = json_object_get(offsets, name);
            text = at ? compact_value(json, end, json_integer_value(at)) : NULL;
            if (!text) {
                snprintf(err, errlen, "headers: out of memory");
                json_decref(offsets);
                json_decref(obj);
                return false;
            }
            v = text;
            vlen = strlen(text);
        }
        *bytes += strlen(name) + vlen;
        if (*bytes > ROUTE_HEADERS_MAX_BYTES) {
            snprintf(err, errlen, "headers: more than the limit of %d bytes (names and values)",
                     ROUTE_HEADERS_MAX_BYTES);
            free(text);
            json_decref(offsets);
            json_decref(obj);
            return false;
        }
        rd_kafka_header_add(hdrs, name, -1, v, v ? (ssize_t)vlen : 0);
        free(text);
    }
    json_decref(offsets);
    json_decref(obj);
    return true;
}

/* The headers that go before the row's: in the Debezium layout (no identity_headers) id, as
 * Debezium's Outbox Event Router adds it first; none in the relay's. */
static void add_leading_headers(rd_kafka_headers_t *hdrs, const OutboxRow *row,
                                bool identity_headers)
{
    if (!identity_headers)
        rd_kafka_header_add(hdrs, "id", -1, row->event_id, -1);
}

/* The headers that go after the row's: in the relay's layout id, event_type and
 * aggregate_type; none in the Debezium layout. */
static void add_trailing_headers(rd_kafka_headers_t *hdrs, const OutboxRow *row,
                                 bool identity_headers)
{
    if (!identity_headers)
        return;
    rd_kafka_header_add(hdrs, "id", -1, row->event_id, -1);
    rd_kafka_header_add(hdrs, "event_type", -1, row->event_type, -1);
    rd_kafka_header_add(hdrs, "aggregate_type", -1, row->aggregate_type, -1);
}

rd_kafka_headers_t *route_headers(const OutboxRow *row, bool identity_headers, char *err,
                                  size_t errlen)
{
    /* Room for the usual few (id, event_type, aggregate_type and a traceparent, say); the list
     * grows for more. Each message in flight keeps it: eight slots cost 32 bytes a message. */
    rd_kafka_headers_t *hdrs = rd_kafka_headers_new(4);
    size_t count = 0, bytes = 0;
    add_leading_headers(hdrs, row, identity_headers);
    if ((row->headers &&
         !add_row_headers(hdrs, row->headers, identity_headers, &count, &bytes, err, errlen)) ||
        (row->extra_headers && !add_row_headers(hdrs, row->extra_headers, identity_headers, &count,
                                                &bytes, err, errlen))) {
        rd_kafka_headers_destroy(hdrs);
        return NULL;
    }
    add_trailing_headers(hdrs, row, identity_headers);
    return hdrs;
}

rd_kafka_headers_t *route_dead_letter_headers(const OutboxRow *row, bool identity_headers,
                                              const char *error, int attempts,
                                              const char *original_topic)
{
    char why[256], count[16];
    rd_kafka_headers_t *hdrs = route_headers(row, identity_headers, why, sizeof(why));
    if (!hdrs) {
        hdrs = rd_kafka_headers_new(8);
        add_leading_headers(hdrs, row, identity_headers);
        add_trailing_headers(hdrs, row, identity_headers);
    }
    snprintf(count, sizeof(count), "%d", attempts);
    rd_kafka_header_add(hdrs, "dlq.error", -1, error ? error : "", -1);
    rd_kafka_header_add(hdrs, "dlq.attempts", -1, count, -1);
    rd_kafka_header_add(hdrs, "dlq.original_topic", -1, original_topic, -1);
    return hdrs;
}

bool route_topic_name_check(const char *option, const char *topic, char *err, size_t errlen)
{
    char why[256];
    if (topic_legal(topic, why, sizeof(why)))
        return true;
    snprintf(err, errlen, "%s '%.64s': %s", option, topic, why);
    log_one_line(err);
    return false;
}

/* The attributes of the CloudEvents Kafka protocol binding, binary content mode (ce_ headers). */
static const char *const ce_names[] = {"ce_specversion", "ce_id",      "ce_source",   "ce_type",
                                       "ce_time",        "ce_subject", "content-type"};

bool route_cloudevents_reserved(const char *name)
{
    for (size_t i = 0; i < sizeof(ce_names) / sizeof(ce_names[0]); i++)
        if (name_shaped_like(name, ce_names[i], false))
            return true;
    return false;
}

bool route_cloudevents_add(rd_kafka_headers_t *hdrs, const OutboxRow *row, const char *source,
                           const char *content_type)
{
    /* A row's own headers of these names, in any letter case, would make the event say
     * something else (or say it twice); judged by route_cloudevents_reserved.
     * One name at a time, found afresh after each removal (removing while walking the list would
     * skip entries), with no cap: a row may bring up to ROUTE_HEADERS_MAX decoys, and any one
     * left in would stand ahead of the relay's own. The name is copied first, as removing frees
     * the header it points into. */
    for (;;) {
        const char *name;
        const void *value;
        size_t size;
        char *found = NULL;
        for (size_t idx = 0; !found && rd_kafka_header_get_all(hdrs, idx, &name, &value, &size) ==
                                           RD_KAFKA_RESP_ERR_NO_ERROR;
             idx++)
            if (route_cloudevents_reserved(name) && !(found = strdup(name)))
                return false;
        if (!found)
            break;
        rd_kafka_header_remove(hdrs, found);
        free(found);
    }
    rd_kafka_header_add(hdrs, "ce_specversion", -1, "1.0", -1);
    rd_kafka_header_add(hdrs, "ce_id", -1, row->event_id, -1);
    rd_kafka_header_add(hdrs, "ce_source", -1, source, -1);
    rd_kafka_header_add(hdrs, "ce_type", -1, row->event_type, -1);
    if (row->created_at)
        rd_kafka_header_add(hdrs, "ce_time", -1, row->created_at, -1);
    rd_kafka_header_add(hdrs, "ce_subject", -1, row->aggregate_id, -1);
    rd_kafka_header_add(hdrs, "content-type", -1, content_type, -1);
    return true;
}
