#include "table.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "db.h"
#include "optval.h"
#include "route.h"
#include "statements.h"
#include "strbuf.h"

/* PostgreSQL truncates longer identifiers (NAMEDATALEN - 1), which would silently name another
 * column than the one configured. */
#define IDENT_MAX 63
/* json_build_object takes at most 100 arguments: two per header. */
#define EXTRA_MAX 32

typedef struct LayoutDefaults {
    const char *seq, *event_id, *aggregate_type, *aggregate_id, *event_type, *payload, *headers;
    bool identity_headers;
} LayoutDefaults;

static const LayoutDefaults layout_defaults[] = {
    [LAYOUT_RELAY] = {"id", "event_id", "aggregate_type", "aggregate_id", "event_type", "payload",
                      "headers", true},
    /* Debezium's outbox table has no order column of its own (Debezium reads the WAL in commit
     * order); migrate adds "seq", a bigint identity, for the relay to claim in. */
    [LAYOUT_DEBEZIUM] = {"seq", "id", "aggregatetype", "aggregateid", "type", "payload", NULL,
                         false},
};

static bool ident_ok(const char *what, const char *name, char *err, size_t errlen)
{
    if (!name || !*name)
        return optval_fail(err, errlen, "%s: empty name", what);
    if (strlen(name) > IDENT_MAX)
        return optval_fail(err, errlen, "%s '%.40s...': longer than %d bytes", what, name,
                           IDENT_MAX);
    return true;
}

/* Copies the configured name, or the default, after checking it. */
static bool pick(char **slot, const char *what, const char *given, const char *def, char *err,
                 size_t errlen)
{
    const char *name = given ? given : def;
    if (!ident_ok(what, name, err, errlen))
        return false;
    *slot = strdup(name);
    return *slot != NULL || optval_fail(err, errlen, "out of memory");
}

/* A placed header name the relay would drop from every message (route_header_reserved: id in
 * any case or shape, dlq.*, with identity_headers event_type and aggregate_type; with
 * CloudEvents its attributes' names, which route_cloudevents_add replaces): refused at start-up
 * rather than accepted and never sent. */
static bool reserved_header(const TableMap *m, const char *name)
{
    return route_header_reserved(name, m->identity_headers) ||
           (m->cloudevents && route_cloudevents_reserved(name));
}

/* Appends {column, name} to *list (with *n entries), refusing a name already there. */
static bool add_placement(TableHeader **list, size_t *n, const char *column, const char *name,
                          const char *kind, char *err, size_t errlen)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp((*list)[i].header, name) == 0)
            return optval_fail(err, errlen, "additional-fields: %s '%.40s' named twice", kind,
                               name);
    if (*n == EXTRA_MAX)
        return optval_fail(err, errlen, "additional-fields: more than %d %s columns", EXTRA_MAX,
                           kind);
    TableHeader *grown = realloc(*list, (*n + 1) * sizeof(*grown));
    if (!grown)
        return optval_fail(err, errlen, "out of memory");
    *list = grown;
    TableHeader h = {strdup(column), strdup(name)};
    if (!h.column || !h.header) {
        free(h.column);
        free(h.header);
        return optval_fail(err, errlen, "out of memory");
    }
    (*list)[(*n)++] = h;
    return true;
}

/* s without its leading and trailing white space, trimmed in place (as Java's String.trim,
 * which Debezium applies to each part of a placement). */
static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        s[--len] = '\0';
    return s;
}

/* One "column:placement[:name]" entry, split in place. The placements are Debezium's: header (a
 * Kafka header), envelope (a field of the value, beside "payload") and partition (the message's
 * partition; no name). As Debezium reads them, each part is trimmed and the placement's case does
 * not matter ("type : HEADER : eventType"): a connector's setting carries over as it is. */
static bool parse_placement(TableMap *m, char *entry, char *err, size_t errlen)
{
    char *placement = strchr(entry, ':');
    char *name = placement ? strchr(placement + 1, ':') : NULL;
    if (!placement || (name && strchr(name + 1, ':')))
        return optval_fail(err, errlen,
                           "additional-fields: expected COLUMN:header|envelope[:NAME] or "
                           "COLUMN:partition, got '%.60s'",
                           trim(entry));
    *placement++ = '\0';
    if (name)
        *name++ = '\0';
    entry = trim(entry);
    placement = trim(placement);
    if (name)
        name = trim(name);
    if (!ident_ok("additional-fields: column", entry, err, errlen))
        return false;
    bool named = name != NULL;
    if (!name)
        name = entry;
    if (strcasecmp(placement, "partition") == 0) {
        /* A partition has no name to take: one given would be dropped unseen. */
        if (named)
            return optval_fail(err, errlen,
                               "additional-fields: expected COLUMN:partition (no name), got "
                               "'%.40s:partition:%.40s'",
                               entry, name);
        if (m->partition)
            return optval_fail(err, errlen,
                               "additional-fields: a second partition column ('%.40s')", entry);
        m->partition = strdup(entry);
        return m->partition != NULL || optval_fail(err, errlen, "out of memory");
    }
    if (strcasecmp(placement, "envelope") == 0) {
        if (!*name || strcmp(name, "payload") == 0)
            return optval_fail(err, errlen, "additional-fields: envelope field name '%.40s' %s",
                               name, *name ? "is the payload's own" : "is empty");
        return add_placement(&m->envelope, &m->n_envelope, entry, name, "envelope field", err,
                             errlen);
    }
    if (strcasecmp(placement, "header") != 0)
        return optval_fail(err, errlen,
                           "additional-fields: placement '%.20s' of column '%.40s' is not "
                           "supported (header, envelope or partition)",
                           placement, entry);
    if (!*name || reserved_header(m, name))
        return optval_fail(err, errlen, "additional-fields: header name '%.40s' %s", name,
                           *name ? "is set by the relay itself" : "is empty");
    return add_placement(&m->extra, &m->n_extra, entry, name, "header", err, errlen);
}

/* "column:placement[:name]" entries separated by commas, as Debezium's
 * table.fields.additional.placement. */
static bool parse_placements(TableMap *m, const char *text, char *err, size_t errlen)
{
    char *copy = strdup(text);
    if (!copy)
        return optval_fail(err, errlen, "out of memory");
    bool ok = true;
    char *save = NULL;
    for (char *entry = strtok_r(copy, ",", &save); ok && entry; entry = strtok_r(NULL, ",", &save))
        ok = parse_placement(m, entry, err, errlen);
    free(copy);
    return ok;
}

bool table_map_init(TableMap *m, const TableOptions *o, char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    m->layout = o->layout;
    const LayoutDefaults *d = &layout_defaults[o->layout];
    m->identity_headers = d->identity_headers;
    m->event_time = o->event_time;
    m->payload_binary = o->payload_binary;
    m->tombstone_on_empty = o->tombstone_on_empty;
    m->cloudevents = o->cloudevents;

    const char *table = o->table ? o->table : "outbox";
    const char *dot = strchr(table, '.');
    if (dot) {
        if (strchr(dot + 1, '.'))
            return optval_fail(err, errlen, "table '%.80s': expected NAME or SCHEMA.NAME", table);
        m->schema = strndup(table, (size_t)(dot - table));
        if (!m->schema)
            return optval_fail(err, errlen, "out of memory");
        if (!ident_ok("table: schema", m->schema, err, errlen))
            return false;
        table = dot + 1;
    }
    if (!pick(&m->name, "table", table, NULL, err, errlen) ||
        !pick(&m->seq, "seq-column", o->seq_column, d->seq, err, errlen) ||
        !pick(&m->event_id, "event-id-column", o->event_id_column, d->event_id, err, errlen) ||
        !pick(&m->aggregate_type, "aggregate-type-column", o->aggregate_type_column,
              d->aggregate_type, err, errlen) ||
        !pick(&m->aggregate_id, "aggregate-id-column", o->aggregate_id_column, d->aggregate_id, err,
              errlen) ||
        !pick(&m->event_type, "event-type-column", o->event_type_column, d->event_type, err,
              errlen) ||
        !pick(&m->payload, "payload-column", o->payload_column, d->payload, err, errlen))
        return false;
    const char *headers = o->headers_column ? o->headers_column : d->headers;
    if (headers && strcmp(headers, "none") != 0 &&
        !pick(&m->headers, "headers-column", headers, NULL, err, errlen))
        return false;
    if (o->additional_fields && !parse_placements(m, o->additional_fields, err, errlen))
        return false;
    if (o->timestamp_column &&
        !pick(&m->timestamp, "timestamp-column", o->timestamp_column, NULL, err, errlen))
        return false;
    /* An envelope is a JSON object: bytes have no place in it (Debezium's envelope of a bytes
     * payload is a Connect struct, which only a schema'd converter could write). */
    if (m->payload_binary && m->n_envelope > 0)
        return optval_fail(err, errlen,
                           "additional-fields: envelope placement needs a text payload, not "
                           "--payload-format binary");
    return true;
}

void table_map_free(TableMap *m)
{
    char **names[] = {&m->schema,         &m->name,         &m->seq,        &m->event_id,
                      &m->aggregate_type, &m->aggregate_id, &m->event_type, &m->payload,
                      &m->headers,        &m->partition,    &m->timestamp};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        free(*names[i]);
        *names[i] = NULL;
    }
    for (size_t i = 0; i < m->n_extra; i++) {
        free(m->extra[i].column);
        free(m->extra[i].header);
    }
    free(m->extra);
    m->extra = NULL;
    m->n_extra = 0;
    for (size_t i = 0; i < m->n_envelope; i++) {
        free(m->envelope[i].column);
        free(m->envelope[i].header);
    }
    free(m->envelope);
    m->envelope = NULL;
    m->n_envelope = 0;
}

static bool same(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

bool table_map_is_own(const TableMap *m, const char *schema)
{
    const LayoutDefaults *d = &layout_defaults[LAYOUT_RELAY];
    /* --table public.outbox is the relay's own table, written out, when public is the schema. */
    bool own_schema = !m->schema || same(m->schema, schema ? schema : "public");
    return own_schema && same(m->name, "outbox") && same(m->seq, d->seq) &&
           same(m->event_id, d->event_id) && same(m->aggregate_type, d->aggregate_type) &&
           same(m->aggregate_id, d->aggregate_id) && same(m->event_type, d->event_type) &&
           same(m->payload, d->payload) && same(m->headers, d->headers);
}

const char *table_map_display(const TableMap *m, char *buf, size_t buflen)
{
    snprintf(buf, buflen, "%s%s%s", m->schema ? m->schema : "", m->schema ? "." : "", m->name);
    return buf;
}

/* ---- SQL templates ------------------------------------------------------------------------ */

/* strbuf_puts for use in && chains (it aborts when out of memory). */
static bool put(StrBuf *sb, const char *s)
{
    strbuf_puts(sb, s);
    return true;
}

/* Appends text quoted by quote (PQescapeIdentifier or PQescapeLiteral, which share a signature);
 * `what` names the kind in the error. */
static bool append_quoted(StrBuf *sb, PGconn *conn, char *(*quote)(PGconn *, const char *, size_t),
                          const char *what, const char *text, char *err, size_t errlen)
{
    char *quoted = quote(conn, text, strlen(text));
    if (!quoted)
        return optval_fail(err, errlen, "cannot quote %s: %s", what,
                           db_error_line(PQerrorMessage(conn)));
    strbuf_puts(sb, quoted);
    PQfreemem(quoted);
    return true;
}

static bool append_ident(StrBuf *sb, PGconn *conn, const char *name, char *err, size_t errlen)
{
    return append_quoted(sb, conn, PQescapeIdentifier, "identifier", name, err, errlen);
}

static bool append_literal(StrBuf *sb, PGconn *conn, const char *text, char *err, size_t errlen)
{
    return append_quoted(sb, conn, PQescapeLiteral, "literal", text, err, errlen);
}

/* The name of one of the indexes migrate gives an adopted table, as an identifier or (text) as a
 * string literal. */
static bool append_index_name(StrBuf *sb, PGconn *conn, const TableMap *m, const char *suffix,
                              bool text, char *err, size_t errlen)
{
    char name[IDENT_MAX * 2 + 16];
    snprintf(name, sizeof(name), "%s%s", m->name, suffix);
    /* As PostgreSQL would truncate it (minus its notice), at a character boundary. */
    size_t len = strlen(name) > IDENT_MAX ? IDENT_MAX : strlen(name);
    while (len > 0 && ((unsigned char)name[len] & 0xC0) == 0x80)
        len--;
    name[len] = '\0';
    return text ? append_literal(sb, conn, name, err, errlen)
                : append_ident(sb, conn, name, err, errlen);
}

/* The value of row alias o: its payload, or with envelope (and envelope fields) the envelope
 * built from o's columns; with m->tombstone_on_empty NULL for a NULL or blank payload, tested
 * without converting the payload. */
static bool expand_payload(StrBuf *sb, PGconn *conn, const TableMap *m, bool envelope, char *err,
                           size_t errlen)
{
    /* Debezium's route.tombstone.on.empty.payload: a NULL payload, or one whose text Java's
     * trim() leaves empty (white space and control characters, U+0001 to U+0020), makes a
     * tombstone. A bytea payload is never blank to Debezium (a byte[]'s toString() is
     * "[B@..."): only its NULL is; nor is a json or jsonb one (no JSON text is blank).
     * This runs on every claimed row before the byte budget cuts the batch, on payloads
     * still as stored (statements.c, SQL_WITHIN_BUDGET): the test must not convert them.
     * So json and jsonb, whose ::text converts the whole value, are passed by their type,
     * and a text payload is looked at by its first 64 characters (substr reads only that
     * slice of a TOASTed value) before all of it, which only a blank start makes needed. */
    if (m->tombstone_on_empty &&
        (!put(sb, "CASE WHEN o.") || !append_ident(sb, conn, m->payload, err, errlen) ||
         !put(sb, " IS NULL") ||
         (!m->payload_binary &&
          (!put(sb, " OR (pg_catalog.pg_typeof(o.") ||
           !append_ident(sb, conn, m->payload, err, errlen) ||
           !put(sb, ") <> ALL ('{pg_catalog.json,pg_catalog.jsonb}'::pg_catalog.regtype[])"
                    " AND pg_catalog.substr(o.") ||
           !append_ident(sb, conn, m->payload, err, errlen) ||
           !put(sb, "::text, 1, 64) !~ '[^\\x01-\\x20]' AND o.") ||
           !append_ident(sb, conn, m->payload, err, errlen) ||
           !put(sb, "::text !~ '[^\\x01-\\x20]')"))) ||
         !put(sb, " THEN NULL ELSE ")))
        return false;
    if (!envelope || m->n_envelope == 0) {
        if (!put(sb, "o.") || !append_ident(sb, conn, m->payload, err, errlen))
            return false;
    } else {
        /* Debezium's envelope placement: the value becomes {"payload": ..., field: ...},
         * each field as its column's JSON (json_build_object keeps the order given). A NULL
         * payload is null in it, as in Debezium's by default: only with
         * route.tombstone.on.empty.payload is it a tombstone. */
        if (!put(sb, "pg_catalog.json_build_object('payload', o.") ||
            !append_ident(sb, conn, m->payload, err, errlen))
            return false;
        for (size_t i = 0; i < m->n_envelope; i++)
            if (!put(sb, ", ") || !append_literal(sb, conn, m->envelope[i].header, err, errlen) ||
                !put(sb, ", o.") || !append_ident(sb, conn, m->envelope[i].column, err, errlen))
                return false;
        if (!put(sb, ")"))
            return false;
    }
    return !m->tombstone_on_empty || put(sb, " END");
}

/* What a claim carries of the fields placed as headers or in the envelope (fields, n), as stored,
 * through its inner queries until the byte budget's first cut (statements.c, SQL_WITHIN_BUDGET):
 * CARRY_COLUMNS o's columns (", o.col" each), CARRY_NAMES their names in the claim's row alias
 * (", PREFIX_1", ...), CARRY_BYTES their stored sizes for that cut (" + coalesce(
 * pg_column_size(r.PREFIX_1), 0)", ...). Nothing for no field. */
typedef enum { CARRY_COLUMNS, CARRY_NAMES, CARRY_BYTES } Carried;

static bool put_carried(StrBuf *sb, PGconn *conn, const TableHeader *fields, size_t n,
                        const char *prefix, Carried what, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        char part[96];
        if (what == CARRY_COLUMNS) {
            if (!put(sb, ", o.") || !append_ident(sb, conn, fields[i].column, err, errlen))
                return false;
            continue;
        }
        if (what == CARRY_NAMES)
            snprintf(part, sizeof(part), ", %s_%zu", prefix, i + 1);
        else
            snprintf(part, sizeof(part), " + coalesce(pg_catalog.pg_column_size(r.%s_%zu), 0)",
                     prefix, i + 1);
        if (!put(sb, part))
            return false;
    }
    return true;
}

static bool expand_token(StrBuf *sb, PGconn *conn, const TableMap *m, const char *token, size_t len,
                         char *err, size_t errlen)
{
#define IS(t) (len == strlen(t) && strncmp(token, t, len) == 0)
    if (IS("table")) {
        if (m->schema && (!append_ident(sb, conn, m->schema, err, errlen) || !put(sb, ".")))
            return false;
        return append_ident(sb, conn, m->name, err, errlen);
    }
    if (IS("table_text")) { /* the table's name as SQL text, for ::regclass */
        StrBuf name = {0};
        bool ok = expand_token(&name, conn, m, "table", strlen("table"), err, errlen) &&
                  append_literal(sb, conn, name.s, err, errlen);
        strbuf_free(&name);
        return ok;
    }
    /* Column names as SQL text (pg_get_serial_sequence, outbox_floor_install). */
    if (IS("seq_text"))
        return append_literal(sb, conn, m->seq, err, errlen);
    if (IS("event_id_text"))
        return append_literal(sb, conn, m->event_id, err, errlen);
    if (IS("aggregate_type_text"))
        return append_literal(sb, conn, m->aggregate_type, err, errlen);
    if (IS("aggregate_id_text"))
        return append_literal(sb, conn, m->aggregate_id, err, errlen);
    if (IS("payload_text"))
        return append_literal(sb, conn, m->payload, err, errlen);
    const struct {
        const char *token;
        const char *column;
    } columns[] = {{"seq", m->seq},
                   {"event_id", m->event_id},
                   {"aggregate_type", m->aggregate_type},
                   {"aggregate_id", m->aggregate_id},
                   {"event_type", m->event_type},
                   {"payload", m->payload}};
    for (size_t i = 0; i < sizeof(columns) / sizeof(columns[0]); i++)
        if (IS(columns[i].token))
            return append_ident(sb, conn, columns[i].column, err, errlen);
    if (IS("headers")) {
        if (!m->headers)
            return optval_fail(err, errlen, "the table has no headers column");
        return append_ident(sb, conn, m->headers, err, errlen);
    }
    /* A claim carries the headers column and the fields placed as headers as stored, and
     * converts them to text ({p.headers_text}, {p.extra_headers_text}) after the byte budget's
     * cut by stored sizes (statements.c, SQL_WITHIN_BUDGET), as it does the payload: converted
     * in the claim's rows query, every claimed row's were read whole (39_batch_bytes,
     * 88_debezium_router part 7 counts the TOAST blocks read). */
    if (IS("o.headers") || IS("o.claim_headers") || IS("p.headers_text")) {
        if (!m->headers)
            return put(sb, "NULL::text");
        if (IS("p.headers_text"))
            return put(sb, "p.stored_headers::text");
        return put(sb, "o.") && append_ident(sb, conn, m->headers, err, errlen) &&
               (IS("o.claim_headers") || put(sb, "::text"));
    }
    if (IS("o.extra_headers") || IS("p.extra_headers_text")) {
        if (m->n_extra == 0)
            return put(sb, "NULL::text");
        bool claimed = IS("p.extra_headers_text");
        /* json, not jsonb: jsonb orders an object's keys by length, and the headers would then
         * go out in that order; Debezium adds them in the order the placement gives. */
        if (!put(sb, "pg_catalog.json_build_object("))
            return false;
        for (size_t i = 0; i < m->n_extra; i++) {
            char field[48];
            snprintf(field, sizeof(field), ", p.extra_header_%zu", i + 1);
            if ((i > 0 && !put(sb, ", ")) ||
                !append_literal(sb, conn, m->extra[i].header, err, errlen) ||
                (claimed ? !put(sb, field)
                         : !put(sb, ", o.") ||
                               !append_ident(sb, conn, m->extra[i].column, err, errlen)) ||
                !put(sb, "::text"))
                return false;
        }
        return put(sb, ")::text");
    }
    if (IS("o.extra_header_columns") || IS("extra_header_names") || IS("r.extra_header_bytes"))
        return put_carried(sb, conn, m->extra, m->n_extra, "extra_header",
                           IS("o.extra_header_columns") ? CARRY_COLUMNS
                           : IS("extra_header_names")   ? CARRY_NAMES
                                                        : CARRY_BYTES,
                           err, errlen);
    /* Only the messages that carry the event's time need it: the text costs 29 bytes a row in
     * every claim result held while its batch is in flight. */
    if (IS("o.created_at_text"))
        return put(sb, m->event_time
                           ? "pg_catalog.to_char(o.created_at AT TIME ZONE 'UTC', " SQL_ISO_UTC ")"
                           : "NULL::text");
    /* {o.payload} builds the value from the row itself; a claim takes {o.claim_payload} and
     * {o.envelope_columns} from the row and builds the envelope in {p.payload_text}, after the
     * byte budget's cut by stored sizes (statements.c, SQL_WITHIN_BUDGET): json_build_object
     * converts the payload to text, which must not happen to a row the budget leaves out. */
    if (IS("o.payload"))
        return expand_payload(sb, conn, m, true, err, errlen);
    if (IS("o.claim_payload"))
        return expand_payload(sb, conn, m, false, err, errlen);
    /* The envelope fields carried through a claim's inner queries as stored (no conversion):
     * o's columns, their names in the claim's row alias (envelope_1, ...), and their stored
     * sizes for the budget's first cut. Empty without envelope fields. */
    if (IS("o.envelope_columns") || IS("envelope_names") || IS("r.envelope_bytes"))
        return put_carried(sb, conn, m->envelope, m->n_envelope, "envelope",
                           IS("o.envelope_columns") ? CARRY_COLUMNS
                           : IS("envelope_names")   ? CARRY_NAMES
                                                    : CARRY_BYTES,
                           err, errlen);
    /* A bytea payload stays bytea: its text form is hex (the result's column type tells
     * batch.c to decode it), and octet_length counts its bytes. With envelope fields (never
     * with bytea) the text is the envelope, built from p's payload (NULL here when
     * {o.claim_payload} made it a tombstone) and the fields {o.envelope_columns} carried. */
    if (IS("p.payload_text")) {
        if (m->n_envelope == 0)
            return put(sb, m->payload_binary ? "p.payload" : "p.payload::text");
        if (m->tombstone_on_empty && !put(sb, "CASE WHEN p.payload IS NULL THEN NULL ELSE "))
            return false;
        if (!put(sb, "pg_catalog.json_build_object('payload', p.payload"))
            return false;
        for (size_t i = 0; i < m->n_envelope; i++) {
            char field[40];
            snprintf(field, sizeof(field), ", p.envelope_%zu", i + 1);
            if (!put(sb, ", ") || !append_literal(sb, conn, m->envelope[i].header, err, errlen) ||
                !put(sb, field))
                return false;
        }
        return put(sb, ")::text") && (!m->tombstone_on_empty || put(sb, " END"));
    }
    /* What a payload holds in the claim's result beyond its bytes: a bytea arrives as its hex
     * text (\x and two digits a byte), so the budget counts that, not the bytes it decodes to. */
    if (IS("s.payload_hex_extra"))
        return put(sb, m->payload_binary
                           ? "coalesce(pg_catalog.octet_length(s.text) + 2, 0)::bigint"
                           : "0::bigint");
    if (IS("o.timestamp_ms")) {
        if (!m->timestamp)
            return put(sb, "NULL::text");
        /* infinity has no epoch as a bigint: the cast would fail the whole claim, every row of
         * the session's lanes with it. Its text instead fails only its own row (message.c). */
        return put(sb, "CASE WHEN pg_catalog.isfinite(o.") &&
               append_ident(sb, conn, m->timestamp, err, errlen) &&
               put(sb, ") THEN pg_catalog.floor(extract(epoch FROM o.") &&
               append_ident(sb, conn, m->timestamp, err, errlen) &&
               put(sb, ") * 1000::numeric)::bigint::text ELSE o.") &&
               append_ident(sb, conn, m->timestamp, err, errlen) && put(sb, "::text END");
    }
    if (IS("o.partition")) {
        if (!m->partition)
            return put(sb, "NULL::text");
        return put(sb, "o.") && append_ident(sb, conn, m->partition, err, errlen) &&
               put(sb, "::text");
    }
    /* {NAME_idx} as an identifier, {NAME_idx_text} as a string literal (migrate's check that
     * each is the table's own). */
    static const struct {
        const char *token, *suffix;
    } indexes[] = {{"unsent_idx", "_unsent_idx"},
                   {"retry_idx", "_retry_idx"},
                   {"seq_idx", "_seq_idx"},
                   {"sent_idx", "_sent_at_idx"}};
    for (size_t i = 0; i < sizeof(indexes) / sizeof(indexes[0]); i++) {
        size_t n = strlen(indexes[i].token);
        if (len >= n && strncmp(token, indexes[i].token, n) == 0 &&
            (len == n || (len == n + 5 && strncmp(token + n, "_text", 5) == 0)))
            return append_index_name(sb, conn, m, indexes[i].suffix, len > n, err, errlen);
    }
#undef IS
    return optval_fail(err, errlen, "unknown placeholder {%.*s} in a statement template", (int)len,
                       token);
}

/* A placeholder is {name} with name made of lower-case letters, '_' and '.'; anything else
 * between braces (a JSON or array literal, say) is SQL text. */
static size_t token_length(const char *p)
{
    size_t n = 0;
    while ((p[n] >= 'a' && p[n] <= 'z') || p[n] == '_' || p[n] == '.')
        n++;
    return n > 0 && p[n] == '}' ? n : 0;
}

char *table_sql(const TableMap *m, PGconn *conn, const char *tmpl, char *err, size_t errlen)
{
    StrBuf sb = {0};
    for (const char *p = tmpl; *p;) {
        size_t n = *p == '{' ? token_length(p + 1) : 0;
        if (n == 0) {
            const char *next = strchr(p + 1, '{');
            size_t literal = next ? (size_t)(next - p) : strlen(p);
            strbuf_append(&sb, p, literal);
            p += literal;
            continue;
        }
        if (!expand_token(&sb, conn, m, p + 1, n, err, errlen)) {
            strbuf_free(&sb);
            return NULL;
        }
        p += n + 2;
    }
    if (!sb.s)
        put(&sb, "");
    return sb.s;
}

bool table_sql_all(const TableMap *m, PGconn *conn, const char *const *tmpls, char **out, int n,
                   char *err, size_t errlen)
{
    for (int i = 0; i < n; i++) {
        out[i] = table_sql(m, conn, tmpls[i], err, errlen);
        if (!out[i]) {
            while (i-- > 0) {
                free(out[i]);
                out[i] = NULL;
            }
            return false;
        }
    }
    return true;
}
