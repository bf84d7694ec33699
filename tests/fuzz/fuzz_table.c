/* fuzz_table: the table and column mapping (relay/outbox/table.c) — --table, the column options
 * and --additional-fields, from configuration — and the SQL written with it.
 *
 * Input: FLAGS_BYTE TABLE \0 SEQ \0 EVENT_ID \0 AGGREGATE_TYPE \0 AGGREGATE_ID \0 EVENT_TYPE \0
 * PAYLOAD \0 HEADERS \0 ADDITIONAL_FIELDS (an empty part: the option is not set). FLAGS_BYTE: bit 0
 * the Debezium layout, bit 1 --tombstone-on-empty-payload, bit 2 --payload-format binary, bit 3
 * --message-format cloudevents (which reserves more header names). Every mapping
 * that is accepted is expanded into a statement using every placeholder (and no ';' of its
 * own), which must not let a name out of its quotes: no ';' outside a quoted identifier or
 * literal. */
#include <libpq-fe.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "table.h"

static PGconn *conn; /* never connected: only for libpq's quoting (its encoding rules) */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_ERROR + 1);
    /* An invalid port fails before any network activity and leaves a usable PGconn. */
    conn = PQconnectStart("port=not-a-port");
    if (!conn)
        abort();
    return 0;
}

/* True when every ';' of sql is inside "..." or '...' (E'...' with backslash escapes). */
static bool semicolons_quoted(const char *sql)
{
    char in = 0;
    bool e_string = false;
    for (const char *p = sql; *p; p++) {
        if (!in) {
            if (*p == ';')
                return false;
            if (*p == '"' || *p == '\'') {
                in = *p;
                e_string = *p == '\'' && p > sql && (p[-1] == 'E' || p[-1] == 'e');
            }
        } else if (in == '\'' && e_string && *p == '\\' && p[1]) {
            p++;
        } else if (*p == in) {
            if (p[1] == in)
                p++; /* doubled: an escaped quote */
            else
                in = 0;
        }
    }
    return in == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *buf = malloc(size + 10);
    memcpy(buf, data + 1, size - 1);
    memset(buf + size - 1, 0, 11);
    const char *part[9];
    const char *p = buf;
    for (int i = 0; i < 9; i++) {
        part[i] = *p ? p : NULL;
        p += strlen(p) + 1;
        if (p > buf + size)
            p = buf + size; /* past the input: the zeroed tail, empty parts */
    }
    TableOptions o = {.layout = data[0] & 1 ? LAYOUT_DEBEZIUM : LAYOUT_RELAY,
                      .table = part[0],
                      .seq_column = part[1],
                      .event_id_column = part[2],
                      .aggregate_type_column = part[3],
                      .aggregate_id_column = part[4],
                      .event_type_column = part[5],
                      .payload_column = part[6],
                      .headers_column = part[7],
                      .additional_fields = part[8],
                      .tombstone_on_empty = (data[0] & 2) != 0,
                      .payload_binary = (data[0] & 4) != 0,
                      .cloudevents = (data[0] & 8) != 0};
    TableMap m;
    char err[512], shown[256];
    if (table_map_init(&m, &o, err, sizeof(err))) {
        (void)table_map_display(&m, shown, sizeof(shown));
        (void)table_map_is_own(&m, "public");
        char *sql = table_sql(
            &m, conn,
            "SELECT o.{seq}, o.{event_id}, o.{aggregate_type}, o.{aggregate_id}, "
            "o.{event_type}, o.{payload}, {o.payload}, {o.headers}, {o.extra_headers}, "
            "{o.claim_payload}{o.envelope_columns}, {p.payload_text}, 0{r.envelope_bytes}, "
            "{o.claim_headers}{o.extra_header_columns}, {p.headers_text}, "
            "{p.extra_headers_text}, 0{r.extra_header_bytes}{extra_header_names} FROM "
            "{table} o {unsent_idx} {retry_idx} {seq_idx} {sent_idx}",
            err, sizeof(err));
        if (sql) {
            /* The template has no ';' of its own: any outside quotes came from a name. */
            if (!semicolons_quoted(sql))
                abort();
            free(sql);
        }
    }
    table_map_free(&m);
    free(buf);
    return 0;
}
