/* table: which table and columns hold the outbox, and the relay's SQL written for them.
 *
 * By default the relay reads its own table (migrations/0001_outbox.sql). It can also serve an
 * existing table of another layout, such as the one Debezium's Outbox Event Router reads
 * (id uuid, aggregatetype, aggregateid, type, payload): the options name the table and the
 * columns holding each part of an event, and `migrate` adds the relay's bookkeeping columns
 * (sent_at, attempts, ... and a bigint order column) to it.
 *
 * Every statement that touches the outbox is written once as a template with placeholders
 * ({table}, {seq}, {aggregate_id}, ...) and expanded here with identifiers quoted by
 * PQescapeIdentifier, so no name from configuration ever reaches SQL unquoted. */
#ifndef OUTBOX_TABLE_H
#define OUTBOX_TABLE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum {
    LAYOUT_RELAY,    /* the relay's own column names; id, event_type, aggregate_type headers */
    LAYOUT_DEBEZIUM, /* Debezium's: id, aggregatetype, aggregateid, type, payload; id header */
} TableLayout;

/* One extra column placed in a Kafka header. */
typedef struct TableHeader {
    char *column;
    char *header;
} TableHeader;

typedef struct TableMap {
    TableLayout layout;
    bool payload_binary; /* bytea payload column: published byte for byte (--payload-format) */
    /* A NULL or blank payload is a tombstone, also in an envelope (--tombstone-on-empty-payload,
     * Debezium's route.tombstone.on.empty.payload); otherwise the value is what Debezium's
     * default makes it: the payload column (a NULL one a tombstone), or the envelope. */
    bool tombstone_on_empty;
    char *schema; /* NULL: found through the search_path */
    char *name;
    char *seq; /* bigint column giving the order in which events are claimed */
    char *event_id;
    char *aggregate_type; /* routes the event (topic) */
    char *aggregate_id;   /* the Kafka key */
    char *event_type;
    char *payload;      /* the Kafka value */
    char *headers;      /* JSON object column of headers; NULL: none */
    TableHeader *extra; /* extra columns placed as headers */
    size_t n_extra;
    TableHeader *envelope; /* extra columns placed in the value's envelope (header: field name) */
    size_t n_envelope;
    char *partition; /* column whose value is the message's partition (placement partition) */
    char *timestamp; /* column whose value is the message's timestamp; NULL: the produce time */
    bool identity_headers; /* also event_type and aggregate_type headers, besides id */
    bool event_time;       /* the claims read created_at as text (CloudEvents' time attribute) */
    bool cloudevents;      /* the messages carry CloudEvents' headers (route_cloudevents_add) */
} TableMap;

/* The options as given; NULL for not set (the layout's default then applies). */
typedef struct TableOptions {
    TableLayout layout;
    const char *table; /* "name" or "schema.name" */
    const char *seq_column, *event_id_column, *aggregate_type_column, *aggregate_id_column,
        *event_type_column, *payload_column;
    const char *headers_column;    /* "none": the table has none */
    const char *additional_fields; /* "column:header[:name],..." (Debezium's placement syntax) */
    const char *timestamp_column;  /* the message timestamp (table.field.event.timestamp) */
    bool event_time;     /* the messages carry the event's time (--message-format cloudevents) */
    bool payload_binary; /* the payload column is bytea, sent as its bytes */
    bool tombstone_on_empty; /* NULL or blank payloads are tombstones (TableMap says how) */
    bool cloudevents; /* --message-format cloudevents: its ce_ and content-type headers replace
                       * any of those names (route_cloudevents_add) */
} TableOptions;

/* Resolves the options into m. On bad input (an empty or over-long name, a placement other than
 * header, envelope or partition, a header name the relay sets itself, an envelope field named
 * payload or twice, a second partition column, envelope fields with a binary payload) returns
 * false with one line in err; m must still be released with table_map_free. */
bool table_map_init(TableMap *m, const TableOptions *o, char *err, size_t errlen)
    __attribute__((warn_unused_result));
void table_map_free(TableMap *m);

/* True when m is the relay's own table, which the embedded migrations create in schema (the
 * --schema, public when NULL): the table "outbox", unqualified or qualified with that schema, with
 * the relay layout's columns. */
bool table_map_is_own(const TableMap *m, const char *schema);

/* The table as one might write it in a message: "outbox" or "app.events" (not quoted). */
const char *table_map_display(const TableMap *m, char *buf, size_t buflen);

/* The columns of a claimed row of alias o, in the order batch.c reads them: last_error (an SQL
 * expression) is only needed for dead-letter rows; then the row's age on the database clock in
 * microseconds, for the latency metric (NULL, unknown, for a created_at of infinity or
 * -infinity, which PostgreSQL 15 cannot subtract: one such row failed every claim of its
 * session's lanes, and nothing of them was sent), the additional fields placed as headers, and
 * the row's created_at as text when the messages carry it. Used by the claims, and by
 * migrate to check that an adopted table has every column they read. */
#define TABLE_ROW_COLUMNS(last_error) TABLE_ROW_COLUMNS_PAYLOAD("{o.payload}::text", last_error)
/* The same with the payload as given (the claims take it as stored and convert it to text only
 * for the rows within their byte budget). */
#define TABLE_ROW_COLUMNS_PAYLOAD(payload, last_error)                                             \
    TABLE_ROW_COLUMNS_AS(payload, "{o.headers}", "{o.extra_headers}", last_error)
/* The same with the headers and the additional fields placed as headers as given too (the
 * claims take the headers column as stored, and the fields as further columns). */
#define TABLE_ROW_COLUMNS_AS(payload, headers, extra_headers, last_error)                          \
    " o.{seq}, o.{event_id}, o.{aggregate_type}, o.{aggregate_id}, o.{event_type}, " payload ","   \
    " " headers ", o.attempts, " last_error ","                                                    \
    " CASE WHEN pg_catalog.isfinite(o.created_at) THEN (extract(epoch FROM"                        \
    " pg_catalog.clock_timestamp() - o.created_at) * 1000000::numeric)::bigint END,"               \
    " " extra_headers ", {o.created_at_text}, {o.timestamp_ms}, {o.partition}"

/* One claimed row, decoded from the columns below (engine/batch.c). Strings point into the query
 * result and stay valid while the batch lives; payload and headers are NULL for SQL NULL. */
typedef struct OutboxRow {
    long long id;
    const char *event_id;
    const char *aggregate_type;
    const char *aggregate_id;
    const char *event_type;
    const char *payload;
    size_t payload_len;
    const char *headers;       /* JSON object text, or NULL */
    const char *extra_headers; /* JSON object of the additional fields placed as headers, or NULL */
    const char *created_at;    /* RFC 3339 in UTC ("2026-11-23T12:00:00.123456Z"), or NULL */
    const char *timestamp_ms;  /* the timestamp column in ms since the epoch (text), or NULL */
    const char *partition;     /* the partition column's text, or NULL (the partitioner decides) */
} OutboxRow;

/* The position of each column of TABLE_ROW_COLUMNS in a result, for whoever decodes one. */
typedef enum {
    ROW_COL_ID,
    ROW_COL_EVENT_ID,
    ROW_COL_AGGREGATE_TYPE,
    ROW_COL_AGGREGATE_ID,
    ROW_COL_EVENT_TYPE,
    ROW_COL_PAYLOAD,
    ROW_COL_HEADERS,
    ROW_COL_ATTEMPTS,
    ROW_COL_LAST_ERROR,
    ROW_COL_AGE, /* microseconds */
    ROW_COL_EXTRA_HEADERS,
    ROW_COL_CREATED_AT,   /* RFC 3339, UTC, microseconds; NULL unless m->event_time */
    ROW_COL_TIMESTAMP,    /* ms since the epoch; NULL without a timestamp column */
    ROW_COL_PARTITION,    /* the partition column as text; NULL without one */
    ROW_COL_PAYLOAD_BYTES /* claims within a byte budget: NULL unless the payload was left out */
} RowColumn;

/* Expands a statement template for conn (whose encoding the quoting follows). Placeholders:
 *   {table}            the table, quoted (schema-qualified when configured)
 *   {seq} {event_id} {aggregate_type} {aggregate_id} {event_type} {payload}
 *                      the mapped columns, quoted, unqualified
 *   {headers}          the headers column, quoted (an error without one)
 *   {o.headers}        o.<headers column>::text, or NULL::text without one
 *   {o.extra_headers}  the extra header columns of row alias o, each as text, in one JSON
 *                      object text, or NULL::text without any
 *   {o.claim_headers}  what a claim takes of row alias o's headers column: the column as stored
 *                      (no conversion), or NULL::text without one
 *   {o.extra_header_columns} ", o.<column>" for each field placed as a header, as stored (""
 *                      without any): a claim's last columns, after {o.envelope_columns}, named
 *                      {extra_header_names} (", extra_header_1", ...)
 *   {r.extra_header_bytes} " + coalesce(pg_column_size(r.extra_header_N), 0)" for each: their
 *                      stored sizes, for the budget's first cut
 *   {p.headers_text}   {o.headers} from alias p's stored_headers (what {o.claim_headers} took)
 *   {p.extra_headers_text} {o.extra_headers} built from alias p's extra_header_N
 *   {o.created_at_text} o.created_at as RFC 3339 text in UTC when m->event_time, else NULL::text
 *   {o.payload}        the value of row alias o: its payload column, or with envelope fields a
 *                      json object {"payload": <payload>, <field>: <column>, ...} (a NULL
 *                      payload in it as null); with m->tombstone_on_empty NULL, a tombstone,
 *                      for a NULL payload and a text one of white space only
 *   {o.claim_payload}  what a claim takes of row alias o's payload: the column as stored (no
 *                      conversion), NULL for a tombstone as in {o.payload}; never the envelope
 *   {o.envelope_columns} ", o.<column>" for each envelope field, as stored ("" without any):
 *                      a claim's last columns, named {envelope_names} (", envelope_1", ...)
 *   {r.envelope_bytes} " + coalesce(pg_column_size(r.envelope_N), 0)" for each: their stored
 *                      sizes, for the budget's first cut
 *   {p.payload_text}   the text form of column payload of alias p (a claim's inner query): its
 *                      ::text, or with a binary payload its bytes as hex (batch.c decodes them),
 *                      or with envelope fields the envelope's text built from p.payload and
 *                      p.envelope_N (NULL for a tombstone with m->tombstone_on_empty)
 *   {o.timestamp_ms}   the timestamp column in ms since the epoch as text, or NULL::text
 *   {o.partition}      the partition column as text, or NULL::text
 *   {payload_text}     the payload column's name as an SQL literal (check's look at its type)
 *   {unsent_idx} {retry_idx} {sent_idx} {seq_idx}  the relay's index names, quoted
 * Returns a malloc'd string, or NULL with one line in err (an unknown placeholder is a bug). */
char *table_sql(const TableMap *m, PGconn *conn, const char *tmpl, char *err, size_t errlen);

/* Expands n templates into out[0..n-1] (each to be freed); all or nothing. */
bool table_sql_all(const TableMap *m, PGconn *conn, const char *const *tmpls, char **out, int n,
                   char *err, size_t errlen) __attribute__((warn_unused_result));

#endif
