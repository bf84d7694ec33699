#include "status.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "db.h"
#include "log.h"
#include "migrate.h"
#include "schema.h"
#include "statements.h"

static long long int_at(PGresult *res, int row, int col)
{
    return strtoll(PQgetvalue(res, row, col), NULL, 10);
}

/* What session row says of its relay's Kafka (SQL_RELAYS' last column, the mark lock it holds):
 * "ok", "away" (its lanes go to the relays that reach Kafka) or "trying" (its share taken back on
 * a trial). */
static const char *kafka_state_at(PGresult *relays, int row)
{
    long long mark = int_at(relays, row, 6);
    return mark == 1 ? "away" : mark == 2 ? "trying" : "ok";
}

/* A column that may be NULL, as a JSON string or null. */
static json_t *json_text_or_null(PGresult *res, int row, int col)
{
    return PQgetisnull(res, row, col) ? json_null() : json_string(PQgetvalue(res, row, col));
}

/* Which relay a session belongs to: its application_name (the relay's is "outbox-relay
 * session-N" unless the URL sets one: set application_name per relay to tell them apart) and its
 * login role, by backend pid, in the order of relays. NULL when not readable (then "-"). SQL_RELAYS
 * is shared with the engine's owner; this is a second, read-only look at pg_stat_activity. */
/* Every pid, however many sessions: a fixed 2048-byte list held some 250 pids, and the sessions
 * past them showed "-" for their application and user with nothing said. Its size follows the
 * relays' result it is built from (8 bytes a pid), which is bounded by the member slots. */
void status_pid_array(const PGresult *relays, StrBuf *out)
{
    strbuf_array_begin(out);
    for (int i = 0; i < PQntuples(relays); i++)
        strbuf_array_int(out, strtoll(PQgetvalue(relays, i, 1), NULL, 10));
    strbuf_array_end(out);
}

static PGresult *session_owners(PGconn *conn, PGresult *relays)
{
    StrBuf pids = {0};
    status_pid_array(relays, &pids);
    const char *params[1] = {pids.s};
    DbError e;
    PGresult *res = admin_query(conn,
                                "SELECT a.application_name, a.usename::text"
                                " FROM pg_catalog.unnest($1::int[]) WITH ORDINALITY AS p(pid, n)"
                                " LEFT JOIN pg_stat_activity a ON a.pid = p.pid ORDER BY p.n",
                                1, params, &e);
    strbuf_free(&pids);
    if (!res)
        log_debug("cannot read the sessions' application names", "error=%s", db_error_text(&e));
    return res;
}

/* Row i's column col of owners, or NULL when unknown. */
static const char *owner_at(PGresult *owners, int i, int col)
{
    return owners && i < PQntuples(owners) && !PQgetisnull(owners, i, col)
               ? PQgetvalue(owners, i, col)
               : NULL;
}

/* What schema_migrations says of this binary (migrate_unknown): how many migrations a newer
 * outbox-relay recorded that this one does not know (0: none), the latest of them in newest;
 * -1 when it cannot be read (the relay's role has no grant on it: status is then silent about
 * it, as check is). */
typedef struct SchemaLook {
    int unknown;
    char newest[200];
} SchemaLook;

/* Why: migrate refuses such a database (exit 2) and check fails it, but status, which an
 * operator runs to see why relays misbehave after a rollback, said nothing of it. */
static void schema_look(PGconn *conn, SchemaLook *look)
{
    DbError e;
    look->newest[0] = '\0';
    look->unknown = migrate_unknown(conn, admin_answer_s(), look->newest, sizeof(look->newest), &e);
    if (look->unknown < 0)
        log_debug("cannot read schema_migrations", "error=%s", db_error_text(&e));
}

/* False (an error logged) when the object cannot be built: a text that is not UTF-8 (a role
 * name in a SQL_ASCII database may hold any bytes). relays NULL: a standby, sessions null. */
/* The lane-group squatters (admin_lane_squatters' columns) as a JSON list; null on a standby. */
static json_t *squatters_json(PGresult *squat, bool *whole)
{
    if (!squat)
        return json_null();
    json_t *list = json_array();
    for (int i = 0; i < PQntuples(squat); i++) {
        /* A prepared transaction: no pid, its gid and age instead (null for a session). */
        json_t *one = json_pack(
            "{s:o, s:s, s:I, s:I, s:o, s:o, s:o, s:o, s:o}", "pid",
            PQgetisnull(squat, i, 0) ? json_null() : json_integer(int_at(squat, i, 0)), "what",
            PQgetvalue(squat, i, 1), "lanes", (json_int_t)int_at(squat, i, 2), "slots",
            (json_int_t)int_at(squat, i, 3), "user", json_text_or_null(squat, i, 4),
            "application_name", json_text_or_null(squat, i, 5), "client_addr",
            json_text_or_null(squat, i, 6), "gid", json_text_or_null(squat, i, 7), "age_seconds",
            PQgetisnull(squat, i, 8) ? json_null() : json_integer(int_at(squat, i, 8)));
        *whole = *whole && one != NULL;
        json_array_append_new(list, one);
    }
    return list;
}

static bool print_json(PGresult *backlog, long long sent_minute, const SchemaLook *schema,
                       PGresult *relays, PGresult *owners, PGresult *squat)
{
    json_t *list = relays ? json_array() : json_null();
    bool whole = true; /* json_array_append_new takes a NULL silently: the session would vanish */
    for (int i = 0; relays && i < PQntuples(relays); i++) {
        const char *app = owner_at(owners, i, 0), *user = owner_at(owners, i, 1);
        json_t *session = json_pack(
            "{s:I, s:I, s:I, s:s, s:o, s:o, s:o, s:o, s:o}", "slot",
            (json_int_t)int_at(relays, i, 0), "pid", (json_int_t)int_at(relays, i, 1), "lanes",
            (json_int_t)int_at(relays, i, 2), "kafka", kafka_state_at(relays, i), "client_addr",
            json_text_or_null(relays, i, 3), "client_port",
            PQgetisnull(relays, i, 4) ? json_null() : json_integer(int_at(relays, i, 4)),
            "backend_start", json_text_or_null(relays, i, 5), "application_name",
            app ? json_string(app) : json_null(), "user", user ? json_string(user) : json_null());
        whole = whole && session != NULL;
        json_array_append_new(list, session);
    }
    json_t *squatters = squatters_json(squat, &whole);
    json_t *o = json_pack(
        "{s:I, s:I, s:o, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o}", "backlog",
        (json_int_t)int_at(backlog, 0, BACKLOG_UNSENT), "retrying",
        (json_int_t)int_at(backlog, 0, BACKLOG_RETRYING), "oldest_unsent_age_seconds",
        PQgetisnull(backlog, 0, BACKLOG_OLDEST_AGE_S)
            ? json_null()
            : json_real(atof(PQgetvalue(backlog, 0, BACKLOG_OLDEST_AGE_S))),
        "dead_lettered", (json_int_t)int_at(backlog, 0, BACKLOG_DEAD), "dead_letter_failed",
        (json_int_t)int_at(backlog, 0, BACKLOG_DEAD_LETTER_FAILED), "sent_last_minute",
        sent_minute < 0 ? json_null() : json_integer(sent_minute), "throughput_per_second",
        sent_minute < 0 ? json_null() : json_real((double)sent_minute / 60.0), "unknown_migrations",
        schema->unknown < 0 ? json_null() : json_integer(schema->unknown),
        "newest_unknown_migration", schema->unknown > 0 ? json_string(schema->newest) : json_null(),
        "sessions", list, "lane_squatters", squatters);
    char *text = o && whole ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
    bool printed = text != NULL;
    if (printed)
        puts(text);
    else
        log_error("cannot print the status as JSON: a session's text is not UTF-8", NULL);
    free(text);
    json_decref(o);
    return printed;
}

/* Said only when some are: each stalls the aggregates of the lanes it holds, or keeps a relay
 * that cannot reach Kafka from marking itself away (docs/guarantees.md), and only a relay with
 * --metrics-listen said so before. Escaped as the sessions' names. */
static void print_squatters(PGresult *squat)
{
    int n = squat ? PQntuples(squat) : 0;
    if (n == 0)
        return;
    printf("lane squatters: %d session%s that %s not a relay hold%s the lane group's locks, and "
           "the relays are not ready (`outbox-relay check` says what each stalls)\n",
           n, n == 1 ? "" : "s", n == 1 ? "is" : "are", n == 1 ? "s" : "");
    printf("  %-8s %-20s %-6s %-6s %-24s %-28s %s\n", "PID", "WHAT", "LANES", "SLOTS", "CLIENT",
           "APPLICATION", "USER");
    for (int i = 0; i < n; i++) {
        char app_text[200], user_text[200], gid_text[1300], who[1310];
        /* A prepared transaction has no pid: named by its gid (escaped: any text). */
        if (PQgetisnull(squat, i, 0))
            snprintf(who, sizeof(who), "gid:%s",
                     log_escape(PQgetvalue(squat, i, 7), gid_text, sizeof(gid_text)));
        else
            snprintf(who, sizeof(who), "%s", PQgetvalue(squat, i, 0));
        printf("  %-8s %-20s %-6s %-6s %-24s %-28s %s\n", who, PQgetvalue(squat, i, 1),
               PQgetvalue(squat, i, 2), PQgetvalue(squat, i, 3),
               PQgetisnull(squat, i, 6) ? "-" : PQgetvalue(squat, i, 6),
               PQgetisnull(squat, i, 5) || !*PQgetvalue(squat, i, 5)
                   ? "-"
                   : log_escape(PQgetvalue(squat, i, 5), app_text, sizeof(app_text)),
               PQgetisnull(squat, i, 4)
                   ? "-"
                   : log_escape(PQgetvalue(squat, i, 4), user_text, sizeof(user_text)));
    }
}

static void print_text(PGresult *backlog, long long sent_minute, const SchemaLook *schema,
                       PGresult *relays, PGresult *owners, PGresult *squat)
{
    printf("backlog:        %lld unsent events (%lld waiting for a retry)\n",
           int_at(backlog, 0, BACKLOG_UNSENT), int_at(backlog, 0, BACKLOG_RETRYING));
    if (PQgetisnull(backlog, 0, BACKLOG_OLDEST_AGE_S))
        printf("oldest unsent:  -\n");
    else
        printf("oldest unsent:  %.1f s\n", atof(PQgetvalue(backlog, 0, BACKLOG_OLDEST_AGE_S)));
    long long dead_letter_failed = int_at(backlog, 0, BACKLOG_DEAD_LETTER_FAILED);
    if (dead_letter_failed > 0) /* why is in the relay's log only: the row keeps why it died */
        printf("dead-lettered:  %lld (%lld whose copy to the dead-letter topic failed or went "
               "unrecorded, retried, or parked as too large for it even without the payload; the "
               "relays' log says why)\n",
               int_at(backlog, 0, BACKLOG_DEAD), dead_letter_failed);
    else
        printf("dead-lettered:  %lld\n", int_at(backlog, 0, BACKLOG_DEAD));
    if (sent_minute < 0)
        printf("throughput:     - (--on-sent delete keeps no sent rows to count; see /metrics)\n");
    else
        printf("throughput:     %.1f events/s (%lld sent in the last 60 s)\n",
               (double)sent_minute / 60.0, sent_minute);
    if (schema->unknown > 0) {
        char newest[200];
        printf("schema:         migrated by a newer outbox-relay (%d migration(s) this binary does "
               "not know, the latest %s; it knows up to %s): its relays may mis-handle rows of "
               "that schema\n",
               schema->unknown, log_escape(schema->newest, newest, sizeof(newest)),
               migration_files[migration_count - 1].name);
    }
    if (!relays) {
        printf("relay sessions: - (a standby: the relays' sessions and their locks are on the "
               "primary)\n");
        return;
    }
    int n = PQntuples(relays), away = 0, trying = 0;
    long long lanes = 0;
    for (int i = 0; i < n; i++) {
        lanes += int_at(relays, i, 2);
        away += strcmp(kafka_state_at(relays, i), "away") == 0;
        trying += strcmp(kafka_state_at(relays, i), "trying") == 0;
    }
    printf("relay sessions: %d active, owning %lld of %d lanes", n, lanes, LANE_COUNT);
    /* Said only when some are: their relays' deliveries time out (docs/guarantees.md). */
    if (away || trying)
        printf("; %d away from kafka, %d trying it again", away, trying);
    printf("\n");
    if (n == 0) {
        print_squatters(squat);
        return;
    }
    printf("  %-6s %-8s %-6s %-7s %-24s %-20s %-28s %s\n", "SLOT", "PID", "LANES", "KAFKA",
           "CLIENT", "CONNECTED SINCE", "APPLICATION", "USER");
    for (int i = 0; i < n; i++) {
        char client[96] = "-";
        if (!PQgetisnull(relays, i, 3))
            snprintf(client, sizeof(client), "%s%s%s", PQgetvalue(relays, i, 3),
                     PQgetisnull(relays, i, 4) ? "" : ":", PQgetvalue(relays, i, 4));
        const char *app = owner_at(owners, i, 0), *user = owner_at(owners, i, 1);
        /* Escaped as in the log: a role name may hold ESC or an OSC sequence (whoever may
         * create roles chooses it), and any session may hold a member slot. */
        char app_text[200], user_text[200];
        printf("  %-6s %-8s %-6s %-7s %-24s %-20s %-28s %s\n", PQgetvalue(relays, i, 0),
               PQgetvalue(relays, i, 1), PQgetvalue(relays, i, 2), kafka_state_at(relays, i),
               client, PQgetisnull(relays, i, 5) ? "-" : PQgetvalue(relays, i, 5),
               app && *app ? log_escape(app, app_text, sizeof(app_text)) : "-",
               user ? log_escape(user, user_text, sizeof(user_text)) : "-");
    }
    print_squatters(squat);
}

int status_run(const Config *cfg)
{
    admin_set_statement_timeout(cfg->statement_timeout_s);
    PGconn *conn = admin_connect(cfg->database_url);
    if (!conn)
        return admin_connect_exit_code();
    int rc = 1;
    PGresult *backlog = admin_exec(conn, &cfg->map, SQL_BACKLOG, 0, NULL, PGRES_TUPLES_OK);
    /* Throughput is counted from sent_at: rows the relay deletes leave nothing to count. */
    bool counted = cfg->on_sent == ON_SENT_MARK;
    PGresult *throughput =
        backlog && counted ? admin_exec(conn, &cfg->map, SQL_THROUGHPUT, 0, NULL, PGRES_TUPLES_OK)
                           : NULL;
    /* A standby (status may read one) has none of the relays' sessions: they, and the advisory
     * locks SQL_RELAYS reads, are on the primary, and its pg_locks said "0 active", as if no
     * relay ran. */
    DbError e;
    PGresult *recovery =
        backlog && (throughput || !counted)
            ? admin_query(conn, "SELECT pg_catalog.pg_is_in_recovery()", 0, NULL, &e)
            : NULL;
    if (backlog && (throughput || !counted) && !recovery) {
        char q[600];
        log_error("query failed", "error=%s", log_quote(e.message, q, sizeof(q)));
    }
    bool standby = recovery && strcmp(PQgetvalue(recovery, 0, 0), "t") == 0;
    PGresult *relays = recovery && !standby
                           ? admin_exec(conn, &cfg->map, SQL_RELAYS, 0, NULL, PGRES_TUPLES_OK)
                           : NULL;
    /* On a standby there are none to see: the locks are the primary's, as the sessions are. */
    PGresult *squat = relays ? admin_lane_squatters(conn, &cfg->map, &e) : NULL;
    if (relays && !squat) {
        char q[600];
        log_error("query failed", "error=%s", log_quote(e.message, q, sizeof(q)));
    }
    if (squat || standby) {
        long long sent_minute = counted ? int_at(throughput, 0, 0) : -1; /* -1: not counted */
        PGresult *owners = relays ? session_owners(conn, relays) : NULL;
        SchemaLook schema;
        schema_look(conn, &schema);
        rc = 0;
        if (cfg->json)
            rc = print_json(backlog, sent_minute, &schema, relays, owners, squat) ? 0 : 1;
        else
            print_text(backlog, sent_minute, &schema, relays, owners, squat);
        PQclear(owners);
    }
    PQclear(backlog);
    PQclear(throughput);
    PQclear(relays);
    PQclear(squat);
    PQclear(recovery);
    PQfinish(conn);
    return rc;
}
