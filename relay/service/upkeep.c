#include "upkeep.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "monotime.h"
#include "metrics.h"
#include "pg.h"
#include "xiddate.h"
#include "squatters.h"
#include "statements.h"
#include "table.h"

#define STR2(x) #x
#define STR(x) STR2(x)

/* Bounds every statement of this session: a backlog count over a huge table, say, gives up and
 * is retried at the next interval instead of piling up. */
#define UPKEEP_STATEMENT_TIMEOUT_S 30
/* A vacuum horizon holder as "KIND WHO START": the kind and a prepared transaction's gid (up to
 * 200 bytes) whole, or two long gids that begin alike compare equal and the second is never
 * logged; and its transaction's start (SQL_HORIZON), so that its next one is another. */
#define HOLDER_START_MAX 40
#define HOLDER_MAX (32 + 1 + 256 + 1 + HOLDER_START_MAX)
/* The session's bound, unless one at most as long is in force already (the URL's options, the
 * role's or the database's setting): a SET overrode a stricter one, so retention's DELETEs ran
 * up to 30 s where the operator allowed 5. */
static const char *const SQL_SETUP =
    DB_BOUND_SETTING_SQL("statement_timeout", STR(UPKEEP_STATEMENT_TIMEOUT_S) "s", "false");
static const char *const SQL_APPNAME = "SET application_name = 'outbox-relay upkeep'";

/* Templates for the configured table (relay/outbox/table.h). */
enum {
    UPKEEP_BACKLOG,
    UPKEEP_RETENTION,
    UPKEEP_RETENTION_OLDEST,
    UPKEEP_SQUATTERS,
    UPKEEP_SQL_COUNT
};

/* What a result or error belongs to (note_result), as its log lines name it: the backlog
 * refresh (the count, and the oldest sent row's age with --retention) apart from the quick looks
 * sent beside it (lane squatters, vacuum horizon), which go every interval while the count is
 * paced to ten times its own time (pace_backlog). */
typedef enum {
    UPKEEP_TASK_SETUP,
    UPKEEP_TASK_BACKLOG,
    UPKEEP_TASK_LOOKS,
    UPKEEP_TASK_RETENTION,
    UPKEEP_TASK_COUNT
} UpkeepTask;
static const char *const task_names[UPKEEP_TASK_COUNT] = {"setup", "backlog", "looks", "retention"};
static const char *const sql_templates[UPKEEP_SQL_COUNT] = {
    [UPKEEP_BACKLOG] = SQL_BACKLOG,
    [UPKEEP_RETENTION] = SQL_RETENTION(STR(RETENTION_BATCH)),
    [UPKEEP_RETENTION_OLDEST] = SQL_RETENTION_OLDEST,
    [UPKEEP_SQUATTERS] = SQL_LANE_SQUATTERS,
};

struct Upkeep {
    struct ev_loop *loop;
    const Config *cfg;
    bool gauges;
    /* Connects for each tick's work and closes after it (upkeep_new_on_demand): one database of
     * many, which should cost one connection (its claim session's) while idle. */
    bool on_demand;
    double interval;      /* seconds between ticks: gauge_interval() */
    ev_timer close_timer; /* closes an on-demand connection outside the callbacks that use it */
    long retention_s;     /* the value the timer runs with */
    PgConn *pg;
    char *sql[UPKEEP_SQL_COUNT]; /* expanded at the first connection */
    bool ready;                  /* connected and session set up */
    bool connected_before;       /* a connection of this upkeep has been up */
    /* On demand, gauge_timer is the one tick of both tasks (see on_gauge_timer) and
     * retention_timer stays stopped; swept_at is when that tick last made retention due
     * (monotime: ev_now() is the wall clock, and a clock stepped back an hour held every sweep
     * back for that hour). */
    ev_timer gauge_timer, retention_timer;
    double swept_at;
    bool gauge_due, retention_due;
    double gauge_sent_at;   /* monotime the looks in flight were sent */
    bool backlog_sent;      /* the backlog count is among them */
    bool oldest_sent;       /* and the oldest sent row's age (retention on) */
    double backlog_next_at; /* monotime before which the count is not sent again (pace_backlog) */
    bool sweeping;          /* the last delete was full: more to go */
    long long swept;        /* rows deleted by the current sweep */
    /* Where the current sweep's next batch starts (SQL_RETENTION's $2): the newest sent_at the
     * last batch deleted, in UTC as SQL_RETENTION prints it; "-infinity" at a sweep's start. */
    char sweep_from[64];
    /* Each task's last error, "" while its queries work (note_result). */
    char last_error[UPKEEP_TASK_COUNT][256];
    char horizon_logged[HOLDER_MAX]; /* the holder last logged as holding back vacuum, "" when
                                      * none */
    /* Its kind and id apart, SQL_HORIZON's parameters (the kind may hold a space; a prepared
     * transaction's gid up to 200 bytes), and those parameters. */
    char horizon_logged_kind[32], horizon_logged_who[256], horizon_logged_start[HOLDER_START_MAX];
    const char *horizon_params[3];
    /* Dates a slot's xmin (note_horizon), by samples of the server with this system identifier
     * and timeline (the last seen outside recovery), "" before the first look. */
    XidDates xid_dates;
    char server_sysid[24], server_timeline[12];
    /* Sessions seen holding lane-group locks no relay would hold (SQL_LANE_SQUATTERS): the last
     * look's slot holders without lanes (squatters.h: counted at the second look in a row), and
     * the holders logged (squat_key), so each is named once. */
    SquatSeen slot_only;
    long long logged[UPKEEP_SQUATTERS_MAX];
    int n_logged;
    int squatters;       /* as of the last look */
    double squatters_at; /* monotime of the last look that answered (0: none yet) */
    /* Its database's log context and metrics registry (current at upkeep_new), made current by
     * each of its callbacks: a process may serve several databases. */
    const char *log_context;
    MetricsDb *metrics;
};

static void enter(const Upkeep *u)
{
    log_set_context(u->log_context);
    metrics_select(u->metrics);
}

static void kick(Upkeep *u);

static bool key_in(const long long *keys, int n, long long key)
{
    for (int i = 0; i < n; i++)
        if (keys[i] == key)
            return true;
    return false;
}

/* Who row `row` of a SQL_LANE_SQUATTERS look is: its pid, or for a prepared transaction (no pid:
 * every one of them would be the same "0") -1 - its xid, which no pid is. */
static long long squat_key(PGresult *r, int row)
{
    if (PQgetisnull(r, row, 0))
        return -1 - strtoll(PQgetvalue(r, row, 9), NULL, 10);
    return atoi(PQgetvalue(r, row, 0));
}

/* Reads SQL_LANE_SQUATTERS: names each new holder once, says once when none is left, and keeps
 * the count for /readyz and the metric. Aggregates of lanes such a session holds wait for it
 * (no relay can claim them): that is worth an operator's attention, not a silent stall. */
static void note_squatters(Upkeep *u, PGresult *r)
{
    SquatSeen slot_only = {0};
    long long found[UPKEEP_SQUATTERS_MAX];
    int n_found = 0;
    for (int i = 0; i < PQntuples(r) && n_found < UPKEEP_SQUATTERS_MAX; i++) {
        if (!squat_counts(r, i, &u->slot_only, &slot_only))
            continue; /* a relay joining, perhaps: counted if still so at the next look */
        long long key = squat_key(r, i);
        found[n_found++] = key;
        if (key_in(u->logged, u->n_logged, key))
            continue;
        char q1[160], q2[160], q3[80];
        if (PQgetisnull(r, i, 0)) {
            /* No session to end: it waits for COMMIT PREPARED or ROLLBACK PREPARED. A gid is up
             * to 200 bytes, each quoted in up to 2. */
            char gid[420];
            log_warn("a prepared transaction that is not a relay holds the lane group's locks: the "
                     "aggregates of its lanes wait until it is committed or rolled back (ROLLBACK "
                     "PREPARED), and the relay is not ready",
                     "gid=%s owner=%s age_s=%s what=%s lanes=%s slots=%s",
                     log_quote(PQgetvalue(r, i, 7), gid, sizeof(gid)),
                     log_quote(PQgetvalue(r, i, 4), q2, sizeof(q2)),
                     PQgetisnull(r, i, 8) ? "-" : PQgetvalue(r, i, 8), PQgetvalue(r, i, 1),
                     PQgetvalue(r, i, 2), PQgetvalue(r, i, 3));
            continue;
        }
        log_warn("a session that is not a relay holds the lane group's locks: the aggregates of "
                 "its lanes wait until it ends, and the relay is not ready",
                 "pid=%s what=%s lanes=%s slots=%s role=%s application=%s client=%s",
                 PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2), PQgetvalue(r, i, 3),
                 log_quote(PQgetvalue(r, i, 4), q1, sizeof(q1)),
                 log_quote(PQgetvalue(r, i, 5), q2, sizeof(q2)),
                 log_quote(PQgetvalue(r, i, 6), q3, sizeof(q3)));
    }
    if (n_found == 0 && u->squatters > 0)
        log_info("no session but relays holds the lane group's locks any more", NULL);
    u->slot_only = slot_only;
    memcpy(u->logged, found, sizeof(found[0]) * (size_t)n_found);
    u->n_logged = n_found;
    u->squatters = n_found;
    metrics_set_lane_squatters(n_found);
}

/* A look older than this is no answer: the connection is down, or the looks fail. Its count is
 * then not reported (readiness should neither stay refused for a holder long gone nor be refused
 * by a failing side connection); the metric keeps the last value. The looks go every gauge
 * interval; a backlog count in flight may hold the connection up to its statement timeout. */
static double squatters_stale_after(const Upkeep *u)
{
    return 3.0 * u->interval + UPKEEP_STATEMENT_TIMEOUT_S;
}

int upkeep_lane_squatters(const Upkeep *u)
{
    if (!u || u->squatters_at <= 0 || monotime_now() - u->squatters_at > squatters_stale_after(u))
        return 0;
    return u->squatters;
}

double upkeep_retention_interval(long retention_s)
{
    double s = (double)retention_s / 4.0;
    return s < 1.0 ? 1.0 : s > 60.0 ? 60.0 : s;
}

/* One warn line per new error of a task; repeats at debug level; one info line when it clears.
 * Kept per task: with one error for all, a retention batch that worked between two failed
 * refreshes said "upkeep queries work again", and the refresh's next failure was new again,
 * so a gauge read failing for good logged warn and info lines every interval. */
static void note_result(Upkeep *u, UpkeepTask task, const char *error)
{
    char q[512];
    char *last = u->last_error[task];
    if (!error) {
        if (last[0])
            log_info("upkeep queries work again", "task=%s", task_names[task]);
        last[0] = '\0';
        return;
    }
    LogLevel level = strcmp(error, last) == 0 ? LOG_DEBUG : LOG_WARN;
    log_write(level, "upkeep query failed; retrying at the next interval", "task=%s error=%s",
              task_names[task], log_quote(error, q, sizeof(q)));
    snprintf(last, sizeof(u->last_error[task]), "%s", error);
}

static void forget_horizon_holder(Upkeep *u)
{
    u->horizon_logged[0] = u->horizon_logged_kind[0] = u->horizon_logged_who[0] = '\0';
    u->horizon_logged_start[0] = '\0';
}

/* The 64-bit transaction id whose low 32 bits are `xid32`, within 2^31 of `next_xid` (64 bits):
 * a slot's xmin may be a little past the snapshot's xmax (a standby knows of transactions not
 * yet committed), never 2^31 away from it (wraparound stops the server first). */
static long long xid_widen(long long next_xid, long long xid32)
{
    long long d = (long long)(uint32_t)((uint64_t)next_xid - (uint64_t)xid32);
    if (d >= 2147483648LL)
        d -= 4294967296LL;
    return next_xid - d;
}

/* Sets the vacuum horizon gauges from SQL_HORIZON's row, and says once per holder when one has
 * held its snapshot for over --horizon-warn: dead row versions pile up behind it, in the outbox
 * as everywhere, and every claim walks them (docs/operations.md#dead-rows-and-old-snapshots). */
static void note_horizon(Upkeep *u, PGresult *r)
{
    if (PQntuples(r) != 1) {
        metrics_set_vacuum_horizon(0, -1.0);
        if (u->horizon_logged[0])
            log_info("nothing holds back vacuum any more", NULL);
        forget_horizon_holder(u);
        return;
    }
    char holder[HOLDER_MAX];
    snprintf(holder, sizeof(holder), "%s %s %s", PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1),
             PQgetvalue(r, 0, 9));
    double now = monotime_now();
    long long xids = strtoll(PQgetvalue(r, 0, 5), NULL, 10);
    long long next_xid = strtoll(PQgetvalue(r, 0, 7), NULL, 10);
    long long last_xid = u->xid_dates.n > 0 ? u->xid_dates.s[u->xid_dates.n - 1].next_xid : 0;
    /* Once per step back (the samples then rise from it again): until then a slot's xmin was
     * dated by another server's history. */
    const char *sysid = PQgetvalue(r, 0, 10);
    char timeline[sizeof(u->server_timeline)];
    snprintf(timeline, sizeof(timeline), "%.8s", PQgetvalue(r, 0, 11));
    bool another =
        (u->server_sysid[0] && strcmp(sysid, u->server_sysid) != 0) ||
        (u->server_timeline[0] && timeline[0] && strcmp(timeline, u->server_timeline) != 0);
    bool went_back = xiddate_sample(&u->xid_dates, next_xid, now);
    if (went_back)
        log_info("the next transaction id went back: another server (a failover, a restore); "
                 "replication slots are dated from this look on",
                 "next_xid=%lld before=%lld", next_xid, last_xid);
    else if (another) {
        /* A standby promoted passes the old server's last id within moments of writes: its next
         * id no longer went back, and the old server's history dated its slots. A new timeline
         * (a promotion, a point-in-time restore) or system identifier (another cluster) says
         * so whatever the ids did; this look's sample is the new server's first. */
        char q0[32], q1[32], q2[64], q3[64];
        log_info("the server's timeline or system identifier changed: another server (a failover, "
                 "a restore); replication slots are dated from this look on",
                 "timeline=%s before=%s system_identifier=%s before_system_identifier=%s",
                 log_quote(timeline, q0, sizeof(q0)), log_quote(u->server_timeline, q1, sizeof(q1)),
                 log_quote(sysid, q2, sizeof(q2)), log_quote(u->server_sysid, q3, sizeof(q3)));
        xiddate_init(&u->xid_dates);
        xiddate_sample(&u->xid_dates, next_xid, now);
    }
    snprintf(u->server_sysid, sizeof(u->server_sysid), "%s", sysid);
    /* A standby's timeline is unknown (""): the last known one stays, unless the samples started
     * over at this look (a lagging standby's ids went back): they are then this server's, and its
     * promotion (a timeline at last) is no other server. */
    if (timeline[0] || went_back)
        snprintf(u->server_timeline, sizeof(u->server_timeline), "%s", timeline);
    /* A slot, or a walsender holding a standby's feedback (in no transaction), has no start time
     * of its own in PostgreSQL: its xmin is dated, since the first look that saw a transaction
     * id past it, so since dead rows could be kept for it (a lower bound: before the first look,
     * a relay restarted, nothing is known). Timed by the slot's
     * name, a healthy standby whose hot_standby_feedback moves the xmin on every few seconds held
     * for as long as the relay ran; timed from when its xmin last changed, a standby whose long
     * queries overlap (each change of the oldest leaves one almost as old) never held, however
     * far behind the horizon stood. Dated, both are what they are; 0 when no transaction came
     * after it (a quiet database holds nothing back). The xmin is 64 bits placed within 2^31 of
     * next_xid (the snapshot's xmax, as the samples), not next_xid - xids: age() counts from the
     * next id to be assigned, past transactions in flight, and a slot whose xmin was past every
     * commit then read as one before it, dated to that commit's first look, however long ago. */
    long long xmin = xid_widen(next_xid, strtoll(PQgetvalue(r, 0, 8), NULL, 10));
    double held = PQgetisnull(r, 0, 4) ? xiddate_held(&u->xid_dates, xmin, now)
                                       : strtod(PQgetvalue(r, 0, 4), NULL);
    double warn_s = u->cfg->horizon_warn_s > 0 ? (double)u->cfg->horizon_warn_s : 1e300;
    metrics_set_vacuum_horizon(xids, held);
    if (held >= warn_s && strcmp(holder, u->horizon_logged) != 0) {
        char qk[40], q0[512], q1[160], q2[160];
        /* id is a backend's pid, or a prepared transaction's name, which any role chooses; the
         * kind is quoted too ("replication slot": a bare space would end the field). */
        log_warn("an old snapshot holds back vacuum; dead rows pile up and claims slow down",
                 "holder=%s id=%s application=%s state=%s held_s=%.0f xids=%lld",
                 log_quote(PQgetvalue(r, 0, 0), qk, sizeof(qk)),
                 log_quote(PQgetvalue(r, 0, 1), q0, sizeof(q0)),
                 log_quote(PQgetvalue(r, 0, 2), q1, sizeof(q1)),
                 log_quote(PQgetvalue(r, 0, 3), q2, sizeof(q2)), held, xids);
        snprintf(u->horizon_logged, sizeof(u->horizon_logged), "%s", holder);
        snprintf(u->horizon_logged_kind, sizeof(u->horizon_logged_kind), "%s", PQgetvalue(r, 0, 0));
        snprintf(u->horizon_logged_who, sizeof(u->horizon_logged_who), "%s", PQgetvalue(r, 0, 1));
        snprintf(u->horizon_logged_start, sizeof(u->horizon_logged_start), "%s",
                 PQgetvalue(r, 0, 9));
    } else if (held < warn_s && u->horizon_logged[0] &&
               (strcmp(holder, u->horizon_logged) == 0 || strcmp(PQgetvalue(r, 0, 6), "t") != 0)) {
        /* The snapshot logged is gone, but another (younger than --horizon-warn) holds one:
         * "nothing holds back vacuum" was false. That one may be the same holder's (a backend in
         * its next transaction, a slot whose xmin moved on). While the one logged still holds,
         * though no longer the oldest by xids, nothing is said: it still does what was logged. */
        char qk[40], q0[512];
        log_info("the old snapshot logged as holding back vacuum is gone; the oldest holding one "
                 "now has held it less than --horizon-warn",
                 "holder=%s id=%s held_s=%.0f xids=%lld",
                 log_quote(PQgetvalue(r, 0, 0), qk, sizeof(qk)),
                 log_quote(PQgetvalue(r, 0, 1), q0, sizeof(q0)), held, xids);
        forget_horizon_holder(u);
    }
}

static double gauge_interval(const Upkeep *u)
{
    return u->interval;
}

/* The backlog query reads every entry of the unsent index, dead versions an old snapshot keeps
 * included (the claims skip them, see floor.h; a count cannot): it may take seconds. So the next
 * count waits at least ten times as long as this one took, and the upkeep connection spends at
 * most a tenth of its time on it. outbox_backlog_refresh_timestamp_seconds shows the pace. The
 * quick looks (vacuum horizon, lane squatters) keep the gauge interval: /readyz reads the
 * squatters, and a count paced to five minutes once kept a holder long gone refusing it. */
static void pace_backlog(Upkeep *u)
{
    double took = monotime_now() - u->gauge_sent_at, every = 10.0 * took;
    if (every < gauge_interval(u))
        every = gauge_interval(u);
    /* Half an interval early is due: the tick that comes at `every` sends it. */
    u->backlog_next_at = u->gauge_sent_at + every - gauge_interval(u) / 2.0;
    /* Shown, so that OutboxGaugesStale waits for a slow count's next turn: ten times a 24-30 s
     * count is four to five minutes between refreshes, past the alert's two. */
    metrics_set_backlog_pace(every);
}

static void on_backlog(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Upkeep *u = arg;
    enter(u);
    if (!results)
        return; /* connection lost: on_state takes over */
    u->gauge_due = false;
    /* In the order kick sends them: the squatters (readiness), the count when due and with it
     * the oldest sent row's age when retention is on, the horizon. One pipeline: the statements
     * after a failed one are skipped, so a count that fails or times out never takes the
     * squatter look with it, and a horizon look the server refuses (pg_replication_slots
     * restricted, say) takes nothing. */
    int at = 0, horizon_at = 1 + (u->backlog_sent ? 1 : 0) + (u->oldest_sent ? 1 : 0);
    if (n > at && PQresultStatus(results[at]) == PGRES_TUPLES_OK) {
        note_squatters(u, results[at]);
        u->squatters_at = monotime_now();
    }
    at++;
    if (u->backlog_sent) {
        pace_backlog(u);
        /* The count and the oldest sent row's age are one refresh, stamped with one time
         * (outbox_backlog_refresh_timestamp_seconds): set only when each of them was read. An
         * age that failed while the count answered kept its last value under a fresh stamp, so
         * OutboxGaugesStale never saw it and OutboxRetentionBehind read an old "keeps up"; now
         * the stamp stops, and that alert fires. */
        PGresult *count = n > at ? results[at] : NULL;
        PGresult *oldest = u->oldest_sent && n > at + 1 ? results[at + 1] : NULL;
        bool counted = count && PQresultStatus(count) == PGRES_TUPLES_OK && PQntuples(count) == 1;
        bool aged = !u->oldest_sent || (oldest && PQresultStatus(oldest) == PGRES_TUPLES_OK);
        if (counted && aged) {
            /* Retention keeps up while no sent row outlives it by more than a sweep's interval
             * (the rows turn due between sweeps); a sweep that fails, times out, is skipped by
             * locks or deletes less than arrives shows as this growing (the alert
             * OutboxRetentionBehind). */
            if (u->oldest_sent)
                metrics_set_retention_overdue(u->retention_s > 0,
                                              PQntuples(oldest) == 1
                                                  ? strtod(PQgetvalue(oldest, 0, 0), NULL) -
                                                        (double)u->retention_s
                                                  : 0.0);
            metrics_set_backlog(strtoll(PQgetvalue(count, 0, BACKLOG_UNSENT), NULL, 10),
                                strtoll(PQgetvalue(count, 0, BACKLOG_DEAD), NULL, 10),
                                strtoll(PQgetvalue(count, 0, BACKLOG_DEAD_LETTER_FAILED), NULL, 10),
                                PQgetisnull(count, 0, BACKLOG_OLDEST_AGE_S)
                                    ? -1.0
                                    : strtod(PQgetvalue(count, 0, BACKLOG_OLDEST_AGE_S), NULL));
        }
    }
    if (n > horizon_at && PQresultStatus(results[horizon_at]) == PGRES_TUPLES_OK)
        note_horizon(u, results[horizon_at]);
    /* Each task's outcome from the statement that failed first (the ones after it did not run,
     * so say nothing of theirs). The refresh apart from the looks: a count failing for good is
     * paced to ten times the time it took (a statement timeout: every 5 min), and the looks that
     * worked in between said "upkeep queries work again" (task=backlog) each time, so the next
     * failed count was new again: a warn line and an info line every count instead of one. */
    int failed = n == horizon_at + 1 ? pg_first_failed(results, n) : 0;
    const char *why = failed == horizon_at + 1 ? NULL : error ? error : "unexpected result";
    if (u->backlog_sent && failed >= 1)
        note_result(u, UPKEEP_TASK_BACKLOG, failed < horizon_at ? why : NULL);
    if (failed == 0 || failed >= horizon_at)
        note_result(u, UPKEEP_TASK_LOOKS, why);
    kick(u);
}

/* The next batch is a new sweep's first: from the oldest sent row on. */
static void sweep_restart(Upkeep *u)
{
    u->sweeping = false;
    u->swept = 0;
    snprintf(u->sweep_from, sizeof(u->sweep_from), "-infinity");
}

static void on_deleted(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Upkeep *u = arg;
    enter(u);
    if (!results)
        return;
    u->retention_due = false;
    /* As kick sends them: the planner settings, then the delete. */
    PGresult *r = n == 2 ? results[1] : NULL;
    bool answered = !error && r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    long long deleted = answered ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    metrics_retention_deleted(deleted);
    u->swept += deleted;
    u->sweeping = answered && deleted >= RETENTION_BATCH &&
                  strlen(PQgetvalue(r, 0, 1)) < sizeof(u->sweep_from);
    if (u->sweeping) {
        /* NULL: the batch's rows were all sent at -infinity, where the cursor still is. */
        if (!PQgetisnull(r, 0, 1))
            snprintf(u->sweep_from, sizeof(u->sweep_from), "%s", PQgetvalue(r, 0, 1));
    } else {
        log_debug("retention sweep done", "deleted=%lld retention_s=%ld", u->swept, u->retention_s);
        sweep_restart(u);
    }
    note_result(u, UPKEEP_TASK_RETENTION, error);
    kick(u);
}

static void on_state(PgConn *pg, bool up, const char *reason, void *arg);
static void on_notify(PgConn *pg, const char *channel, const char *payload, void *arg);

static bool work_due(const Upkeep *u)
{
    return (u->gauge_due && u->gauges) || ((u->retention_due || u->sweeping) && u->retention_s > 0);
}

static void open_connection(Upkeep *u)
{
    u->pg = pg_conn_new_named(u->loop, u->cfg->database_url, "upkeep", on_state, on_notify, u);
    /* On demand, the first connection says "postgres connected", not every one after it. */
    if (u->pg && u->connected_before)
        pg_conn_seen_before(u->pg);
    /* Its statements may run up to their statement_timeout (SQL_SETUP): wait a little longer
     * for the server's own error before giving the connection up. */
    if (u->pg)
        pg_conn_set_request_timeout(u->pg, UPKEEP_STATEMENT_TIMEOUT_S + 5.0);
}

static void close_connection(Upkeep *u)
{
    ev_timer_stop(u->loop, &u->close_timer);
    pg_conn_free(u->pg);
    u->pg = NULL;
    u->ready = false;
}

/* Sends the next due query when the connection is free: the gauges first (cheap, and a long
 * sweep must not starve them), then the next retention batch. On demand, a due query opens the
 * connection and the last one done closes it (at the next loop iteration: kick runs inside the
 * connection's callbacks, which must not free it). */
static void kick(Upkeep *u)
{
    if (u->on_demand && !u->pg && work_due(u))
        open_connection(u); /* on_setup kicks again once it is up */
    if (!u->pg || !u->ready || !pg_conn_idle(u->pg))
        return;
    if (u->on_demand && !work_due(u)) {
        /* Already pending when kicked twice in one iteration (a SIGHUP's reconfigure beside a
         * query's callback): libev forbids re-setting an active timer, and once is enough. */
        if (!ev_is_active(&u->close_timer))
            ev_timer_start(u->loop, &u->close_timer);
        return;
    }
    if (u->gauge_due && u->gauges) {
        u->gauge_sent_at = monotime_now();
        u->backlog_sent = u->gauge_sent_at >= u->backlog_next_at;
        /* Paced with the count (pace_backlog): under an old snapshot it walks the index entries
         * of every row retention deleted since, as the sweep does. */
        u->oldest_sent = u->backlog_sent && u->retention_s > 0;
        PgQuery q[4];
        int n = 0;
        q[n++] = (PgQuery){u->sql[UPKEEP_SQUATTERS], 0, NULL, false};
        if (u->backlog_sent)
            q[n++] = (PgQuery){u->sql[UPKEEP_BACKLOG], 0, NULL, false};
        if (u->oldest_sent)
            q[n++] = (PgQuery){u->sql[UPKEEP_RETENTION_OLDEST], 0, NULL, false};
        q[n++] = (PgQuery){SQL_HORIZON, 3, u->horizon_params, false};
        if (!pg_conn_send(u->pg, q, n, on_backlog, u))
            u->gauge_due = false;
        return;
    }
    if ((u->retention_due || u->sweeping) && u->retention_s > 0) {
        char secs[32];
        snprintf(secs, sizeof(secs), "%ld", u->retention_s);
        const char *params[2] = {secs, u->sweep_from};
        PgQuery q[2] = {{SQL_RETENTION_PLAN, 0, NULL, false},
                        {u->sql[UPKEEP_RETENTION], 2, params, false}};
        if (!pg_conn_send(u->pg, q, 2, on_deleted, u)) {
            u->retention_due = false;
            sweep_restart(u);
        }
    }
}

static void on_setup(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Upkeep *u = arg;
    enter(u);
    if (!results)
        return;
    if (error) {
        note_result(u, UPKEEP_TASK_SETUP, error);
        pg_conn_reset(pg, "upkeep session setup failed");
        return;
    }
    u->ready = true;
    note_result(u, UPKEEP_TASK_SETUP, NULL);
    /* A new connection refreshes the gauges and sweeps at once (the state may have changed while
     * it was down). On demand, the connection exists because something is due: that is done,
     * and nothing more. */
    if (!u->on_demand) {
        u->gauge_due = u->gauges;
        u->backlog_next_at = 0;
        u->retention_due = u->retention_s > 0;
    }
    kick(u);
}

static void on_state(PgConn *pg, bool up, const char *reason, void *arg)
{
    Upkeep *u = arg;
    enter(u);
    u->ready = false;
    sweep_restart(u);
    if (!up)
        return;
    u->connected_before = true;
    char err[256];
    if (!u->sql[0] && !table_sql_all(&u->cfg->map, pg_conn_libpq(pg), sql_templates, u->sql,
                                     UPKEEP_SQL_COUNT, err, sizeof(err))) {
        note_result(u, UPKEEP_TASK_SETUP, err);
        if (u->on_demand) {
            /* Useless without its statements: closed (on_close_timer, outside this callback)
             * rather than kept for good beside the claim session; the next tick tries again. */
            u->gauge_due = u->retention_due = false;
            if (!ev_is_active(&u->close_timer))
                ev_timer_start(u->loop, &u->close_timer);
        }
        return; /* the gauges and retention stay off; the relay itself goes on */
    }
    PgQuery q[2] = {{SQL_SETUP, 0, NULL, false}, {SQL_APPNAME, 0, NULL, false}};
    if (!pg_conn_send(pg, q, 2, on_setup, u))
        pg_conn_reset(pg, "upkeep connection busy at setup");
}

static void on_notify(PgConn *pg, const char *channel, const char *payload, void *arg) {}

/* On demand, this tick also makes retention due once its interval has passed, so that one
 * connection does both and the databases' sweeps are spread over the interval as their refreshes
 * are (upkeep_create); a sweep then comes at most every UPKEEP_ON_DEMAND_GAUGE_INTERVAL_S, however
 * short the retention. Half a tick of slack keeps a sweep due every fourth tick, say, from
 * slipping to the fifth when a tick comes a little early. */
static void on_gauge_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Upkeep *u = w->data;
    enter(u);
    u->gauge_due = u->gauges;
    double now = monotime_now();
    if (u->on_demand && u->retention_s > 0 &&
        now - u->swept_at >= upkeep_retention_interval(u->retention_s) - gauge_interval(u) / 2.0) {
        u->retention_due = true;
        u->swept_at = now;
    }
    kick(u);
}

static void on_close_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Upkeep *u = w->data;
    enter(u);
    /* Without its statements (table_sql_all failed in on_state) the connection serves nothing. */
    if (u->pg && (!u->sql[0] || (u->ready && pg_conn_idle(u->pg) && !work_due(u))))
        close_connection(u);
}

static void on_retention_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Upkeep *u = w->data;
    enter(u);
    u->retention_due = true;
    kick(u);
}

void upkeep_reconfigure(Upkeep *u)
{
    long retention = u->cfg->retention_s;
    if (retention != u->retention_s) {
        ev_timer_stop(u->loop, &u->retention_timer);
        u->retention_s = retention;
        sweep_restart(u);
        if (retention <= 0)
            metrics_set_retention_overdue(false, 0.0);
        if (retention > 0) {
            /* On demand, the gauge tick makes retention due (on_gauge_timer). */
            if (!u->on_demand) {
                u->retention_timer.repeat = upkeep_retention_interval(retention);
                ev_timer_again(u->loop, &u->retention_timer);
            }
            u->retention_due = true;
            u->swept_at = monotime_now();
        }
    }
    bool needed = u->gauges || u->retention_s > 0;
    if (needed && !u->pg && !u->on_demand)
        open_connection(u);
    else if (!needed && u->pg)
        close_connection(u);
    kick(u); /* on demand: connects if something is due */
}

/* The standing upkeep's interval: UPKEEP_GAUGE_INTERVAL_S, or in a test build only (the sanitizer
 * build `make test` runs: the Makefile defines OUTBOX_TEST_KNOBS for it and never for the build
 * that is installed or packaged) a shorter one from OUTBOX_TEST_GAUGE_INTERVAL_S. The tests that
 * wait for a look (a vacuum horizon holder, a lane squatter) spent most of their time waiting
 * out 5 s intervals; the looks are the same, only sooner. Logged, so that no run hides it. */
static double test_gauge_interval(void)
{
#ifdef OUTBOX_TEST_KNOBS
    const char *env = getenv("OUTBOX_TEST_GAUGE_INTERVAL_S");
    if (env && *env) {
        char *end;
        double s = strtod(env, &end);
        if (*end == '\0' && s >= 0.2 && s <= UPKEEP_GAUGE_INTERVAL_S) {
            log_warn("test build: the gauges' interval is OUTBOX_TEST_GAUGE_INTERVAL_S",
                     "seconds=%g", s);
            return s;
        }
        char q[64];
        log_warn("test build: OUTBOX_TEST_GAUGE_INTERVAL_S ignored: not 0.2 to " STR(
                     UPKEEP_GAUGE_INTERVAL_S) " seconds",
                 "value=%s", log_quote(env, q, sizeof(q)));
    }
#endif
    return UPKEEP_GAUGE_INTERVAL_S;
}

static Upkeep *upkeep_create(struct ev_loop *loop, const Config *cfg, bool gauges, bool on_demand)
{
    Upkeep *u = calloc(1, sizeof(*u));
    if (!u)
        return NULL;
    u->loop = loop;
    u->cfg = cfg;
    u->gauges = gauges;
    u->on_demand = on_demand;
    u->interval = on_demand ? UPKEEP_ON_DEMAND_GAUGE_INTERVAL_S : test_gauge_interval();
    u->horizon_params[0] = u->horizon_logged_kind;
    u->horizon_params[1] = u->horizon_logged_who;
    u->horizon_params[2] = u->horizon_logged_start;
    xiddate_init(&u->xid_dates);
    /* On demand, the first refresh comes at once, as a standing connection's does at setup. */
    u->gauge_due = on_demand && gauges;
    /* Never swept: the first tick sweeps, whatever the monotonic clock reads (it counts from the
     * host's boot, which may be less than an interval ago). */
    u->swept_at = -HUGE_VAL;
    sweep_restart(u);
    ev_timer_init(&u->close_timer, on_close_timer, 0.0, 0.0);
    u->close_timer.data = u;
    u->log_context = log_context();
    u->metrics = metrics_selected();
    ev_init(&u->gauge_timer, on_gauge_timer);
    u->gauge_timer.data = u;
    ev_init(&u->retention_timer, on_retention_timer);
    u->retention_timer.data = u;
    if (gauges || on_demand) {
        /* The databases of a list start together: on demand, the first tick of each comes at
         * another point of the interval (the fractional parts of multiples of the golden ratio
         * spread any number of them evenly), so fifty databases do not open fifty connections at
         * once every interval but one every 0.3 s. Their first refresh and sweep are the ones at
         * start. On demand the tick runs without the gauges too: it times retention, which
         * --retention may turn on at a SIGHUP (on_gauge_timer). */
        static unsigned started;
        double every = gauge_interval(u), first = every;
        if (on_demand)
            first = every * (0.05 + 0.95 * fmod(0.6180339887 * (double)started++, 1.0));
        ev_timer_set(&u->gauge_timer, first, every);
        ev_timer_start(loop, &u->gauge_timer);
    }
    upkeep_reconfigure(u);
    return u;
}

Upkeep *upkeep_new(struct ev_loop *loop, const Config *cfg, bool gauges)
{
    return upkeep_create(loop, cfg, gauges, false);
}

Upkeep *upkeep_new_on_demand(struct ev_loop *loop, const Config *cfg, bool gauges)
{
    return upkeep_create(loop, cfg, gauges, true);
}

void upkeep_free(Upkeep *u)
{
    if (!u)
        return;
    ev_timer_stop(u->loop, &u->gauge_timer);
    ev_timer_stop(u->loop, &u->retention_timer);
    ev_timer_stop(u->loop, &u->close_timer);
    pg_conn_free(u->pg);
    for (int i = 0; i < UPKEEP_SQL_COUNT; i++)
        free(u->sql[i]);
    free(u);
}
