#include "check.h"

#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "db.h"
#include "diagnose.h"
#include "grants.h"
#include "kafka.h"
#include "log.h"
#include "migrate.h"
#include "schema.h"
#include "secrets.h"
#include "serializer.h"
#include "table.h"

typedef struct Checks {
    int problems;
    /* PostgreSQL stopped answering (admin_query gave a statement up): the connection is still
     * mid-statement, and nothing more may be sent on it (each later statement would fail, and
     * say so, on a connection that is gone). */
    bool pg_gone;
} Checks;

/* One line of a check under its tag ("ok", "warn" or "FAIL"); a FAIL counts as a problem. */
static void say_line(Checks *c, const char *tag, const char *area, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
static void say_line(Checks *c, const char *tag, const char *area, const char *fmt, va_list ap)
{
    char text[1024];
    vsnprintf(text, sizeof(text), fmt, ap);
    /* As every line the program writes: the text quotes servers, files and the configuration
     * (a password repeated elsewhere in a URL, libpq's and librdkafka's errors). */
    secrets_scrub(text);
    log_one_line(text);
    printf("%-5s %s: %s\n", tag, area, text);
    if (strcmp(tag, "FAIL") == 0)
        c->problems++;
    fflush(stdout);
}

/* One line per check: "ok    AREA: text" or "FAIL  AREA: text". */
static void say(Checks *c, bool good, const char *area, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void say(Checks *c, bool good, const char *area, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say_line(c, good ? "ok" : "FAIL", area, fmt, ap);
    va_end(ap);
}

/* "warn  AREA: text": what `run` starts with, logging a warning, and is no problem (exit 0). */
static void say_warn(Checks *c, const char *area, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say_warn(Checks *c, const char *area, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say_line(c, "warn", area, fmt, ap);
    va_end(ap);
}

/* Runs a table template with text params; NULL (and a FAIL line) on failure. */
static PGresult *query(Checks *c, PGconn *conn, const TableMap *map, const char *area,
                       const char *tmpl, int n, const char *const *params)
{
    char err[256];
    char *sql = table_sql(map, conn, tmpl, err, sizeof(err));
    if (!sql) {
        say(c, false, area, "cannot write the query: %s", err);
        return NULL;
    }
    DbError e;
    PGresult *res = admin_query(conn, sql, n, params, &e);
    free(sql);
    if (!res) {
        say(c, false, area, "the check's query failed: %s", db_error_text(&e));
        c->pg_gone = c->pg_gone || e.conn_lost;
    }
    return res;
}

static void check_session(Checks *c, PGconn *conn)
{
    DbError e;
    PGresult *res = admin_query(
        conn,
        "SELECT current_user, pg_catalog.current_database(), pg_catalog.current_setting("
        "'server_version'), coalesce(pg_catalog.host(pg_catalog.inet_server_addr()), 'local "
        "socket'), pg_catalog.current_setting('port')",
        0, NULL, &e);
    if (res)
        say(c, true, "postgresql",
            "connected to %s port %s, database %s, as role %s (PostgreSQL %s)",
            PQgetvalue(res, 0, 3), PQgetvalue(res, 0, 4), PQgetvalue(res, 0, 1),
            PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 2));
    else
        say(c, false, "postgresql", "connected, but cannot query: %s", db_error_text(&e));
    c->pg_gone = c->pg_gone || (!res && e.conn_lost);
    PQclear(res);
}

/* Whether a newer outbox-relay migrated the database (migrate_unknown): this binary's relays may
 * mis-handle rows of a schema they were not written for, and `migrate` refuses it (exit 2), so
 * check says it too. Silent when schema_migrations cannot be read: the relay's role, which
 * check usually runs as, has no grant on it (migrate runs as the owner). With
 * --allow-newer-schema (a rollback to this version, as migrate's) a warn line, no problem. */
static void check_migrations(Checks *c, PGconn *conn, bool allow_newer)
{
    char newest[200];
    DbError e;
    int unknown = migrate_unknown(conn, admin_answer_s(), newest, sizeof(newest), &e);
    c->pg_gone = c->pg_gone || (unknown < 0 && e.conn_lost);
    if (unknown > 0 && allow_newer)
        say_warn(c, "migrations",
                 "the database was migrated by a newer outbox-relay (%d migration(s) this binary "
                 "does not know, the latest %s; it knows up to %s), allowed by "
                 "--allow-newer-schema",
                 unknown, newest, migration_files[migration_count - 1].name);
    else if (unknown > 0)
        say(c, false, "migrations",
            "the database was migrated by a newer outbox-relay (%d migration(s) this binary does "
            "not know, the latest %s; it knows up to %s), whose rows this relay may mis-handle: "
            "run that version, or, to run this one on it anyway (a rollback), "
            "--allow-newer-schema",
            unknown, newest, migration_files[migration_count - 1].name);
}

/* The table and each column the claims, marks and bookkeeping use. False when the table is
 * missing (nothing else about it can be checked). */
static bool check_table(Checks *c, PGconn *conn, const TableMap *map)
{
    char name[160];
    table_map_display(map, name, sizeof(name));
    PGresult *res = query(c, conn, map, "table",
                          "SELECT pg_catalog.to_regclass({table_text}) IS NOT NULL", 0, NULL);
    if (!res)
        return false;
    bool exists = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    if (!exists) {
        say(c, false, "table",
            "the outbox table %s does not exist, or this role may not see it (no USAGE on its "
            "schema): create it with `outbox-relay migrate` as the database owner (with the same "
            "--table and column options for a table of your own)",
            name);
        return false;
    }
    const char *columns[32 + 8];
    size_t n = 0;
    columns[n++] = map->seq;
    columns[n++] = map->event_id;
    columns[n++] = map->aggregate_type;
    columns[n++] = map->aggregate_id;
    columns[n++] = map->event_type;
    columns[n++] = map->payload;
    if (map->headers)
        columns[n++] = map->headers;
#define BOOKKEEPING(col, definition) columns[n++] = col;
    SCHEMA_BOOKKEEPING_COLUMNS(BOOKKEEPING)
#undef BOOKKEEPING
    columns[n++] = "lane";
    char missing[512] = "";
    for (size_t i = 0; i < n + map->n_extra; i++) {
        const char *col = i < n ? columns[i] : map->extra[i - n].column;
        const char *params[1] = {col};
        res = query(c, conn, map, "table",
                    "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid ="
                    " pg_catalog.to_regclass({table_text})::oid AND attname = $1 AND attnum > 0"
                    " AND NOT attisdropped)",
                    1, params);
        if (!res)
            return !c->pg_gone;
        if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
            snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), "%s%s",
                     *missing ? ", " : "", col);
        PQclear(res);
    }
    if (*missing)
        say(c, false, "table",
            "%s lacks column(s) %s: check the column options, or run `outbox-relay migrate` as "
            "the owner (it adds the relay's own columns to a table it adopts)",
            name, missing);
    else
        say(c, true, "table", "%s has every column the relay reads and writes", name);
    return true;
}

/* What each index the relay wants is for, by migrate_index_served_sql's k. */
static const char *index_use(const char *k)
{
    switch (atoi(k)) {
    case 1:
        return "the order column's uniqueness (rows are marked by it: a duplicate would be "
               "marked sent with its twin)";
    case 2:
        return "the claims (the unsent rows in order: without it each claim reads the table)";
    case 3:
        return "the claims' look for earlier failed events of an aggregate";
    default:
        return "retention and verify (the sent rows by time)";
    }
}

/* The indexes the relay wants on the table, by what they are (migrate.h): each one no valid
 * index of the table serves, whatever its name, is named with what it is for and the statement
 * that makes it. Judged by name alone, a missing one went unreported (the relay's own table
 * has its primary key where an adopted one has the order column's unique index, so a name
 * missing proved nothing), and one of the relay's names with another definition (REINDEX
 * cannot make one, but a DROP and CREATE of another definition can: DESC, another collation or
 * operator class, another predicate) was reported even beside another index that serves. */
static void check_indexes(Checks *c, PGconn *conn, const TableMap *map)
{
    PGresult *res = query(c, conn, map, "indexes", migrate_index_served_sql, 0, NULL);
    if (!res)
        return;
    char name[160], table[DIAGNOSE_TABLE_MAX], index[DIAGNOSE_IDENT_MAX];
    table_map_display(map, name, sizeof(name));
    diagnose_quote_table(map, NULL, table, sizeof(table));
    for (int i = 0; i < PQntuples(res); i++) {
        const char *idx = PQgetvalue(res, i, 0);
        /* want: "UNIQUE (id)" or "(id) WHERE sent_at IS NULL"... (migrate.c) */
        const char *want = PQgetvalue(res, i, 1);
        bool unique = strncmp(want, "UNIQUE ", 7) == 0;
        bool named = strcmp(PQgetvalue(res, i, 2), "t") == 0;
        char create[1024];
        snprintf(create, sizeof(create), "CREATE %sINDEX CONCURRENTLY %s ON %s %s",
                 unique ? "UNIQUE " : "", diagnose_quote_ident(idx, index, sizeof(index)), table,
                 unique ? want + 7 : want);
        if (named)
            say(c, false, "indexes",
                "index %s of %s is not as the relay makes it, and no other index serves %s: as "
                "the owner, drop it (DROP INDEX CONCURRENTLY) and create it again without "
                "blocking writers: %s",
                idx, name, index_use(PQgetvalue(res, i, 3)), create);
        else
            say(c, false, "indexes",
                "%s has no index for %s: as the owner, create it without blocking writers: %s",
                name, index_use(PQgetvalue(res, i, 3)), create);
    }
    if (PQntuples(res) == 0)
        say(c, true, "indexes", "%s has every index the relay uses, as it makes them", name);
    PQclear(res);
}

/* The payload column's type against --payload-format: binary wants bytea, and text a column
 * that is not (its hex text would go out instead of its bytes). */
static void check_payload_type(Checks *c, PGconn *conn, const TableMap *map)
{
    PGresult *res = query(c, conn, map, "payload",
                          "SELECT pg_catalog.format_type(atttypid, atttypmod) FROM pg_attribute"
                          " WHERE attrelid = pg_catalog.to_regclass({table_text})::oid"
                          " AND attname = {payload_text} AND attnum > 0 AND NOT attisdropped",
                          0, NULL);
    if (!res)
        return;
    if (PQntuples(res) == 1) {
        const char *type = PQgetvalue(res, 0, 0);
        bool bytea = strcmp(type, "bytea") == 0;
        if (bytea == map->payload_binary)
            say(c, true, "payload", "column %s is %s: published %s", map->payload, type,
                bytea ? "byte for byte" : "as its text");
        else
            say(c, false, "payload", "column %s is %s: %s", map->payload, type,
                bytea ? "set --payload-format binary, or its hex text is published"
                      : "--payload-format binary needs a bytea column");
    }
    PQclear(res);
}

/* With --value-format avro or json-schema: the Schema Registry answers and takes the
 * credentials (registry_probe, bounded by --schema-registry-timeout). */
static void check_registry(Checks *c, const Config *cfg)
{
    if (cfg->value_format == VALUE_JSON)
        return;
    char err[512];
    /* the environment's LIBEV_FLAGS ignored, as by run's loop (main.c's default_loop) */
    Serializer *ser = serializer_new(ev_default_loop(EVFLAG_AUTO | EVFLAG_NOENV), cfg, NULL, NULL,
                                     err, sizeof(err));
    if (!ser) {
        say(c, false, "schema registry", "%s", err);
        return;
    }
    char warned[512];
    if (!serializer_probe(ser, warned, sizeof(warned), err, sizeof(err)))
        say(c, false, "schema registry", "%s", err);
    else if (strncmp(warned, "HTTP 404", 8) == 0) /* an answer, but no registry's */
        say(c, false, "schema registry", "answers, but not as a Schema Registry: %s", warned);
    else if (strncmp(warned, "HTTP 403", 8) == 0) /* credentials taken, listing refused */
        say_warn(c, "schema registry", "answers and takes the credentials, but %s", warned);
    else if (strncmp(warned, "passed over", 11) == 0) /* a later URL answered */
        say_warn(c, "schema registry", "answers and takes the credentials, but a URL was %s",
                 warned);
    else if (*warned)
        say(c, false, "schema registry", "does not answer: %s", warned);
    else
        say(c, true, "schema registry", "answers and takes the credentials");
    serializer_free(ser);
}

static void on_missing(const char *what, const char *grant, bool migrate_grants,
                       const char *nonmember, void *arg)
{
    Checks *c = arg;
    /* migrate gives DELETE only with a role's first grants (a REVOKE DELETE stays revoked):
     * running it again would not help, only the GRANT does. What it grants goes to outbox_relay:
     * for a role that is not a member, running it again would not help either, membership does. */
    if (nonmember && migrate_grants)
        say(c, false, "privileges",
            "this role lacks %s: as the owner, %s (or make it a member of outbox_relay, to which "
            "`outbox-relay migrate` grants it: GRANT outbox_relay TO %s)",
            what, *grant ? grant : "grant it", nonmember);
    else
        say(c, false, "privileges", "this role lacks %s: as the owner, %s%s", what,
            *grant ? grant : "grant it",
            nonmember        ? ""
            : migrate_grants ? " (or run `outbox-relay migrate` again, which grants it to "
                               "outbox_relay)"
                             : " (`outbox-relay migrate` does not give it back once revoked)");
}

static void check_floor(Checks *c, PGconn *conn, const Config *cfg)
{
    if (!cfg->claim_floor) {
        say(c, true, "claim floor", "off (--claim-floor off)");
        return;
    }
    PGresult *res = query(c, conn, &cfg->map, "claim floor", diagnose_floor_sql, 0, NULL);
    if (!res)
        return;
    char why[1024];
    if (diagnose_floor(res, &cfg->map, why, sizeof(why)))
        say(c, true, "claim floor",
            "the order column %s is drawn in order from a sequence this role may read",
            cfg->map.seq);
    else
        say(c, false, "claim floor", "claims would read the unsent index from its start: %s", why);
    PQclear(res);
}

/* The relay's triggers on the table, as migrate installs them: outbox_wakeup and
 * outbox_floor_visible enabled ALWAYS (0011_triggers_always.sql), so they fire also in sessions
 * with session_replication_role = replica (loaders), and the wakeup's row-level twin
 * outbox_wakeup_replica enabled REPLICA (0012_wakeup_replica_rows.sql), for logical replication's
 * apply workers, which fire row triggers only, and only there, so ordinary producers do not run
 * it row by row. One row per trigger: its name, the state wanted, its tgenabled ('' when
 * missing) and the statement that puts it right, names quoted and qualified by the server (the
 * owner runs it in psql, with a search_path of their own). Missing: the relay's install function
 * in --schema (pinned first on check's search_path) installs it as migrate does (the wakeup's
 * installs both of its triggers), unless that function predates the trigger (its body does not
 * name it: a database behind this binary's migrations, the twin before 0012), when only
 * `migrate` puts it in; otherwise ALTER TABLE. Reads catalogs only, which every role
 * may. */
static const char *const SQL_TRIGGERS =
    "SELECT w.name, w.want, coalesce(t.tgenabled::pg_catalog.text, ''), CASE"
    " WHEN t.tgenabled IS NOT NULL THEN pg_catalog.format('ALTER TABLE %I.%I ENABLE %s TRIGGER"
    " %I', n.nspname, c.relname, CASE w.want WHEN 'A' THEN 'ALWAYS' ELSE 'REPLICA' END, w.name)"
    " WHEN pg_catalog.strpos(coalesce(CASE WHEN w.k < 3 THEN f.wakeup_src ELSE f.floor_src END,"
    " ''), w.name) = 0 THEN 'run `outbox-relay migrate` (the database''s install function"
    " predates the trigger: a migration is pending)'"
    " WHEN w.k < 3 THEN pg_catalog.format('SELECT %s.outbox_wakeup_install(%L)', f.schema,"
    " pg_catalog.format('%I.%I', n.nspname, c.relname))"
    " ELSE pg_catalog.format('SELECT %s.outbox_floor_install(%L, %L, %L, %L)', f.schema,"
    " pg_catalog.format('%I.%I', n.nspname, c.relname), {seq_text}, {aggregate_type_text},"
    " {aggregate_id_text}) END"
    " FROM (VALUES (1, 'outbox_wakeup'::pg_catalog.text, 'A'::pg_catalog.text),"
    " (2, 'outbox_wakeup_replica', 'R'), (3, 'outbox_floor_visible', 'A')) AS w(k, name, want)"
    " JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass({table_text})::pg_catalog.oid"
    " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " CROSS JOIN (SELECT coalesce((SELECT pg_catalog.quote_ident(s.nspname) FROM"
    " pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace s ON s.oid = p.pronamespace WHERE p.oid ="
    " pg_catalog.to_regprocedure('outbox_wakeup_install(pg_catalog.regclass)')::pg_catalog.oid),"
    " pg_catalog.quote_ident(pg_catalog.current_schema())) AS schema,"
    " (SELECT p.prosrc FROM pg_catalog.pg_proc p WHERE p.oid = pg_catalog.to_regprocedure("
    "'outbox_wakeup_install(pg_catalog.regclass)')::pg_catalog.oid) AS wakeup_src,"
    " (SELECT p.prosrc FROM pg_catalog.pg_proc p WHERE p.oid = pg_catalog.to_regprocedure("
    "'outbox_floor_install(pg_catalog.regclass, pg_catalog.name, pg_catalog.name,"
    " pg_catalog.name)')::pg_catalog.oid) AS floor_src) f"
    " LEFT JOIN pg_catalog.pg_trigger t ON t.tgrelid = c.oid AND t.tgname = w.name::pg_catalog.name"
    " ORDER BY w.k";

/* How a trigger in state (tgenabled, "" when missing) differs from the state wanted ("A" or
 * "R"), in words; NULL when it is as wanted. */
static const char *trigger_state_text(const char *state, const char *want)
{
    if (strcmp(state, want) == 0)
        return NULL;
    if (!*state)
        return "is missing";
    if (strcmp(state, "D") == 0)
        return "is disabled: it fires in no session";
    if (strcmp(state, "O") == 0)
        return strcmp(want, "A") == 0
                   ? "is enabled the ordinary way, not ALWAYS (as ENABLE TRIGGER, and a data-only "
                     "restore's --disable-triggers, which ends with ENABLE TRIGGER ALL, leave it): "
                     "it does not fire in sessions with session_replication_role = replica "
                     "(logical replication's apply workers, loaders)"
                   : "is enabled the ordinary way, not REPLICA (as ENABLE TRIGGER, and a data-only "
                     "restore's --disable-triggers, which ends with ENABLE TRIGGER ALL, leave it): "
                     "it does not fire in logical replication's apply workers, and runs in every "
                     "other producer's insert, row by row";
    if (strcmp(state, "R") == 0)
        return "is enabled REPLICA, not ALWAYS: it fires only in sessions with "
               "session_replication_role = replica";
    return "is enabled ALWAYS, not REPLICA: it runs in every producer's insert, row by row";
}

/* A warn line for each of the relay's triggers not in the state migrate gives it. Why warn, not
 * FAIL: `run` works without them, only slower or out of order in the cases each line names. A
 * data-only restore with --disable-triggers ends with ENABLE TRIGGER ALL, which makes both ALWAYS
 * triggers and the REPLICA one ordinary triggers without a word; so does a hand's ENABLE
 * TRIGGER. */
static void check_triggers(Checks *c, PGconn *conn, const TableMap *map)
{
    PGresult *res = query(c, conn, map, "triggers", SQL_TRIGGERS, 0, NULL);
    if (!res)
        return;
    char name[160];
    table_map_display(map, name, sizeof(name));
    int bad = 0;
    for (int i = 0; i < PQntuples(res); i++) {
        const char *trigger = PQgetvalue(res, i, 0);
        const char *state = PQgetvalue(res, i, 2);
        const char *where = trigger_state_text(state, PQgetvalue(res, i, 1));
        if (!where)
            continue;
        bad++;
        /* What it costs. The wakeup's twin enabled ALWAYS still wakes relays: only a cost. */
        const char *effect =
            strcmp(trigger, "outbox_floor_visible") == 0
                ? "a sent row the updates it misses make unsent again keeps attempts 0 below the "
                  "claim floor: the later events of its aggregate are published first, and it "
                  "waits until the floor starts again"
            : strcmp(trigger, "outbox_wakeup") == 0
                ? "the inserts it misses wake no sleeping relay: their events wait for "
                  "--poll-interval"
            : strcmp(state, "A") == 0
                ? "ordinary producers pay for a trigger meant for replica sessions"
                : "the rows logical replication's apply workers insert wake no sleeping relay: "
                  "their events wait for --poll-interval";
        say_warn(c, "triggers", "trigger %s on %s %s; %s: as the owner, %s", trigger, name, where,
                 effect, PQgetvalue(res, i, 3));
    }
    if (bad == 0 && PQntuples(res) == 3)
        say(c, true, "triggers",
            "outbox_wakeup and outbox_floor_visible on %s are enabled ALWAYS, "
            "outbox_wakeup_replica REPLICA, as migrate installs them",
            name);
    PQclear(res);
}

/* librdkafka's own lines (a broker refusing connections, a property's warning) would be printed
 * between the check's lines; the one line per check says what matters, the rest is for
 * --log-level debug. */
static void on_kafka_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    char q[600];
    log_debug("librdkafka", "facility=%s message=%s", fac, log_quote(buf, q, sizeof(q)));
}

static void check_kafka(Checks *c, const Config *cfg, rd_kafka_conf_t *kconf)
{
    char errstr[512];
    rd_kafka_conf_set_log_cb(kconf, on_kafka_log);
    /* librdkafka reads the TLS files in rd_kafka_new: it is handed the files opened here without
     * waiting (kafka_conf_pin_files), as run's producers are. The paths were checked when the
     * configuration was built, but the PostgreSQL checks ran since, for up to
     * --statement-timeout each: a file swapped for a FIFO meanwhile held the check in an open
     * that waits for a writer, past every bound it promises. */
    KafkaPins pins;
    if (!kafka_conf_pin_files(kconf, &pins, errstr, sizeof(errstr))) {
        rd_kafka_conf_destroy(kconf);
        say(c, false, "kafka", "cannot create a producer: %s", errstr);
        return;
    }
    /* Only metadata is asked for: nothing is produced, no topic is created. */
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, kconf, errstr, sizeof(errstr));
    kafka_pins_text(&pins, errstr, sizeof(errstr));
    kafka_pins_close(&pins); /* read whole by rd_kafka_new, never opened again */
    if (!rk) {
        rd_kafka_conf_destroy(kconf);
        say(c, false, "kafka", "cannot create a producer: %s", errstr);
        return;
    }
    const struct rd_kafka_metadata *md = NULL;
    /* --statement-timeout bounds every wait of the command, Kafka's as PostgreSQL's: the
     * metadata wait was a fixed 10 s, so a strict operator's 2 s bound did not hold for a
     * silent broker. At most a day: fits librdkafka's int milliseconds. */
    rd_kafka_resp_err_t err =
        rd_kafka_metadata(rk, 1, NULL, &md, (int)(cfg->statement_timeout_s * 1000));
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
        say(c, true, "kafka", "%d broker(s) answered at %s (%d topics)", md->broker_cnt,
            cfg->brokers, md->topic_cnt);
    else
        say(c, false, "kafka", "no broker at %s answered within %ld s (--statement-timeout): %s",
            cfg->brokers, cfg->statement_timeout_s, rd_kafka_err2str(err));
    if (md)
        rd_kafka_metadata_destroy(md);
    rd_kafka_destroy(rk);
}

/* A prepared transaction holding the lane group's locks (row `row` of admin_lane_squatters, no
 * pid): no session to end, so the advice is ROLLBACK PREPARED of its gid (quoted as a literal: a
 * gid may hold any text). Its gid gone (ended between the reads): said so. */
static void warn_prepared(Checks *c, PGresult *res, int row)
{
    /* Escaped first (a gid may hold controls: one warn line each), then quoted as a literal. A
     * gid is up to 200 bytes, each escaped in at most 6. */
    char gid[1300], literal[2 * sizeof(gid) + 3] = "'";
    log_escape(PQgetvalue(res, row, 7), gid, sizeof(gid));
    size_t n = 1;
    for (const char *p = gid; *p; p++) {
        if (*p == '\'')
            literal[n++] = '\'';
        literal[n++] = *p;
    }
    literal[n++] = '\'';
    literal[n] = '\0';
    char owner[200];
    say_warn(c, "lanes",
             "prepared transaction %s (owner %s, prepared %s s ago) is not a relay but holds the "
             "lane group's locks (%s: %s lanes, %s member slots): the aggregates of the lanes it "
             "holds, or that relays leave to its member slots, wait until it is committed or "
             "rolled back, and relays with --metrics-listen are not ready; no session holds it "
             "(pg_terminate_backend cannot end it): find who prepared it and end it, or roll it "
             "back: ROLLBACK PREPARED %s",
             PQgetisnull(res, row, 7) ? "(ended meanwhile)" : literal,
             PQgetisnull(res, row, 4) ? "-"
                                      : log_escape(PQgetvalue(res, row, 4), owner, sizeof(owner)),
             PQgetisnull(res, row, 8) ? "-" : PQgetvalue(res, row, 8), PQgetvalue(res, row, 1),
             PQgetvalue(res, row, 2), PQgetvalue(res, row, 3),
             PQgetisnull(res, row, 7) ? "(none left)" : literal);
}

/* Sessions that hold the lane group's locks and cannot be relays (admin_lane_squatters, the
 * relay's own rule): a warn line for each, with what to do. Not a problem of the setup (exit 0
 * as `run` starts), but the aggregates of the lanes such a session holds wait until it ends, a
 * relay away from Kafka whose mark it holds keeps its lanes, and before, only a relay with
 * --metrics-listen said so. */
static void check_lane_squatters(Checks *c, PGconn *conn, const TableMap *map)
{
    DbError e;
    PGresult *res = admin_lane_squatters(conn, map, &e);
    if (!res && strcmp(e.sqlstate, "42501") == 0) {
        /* pg_locks revoked: the privileges line names that already, as the problem it is. */
        say_warn(c, "lanes", "cannot look for sessions that hold the lane group's locks: %s",
                 db_error_text(&e));
        return;
    }
    if (!res) {
        say(c, false, "lanes", "the check's query failed: %s", db_error_text(&e));
        c->pg_gone = c->pg_gone || e.conn_lost;
        return;
    }
    if (PQntuples(res) == 0)
        say(c, true, "lanes", "no session but relays holds the lane group's locks");
    for (int i = 0; i < PQntuples(res); i++) {
        if (PQgetisnull(res, i, 0)) {
            warn_prepared(c, res, i);
            continue;
        }
        const char *pid = PQgetvalue(res, i, 0);
        /* What it stalls: a mark lock stalls no lanes of its own (SQL_LANE_SQUATTERS). */
        const char *stalls =
            strcmp(PQgetvalue(res, i, 1), "stray-marks") == 0
                ? "a relay that cannot reach Kafka cannot mark itself away while this session "
                  "holds its mark lock, and keeps its lanes, their rows timing out"
                : "the aggregates of the lanes it holds, or that relays leave to its member "
                  "slots, wait until it ends";
        say_warn(c, "lanes",
                 "session pid %s (role %s, application %s, client %s) is not a relay but holds "
                 "the lane group's locks (%s: %s lanes, %s member slots): %s, and relays with "
                 "--metrics-listen are not ready; find who runs it and stop it, or end it: "
                 "SELECT pg_terminate_backend(%s)",
                 pid, PQgetisnull(res, i, 4) ? "-" : PQgetvalue(res, i, 4),
                 PQgetisnull(res, i, 5) || !*PQgetvalue(res, i, 5) ? "-" : PQgetvalue(res, i, 5),
                 PQgetisnull(res, i, 6) ? "-" : PQgetvalue(res, i, 6), PQgetvalue(res, i, 1),
                 PQgetvalue(res, i, 2), PQgetvalue(res, i, 3), stalls, pid);
    }
    PQclear(res);
}

int check_run(const Config *cfg, rd_kafka_conf_t *kconf)
{
    Checks c = {0};
    say(&c, true, "config", "%s%s", cfg->config_file ? cfg->config_file : "no config file",
        cfg->config_file ? " and the options given are valid" : "; the options given are valid");
    char err[300];
    admin_set_statement_timeout(cfg->statement_timeout_s);
    bool unsupported = false;
    PGconn *conn =
        db_connect_checked(cfg->database_url, "outbox-relay check", &unsupported, err, sizeof(err));
    DbError e;
    if (!conn && unsupported) {
        say(&c, false, "postgresql", "%s", err);
    } else if (!conn) {
        say(&c, false, "postgresql", "cannot connect: %s", err);
    } else if (!admin_bound_session(conn, &e)) {
        say(&c, false, "postgresql", "connected, but cannot query: %s", db_error_text(&e));
        PQfinish(conn);
    } else {
        check_session(&c, conn);
        if (!c.pg_gone)
            check_migrations(&c, conn, cfg->allow_newer_schema);
        if (!c.pg_gone && check_table(&c, conn, &cfg->map)) {
            GrantsUse use = {cfg->on_sent == ON_SENT_DELETE || cfg->retention_s > 0, false};
            bool lost = false;
            int missing = grants_check(conn, &cfg->map, use, on_missing, &c, &lost);
            c.pg_gone = c.pg_gone || lost;
            if (missing == 0)
                say(&c, true, "privileges", "this role holds every privilege the relay needs");
            else if (missing < 0)
                say(&c, false, "privileges", "the check failed (see above)");
            if (!c.pg_gone)
                check_floor(&c, conn, cfg);
            if (!c.pg_gone)
                check_triggers(&c, conn, &cfg->map);
            if (!c.pg_gone)
                check_indexes(&c, conn, &cfg->map);
            if (!c.pg_gone)
                check_payload_type(&c, conn, &cfg->map);
        }
        if (!c.pg_gone)
            check_lane_squatters(&c, conn, &cfg->map);
        PQfinish(conn);
    }
    check_kafka(&c, cfg, kconf);
    check_registry(&c, cfg);
    if (c.problems)
        printf("check: %d problem%s found\n", c.problems, c.problems == 1 ? "" : "s");
    else
        printf("check: ok, `outbox-relay run` would find what it needs\n");
    /* An old server is bad input, as for every command: no fix of grants or topics helps. */
    return unsupported ? 2 : c.problems ? 1 : 0;
}
