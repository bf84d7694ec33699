/* Unit tests of the engine's session cycle without a network: the real engine (relay/engine,
 * relay/outbox, lib, config) linked with stand-ins for the PostgreSQL connection (fake_pg.c,
 * pg.h's interface) and the Kafka producer (fake_kafka.c, kafka.h's), on the real libev loop.
 *
 * The tests drive the engine only from outside: they bring connections up and down, answer its
 * requests with canned results (or failures with a SQLSTATE), deliver delivery reports, fire its
 * timers and send it SIGTERM. They assert two things at each step:
 *  - the phases each session went through, by name (session_phase_observer): the expected
 *    sequences are tables at the top of each test, to update in one place when phases change;
 *  - the requests each session sent, each as its statements' kinds ("BEGIN,claim-plan,claim"),
 *    and their parameters where it matters (which rows a mark names).
 * At the end the program prints how many of the phase changes the engine allows the tests went
 * through ("# cycle paths covered"), the allowed ones asked of the engine itself.
 *
 * The relay is started as main starts it (relay_new, relay_run: see start()). What reaches into
 * the engine's insides (engine.h): the Relay's sessions (S(), for their timers), its timers
 * (rest_timer), its count of sessions still running (to see a stop complete) and its notion of
 * when the backlog was last seen (backlog_seen_at, instead of waiting --session-rest-after). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "engine.h"
#include "fake_kafka.h"
#include "fake_pg.h"
#include "log.h"
#include "secrets.h"
#include "monotime.h"
#include "relay.h"
#include "statements.h"
#include "table.h"

#define MAX_SESSIONS 2
#define MAX_STEPS 128

static struct {
    struct ev_loop *loop;
    Config cfg;
    Relay *r;
    char *tmpl[SESSION_SQL_COUNT]; /* the table's statements, expanded as the engine does */
    /* What each session did since its last check: phases entered, requests sent. */
    char phases[MAX_SESSIONS][MAX_STEPS][160];
    int nphases[MAX_SESSIONS];
    char sent[MAX_SESSIONS][MAX_STEPS][160];
    int nsent[MAX_SESSIONS];
    /* How the fake database answers (auto_result). */
    const char *members;             /* live member slots, "0" or "0,1" */
    const char *away;                /* of those, the slots away ("0,1"); NULL: none */
    const char *mark_holder;         /* the pid holding the mark lock asked for; NULL: free */
    const char *sleep_answer;        /* outbox_relay_sleep(): guard, follow, busy */
    const char *claim[MAX_SESSIONS]; /* the next claim's rows by aggregate, "A,A,B"; "" none */
    const char *fail_kind;           /* the first statement of this kind fails ... */
    const char *fail_state;          /* ... with this SQLSTATE */
    const char *fail_msg;            /* ... and this message (NULL: "the test says no") */
    const char *dead[MAX_SESSIONS];  /* the next dead-letter claim's rows, as claim[] */
    const char *recheck[3];          /* the next claim's recheck: aggregate type, id, seq; none */
    bool recheck_full; /* ... a full answer: recheck[] surely new, then others only possibly new */
    const char *table_node;   /* the table's relfilenode the floor's look finds */
    const char *seq_last;     /* the sequence's last value it finds (NULL: "10") */
    const char *seq_in_order; /* whether it finds the sequence in order (NULL: "t") */
    bool floor_ok;            /* the floor's check passes (else: "no such table") */
    long long next_id;
    ev_prepare brk;
    ev_idle idle;
} T;

/* ---- phase changes: covered, and allowed ------------------------------------------------- */

#define MAX_PHASES 24
static bool covered[MAX_PHASES][MAX_PHASES];

static void observe_phase(const Session *s, Phase from, Phase to)
{
    if ((int)from < MAX_PHASES && (int)to < MAX_PHASES)
        covered[from][to] = true;
    if (s->index < MAX_SESSIONS && T.nphases[s->index] < MAX_STEPS)
        snprintf(T.phases[s->index][T.nphases[s->index]++], 160, "%s", session_phase_name(to));
}

static int phase_count(void)
{
    int n = 0;
    while (n < MAX_PHASES && strcmp(session_phase_name((Phase)n), "?") != 0)
        n++;
    return n;
}

/* Whether the engine allows from -> to: asked of session_set_phase itself, which aborts on a
 * change its cycle does not allow (the abort is caught here), so that the count follows the
 * engine's own table. A fork per change would do the same at ten times the cost under ASan. */
static sigjmp_buf probe_jump;

static void on_probe_abort(int sig)
{
    siglongjmp(probe_jump, 1);
}

static bool phase_change_allowed_by_engine(Phase from, Phase to)
{
    struct sigaction act = {.sa_handler = on_probe_abort}, old;
    sigemptyset(&act.sa_mask);
    sigaction(SIGABRT, &act, &old);
    void (*observer)(const Session *, Phase, Phase) = session_phase_observer;
    session_phase_observer = NULL;
    static Session s; /* static: untouched by the jump */
    memset(&s, 0, sizeof(s));
    s.phase = from;
    volatile bool allowed = false;
    if (sigsetjmp(probe_jump, 1) == 0) {
        session_set_phase(&s, to);
        allowed = true;
    }
    session_phase_observer = observer;
    sigaction(SIGABRT, &old, NULL);
    return allowed;
}

static void print_coverage(void)
{
    int n = phase_count(), allowed = 0, seen = 0;
    char missing[2048] = "";
    for (int from = 0; from < n; from++)
        for (int to = 0; to < n; to++) {
            if (!phase_change_allowed_by_engine((Phase)from, (Phase)to))
                continue;
            allowed++;
            if (covered[from][to]) {
                seen++;
            } else if (strlen(missing) < sizeof(missing) - 64) {
                strcat(missing, " ");
                strcat(missing, session_phase_name((Phase)from));
                strcat(missing, ">");
                strcat(missing, session_phase_name((Phase)to));
            }
        }
    printf("# cycle paths covered: %d of %d allowed phase changes (%d phases)\n", seen, allowed, n);
    printf("# not covered:%s\n", missing);
}

/* ---- naming what the engine sends ------------------------------------------------------- */

static const char *const template_kind[SESSION_SQL_COUNT] = {
    [SQL_CLAIM_HOLD] = "claim",
    [SQL_CLAIM_SKIP] = "claim",
    [SQL_CLAIM_HOLD_AROUND_LOCKS] = "claim-around-locks",
    [SQL_CLAIM_SKIP_AROUND_LOCKS] = "claim-around-locks",
    [SQL_FIND_LOCKER] = "find-locker",
    [SQL_CLAIM_DEAD] = "claim-dead",
    [SQL_FLOOR_HELD_HOLD] = "floor-held",
    [SQL_FLOOR_HELD_SKIP] = "floor-held",
    [SQL_FLOOR_WRITERS] = "floor-writers",
    [SQL_FLOOR_CHECK] = "floor-check",
    [SQL_MARK_SENT] = "mark-sent",
    [SQL_DELETE_SENT] = "delete-sent",
    [SQL_MARK_FAILED] = "mark-failed",
    [SQL_MARK_DEAD_LETTERED] = "mark-dead-lettered",
    [SQL_MARK_DEAD_LETTER_FAILED] = "mark-dead-letter-failed",
    [SQL_CLAIM_RECHECK_HOLD] = "claim-recheck",
    [SQL_CLAIM_RECHECK_SKIP] = "claim-recheck",
};

/* A plain claim's request, as summarise() names it. */
#define CLAIM "BEGIN,claim-plan,claim,claim-recheck"

static const struct {
    const char *sql, *kind;
} fixed_kind[] = {
    {SQL_LISTEN, "LISTEN"},
    {SQL_BEGIN, "BEGIN"},
    {SQL_COMMIT, "COMMIT"},
    {SQL_ROLLBACK, "ROLLBACK"},
    {SQL_CLAIM_PLAN, "claim-plan"},
    {SQL_MARK_PLAN, "mark-plan"},
    {SQL_MARK_PLAN_FAILURES, "mark-plan-failures"},
    {SQL_FAILURES_DURABLE, "failures-durable"},
    {SQL_SLEEP, "sleep"},
    {SQL_WAKE, "wake"},
    {SQL_LANES_JOIN, "join"},
    {SQL_LANES_LEAVE, "leave"},
    {SQL_LANES_MEMBERS, "members"},
    {SQL_LANES_CALLABLE, "callable"},
    {SQL_LOCK_LANES, "lock"},
    {SQL_UNLOCK_LANES, "unlock"},
    {SQL_LANES_MARK, "mark"},
    {SQL_LANES_UNMARK, "unmark"},
};

static const char *kind_of(const char *sql)
{
    for (size_t i = 0; i < sizeof(fixed_kind) / sizeof(fixed_kind[0]); i++)
        if (strcmp(sql, fixed_kind[i].sql) == 0)
            return fixed_kind[i].kind;
    for (int i = 0; i < SESSION_SQL_COUNT; i++)
        if (T.tmpl[i] && strcmp(sql, T.tmpl[i]) == 0)
            return template_kind[i];
    if (strstr(sql, "pg_terminate_backend") && strstr(sql, GUARD_LEFT))
        return "end-lost-guard"; /* wakeup.c's own statement */
    return "?";
}

static int session_of(const PgConn *pg)
{
    int i = -1;
    return sscanf(fake_pg_name(pg), "session-%d", &i) == 1 && i >= 0 && i < MAX_SESSIONS ? i : 0;
}

static void summarise(const FakeRequest *req, char *out, size_t len)
{
    out[0] = '\0';
    for (int i = 0; i < req->n; i++) {
        if (i)
            strncat(out, ",", len - strlen(out) - 1);
        strncat(out, kind_of(req->sql[i]), len - strlen(out) - 1);
    }
}

/* Records each request as it is sent (fake_pg's hook). */
static void on_sent(PgConn *pg, const FakeRequest *req)
{
    int i = session_of(pg);
    if (T.nsent[i] < MAX_STEPS)
        summarise(req, T.sent[i][T.nsent[i]++], 160);
}

/* The parameters of the pending request's first statement of this kind ("" when none). */
static const char *pending_param(int i, const char *kind);

/* ---- checks -------------------------------------------------------------------------------- */

/* Compares a recorded list with a NULL-terminated table, then forgets the recorded list. */
static void expect_list(const char *what, int i, char (*list)[160], int *n, const char *const *want)
{
    int k = 0;
    bool same = true;
    for (; want[k]; k++)
        same = same && k < *n && strcmp(list[k], want[k]) == 0;
    same = same && k == *n;
    if (!same) {
        print_error("session %d %s:\n  expected:", i, what);
        for (int j = 0; want[j]; j++)
            print_error(" [%s]", want[j]);
        print_error("\n  got:     ");
        for (int j = 0; j < *n; j++)
            print_error(" [%s]", list[j]);
        print_error("\n");
    }
    *n = 0;
    assert_true(same);
}

static void expect_phases(int i, const char *const *want)
{
    expect_list("phases", i, T.phases[i], &T.nphases[i], want);
}

static void expect_sent(int i, const char *const *want)
{
    expect_list("requests", i, T.sent[i], &T.nsent[i], want);
}

/* Forgets what session i did so far (checked, or of no interest to the test). */
static void forget(int i)
{
    T.nphases[i] = T.nsent[i] = 0;
}

/* ---- the relay and its surroundings ------------------------------------------------------- */

static Session *S(int i)
{
    return &T.r->sessions[i];
}

static PgConn *PG(int i)
{
    char name[24];
    snprintf(name, sizeof(name), "session-%d", i);
    PgConn *pg = fake_pg_named(name);
    assert_non_null(pg);
    return pg;
}

/* Runs what the loop has ready without waiting (the tests' timers are far away). */
static void settle(void)
{
    for (int i = 0; i < 4; i++)
        ev_run(T.loop, EVRUN_NOWAIT);
}

/* A timer expires: a one-shot one stops first, as libev does. */
static void fire(ev_timer *w)
{
    assert_true(ev_is_active(w));
    if (w->repeat == 0.0)
        ev_timer_stop(T.loop, w);
    ev_invoke(T.loop, w, EV_TIMER);
    settle();
}

static void sigterm(void)
{
    ev_feed_signal_event(T.loop, SIGTERM);
    settle();
}

static void on_prepare_break(struct ev_loop *loop, ev_prepare *w, int revents)
{
    ev_prepare_stop(loop, w);
    ev_break(loop, EVBREAK_ALL);
}

static void on_idle(struct ev_loop *loop, ev_idle *w, int revents)
{
    ev_idle_stop(loop, w);
}

/* More options for the next start() (NULL-terminated, at most 6); teardown forgets them. */
static const char *extra_args[7];

static void load_config(const char *sessions, const char *min_sessions, const char *sleep_after)
{
    char *argv[] = {
        "outbox-relay", "run", "--database-url", "postgresql://fake/db", "--brokers", "fake:9092",
        "--batch-size", "8", "--sessions", (char *)sessions, "--min-sessions", (char *)min_sessions,
        "--sleep-after", (char *)sleep_after, "--claim-floor", "off",
        /* Every timer far away: the tests fire the ones they mean. */
        "--poll-interval", "3600000", "--rebalance-interval", "60000", "--busy-poll-interval",
        "1000", "--delivery-timeout", "3600000", "--shutdown-timeout", "3600000",
        "--session-rest-after", "3600000", NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    char err[512];
    int argc = (int)(sizeof(argv) / sizeof(argv[0])) - 7;
    for (int i = 0; extra_args[i]; i++)
        argv[argc++] = (char *)extra_args[i];
    if (!config_load(&T.cfg, argc, argv, err, sizeof(err)))
        fail_msg("config: %s", err);
}

/* Starts the relay as main does (relay_new, relay_run), with relay_run's loop broken after its
 * first iteration, so that the test drives the loop from here on (settle). */
static void start(const char *sessions, const char *min_sessions, const char *sleep_after)
{
    memset(&T, 0, sizeof(T));
    T.loop = ev_default_loop(0);
    T.members = "0";
    T.sleep_answer = "guard";
    T.next_id = 1;
    T.table_node = "5";
    for (int i = 0; i < MAX_SESSIONS; i++)
        T.claim[i] = "";
    log_set_level(LOG_ERROR + 1); /* quiet: the tests check what the engine does, not says */
    load_config(sessions, min_sessions, sleep_after);
    PGconn *quoter = PQconnectStart("fake_pg_never_connects=1");
    char err[512];
    assert_true(table_sql_all(&T.cfg.map, quoter, session_sql_templates, T.tmpl, SESSION_SQL_COUNT,
                              err, sizeof(err)));
    PQfinish(quoter);
    fake_pg_sent_hook = on_sent;
    session_phase_observer = observe_phase;
    T.r = relay_new(T.loop, &T.cfg, rd_kafka_conf_new(), err, sizeof(err));
    assert_non_null(T.r);
    static const char *const initialised[] = {"down", NULL};
    for (int i = 0; i < (int)T.cfg.sessions; i++)
        expect_phases(i, initialised);
    ev_prepare_init(&T.brk, on_prepare_break);
    ev_prepare_start(T.loop, &T.brk);
    ev_idle_init(&T.idle, on_idle);
    ev_idle_start(T.loop, &T.idle);
    assert_int_equal(relay_run(T.r), 0);
    assert_int_equal(fake_pg_count(), (int)T.cfg.sessions);
}

static int teardown(void **state)
{
    session_phase_observer = NULL;
    fake_pg_sent_hook = NULL;
    fake_kafka_set_files_refused(false); /* a test that failed while refusing */
    fake_kafka_set_pin_refused(false);
    relay_free(T.r);
    T.r = NULL;
    fake_kafka_destroy_handed_off(); /* the threads' part of what relay_free handed off */
    for (int i = 0; i < SESSION_SQL_COUNT; i++)
        free(T.tmpl[i]);
    config_free(&T.cfg);
    fake_pg_forget();
    memset(extra_args, 0, sizeof(extra_args));
    return 0;
}

/* ---- the fake database's answers ----------------------------------------------------------- */

static const char *const ROW_COLS = "id,event_id,aggregate_type,aggregate_id,event_type,payload,"
                                    "headers,attempts,last_error,age,extra_headers,created_at,"
                                    "payload_bytes";
#define NCOLS 13

/* A claim's rows: one per aggregate named in spec ("A,A,B"), ids counting up; "A:Shipped" gives
 * the row an event type other than Created, "A@pay" an aggregate type other than order (its
 * aggregate id stays agg-A). */
static PGresult *claim_result(const char *spec)
{
    static char text[MAX_STEPS][5][64];
    const char *cells[MAX_STEPS * NCOLS];
    int rows = 0;
    char copy[256];
    snprintf(copy, sizeof(copy), "%s", spec);
    for (char *save = NULL, *a = strtok_r(copy, ",", &save); a && rows < MAX_STEPS;
         a = strtok_r(NULL, ",", &save), rows++) {
        long long id = T.next_id++;
        snprintf(text[rows][0], 64, "%lld", id);
        snprintf(text[rows][1], 64, "00000000-0000-4000-8000-%012lld", id);
        char *type = strchr(a, ':');
        if (type)
            *type++ = '\0';
        char *agg_type = strchr(a, '@');
        if (agg_type)
            *agg_type++ = '\0';
        snprintf(text[rows][2], 64, "agg-%s", a);
        snprintf(text[rows][3], 64, "%s", type ? type : "Created");
        snprintf(text[rows][4], 64, "%s", agg_type ? agg_type : "order");
        const char *row[NCOLS] = {
            text[rows][0], text[rows][1], text[rows][4], text[rows][2], text[rows][3], "{}", NULL,
            "0",           NULL,          "0",           NULL,          NULL,          NULL};
        memcpy(&cells[rows * NCOLS], row, sizeof(row));
    }
    return fake_pg_tuples(ROW_COLS, rows, cells);
}

/* A one-column result of the comma-separated values (from an array literal "{1,2}" too). */
static PGresult *column(const char *name, const char *values)
{
    static char text[LANE_COUNT + 8][16];
    const char *cells[LANE_COUNT + 8];
    int rows = 0;
    char copy[512];
    snprintf(copy, sizeof(copy), "%s", values);
    for (char *save = NULL, *v = strtok_r(copy, "{},", &save); v && rows < LANE_COUNT + 8;
         v = strtok_r(NULL, "{},", &save))
        snprintf(text[rows], 16, "%s", v), cells[rows] = text[rows], rows++;
    return fake_pg_tuples(name, rows, cells);
}

/* The members' answer with its mark column: T.members, each away (1) when T.away names it. */
static PGresult *members_away(void)
{
    static char text[LANE_COUNT][16];
    const char *cells[LANE_COUNT * 2];
    int rows = 0;
    char copy[512], away[512];
    snprintf(copy, sizeof(copy), "%s", T.members);
    snprintf(away, sizeof(away), ",%s,", T.away);
    for (char *save = NULL, *v = strtok_r(copy, ",", &save); v && rows < LANE_COUNT;
         v = strtok_r(NULL, ",", &save)) {
        char key[20];
        snprintf(text[rows], 16, "%s", v);
        snprintf(key, sizeof(key), ",%s,", v);
        cells[rows * 2] = text[rows];
        cells[rows * 2 + 1] = strstr(away, key) ? "1" : "0";
        rows++;
    }
    return fake_pg_tuples("objid,mark", rows, cells);
}

static PGresult *auto_result(int i, const FakeRequest *req, int q)
{
    const char *kind = kind_of(req->sql[q]);
    if (T.fail_kind && strcmp(kind, T.fail_kind) == 0) {
        T.fail_kind = NULL;
        return fake_pg_error(T.fail_state, T.fail_msg ? T.fail_msg : "the test says no");
    }
    char slot[12]; /* any int */
    snprintf(slot, sizeof(slot), "%d", i);
    if (strcmp(kind, "floor-check") == 0 && T.floor_ok) /* a table fit for the floor */
        return fake_pg_tuples("t,relkind,col,identity,seq,cache,cycle,priv,user,grantee,qualified",
                              1,
                              (const char *[]){"t", "r", "t", "a", "public.outbox_id_seq", "1", "f",
                                               "t", "relay", "outbox_relay", "public.outbox"});
    if (strcmp(kind, "floor-check") == 0) /* no floor in these tests: "no such table" */
        return fake_pg_tuples("t,relkind,col,identity,seq,cache,cycle,priv,user,grantee,qualified",
                              1,
                              (const char *[]){"f", NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                               "relay", "outbox_relay", NULL});
    if (strcmp(kind, "floor-held") == 0) /* no failed row; the sequence's last value, in order */
        return fake_pg_tuples("held,seq_last,seq_in_order,table_node,seq_node", 1,
                              (const char *[]){NULL, T.seq_last ? T.seq_last : "10",
                                               T.seq_in_order ? T.seq_in_order : "t", T.table_node,
                                               "1"});
    if (strcmp(kind, "floor-writers") == 0)
        return fake_pg_tuples("ended,writers", 1, (const char *[]){"t", "{}"});
    if (strcmp(kind, "join") == 0)
        return column("s", slot);
    if (strcmp(kind, "members") == 0 && T.away)
        return members_away();
    if (strcmp(kind, "members") == 0)
        return column("objid", T.members);
    if (strcmp(kind, "mark") == 0)
        return fake_pg_tuples("taken,holder", 1,
                              (const char *[]){T.mark_holder ? "f" : "t", T.mark_holder});
    if (strcmp(kind, "unmark") == 0)
        return column("pg_advisory_unlock", "t");
    if (strcmp(kind, "lock") == 0)
        return column("l", req->params[q]); /* every lane asked for is free */
    if (strcmp(kind, "unlock") == 0 || strcmp(kind, "leave") == 0)
        return column("pg_advisory_unlock", "t");
    if (strcmp(kind, "sleep") == 0)
        return column("outbox_relay_sleep", T.sleep_answer);
    if (strcmp(kind, "wake") == 0)
        return fake_pg_tuples("outbox_relay_wake", 1, (const char *[]){""});
    if (strcmp(kind, "end-lost-guard") == 0) /* the process ran on, and is ended */
        return fake_pg_tuples("pg_notify,pg_terminate_backend", 1, (const char *[]){"", "t"});
    if (strcmp(kind, "claim") == 0 || strcmp(kind, "claim-around-locks") == 0) {
        PGresult *res = claim_result(T.claim[i]);
        T.claim[i] = "";
        return res;
    }
    if (strcmp(kind, "claim-dead") == 0) {
        PGresult *res = claim_result(T.dead[i] ? T.dead[i] : "");
        T.dead[i] = NULL;
        return res;
    }
    if (strcmp(kind, "mark-failed") == 0)
        return fake_pg_tuples("id,event_id,aggregate_type,aggregate_id,dead", 0, NULL);
    if (strcmp(kind, "claim-recheck") == 0 && T.recheck_full) {
        /* CLAIM_RECHECK_MAX rows, surely new ones first (SQL_CLAIM_RECHECK_HOLD's order). */
        static char ids[CLAIM_RECHECK_MAX][16];
        static const char *cells[CLAIM_RECHECK_MAX * 4];
        for (int k = 0; k < CLAIM_RECHECK_MAX; k++) {
            snprintf(ids[k], sizeof(ids[k]), "other-%d", k);
            cells[k * 4] = k == 0 ? T.recheck[0] : "other";
            cells[k * 4 + 1] = k == 0 ? T.recheck[1] : ids[k];
            cells[k * 4 + 2] = k == 0 ? T.recheck[2] : "1";
            cells[k * 4 + 3] = k == 0 ? "t" : "f";
        }
        T.recheck_full = false;
        memset(T.recheck, 0, sizeof(T.recheck));
        return fake_pg_tuples("agg_type,agg_id,first_seq,surely_new", CLAIM_RECHECK_MAX, cells);
    }
    if (strcmp(kind, "claim-recheck") == 0) {
        PGresult *res = fake_pg_tuples("agg_type,agg_id,first_seq", T.recheck[0] ? 1 : 0,
                                       T.recheck[0] ? T.recheck : NULL);
        memset(T.recheck, 0, sizeof(T.recheck));
        return res;
    }
    return fake_pg_command_ok();
}

/* Answers session i's request in flight as a healthy database would (and as T says). */
static void answer(int i)
{
    PgConn *pg = PG(i);
    const FakeRequest *req = fake_pg_pending(pg);
    assert_non_null(req);
    PGresult *results[PG_MAX_QUERIES];
    int n = req->n;
    for (int q = 0; q < n; q++)
        results[q] = auto_result(i, req, q);
    fake_pg_answer(pg, results, n);
    settle();
}

/* Answers with the claim's rows given by aggregate ("A,B"). */
static void answer_claim(int i, const char *rows)
{
    T.claim[i] = rows;
    answer(i);
}

/* Answers with the first statement of `kind` failing with sqlstate. */
static void answer_failing(int i, const char *kind, const char *sqlstate)
{
    T.fail_kind = kind;
    T.fail_state = sqlstate;
    answer(i);
    assert_null(T.fail_kind); /* the request had such a statement */
}

static const char *pending_param(int i, const char *kind)
{
    const FakeRequest *req = fake_pg_pending(PG(i));
    for (int q = 0; req && q < req->n; q++)
        if (strcmp(kind_of(req->sql[q]), kind) == 0)
            return req->params[q];
    return "";
}

static void expect_idle_pg(int i)
{
    const FakeRequest *req = fake_pg_pending(PG(i));
    if (req) {
        char what[160];
        summarise(req, what, sizeof(what));
        fail_msg("session %d sent [%s] where it must wait", i, what);
    }
}

/* A session connects, joins the lane group and owns the lanes T.members leaves it; it then
 * claims (its first claim is in flight when this returns). */
static void bring_up(int i)
{
    static const char *const phases[] = {"setup", "idle", "rebalancing", "idle", "claiming", NULL};
    static const char *const sent[] = {
        "LISTEN,floor-check", "join", "members", "lock", CLAIM, NULL};
    fake_pg_up(PG(i));
    answer(i); /* LISTEN */
    answer(i); /* join */
    answer(i); /* members */
    answer(i); /* lock */
    expect_phases(i, phases);
    expect_sent(i, sent);
}

/* Brings up session i whose lost connection's process held (or may have held) the wakeup lock
 * (guard "t") or a member slot and lanes (guard "f"): after LISTEN, before its first look at the
 * lanes, it ends exactly that process (pid and start of the connection lost; notifying for a
 * guard); then it joins as bring_up. */
static void bring_up_lost(int i, const char *guard)
{
    static const char *const phases[] = {"setup",       "idle", "leaving guard", "idle",
                                         "rebalancing", "idle", "claiming",      NULL};
    static const char *const sent[] = {
        "LISTEN,floor-check", "end-lost-guard", "join", "members", "lock", CLAIM, NULL};
    int lost = fake_pg_backend_pid(PG(i));
    char want[64];
    snprintf(want, sizeof(want), "%d|2026-11-28 18:00:00.%06d|%s|", lost, lost, guard);
    fake_pg_up(PG(i));
    answer(i); /* LISTEN */
    const char *params = pending_param(i, "end-lost-guard");
    if (strncmp(params, want, strlen(want)) != 0)
        fail_msg("ending the lost process: \"%s\", not \"%s...\"", params, want);
    answer(i); /* ended (and notified) */
    answer(i); /* join */
    answer(i); /* members */
    answer(i); /* lock */
    expect_phases(i, phases);
    expect_sent(i, sent);
}

static void bring_up_lost_guard(int i)
{
    bring_up_lost(i, "t");
}

/* "{a,b}": the lane list the engine sends for the lanes member `slot` owns among `slots`. */
static const char *lanes_of(const int *slots, int n, int slot)
{
    static char out[LANE_COUNT * 4 + 4];
    bool own[LANE_COUNT];
    lanes_assign(slots, n, slot, own);
    snprintf(out, sizeof(out), "{");
    for (int l = 0, first = 1; l < LANE_COUNT; l++)
        if (own[l]) {
            char item[8];
            snprintf(item, sizeof(item), "%s%d", first ? "" : ",", l);
            strcat(out, item);
            first = 0;
        }
    strcat(out, "}");
    return out;
}

/* The field'th '|'-separated parameter of text (a copy in a static buffer). */
static const char *field(const char *params, int field)
{
    static char out[512];
    const char *p = params;
    for (int i = 0; i < field && p; i++)
        p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL;
    snprintf(out, sizeof(out), "%s", p ? p : "");
    out[strcspn(out, "|")] = '\0';
    return out;
}

#define OK RD_KAFKA_RESP_ERR_NO_ERROR
#define FULL "A,B,C,D,E,F,G,H" /* --batch-size 8: a full claim */

/* Session 0 claims A,B,C, Kafka acknowledges them, the marks fail with sqlstate (a row's fault:
 * 22P02, 23514; a passing one: 40001), and the ROLLBACK is answered: what follows is the test's. */
static void marks_fail(const char *sqlstate)
{
    answer_claim(0, "A,B,C"); /* three rows: not chained */
    fake_kafka_report_all(OK);
    answer_failing(0, "mark-sent", sqlstate);
    answer(0); /* ROLLBACK */
}

/* ---- the scenarios ------------------------------------------------------------------------ */

/* A batch is claimed, produced, acknowledged and marked; the next claim rides behind its
 * COMMIT in the same round trip, and so on until a claim comes back empty. Nothing is marked
 * before every report is in, and only the acknowledged rows are marked. */
static void test_batch_chained(void **state)
{
    static const char *const phases[] = {"producing",
                                         "marking and claiming",
                                         "claiming",
                                         "producing",
                                         "marking and claiming",
                                         "claiming",
                                         "ending",
                                         "idle",
                                         "claiming",
                                         NULL};
    static const char *const sent[] = {"mark-plan,mark-sent,COMMIT," CLAIM,
                                       "mark-plan,mark-sent,COMMIT," CLAIM, "COMMIT", CLAIM, NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B"); /* rows 1, 2 */
    assert_int_equal(fake_kafka_count(), 2);
    expect_idle_pg(0); /* nothing is marked before the acknowledgements */
    fake_kafka_report(0, OK);
    expect_idle_pg(0); /* nor with one of two in */
    fake_kafka_report(1, OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{1,2}");
    answer_claim(0, "C"); /* the marks went through, the chained claim brings row 3 */
    assert_int_equal(fake_kafka_count(), 3);
    expect_idle_pg(0);
    fake_kafka_report(2, OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{3}");
    answer_claim(0, ""); /* caught up: rows came recently, so it polls soon, awake */
    answer(0);           /* the empty claim's COMMIT */
    expect_idle_pg(0);
    fire(&S(0)->busy_timer);
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* The claim's recheck (the statement after the claim, with a snapshot of its own) finds that
 * another transaction made an earlier event of aggregate A wait while the claim waited for its
 * lock: the claim went on with A's later rows, which must not be published in this batch; the
 * other aggregates are. On the old code there was no recheck, and both A rows were produced
 * (4 messages). */
static void test_claim_recheck_holds_aggregate(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    assert_string_equal(field(pending_param(0, "claim-recheck"), 1), "1000"); /* the bound */
    T.recheck[0] = "order";
    T.recheck[1] = "agg-A";
    T.recheck[2] = "1";                      /* below both of A's claimed rows */
    answer_claim(0, "B,A,A,C");              /* rows 1..4 */
    assert_int_equal(fake_kafka_count(), 2); /* B and C */
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{1,4}"); /* A's rows stay unsent */
}

/* A full recheck answer whose last rows are only possibly new (failed rows recorded after the
 * oldest transaction running at the claim's snapshot, which the claim mostly saw itself: many of
 * them while an old snapshot is open elsewhere) holds what it names, not the whole batch: only
 * surely new rows, which come first, can have been left out. On the old code a full answer held
 * every aggregate of every batch: nothing was produced ("0 != 2"). */
static void test_claim_recheck_full_of_possibly_new(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    T.recheck[0] = "order";
    T.recheck[1] = "agg-A";
    T.recheck[2] = "1";
    T.recheck_full = true;
    answer_claim(0, "B,A,A,C");              /* rows 1..4 */
    assert_int_equal(fake_kafka_count(), 2); /* B and C */
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{1,4}"); /* A's rows stay unsent */
}

/* An empty claim, with no rows for --sleep-after: the session commits and asks to sleep in one
 * round trip, makes its final claim as the guard, and sleeps; a notification makes the guard
 * let the wakeup lock go, then claim. A stop while asleep lets the lock go too. */
static void test_empty_claim_sleeps(void **state)
{
    static const char *const asleep[] = {"going to sleep", "idle", "claiming",
                                         "ending",         "idle", NULL};
    static const char *const asleep_sent[] = {"COMMIT,sleep", CLAIM, "COMMIT", NULL};
    static const char *const woken[] = {"leaving guard",  "idle", "claiming",
                                        "going to sleep", "idle", "claiming",
                                        "ending",         "idle", NULL};
    static const char *const woken_sent[] = {"wake", CLAIM, "COMMIT,sleep", CLAIM, "COMMIT", NULL};
    static const char *const stopped[] = {"leaving guard", "idle", NULL};
    static const char *const stopped_sent[] = {"wake", NULL};
    start("1", "1", "0");
    bring_up(0);
    answer_claim(0, ""); /* empty: go to sleep */
    answer(0);           /* "guard": the final claim follows */
    answer_claim(0, ""); /* still nothing: asleep */
    answer(0);
    expect_idle_pg(0);
    expect_phases(0, asleep);
    expect_sent(0, asleep_sent);
    fake_pg_notify(PG(0), WAKEUP_CHANNEL, "");
    answer(0);           /* the guard left: it claims */
    answer_claim(0, ""); /* nothing: to sleep again */
    answer(0);           /* "guard" */
    answer_claim(0, ""); /* the final claim */
    answer(0);
    expect_idle_pg(0);
    expect_phases(0, woken);
    expect_sent(0, woken_sent);
    sigterm(); /* a guard lets the wakeup lock go before it stops */
    assert_int_equal(T.r->running, 1);
    answer(0);
    assert_int_equal(T.r->running, 0);
    expect_phases(0, stopped);
    expect_sent(0, stopped_sent);
}

/* SIGTERM comes while a lost process's ending is due (the session reconnected and its LISTEN
 * is out): the session stopped without it, and that process kept the session's lanes from the
 * other relays (and, had it guarded, left their sessions asleep unguarded) until the server
 * ended it, up to --session-timeout later. It is sent on the way out, within the second a guard
 * has to give its lock up, and the session stops with its answer. */
static void test_stop_ends_lost_process(void **state)
{
    static const char *const sent[] = {"LISTEN,floor-check", "end-lost-guard", NULL};
    start("1", "1", "60000");
    bring_up(0);
    fake_pg_drop(PG(0), "cut while claiming");
    forget(0);
    fake_pg_up(PG(0));
    sigterm();
    assert_int_equal(T.r->running, 1);
    answer(0); /* LISTEN */
    expect_sent(0, sent);
    assert_int_equal(T.r->running, 1);
    answer(0); /* ended */
    assert_int_equal(T.r->running, 0);
    expect_idle_pg(0);
}

/* SIGTERM while a batch waits for acknowledgements: nothing is marked until the shutdown
 * timer gives up on the rest, and then only what was acknowledged. */
static void test_stop_while_producing(void **state)
{
    static const char *const phases[] = {"producing", "marking", "idle", NULL};
    static const char *const sent[] = {"mark-plan,mark-sent,COMMIT", NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B,C"); /* rows 1-3 */
    fake_kafka_report(0, OK);
    sigterm();
    expect_idle_pg(0); /* waits for the reports, bounded by the shutdown timer */
    fire(&S(0)->shutdown_timer);
    assert_string_equal(pending_param(0, "mark-sent"), "{1}");
    answer(0);
    fake_kafka_report_all(OK); /* late reports change nothing */
    expect_idle_pg(0);
    assert_int_equal(T.r->running, 0);
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* A relay freed with every report in (a database removed by SIGHUP is freed on the loop)
 * hands its producer to kafka_producer_retire, destroyed off the loop; one freed with a batch
 * still out hands it, with the batch's results, to kafka_producer_free_then: destroyed off the
 * loop too, the results freed only after it. */
static void test_freed_producer_destroyed_off_the_loop(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A");
    fake_kafka_report_all(OK);
    answer(0); /* marked */
    int freed = fake_kafka_freed(), retired = fake_kafka_retired();
    relay_free(T.r);
    T.r = NULL;
    assert_int_equal(fake_kafka_retired(), retired + 1);
    assert_int_equal(fake_kafka_freed(), freed);

    teardown(state);
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B"); /* out: no report yet */
    freed = fake_kafka_freed();
    retired = fake_kafka_retired();
    int handed_off = fake_kafka_handed_off();
    relay_free(T.r); /* the fake aborts if it is retired with reports outstanding */
    T.r = NULL;
    assert_int_equal(fake_kafka_handed_off(), handed_off + 1);
    assert_int_equal(fake_kafka_freed(), freed);
    assert_int_equal(fake_kafka_retired(), retired);
    fake_kafka_destroy_handed_off(); /* reads the payloads: still there */
}

/* A batch given up at the shutdown timeout is marked and cleared while the producer still holds
 * its unacknowledged messages, whose payloads point into the claim results the batch keeps
 * until it is freed (batch_retire). Handed to kafka_producer_retire's thread the producer
 * outlived them (the fake aborts on a retirement with messages unreported); destroyed in place
 * (the old code) its purge's flush (100 ms) and rd_kafka_destroy (no bound while requests are
 * out) ran on the loop for a database removed by SIGHUP. Now the producer goes to a thread with
 * those results (kafka_producer_free_then), which frees them only once it is destroyed: the
 * fake's destroy, after relay_free, still reads every payload where the batch left it. */
static void test_given_up_batch_producer_freed_off_the_loop(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B,C"); /* rows 1-3 */
    fake_kafka_report(0, OK);
    sigterm();
    fire(&S(0)->shutdown_timer); /* rows 2 and 3 given up, still at the producer */
    answer(0);                   /* row 1 marked */
    expect_idle_pg(0);
    assert_int_equal(S(0)->batch.n, 0);
    int freed = fake_kafka_freed(), retired = fake_kafka_retired();
    int handed_off = fake_kafka_handed_off();
    relay_free(T.r);
    T.r = NULL;
    assert_int_equal(fake_kafka_handed_off(), handed_off + 1);
    assert_int_equal(fake_kafka_freed(), freed);
    assert_int_equal(fake_kafka_retired(), retired);
    fake_kafka_destroy_handed_off(); /* reads rows 2 and 3's payloads: still there */
}

/* The connection goes while the marks (and the chained claim) are in flight: the batch is
 * abandoned, and after the reconnect nothing of it is marked again. */
static void test_connection_lost_while_marking(void **state)
{
    static const char *const phases[] = {"producing", "marking and claiming", "down", NULL};
    static const char *const sent[] = {"mark-plan,mark-sent,COMMIT," CLAIM, NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B");
    fake_kafka_report_all(OK);
    fake_pg_drop(PG(0), "connection reset by peer");
    expect_phases(0, phases);
    expect_sent(0, sent);
    bring_up_lost(0, "f"); /* LISTEN, the lost process ended, join, members, lock, claim: no mark */
}

/* The floor's check fails ("permission denied for schema": the relay's role lacks USAGE on the
 * table's schema). It went in one pipeline with LISTEN, which PostgreSQL runs as one implicit
 * transaction: the LISTEN, though its own result is COMMAND_OK, was rolled back with it. The
 * session sends LISTEN again, alone, before it joins the lanes; on the old code it went on deaf
 * (and could sleep as the wakeup guard that hears no producer). */
static void test_listen_again_after_floor_check_failed(void **state)
{
    static const char *const phases[] = {"setup", "setup",    "idle", "rebalancing",
                                         "idle",  "claiming", NULL};
    static const char *const sent[] = {
        "LISTEN,floor-check", "LISTEN", "join", "members", "lock", CLAIM, NULL};
    static const char *const asleep_sent[] = {"COMMIT,sleep", NULL};
    start("1", "1", "0");
    fake_pg_up(PG(0));
    answer_failing(0, "floor-check", "42501"); /* the LISTEN before it is rolled back too */
    answer(0);                                 /* LISTEN, on its own: it holds */
    answer(0);                                 /* join */
    answer(0);                                 /* members */
    answer(0);                                 /* lock */
    expect_phases(0, phases);
    expect_sent(0, sent);
    assert_false(S(0)->floor.enabled); /* the check failed: no floor */
    answer_claim(0, "");               /* empty: it listens, so it may sleep */
    expect_sent(0, asleep_sent);
}

/* LISTEN itself fails (a pooler that refuses it, say): the session is deaf. An empty, quiet
 * claim then commits and waits for the poll timer; it never asks to sleep, which could make it
 * the wakeup guard, whose producers' notifications no one would hear. On the old code it sent
 * COMMIT,sleep. After a reconnect whose LISTEN holds it sleeps again. */
static void test_deaf_session_polls_instead_of_sleeping(void **state)
{
    static const char *const sent[] = {
        "LISTEN,floor-check", "join", "members", "lock", CLAIM, "COMMIT", CLAIM, NULL};
    static const char *const asleep_sent[] = {"COMMIT,sleep", NULL};
    start("1", "1", "0");
    fake_pg_up(PG(0));
    answer_failing(0, "LISTEN", "0A000");
    answer(0);           /* join */
    answer(0);           /* members */
    answer(0);           /* lock */
    answer_claim(0, ""); /* empty and quiet: it would sleep, but cannot hear */
    answer(0);           /* COMMIT */
    expect_idle_pg(0);
    assert_false(S(0)->wake.asleep);
    fire(&S(0)->poll_timer); /* --poll-interval: it claims again */
    expect_sent(0, sent);
    fake_pg_drop(PG(0), "connection reset by peer");
    forget(0);
    bring_up_lost(0, "f"); /* LISTEN holds this time */
    forget(0);
    answer_claim(0, "");
    expect_sent(0, asleep_sent);
}

/* The floor's check failed at connect (a grant missing, a sequence with a cache): the floor stayed
 * off until the session reconnected, however soon the operator fixed it. The check is asked
 * again, alone (in a pipeline its failure would abort the claim), before the first claim once
 * FLOOR_CHECK_AGAIN_S have passed; when it passes, the claims start at the floor. On the old code
 * the session claimed on with the floor off. */
static void test_floor_checked_again(void **state)
{
    static const char *const soon_sent[] = {CLAIM, "COMMIT", NULL};
    static const char *const phases[] = {"setup", "idle", "claiming", NULL};
    static const char *const sent[] = {
        "floor-check", "BEGIN,claim-plan,floor-held,claim,claim-recheck,floor-writers", NULL};
    extra_args[0] = "--claim-floor";
    extra_args[1] = "on";
    start("1", "1", "60000");
    bring_up(0); /* the check finds no such table: no floor */
    assert_false(S(0)->floor.enabled);
    S(0)->last_rows_at = monotime_now(); /* rows came recently: it stays awake */
    answer_claim(0, "");                 /* caught up: it polls soon */
    answer(0);                           /* COMMIT */
    T.floor_ok = true;                   /* the operator fixes the table */
    forget(0);
    fire(&S(0)->busy_timer); /* too soon to ask again: a claim */
    answer_claim(0, "");
    answer(0);
    expect_sent(0, soon_sent);
    assert_false(S(0)->floor.enabled);
    S(0)->floor_check_due = monotime_now() - 1; /* FLOOR_CHECK_AGAIN_S later */
    forget(0);
    fire(&S(0)->busy_timer);
    answer(0); /* the check passes */
    expect_phases(0, phases);
    expect_sent(0, sent);
    assert_true(S(0)->floor.enabled);
    assert_true(S(0)->floor_check_due == 0); /* not asked again */
}

/* A floor on is turned off by a later look: the sequence given a cache while the relay runs, or
 * the look itself refused (its SELECT on the sequence revoked). It stayed off until the session
 * reconnected, which a healthy connection may never do, however soon the operator undid it: the
 * check is asked again every FLOOR_CHECK_AGAIN_S, as for a check failed at connect. On the old
 * code floor_check_due stayed 0 and no check was asked. */
static void test_floor_turned_off_checked_again(void **state)
{
    static const char *const check_sent[] = {"floor-check", NULL};
    extra_args[0] = "--claim-floor";
    extra_args[1] = "on";
    start("1", "1", "60000");
    T.floor_ok = true;
    fake_pg_up(PG(0));
    while (fake_pg_pending(PG(0)))
        answer(0); /* the check passes; joined; nothing to claim: asleep */
    assert_true(S(0)->floor.enabled);
    for (int round = 0; round < 2; round++) {
        S(0)->floor_look_due = 0;
        fire(&S(0)->poll_timer);
        if (round == 0) {
            T.seq_in_order = "f"; /* ALTER SEQUENCE ... CACHE 20 */
            answer(0);            /* the claim: its look turns the floor off */
        } else {
            answer_failing(0, "floor-held", "42501"); /* its SELECT on the sequence revoked */
        }
        assert_false(S(0)->floor.enabled);
        assert_true(S(0)->floor_check_due > 0); /* asked again later, not only at a reconnect */
        T.seq_in_order = NULL;                  /* the operator undoes it */
        while (fake_pg_pending(PG(0)))
            answer(0); /* COMMIT or ROLLBACK; the claim again from the table's start; asleep */
        forget(0);
        S(0)->floor_check_due = monotime_now() - 1; /* FLOOR_CHECK_AGAIN_S later */
        fire(round == 0 ? &S(0)->poll_timer : &S(0)->retry_timer);
        expect_sent(0, check_sent);
        answer(0); /* the check passes */
        assert_true(S(0)->floor.enabled);
        assert_true(S(0)->floor_check_due == 0);
        while (fake_pg_pending(PG(0)))
            answer(0); /* the claim it came before, empty; COMMIT */
    }
}

/* The connection goes while a batch is at the producer: the session reconnects and takes lanes
 * again, but claims only once every report of the abandoned batch is in. */
static void test_connection_lost_while_producing(void **state)
{
    static const char *const phases[] = {"producing",     "down", "setup", "idle",
                                         "leaving guard", "idle", NULL};
    static const char *const sent[] = {"LISTEN,floor-check", "end-lost-guard", NULL};
    static const char *const after[] = {"rebalancing", "idle", "claiming", NULL};
    static const char *const after_sent[] = {"join", "members", "lock", CLAIM, NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B");
    fake_kafka_report(0, OK);
    fake_pg_drop(PG(0), "connection reset by peer");
    fake_pg_up(PG(0));
    answer(0); /* LISTEN */
    answer(0); /* the lost process ended: it need not wait for the batch's reports */
    expect_phases(0, phases);
    expect_sent(0, sent);
    expect_idle_pg(0); /* a report is still out: no lanes, no claim */
    fake_kafka_report(1, RD_KAFKA_RESP_ERR__PURGE_QUEUE);
    answer(0); /* join */
    answer(0); /* members */
    answer(0); /* lock */
    expect_phases(0, after);
    expect_sent(0, after_sent);
}

/* The delivery timeout purges the producer; the purged rows are recorded as failed (a passing
 * failure: no attempt against them is permanent) and the next claim waits for the retry
 * backoff, as nothing got through. */
static void test_delivery_timeout_purges(void **state)
{
    static const char *const phases[] = {"producing", "marking", "idle", "claiming", NULL};
    static const char *const sent[] = {"mark-plan-failures,mark-failed,COMMIT", CLAIM, NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B");
    fire(&S(0)->delivery_timer);
    assert_int_equal(fake_kafka_purges(), 1);
    expect_idle_pg(0); /* the purged reports are not in yet */
    fake_kafka_deliver_purged();
    assert_string_equal(field(pending_param(0, "mark-failed"), 0), "{1,2}");
    assert_string_equal(field(pending_param(0, "mark-failed"), 2),
                        "{\"f\",\"f\"}"); /* not permanent */
    answer(0);
    expect_idle_pg(0); /* the retry backoff */
    fire(&S(0)->retry_timer);
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* Lanes move between batches only: a rebalance that falls due while a batch is out waits for
 * its COMMIT (the claim is then not chained); the lanes another relay's session now owns are
 * given up, the next claim names only the session's own, and lanes that come back are locked
 * and claimed at once. */
static void test_lanes_handed_over(void **state)
{
    static const char *const phases[] = {"producing",   "marking",  "idle",     "rebalancing",
                                         "idle",        "claiming", "ending",   "idle",
                                         "rebalancing", "idle",     "claiming", NULL};
    static const char *const sent[] = {"mark-plan,mark-sent,COMMIT",
                                       "members",
                                       "unlock",
                                       CLAIM,
                                       "COMMIT",
                                       "members",
                                       "lock",
                                       CLAIM,
                                       NULL};
    static const int two[] = {0, 1}, one[] = {0};
    start("1", "1", "60000");
    bring_up(0);
    assert_string_equal(field(pending_param(0, "claim"), 1), lanes_of(one, 1, 0));
    answer_claim(0, "A");
    fire(&S(0)->rebalance_timer);
    expect_idle_pg(0); /* no lane moves while its rows are out */
    fake_kafka_report_all(OK);
    answer(0);         /* the marks, not chained: the rebalance comes first */
    T.members = "0,1"; /* another relay's session joined: slot 1 */
    answer(0);         /* members: give slot 1's lanes up */
    char given_up[LANE_COUNT * 4 + 4];
    snprintf(given_up, sizeof(given_up), "%s", lanes_of(two, 2, 1));
    assert_string_equal(pending_param(0, "unlock"), given_up);
    answer(0);
    assert_string_equal(field(pending_param(0, "claim"), 1), lanes_of(two, 2, 0));
    answer_claim(0, "");
    answer(0);       /* COMMIT */
    T.members = "0"; /* it left: its lanes come back */
    fire(&S(0)->rebalance_timer);
    answer(0); /* members */
    assert_string_equal(pending_param(0, "lock"), given_up);
    answer(0); /* gained lanes may hold a backlog: claim at once */
    assert_string_equal(field(pending_param(0, "claim"), 1), lanes_of(one, 1, 0));
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* The send of a rebalance's lock/unlock fails: the lanes to give up are already marked not
 * owned while the server still holds their locks, so the session is dropped (which releases
 * them) rather than left holding lanes that nobody claims. */
static void test_failed_unlock_send_reconnects(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A");
    fire(&S(0)->rebalance_timer);
    fake_kafka_report_all(OK);
    answer(0); /* the marks; the rebalance's members look comes next */
    assert_non_null(fake_pg_pending(PG(0)));
    assert_string_equal(fake_pg_pending(PG(0))->sql[0], SQL_LANES_MEMBERS);
    T.members = "0,1"; /* another relay's session joined: slot 1 */
    int resets = fake_pg_resets(PG(0));
    fake_pg_refuse_sends = 1;
    answer(0); /* members: the unlock of slot 1's lanes cannot be sent */
    fake_pg_refuse_sends = 0;
    assert_int_equal(fake_pg_resets(PG(0)), resets + 1);
}

/* The connection goes with a request of each kind in flight (and between requests): the
 * session goes down, and comes back to claiming after the reconnect. */
static void test_connection_lost_anywhere(void **state)
{
    static const char *const in_setup[] = {"setup", "down", NULL};
    static const char *const in_rebalancing[] = {"setup", "idle", "rebalancing", "down", NULL};
    static const char *const in_claiming[] = {"down", NULL};
    static const char *const in_going_to_sleep[] = {"going to sleep", "down", NULL};
    static const char *const in_idle[] = {"going to sleep", "idle", "claiming", "ending",
                                          "idle",           "down", NULL};
    static const char *const in_leaving_guard[] = {"leaving guard", "down", NULL};
    static const char *const in_ending[] = {
        "producing", "marking and claiming", "claiming", "ending", "down", NULL};
    static const char *const in_marking[] = {"producing", "marking", "down", NULL};
    static const char *const in_rolling_back[] = {"producing", "marking", "rolling back", "down",
                                                  NULL};
    static const char *const in_recording_row[] = {"producing",     "marking", "rolling back",
                                                   "recording row", "down",    NULL};
    static const char *const in_leaving_lanes[] = {"ending", "idle", "leaving lanes", "down", NULL};
    start("1", "1", "60000");
    fake_pg_up(PG(0));
    fake_pg_drop(PG(0), "gone during LISTEN");
    expect_phases(0, in_setup);
    fake_pg_up(PG(0));
    answer(0); /* LISTEN */
    fake_pg_drop(PG(0), "gone during the join");
    expect_phases(0, in_rebalancing);
    forget(0);
    bring_up_lost(0, "f");
    fake_pg_drop(PG(0), "gone during the claim");
    expect_phases(0, in_claiming);
    bring_up_lost(0, "f");
    answer_claim(0, ""); /* empty, no rows for long: COMMIT and to sleep */
    fake_pg_drop(PG(0), "gone while going to sleep");
    expect_phases(0, in_going_to_sleep);
    forget(0);
    bring_up_lost_guard(0); /* the lost request to sleep may have taken the lock */
    answer_claim(0, "");
    answer(0);           /* "guard" */
    answer_claim(0, ""); /* the final claim */
    answer(0);           /* COMMIT: asleep, between requests */
    fake_pg_drop(PG(0), "gone between requests");
    expect_phases(0, in_idle);
    forget(0);
    bring_up_lost_guard(0);
    answer_claim(0, "");
    answer(0); /* "guard" */
    answer_claim(0, "");
    answer(0);
    forget(0);
    fake_pg_notify(PG(0), WAKEUP_CHANNEL, "");
    fake_pg_drop(PG(0), "gone while the guard leaves");
    expect_phases(0, in_leaving_guard);
    forget(0);
    bring_up_lost_guard(0);
    answer_claim(0, "A");
    fake_kafka_report_all(OK);
    answer_claim(0, ""); /* rows came recently: the empty claim's COMMIT alone */
    fake_pg_drop(PG(0), "gone during the COMMIT");
    expect_phases(0, in_ending);
    forget(0);
    bring_up_lost(0, "f");
    answer_claim(0, "A,B,C"); /* not chained: the marks alone */
    fake_kafka_report_all(OK);
    fake_pg_drop(PG(0), "gone during the marks");
    expect_phases(0, in_marking);
    forget(0);
    bring_up_lost(0, "f"); /* nothing of the batch is marked again */
    answer_claim(0, "A,B,C");
    fake_kafka_report_all(OK);
    answer_failing(0, "mark-sent", "22P02");
    fake_pg_drop(PG(0), "gone during the ROLLBACK");
    expect_phases(0, in_rolling_back);
    forget(0);
    bring_up_lost(0, "f");
    marks_fail("22P02");
    fake_pg_drop(PG(0), "gone while recording a row");
    expect_phases(0, in_recording_row);
    forget(0);
    bring_up_lost(0, "f");
    answer_failing(0, "claim", "42501");
    answer(0); /* ROLLBACK */
    fake_pg_drop(PG(0), "gone while leaving the lanes");
    expect_phases(0, in_leaving_lanes);
}

/* The marks that rode with the next claim fail for a passing reason: rolled back, and the next
 * claim waits for the retry backoff. */
static void test_chained_marks_transient_failure(void **state)
{
    static const char *const phases[] = {
        "producing", "marking and claiming", "rolling back", "idle", "claiming", NULL};
    static const char *const sent[] = {"mark-plan,mark-sent,COMMIT," CLAIM, "ROLLBACK", CLAIM,
                                       NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B");
    fake_kafka_report_all(OK);
    answer_failing(0, "mark-sent", "40P01");
    answer(0); /* ROLLBACK */
    expect_idle_pg(0);
    fire(&S(0)->retry_timer);
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* One full batch of session 0 (claimed as FULL, acknowledged, marked, claim again). */
static void full_batch(void)
{
    answer_claim(0, FULL);
    fake_kafka_report_all(OK);
    answer(0); /* marks (a full batch is never chained); the next claim follows */
}

/* --sessions 2 --min-sessions 1: the second session connects but rests (no lanes, no member
 * slot) until ten claims in a row come back full; then it joins and claims. Once the backlog is
 * long gone it rests again, giving its lanes back; and when the claiming session's connection
 * goes, the resting one takes its place. */
static void test_session_rests_and_joins(void **state)
{
    static const char *const resting[] = {"setup", "idle", NULL};
    static const char *const resting_sent[] = {"LISTEN,floor-check", NULL};
    static const char *const joined[] = {"rebalancing",    "idle", "claiming",
                                         "going to sleep", "idle", "claiming",
                                         "ending",         "idle", NULL};
    static const char *const joined_sent[] = {"join",         "members", "lock",   CLAIM,
                                              "COMMIT,sleep", CLAIM,     "COMMIT", NULL};
    static const char *const redivides[] = {"rebalancing", "idle", NULL};
    static const char *const redivides_sent[] = {"members", NULL};
    static const char *const rests[] = {"leaving lanes", "idle", "leaving guard", "idle", NULL};
    static const char *const rests_sent[] = {"unlock,leave", "wake", NULL};
    static const char *const takes_over[] = {"rebalancing", NULL};
    static const char *const takes_over_sent[] = {"join", NULL};
    start("2", "1", "60000");
    bring_up(0);
    fake_pg_up(PG(1));
    answer(1); /* LISTEN */
    expect_phases(1, resting);
    expect_sent(1, resting_sent);
    expect_idle_pg(1);
    for (int i = 0; i < 9; i++) {
        full_batch();
        expect_idle_pg(1); /* nine full claims are a lag, not yet a backlog */
    }
    answer_claim(0, FULL); /* the tenth */
    T.members = "0,1";
    answer(1);           /* join */
    answer(1);           /* members */
    answer(1);           /* lock */
    answer_claim(1, ""); /* its lanes are empty: to sleep */
    answer(1);           /* "guard" */
    answer_claim(1, ""); /* the final claim */
    answer(1);
    expect_phases(1, joined);
    expect_sent(1, joined_sent);
    /* Session 0 finishes its batch, gives session 1's lanes up, and catches up. */
    fake_kafka_report_all(OK);
    answer(0); /* marks */
    answer(0); /* members */
    answer(0); /* unlock */
    answer_claim(0, "");
    answer(0);
    expect_idle_pg(0);
    answer(1); /* session 0 saw the group change: session 1 re-divides too */
    expect_phases(1, redivides);
    expect_sent(1, redivides_sent);
    expect_idle_pg(1);
    /* The backlog is long gone: the sessions above --min-sessions rest. */
    T.r->backlog_seen_at = monotime_now() - 2 * (double)T.cfg.session_rest_after_ms / 1000.0;
    fire(&T.r->rest_timer);
    answer(1); /* unlock, leave */
    answer(1); /* a guard with no lanes lets the wakeup lock go */
    expect_phases(1, rests);
    expect_sent(1, rests_sent);
    expect_idle_pg(1);
    /* Session 0 takes the lanes back, then loses its connection: session 1 takes its place. */
    T.members = "0";
    answer(0); /* members */
    answer(0); /* lock */
    fake_pg_drop(PG(0), "connection reset by peer");
    expect_phases(1, takes_over);
    expect_sent(1, takes_over_sent);
}

/* A backlog calls the resting sessions back while one is still leaving the group (its unlock and
 * leave out): once out, it joins again at once, not at its next --rebalance-interval (while the
 * backlog waits on fewer sessions than it asked for). */
static void test_called_back_while_leaving(void **state)
{
    start("2", "1", "60000");
    bring_up(0);
    fake_pg_up(PG(1));
    answer(1); /* LISTEN */
    for (int i = 0; i < 10; i++)
        full_batch(); /* a backlog: session 1 joins */
    T.members = "0,1";
    answer(1); /* join */
    answer(1); /* members */
    answer(1); /* lock */
    answer_claim(1, "");
    while (fake_pg_pending(PG(1)))
        answer(1); /* to sleep, its final claim */
    T.r->backlog_seen_at = monotime_now() - 2 * (double)T.cfg.session_rest_after_ms / 1000.0;
    fire(&T.r->rest_timer);
    assert_non_null(fake_pg_pending(PG(1))); /* unlock, leave */
    forget(1);
    for (int i = 0; i < 10; i++)
        relay_batch_claimed(T.r, true); /* the backlog is back before the leave's answer */
    answer(1);
    static const char *const sent[] = {"join", NULL};
    expect_sent(1, sent);
}

/* A session that met a Kafka setup fault, then rests (--sessions above --min-sessions, once the
 * backlog is gone), gives its lanes up and claims no more: nothing could clear its fault (only a
 * batch delivered, or a claim finding nothing, does), so /readyz named it for as long as the
 * session rested, long after the session that took its lanes over delivered everything. The fault
 * goes with the lanes: whoever claims their rows meets it again if it lasts. */
static void test_resting_session_keeps_no_kafka_fault(void **state)
{
    start("2", "1", "60000");
    bring_up(0);
    fake_pg_up(PG(1));
    answer(1); /* LISTEN */
    for (int i = 0; i < 10; i++)
        full_batch(); /* a backlog: session 1 joins */
    T.members = "0,1";
    answer(1); /* join */
    answer(1); /* members */
    answer(1); /* lock */
    fake_kafka_refuse_key("agg-P*", RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    answer_claim(1, "P@pay");
    answer(1); /* its marks: nothing recorded */
    RelayStatus st;
    relay_status(T.r, &st);
    assert_non_null(strstr(st.setup_error, "Topic authorization failed"));
    answer_claim(1, ""); /* pay left out: nothing else */
    while (fake_pg_pending(PG(1)))
        answer(1); /* to sleep, its final claim */
    T.r->backlog_seen_at = monotime_now() - 2 * (double)T.cfg.session_rest_after_ms / 1000.0;
    fire(&T.r->rest_timer);
    while (fake_pg_pending(PG(1)))
        answer(1); /* unlock, leave; the wakeup lock */
    assert_int_equal(S(1)->lanes.n_owned, 0);
    /* Fixed: session 0, every lane its own again, delivers pay's rows. */
    fake_kafka_refuse_key("agg-P*", RD_KAFKA_RESP_ERR_NO_ERROR);
    T.members = "0";
    while (fake_pg_pending(PG(0)) && !strstr(pending_param(0, "claim"), "{"))
        answer(0); /* the batch in hand, the rebalance */
    unsigned long long sent = S(0)->total_sent;
    answer_claim(0, "P@pay");
    fake_kafka_report_all(OK);
    while (fake_pg_pending(PG(0)))
        answer(0);
    assert_int_equal(S(0)->total_sent, sent + 1);
    relay_status(T.r, &st);
    assert_string_equal(st.setup_error, "");
}

/* The group changes while a session's rebalance is out: the answer it gets describes the group
 * before the change, so it must look again before it claims. Seen at start-up, where the second
 * session's connection came up first: that session joined and claimed, then rested when the
 * first came up, during the first's rebalance; the first then claimed on half of the lanes
 * until its next rebalance interval, and the other half's events waited. */
static void test_group_change_during_rebalance(void **state)
{
    static const char *const sent[] = {
        "LISTEN,floor-check", "join", "members", "lock", "members", NULL};
    static const int two[] = {0, 1}, one[] = {0};
    start("2", "1", "60000");
    T.members = "1";
    bring_up(1); /* session 0 is down: session 1 claims in its place */
    fake_pg_up(PG(0));
    answer(0); /* LISTEN: session 1 rests from now on */
    answer(0); /* join */
    T.members = "0,1";
    /* Its members look is out; it is answered below with the group before session 1 left. */
    assert_non_null(fake_pg_pending(PG(0)));
    answer_claim(1, "");
    while (S(1)->lanes.slot >= 0) {
        assert_non_null(fake_pg_pending(PG(1)));
        answer(1); /* ending its claim, then unlock and leave */
    }
    answer(0); /* members: "0,1", as the statement saw it */
    assert_string_equal(pending_param(0, "lock"), lanes_of(two, 2, 0));
    T.members = "0";
    answer(0); /* lock: the group changed meanwhile, so it looks again before claiming */
    expect_sent(0, sent);
    answer(0); /* members: alone now, so it takes session 1's half too */
    assert_string_equal(pending_param(0, "lock"), lanes_of(two, 2, 1));
    answer(0);
    assert_string_equal(field(pending_param(0, "claim"), 1), lanes_of(one, 1, 0));
}

/* Answers both sessions until neither has a request out. */
static void drain_both(void)
{
    while (fake_pg_pending(PG(0)) || fake_pg_pending(PG(1))) {
        if (fake_pg_pending(PG(0)))
            answer(0);
        if (fake_pg_pending(PG(1)))
            answer(1);
    }
}

/* Session 1 came up first and claims in session 0's place; it is asleep, with nothing to do,
 * when session 0's connection comes up. From then on it rests: it gives its lanes up at once,
 * not at its next event (a notification, the poll or rebalance timer) while session 0 joins
 * beside it and takes only half of the lanes. */
static void test_rests_when_lower_session_connects(void **state)
{
    static const char *const rests_sent[] = {"unlock,leave", "wake", NULL};
    static const int one[] = {0};
    start("2", "1", "60000");
    T.members = "1";
    bring_up(1); /* session 0 is down: session 1 claims in its place */
    while (fake_pg_pending(PG(1)))
        answer(1); /* nothing to claim: to sleep, its final claim */
    forget(1);
    fake_pg_up(PG(0)); /* session 1 rests from now on */
    assert_non_null(fake_pg_pending(PG(1)));
    answer(1); /* unlock, leave */
    answer(1); /* a guard with no lanes lets the wakeup lock go */
    expect_sent(1, rests_sent);
    expect_idle_pg(1);
    T.members = "0";
    answer(0); /* LISTEN */
    answer(0); /* join */
    answer(0); /* members: alone, so it takes every lane */
    assert_string_equal(pending_param(0, "lock"), lanes_of(one, 1, 0));
}

/* A session's connection goes and comes back: its join after the reconnect is a change of the
 * group as much as its first one, and the other session re-divides at once, not at its next
 * --rebalance-interval (keeping the lanes of both sessions until then), though the number of
 * members is the one the session saw before it went. */
/* A guard's connection is lost while its server process may live on with the wakeup lock (a
 * network cut): that process would free the lock later without a notification, and sessions
 * asleep would wait for their poll timer. After the reconnect the session ends exactly it and
 * notifies, once, before anything else; a failure of that is said and the session goes on (no
 * reset: the old behaviour). A connection lost while the request is out keeps it due; the loss of
 * a session that did not guard sends none. */
static void test_lost_guard_ended_after_reconnect(void **state)
{
    static const char *const once[] = {"join", "members", "lock", CLAIM, NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "");
    answer(0);           /* "guard" */
    answer_claim(0, ""); /* the final claim */
    answer(0);           /* COMMIT: asleep as the guard */
    int guard = fake_pg_backend_pid(PG(0));
    fake_pg_drop(PG(0), "cut");
    forget(0);
    fake_pg_up(PG(0));
    answer(0); /* LISTEN */
    char want[64];
    snprintf(want, sizeof(want), "%d|2026-11-28 18:00:00.%06d|t|0|{}", guard, guard);
    assert_string_equal(pending_param(0, "end-lost-guard"), want);
    fake_pg_drop(PG(0), "cut again while ending it"); /* still due: the first process */
    forget(0);
    fake_pg_up(PG(0));
    answer(0); /* LISTEN */
    assert_string_equal(pending_param(0, "end-lost-guard"), want);
    int resets = fake_pg_resets(PG(0));
    forget(0);
    answer_failing(0, "end-lost-guard", "42501"); /* not allowed: said, and on as before */
    assert_int_equal(fake_pg_resets(PG(0)), resets);
    answer(0); /* join */
    answer(0); /* members */
    answer(0); /* lock */
    expect_sent(0, once);
    /* Awake, claiming: a loss now is no guard's, but its lanes'. */
    fake_pg_drop(PG(0), "cut while awake");
    forget(0);
    bring_up_lost(0, "f");
}

/* A claim session's connection is lost while its server process may live on with its member slot
 * and lanes (a network cut the server has not noticed): the reconnected session would join with
 * another slot beside it, and the lanes' rows would wait until the server ends it (up to
 * --session-timeout). After the reconnect, before its first look at the lanes, the session ends
 * exactly that process, while it holds the slot the session held (-1: any slot, a request to join
 * was out), and notifies no one (it did not guard); a session that held no slot ends nothing. */
static void test_lost_lanes_ended_after_reconnect(void **state)
{
    start("1", "1", "60000");
    T.members = "0";
    bring_up(0);
    int lost = fake_pg_backend_pid(PG(0));
    fake_pg_drop(PG(0), "cut while claiming");
    forget(0);
    fake_pg_up(PG(0));
    answer(0); /* LISTEN */
    char want[64];
    snprintf(want, sizeof(want), "%d|2026-11-28 18:00:00.%06d|f|0", lost, lost);
    const char *params = pending_param(0, "end-lost-guard");
    if (strncmp(params, want, strlen(want)) != 0)
        fail_msg("ending the lost process: \"%s\", not \"%s...\"", params, want);
    answer(0);                                  /* ended */
    answer(0);                                  /* join */
    fake_pg_drop(PG(0), "cut during the look"); /* a member, its slot known */
    forget(0);
    bring_up_lost(0, "f");
    forget(0);
    fake_pg_drop(PG(0), "cut again");
    fake_pg_up(PG(0));
    answer(0); /* LISTEN */
    answer(0); /* ended */
    lost = fake_pg_backend_pid(PG(0));
    fake_pg_drop(PG(0), "cut during the join"); /* which slot, if any, is unknown */
    forget(0);
    fake_pg_up(PG(0));
    answer(0); /* LISTEN */
    snprintf(want, sizeof(want), "%d|2026-11-28 18:00:00.%06d|f|-1", lost, lost);
    params = pending_param(0, "end-lost-guard");
    if (strncmp(params, want, strlen(want)) != 0)
        fail_msg("ending the lost process: \"%s\", not \"%s...\"", params, want);
}

/* Behind a pooler (pool_mode = session) the lost process may serve another session of this
 * relay by now, which took the lowest free slot: often the very one the lost session held. The
 * ending spares the server processes of the relay's sessions that are up ($5), and only those:
 * a session down still names its own lost process, which may be the one to end. */
static void test_lost_process_spares_own_sessions(void **state)
{
    start("2", "2", "60000");
    bring_up(0);
    T.members = "0,1";
    fake_pg_up(PG(1));
    drain_both();
    int lost = fake_pg_backend_pid(PG(1));
    fake_pg_drop(PG(1), "cut while it was a member");
    T.members = "0";
    drain_both();
    fake_pg_up(PG(1));
    answer(1); /* LISTEN */
    char want[96], spared[32];
    snprintf(want, sizeof(want), "%d|2026-11-28 18:00:00.%06d|", lost, lost);
    snprintf(spared, sizeof(spared), "|1|{%d}", fake_pg_backend_pid(PG(0)));
    const char *params = pending_param(1, "end-lost-guard");
    if (strncmp(params, want, strlen(want)) != 0 || !strstr(params, spared))
        fail_msg("ending the lost process: \"%s\", not \"%s...%s\"", params, want, spared);
    T.members = "0,1";
    drain_both();
    fake_pg_drop(PG(0), "cut");
    fake_pg_drop(PG(1), "cut");
    fake_pg_up(PG(1));
    answer(1); /* LISTEN */
    params = pending_param(1, "end-lost-guard");
    if (!strstr(params, "|{}"))
        fail_msg("ending the lost process with session 0 down: \"%s\", none spared", params);
}

static void test_rejoin_after_reconnect(void **state)
{
    static const char *const redivides_sent[] = {"members", NULL};
    start("2", "2", "60000");
    bring_up(0);
    T.members = "0,1";
    fake_pg_up(PG(1));
    drain_both(); /* session 1 joins, session 0 re-divides; both go to sleep */
    fake_pg_drop(PG(1), "connection reset by peer");
    T.members = "0";
    drain_both(); /* session 0 takes every lane */
    forget(0);
    T.members = "0,1";
    fake_pg_up(PG(1));
    answer(1); /* LISTEN */
    answer(1); /* it slept as a guard: its lost process is ended first */
    answer(1); /* join */
    answer(1); /* members */
    answer(1); /* lock: session 1 is a member with lanes again */
    expect_sent(0, redivides_sent);
}

/* Between two looks, another relay leaves the group and a third joins: the number of members is
 * the same, but not the members, and so not the lanes each should own. The session whose look
 * sees it tells the other to re-divide at once, not at its next --rebalance-interval. */
static void test_members_replaced_between_looks(void **state)
{
    static const char *const redivides_sent[] = {"members", NULL};
    start("2", "2", "60000");
    T.members = "0,1,3"; /* slot 3: another relay */
    bring_up(0);
    fake_pg_up(PG(1));
    drain_both();
    forget(1);
    T.members = "0,1,4"; /* slot 3 left, slot 4 joined */
    fire(&S(0)->rebalance_timer);
    answer(0); /* members */
    answer(0); /* lock and unlock: slot 4's share is not slot 3's */
    expect_sent(1, redivides_sent);
}

/* The relay's Kafka is cut off while another relay's is not: after --kafka-away-after (2)
 * delivery timeouts the session marks its slot away at its next look and gives every lane up to
 * the member that is not away (slot 1). When that member is away too (every relay's Kafka down),
 * the lanes are divided among all again: the session takes its share back. */
static void test_away_relay_gives_lanes_to_peers(void **state)
{
    static const char *const away_sent[] = {"mark,members", "unlock", "wake", NULL};
    static const char *const all_away_sent[] = {"members", "lock", CLAIM, NULL};
    start("1", "1", "60000");
    T.members = "0,1"; /* slot 1: another relay */
    bring_up(0);
    while (fake_pg_pending(PG(0)))
        answer(0); /* the claim finds nothing */
    forget(0);
    relay_kafka_timed_out(T.r);
    assert_false(T.r->kafka_away); /* one timeout is not a streak */
    relay_kafka_timed_out(T.r);
    assert_true(T.r->kafka_away);
    T.away = "0";
    fire(&S(0)->rebalance_timer);
    answer(0); /* mark (away), members */
    answer(0); /* unlock: every lane goes to slot 1 */
    answer(0); /* the guard, with no lanes, gives the wakeup lock up */
    expect_sent(0, away_sent);
    assert_int_equal(S(0)->lanes.n_owned, 0);
    assert_int_equal(S(0)->lanes.mark, LANE_MARK_AWAY);
    forget(0);
    T.away = "0,1";
    fire(&S(0)->rebalance_timer);
    answer(0); /* members */
    answer(0); /* lock: its share, as if none were away; it claims */
    expect_sent(0, all_away_sent);
    assert_true(S(0)->lanes.n_owned > 0 && S(0)->lanes.n_owned < LANE_COUNT);
}

static void capture_log(LogLevel level);
static const char *logged(void);
static int occurrences(const char *text, const char *what);

/* Another session (a squatter: any login may take advisory locks) holds the away mark this
 * relay's session wants: the try answers false, and the relay reads as healthy to the others and
 * keeps its lanes. Its own log says so, naming the holder, once while the refusal lasts (not at
 * every look); the mark taken at last, a later refusal is said again. On the old code the
 * refusal was silent. */
static void test_refused_mark_warned_once(void **state)
{
    start("1", "1", "60000");
    T.members = "0,1";
    bring_up(0);
    while (fake_pg_pending(PG(0)))
        answer(0);
    relay_kafka_timed_out(T.r);
    relay_kafka_timed_out(T.r);
    assert_true(T.r->kafka_away);
    T.mark_holder = "4242";
    capture_log(LOG_WARN);
    for (int look = 0; look < 3; look++) {
        fire(&S(0)->rebalance_timer);
        while (fake_pg_pending(PG(0)))
            answer(0);
        assert_int_equal(S(0)->lanes.mark, LANE_MARK_NONE); /* refused each time */
    }
    const char *text = logged();
    if (occurrences(text, "lane mark refused") != 1)
        fail_msg("three refused looks, want one warning: %s", text);
    assert_non_null(strstr(text, "holder_pid=4242"));
    assert_non_null(strstr(text, "mark=away"));
    T.mark_holder = NULL; /* the squatter lets go: the next look takes the mark */
    T.away = "0";
    fire(&S(0)->rebalance_timer);
    while (fake_pg_pending(PG(0)))
        answer(0);
    assert_int_equal(S(0)->lanes.mark, LANE_MARK_AWAY);
}

/* An away relay's trial, and the trial's failure, switch the session's mark lock between away
 * (key: the slot) and trying (the slot + 1024). The new mark is taken before the old one goes, in
 * the look's pipeline: with the old one dropped first, another session's look between the two
 * statements saw the member healthy (neither mark), and moved lanes for one interval. */
static void test_away_trying_switch_takes_new_mark_first(void **state)
{
    static const char *const switch_sent[] = {"mark,unmark,members", "lock", CLAIM, NULL};
    start("1", "1", "60000");
    T.members = "0,1"; /* slot 1: another relay */
    bring_up(0);
    while (fake_pg_pending(PG(0)))
        answer(0); /* the claim finds nothing */
    relay_kafka_timed_out(T.r);
    relay_kafka_timed_out(T.r);
    T.away = "0";
    fire(&S(0)->rebalance_timer);
    while (fake_pg_pending(PG(0)))
        answer(0); /* away: every lane to slot 1 */
    assert_int_equal(S(0)->lanes.mark, LANE_MARK_AWAY);
    forget(0);
    T.away = NULL;
    fire(&T.r->away_timer); /* the trial: trying */
    if (strcmp(pending_param(0, "mark"), "1024") != 0 || strcmp(pending_param(0, "unmark"), "0"))
        fail_msg("the trial takes mark %s and gives %s up, not 1024 and 0",
                 pending_param(0, "mark"), pending_param(0, "unmark"));
    answer(0); /* mark, unmark, members */
    answer(0); /* lock: its share */
    expect_sent(0, switch_sent);
    assert_int_equal(S(0)->lanes.mark, LANE_MARK_TRYING);
    assert_true(S(0)->lanes.n_owned > 0);
    relay_kafka_timed_out(T.r); /* the trial failed: away again */
    assert_true(T.r->kafka_away);
    T.away = "0";
    for (int k = 0; k < 4 && !*pending_param(0, "mark"); k++)
        answer(0); /* its claim, found empty; then the look the new state asks for */
    forget(0);
    if (strcmp(pending_param(0, "mark"), "0") != 0 || strcmp(pending_param(0, "unmark"), "1024"))
        fail_msg("the failed trial takes mark %s and gives %s up, not 0 and 1024",
                 pending_param(0, "mark"), pending_param(0, "unmark"));
    answer(0);
    assert_int_equal(S(0)->lanes.mark, LANE_MARK_AWAY);
    while (fake_pg_pending(PG(0)))
        answer(0);
    static const char *const back_sent[] = {"unlock", "wake", NULL};
    expect_sent(0, back_sent);
    assert_int_equal(S(0)->lanes.n_owned, 0);
}

/* Both sessions' batches are out when Kafka stops answering: session 0's delivery timeout
 * cancels both (one purge), and session 1's own timer ends before its cancelled reports are in
 * (a request partly written when the purge came is reported only later: relay.c). One cut, one
 * timeout of the streak: with --kafka-away-after 2 the relay is not away yet; the next batch
 * that times out is the second, and sends it away. */
static void test_one_purge_counts_one_timeout(void **state)
{
    start("2", "2", "60000");
    T.members = "0,1";
    bring_up(0);
    bring_up(1);
    answer_claim(0, "A");
    answer_claim(1, "B");
    fire(&S(0)->delivery_timer);
    assert_int_equal(fake_kafka_purges(), 1);
    fire(&S(1)->delivery_timer); /* its cancelled reports are not in yet */
    if (T.r->kafka_timeouts != 1 || T.r->kafka_away)
        fail_msg("one purge counted %d timeouts%s", T.r->kafka_timeouts,
                 T.r->kafka_away ? ", and the relay went away" : "");
    fake_kafka_deliver_purged();
    assert_false(T.r->purging);
    for (int i = 0; i < 2; i++)
        while (fake_pg_pending(PG(i)))
            answer(i); /* the failures recorded */
    fire(&S(0)->retry_timer);
    answer_claim(0, "A");
    fire(&S(0)->delivery_timer);
    assert_int_equal(T.r->kafka_timeouts, 2);
    assert_true(T.r->kafka_away);
}

/* Every relay's Kafka down: the away relay keeps its lanes, and its backoff ends again and again
 * with nothing to try. Then the other relay's Kafka answers first (slot 1 is healthy again): the
 * session gives its lanes up, and its trial comes after the first delay (2 x --delivery-timeout),
 * not after one grown by every end it met holding lanes (up to 10 min), while its own Kafka may
 * answer as well. */
static void test_away_relay_tries_soon_after_an_outage_for_everyone(void **state)
{
    extra_args[0] = "--delivery-timeout"; /* a first delay of 20 s, below the 10 min cap */
    extra_args[1] = "10000";
    start("1", "1", "60000");
    T.members = "0,1"; /* slot 1: another relay */
    bring_up(0);
    while (fake_pg_pending(PG(0)))
        answer(0); /* the claim finds nothing */
    relay_kafka_timed_out(T.r);
    relay_kafka_timed_out(T.r);
    assert_true(T.r->kafka_away);
    T.away = "0,1"; /* every relay away: it keeps its share */
    fire(&S(0)->rebalance_timer);
    while (fake_pg_pending(PG(0)))
        answer(0);
    int share = S(0)->lanes.n_owned;
    assert_true(share > 0 && share < LANE_COUNT);
    for (int i = 0; i < 4; i++) {
        fire(&T.r->away_timer); /* lanes held: no trial */
        assert_true(T.r->kafka_away);
        assert_int_equal(S(0)->lanes.n_owned, share);
    }
    T.away = "0"; /* the other relay's Kafka answers */
    fire(&S(0)->rebalance_timer);
    while (fake_pg_pending(PG(0)))
        answer(0);
    assert_int_equal(S(0)->lanes.n_owned, 0);
    double first = 2.0 * (double)T.cfg.delivery_timeout_ms / 1000.0;
    double trial_in = ev_timer_remaining(T.loop, &T.r->away_timer);
    if (!ev_is_active(&T.r->away_timer) || trial_in > first)
        fail_msg("the trial comes in %.1f s, not within the first delay (%.1f s)", trial_in, first);
    fire(&T.r->away_timer);
    assert_false(T.r->kafka_away);
    assert_int_equal(relay_lane_mark(T.r), LANE_MARK_TRYING);
}

/* The rebalance timer ticks while the session's look at the group is out (a look as slow as
 * --rebalance-interval: a remote or loaded server, or an interval of 100 ms): that look is the
 * interval's, and the next claim follows it. Were the tick to bring another look at once, every
 * look would have one behind it, and the session would never claim again. */
static void test_rebalance_tick_during_look(void **state)
{
    static const char *const sent[] = {"mark-plan,mark-sent,COMMIT", "members", CLAIM, NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A");
    fire(&S(0)->rebalance_timer); /* a look before the next claim */
    fake_kafka_report_all(OK);
    answer(0); /* the marks; the look goes out */
    fire(&S(0)->rebalance_timer);
    answer(0); /* members: nothing changed */
    expect_sent(0, sent);
}

/* The marks fail with a row's own fault (22P02): the batch is rolled back and recorded row by
 * row, the refused row as a failure, the others as sent. */
static void test_row_by_row_after_row_fault(void **state)
{
    static const char *const phases[] = {
        "producing",     "marking",       "rolling back", "recording row", "recording row",
        "recording row", "recording row", "idle",         "claiming",      NULL};
    static const char *const sent[] = {
        "mark-plan,mark-sent,COMMIT",   "ROLLBACK",  "mark-sent", "mark-sent",
        "failures-durable,mark-failed", "mark-sent", CLAIM,       NULL};
    start("1", "1", "60000");
    bring_up(0);
    marks_fail("22P02");
    assert_string_equal(pending_param(0, "mark-sent"), "{1}");
    answer(0);
    assert_string_equal(pending_param(0, "mark-sent"), "{2}");
    answer_failing(0, "mark-sent", "22P02"); /* this row refuses */
    assert_string_equal(field(pending_param(0, "mark-failed"), 0), "{2}");
    answer(0);
    assert_string_equal(pending_param(0, "mark-sent"), "{3}");
    answer(0);
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* The same when the marks rode with the next claim: their failure is seen, not taken as
 * recorded. */
static void test_row_by_row_after_chained_marks(void **state)
{
    static const char *const phases[] = {"producing",     "marking and claiming",
                                         "rolling back",  "recording row",
                                         "recording row", "idle",
                                         "claiming",      NULL};
    static const char *const sent[] = {
        "mark-plan,mark-sent,COMMIT," CLAIM, "ROLLBACK", "mark-sent", "mark-sent", CLAIM, NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B");
    fake_kafka_report_all(OK);
    answer_failing(0, "mark-sent", "23514");
    answer(0); /* ROLLBACK */
    answer(0);
    answer(0);
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* Recorded row by row, only the rows whose record went through count as sent: a row whose
 * record failed for a passing reason (40001) goes out again, and so do the rows left when the
 * relay stops in the middle; they count when they are recorded. */
static void test_row_by_row_counts_recorded_rows(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    marks_fail("22P02");
    answer(0);                               /* row 1 recorded */
    answer_failing(0, "mark-sent", "40001"); /* row 2 not */
    answer(0);                               /* row 3 recorded */
    assert_int_equal(S(0)->total_sent, 2);
    expect_idle_pg(0); /* the retry backoff: row 2 goes out again after it */
    fire(&S(0)->retry_timer);
    marks_fail("22P02");
    sigterm();
    answer(0); /* row 1 recorded; the relay stops before the others */
    expect_idle_pg(0);
    assert_int_equal(S(0)->total_sent, 3);
}

/* The connection goes while a batch is recorded row by row: the rows recorded so far are in (each
 * in a transaction of its own) and count; the row in flight and the rest go out again. */
static void test_row_by_row_lost_counts_recorded(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    marks_fail("22P02");
    answer(0); /* row 1 recorded; row 2's record is out */
    fake_pg_drop(PG(0), "connection reset by peer");
    assert_int_equal(S(0)->total_sent, 1);
}

/* The table refuses the sent mark of every row Kafka acknowledged (a trigger): recorded row by
 * row as failures, the batch is followed by the retry backoff, as the rows behind it would meet
 * the same refusal; without it each batch would be published, refused and recorded again at
 * full speed. */
static void test_every_sent_mark_refused_backs_off(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    marks_fail("23514");
    for (int row = 0; row < 3; row++) {
        answer_failing(0, "mark-sent", "23514"); /* refused: the row becomes a failure */
        answer(0);                               /* ...recorded as one */
    }
    expect_idle_pg(0);
    assert_true(ev_is_active(&S(0)->retry_timer));
    assert_int_equal(S(0)->total_failed, 3);
}

/* Every row of a batch failed for good (too large for the broker) and the marks were refused by
 * a row: recorded row by row as failures, the rows behind them are claimed at once, not after
 * the retry backoff, which is for a Kafka that may come back. */
static void test_permanent_failures_by_row_no_backoff(void **state)
{
    static const char *const sent[] = {"mark-plan-failures,mark-failed,COMMIT",
                                       "ROLLBACK",
                                       "failures-durable,mark-failed",
                                       "failures-durable,mark-failed",
                                       "failures-durable,mark-failed",
                                       CLAIM,
                                       NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B,C");
    forget(0);
    fake_kafka_report_all(RD_KAFKA_RESP_ERR_INVALID_RECORD);
    answer_failing(0, "mark-failed", "23514");
    answer(0); /* ROLLBACK */
    answer(0);
    answer(0);
    answer(0);
    expect_sent(0, sent);
    assert_false(ev_is_active(&S(0)->retry_timer));
    assert_int_equal(S(0)->total_failed, 3);
}

/* Session 0 claims A,B,C, Kafka acknowledges them, and the marks fail for a passing reason
 * (40001): rolled back, the batch is sent again after the retry backoff (fired here). */
static void marks_fail_passingly(void)
{
    marks_fail("40001");
    expect_idle_pg(0); /* the retry backoff */
    fire(&S(0)->retry_timer);
}

/* A batch whose marks were rolled back is not counted (sent, committed): its rows go out again
 * and count then, once. */
static void test_rolled_back_batch_not_counted(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    marks_fail_passingly();
    assert_int_equal(S(0)->total_sent, 0);
    answer_claim(0, "A,B,C");
    fake_kafka_report_all(OK);
    answer(0); /* the marks go through */
    assert_int_equal(S(0)->total_sent, 3);
}

/* The marks fail for a passing reason (40001): the batch is rolled back and sent again after
 * the retry backoff, twice; the third time in a row, it is recorded row by row. */
static void test_transient_mark_failures(void **state)
{
    static const char *const retried[] = {"producing", "marking",  "rolling back",
                                          "idle",      "claiming", NULL};
    static const char *const retried_sent[] = {"mark-plan,mark-sent,COMMIT", "ROLLBACK", CLAIM,
                                               NULL};
    static const char *const by_row[] = {"producing",     "marking",       "rolling back",
                                         "recording row", "recording row", "recording row",
                                         "idle",          "claiming",      NULL};
    static const char *const by_row_sent[] = {"mark-plan,mark-sent,COMMIT",
                                              "ROLLBACK",
                                              "mark-sent",
                                              "mark-sent",
                                              "mark-sent",
                                              CLAIM,
                                              NULL};
    start("1", "1", "60000");
    bring_up(0);
    for (int round = 0; round < 2; round++) {
        marks_fail_passingly();
        expect_phases(0, retried);
        expect_sent(0, retried_sent);
    }
    marks_fail("40001");
    answer(0);
    answer(0);
    answer(0);
    expect_phases(0, by_row);
    expect_sent(0, by_row_sent);
}

/* A claim fails for a passing reason (57014, a statement timeout): the session rolls back and
 * waits out the retry backoff; a notification meanwhile (work for everyone) sends nothing, the
 * retry timer brings the next claim. */
static void test_claim_failure_waits_for_backoff(void **state)
{
    static const char *const phases[] = {"ending", "idle", "claiming", NULL};
    static const char *const sent[] = {"ROLLBACK", CLAIM, NULL};
    start("1", "1", "60000");
    bring_up(0);
    answer_failing(0, "claim", "57014");
    answer(0); /* ROLLBACK */
    expect_idle_pg(0);
    fake_pg_notify(PG(0), WAKEUP_CHANNEL, "");
    expect_idle_pg(0);       /* the backoff runs: no claim before it ends */
    fire(&S(0)->poll_timer); /* nor the poll timer */
    expect_idle_pg(0);
    fire(&S(0)->retry_timer);
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* Claims that fail for a passing reason grow the retry backoff (six in a row: up to 30 s); a
 * claim that then goes through and finds nothing is the end of that fault, as a batch recorded
 * is: a later passing failure, here after the session slept and was woken, waits the base
 * backoff again (half a second), not the grown one. Before, only a batch recorded reset it, so
 * on a quiet outbox the next failure, hours later, waited 15-30 s. */
static void test_empty_claim_resets_claim_backoff(void **state)
{
    start("1", "1", "0");
    bring_up(0);
    for (int k = 0; k < 6; k++) {
        answer_failing(0, "claim", "57014");
        answer(0); /* ROLLBACK */
        expect_idle_pg(0);
        fire(&S(0)->retry_timer);
    }
    assert_int_equal(S(0)->retry.failures, 6);
    answer_claim(0, ""); /* it works again: nothing to claim, to sleep */
    answer(0);           /* "guard": the final claim follows */
    answer_claim(0, ""); /* asleep */
    answer(0);
    expect_idle_pg(0);
    fake_pg_notify(PG(0), WAKEUP_CHANNEL, "");
    answer(0); /* the guard left: it claims */
    answer_failing(0, "claim", "57014");
    answer(0); /* ROLLBACK */
    assert_int_equal(S(0)->retry.failures, 1);
    assert_true(ev_timer_remaining(T.loop, &S(0)->retry_timer) <= 0.5);
}

/* A claim fails for a reason of the setup (42501, no privilege): the session gives its lanes
 * up, the relay is not ready, and after each retry backoff it probes with a claim of no lanes;
 * once one goes through it joins again and claims. */
static void test_setup_fault(void **state)
{
    static const char *const phases[] = {
        "ending",   "idle",   "leaving lanes", "idle",        "claiming", "ending",   "idle",
        "claiming", "ending", "idle",          "rebalancing", "idle",     "claiming", NULL};
    static const char *const sent[] = {"ROLLBACK",
                                       "unlock,leave",
                                       "BEGIN,claim-plan,claim,mark-sent,members,callable",
                                       "ROLLBACK",
                                       "BEGIN,claim-plan,claim,mark-sent,members,callable",
                                       "COMMIT",
                                       "join",
                                       "members",
                                       "lock",
                                       CLAIM,
                                       NULL};
    RelayStatus st;
    start("1", "1", "60000");
    bring_up(0);
    answer_failing(0, "claim", "42501");
    answer(0); /* ROLLBACK */
    answer(0); /* unlock, leave */
    relay_status(T.r, &st);
    assert_int_equal(st.lanes_owned, 0);
    assert_true(st.setup_error[0] != '\0');
    expect_idle_pg(0); /* until the retry backoff */
    fire(&S(0)->retry_timer);
    assert_string_equal(field(pending_param(0, "claim"), 1), "{}"); /* a probe: no lanes */
    answer_failing(0, "claim", "42501");
    answer(0); /* ROLLBACK */
    fire(&S(0)->retry_timer);
    answer(0); /* the probe goes through: fixed */
    answer(0); /* COMMIT */
    answer(0); /* join */
    answer(0); /* members */
    answer(0); /* lock */
    relay_status(T.r, &st);
    assert_string_equal(st.setup_error, "");
    assert_int_equal(st.lanes_owned, LANE_COUNT);
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* The look at the lane group fails for a reason of the setup (42501: the role may not read
 * pg_locks): the session resets its connection once (which lanes it holds is uncertain), is in a
 * setup fault (not ready, no lanes) and probes after its retry backoff, the probe reading the
 * group too; no look, no reconnect until a probe goes through, then it joins and claims. The old
 * driver reset the connection and looked again at once, every time. */
static void test_lane_look_setup_fault(void **state)
{
    RelayStatus st;
    start("1", "1", "60000");
    fake_pg_up(PG(0));
    answer(0); /* LISTEN */
    answer(0); /* join */
    int resets = fake_pg_resets(PG(0));
    answer_failing(0, "members", "42501");
    assert_int_equal(fake_pg_resets(PG(0)), resets + 1);
    relay_status(T.r, &st);
    assert_true(st.setup_error[0] != '\0');
    assert_int_equal(st.lanes_owned, 0);
    fake_pg_up(PG(0));
    answer(0);         /* LISTEN */
    answer(0);         /* its lost process ended (it held a member slot) */
    expect_idle_pg(0); /* no look until the retry backoff */
    fire(&S(0)->retry_timer);
    assert_string_equal(field(pending_param(0, "claim"), 1), "{}"); /* a probe: no lanes */
    answer_failing(0, "members", "42501"); /* the probe's look fails the same way */
    answer(0);                             /* ROLLBACK */
    assert_int_equal(fake_pg_resets(PG(0)), resets + 1);
    expect_idle_pg(0);
    fire(&S(0)->retry_timer);
    answer(0); /* the probe goes through: fixed */
    answer(0); /* COMMIT */
    answer(0); /* join */
    answer(0); /* members */
    answer(0); /* lock */
    relay_status(T.r, &st);
    assert_string_equal(st.setup_error, "");
    assert_int_equal(st.lanes_owned, LANE_COUNT);
}

/* The join refused for a reason of the setup (42501: EXECUTE on pg_try_advisory_lock revoked
 * from PUBLIC): a setup fault, as for the look above, and the probe checks the lock functions too
 * (SQL_LANES_CALLABLE): while they stay refused the probe fails, and the session neither says
 * the setup is fixed nor joins or reconnects; once they are callable it joins. The old probe
 * passed (it read pg_locks only): "the setup is fixed", a join that failed, the fault said again
 * and a reconnect, after every retry backoff. */
static void test_lane_lock_function_setup_fault(void **state)
{
    RelayStatus st;
    start("1", "1", "60000");
    fake_pg_up(PG(0));
    answer(0); /* LISTEN */
    int resets = fake_pg_resets(PG(0));
    answer_failing(0, "join", "42501");
    assert_int_equal(fake_pg_resets(PG(0)), resets + 1);
    relay_status(T.r, &st);
    assert_true(st.setup_error[0] != '\0');
    assert_int_equal(st.lanes_owned, 0);
    fake_pg_up(PG(0));
    answer(0);         /* LISTEN */
    answer(0);         /* its lost process ended (it may have held a member slot) */
    expect_idle_pg(0); /* no join until the retry backoff */
    fire(&S(0)->retry_timer);
    assert_string_equal(field(pending_param(0, "claim"), 1), "{}"); /* a probe: no lanes */
    answer_failing(0, "callable", "42501"); /* the lock functions are still refused */
    answer(0);                              /* ROLLBACK */
    expect_idle_pg(0);                      /* no join */
    assert_int_equal(fake_pg_resets(PG(0)), resets + 1);
    relay_status(T.r, &st);
    assert_true(st.setup_error[0] != '\0');
    fire(&S(0)->retry_timer);
    answer(0); /* the probe goes through: fixed */
    answer(0); /* COMMIT */
    answer(0); /* join */
    answer(0); /* members */
    answer(0); /* lock */
    relay_status(T.r, &st);
    assert_string_equal(st.setup_error, "");
    assert_int_equal(st.lanes_owned, LANE_COUNT);
}

/* A setup fault's text is kept (for /readyz and STATUS=) cut to its buffer: a secret that
 * straddles the cut is scrubbed first, so no fragment of it is kept. */
static void test_setup_fault_scrubbed_before_cut(void **state)
{
    static const char secret[] = "s3cr3t-passw0rd-straddling";
    char text[512];
    RelayStatus st;
    /* The kept text starts "ERROR:  " (8 bytes, libpq's prefix): the secret starts 6 bytes
     * before the cut. */
    const size_t xs = sizeof(st.setup_error) - 8 - 6;
    memset(text, 'x', xs);
    snprintf(text + xs, sizeof(text) - xs, "%s and more", secret);
    start("1", "1", "60000");
    secrets_add(secret);
    bring_up(0);
    T.fail_msg = text;
    answer_failing(0, "claim", "42501");
    T.fail_msg = NULL;
    answer(0); /* ROLLBACK */
    answer(0); /* unlock, leave */
    relay_status(T.r, &st);
    assert_true(st.setup_error[0] != '\0');
    assert_null(strstr(st.setup_error, "s3cr"));
    assert_non_null(strstr(st.setup_error, "***"));
    secrets_clear();
}

/* --sessions 2 --min-sessions 1: the claiming session 0 hits a setup fault while session 1
 * rests. Session 1 takes its place at once (a relay must not deliver nothing while a session of
 * it could claim; the fault may be session 0's alone), while session 0 probes after each retry
 * backoff; once a probe goes through, session 1 rests again and session 0 takes every lane. */
static void test_lower_setup_fault_hands_over(void **state)
{
    static const char *const takes_over_sent[] = {"join", "members", "lock", CLAIM, NULL};
    static const char *const rests_sent[] = {"unlock,leave", "wake", NULL};
    static const int one[] = {0};
    start("2", "1", "60000");
    bring_up(0);
    fake_pg_up(PG(1));
    answer(1); /* LISTEN: it rests */
    expect_idle_pg(1);
    forget(1);
    answer_failing(0, "claim", "42501");
    answer(0); /* ROLLBACK */
    T.members = "1";
    answer(0);                               /* unlock, leave */
    assert_non_null(fake_pg_pending(PG(1))); /* session 1 takes session 0's place */
    answer(1);                               /* join */
    answer(1);                               /* members */
    answer(1);                               /* lock */
    expect_sent(1, takes_over_sent);
    assert_int_equal(S(1)->lanes.n_owned, LANE_COUNT);
    while (fake_pg_pending(PG(1)))
        answer(1); /* nothing to claim: asleep, its final claim */
    forget(1);
    expect_idle_pg(0); /* session 0 waits for its retry backoff */
    fire(&S(0)->retry_timer);
    assert_string_equal(field(pending_param(0, "claim"), 1), "{}"); /* a probe: no lanes */
    answer(0); /* the probe goes through: session 1 rests from now on */
    assert_non_null(fake_pg_pending(PG(1)));
    answer(1); /* unlock, leave */
    answer(1); /* a guard with no lanes lets the wakeup lock go */
    expect_sent(1, rests_sent);
    expect_idle_pg(1);
    T.members = "0";
    answer(0); /* COMMIT */
    answer(0); /* join */
    answer(0); /* members: alone, so it takes every lane */
    assert_string_equal(pending_param(0, "lock"), lanes_of(one, 1, 0));
}

/* --sessions 2 --min-sessions 1: session 0's connection goes while its batch is at the producer,
 * and session 1 takes its place. Session 0 reconnects while a report of its abandoned batch is
 * still out: it cannot claim until that report is in, so session 1 goes on claiming meanwhile,
 * and rests only once session 0 can claim again. */
static void test_stand_in_works_while_batch_abandoned(void **state)
{
    static const char *const rests_sent[] = {"unlock,leave", "wake", NULL};
    static const char *const redivides_sent[] = {"members", NULL};
    static const int one[] = {0};
    start("2", "1", "60000");
    bring_up(0);
    fake_pg_up(PG(1));
    answer(1); /* LISTEN: it rests */
    answer_claim(0, "A,B");
    fake_kafka_report(0, OK);
    fake_pg_drop(PG(0), "connection reset by peer");
    T.members = "1";
    while (fake_pg_pending(PG(1)))
        answer(1); /* session 1 joins, claims nothing, goes to sleep */
    assert_int_equal(S(1)->lanes.n_owned, LANE_COUNT);
    forget(1);
    fake_pg_up(PG(0));
    answer(0);                      /* LISTEN */
    answer(0);                      /* its lost process ended at once, whatever the batch */
    expect_sent(1, redivides_sent); /* the others take its lanes now, not at their interval */
    answer(1);                      /* members: session 1 alone */
    expect_idle_pg(0);              /* a report is still out: no lanes, no claim */
    expect_idle_pg(1);              /* session 1 keeps its lanes and claims on */
    assert_int_equal(S(1)->lanes.n_owned, LANE_COUNT);
    fake_kafka_report(1, RD_KAFKA_RESP_ERR__PURGE_QUEUE); /* session 0 can claim again */
    T.members = "0";
    assert_non_null(fake_pg_pending(PG(1)));
    answer(1); /* unlock, leave */
    answer(1); /* a guard with no lanes lets the wakeup lock go */
    expect_sent(1, rests_sent);
    answer(0); /* join */
    answer(0); /* members: alone, so it takes every lane */
    assert_string_equal(pending_param(0, "lock"), lanes_of(one, 1, 0));
}

/* A session asleep (as guard, its final claim done) claims at its poll timer, and that claim's
 * floor look finds the table replaced (TRUNCATE ... RESTART IDENTITY): the floor starts again
 * from 0, but the claim itself read from the old floor, above the new rows, which were committed
 * before and bring no notification. The session claims again at once, from the table's start,
 * not at its next poll. (The floor is turned on by hand: the fake database has no floor check.) */
static void test_claim_again_after_floor_restart(void **state)
{
    static const char *const again_sent[] = {
        "BEGIN,claim-plan,floor-held,claim,claim-recheck,floor-writers", "COMMIT", CLAIM, NULL};
    start("1", "1", "60000");
    bring_up(0);
    S(0)->floor.enabled = true;
    while (fake_pg_pending(PG(0)))
        answer(0); /* nothing to claim: asleep as guard, its final claim (and first look) done */
    assert_true(S(0)->wake.asleep && S(0)->wake.guard);
    assert_int_equal(S(0)->floor.restarts, 0);
    forget(0);
    T.table_node = "6"; /* the table was truncated meanwhile */
    S(0)->floor_look_due = 0;
    fire(&S(0)->poll_timer);
    answer(0); /* the claim, empty: its look restarts the floor */
    assert_int_equal(S(0)->floor.restarts, 1);
    answer(0); /* COMMIT */
    expect_sent(0, again_sent);
    assert_non_null(fake_pg_pending(PG(0))); /* the claim from the table's start */
}

/* An event the producer refuses (too large) fails, and holds the later events of its aggregate
 * in the batch back (not produced, nothing recorded for them); other aggregates go on. */
static void test_refused_event_holds_its_aggregate(void **state)
{
    static const char *const phases[] = {"producing", "marking", "idle", "claiming", NULL};
    static const char *const sent[] = {"mark-plan-failures,mark-sent,mark-failed,COMMIT", CLAIM,
                                       NULL};
    start("1", "1", "60000");
    bring_up(0);
    fake_kafka_refuse_key("agg-A", RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
    answer_claim(0, "A,A,B"); /* rows 1, 2 of A, 3 of B */
    assert_int_equal(fake_kafka_count(), 1);
    assert_string_equal(fake_kafka_at(0)->key, "agg-B");
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{3}");
    assert_string_equal(field(pending_param(0, "mark-failed"), 0), "{1}");
    answer(0);
    expect_phases(0, phases);
    expect_sent(0, sent);
}

/* Two sessions claim; the producer fails fatally while session 0's batch is out and session 1's
 * claim is out, which then goes back (its ROLLBACK is the next request of session 1). */
static void producer_fails_under_a_claim(void)
{
    start("2", "2", "60000");
    T.members = "0,1";
    bring_up(0);
    bring_up(1);
    answer_claim(0, "A"); /* session 0's batch is out */
    fake_kafka_set_fatal(true);
    answer_claim(1, "B"); /* the producer failed: nothing of it is produced */
}

/* The producer fails fatally while session 0's batch is out and session 1's claim is out: its
 * rows go back. Session 1 may not claim until session 0's batch is done (the shared producer is
 * recreated only then, relay_producer_ready): it waits for the retry backoff, and each look
 * meanwhile (looks of them) finds the batch still out and grows the backoff (up to 30 s). Once
 * the last batch is done, session 1 claims at once (recreating the producer), not at the end of
 * that backoff. */
static void claims_once_producer_may_be_recreated(int looks, double backoff_at_least)
{
    producer_fails_under_a_claim();
    answer(1); /* ROLLBACK */
    for (int i = 0; i < looks; i++) {
        expect_idle_pg(1); /* the retry backoff */
        fire(&S(1)->retry_timer);
    }
    expect_idle_pg(1); /* session 0's batch is still out */
    assert_true(ev_timer_remaining(T.loop, &S(1)->retry_timer) >= backoff_at_least);
    fake_kafka_report_all(RD_KAFKA_RESP_ERR__FATAL);
    /* The marks, then the look session 1's join asked for. */
    while (fake_pg_pending(PG(0)))
        answer(0);
    assert_non_null(fake_pg_pending(PG(1))); /* the last batch is done: session 1 claims */
    assert_false(kafka_fatal(T.r->kafka));   /* on a new producer */
}

/* Session 0's batch is done before session 1's first retry. */
static void test_claims_once_producer_may_be_recreated(void **state)
{
    claims_once_producer_may_be_recreated(0, 0.25);
}

/* Session 0's batch is done after six more looks of session 1's: its backoff was at its cap by
 * then, 15-30 s. */
static void test_claims_once_producer_may_be_recreated_late(void **state)
{
    claims_once_producer_may_be_recreated(6, 15.0);
}

/* A session with a setup fault probes after each retry backoff; when its probe found the producer
 * failed with another session's batch out, the end of that batch does not bring the probe
 * forward: probes keep their pace, not one per batch of the other sessions. */
static void test_setup_probe_keeps_its_backoff(void **state)
{
    start("2", "2", "60000");
    T.members = "0,1";
    bring_up(0);
    bring_up(1);
    answer_claim(0, "A"); /* session 0's batch is out */
    answer_failing(1, "claim", "42501");
    answer(1); /* ROLLBACK */
    T.members = "0";
    answer(1); /* unlock, leave */
    fake_kafka_set_fatal(true);
    fire(&S(1)->retry_timer);
    expect_idle_pg(1); /* its probe waits: the producer cannot be recreated yet */
    fake_kafka_report_all(RD_KAFKA_RESP_ERR__FATAL);
    while (fake_pg_pending(PG(0)))
        answer(0); /* the marks, a look at the group */
    expect_idle_pg(1);
    assert_true(ev_timer_remaining(T.loop, &S(1)->retry_timer) >= 0.2);
}

/* As above, but session 0's batch is abandoned with its connection: its last report (served by
 * the failed producer, inside its poll) lets the batch go, and session 1, waiting on the
 * producer, claims. Its claim recreates the producer: not from inside that producer's own
 * delivery report (kafka_poll goes on polling it), but once the report is served. */
static void test_producer_recreated_outside_its_report(void **state)
{
    producer_fails_under_a_claim();
    answer(1); /* ROLLBACK: session 1 waits on the producer */
    T.members = "1";
    fake_pg_drop(PG(0), "connection reset by peer"); /* session 0's batch is abandoned */
    while (fake_pg_pending(PG(1)))
        answer(1);     /* session 1 takes session 0's lanes */
    expect_idle_pg(1); /* the retry backoff: session 0's batch is still out */
    fake_kafka_report_all(RD_KAFKA_RESP_ERR__FATAL); /* aborts if freed inside the report */
    settle();
    assert_non_null(fake_pg_pending(PG(1))); /* session 1 claims */
    assert_false(kafka_fatal(T.r->kafka));   /* on a new producer */
}

/* The producer is recreated after a fatal error, and the new one fails too before anything of it
 * is acknowledged (an InitProducerId the cluster refuses, say): the next recreation waits for its
 * own backoff, not for whichever claim comes next, so that a producer failing at its start is
 * not recreated by every claim; the session's retry backoff bounds the wait. An acknowledgement
 * from a recreated producer ends the run. */
static void test_failing_producer_recreated_at_a_pace(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    fake_kafka_set_fatal(true);
    answer_claim(0, "A"); /* the producer failed under the claim */
    answer(0);            /* ROLLBACK */
    fire(&S(0)->retry_timer);
    KafkaProducer *second = fake_kafka_current();
    assert_false(kafka_fatal(second)); /* recreated at once: the first failure */
    fake_kafka_set_fatal(true);        /* the new one fails at its start */
    answer_claim(0, "A");
    answer(0); /* ROLLBACK */
    fire(&S(0)->retry_timer);
    expect_idle_pg(0); /* no claim, no new producer: its recreation waits */
    assert_ptr_equal(fake_kafka_current(), second);
    assert_true(ev_is_active(&S(0)->retry_timer)); /* the session tries again later */
    T.r->recreate_after = monotime_now() - 1;      /* its backoff is over */
    fire(&S(0)->retry_timer);
    assert_ptr_not_equal(fake_kafka_current(), second);
    answer_claim(0, "A");
    fake_kafka_report_all(OK); /* this one works */
    assert_true(T.r->recreate_after == 0);
}

/* The failed producer is destroyed off the loop (rd_kafka_destroy may block while a broker thread
 * finishes a connection attempt or a name lookup): handed to kafka_producer_retire once all its
 * reports are in (the fake aborts otherwise), never kafka_producer_free'd while the relay runs.
 * While another old producer is still being destroyed, the recreation waits (one at a time, so
 * memory stays bounded) and comes with the session's retry. */
static void test_failed_producer_destroyed_off_the_loop(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    int freed = fake_kafka_freed(), retired = fake_kafka_retired();
    KafkaProducer *first = fake_kafka_current();
    fake_kafka_set_fatal(true);
    answer_claim(0, "A"); /* the producer failed under the claim */
    answer(0);            /* ROLLBACK */
    fake_kafka_set_retire_busy(true);
    fire(&S(0)->retry_timer);
    expect_idle_pg(0); /* no claim: the old producer is kept until it can be retired */
    assert_ptr_equal(fake_kafka_current(), first);
    assert_true(ev_is_active(&S(0)->retry_timer)); /* the session tries again later */
    fake_kafka_set_retire_busy(false);
    fire(&S(0)->retry_timer);
    assert_ptr_not_equal(fake_kafka_current(), first);
    assert_false(kafka_fatal(fake_kafka_current()));
    assert_int_equal(fake_kafka_retired(), retired + 1);
    assert_int_equal(fake_kafka_freed(), freed); /* none destroyed on the loop */
    answer_claim(0, "A");
    fake_kafka_report_all(OK);
}

/* librdkafka opens the TLS files in rd_kafka_new, on the loop: while one is not a regular file
 * (a FIFO swapped in since start-up, which it would wait on for a writer), the recreation is not
 * tried, the failed producer is kept (not retired), and the session tries again after its
 * backoff; the files back, the next try after the recreation's backoff recreates it. */
static void test_producer_not_recreated_over_a_fifo(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    int retired = fake_kafka_retired();
    KafkaProducer *first = fake_kafka_current();
    fake_kafka_set_fatal(true);
    answer_claim(0, "A"); /* the producer failed under the claim */
    answer(0);            /* ROLLBACK */
    fake_kafka_set_files_refused(true);
    fire(&S(0)->retry_timer);
    expect_idle_pg(0); /* no claim, and no rd_kafka_new that would open the FIFO */
    assert_ptr_equal(fake_kafka_current(), first);
    assert_int_equal(fake_kafka_retired(), retired);
    assert_true(ev_is_active(&S(0)->retry_timer)); /* the session tries again later */
    fake_kafka_set_files_refused(false);
    T.r->recreate_after = monotime_now() - 1; /* its backoff is over */
    fire(&S(0)->retry_timer);
    assert_ptr_not_equal(fake_kafka_current(), first);
    assert_int_equal(fake_kafka_retired(), retired + 1);
    answer_claim(0, "A");
    fake_kafka_report_all(OK);
}

/* A TLS file swapped for a FIFO after the recreation's check passed but before librdkafka is
 * handed it: the pinning (which opens each file without waiting) refuses it. That refusal comes
 * before the failed producer is retired, so it means "the recreation waits", as the check's
 * does: the old producer kept, the relay not failed, the next try after the backoff recreates
 * it. On the old code the pinning came inside the creation, after the retirement: the relay
 * failed (exit 1, "cannot recreate the Kafka producer") with no producer at all. */
static void test_producer_not_recreated_over_a_fifo_at_the_pin(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    int retired = fake_kafka_retired();
    KafkaProducer *first = fake_kafka_current();
    fake_kafka_set_fatal(true);
    answer_claim(0, "A"); /* the producer failed under the claim */
    answer(0);            /* ROLLBACK */
    fake_kafka_set_pin_refused(true);
    fire(&S(0)->retry_timer);
    assert_false(T.r->stopping);
    assert_int_equal(T.r->exit_status, 0);
    assert_ptr_equal(T.r->kafka, first); /* kept, not retired */
    assert_int_equal(fake_kafka_retired(), retired);
    expect_idle_pg(0);
    assert_true(ev_is_active(&S(0)->retry_timer)); /* the session tries again later */
    fake_kafka_set_pin_refused(false);
    T.r->recreate_after = monotime_now() - 1; /* its backoff is over */
    fire(&S(0)->retry_timer);
    assert_ptr_not_equal(fake_kafka_current(), first);
    assert_int_equal(fake_kafka_retired(), retired + 1);
    answer_claim(0, "A");
    fake_kafka_report_all(OK);
}

/* A follower's final claim waits behind a look at the lanes (the rebalance timer ticked while it
 * asked to sleep), and its guard leaves meanwhile: the claim is then a wakeup, and the session
 * asks again after it, as when the guard leaves while it asks to sleep. Were it to sleep on, no
 * session would guard it, and rows committed from then on would wait for its poll timer. */
static void test_guard_leaves_before_final_claim(void **state)
{
    static const char *const sent[] = {"members", CLAIM, "COMMIT,sleep", NULL};
    start("1", "1", "0");
    T.sleep_answer = "follow";
    bring_up(0);
    answer_claim(0, "");          /* empty: COMMIT and to sleep */
    fire(&S(0)->rebalance_timer); /* while the request to sleep is out */
    forget(0);
    answer(0); /* "follow": the look goes before the final claim */
    fake_pg_notify(PG(0), WAKEUP_CHANNEL, GUARD_LEFT);
    answer(0);           /* members: nothing changed */
    answer_claim(0, ""); /* the claim that was to be the final one: nothing */
    expect_sent(0, sent);
}

/* A producer holds the wakeup lock shared (the answer to sleep is "busy"): the session no longer
 * polls every --busy-poll-interval while it does. Told busy for a while (not at once: most
 * producers' transactions are short), the relay's waiter connects and queues for the lock (its
 * lock_timeout the first wait's 50 ms); once its wait is in flight, a session told
 * busy sleeps like a follower (after its final claim), and the wait ends with "guard left",
 * which wakes it to ask again; a session that slept on a wait in flight gets another wait after
 * it (the one in flight may have ended already). A waiter lost wakes the sessions asleep (its
 * wait may have ended without a notification). On the old code there was no waiter: no
 * connection "wakeup", and the session polled on. */
static void test_busy_sleeps_on_waiter(void **state)
{
    static const char *const asleep_sent[] = {CLAIM, "COMMIT,sleep", CLAIM, "COMMIT", NULL};
    static const char *const woken_sent[] = {CLAIM, "COMMIT,sleep", NULL};
    start("1", "1", "0");
    T.sleep_answer = "busy";
    bring_up(0);
    answer_claim(0, ""); /* empty: COMMIT and to sleep */
    answer(0);           /* busy: most producers' transactions end within a few polls */
    assert_null(fake_pg_named("wakeup"));
    assert_true(ev_is_active(&S(0)->busy_timer));
    S(0)->wake.busy_since -= 1.0; /* a second later, busy all along */
    fire(&S(0)->busy_timer);
    answer_claim(0, "");
    answer(0); /* busy: the waiter connects; meanwhile the session polls */
    PgConn *w = fake_pg_named("wakeup");
    assert_non_null(w);
    /* Its sessions have reached the server: the waiter, opened for each spell of busy answers,
     * does not log "postgres connected" each time (only an outage and its end, as for any). */
    assert_true(fake_pg_seen_before(w));
    assert_true(ev_is_active(&S(0)->busy_timer));
    fake_pg_up(w);
    settle();
    const FakeRequest *wait = fake_pg_pending(w);
    assert_non_null(wait);
    assert_non_null(strstr(wait->sql[0], "'lock_timeout', '50ms'"));
    assert_non_null(strstr(wait->sql[0], "pg_advisory_lock(" LOCK_KEY_WAKEUP "::bigint)"));
    assert_non_null(strstr(wait->sql[0], "pg_notify('" WAKEUP_CHANNEL "', '" GUARD_LEFT "')"));
    forget(0);
    fire(&S(0)->busy_timer);
    answer_claim(0, ""); /* empty again */
    answer(0);           /* busy, the wait in flight: asleep, one final claim */
    assert_true(S(0)->wake.asleep);
    assert_false(S(0)->wake.guard);
    answer_claim(0, ""); /* the final claim */
    answer(0);           /* its COMMIT */
    expect_sent(0, asleep_sent);
    expect_idle_pg(0);
    assert_false(ev_is_active(&S(0)->busy_timer)); /* asleep: no polling */
    PGresult *done[1] = {fake_pg_command_ok()};
    fake_pg_answer(w, done, 1); /* the wait ends (its notification below) */
    settle();
    assert_non_null(fake_pg_pending(w)); /* the session slept on it: another wait follows */
    forget(0);
    fake_pg_notify(PG(0), WAKEUP_CHANNEL, GUARD_LEFT);
    settle();
    answer_claim(0, ""); /* the wakeup: nothing; it asks again */
    expect_sent(0, woken_sent);
    answer(0); /* busy: asleep again on the wait in flight */
    answer_claim(0, "");
    answer(0);
    expect_idle_pg(0);
    forget(0);
    fake_pg_drop(w, "connection lost"); /* the wait's notification may never come */
    settle();
    assert_non_null(fake_pg_pending(PG(0))); /* woken: a claim */
}

/* The waiter's connection is refused (max_connections reached, a role's connection limit) while a
 * session is told busy: it is kept, retrying with its growing backoff, and closed only once it
 * is no longer needed. On the old code the idle timer closed it WAITER_IDLE_S after it was made,
 * and the next busy answer made another, which logged "postgres unreachable" again (a warning
 * every 10 s for as long as a producer's transaction stayed open) and tried again at once. */
static void test_waiter_kept_while_refused(void **state)
{
    start("1", "1", "0");
    T.sleep_answer = "busy";
    bring_up(0);
    answer_claim(0, "");
    answer(0); /* busy */
    S(0)->wake.busy_since -= 1.0;
    fire(&S(0)->busy_timer);
    answer_claim(0, "");
    answer(0); /* busy: the waiter connects, and does not get in */
    PgConn *w = fake_pg_named("wakeup");
    assert_non_null(w);
    WakeupWaiter *waiter = &S(0)->relay->waiter;
    fire(&S(0)->busy_timer);
    answer_claim(0, "");
    answer(0); /* still busy: still wanted */
    fire(&waiter->idle_timer);
    assert_ptr_equal(fake_pg_named("wakeup"), w); /* kept: the same connection retries */
    fake_pg_up(w);                                /* let in at last: the wait goes out */
    settle();
    assert_non_null(fake_pg_pending(w));
    PGresult *done[1] = {fake_pg_command_ok()};
    fake_pg_answer(w, done, 1);
    settle();
    fire(&waiter->idle_timer); /* no wait asked since: closed */
    assert_null(fake_pg_named("wakeup"));
}

/* Two batches in a row whose marks failed for a passing reason, then a batch whose marks go
 * through though nothing of it got through (Kafka down: every row failed, recorded, and the next
 * claim waits for the retry backoff): the run of failed marks is over. A later passing failure of
 * the marks is the first of a new run: the batch is sent again after the backoff, not recorded
 * row by row as from the third in a row. */
static void test_mark_retries_end_with_recorded_failures(void **state)
{
    static const char *const retried_sent[] = {"mark-plan,mark-sent,COMMIT", "ROLLBACK", NULL};
    start("1", "1", "60000");
    bring_up(0);
    for (int round = 0; round < 2; round++)
        marks_fail_passingly();
    answer_claim(0, "A,B,C");
    fake_kafka_report_all(RD_KAFKA_RESP_ERR__TRANSPORT);
    assert_string_equal(field(pending_param(0, "mark-failed"), 0), "{7,8,9}");
    answer(0); /* the failures are recorded */
    fire(&S(0)->retry_timer);
    forget(0);
    marks_fail("40001");
    expect_idle_pg(0); /* the retry backoff, not row by row */
    expect_sent(0, retried_sent);
}

/* ---- what the engine logs ---------------------------------------------------------------- */

static struct {
    char path[64];
    int saved;
} capture;

/* From here to logged(), the log (stderr) goes to a file, at level and above. */
static void capture_log(LogLevel level)
{
    snprintf(capture.path, sizeof(capture.path), "/tmp/test_engine_log.XXXXXX");
    int fd = mkstemp(capture.path);
    capture.saved = dup(STDERR_FILENO);
    assert_true(fd >= 0 && capture.saved >= 0);
    fflush(stderr);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    close(fd);
    log_set_level(level);
}

/* Ends capture_log: what was logged (a static buffer), the log quiet again. */
static const char *logged(void)
{
    static char text[65536];
    fflush(stderr);
    assert_true(dup2(capture.saved, STDERR_FILENO) >= 0);
    close(capture.saved);
    log_set_level(LOG_ERROR + 1);
    FILE *f = fopen(capture.path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(capture.path);
    return text;
}

static int occurrences(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* A recreation skipped over a refused TLS file is retried, not fatal: its line is not the fatal
 * "cannot recreate the Kafka producer" (after which the relay exits 1) that alerts key on, it
 * says when it tries again, and it is said at error level once, not at every try (up to every
 * 30 s for as long as the file stays). On the old code each try logged the fatal line again. */
static void test_producer_refused_recreation_said_once(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    fake_kafka_set_fatal(true);
    answer_claim(0, "A"); /* the producer failed under the claim */
    answer(0);            /* ROLLBACK */
    fake_kafka_set_files_refused(true);
    capture_log(LOG_ERROR);
    for (int i = 0; i < 3; i++) {
        T.r->recreate_after = monotime_now() - 1; /* each try after its backoff */
        fire(&S(0)->retry_timer);
        expect_idle_pg(0);
    }
    const char *text = logged();
    if (strstr(text, "cannot recreate the Kafka producer"))
        fail_msg("a retried recreation logged the fatal line: %s", text);
    if (occurrences(text, "kafka producer recreation waits") != 1)
        fail_msg("three refused tries, want one line at error level: %s", text);
    assert_non_null(strstr(text, "retry_in_s="));
    assert_non_null(strstr(text, "not a regular file"));
    fake_kafka_set_files_refused(false);
}

/* The marks fail batch after batch with the same error, one longer than the copy the session
 * keeps of the last (a trigger's long RAISE text): logged at error level once, then at debug
 * level, as any other error. Each batch logged it at error level when the comparison was with
 * the whole text. */
static void test_long_mark_error_logged_once(void **state)
{
    char msg[400];
    memset(msg, 'x', sizeof(msg) - 1);
    msg[sizeof(msg) - 1] = '\0';
    start("1", "1", "60000");
    bring_up(0);
    T.fail_msg = msg;
    capture_log(LOG_ERROR);
    marks_fail_passingly();
    marks_fail_passingly();
    const char *text = logged();
    assert_int_equal(occurrences(text, "recording the batch failed"), 1);
}

/* Answers session 0's requests as they come, at most `most` of them and no timer fired, each claim
 * with rows (by aggregate, as answer_claim) whose recheck holds aggregate "agg-A" from its first
 * row (null: no recheck answer): returns how many claims it answered. */
static int answer_claims_held(int most, const char *rows, bool hold)
{
    int claims = 0;
    for (int k = 0; k < most && fake_pg_pending(PG(0)); k++) {
        char what[160];
        summarise(fake_pg_pending(PG(0)), what, sizeof(what));
        if (strstr(what, "claim-recheck")) {
            claims++;
            if (hold) {
                T.recheck[0] = "order";
                T.recheck[1] = "agg-A";
                T.recheck[2] = "1";
            }
            answer_claim(0, rows);
        } else {
            answer(0);
        }
        if (fake_kafka_count() > 0)
            fake_kafka_report_all(OK);
    }
    return claims;
}

/* A claim whose recheck held every event of its batch (a full answer of surely new rows does, or,
 * as here, an answer naming the batch's only aggregate) published nothing, and claimed again at
 * once: if the recheck holds every batch, nothing bounded the rate of claims. The next claim
 * waits for the retry backoff, growing batch after batch, said once for the run of such batches,
 * and a batch that publishes again ends the run (and the backoff). On the old code the claims ran
 * back to back: 10 claims in 20 answers with no timer fired ("0xa != 0x1"). */
static void test_claim_recheck_held_whole_backs_off(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_INFO);
    for (unsigned round = 1; round <= 3; round++) {
        assert_int_equal(answer_claims_held(20, "A,A", true), 1);
        expect_idle_pg(0);
        assert_int_equal(fake_kafka_count(), 0);
        assert_int_equal(S(0)->retry.failures, round); /* the backoff grows */
        fire(&S(0)->retry_timer);
    }
    /* A claim of which something is published ends the run: B goes, and the next claim rides
     * at once behind its marks. */
    assert_int_equal(answer_claims_held(2, "A,B", true), 2);
    assert_false(ev_is_active(&S(0)->retry_timer));
    assert_int_equal(S(0)->retry.failures, 0);
    const char *text = logged();
    assert_int_equal(occurrences(text, "every event of a claim waits"), 1);
    assert_int_equal(occurrences(text, "claims publish events again"), 1);
}

/* Brings session i up as bring_up does, without its checks (a dead-letter topic adds its claim
 * to the expected requests). */
static void bring_up_quietly(int i)
{
    fake_pg_up(PG(i));
    for (int k = 0; k < 4; k++) /* LISTEN, join, members, lock */
        answer(i);
    forget(i);
}

/* A dead event whose publication to the dead-letter topic failed (the topic refused, say) is
 * said in the log, once per distinct error like any failure: it was silent (only the metric
 * and the row's last_error knew), and a batch that delivered its events even logged "deliveries
 * succeed again". */
/* Why the claim floor is off is said once per relay (one per database), not once per process:
 * with --databases, the second database's table without the floor went unsaid (a static flag),
 * and so did every relay's after the first in this process. Two relays in turn, each says it once
 * (not again after a reconnect). On the old code the second relay's log lacked it. */
static void test_floor_off_said_per_database(void **state)
{
    for (int round = 0; round < 2; round++) {
        if (round > 0)
            teardown(state);
        extra_args[0] = "--claim-floor"; /* the floor asked for; the fake table has none */
        extra_args[1] = "on";
        start("1", "1", "60000");
        capture_log(LOG_WARN);
        bring_up(0);
        fake_pg_drop(PG(0), "connection reset by peer"); /* its next setup: not said again */
        forget(0);
        bring_up_lost(0, "f");
        const char *text = logged();
        const char *first = strstr(text, "claims read the unsent index from its start");
        if (!first)
            fail_msg("relay %d did not say why the floor is off: %s", round, text);
        assert_null(strstr(first + 1, "claims read the unsent index from its start"));
    }
}

/* The floor's check passes again after it failed (the operator fixed the table), and a later
 * connection's check fails again: that new episode is said too. The flag that says it once per
 * database never reset, so on the old code the second failure was silent (said once, not twice). */
static void test_floor_off_said_again_after_it_worked(void **state)
{
    extra_args[0] = "--claim-floor";
    extra_args[1] = "on";
    start("1", "1", "60000");
    capture_log(LOG_WARN);
    bring_up(0); /* the check finds no such table: said */
    S(0)->last_rows_at = monotime_now();
    answer_claim(0, "");
    answer(0);         /* COMMIT */
    T.floor_ok = true; /* the operator fixes the table */
    S(0)->floor_check_due = monotime_now() - 1;
    forget(0);
    fire(&S(0)->busy_timer);
    answer(0); /* the check passes */
    assert_true(S(0)->floor.enabled);
    T.floor_ok = false; /* and the table is broken again: the next connection's check fails */
    fake_pg_drop(PG(0), "connection reset by peer");
    forget(0);
    bring_up_lost(0, "f");
    assert_false(S(0)->floor.enabled);
    const char *text = logged();
    assert_int_equal(occurrences(text, "claims read the unsent index from its start"), 2);
}

/* LISTEN itself fails: the floor's check after it in the pipeline never ran (aborted). It was
 * read as a failed check, and the log blamed the floor with no cause ("the claim floor's
 * diagnosis failed: "). Now only LISTEN's error is said, once, and the floor's check is asked
 * alone before the first claim. On the old code the log held the floor's empty diagnosis and the
 * first claim went out with no check. */
static void test_listen_failed_does_not_blame_floor(void **state)
{
    static const char *const sent[] = {"LISTEN,floor-check", "join", "members", "lock",
                                       "floor-check",        NULL};
    extra_args[0] = "--claim-floor";
    extra_args[1] = "on";
    start("1", "1", "60000");
    T.floor_ok = true;
    capture_log(LOG_WARN);
    fake_pg_up(PG(0));
    T.fail_msg = "ERROR:  LISTEN is not supported by this pooler";
    answer_failing(0, "LISTEN", "0A000");
    T.fail_msg = NULL;
    answer(0); /* join */
    answer(0); /* members */
    answer(0); /* lock */
    expect_sent(0, sent);
    answer(0); /* the floor's check, alone, passes */
    assert_true(S(0)->floor.enabled);
    const char *text = logged();
    assert_null(strstr(text, "diagnosis failed"));
    assert_null(strstr(text, "claims read the unsent index from its start"));
    assert_int_equal(occurrences(text, "LISTEN failed"), 1);
    assert_int_equal(occurrences(text, "not supported by this pooler"), 1);
}

static void test_dead_letter_failure_logged(void **state)
{
    extra_args[0] = "--dead-letter-topic";
    extra_args[1] = "dead-letters";
    start("1", "1", "60000");
    bring_up_quietly(0);
    capture_log(LOG_WARN);
    T.dead[0] = "A";      /* row 1: dead, to be published to the dead-letter topic */
    answer_claim(0, "B"); /* row 2: an event */
    assert_int_equal(fake_kafka_count(), 2);
    assert_string_equal(fake_kafka_at(1)->topic, "dead-letters");
    fake_kafka_report(0, OK);
    /* Not authorised: a fault of the setup, but a dead event's copy is recorded as failed all the
     * same (it counts nothing against the row, and has a backoff of its own). */
    fake_kafka_report(1, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    assert_string_equal(field(pending_param(0, "mark-dead-letter-failed"), 0), "{1}");
    const char *text = logged();
    assert_int_equal(occurrences(text, "dead events not published to the dead-letter topic"), 1);
    assert_int_equal(occurrences(text, "id=1"), 1);
}

/* The "stopped" totals count events: sent= the events delivered, failed_attempts= the attempts
 * counted against events. A dead event's copy to the dead-letter topic is neither (its event was
 * dead-lettered when its last attempt failed; a copy that fails counts no attempt): published
 * copies are counted apart (dead_letter_published=), failed ones not at all (the metric
 * outbox_failures_total has them). Whole and row by row. On the old code a batch of one event
 * and two dead events' copies, one delivered and one refused, said sent=2 failed_attempts=1. */
static void copies_counted_apart(bool by_row)
{
    extra_args[0] = "--dead-letter-topic";
    extra_args[1] = "dead-letters";
    start("1", "1", "60000");
    bring_up_quietly(0);
    T.dead[0] = "A,B";    /* rows 1 and 2: dead, to be published to the dead-letter topic */
    answer_claim(0, "C"); /* row 3: an event */
    assert_int_equal(fake_kafka_count(), 3);
    bool first_copy = true;
    for (int k = 0; k < 3; k++) {
        bool copy = strcmp(fake_kafka_at(k)->topic, "dead-letters") == 0;
        fake_kafka_report(k,
                          copy && !first_copy ? RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED : OK);
        first_copy = first_copy && !copy;
    }
    if (by_row) {
        answer_failing(0, "mark-sent", "22P02");
        answer(0); /* ROLLBACK: row by row */
    }
    for (int k = 0; k < 10 && S(0)->batch.n > 0; k++)
        answer(0); /* the marks (row by row: each row's), until the batch is done */
    assert_int_equal(S(0)->batch.n, 0);
    capture_log(LOG_INFO);
    relay_finish(T.r);
    const char *text = logged();
    if (!strstr(text, "sent=1 failed_attempts=0 dead_lettered=0 dead_letter_published=1 "))
        fail_msg("one event sent, one copy published, one refused: %s", text);
}

static void test_dead_letter_copies_counted_apart(void **state)
{
    copies_counted_apart(false);
}

static void test_dead_letter_copies_counted_apart_by_row(void **state)
{
    copies_counted_apart(true);
}

/* A dead-letter publication that fails while events fail too (a continuing streak of event
 * failures) is said all the same: the batch's dead rows were never looked at once an event had
 * failed, so a refused dead-letter topic stayed silent for as long as the events failed. Said
 * once per distinct error, like any failure. */
static void test_dead_letter_failure_logged_during_event_failures(void **state)
{
    extra_args[0] = "--dead-letter-topic";
    extra_args[1] = "dead-letters";
    start("1", "1", "60000");
    bring_up_quietly(0);
    capture_log(LOG_WARN);
    answer_claim(0, "B"); /* row 1: an event, failing */
    fake_kafka_report(0, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
    answer(0); /* its marks */
    for (int round = 0; round < 2; round++) {
        fire(&S(0)->retry_timer);
        T.dead[0] = "A";           /* a dead row, to be published to the dead-letter topic */
        answer_claim(0, "B");      /* the event again, failing again with the same error */
        int first = 1 + 2 * round; /* indices count from the producer's creation */
        assert_int_equal(fake_kafka_count(), first + 2);
        for (int k = first; k < first + 2; k++)
            fake_kafka_report(k, strcmp(fake_kafka_at(k)->topic, "dead-letters") == 0
                                     ? RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED
                                     : RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
        answer(0);
    }
    const char *text = logged();
    assert_int_equal(occurrences(text, "events not delivered; they will be retried"), 1);
    assert_int_equal(occurrences(text, "dead events not published to the dead-letter topic"), 1);
}

/* Kafka refuses events for a fault of the setup (an ACL revoked, a topic deleted): no attempt is
 * counted against the rows (no mark-failed: they were recorded as failures, and dead-lettered
 * after --max-attempts, every event of the topic), the rest of their aggregate waits, other
 * aggregates are delivered, the next claim waits for the retry backoff, the relay is not ready,
 * and the fault is logged once however many batches meet it. */
static void test_kafka_setup_fault_counts_no_attempt(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_WARN);
    answer_claim(0, "A,A,B");
    assert_int_equal(fake_kafka_count(), 3);
    fake_kafka_report(0, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    fake_kafka_report(1, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    fake_kafka_report(2, OK);
    assert_string_equal(pending_param(0, "mark-failed"), "");  /* nothing counted against 1, 2 */
    assert_string_equal(pending_param(0, "mark-sent"), "{3}"); /* B is delivered */
    answer(0);
    /* The refused type is held out of the next claims (at once, no retry backoff); the hold
     * backoff brings the probe. */
    assert_false(ev_is_active(&S(0)->retry_timer));
    assert_true(ev_is_active(&S(0)->hold_timer));
    assert_string_equal(field(pending_param(0, "claim"), 5), "{\"order\"}");
    answer_claim(0, ""); /* nothing else: not "nothing left", the refused rows were left out */
    answer(0);           /* its COMMIT */
    RelayStatus st;
    relay_status(T.r, &st);
    assert_non_null(strstr(st.setup_error, "Topic authorization failed"));
    /* Another fault, met when producing: still nothing counted; logged, being another. */
    fire(&S(0)->hold_timer);
    assert_string_equal(field(pending_param(0, "claim"), 5), "{}"); /* the probe */
    fake_kafka_refuse_key("agg-A", RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC);
    answer_claim(0, "A,A");
    assert_int_equal(fake_kafka_count(), 3); /* the second A waits behind the first */
    assert_string_equal(pending_param(0, "mark-failed"), "");
    answer(0);
    assert_true(ev_is_active(&S(0)->hold_timer)); /* still held: the next probe after a backoff */
    assert_false(ev_is_active(&S(0)->retry_timer));
    /* Fixed: everything goes through, in order, and the relay is ready again. */
    fake_kafka_refuse_key("agg-A", RD_KAFKA_RESP_ERR_NO_ERROR);
    answer_claim(0, ""); /* the claim that left order out */
    answer(0);
    fire(&S(0)->hold_timer);
    answer_claim(0, "A,A");
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{6,7}");
    assert_string_equal(field(pending_param(0, "claim"), 5), "{}"); /* chained, nothing held */
    answer(0);
    relay_status(T.r, &st);
    assert_string_equal(st.setup_error, "");
    assert_int_equal(S(0)->hold.n, 0);
    assert_false(ev_is_active(&S(0)->hold_timer));
    assert_int_equal(S(0)->order_breaks, 0);
    const char *text = logged();
    assert_int_equal(occurrences(text, "Kafka refuses events for a fault of the setup"), 2);
    assert_int_equal(occurrences(text, "hint="), 2);
    assert_int_equal(occurrences(text, "dead-lettered"), 0);
    assert_int_equal(occurrences(text, "events of an aggregate type whose topic Kafka refuses"), 1);
}

/* One refused topic must not slow the others: Kafka refuses the topic of aggregate type pay
 * (an ACL revoked); rows of type order in the same lanes went out one batch per retry backoff
 * (up to 30 s) with it. Now pay is held out of the claims, order's batches follow one another
 * at once, pay's rows are claimed only by the probe after each hold backoff (growing), stay
 * unsent with no attempt counted, and go out in order once Kafka takes them again. */
static void test_refused_type_held_others_go_on(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_INFO);
    fake_kafka_refuse_key("agg-P*", RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    answer_claim(0, "P@pay,P2@pay,A,P@pay"); /* rows 1-4 */
    assert_int_equal(fake_kafka_count(), 1); /* A; P and P2 refused when produced, P's 2nd waits */
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-failed"), "");
    assert_string_equal(pending_param(0, "mark-sent"), "{3}");
    answer(0);
    /* Batches of the other type follow at once, pay left out of each claim. */
    for (int i = 0; i < 3; i++) {
        assert_false(ev_is_active(&S(0)->retry_timer));
        assert_string_equal(field(pending_param(0, "claim"), 5), "{\"pay\"}");
        answer_claim(0, "B,C,D");
        fake_kafka_report_all(OK);
        answer(0); /* the marks */
    }
    assert_int_equal(S(0)->total_sent, 10);
    answer_claim(0, ""); /* caught up: the held rows are not "nothing left" */
    answer(0);
    RelayStatus st;
    relay_status(T.r, &st);
    assert_non_null(strstr(st.setup_error, "Topic authorization failed"));
    assert_int_equal(st.held_aggregate_types, 1); /* outbox_held_aggregate_types */
    /* No hot loop: nothing is claimed until the hold backoff is over, and then the probe. */
    expect_idle_pg(0);
    assert_true(ev_is_active(&S(0)->hold_timer));
    double first_wait = ev_timer_remaining(T.loop, &S(0)->hold_timer);
    fire(&S(0)->hold_timer);
    assert_string_equal(field(pending_param(0, "claim"), 5), "{}");
    answer_claim(0, "P@pay,P2@pay,P@pay,E"); /* refused again, E goes */
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-failed"), "");
    answer(0);
    assert_int_equal(S(0)->hold.n, 1);
    assert_true(ev_is_active(&S(0)->hold_timer));
    assert_true(ev_timer_remaining(T.loop, &S(0)->hold_timer) > first_wait); /* it grows */
    assert_string_equal(field(pending_param(0, "claim"), 5), "{\"pay\"}");
    answer_claim(0, "");
    answer(0);
    /* Kafka takes pay again: the probe's batch delivers its rows in order and the hold ends. */
    fake_kafka_refuse_key("agg-P*", RD_KAFKA_RESP_ERR_NO_ERROR);
    fire(&S(0)->hold_timer);
    assert_string_equal(field(pending_param(0, "claim"), 5), "{}");
    answer_claim(0, "P@pay,P2@pay,P@pay");
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{18,19,20}");
    answer(0);
    assert_int_equal(S(0)->hold.n, 0);
    assert_false(ev_is_active(&S(0)->hold_timer));
    assert_string_equal(field(pending_param(0, "claim"), 5), "{}"); /* nothing left out */
    answer_claim(0, "");
    answer(0);
    relay_status(T.r, &st);
    assert_string_equal(st.setup_error, "");
    assert_int_equal(st.held_aggregate_types, 0);
    assert_int_equal(S(0)->order_breaks, 0);
    assert_int_equal(occurrences(logged(), "Kafka accepts the events of a held aggregate type"), 1);
}

/* A message too large names its own sizes and the limit it is over: refused by librdkafka at
 * produce (an encoded value or the relay's headers can take a row the claim measured under the
 * limit over it), the message as produced, not the claim's count of the row's columns; refused by
 * the broker (a topic's max.message.bytes below the producer's limit), the same, where librdkafka
 * said only "Broker: Message size too large". */
static void test_too_large_names_its_sizes(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    fake_kafka_refuse_key("agg-A", RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
    answer_claim(0, "A,B");
    fake_kafka_refuse_key("", RD_KAFKA_RESP_ERR_NO_ERROR);
    fake_kafka_report_all(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE); /* B, by the broker */
    const char *errors = field(pending_param(0, "mark-failed"), 1);
    char produced[160], broker[160];
    /* value "{}" (2 bytes), key agg-A (5); the headers are what the relay adds */
    snprintf(produced, sizeof(produced),
             "message too large: %zu bytes as produced (value 2, key 5,",
             2 + 5 + S(0)->batch.rows[0].sent_headers);
    snprintf(broker, sizeof(broker),
             "message too large for the broker: %zu bytes as produced (value 2, key 5,",
             2 + 5 + S(0)->batch.rows[1].sent_headers);
    assert_non_null(strstr(errors, produced));
    assert_non_null(strstr(errors, broker));
    assert_int_equal(occurrences(errors, "message.max.bytes of 1000000"), 2);
    assert_true(S(0)->batch.rows[0].sent_headers > 0);
    answer(0);
}

#define TOO_LARGE RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE

/* The statements of the request session i has pending, comma-separated ("" when none). */
static const char *pending_kinds(int i)
{
    static char out[512];
    const FakeRequest *req = fake_pg_pending(PG(i));
    out[0] = '\0';
    for (int q = 0; req && q < req->n; q++)
        snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s%s", q ? "," : "",
                 kind_of(req->sql[q]));
    return out;
}

/* Answers session i's requests (the marks, nothing recorded) until it is idle, wakes it by its
 * retry backoff (rows left unsent) or poll timer, and answers its claim with rows (ids from
 * first_id). */
static void reclaim(int i, long long first_id, const char *rows)
{
    for (int n = 0; n < 8 && fake_pg_pending(PG(i)) && !strstr(pending_kinds(i), "claim"); n++)
        answer(i);
    if (!fake_pg_pending(PG(i)))
        fire(ev_is_active(&S(i)->retry_timer) ? &S(i)->retry_timer : &S(i)->poll_timer);
    assert_non_null(strstr(pending_kinds(i), "claim"));
    T.next_id = first_id;
    answer_claim(i, rows);
}

/* The broker refuses a whole produce request as too large (a topic's max.message.bytes below
 * the record batch; librdkafka 2.0.2 does not split it): the small events in it count nothing,
 * are left unsent, and go again alone, one at a time, nothing else of the relay in flight while
 * each is out, so an aggregate's order holds; one refused alone is the row's own fault (a
 * rejection) and holds its aggregate. Said once per episode. On the old code all three rows
 * were recorded as rejections ("{1,2,3}" in mark-failed). */
static void test_too_large_request_isolates_rows(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_WARN);
    answer_claim(0, "A,B,A"); /* rows 1..3, one request */
    assert_int_equal(fake_kafka_count(), 3);
    fake_kafka_report_all(TOO_LARGE);
    assert_string_equal(pending_param(0, "mark-failed"), "");
    assert_string_equal(pending_param(0, "mark-sent"), "");
    assert_int_equal(T.r->isolate.n, 3);
    /* Claimed again: row 1 goes alone; nothing else until its report. */
    reclaim(0, 1, "A,B,A,C");
    assert_int_equal(fake_kafka_count(), 4);
    assert_string_equal(fake_kafka_at(3)->key, "agg-A");
    fake_kafka_report(3, OK);
    assert_int_equal(fake_kafka_count(), 5); /* row 2 alone */
    assert_string_equal(fake_kafka_at(4)->key, "agg-B");
    fake_kafka_report(4, TOO_LARGE);         /* refused alone: too large itself */
    assert_int_equal(fake_kafka_count(), 6); /* row 3 alone, after row 1 was acknowledged */
    assert_string_equal(fake_kafka_at(5)->key, "agg-A");
    fake_kafka_report(5, OK);
    assert_int_equal(fake_kafka_count(), 7); /* row 4, not isolated, goes as usual */
    fake_kafka_report(6, OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{1,3,4}");
    assert_string_equal(field(pending_param(0, "mark-failed"), 0), "{2}");
    assert_int_equal(T.r->isolate.n, 0);
    answer(0);
    const char *text = logged();
    assert_int_equal(occurrences(text, "the broker refused a produce request as too large though "
                                       "its messages were within message.max.bytes"),
                     1);
}

/* The rows to produce alone are a set of fixed size (ISOLATE_MAX): one that does not fit counts
 * a transient failure (an attempt, never a rejection), unless an entry no claim has met for
 * ISOLATE_STALE_S makes room. On the old code both rows were rejections (permanent "t"). */
static void test_too_large_request_isolate_cap(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    Isolate *iso = &T.r->isolate;
    for (int i = 0; i < ISOLATE_MAX; i++) {
        iso->ids[i] = 1000 + i; /* rows of other lanes, met just now */
        iso->met[i] = monotime_now();
    }
    iso->n = ISOLATE_MAX;
    iso->met[7] = monotime_now() - ISOLATE_STALE_S - 1; /* one stale */
    answer_claim(0, "A,B,C");                           /* rows 1..3 */
    fake_kafka_report_all(TOO_LARGE);
    assert_int_equal(iso->n, ISOLATE_MAX);
    int row1 = 0; /* row 1 took the stale one's room: left unsent */
    for (int i = 0; i < iso->n; i++)
        row1 += iso->ids[i] == 1;
    assert_int_equal(row1, 1);
    assert_string_equal(field(pending_param(0, "mark-failed"), 0), "{2,3}");
    assert_string_equal(field(pending_param(0, "mark-failed"), 2), "{\"f\",\"f\"}");
    assert_non_null(
        strstr(field(pending_param(0, "mark-failed"), 1), "not counted as a rejection"));
    answer(0);
}

/* Isolation is relay-wide, the producer being shared: a session whose next row goes alone waits
 * for the other session's messages to be reported, and the other produces nothing new
 * meanwhile (here its next batch waits); then the row goes out alone. */
static void test_too_large_request_isolation_relay_wide(void **state)
{
    start("2", "2", "60000");
    T.members = "0,1";
    bring_up(0);
    bring_up(1);
    T.r->isolate.ids[0] = 5;
    T.r->isolate.met[0] = monotime_now();
    T.r->isolate.n = 1;
    T.next_id = 1;
    answer_claim(1, "B,C"); /* session 1: rows 1, 2 in flight */
    assert_int_equal(fake_kafka_count(), 2);
    T.next_id = 5;
    answer_claim(0, "A,D"); /* session 0: row 5 to go alone, row 6 after it */
    assert_int_equal(fake_kafka_count(), 2);
    assert_true(S(0)->isolate_wait);
    fake_kafka_report(0, OK);
    assert_int_equal(fake_kafka_count(), 2); /* row 2 still out */
    fake_kafka_report(1, OK);
    assert_int_equal(fake_kafka_count(), 3); /* row 5, alone */
    assert_string_equal(fake_kafka_at(2)->key, "agg-A");
    fake_kafka_report(2, OK);
    assert_int_equal(fake_kafka_count(), 4); /* then row 6 */
    fake_kafka_report(3, OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{5,6}");
    assert_int_equal(T.r->isolate.n, 0);
}

/* An episode ends once no row refused with others is left to go alone, or none a claim has met
 * for ISOLATE_STALE_S (its lane moved to another relay, which delivered it; it was dead-lettered,
 * requeued or deleted): the next refusal is said again. On the old code such a row stayed in the
 * set for good, the episode never ended and every later one was silent (1 warning, not 2). */
static void test_too_large_request_episode_ends_with_stale_rows(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_WARN);
    answer_claim(0, "A,B"); /* rows 1, 2 refused together: the first episode */
    fake_kafka_report_all(TOO_LARGE);
    assert_int_equal(T.r->isolate.n, 2);
    reclaim(0, 1, "A"); /* row 2's lane went to another relay: only row 1 comes back */
    assert_int_equal(fake_kafka_count(), 3);
    fake_kafka_report(2, OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{1}");
    assert_int_equal(T.r->isolate.n, 1); /* row 2, never met again */
    T.r->isolate.met[0] = monotime_now() - ISOLATE_STALE_S - 1;
    reclaim(0, 10, "C,D"); /* hours later, rows 10, 11 refused together: a new episode */
    fake_kafka_report(3, TOO_LARGE);
    fake_kafka_report(4, TOO_LARGE);
    answer(0);
    const char *text = logged();
    assert_int_equal(occurrences(text, "the broker refused a produce request as too large though "
                                       "its messages were within message.max.bytes"),
                     2);
    assert_int_equal(T.r->isolate.n, 2); /* rows 10, 11: the stale row 2 is gone */
}

/* A dead event's copy is judged as an event is: refused as too large in a request with other
 * messages (the dead-letter topic's max.message.bytes under the record batch), the copies count
 * nothing, stay unsent and go again alone, one at a time; one refused alone with its payload is
 * too large itself for the dead-letter topic and goes again alone without it (payload_len 0: the
 * dlq.payload_omitted copy, as one too large for the producer). Refused again bare (nothing
 * left to leave out), it can never fit: a failed publication parked ("t": never retried, not
 * with its payload 30 s later either), said in one error line with its sizes, and its entry
 * goes. The warning is said once. On the old code both copies were recorded as failed
 * publications at once ("{1,2}" in mark-dead-letter-failed), to go again together after 30 s;
 * and the bare copy refused alone was a plain failed publication (no "parked" parameter), to go
 * again with its payload 30 s later, for ever. */
static void copies_refused_together(bool bare_refused)
{
    extra_args[0] = "--dead-letter-topic";
    extra_args[1] = "dead-letters";
    start("1", "1", "60000");
    bring_up_quietly(0);
    capture_log(LOG_WARN);
    T.dead[0] = "A,B"; /* rows 1, 2: dead events' copies, in one request */
    answer_claim(0, "");
    assert_int_equal(fake_kafka_count(), 2);
    fake_kafka_report_all(TOO_LARGE);
    assert_string_equal(pending_param(0, "mark-dead-letter-failed"), "");
    assert_int_equal(T.r->isolate.n, 2);
    T.dead[0] = "A,B";
    reclaim(0, 1, ""); /* copy 1 alone, nothing else until its report */
    assert_int_equal(fake_kafka_count(), 3);
    assert_string_equal(fake_kafka_at(2)->topic, "dead-letters");
    assert_string_equal(fake_kafka_at(2)->key, "agg-A");
    assert_true(fake_kafka_at(2)->payload_len > 0);
    fake_kafka_report(2, OK);
    assert_int_equal(fake_kafka_count(), 4); /* copy 2 alone, with its payload */
    assert_string_equal(fake_kafka_at(3)->key, "agg-B");
    assert_true(fake_kafka_at(3)->payload_len > 0);
    fake_kafka_report(3, TOO_LARGE); /* refused alone: too large for the dead-letter topic */
    assert_string_equal(field(pending_param(0, "mark-dead-lettered"), 0), "{1}");
    assert_string_equal(pending_param(0, "mark-dead-letter-failed"), "");
    assert_int_equal(T.r->isolate.n, 1);
    T.dead[0] = "B";
    reclaim(0, 2, ""); /* copy 2 again, alone, without its payload */
    assert_int_equal(fake_kafka_count(), 5);
    assert_string_equal(fake_kafka_at(4)->key, "agg-B");
    assert_int_equal(fake_kafka_at(4)->payload_len, 0);
    fake_kafka_report(4, bare_refused ? TOO_LARGE : OK);
    if (bare_refused) {
        assert_string_equal(field(pending_param(0, "mark-dead-letter-failed"), 0), "{2}");
        assert_string_equal(field(pending_param(0, "mark-dead-letter-failed"), 1), "{\"t\"}");
        assert_string_equal(pending_param(0, "mark-dead-lettered"), "");
    } else {
        assert_string_equal(field(pending_param(0, "mark-dead-lettered"), 0), "{2}");
    }
    assert_int_equal(T.r->isolate.n, 0);
    answer(0);
    const char *text = logged();
    assert_int_equal(occurrences(text, "the broker refused a produce request as too large "
                                       "though its messages were within message.max.bytes"),
                     1);
    assert_int_equal(occurrences(text, "a dead event's copy is too large for the dead-letter "
                                       "topic even without its payload"),
                     bare_refused ? 1 : 0);
}

static void test_too_large_request_isolates_copies(void **state)
{
    copies_refused_together(false);
}

static void test_too_large_request_copy_refused_bare(void **state)
{
    copies_refused_together(true);
}

/* A copy refused alone with its payload goes without it while the relay's knowledge of that
 * refusal is current, not once it is stale: its bare publication failed for a passing reason
 * (the broker down) and its retry came more than ISOLATE_STALE_S later, when the dead-letter
 * topic's max.message.bytes may have been raised. It goes alone with its payload again (refused
 * again, it would go bare at once). On the old code the stale entry still left the payload out
 * (payload_len 0). */
static void test_too_large_copy_bare_flag_goes_stale(void **state)
{
    extra_args[0] = "--dead-letter-topic";
    extra_args[1] = "dead-letters";
    start("1", "1", "60000");
    bring_up_quietly(0);
    T.dead[0] = "A"; /* row 1: a dead event's copy, alone */
    answer_claim(0, "");
    assert_int_equal(fake_kafka_count(), 1);
    assert_true(fake_kafka_at(0)->payload_len > 0);
    fake_kafka_report(0, TOO_LARGE); /* refused alone: to go without its payload */
    assert_string_equal(pending_param(0, "mark-dead-letter-failed"), "");
    T.dead[0] = "A";
    reclaim(0, 1, "");
    assert_int_equal(fake_kafka_count(), 2);
    assert_int_equal(fake_kafka_at(1)->payload_len, 0);
    fake_kafka_report(1, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT); /* a passing failure: 30 s doubling */
    assert_string_equal(field(pending_param(0, "mark-dead-letter-failed"), 0), "{1}");
    assert_int_equal(T.r->isolate.n, 1);
    T.r->isolate.met[0] = monotime_now() - ISOLATE_STALE_S - 1; /* its retry, much later */
    T.dead[0] = "A";
    reclaim(0, 1, "");
    assert_int_equal(fake_kafka_count(), 3);
    assert_string_equal(fake_kafka_at(2)->key, "agg-A");
    assert_true(fake_kafka_at(2)->payload_len > 0); /* with its payload, alone */
    fake_kafka_report(2, OK);
    assert_string_equal(field(pending_param(0, "mark-dead-lettered"), 0), "{1}");
    assert_int_equal(T.r->isolate.n, 0);
}

/* A copy refused alone with its payload while the set is full of rows refused with others goes
 * bare next time all the same: its bare mark takes the place of the row met longest ago (which
 * goes with others again). On the old code it was a failed publication ("{1}" in
 * mark-dead-letter-failed) and went again with its payload (payload_len > 0), refused each time
 * for as long as the set stayed full. */
static void test_too_large_copy_bare_in_full_set(void **state)
{
    extra_args[0] = "--dead-letter-topic";
    extra_args[1] = "dead-letters";
    start("1", "1", "60000");
    bring_up_quietly(0);
    Isolate *iso = &T.r->isolate;
    for (int i = 0; i < ISOLATE_MAX; i++) {
        iso->ids[i] = 1000 + i; /* rows of other lanes refused with others, met just now */
        iso->met[i] = monotime_now();
        iso->bare[i] = false;
    }
    iso->n = ISOLATE_MAX;
    iso->met[5] = monotime_now() - 100; /* met longest ago, not stale */
    T.dead[0] = "A";                    /* row 1: a dead event's copy, alone by chance */
    answer_claim(0, "");
    assert_int_equal(fake_kafka_count(), 1);
    assert_true(fake_kafka_at(0)->payload_len > 0);
    fake_kafka_report(0, TOO_LARGE); /* refused alone: too large for the dead-letter topic */
    assert_string_equal(pending_param(0, "mark-dead-letter-failed"), "");
    assert_int_equal(iso->n, ISOLATE_MAX);
    assert_int_equal(iso->ids[5], 1); /* in row 1005's place, bare */
    assert_true(iso->bare[5]);
    T.dead[0] = "A";
    reclaim(0, 1, "");
    assert_int_equal(fake_kafka_count(), 2);
    assert_string_equal(fake_kafka_at(1)->key, "agg-A");
    assert_int_equal(fake_kafka_at(1)->payload_len, 0); /* bare */
    fake_kafka_report(1, OK);
    assert_string_equal(field(pending_param(0, "mark-dead-lettered"), 0), "{1}");
    assert_int_equal(iso->n, ISOLATE_MAX - 1);
}

/* A row whose outcome the table refuses to record at all (its sent mark and then its failure
 * mark refused by a CHECK or trigger of the row) was claimed, published and refused again after
 * every retry backoff, for ever, with the rest of each batch recorded one by one. Now it is said
 * once, kept apart (not published, its aggregate waiting) for 30 s doubling, and the other rows
 * go on; a batch of nothing else waits for the retry backoff (no hot loop). */
static void test_unrecordable_row_kept_apart(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_INFO);
    marks_fail("23514");
    answer(0);                                 /* row 1 recorded */
    answer_failing(0, "mark-sent", "23514");   /* row 2: its sent mark refused */
    answer_failing(0, "mark-failed", "23514"); /* ...and its failure mark */
    answer(0);                                 /* row 3 recorded */
    expect_idle_pg(0);                         /* the retry backoff, once */
    fire(&S(0)->retry_timer);
    int produced = fake_kafka_count();
    T.next_id = 2; /* row 2 comes back first, and a row of another aggregate */
    answer_claim(0, "B,D");
    assert_int_equal(fake_kafka_count(), produced + 1); /* D alone: row 2 is not published */
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{3}");
    assert_string_equal(pending_param(0, "mark-failed"), "");
    assert_string_not_equal(pending_param(0, "claim"), ""); /* the next claim rides along */
    T.next_id = 2;
    answer_claim(0, "B"); /* row 2 alone: not published, and the retry backoff */
    assert_int_equal(fake_kafka_count(), produced + 1);
    while (fake_pg_pending(PG(0)))
        answer(0);
    assert_true(ev_is_active(&S(0)->retry_timer));
    /* Its wait over, it is tried again; recorded this time (the trigger fixed), it is let go. */
    T.r->unrecordable.due[0] = 0;
    fire(&S(0)->retry_timer);
    T.next_id = 2;
    answer_claim(0, "B");
    assert_int_equal(fake_kafka_count(), produced + 2);
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{2}");
    answer(0);
    assert_int_equal(T.r->unrecordable.n, 0);
    const char *text = logged();
    assert_int_equal(occurrences(text, "the table refuses to record a row's outcome"), 1);
    assert_int_equal(occurrences(text, "a row whose outcome the table refused is recorded now"), 1);
}

/* A row kept apart stays apart across a reconnect of its session: the list is the relay's. On
 * the old code each session's list was forgotten with its lanes, and the row was published
 * again after every reconnect or rest (2 messages here instead of 1). */
static void test_unrecordable_row_kept_apart_across_reconnect(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    marks_fail("23514");
    answer(0);                                 /* row 1 recorded */
    answer_failing(0, "mark-sent", "23514");   /* row 2: its sent mark refused */
    answer_failing(0, "mark-failed", "23514"); /* ...and its failure mark */
    answer(0);                                 /* row 3 recorded */
    assert_int_equal(T.r->unrecordable.n, 1);
    fake_pg_drop(PG(0), "connection reset by peer");
    fake_pg_up(PG(0));
    for (int i = 0; i < 12 && !pending_param(0, "claim")[0]; i++) {
        if (fake_pg_pending(PG(0)))
            answer(0); /* LISTEN, join, members, lock */
        else if (ev_is_active(&S(0)->retry_timer))
            fire(&S(0)->retry_timer);
    }
    assert_string_not_equal(pending_param(0, "claim"), "");
    int produced = fake_kafka_count();
    T.next_id = 2; /* row 2 comes back first, and a row of another aggregate */
    answer_claim(0, "B,D");
    assert_int_equal(fake_kafka_count(), produced + 1); /* D alone: row 2 is not published */
    assert_int_equal(T.r->unrecordable.n, 1);
}

/* The relay's rows kept apart outlive reconnects, so a claim whose floor look finds the table
 * replaced (TRUNCATE ... RESTART IDENTITY: ids start again) forgets them: a new row with a kept
 * id is published, not left out with its aggregate for up to an hour. On the old code the
 * list stayed: the new row 2 was not produced ("0x4 != 0x5"). */
static void test_unrecordable_forgotten_when_table_replaced(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    S(0)->floor.enabled = true;
    marks_fail("23514");
    answer(0);                                 /* row 1 recorded */
    answer_failing(0, "mark-sent", "23514");   /* row 2: its sent mark refused */
    answer_failing(0, "mark-failed", "23514"); /* ...and its failure mark */
    answer(0);                                 /* row 3 recorded */
    assert_int_equal(T.r->unrecordable.n, 1);
    S(0)->floor.table_node = 5; /* as its first look found (by hand, as floor.enabled) */
    S(0)->floor_look_due = 0;   /* the next claim looks */
    for (int i = 0; i < 12 && !pending_param(0, "claim")[0]; i++) {
        if (fake_pg_pending(PG(0)))
            answer(0);
        else if (ev_is_active(&S(0)->retry_timer))
            fire(&S(0)->retry_timer);
        else if (ev_is_active(&S(0)->poll_timer))
            fire(&S(0)->poll_timer);
    }
    assert_string_not_equal(pending_param(0, "claim"), "");
    assert_non_null(pending_param(0, "floor-held"));
    int produced = fake_kafka_count();
    T.table_node = "6"; /* TRUNCATE ... RESTART IDENTITY: new rows from id 1 */
    T.next_id = 2;      /* a new row 2 comes, and a row of another aggregate */
    answer_claim(0, "B,D");
    assert_int_equal(S(0)->floor.restarts, 1);
    assert_int_equal(fake_kafka_count(), produced + 2);
    assert_int_equal(T.r->unrecordable.n, 0);
}

/* The rows to produce alone are forgotten with the rows kept apart when a claim finds the table
 * replaced (TRUNCATE ... RESTART IDENTITY): their ids may name other rows now. A copy marked to go
 * without its payload (refused alone, then its bare publication failed for a passing reason) left
 * its mark on its id, and a new row dead under that id had its copy published without its
 * payload, a payload no broker had refused. On the old code the new copy went bare (payload_len
 * 0). */
static void test_too_large_set_forgotten_when_table_replaced(void **state)
{
    extra_args[0] = "--dead-letter-topic";
    extra_args[1] = "dead-letters";
    start("1", "1", "60000");
    bring_up_quietly(0);
    S(0)->floor.enabled = true;
    T.dead[0] = "A"; /* row 1: a dead event's copy, alone */
    answer_claim(0, "");
    fake_kafka_report(0, TOO_LARGE); /* refused alone: to go without its payload */
    T.dead[0] = "A";
    reclaim(0, 1, "");
    assert_int_equal(fake_kafka_at(1)->payload_len, 0);
    fake_kafka_report(1, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT); /* kept, to go bare again */
    assert_int_equal(T.r->isolate.n, 1);
    S(0)->floor.table_node = 5; /* as its first look found (by hand, as floor.enabled) */
    S(0)->floor_look_due = 0;   /* the next claim looks */
    for (int i = 0; i < 12 && !pending_param(0, "claim")[0]; i++) {
        if (fake_pg_pending(PG(0)))
            answer(0);
        else if (ev_is_active(&S(0)->retry_timer))
            fire(&S(0)->retry_timer);
        else if (ev_is_active(&S(0)->poll_timer))
            fire(&S(0)->poll_timer);
    }
    assert_string_not_equal(pending_param(0, "claim"), "");
    int produced = fake_kafka_count();
    T.table_node = "6"; /* TRUNCATE ... RESTART IDENTITY: new rows from id 1 */
    T.dead[0] = "C";    /* a new row 1, dead, of another aggregate */
    T.next_id = 1;
    answer_claim(0, "");
    assert_int_equal(S(0)->floor.restarts, 1);
    assert_int_equal(fake_kafka_count(), produced + 1);
    assert_string_equal(fake_kafka_at(produced)->key, "agg-C");
    assert_true(fake_kafka_at(produced)->payload_len > 0); /* with its payload */
    assert_int_equal(T.r->isolate.n, 0);
}

/* The same for a dead event's copy: published to the dead-letter topic, its dead-lettered mark
 * and then its failure mark refused, it is not published again by the next claims. */
static void test_unrecordable_dead_row_kept_apart(void **state)
{
    extra_args[0] = "--dead-letter-topic";
    extra_args[1] = "dead-letters";
    start("1", "1", "60000");
    bring_up_quietly(0);
    T.dead[0] = "A";      /* row 1: dead, to be published to the dead-letter topic */
    answer_claim(0, "B"); /* row 2: an event */
    assert_int_equal(fake_kafka_count(), 2);
    fake_kafka_report_all(OK);
    answer_failing(0, "mark-dead-lettered", "23514");
    answer(0); /* ROLLBACK: row by row */
    while (fake_pg_pending(PG(0))) {
        if (pending_param(0, "mark-dead-lettered")[0])
            answer_failing(0, "mark-dead-lettered", "23514");
        else if (pending_param(0, "mark-dead-letter-failed")[0])
            answer_failing(0, "mark-dead-letter-failed", "23514");
        else
            answer(0);
    }
    fire(&S(0)->retry_timer);
    T.next_id = 1;
    T.dead[0] = "A";                         /* the dead row comes back */
    answer_claim(0, "C");                    /* with an event */
    assert_int_equal(fake_kafka_count(), 3); /* C alone */
    assert_string_not_equal(fake_kafka_at(2)->topic, "dead-letters");
}

/* The next claim the session builds looks at what the floor needs (claim.c looks at most every
 * FLOOR_LOOK_INTERVAL_S, a real-time interval the test does not wait for). */
static void look_next(void)
{
    S(0)->floor_look_due = 0;
}

/* A claim's batch of rows, all delivered and marked (three rows: not chained), the claim after
 * it built with the floor's looks. */
static void deliver_looking(const char *rows)
{
    answer_claim(0, rows);
    fake_kafka_report_all(OK);
    look_next();
    answer(0); /* the marks */
}

/* While a type is held, the claims that leave it out move the floor as usual (a floor kept below
 * the held rows made each claim read past every row sent since the hold began, slower and slower
 * through a refusal of hours); the probe reads from where the floor was when the hold began, and
 * once the type is let go the floor goes back there, so its rows are claimed next, in order.
 * (The floor is turned on by hand: the fake database has no floor check.) */
static void test_floor_moves_during_hold(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    S(0)->floor.enabled = true;
    T.seq_last = "1000";
    fake_kafka_refuse_key("agg-P*", RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    look_next();
    deliver_looking("A,B,C"); /* 1-3, no look: the first claim was sent with the floor off */
    deliver_looking("D,E,F"); /* 4-6: a candidate (1001) */
    deliver_looking("G,H,I"); /* 7-9: confirmed */
    deliver_looking("J,K,L"); /* 10-12: the floor rises to 13 */
    assert_int_equal(S(0)->floor.floor, 13);
    answer_claim(0, "P@pay,M,N"); /* 13-15: pay refused, held */
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{14,15}");
    look_next();
    answer(0);
    assert_int_equal(S(0)->hold.n, 1);
    assert_int_equal(S(0)->floor.floor, 13); /* not past the refused row's batch */
    for (int i = 0; i < 3; i++) {
        assert_string_equal(field(pending_param(0, "claim"), 5), "{\"pay\"}");
        /* nor does a failed row of pay hold the floor back (the floor's look leaves pay out) */
        assert_string_equal(field(pending_param(0, "floor-held"), 1), "{\"pay\"}");
        deliver_looking("Q,R,S");
    }
    /* Past the held row at 13: the claims leaving pay out read from 25, not from 13. */
    assert_int_equal(S(0)->floor.floor, 25);
    assert_string_equal(field(pending_param(0, "claim"), 4), "{25,5,0,1,1000}");
    answer_claim(0, ""); /* caught up */
    answer(0);
    /* The probe reads from where the hold began, below the held row. */
    fake_kafka_refuse_key("agg-P*", RD_KAFKA_RESP_ERR_NO_ERROR);
    look_next();
    fire(&S(0)->hold_timer);
    assert_string_equal(field(pending_param(0, "claim"), 5), "{}");
    assert_string_equal(field(pending_param(0, "claim"), 4), "{13,5,0,1,1000}");
    answer_claim(0, "P@pay"); /* Kafka takes it: the hold ends */
    fake_kafka_report_all(OK);
    assert_int_equal(S(0)->hold.n, 0);
    /* The floor goes back to the hold's start: pay's other rows come next, in order. */
    assert_int_equal(S(0)->floor.floor, 13);
    assert_string_equal(field(pending_param(0, "claim"), 4), "{13,5,0,1,1000}"); /* chained */
    answer(0);
    fake_kafka_report_all(OK);
    answer_claim(0, "");
    assert_int_equal(S(0)->order_breaks, 0);
}

/* A broker's refusal is fatal to the producer (enable.gapless.guarantee), which purges what it
 * held: the messages of other partitions cancelled that way failed for no fault of their rows,
 * and count no attempt against them, like the refused row's own (a setup fault). They stay
 * unsent and go out again on the recreated producer, after the retry backoff. */
static void test_purged_by_fatal_counts_no_attempt(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,B@pay,C@pay");
    assert_int_equal(fake_kafka_count(), 3);
    fake_kafka_set_fatal(true);
    fake_kafka_report(0, RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    fake_kafka_report(1, RD_KAFKA_RESP_ERR__PURGE_INFLIGHT);
    fake_kafka_report(2, RD_KAFKA_RESP_ERR__PURGE_QUEUE);
    assert_string_equal(pending_param(0, "mark-failed"), ""); /* no attempt counted */
    assert_string_equal(pending_param(0, "mark-sent"), "");
    answer(0);
    assert_int_equal(S(0)->total_failed, 0);
    expect_idle_pg(0); /* nothing got through: the retry backoff, then a new producer */
    assert_true(ev_is_active(&S(0)->retry_timer));
}

/* librdkafka refuses to produce (rd_kafka_producev: __FATAL) from the moment its producer failed,
 * which a broker thread decides, before the loop has served the error event that tells the relay
 * (kafka_fatal): a claim answered in between meets the refusal row by row. No row is at fault:
 * each stays unsent, no attempt counted, nothing recorded, as rows the relay did not produce on a
 * producer it knew had failed; the next claim waits for the retry backoff. */
static void test_fatal_refusal_counts_no_attempt(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    fake_kafka_refuse_key("agg-*", RD_KAFKA_RESP_ERR__FATAL); /* failed, not told yet */
    answer_claim(0, "A,A,B");
    assert_int_equal(fake_kafka_count(), 0);
    assert_string_equal(pending_param(0, "mark-failed"), ""); /* no attempt counted */
    assert_string_equal(pending_param(0, "mark-sent"), "");
    answer(0);
    assert_int_equal(S(0)->total_failed, 0);
    expect_idle_pg(0); /* nothing got through: the retry backoff */
    assert_true(ev_is_active(&S(0)->retry_timer));
}

/* librdkafka counts a message in its queue until its delivery report has returned: with a queue
 * of one message (queue.buffering.max.messages=1), the next row, tried from inside the last
 * report, finds it full with nothing of the relay's in flight. It waits for the room the report
 * frees (the loop's next iteration) and goes out then: no row failed, no attempt counted. */
static void test_full_queue_inside_last_report_waits(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    fake_kafka_set_queue_limit(1);
    answer_claim(0, "A,B");
    assert_int_equal(fake_kafka_count(), 1); /* B waits for room */
    fake_kafka_report(0, OK);
    settle(); /* the report has returned: room */
    assert_int_equal(fake_kafka_count(), 2);
    fake_kafka_report(1, OK);
    assert_string_equal(pending_param(0, "mark-failed"), "");
    assert_string_equal(pending_param(0, "mark-sent"), "{1,2}");
    answer(0);
    assert_int_equal(S(0)->total_failed, 0);
}

/* outbox_held_aggregate_types counts the types the sessions hold, each once: two sessions may
 * hold one type (each holds those of its own lanes' batches). */
static void test_held_types_counted_once(void **state)
{
    start("2", "2", "60000");
    const char *held[2][2] = {{"order", "pay"}, {"pay", "ship"}};
    for (int i = 0; i < 2; i++) {
        S(i)->hold.n = 2;
        for (int t = 0; t < 2; t++)
            snprintf(S(i)->hold.types[t], sizeof(S(i)->hold.types[t]), "%s", held[i][t]);
    }
    RelayStatus st;
    relay_status(T.r, &st);
    assert_int_equal(st.held_aggregate_types, 3);
    S(0)->hold.n = S(1)->hold.n = 0;
    relay_status(T.r, &st);
    assert_int_equal(st.held_aggregate_types, 0);
}

/* The hold is bounded: past HOLD_TYPES_MAX refused types the session drops it and waits its
 * retry backoff after each refused batch, claiming everything, as before the hold. A lost
 * connection drops the hold too. */
static void test_hold_bounded_and_dropped(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_WARN);
    char spec[256] = "";
    for (int i = 0; i <= HOLD_TYPES_MAX; i++) {
        char item[32];
        snprintf(item, sizeof(item), "%sR%d@t%d", i ? "," : "", i, i);
        strcat(spec, item);
    }
    fake_kafka_refuse_key("agg-R*", RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC);
    answer_claim(0, spec);
    assert_int_equal(fake_kafka_count(), 0);
    answer(0); /* the marks: nothing */
    assert_int_equal(S(0)->hold.n, 0);
    assert_true(ev_is_active(&S(0)->retry_timer)); /* the old pace */
    assert_false(ev_is_active(&S(0)->hold_timer));
    expect_idle_pg(0);
    assert_int_equal(occurrences(logged(), "more aggregate types than a session holds"), 1);
    fire(&S(0)->retry_timer);
    assert_string_equal(field(pending_param(0, "claim"), 5), "{}");
    answer_claim(0, "R0@t0");
    answer(0);
    assert_int_equal(S(0)->hold.n, 1); /* one fits again */
    assert_true(ev_is_active(&S(0)->hold_timer));
    fake_pg_drop(PG(0), "connection reset by peer");
    assert_int_equal(S(0)->hold.n, 0);
    assert_false(ev_is_active(&S(0)->hold_timer));
}

/* The hold leaves a type out by comparing its name in the claim ($6, a text[] literal), where a
 * name that is not valid UTF-8 (a SQL_ASCII or LATIN1 database holds any bytes) is written with
 * U+FFFD for each stray byte, and so matches no row: the claim that was to leave the type out
 * returned its rows again, Kafka refused them again, and with no retry backoff due the session
 * claimed again at once, batch after batch (a hot loop against PostgreSQL and Kafka). Such a type
 * is not held: the session waits its retry backoff after each refused batch, as past the bound. */
static void test_type_not_utf8_not_held(void **state)
{
    extra_args[0] = "--topic-template";
    extra_args[1] = "outbox.events"; /* one topic: the type's name need not be a topic's */
    start("1", "1", "60000");
    bring_up(0);
    fake_kafka_refuse_key("agg-P*", RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    answer_claim(0, "P@livr\xe9,A"); /* 0xe9: 'e' with an acute accent in Latin-1 */
    fake_kafka_report_all(OK);
    assert_string_equal(pending_param(0, "mark-sent"), "{2}");
    answer(0); /* the marks */
    assert_int_equal(S(0)->hold.n, 0);
    assert_true(ev_is_active(&S(0)->retry_timer));
    expect_idle_pg(0);
    fire(&S(0)->retry_timer);
    assert_string_equal(field(pending_param(0, "claim"), 5), "{}");
}

/* Whatever the cause, a claim that was to leave a held type out and returned a row of it that
 * Kafka refused again would loop at once: the session falls back to its retry backoff. */
static void test_held_type_claimed_anyway_backs_off(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_WARN);
    fake_kafka_refuse_key("agg-P*", RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    answer_claim(0, "P@pay,A");
    fake_kafka_report_all(OK);
    answer(0);
    assert_string_equal(field(pending_param(0, "claim"), 5), "{\"pay\"}");
    answer_claim(0, "P@pay,B"); /* the claim did not leave pay out */
    fake_kafka_report_all(OK);
    answer(0);
    assert_true(ev_is_active(&S(0)->retry_timer));
    expect_idle_pg(0);
    assert_int_equal(occurrences(logged(), "came back in a claim that leaves it out"), 1);
}

/* The guard above is for the types the claim left out, not for one its own batch refused twice:
 * two aggregates of a newly refused type, in a claim that left another type out, are both held. */
static void test_new_type_refused_twice_held(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_WARN);
    fake_kafka_refuse_key("agg-P*", RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED);
    answer_claim(0, "P@pay,A");
    fake_kafka_report_all(OK);
    answer(0);
    assert_string_equal(field(pending_param(0, "claim"), 5), "{\"pay\"}");
    answer_claim(0, "P1@ship,P2@ship,B"); /* ship refused too, by two of its aggregates */
    fake_kafka_report_all(OK);
    answer(0);
    assert_int_equal(S(0)->hold.n, 2);
    assert_false(ev_is_active(&S(0)->retry_timer));
    assert_string_equal(field(pending_param(0, "claim"), 5), "{\"pay\",\"ship\"}");
    assert_int_equal(occurrences(logged(), "came back in a claim that leaves it out"), 0);
}

/* Rows Kafka refused for a fault of the setup that an operator then requeued or deleted leave
 * nothing to deliver: the relay stayed not ready for ever (only a batch delivered without a
 * fault cleared it). A claim that finds nothing clears it. */
static void test_kafka_setup_fault_cleared_by_empty_claim(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_INFO);
    answer_claim(0, "A");
    fake_kafka_report(0, RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC);
    answer(0);           /* its marks: nothing recorded against row 1 */
    answer_claim(0, ""); /* the claim that leaves its type out finds nothing else */
    answer(0);
    expect_idle_pg(0);
    RelayStatus st;
    relay_status(T.r, &st);
    assert_true(st.setup_error[0] != '\0');
    fire(&S(0)->hold_timer);
    answer_claim(0, ""); /* the probe: row 1 was deleted meanwhile, nothing left */
    relay_status(T.r, &st);
    assert_string_equal(st.setup_error, "");
    assert_int_equal(occurrences(logged(), "no events left that Kafka refused"), 1);
}

/* A streak of failing batches ends only with a batch that got something through: one stopped
 * before any of its events was acknowledged (nothing sent, nothing failed) said "deliveries
 * succeed again sent=0" while nothing did. */
static void test_no_success_said_without_a_delivery(void **state)
{
    start("1", "1", "60000");
    bring_up(0);
    capture_log(LOG_INFO);
    answer_claim(0, "A");
    fake_kafka_report(0, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT); /* a passing failure */
    answer(0);                                              /* its marks */
    fire(&S(0)->retry_timer);
    answer_claim(0, "B");
    sigterm(); /* B waits for its report, within the shutdown timeout */
    fire(&S(0)->shutdown_timer);
    const char *text = logged();
    assert_int_equal(occurrences(text, "events not delivered"), 1);
    assert_int_equal(occurrences(text, "deliveries succeed again"), 0);
}

/* --order-scope partition promises order within each topic and partition: an event of the
 * aggregate acknowledged in another topic after an earlier one failed (a partial outage) breaks
 * no promise. It was counted, and logged as "order broken" at error level, as though the scope
 * were the whole aggregate. In the failed event's own topic it still counts. */
static void test_order_scope_partition_breaks(void **state)
{
    extra_args[0] = "--order-scope";
    extra_args[1] = "partition";
    extra_args[2] = "--topic-template";
    extra_args[3] = "ev.{event_type}";
    start("1", "1", "60000");
    bring_up(0);
    answer_claim(0, "A,A:Shipped"); /* rows 1 (ev.Created), 2 (ev.Shipped) */
    assert_int_equal(fake_kafka_count(), 2);
    assert_string_equal(fake_kafka_at(1)->topic, "ev.Shipped");
    fake_kafka_report(1, OK);
    fake_kafka_report(0, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
    assert_int_equal(S(0)->order_breaks, 0);
    answer_claim(0, "B,B"); /* the marks, and the claim behind them: rows 3, 4, one topic */
    fake_kafka_report(3, OK);
    fake_kafka_report(2, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
    assert_int_equal(S(0)->order_breaks, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_batch_chained, teardown),
        cmocka_unit_test_teardown(test_claim_recheck_holds_aggregate, teardown),
        cmocka_unit_test_teardown(test_claim_recheck_full_of_possibly_new, teardown),
        cmocka_unit_test_teardown(test_empty_claim_sleeps, teardown),
        cmocka_unit_test_teardown(test_stop_while_producing, teardown),
        cmocka_unit_test_teardown(test_connection_lost_while_marking, teardown),
        cmocka_unit_test_teardown(test_connection_lost_while_producing, teardown),
        cmocka_unit_test_teardown(test_listen_again_after_floor_check_failed, teardown),
        cmocka_unit_test_teardown(test_floor_checked_again, teardown),
        cmocka_unit_test_teardown(test_floor_turned_off_checked_again, teardown),
        cmocka_unit_test_teardown(test_deaf_session_polls_instead_of_sleeping, teardown),
        cmocka_unit_test_teardown(test_connection_lost_anywhere, teardown),
        cmocka_unit_test_teardown(test_chained_marks_transient_failure, teardown),
        cmocka_unit_test_teardown(test_delivery_timeout_purges, teardown),
        cmocka_unit_test_teardown(test_lanes_handed_over, teardown),
        cmocka_unit_test_teardown(test_failed_unlock_send_reconnects, teardown),
        cmocka_unit_test_teardown(test_session_rests_and_joins, teardown),
        cmocka_unit_test_teardown(test_group_change_during_rebalance, teardown),
        cmocka_unit_test_teardown(test_called_back_while_leaving, teardown),
        cmocka_unit_test_teardown(test_resting_session_keeps_no_kafka_fault, teardown),
        cmocka_unit_test_teardown(test_rests_when_lower_session_connects, teardown),
        cmocka_unit_test_teardown(test_rejoin_after_reconnect, teardown),
        cmocka_unit_test_teardown(test_members_replaced_between_looks, teardown),
        cmocka_unit_test_teardown(test_away_relay_gives_lanes_to_peers, teardown),
        cmocka_unit_test_teardown(test_refused_mark_warned_once, teardown),
        cmocka_unit_test_teardown(test_away_trying_switch_takes_new_mark_first, teardown),
        cmocka_unit_test_teardown(test_one_purge_counts_one_timeout, teardown),
        cmocka_unit_test_teardown(test_away_relay_tries_soon_after_an_outage_for_everyone,
                                  teardown),
        cmocka_unit_test_teardown(test_rebalance_tick_during_look, teardown),
        cmocka_unit_test_teardown(test_row_by_row_after_row_fault, teardown),
        cmocka_unit_test_teardown(test_row_by_row_after_chained_marks, teardown),
        cmocka_unit_test_teardown(test_transient_mark_failures, teardown),
        cmocka_unit_test_teardown(test_rolled_back_batch_not_counted, teardown),
        cmocka_unit_test_teardown(test_row_by_row_counts_recorded_rows, teardown),
        cmocka_unit_test_teardown(test_permanent_failures_by_row_no_backoff, teardown),
        cmocka_unit_test_teardown(test_row_by_row_lost_counts_recorded, teardown),
        cmocka_unit_test_teardown(test_every_sent_mark_refused_backs_off, teardown),
        cmocka_unit_test_teardown(test_claim_failure_waits_for_backoff, teardown),
        cmocka_unit_test_teardown(test_empty_claim_resets_claim_backoff, teardown),
        cmocka_unit_test_teardown(test_setup_fault, teardown),
        cmocka_unit_test_teardown(test_lane_look_setup_fault, teardown),
        cmocka_unit_test_teardown(test_lane_lock_function_setup_fault, teardown),
        cmocka_unit_test_teardown(test_setup_fault_scrubbed_before_cut, teardown),
        cmocka_unit_test_teardown(test_lower_setup_fault_hands_over, teardown),
        cmocka_unit_test_teardown(test_stand_in_works_while_batch_abandoned, teardown),
        cmocka_unit_test_teardown(test_claim_again_after_floor_restart, teardown),
        cmocka_unit_test_teardown(test_refused_event_holds_its_aggregate, teardown),
        cmocka_unit_test_teardown(test_claims_once_producer_may_be_recreated, teardown),
        cmocka_unit_test_teardown(test_claims_once_producer_may_be_recreated_late, teardown),
        cmocka_unit_test_teardown(test_setup_probe_keeps_its_backoff, teardown),
        cmocka_unit_test_teardown(test_producer_recreated_outside_its_report, teardown),
        cmocka_unit_test_teardown(test_failing_producer_recreated_at_a_pace, teardown),
        cmocka_unit_test_teardown(test_failed_producer_destroyed_off_the_loop, teardown),
        cmocka_unit_test_teardown(test_producer_not_recreated_over_a_fifo, teardown),
        cmocka_unit_test_teardown(test_producer_not_recreated_over_a_fifo_at_the_pin, teardown),
        cmocka_unit_test_teardown(test_producer_refused_recreation_said_once, teardown),
        cmocka_unit_test_teardown(test_freed_producer_destroyed_off_the_loop, teardown),
        cmocka_unit_test_teardown(test_given_up_batch_producer_freed_off_the_loop, teardown),
        cmocka_unit_test_teardown(test_guard_leaves_before_final_claim, teardown),
        cmocka_unit_test_teardown(test_busy_sleeps_on_waiter, teardown),
        cmocka_unit_test_teardown(test_waiter_kept_while_refused, teardown),
        cmocka_unit_test_teardown(test_lost_guard_ended_after_reconnect, teardown),
        cmocka_unit_test_teardown(test_lost_lanes_ended_after_reconnect, teardown),
        cmocka_unit_test_teardown(test_lost_process_spares_own_sessions, teardown),
        cmocka_unit_test_teardown(test_stop_ends_lost_process, teardown),
        cmocka_unit_test_teardown(test_mark_retries_end_with_recorded_failures, teardown),
        cmocka_unit_test_teardown(test_long_mark_error_logged_once, teardown),
        cmocka_unit_test_teardown(test_claim_recheck_held_whole_backs_off, teardown),
        cmocka_unit_test_teardown(test_floor_off_said_per_database, teardown),
        cmocka_unit_test_teardown(test_floor_off_said_again_after_it_worked, teardown),
        cmocka_unit_test_teardown(test_listen_failed_does_not_blame_floor, teardown),
        cmocka_unit_test_teardown(test_dead_letter_failure_logged, teardown),
        cmocka_unit_test_teardown(test_dead_letter_copies_counted_apart, teardown),
        cmocka_unit_test_teardown(test_dead_letter_copies_counted_apart_by_row, teardown),
        cmocka_unit_test_teardown(test_dead_letter_failure_logged_during_event_failures, teardown),
        cmocka_unit_test_teardown(test_kafka_setup_fault_counts_no_attempt, teardown),
        cmocka_unit_test_teardown(test_kafka_setup_fault_cleared_by_empty_claim, teardown),
        cmocka_unit_test_teardown(test_refused_type_held_others_go_on, teardown),
        cmocka_unit_test_teardown(test_held_types_counted_once, teardown),
        cmocka_unit_test_teardown(test_hold_bounded_and_dropped, teardown),
        cmocka_unit_test_teardown(test_type_not_utf8_not_held, teardown),
        cmocka_unit_test_teardown(test_held_type_claimed_anyway_backs_off, teardown),
        cmocka_unit_test_teardown(test_new_type_refused_twice_held, teardown),
        cmocka_unit_test_teardown(test_no_success_said_without_a_delivery, teardown),
        cmocka_unit_test_teardown(test_order_scope_partition_breaks, teardown),
        cmocka_unit_test_teardown(test_floor_moves_during_hold, teardown),
        cmocka_unit_test_teardown(test_purged_by_fatal_counts_no_attempt, teardown),
        cmocka_unit_test_teardown(test_fatal_refusal_counts_no_attempt, teardown),
        cmocka_unit_test_teardown(test_full_queue_inside_last_report_waits, teardown),
        cmocka_unit_test_teardown(test_too_large_names_its_sizes, teardown),
        cmocka_unit_test_teardown(test_too_large_request_isolates_rows, teardown),
        cmocka_unit_test_teardown(test_too_large_request_isolate_cap, teardown),
        cmocka_unit_test_teardown(test_too_large_request_isolation_relay_wide, teardown),
        cmocka_unit_test_teardown(test_too_large_request_episode_ends_with_stale_rows, teardown),
        cmocka_unit_test_teardown(test_too_large_request_isolates_copies, teardown),
        cmocka_unit_test_teardown(test_too_large_request_copy_refused_bare, teardown),
        cmocka_unit_test_teardown(test_too_large_copy_bare_flag_goes_stale, teardown),
        cmocka_unit_test_teardown(test_too_large_copy_bare_in_full_set, teardown),
        cmocka_unit_test_teardown(test_unrecordable_row_kept_apart, teardown),
        cmocka_unit_test_teardown(test_unrecordable_row_kept_apart_across_reconnect, teardown),
        cmocka_unit_test_teardown(test_unrecordable_forgotten_when_table_replaced, teardown),
        cmocka_unit_test_teardown(test_too_large_set_forgotten_when_table_replaced, teardown),
        cmocka_unit_test_teardown(test_unrecordable_dead_row_kept_apart, teardown),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    print_coverage();
    return failed;
}
