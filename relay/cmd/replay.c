#include "replay.h"

#include <errno.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <signal.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"
#include "db.h"
#include "log.h"
#include "route.h"
#include "statements.h"
#include "strbuf.h"
#include "table.h"

/* How long any statement waits for a lock before it gives up: a batch for a row someone else
 * holds (a retention DELETE, an operator's open UPDATE; a long wait would hold the batch's other
 * locks that long), and every statement, the dry run's included, for the table itself (a
 * migration's ALTER, a VACUUM FULL, or an ALTER queued behind a long transaction, which every
 * later reader queues behind): without it replay waits as long as they do, silently. */
#define REPLAY_LOCK_TIMEOUT "10s"
/* A batch's COMMIT may go --statement-timeout without an answer. It is a flush of the WAL, and with
 * a synchronous standby (synchronous_standby_names, synchronous_commit on or above) a round trip to
 * it: one that stops answering held the COMMIT, and replay with it, for as long as it was gone,
 * with the network fine (keepalives answered) and nothing said. The wait is not cut short on the
 * server (a cancel would commit locally without the standby, against the durability the
 * database is set for): replay gives up and says the outcome is unknown. */
/* replay_batch's answer when its COMMIT was sent and no verdict came back. */
#define REPLAY_COMMIT_UNKNOWN (-2)
/* How long each statement of a batch before its COMMIT (BEGIN, the locking SELECT, the update,
 * the NOTIFY) may go without an answer (Selection.answer_s): --statement-timeout, plus a
 * millisecond a row of --batch-rows (the update draws a value and writes a row at 6,000-16,000 rows
 * a second, docs/operations.md), plus ten times what the summary took (it reads the whole selection
 * once; a batch's SELECT, which walks the table in order from the last batch's end, reads no more
 * of it unless its plan is far worse: a sparse selection of a large table takes its time, and must
 * not be cut short). Lock waits end at REPLAY_LOCK_TIMEOUT. A server that stopped (SIGSTOP, a VM
 * paused) or a proxy that lost it acknowledges every packet and never answers, which the keepalives
 * cannot tell from a long statement: without a bound replay waited there for ever, silently, and a
 * first Ctrl-C (which waits for the batch) did nothing. The batch is then given up with its COMMIT
 * never sent: not replayed. The statements before the batches (the session's settings, the reads of
 * the order column and of the start) get --statement-timeout alone, and the summary, which reads
 * the whole selection once and so grows with the table (a selection that takes longer than
 * dead's and status's bound is no failure), REPLAY_SUMMARY_FACTOR times it: without a bound a
 * server that stopped before the first batch held replay for ever (a larger selection on a slower
 * server needs a longer --statement-timeout: its documentation says so). */
#define REPLAY_SUMMARY_FACTOR 10

/* The selection, shared by the summary and the batches. $1: the last {seq} done (exclusive; NULL:
 * none, for the summary: an id may be 0 or negative, and "> 0" never selected those),
 * $2: the highest {seq} when replay started (for the batches, the highest the summary found), $3:
 * the database's time then. Rows given new values lie above $2, and any row marked sent later
 * lies after $3: neither is replayed twice.
 * The optional filters ($4-$12) are NULL when not given; each statement is planned for its
 * values (unnamed, custom plan), so the NULL ones cost nothing. The texts are matched byte for
 * byte (COLLATE "C"), as Kafka keys and the claims tell aggregates apart: under an adopted
 * column's nondeterministic (say case-insensitive) collation, --aggregate-id l also selected the
 * events of 'L', another aggregate, and published them again. Each is also compared under the
 * column's own collation first: an index on the column is built under that collation and serves
 * that comparison alone (a "C" one alone made a replay by aggregate read the whole table), and
 * what the byte comparison keeps, the collation's equality keeps too. */
#define REPLAY_WHERE                                                                               \
    " o.sent_at IS NOT NULL AND o.sent_at <= $3::timestamptz"                                      \
    " AND ($1::bigint IS NULL OR o.{seq} > $1::bigint) AND o.{seq} <= $2::bigint"                  \
    " AND ($4::bigint IS NULL OR o.{seq} >= $4::bigint)"                                           \
    " AND ($5::bigint IS NULL OR o.{seq} <= $5::bigint)"                                           \
    " AND ($6::timestamptz IS NULL OR o.sent_at >= $6::timestamptz)"                               \
    " AND ($7::timestamptz IS NULL OR o.sent_at < $7::timestamptz)"                                \
    " AND ($8::text IS NULL OR (o.{aggregate_type}::text = $8::text"                               \
    " AND o.{aggregate_type}::text COLLATE \"C\" = $8::text))"                                     \
    " AND ($9::text IS NULL OR (o.{aggregate_id}::text = $9::text"                                 \
    " AND o.{aggregate_id}::text COLLATE \"C\" = $9::text))"                                       \
    " AND ($10::text IS NULL OR (o.{event_type}::text = $10::text"                                 \
    " AND o.{event_type}::text COLLATE \"C\" = $10::text))"                                        \
    " AND ($11::bigint[] IS NULL OR o.{seq} = ANY($11::bigint[]))"                                 \
    " AND ($12::text[] IS NULL OR (o.{event_id}::text = ANY($12::text[])"                          \
    " AND o.{event_id}::text COLLATE \"C\" = ANY($12::text[])))"
#define REPLAY_NPARAMS 12

/* Where the selection starts, read once; and the bounds that select the rest of it in a later
 * run, printed when this one stops short: the rows it replays get ids above $2 and, once sent
 * again, a sent_at after $3, so a rerun of an open-ended selection (an aggregate type, --from-id
 * alone) would take them again. The time of the rest is the exclusive bound --sent-before takes:
 * the earlier of the user's ($1) and $3 plus the type's resolution. The last column says whether
 * --sent-after ($2) is at or after --sent-before, a range no time lies in (both read here, as
 * PostgreSQL reads them: a time zone or DateStyle of the text's own is honoured). */
static const char *const SQL_REPLAY_START =
    "SELECT coalesce((SELECT max(o.{seq}) FROM {table} o), 0),"
    " pg_catalog.to_char(now() AT TIME ZONE 'UTC', " SQL_ISO_UTC "),"
    " pg_catalog.to_char(LEAST($1::timestamptz, now() + '1 microsecond'::interval)"
    " AT TIME ZONE 'UTC', " SQL_ISO_UTC "),"
    " coalesce($2::timestamptz >= $1::timestamptz, false)";
/* Whether the order column draws new values by itself (an identity column or a default, as a
 * sequence gives; not a generated column, whose DEFAULT keeps the old value): each replayed row
 * takes its new value from there. The oids are compared as oids: oid = regclass is an exact
 * match for a look-alike operator someone with CREATE on the schema planted, which would run with
 * the rights of the table's owner, who runs replay (docs/security.md). */
static const char *const SQL_REPLAY_SEQ_DRAWS =
    "SELECT (a.atthasdef AND a.attgenerated = '') OR a.attidentity <> ''"
    " FROM pg_catalog.pg_attribute a"
    " WHERE a.attrelid = {table_text}::pg_catalog.regclass::pg_catalog.oid"
    " AND a.attname = {seq_text} AND NOT a.attisdropped";
/* What a dry run shows and the confirmation asks about: the topics come from the aggregate and
 * event types (the only placeholders of a topic template). */
#define REPLAY_SUMMARY_COLUMNS                                                                     \
    "SELECT o.{aggregate_type}::text, o.{event_type}::text, count(*), min(o.{seq}), max(o.{seq})"
static const char *const SQL_REPLAY_SUMMARY =
    REPLAY_SUMMARY_COLUMNS " FROM {table} o WHERE" REPLAY_WHERE " GROUP BY 1, 2 ORDER BY 1, 2";
/* With --missing the summary also gives the ids it found (no more than the list names): the
 * batches are given slices of these alone (keep_found). */
static const char *const SQL_REPLAY_SUMMARY_IDS = REPLAY_SUMMARY_COLUMNS
    ", array_agg(o.{seq}) FROM {table} o WHERE" REPLAY_WHERE " GROUP BY 1, 2 ORDER BY 1, 2";
/* One batch: the next rows of the selection in {seq} order, locked for the batch's transaction
 * so nothing (a relay's retention, a second replay) changes them between this and the update. */
static const char *const SQL_REPLAY_BATCH = "SELECT o.{seq} FROM {table} o WHERE" REPLAY_WHERE
                                            " ORDER BY o.{seq} LIMIT $13 FOR UPDATE OF o";
/* The update, one row at a time in {seq} order within one statement (a DO block: one round
 * trip, its UPDATE planned once): a single UPDATE ... WHERE {seq} = ANY(...) draws the new values
 * in whatever order its plan visits the rows, and replayed events of one aggregate must keep
 * their order. {seq} = DEFAULT draws from the sequence (migrations/0009_hardening.sql); attempts,
 * rejections and the retry time start again as for a new event: the copy is a new delivery, and
 * failures of the first copy (which did reach Kafka) must not bring it nearer to --max-attempts.
 * last_error stays as history. The ids come from this program (integers), never from input. */
static const char *const SQL_REPLAY_UPDATE_HEAD =
    "DO $replay$ DECLARE s bigint; BEGIN FOREACH s IN ARRAY ARRAY[";
static const char *const SQL_REPLAY_UPDATE_TAIL =
    "]::bigint[] LOOP UPDATE {table} SET {seq} = DEFAULT, sent_at = NULL, attempts = 0,"
    " rejections = 0, next_attempt_at = NULL WHERE {seq} = s; END LOOP; END $replay$";

typedef struct Topic {
    char name[ROUTE_TOPIC_MAX + 1];
    long long rows;
} Topic;

/* An entry of a --missing list: verify names a row by its id and event id. */
typedef struct Listed {
    long long seq;
    char *event_id; /* owned */
} Listed;

typedef struct Selection {
    const char *params[REPLAY_NPARAMS + 1];
    char after[24], high[24], start[64], from_id[24], to_id[24], limit[24];
    char last[24]; /* the summary's highest {seq}: where the batches stop ($2) */
    char rest_to_id[24], rest_sent_before[40]; /* the bounds of the rest (SQL_REPLAY_START) */
    char batch_first[24];                      /* the first {seq} of the batch under way */
    /* --missing: the ids verify named, whole for the summary (freed after it), and sorted for
     * the batches, each of which is given only its slice of them (next_slice). */
    StrBuf seqs, event_ids;
    Listed *listed;
    size_t nlisted, next_listed;
    StrBuf slice_seqs, slice_event_ids;
    long long *found; /* the listed ids the summary found (SQL_REPLAY_SUMMARY_IDS) */
    size_t nfound, found_cap;
    long answer_s; /* each statement of a batch before its COMMIT (--statement-timeout and more) */
    long long rows, min_seq, max_seq;
    Topic *topics;
    size_t ntopics;
} Selection;

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A template bounded by --statement-timeout (admin_template_within): the statements before the
 * batches. */
static PGresult *run(PGconn *conn, const Config *cfg, const char *tmpl, int nparams,
                     const char *const *params, ExecStatusType expect, DbError *e)
{
    return admin_template_within(conn, &cfg->map, tmpl, nparams, params, expect,
                                 cfg->statement_timeout_s, e);
}

/* A database error, logged; 2 when it is the input's fault (a timestamp PostgreSQL cannot
 * read: class 22) while reads_input (the statements that read the selection's options), else 1.
 * A batch's class 22 is a row's or a trigger's (the options were read before it), and comes
 * after other batches may have committed: exit 2 would say nothing changed. A batch's 42501 is
 * the update's (the reads before it worked); a read's is a missing SELECT, which the hint about
 * UPDATE on the order column only misled (a dry run needs no UPDATE at all). */
static int db_failed(const char *what, const DbError *e, bool reads_input)
{
    char q[600];
    if (reads_input && strncmp(e->sqlstate, "22", 2) == 0) {
        fprintf(stderr, "outbox-relay: replay: bad selection: %s\n", db_error_text(e));
        return 2;
    }
    if (!reads_input && strcmp(e->sqlstate, "42501") == 0)
        log_error("replay needs UPDATE on the order column (it gives each event a new value from "
                  "the sequence): run it as the table's owner, as migrate",
                  "error=%s", log_quote(db_error_text(e), q, sizeof(q)));
    else
        log_error(what, "error=%s", log_quote(db_error_text(e), q, sizeof(q)));
    return 1;
}

/* Who set the session's statement_timeout, by pg_settings.source: the remedy (a longer one in
 * the URL's options) overrides any of them, but an operator looks for the setting where it was
 * made, and a fixed "the role's, the database's or the connection string's" sent them past
 * postgresql.conf and PGOPTIONS. */
static const char *timeout_set_by(const char *source)
{
    static const struct {
        const char *source, *words;
    } by[] = {
        {"configuration file", "the server's configuration (postgresql.conf, ALTER SYSTEM)"},
        {"command line", "the server's command line"},
        {"database", "the database (ALTER DATABASE ... SET)"},
        {"user", "the role (ALTER ROLE ... SET)"},
        {"database user", "the role in this database (ALTER ROLE ... IN DATABASE ... SET)"},
        {"client", "the connection (options in the URL or PGOPTIONS)"},
    };
    for (size_t i = 0; i < sizeof(by) / sizeof(by[0]); i++)
        if (strcmp(source, by[i].source) == 0)
            return by[i].words;
    return source;
}

/* After a statement the server cancelled (57014): when this session has a statement_timeout
 * (which replay leaves in place, as the other commands do), says so, who set it (pg_settings'
 * source: the server's configuration, the database, the role, the connection), and what lifts
 * it. --statement-timeout bounds replay's own waits only,
 * and the server's words alone ("canceling statement due to statement timeout") sent operators to
 * raise it, to the same end. A cancel of someone's (pg_cancel_backend, a Ctrl-C in psql) has the
 * same SQLSTATE: the server's words tell it apart ("due to user request"), and it says nothing
 * more, whatever statement_timeout is set (a role's 1h, far from expired, was blamed for it). A
 * server whose messages are translated (lc_messages) is judged by the setting alone. The remedy
 * is the statement's: smaller batches shorten a batch, not the summary, which reads the whole
 * selection once whatever --batch-rows is (summary: the statement cancelled was the summary's).
 * The connection must be idle (the failed batch rolled back). */
static void say_statement_timeout(PGconn *conn, const Config *cfg, const DbError *e, bool summary)
{
    if (strcmp(e->sqlstate, "57014") != 0 || strstr(e->message, "due to user request") ||
        PQstatus(conn) != CONNECTION_OK || PQtransactionStatus(conn) != PQTRANS_IDLE)
        return;
    DbError why;
    PGresult *res = admin_query_within(
        conn,
        "SELECT pg_catalog.current_setting('statement_timeout'::pg_catalog.text),"
        " (SELECT s.source FROM pg_catalog.pg_settings s"
        " WHERE s.name OPERATOR(pg_catalog.=) 'statement_timeout'::pg_catalog.text)",
        0, NULL, cfg->statement_timeout_s, &why);
    if (!res)
        return;
    if (PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "0") != 0) {
        char q[100], qs[200];
        log_quote(PQgetvalue(res, 0, 0), q, sizeof(q));
        log_quote(timeout_set_by(PQgetvalue(res, 0, 1)), qs, sizeof(qs));
        if (summary)
            log_error("PostgreSQL's statement_timeout for this session cancelled the read of the "
                      "selection, and --statement-timeout does not lift it: select fewer events "
                      "(--sent-after, --sent-before, --from-id, --to-id), or give its connection "
                      "a longer one (?options=-c%20statement_timeout%3D0 in the URL: libpq "
                      "refuses a bare space or = there)",
                      "statement_timeout=%s set_by=%s", q, qs);
        else
            log_error("PostgreSQL's statement_timeout for this session cancelled the statement, "
                      "and --statement-timeout does not lift it: replay in smaller batches "
                      "(--batch-rows), or give its connection a longer one "
                      "(?options=-c%20statement_timeout%3D0 in the URL: libpq refuses a bare "
                      "space or = there)",
                      "statement_timeout=%s set_by=%s", q, qs);
    }
    PQclear(res);
}

static char *xstrdup(const char *text)
{
    char *copy = strdup(text);
    if (!copy) {
        perror("outbox-relay");
        exit(1);
    }
    return copy;
}

static int cmp_listed(const void *a, const void *b)
{
    long long x = ((const Listed *)a)->seq, y = ((const Listed *)b)->seq;
    return (x > y) - (x < y);
}

/* The most of a --missing list read: the list is parsed whole, at about 7 bytes of memory a byte
 * of text (a million events, 100 MB of verify's output, took 740 MB). 32 MiB is about 330,000
 * events; more are a loss better selected by the time they were sent. */
#define REPLAY_MISSING_MAX_BYTES (32u << 20)

typedef struct MissingInput {
    FILE *f;
    size_t read;
    bool too_big;
    int error; /* errno of a failed read, else 0 */
} MissingInput;

/* json_load_callback's reader: at most REPLAY_MISSING_MAX_BYTES, then an error (too_big). One
 * byte more is read to tell a list of exactly the limit from a longer one. */
static size_t read_capped(void *buffer, size_t buflen, void *data)
{
    MissingInput *in = data;
    if (in->too_big || in->error)
        return (size_t)-1;
    size_t room = REPLAY_MISSING_MAX_BYTES + 1 - in->read;
    size_t n = fread(buffer, 1, buflen < room ? buflen : room, in->f);
    in->read += n;
    if (in->read > REPLAY_MISSING_MAX_BYTES) {
        in->too_big = true;
        return (size_t)-1;
    }
    if (n == 0 && ferror(in->f)) {
        in->error = errno;
        return (size_t)-1;
    }
    return n;
}

/* Reads `verify --json` output from path (- for stdin) into s->seqs and s->event_ids. Returns 0,
 * 2 (message printed) on bad input (a file that cannot be read, not verify's, larger than
 * REPLAY_MISSING_MAX_BYTES); *count gets the number of events named. */
static int read_missing(const char *path, Selection *s, size_t *count)
{
    MissingInput in = {.f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r")};
    if (!in.f) {
        fprintf(stderr, "outbox-relay: replay: --missing %s: %s\n", path, strerror(errno));
        return 2;
    }
    json_error_t jerr;
    json_t *root = json_load_callback(read_capped, &in, 0, &jerr);
    if (in.f != stdin)
        fclose(in.f);
    if (in.too_big) {
        fprintf(stderr,
                "outbox-relay: replay: --missing %s: larger than %u MiB (some 330,000 events): "
                "select so many by the time they were sent instead (--sent-after, --sent-before: "
                "the window verify checked)\n",
                path, REPLAY_MISSING_MAX_BYTES >> 20);
        json_decref(root);
        return 2;
    }
    if (!root) {
        if (in.error)
            fprintf(stderr, "outbox-relay: replay: --missing %s: %s\n", path, strerror(in.error));
        else
            fprintf(stderr, "outbox-relay: replay: --missing %s: not JSON (%s, line %d)\n", path,
                    jerr.text, jerr.line);
        return 2;
    }
    /* An inconclusive check lists rows it could not look for (partitions not read): replaying
     * them would publish events Kafka may well hold. */
    json_t *result = json_object_get(root, "result");
    if (json_is_string(result) && strcmp(json_string_value(result), "inconclusive") == 0) {
        fprintf(stderr,
                "outbox-relay: replay: --missing %s: verify's result was inconclusive (partitions "
                "not read), so its list proves nothing: run verify with --from-beginning\n",
                path);
        json_decref(root);
        return 2;
    }
    json_t *list = json_object_get(root, "missing_events");
    if (!json_is_array(list)) {
        fprintf(stderr,
                "outbox-relay: replay: --missing %s: not the output of `verify --json` (no "
                "missing_events list)\n",
                path);
        json_decref(root);
        return 2;
    }
    strbuf_array_begin(&s->seqs);
    strbuf_array_begin(&s->event_ids);
    size_t i, n = json_array_size(list);
    Listed *ids = calloc(n ? n : 1, sizeof(*ids));
    if (!ids) {
        perror("outbox-relay");
        exit(1);
    }
    json_t *item;
    json_array_foreach(list, i, item)
    {
        json_t *id = json_object_get(item, "id"), *eid = json_object_get(item, "event_id");
        if (!json_is_integer(id) || !json_is_string(eid)) {
            fprintf(stderr,
                    "outbox-relay: replay: --missing %s: entry %zu of missing_events lacks an "
                    "integer id or a string event_id\n",
                    path, i + 1);
            s->listed = ids;
            s->nlisted = i;
            json_decref(root);
            return 2;
        }
        ids[i].seq = (long long)json_integer_value(id);
        ids[i].event_id = xstrdup(json_string_value(eid));
        strbuf_array_int(&s->seqs, ids[i].seq);
        strbuf_array_text(&s->event_ids, ids[i].event_id);
    }
    strbuf_array_end(&s->seqs);
    strbuf_array_end(&s->event_ids);
    /* A list named twice (two verify outputs joined) counts each event once. */
    qsort(ids, n, sizeof(*ids), cmp_listed);
    *count = 0;
    for (i = 0; i < n; i++)
        if (i == 0 || ids[i].seq != ids[i - 1].seq)
            (*count)++;
    s->listed = ids;
    s->nlisted = n;
    json_decref(root);
    return 0;
}

/* Gives the next batch of a --missing selection the next slice of the sorted list, at most
 * --batch-rows entries (the batch's LIMIT, so each takes every row of its slice): the whole list
 * went with each batch's SELECT, with 100,000 ids some 5 MB sent and parsed again for each batch
 * of 10,000. The slices follow the id order, as the batches do. False when none is left. */
static bool next_slice(Selection *s, long batch_rows)
{
    if (s->next_listed >= s->nlisted)
        return false;
    size_t end = s->nlisted - s->next_listed > (size_t)batch_rows
                     ? s->next_listed + (size_t)batch_rows
                     : s->nlisted;
    strbuf_array_begin(&s->slice_seqs);
    strbuf_array_begin(&s->slice_event_ids);
    for (size_t i = s->next_listed; i < end; i++) {
        strbuf_array_int(&s->slice_seqs, s->listed[i].seq);
        strbuf_array_text(&s->slice_event_ids, s->listed[i].event_id);
    }
    strbuf_array_end(&s->slice_seqs);
    strbuf_array_end(&s->slice_event_ids);
    s->params[10] = s->slice_seqs.s;
    s->params[11] = s->slice_event_ids.s;
    s->next_listed = end;
    return true;
}

static int cmp_seq(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Adds the ids of an array_agg's text ("{4,7,9}") to s->found. */
static void note_found(Selection *s, const char *array)
{
    for (const char *p = array; *p;) {
        if (*p < '0' || *p > '9') {
            p++;
            continue;
        }
        char *end;
        long long seq = strtoll(p, &end, 10);
        p = end;
        if (s->nfound == s->found_cap) {
            s->found_cap = s->found_cap ? 2 * s->found_cap : 1024;
            s->found = realloc(s->found, s->found_cap * sizeof(*s->found));
            if (!s->found) {
                perror("outbox-relay");
                exit(1);
            }
        }
        s->found[s->nfound++] = seq;
    }
}

/* Drops from s->listed the entries the summary did not find (deleted since verify ran, unsent
 * again, outside the other options): the batches then take --batch-rows of the rows still there
 * each. Cut from the whole list instead, a list of mostly deleted rows cost a transaction (BEGIN,
 * the SELECT with its slice, ROLLBACK) for every slice that held none of them, and the rate shown
 * counted those. The ids come with the summary's one read of the list: a second read of it whole
 * cost more than the empty batches it saved (100,000 listed: 0.6 s). */
static void keep_found(Selection *s)
{
    qsort(s->found, s->nfound, sizeof(*s->found), cmp_seq);
    size_t at = 0, kept = 0;
    for (size_t i = 0; i < s->nlisted; i++) {
        while (at < s->nfound && s->found[at] < s->listed[i].seq)
            at++;
        if (at < s->nfound && s->found[at] == s->listed[i].seq)
            s->listed[kept++] = s->listed[i];
        else
            free(s->listed[i].event_id);
    }
    s->nlisted = kept;
    free(s->found);
    s->found = NULL;
    s->nfound = s->found_cap = 0;
}

/* Reads the selection's size and topics into s. Returns 0, or what db_failed says. */
static int summarise(PGconn *conn, const Config *cfg, Selection *s)
{
    DbError e;
    PGresult *res = admin_template_within(
        conn, &cfg->map, cfg->replay_missing ? SQL_REPLAY_SUMMARY_IDS : SQL_REPLAY_SUMMARY,
        REPLAY_NPARAMS, s->params, PGRES_TUPLES_OK,
        REPLAY_SUMMARY_FACTOR * cfg->statement_timeout_s, &e);
    if (!res) {
        int rc = db_failed("cannot read the selection", &e, true);
        say_statement_timeout(conn, cfg, &e, true);
        return rc;
    }
    s->topics = calloc((size_t)PQntuples(res) + 1, sizeof(*s->topics));
    if (!s->topics) {
        perror("outbox-relay");
        exit(1);
    }
    for (int i = 0; i < PQntuples(res); i++) {
        OutboxRow row = {.aggregate_type = PQgetvalue(res, i, 0),
                         .event_type = PQgetvalue(res, i, 1)};
        char topic[ROUTE_TOPIC_MAX + 1], why[256];
        if (!route_topic(cfg->topic_template, &row, topic, sizeof(topic), why, sizeof(why)))
            snprintf(topic, sizeof(topic), "(no legal topic)");
        long long n = strtoll(PQgetvalue(res, i, 2), NULL, 10);
        long long lo = strtoll(PQgetvalue(res, i, 3), NULL, 10);
        long long hi = strtoll(PQgetvalue(res, i, 4), NULL, 10);
        s->rows += n;
        if (cfg->replay_missing)
            note_found(s, PQgetvalue(res, i, 5));
        /* The first group sets both: 0 is an id like any other. */
        if (i == 0 || lo < s->min_seq)
            s->min_seq = lo;
        if (i == 0 || hi > s->max_seq)
            s->max_seq = hi;
        size_t t = 0;
        while (t < s->ntopics && strcmp(s->topics[t].name, topic) != 0)
            t++;
        if (t == s->ntopics)
            snprintf(s->topics[s->ntopics++].name, sizeof(s->topics[t].name), "%s", topic);
        s->topics[t].rows += n;
    }
    PQclear(res);
    return 0;
}

/* "3 to outbox.event.order, 1 to outbox.event.user" */
static void print_topics(FILE *out, const Selection *s)
{
    for (size_t t = 0; t < s->ntopics; t++)
        fprintf(out, "%s%lld to %s", t ? ", " : "", s->topics[t].rows, s->topics[t].name);
}

/* Asks on the terminal whether to go on with a large selection. Returns 0 to go on, 2 when
 * there is no terminal to ask (message printed), 1 when the answer is not yes. */
static int confirm(const Selection *s)
{
    if (!isatty(STDIN_FILENO) || !isatty(STDERR_FILENO)) {
        fprintf(stderr,
                "outbox-relay: replay: %lld events selected, more than %d: pass --yes to replay "
                "them without a terminal to confirm (--dry-run shows them)\n",
                s->rows, REPLAY_CONFIRM_ROWS);
        return 2;
    }
    fprintf(stderr, "replay %lld events (", s->rows);
    print_topics(stderr, s);
    fprintf(stderr, ")? [y/N] ");
    char answer[16] = "";
    if (!fgets(answer, sizeof(answer), stdin) || (answer[0] != 'y' && answer[0] != 'Y')) {
        fprintf(stderr, "replay: not confirmed; nothing changed\n");
        return 1;
    }
    return 0;
}

/* Ends the batch's transaction, waiting answer_s at most (db_rollback's blocking PQexec waited for
 * ever on a server that stopped answering right then, after every batch was done). Without an
 * answer the connection is left mid-statement (the caller closes it, and the server rolls back). */
static void roll_back(PGconn *conn, long answer_s)
{
    if (PQstatus(conn) != CONNECTION_OK || PQtransactionStatus(conn) == PQTRANS_IDLE)
        return;
    DbError e;
    PQclear(admin_script_within(conn, "ROLLBACK", answer_s, &e));
}

/* One batch in its own transaction: locks the next rows of the selection and gives them new
 * order values. Returns the rows replayed (0: none left), -1 with e filled in (rolled back), or
 * REPLAY_COMMIT_UNKNOWN with e filled in when the COMMIT was sent but no verdict came (no answer
 * within --statement-timeout, or the connection lost): the batch may or may not have
 * committed, and the connection is unusable (the caller closes it). */
static long long replay_batch(PGconn *conn, const Config *cfg, Selection *s, DbError *e)
{
    long answer_s = s->answer_s;
    PGresult *res =
        admin_template_within(conn, &cfg->map, "BEGIN", 0, NULL, PGRES_COMMAND_OK, answer_s, e);
    if (!res)
        return -1;
    PQclear(res);
    res = admin_template_within(conn, &cfg->map, SQL_REPLAY_BATCH, REPLAY_NPARAMS + 1, s->params,
                                PGRES_TUPLES_OK, answer_s, e);
    if (!res)
        goto failed;
    long long n = PQntuples(res);
    if (n == 0) {
        /* Nothing locked, nothing changed: the ROLLBACK's answer changes nothing either, and one
         * that does not come leaves the connection for the caller to close. */
        PQclear(res);
        roll_back(conn, answer_s);
        return 0;
    }
    StrBuf sql = {0};
    strbuf_puts(&sql, SQL_REPLAY_UPDATE_HEAD);
    for (long long i = 0; i < n; i++) {
        if (i)
            strbuf_puts(&sql, ",");
        /* Checked as an integer: only digits reach the statement. */
        char digits[24];
        snprintf(digits, sizeof(digits), "%lld", strtoll(PQgetvalue(res, (int)i, 0), NULL, 10));
        strbuf_puts(&sql, digits);
    }
    strbuf_puts(&sql, SQL_REPLAY_UPDATE_TAIL);
    snprintf(s->batch_first, sizeof(s->batch_first), "%s", PQgetvalue(res, 0, 0));
    snprintf(s->after, sizeof(s->after), "%s", PQgetvalue(res, (int)(n - 1), 0));
    s->params[0] = s->after;
    PQclear(res);
    res = admin_template_within(conn, &cfg->map, sql.s, 0, NULL, PGRES_COMMAND_OK, answer_s, e);
    strbuf_free(&sql);
    if (!res)
        goto failed;
    PQclear(res);
    /* Wakes sleeping relays (they LISTEN; producers notify only when the relays sleep, and an
     * UPDATE fires no wakeup trigger): sent at the commit, once a batch. */
    res = admin_template_within(conn, &cfg->map, "NOTIFY " WAKEUP_CHANNEL, 0, NULL,
                                PGRES_COMMAND_OK, answer_s, e);
    if (!res)
        goto failed;
    PQclear(res);
    res = admin_script_within(conn, "COMMIT", cfg->statement_timeout_s, e);
    if (!res)
        /* An error the server sent is its verdict: rolled back. None (no answer, the connection
         * gone after the COMMIT left) says nothing either way. */
        return e->sqlstate[0] ? -1 : REPLAY_COMMIT_UNKNOWN;
    PQclear(res);
    return n;
failed:
    /* A statement without an answer left the connection mid-statement: a ROLLBACK would wait
     * behind it as long. The caller closes the connection, and the server rolls the batch back. */
    if (!e->conn_lost)
        roll_back(conn, answer_s);
    return -1;
}

/* A silent network (a partition, a host gone) must not leave this session's batch, with its row
 * locks and its place among the writers the relays' claim floors wait for, open on the server
 * for hours: the server ends a transaction idle for a minute (a batch's statements follow one
 * another without a pause) and probes a quiet client as it does the relay's sessions; the
 * client's side of the same is db_connect's. Every statement waits for a lock at most
 * REPLAY_LOCK_TIMEOUT (a stricter lock_timeout of the connection string stays). Each is given up
 * after answer_s without an answer. Returns false with e filled in. */
static bool bound_server_session(PGconn *conn, long answer_s, DbError *e)
{
#define SESSION_BOUNDS                                                                             \
    "SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', '60000', false),"         \
    " pg_catalog.set_config('tcp_keepalives_idle', '10', false),"                                  \
    " pg_catalog.set_config('tcp_keepalives_interval', '5', false),"                               \
    " pg_catalog.set_config('tcp_keepalives_count', '3', false)"
    bool user_timeout = PQserverVersion(conn) >= 120000; /* tcp_user_timeout: PostgreSQL 12 on */
    PGresult *res = admin_query_within(
        conn,
        user_timeout ? SESSION_BOUNDS ", pg_catalog.set_config('tcp_user_timeout', '30000', false)"
                     : SESSION_BOUNDS,
        0, NULL, answer_s, e);
    if (!res)
        return false;
    PQclear(res);
    res =
        admin_query_within(conn, DB_BOUND_SETTING_SQL("lock_timeout", REPLAY_LOCK_TIMEOUT, "false"),
                           0, NULL, answer_s, e);
    bool ok = res != NULL;
    PQclear(res);
    return ok;
#undef SESSION_BOUNDS
}

/* A first SIGINT, SIGTERM or SIGHUP asks the batch loop to stop after the batch under way, so
 * the count and the bounds of the rest are printed; the three then go back to the default, and a
 * second one ends the process at once (the server rolls the open batch back). SIGHUP is one of
 * them because a terminal that goes away (an ssh session dropped) sends it to a replay whose
 * output may well go to a file: killed at once, it would leave that file without its last line.
 * A signal the process was started ignoring (nohup, a background job of a script) stays
 * ignored. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    static const char note[] = "\nreplay: stopping after the batch under way (a second signal "
                               "stops at once; that batch then rolls back unless its COMMIT was "
                               "sent)\n";
    int saved = errno;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGTERM, &dfl, NULL);
    sigaction(SIGHUP, &dfl, NULL);
    stop_signal = sig;
    ssize_t w = write(STDERR_FILENO, note, sizeof(note) - 1);
    (void)w;
    errno = saved;
}

static void catch_stop_signals(void)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGHUP);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(sigs[i], &sa, NULL);
    /* The last line must not be lost to a reader that went away with the same Ctrl-C (a tee):
     * a write to a closed pipe fails (print_rest then uses stderr) instead of killing. */
    signal(SIGPIPE, SIG_IGN);
}

/* The bounds of the rest, as print_rest and the first line of a run of several batches give
 * them. */
#define REST_BOUNDS                                                                                \
    "--to-id %s --sent-before '%s' in place of any such options of yours (without them the "       \
    "events replayed so far would be selected again)"

/* The last line of a run that stopped short (why: "before the failure", "before the signal"),
 * on stdout, or on stderr when stdout cannot take it. */
static void print_rest(const Selection *s, long long done_rows, const char *why)
{
#define REST_LINE                                                                                  \
    "replay: %lld events replayed %s; to replay the rest, run it again with " REST_BOUNDS "\n"
    printf(REST_LINE, done_rows, why, s->rest_to_id, s->rest_sent_before);
    if (fflush(stdout) != 0 || ferror(stdout))
        fprintf(stderr, REST_LINE, done_rows, why, s->rest_to_id, s->rest_sent_before);
#undef REST_LINE
}

int replay_run(const Config *cfg)
{
    Selection s = {0};
    int rc = 0;
    PGconn *conn = NULL;
    size_t listed = 0;
    if (cfg->replay_missing) {
        rc = read_missing(cfg->replay_missing, &s, &listed);
        if (rc)
            goto done;
        if (listed == 0) {
            printf("replay: nothing to replay: verify reported no missing events\n");
            goto done;
        }
    }
    conn = admin_connect_unbounded(cfg->database_url);
    if (!conn) {
        rc = admin_connect_exit_code();
        goto done;
    }
    DbError e;
    if (!bound_server_session(conn, cfg->statement_timeout_s, &e)) {
        rc = db_failed("cannot set the session's timeouts", &e, true);
        goto done;
    }
    PGresult *res = run(conn, cfg, SQL_REPLAY_SEQ_DRAWS, 0, NULL, PGRES_TUPLES_OK, &e);
    if (!res) {
        rc = db_failed("cannot read the order column's definition", &e, true);
        goto done;
    }
    bool draws = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
    PQclear(res);
    if (!draws) {
        char q[300];
        log_error("replay gives each event a new value of the order column from its sequence, "
                  "and this table's has neither an identity nor a default: give it one, or make "
                  "the rows unsent by hand (UPDATE ... SET sent_at = NULL)",
                  "column=%s", log_quote(cfg->map.seq, q, sizeof(q)));
        rc = 1;
        goto done;
    }
    const char *start_params[2] = {cfg->replay_sent_before, cfg->replay_sent_after};
    res = run(conn, cfg, SQL_REPLAY_START, 2, start_params, PGRES_TUPLES_OK, &e);
    if (!res) {
        rc = db_failed("cannot read the outbox", &e, true);
        goto done;
    }
    /* Swapped bounds are a typo: "nothing to replay", exit 0, would read as "nothing was sent
     * then". */
    if (strcmp(PQgetvalue(res, 0, 3), "t") == 0) {
        fprintf(stderr,
                "outbox-relay: replay: --sent-after (%s) is not before --sent-before (%s): no "
                "time lies between them\n",
                cfg->replay_sent_after, cfg->replay_sent_before);
        PQclear(res);
        rc = 2;
        goto done;
    }
    snprintf(s.high, sizeof(s.high), "%s", PQgetvalue(res, 0, 0));
    snprintf(s.start, sizeof(s.start), "%s", PQgetvalue(res, 0, 1));
    snprintf(s.rest_sent_before, sizeof(s.rest_sent_before), "%s", PQgetvalue(res, 0, 2));
    PQclear(res);
    long long high = strtoll(s.high, NULL, 10);
    snprintf(s.rest_to_id, sizeof(s.rest_to_id), "%lld",
             cfg->replay_to_id_set && cfg->replay_to_id < high ? (long long)cfg->replay_to_id
                                                               : high);
    snprintf(s.from_id, sizeof(s.from_id), "%ld", cfg->replay_from_id);
    snprintf(s.to_id, sizeof(s.to_id), "%ld", cfg->replay_to_id);
    snprintf(s.limit, sizeof(s.limit), "%ld", cfg->replay_batch_rows);
    const char *params[REPLAY_NPARAMS + 1] = {
        NULL, /* the summary reads the whole selection */
        s.high,
        s.start,
        cfg->replay_from_id_set ? s.from_id : NULL,
        cfg->replay_to_id_set ? s.to_id : NULL,
        cfg->replay_sent_after,
        cfg->replay_sent_before,
        cfg->replay_aggregate_type,
        cfg->replay_aggregate_id,
        cfg->replay_event_type,
        cfg->replay_missing ? s.seqs.s : NULL,
        cfg->replay_missing ? s.event_ids.s : NULL,
        s.limit,
    };
    memcpy(s.params, params, sizeof(params));

    double summary_started = mono_now();
    rc = summarise(conn, cfg, &s);
    if (rc)
        goto done;
    s.answer_s = cfg->statement_timeout_s + cfg->replay_batch_rows / 1000 +
                 (long)(10.0 * (mono_now() - summary_started));
    if (s.rows == 0) {
        printf("replay: nothing to replay: no sent event matches the selection\n");
        goto done;
    }
    /* With other selection options beside the list (`--missing - --aggregate-type order`),
     * listed events they leave out are no less in the table as sent: the counts below say so,
     * not that those were deleted. */
    bool narrowed = cfg->replay_missing &&
                    (cfg->replay_from_id_set || cfg->replay_to_id_set || cfg->replay_sent_after ||
                     cfg->replay_sent_before || cfg->replay_aggregate_type ||
                     cfg->replay_aggregate_id || cfg->replay_event_type);
    if (cfg->replay_missing && (size_t)s.rows < listed && narrowed)
        fprintf(stderr,
                "replay: %zu events listed, %lld of them selected (the others are outside the "
                "other options, were deleted, or are unsent already)\n",
                listed, s.rows);
    else if (cfg->replay_missing && (size_t)s.rows < listed)
        fprintf(stderr,
                "replay: %zu events listed, %lld of them still in the table as sent (the others "
                "were deleted, or are unsent already)\n",
                listed, s.rows);
    if (cfg->dry_run) {
        printf("replay: dry run: %lld events would be replayed (ids %lld-%lld): ", s.rows,
               s.min_seq, s.max_seq);
        print_topics(stdout, &s);
        printf("\n");
        goto done;
    }
    if (s.rows > REPLAY_CONFIRM_ROWS && !cfg->yes) {
        rc = confirm(&s);
        if (rc)
            goto done;
    }
    /* The batches take the listed ids the summary found a slice at a time (next_slice), which
     * sets these two again. */
    if (cfg->replay_missing)
        keep_found(&s);
    strbuf_free(&s.seqs);
    strbuf_free(&s.event_ids);
    s.params[10] = s.params[11] = NULL;
    /* The batches walk the order column's index from the last batch's end, and the summary found
     * where the selection lies: from 0 to the highest {seq} at the start, the first batch read
     * every row before the selection and the last every row after it. A time range of the last
     * hours (what a loss on the Kafka side is dated by) is read for the summary on the sent_at
     * index; its first batch walked the table's whole history, each row fetched and filtered out
     * (2,000,000 rows sent before the window: 0.77 s, against the summary's 0.13 s), a cost that
     * grows with the history where the batches' bound (answer_s) grows with the summary's time
     * only: on a table kept for months, "PostgreSQL did not answer". A row the summary could not
     * see (its mark, begun before the start, committed as the summary ran) is taken only within
     * these bounds. */
    /* The lowest bigint has no id below it: the first batch then starts without a bound. */
    if (s.min_seq > LLONG_MIN) {
        snprintf(s.after, sizeof(s.after), "%lld", s.min_seq - 1);
        s.params[0] = s.after;
    }
    snprintf(s.last, sizeof(s.last), "%lld", s.max_seq);
    s.params[1] = s.last;

    /* A run that stops between its batches without a last line (a second signal, SIGKILL, the
     * OOM killer, the operator's machine gone) leaves batches replayed, and a rerun of the same
     * command would take them again once the relays have sent them: the bounds of the rest are
     * given before the first batch, where they survive any such end. One batch commits whole
     * or not at all, so a run of one needs none. */
    if (s.rows > cfg->replay_batch_rows)
        fprintf(stderr,
                "replay: %lld events, in transactions of %ld; should it stop short, run it again "
                "with " REST_BOUNDS " to replay the rest\n",
                s.rows, cfg->replay_batch_rows, s.rest_to_id, s.rest_sent_before);
    bool tty = isatty(STDERR_FILENO);
    double started = mono_now(), shown = started;
    long long done_rows = 0;
    catch_stop_signals();
    for (;;) {
        if (stop_signal) {
            if (tty)
                fprintf(stderr, "\n");
            print_rest(&s, done_rows, "before the signal");
            rc = 1;
            goto done;
        }
        if (cfg->replay_missing && !next_slice(&s, cfg->replay_batch_rows))
            break;
        long long n = replay_batch(conn, cfg, &s, &e);
        if (n == REPLAY_COMMIT_UNKNOWN) {
            if (tty)
                fprintf(stderr, "\n");
            char q[600];
            /* A rerun with the bounds of the rest is right either way once the COMMIT is settled:
             * committed, the batch's rows are unsent under new ids above --to-id; not, they are
             * selected again. While it waits it holds their locks, and a rerun gives up on
             * them after REPLAY_LOCK_TIMEOUT. */
            log_error("a batch's COMMIT got no verdict: whether that batch was replayed is "
                      "unknown. A synchronous standby that does not answer holds a COMMIT until "
                      "it answers or leaves synchronous_standby_names (pg_stat_activity shows the "
                      "session, application_name outbox-relay, waiting with wait_event SyncRep); "
                      "once no such session is left, `replay --dry-run` with the same options "
                      "lists the batch's ids again if it did not commit. Run again with the "
                      "bounds of the rest below then: they are right either way",
                      "batch_ids=%s-%s error=%s", s.batch_first, s.after,
                      log_quote(db_error_text(&e), q, sizeof(q)));
            print_rest(&s, done_rows, "before the batch whose outcome is unknown");
            rc = 1;
            goto done;
        }
        if (n < 0) {
            if (tty)
                fprintf(stderr, "\n");
            rc = db_failed("replay failed; the batches before it stay replayed", &e, false);
            say_statement_timeout(conn, cfg, &e, false);
            print_rest(&s, done_rows, "before the failure");
            goto done;
        }
        if (n == 0 && !cfg->replay_missing)
            break;
        done_rows += n;
        double now = mono_now();
        if (tty && now - shown >= 0.5) {
            double rate = (double)done_rows / (now - started);
            long long left = s.rows > done_rows ? s.rows - done_rows : 0;
            fprintf(stderr, "\rreplay: %lld of %lld events, %.0f/s, %.0f s left   ", done_rows,
                    s.rows, rate, rate > 0 ? (double)left / rate : 0.0);
            shown = now;
        }
    }
    if (tty && shown > started)
        fprintf(stderr, "\n");
    printf("replay: %lld events replayed in %.1f s: ", done_rows, mono_now() - started);
    print_topics(stdout, &s);
    /* The listed events no batch found still sent (deleted, unsent again): a list of mostly
     * deleted rows says so here, where its count is read, not only before the batches. */
    if (cfg->replay_missing && (long long)listed > done_rows && narrowed)
        printf(" (as selected; %lld of the %zu events listed not selected: outside the other "
               "options, or not in the table as sent)\n",
               (long long)listed - done_rows, listed);
    else if (cfg->replay_missing && (long long)listed > done_rows)
        printf(" (as selected; %lld of the %zu events listed not in the table as sent)\n",
               (long long)listed - done_rows, listed);
    else
        printf(" (as selected)\n");
done:
    if (conn)
        PQfinish(conn);
    strbuf_free(&s.seqs);
    strbuf_free(&s.event_ids);
    strbuf_free(&s.slice_seqs);
    strbuf_free(&s.slice_event_ids);
    for (size_t i = 0; i < s.nlisted; i++)
        free(s.listed[i].event_id);
    free(s.listed);
    free(s.found);
    free(s.topics);
    return rc;
}
