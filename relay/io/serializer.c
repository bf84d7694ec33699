#include "serializer.h"

#include <avro.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "registry.h"

/* Confluent's wire format: magic byte 0, then the schema id as 4 bytes big-endian. */
#define WIRE_HEADER 5
/* Deeper payloads than this are refused rather than walked (the recursion's bound). */
#define DEPTH_MAX 64

struct Serializer {
    Registry *registry;
    ValueFormat format;
    SubjectStrategy strategy;
    SerializerReadyFn ready;
    void *arg;
};

/* A schema as the serializer uses it, attached to the registry's cache entry. */
typedef struct Parsed {
    ValueFormat format;
    bool broken; /* the registry's schema cannot be parsed (logged once): every row fails */
    char broken_why[256];
    avro_schema_t avro;
    avro_value_iface_t *iface;
    avro_value_t value; /* reused for each row (avro_value_reset) */
    json_t *json;       /* the JSON Schema */
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
    s->ready = ready;
    s->arg = arg;
    RegistryOptions o = {.urls = cfg->schema_registry_url,
                         .auth_file = cfg->schema_registry_auth_file,
                         .ca_file = cfg->schema_registry_ca_file,
                         .timeout_ms = cfg->schema_registry_timeout_ms,
                         .version = cfg->schema_version};
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

bool serializer_probe(Serializer *s, bool *answered, char *err, size_t errlen)
{
    char warn[512];
    if (!registry_probe(s->registry, err, errlen, warn, sizeof(warn)))
        return false;
    if (answered)
        *answered = !*warn;
    if (*warn)
        log_warn("schema registry not reachable at start-up", "error=\"%s\"", warn);
    return true;
}

/* ---- Avro: a JSON tree into an avro value, by its schema ----------------------------------- */

/* The path of the field being written, for errors: "order.lines[2].sku". */
typedef struct Path {
    char text[256];
} Path;

/* Appends ".name" (or name first), or "[index]" when name is NULL; *mark is where to cut it. */
static void path_push(Path *p, size_t *mark, const char *name, size_t index)
{
    *mark = strlen(p->text);
    size_t room = sizeof(p->text) - *mark;
    if (name)
        snprintf(p->text + *mark, room, "%s%s", *mark ? "." : "", name);
    else
        snprintf(p->text + *mark, room, "[%zu]", index);
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

/* Whether a JSON value could be written as a value of Avro type t (for choosing a union's
 * branch: no deeper check, the write itself does that). */
static bool fits(avro_type_t t, const json_t *j)
{
    switch (t) {
    case AVRO_NULL:
        return json_is_null(j);
    case AVRO_BOOLEAN:
        return json_is_boolean(j);
    case AVRO_INT32:
    case AVRO_INT64:
        return json_is_integer(j);
    case AVRO_FLOAT:
    case AVRO_DOUBLE:
        return json_is_number(j);
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

static bool put_value(avro_value_t *v, const json_t *j, Path *path, int depth, char *err,
                      size_t errlen);

static bool mismatch(const Path *path, avro_type_t t, const json_t *j, char *err, size_t errlen)
{
    snprintf(err, errlen, "field %s: expected %s, got %s", *path->text ? path->text : "(value)",
             avro_kind(t), json_kind(j));
    return false;
}

static bool put_union(avro_value_t *v, const json_t *j, Path *path, int depth, char *err,
                      size_t errlen)
{
    avro_schema_t us = avro_value_get_schema(v);
    size_t n = avro_schema_union_size(us);
    const json_t *inner = j;
    int chosen = -1;
    /* Avro's JSON encoding wraps a non-null union value as {"type name": value}. */
    if (json_is_object(j) && json_object_size(j) == 1) {
        const char *key = json_object_iter_key(json_object_iter((json_t *)j));
        for (size_t b = 0; b < n && chosen < 0; b++) {
            avro_schema_t bs = avro_schema_union_branch(us, (int)b);
            const char *name = avro_schema_type_name(bs);
            if (name && strcmp(name, key) == 0) {
                chosen = (int)b;
                inner = json_object_iter_value(json_object_iter((json_t *)j));
            }
        }
    }
    for (size_t b = 0; b < n && chosen < 0; b++)
        if (fits(avro_typeof(avro_schema_union_branch(us, (int)b)), j))
            chosen = (int)b;
    if (chosen < 0) {
        snprintf(err, errlen, "field %s: %s fits no branch of its union",
                 *path->text ? path->text : "(value)", json_kind(j));
        return false;
    }
    avro_value_t branch;
    if (avro_value_set_branch(v, chosen, &branch) != 0) {
        snprintf(err, errlen, "field %s: %s", path->text, avro_strerror());
        return false;
    }
    return put_value(&branch, inner, path, depth + 1, err, errlen);
}

static bool put_record(avro_value_t *v, const json_t *j, Path *path, int depth, char *err,
                       size_t errlen)
{
    size_t n = 0;
    avro_value_get_size(v, &n);
    for (size_t i = 0; i < n; i++) {
        avro_value_t field;
        const char *name = NULL;
        if (avro_value_get_by_index(v, i, &field, &name) != 0)
            return mismatch(path, AVRO_RECORD, j, err, errlen);
        size_t mark;
        path_push(path, &mark, name, 0);
        const json_t *fj = json_object_get(j, name);
        bool ok;
        if (!fj) {
            /* A missing field is null where its type allows null. */
            json_t *null = json_null();
            avro_type_t ft = avro_value_get_type(&field);
            ok = (ft == AVRO_NULL || ft == AVRO_UNION) &&
                 put_value(&field, null, path, depth + 1, err, errlen);
            if (!ok)
                snprintf(err, errlen, "field %s: missing (its type has no null)", path->text);
        } else {
            ok = put_value(&field, fj, path, depth + 1, err, errlen);
        }
        if (!ok)
            return false;
        path->text[mark] = '\0';
    }
    return true;
}

static bool put_value(avro_value_t *v, const json_t *j, Path *path, int depth, char *err,
                      size_t errlen)
{
    if (depth > DEPTH_MAX) {
        snprintf(err, errlen, "field %s: nested deeper than %d levels", path->text, DEPTH_MAX);
        return false;
    }
    avro_type_t t = avro_value_get_type(v);
    if (t != AVRO_UNION && !fits(t, j))
        return mismatch(path, t, j, err, errlen);
    int rc = 0;
    switch (t) {
    case AVRO_NULL:
        rc = avro_value_set_null(v);
        break;
    case AVRO_BOOLEAN:
        rc = avro_value_set_boolean(v, json_is_true(j));
        break;
    case AVRO_INT32: {
        json_int_t i = json_integer_value(j);
        if (i < INT32_MIN || i > INT32_MAX) {
            snprintf(err, errlen, "field %s: %" JSON_INTEGER_FORMAT " is out of an int's range",
                     path->text, i);
            return false;
        }
        rc = avro_value_set_int(v, (int32_t)i);
        break;
    }
    case AVRO_INT64:
        rc = avro_value_set_long(v, json_integer_value(j));
        break;
    case AVRO_FLOAT:
        rc = avro_value_set_float(v, (float)json_number_value(j));
        break;
    case AVRO_DOUBLE:
        rc = avro_value_set_double(v, json_number_value(j));
        break;
    case AVRO_STRING:
        /* avro-c counts the terminating NUL in a string's size. */
        rc = avro_value_set_string_len(v, json_string_value(j), json_string_length(j) + 1);
        break;
    case AVRO_BYTES:
        rc = avro_value_set_bytes(v, (void *)json_string_value(j), json_string_length(j));
        break;
    case AVRO_FIXED: {
        avro_schema_t fs = avro_value_get_schema(v);
        if ((size_t)avro_schema_fixed_size(fs) != json_string_length(j)) {
            snprintf(err, errlen, "field %s: fixed of %lld bytes, got %zu", path->text,
                     (long long)avro_schema_fixed_size(fs), json_string_length(j));
            return false;
        }
        rc = avro_value_set_fixed(v, (void *)json_string_value(j), json_string_length(j));
        break;
    }
    case AVRO_ENUM: {
        int sym = avro_schema_enum_get_by_name(avro_value_get_schema(v), json_string_value(j));
        if (sym < 0) {
            snprintf(err, errlen, "field %s: '%.60s' is not a symbol of its enum", path->text,
                     json_string_value(j));
            return false;
        }
        rc = avro_value_set_enum(v, sym);
        break;
    }
    case AVRO_ARRAY: {
        size_t i;
        const json_t *item;
        json_array_foreach(j, i, item)
        {
            avro_value_t child;
            size_t mark;
            path_push(path, &mark, NULL, i);
            if (avro_value_append(v, &child, NULL) != 0 ||
                !put_value(&child, item, path, depth + 1, err, errlen))
                return false;
            path->text[mark] = '\0';
        }
        break;
    }
    case AVRO_MAP: {
        const char *key;
        const json_t *item;
        json_object_foreach((json_t *)j, key, item)
        {
            avro_value_t child;
            size_t mark;
            path_push(path, &mark, key, 0);
            if (avro_value_add(v, key, &child, NULL, NULL) != 0 ||
                !put_value(&child, item, path, depth + 1, err, errlen))
                return false;
            path->text[mark] = '\0';
        }
        break;
    }
    case AVRO_RECORD:
        return put_record(v, j, path, depth, err, errlen);
    case AVRO_UNION:
        return put_union(v, j, path, depth, err, errlen);
    default:
        return mismatch(path, t, j, err, errlen);
    }
    if (rc != 0) {
        snprintf(err, errlen, "field %s: %s", path->text, avro_strerror());
        return false;
    }
    return true;
}

static bool avro_encode(Parsed *ps, const json_t *root, char **out, size_t *out_len, int id,
                        char *err, size_t errlen)
{
    avro_value_reset(&ps->value);
    Path path = {""};
    if (!put_value(&ps->value, root, &path, 0, err, errlen))
        return false;
    size_t size = 0;
    if (avro_value_sizeof(&ps->value, &size) != 0) {
        snprintf(err, errlen, "%s", avro_strerror());
        return false;
    }
    char *buf = malloc(WIRE_HEADER + size);
    if (!buf) {
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

/* ---- JSON Schema: the keywords checked ------------------------------------------------------ */

static bool type_matches(const char *type, const json_t *j)
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
        return json_is_integer(j) || (json_is_real(j) && isfinite(json_real_value(j)) &&
                                      floor(json_real_value(j)) == json_real_value(j));
    if (strcmp(type, "number") == 0)
        return json_is_number(j);
    if (strcmp(type, "boolean") == 0)
        return json_is_boolean(j);
    if (strcmp(type, "null") == 0)
        return json_is_null(j);
    return true; /* an unknown type name: not ours to refuse */
}

static bool check_json(const json_t *schema, const json_t *j, Path *path, int depth, char *err,
                       size_t errlen)
{
    if (!json_is_object(schema))
        return true; /* true / {} / a boolean schema: anything goes (false is rare: not checked) */
    if (depth > DEPTH_MAX) {
        snprintf(err, errlen, "field %s: nested deeper than %d levels", path->text, DEPTH_MAX);
        return false;
    }
    const char *where = *path->text ? path->text : "(value)";
    const json_t *type = json_object_get(schema, "type");
    if (json_is_string(type) && !type_matches(json_string_value(type), j)) {
        snprintf(err, errlen, "field %s: expected %s, got %s", where, json_string_value(type),
                 json_kind(j));
        return false;
    }
    if (json_is_array(type)) {
        bool any = false;
        size_t i;
        const json_t *t;
        json_array_foreach(type, i, t) any =
            any || (json_is_string(t) && type_matches(json_string_value(t), j));
        if (!any) {
            snprintf(err, errlen, "field %s: a %s is none of its types", where, json_kind(j));
            return false;
        }
    }
    const json_t *cnst = json_object_get(schema, "const");
    if (cnst && !json_equal((json_t *)cnst, (json_t *)j)) {
        snprintf(err, errlen, "field %s: not the constant its schema requires", where);
        return false;
    }
    const json_t *enm = json_object_get(schema, "enum");
    if (json_is_array(enm)) {
        bool any = false;
        size_t i;
        const json_t *e;
        json_array_foreach(enm, i, e) any = any || json_equal((json_t *)e, (json_t *)j);
        if (!any) {
            snprintf(err, errlen, "field %s: not one of its enum's values", where);
            return false;
        }
    }
    if (json_is_object(j)) {
        const json_t *props = json_object_get(schema, "properties");
        const json_t *required = json_object_get(schema, "required");
        const json_t *additional = json_object_get(schema, "additionalProperties");
        size_t i;
        const json_t *name;
        json_array_foreach(required, i, name)
        {
            if (json_is_string(name) && !json_object_get(j, json_string_value(name))) {
                snprintf(err, errlen, "field %s%s%s: required, missing", path->text,
                         *path->text ? "." : "", json_string_value(name));
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
                         path->text);
                return false;
            }
            if (!sub && json_is_object(additional))
                sub = additional;
            if (sub && !check_json(sub, value, path, depth + 1, err, errlen))
                return false;
            path->text[mark] = '\0';
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
            path->text[mark] = '\0';
        }
    }
    return true;
}

/* ---- encode --------------------------------------------------------------------------------- */

/* Parses the registry's schema once; a schema we cannot use fails every row of its subject with
 * the reason (logged once). */
static Parsed *parse_schema(const RegistrySchema *rs, ValueFormat format)
{
    Parsed *ps = calloc(1, sizeof(*ps));
    if (!ps)
        return NULL;
    ps->format = format;
    bool want_avro = format == VALUE_AVRO;
    if ((rs->type == REGISTRY_AVRO) != want_avro || rs->type == REGISTRY_PROTOBUF) {
        snprintf(ps->broken_why, sizeof(ps->broken_why), "subject %s holds a %s schema, not %s",
                 rs->subject,
                 rs->type == REGISTRY_AVRO   ? "AVRO"
                 : rs->type == REGISTRY_JSON ? "JSON"
                                             : "PROTOBUF",
                 want_avro ? "AVRO" : "JSON");
        ps->broken = true;
    } else if (want_avro) {
        if (avro_schema_from_json_length(rs->text, strlen(rs->text), &ps->avro) != 0 ||
            !(ps->iface = avro_generic_class_from_schema(ps->avro)) ||
            avro_generic_value_new(ps->iface, &ps->value) != 0) {
            snprintf(ps->broken_why, sizeof(ps->broken_why), "schema id %d: avro: %s", rs->id,
                     avro_strerror());
            if (ps->iface)
                avro_value_iface_decref(ps->iface);
            ps->iface = NULL;
            ps->broken = true;
        }
    } else {
        json_error_t jerr;
        ps->json = json_loads(rs->text, 0, &jerr);
        if (!ps->json) {
            snprintf(ps->broken_why, sizeof(ps->broken_why), "schema id %d: not JSON: %s", rs->id,
                     jerr.text);
            ps->broken = true;
        }
    }
    if (ps->broken)
        log_error("the registry's schema cannot be used: its rows fail",
                  "subject=%s id=%d "
                  "error=\"%s\"",
                  rs->subject, rs->id, ps->broken_why);
    return ps;
}

SerializerOutcome serializer_encode(Serializer *s, const char *topic, const char *record,
                                    const char *payload, size_t payload_len, char **out,
                                    size_t *out_len, char *err, size_t errlen)
{
    char subject[600];
    switch (s->strategy) {
    case SUBJECT_RECORD:
        snprintf(subject, sizeof(subject), "%s", record);
        break;
    case SUBJECT_TOPIC_RECORD:
        snprintf(subject, sizeof(subject), "%s-%s", topic, record);
        break;
    default:
        snprintf(subject, sizeof(subject), "%s-value", topic);
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
                                    out, out_len, err, errlen);
}

void serializer_schema_release(RegistrySchema *rs)
{
    parsed_free(rs->parsed);
    rs->parsed = NULL;
}

SerializerOutcome serializer_encode_schema(ValueFormat format, RegistrySchema *rs,
                                           const char *subject, const char *payload,
                                           size_t payload_len, char **out, size_t *out_len,
                                           char *err, size_t errlen)
{
    if (!rs->parsed)
        rs->parsed = parse_schema(rs, format);
    Parsed *ps = rs->parsed;
    if (!ps) {
        snprintf(err, errlen, "out of memory");
        return SERIALIZER_RETRY_LATER;
    }
    if (ps->broken) {
        snprintf(err, errlen, "%s", ps->broken_why);
        return SERIALIZER_RETRY_LATER;
    }
    json_error_t jerr;
    json_t *root = json_loadb(payload, payload_len, JSON_DECODE_ANY, &jerr);
    if (!root) {
        snprintf(err, errlen, "payload is not JSON (schema id %d): %s", rs->id, jerr.text);
        return SERIALIZER_ROW_FAULT;
    }
    char why[400];
    bool ok;
    if (format == VALUE_AVRO) {
        ok = avro_encode(ps, root, out, out_len, rs->id, why, sizeof(why));
    } else {
        Path path = {""};
        ok = check_json(ps->json, root, &path, 0, why, sizeof(why));
        char *buf = ok ? malloc(WIRE_HEADER + payload_len) : NULL;
        if (ok && !buf) {
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
    if (!ok) {
        snprintf(err, errlen, "payload does not fit schema id %d (subject %s): %s", rs->id, subject,
                 why);
        return SERIALIZER_ROW_FAULT;
    }
    return SERIALIZER_OK;
}
