#include "lanes.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "statements.h"

static void update_owned_array(Lanes *l)
{
    strbuf_array_begin(&l->owned_array);
    l->n_owned = 0;
    for (int i = 0; i < LANE_COUNT; i++) {
        if (l->owned[i]) {
            strbuf_array_int(&l->owned_array, i);
            l->n_owned++;
        }
    }
    strbuf_array_end(&l->owned_array);
}

void lanes_init(Lanes *l)
{
    memset(l, 0, sizeof(*l));
    lanes_reset(l);
}

void lanes_free(Lanes *l)
{
    strbuf_free(&l->owned_array);
    strbuf_free(&l->lock_array);
    strbuf_free(&l->unlock_array);
}

void lanes_reset(Lanes *l)
{
    l->slot = -1;
    l->live_sessions = 0;
    l->members = 0;
    l->gained = false;
    l->mark = LANE_MARK_NONE;
    memset(l->owned, 0, sizeof(l->owned));
    update_owned_array(l);
}

/* splitmix64: a well-mixed 64-bit hash of (lane, slot) for rendezvous hashing. */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void lanes_assign(const int *slots, int n, int slot, bool out[LANE_COUNT])
{
    for (int lane = 0; lane < LANE_COUNT; lane++) {
        int best = -1;
        uint64_t best_score = 0;
        for (int i = 0; i < n; i++) {
            uint64_t score = mix(((uint64_t)lane << 32) | (uint32_t)slots[i]);
            if (best < 0 || score > best_score) {
                best = slots[i];
                best_score = score;
            }
        }
        out[lane] = best == slot;
    }
}

int lanes_sharing(const int *slots, const LaneMark *marks, int n, int *out)
{
    bool healthy = false;
    for (int i = 0; i < n; i++)
        healthy = healthy || marks[i] == LANE_MARK_NONE;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!healthy || marks[i] != LANE_MARK_AWAY)
            out[k++] = slots[i];
    return k;
}

/* SQL_LANES_MEMBERS reads a trying mark at the slot + 1024. */
_Static_assert(LANE_MAX_MEMBERS == 1024, "SQL_LANES_MEMBERS' trying mark key");

/* The key of the mark lock (SQL_LANES_MARK) of slot. */
static int mark_key(int slot, LaneMark mark)
{
    return mark == LANE_MARK_TRYING ? slot + LANE_MAX_MEMBERS : slot;
}

static void finish(Lanes *l, PgConn *pg, bool ok)
{
    LanesDoneFn done = l->done;
    l->done = NULL;
    done(l, ok, l->arg);
}

static bool query_failed(Lanes *l, PgConn *pg, PGresult **results, int n, const char *error,
                         const char *step)
{
    if (!results) {
        l->done = NULL; /* connection lost: the owner hears about it through the pg state */
        return true;
    }
    if (error) {
        const char *state = pg_failed_sqlstate(results, n);
        snprintf(l->error_state, sizeof(l->error_state), "%s", state ? state : "");
        snprintf(l->error, sizeof(l->error), "%s", error);
        /* Which locks this session holds is now uncertain: the owner drops the session, which
         * releases them all, and the reconnect starts from a clean slate. */
        char q[512];
        log_warn("lane rebalance failed; reconnecting", "step=%s error=%s", step,
                 log_quote(error, q, sizeof(q)));
        finish(l, pg, false);
        return true;
    }
    return false;
}

static void on_locked(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Lanes *l = arg;
    if (query_failed(l, pg, results, n, error, "lock"))
        return;
    /* results: [lock (rows = acquired lanes)], [unlock] in the order they were sent. */
    for (int i = 0; i < n; i++) {
        PGresult *res = results[i];
        if (PQnfields(res) != 1 || strcmp(PQfname(res, 0), "l") != 0)
            continue;
        for (int row = 0; row < PQntuples(res); row++) {
            int lane = atoi(PQgetvalue(res, row, 0));
            if (lane >= 0 && lane < LANE_COUNT) {
                l->owned[lane] = true;
                l->gained = true;
            }
        }
    }
    update_owned_array(l);
    finish(l, pg, true);
}

static void on_members(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Lanes *l = arg;
    if (query_failed(l, pg, results, n, error, "members"))
        return;
    /* results: [the new mark taken], [the old one given up], members: its answer comes last. */
    if (n > 1) {
        const PGresult *took = results[0]; /* the new mark's, when there is one */
        /* "f": another session holds the mark lock, a squatter the upkeep names
         * (SQL_LANE_SQUATTERS, "stray-marks"); the member reads healthy meanwhile. */
        bool taken = l->want_mark != LANE_MARK_NONE && PQntuples(took) == 1 &&
                     strcmp(PQgetvalue(took, 0, 0), "t") == 0;
        l->mark = taken ? l->want_mark : LANE_MARK_NONE;
        /* The upkeep names the holder to whoever reads the metrics or /readyz; the relay's own
         * log says what it costs this relay. Once while the refusal lasts: the mark is tried
         * again at every look (--rebalance-interval). */
        if (l->want_mark != LANE_MARK_NONE && !taken && l->refused_said != l->want_mark) {
            const char *holder =
                PQntuples(took) == 1 && PQnfields(took) > 1 && !PQgetisnull(took, 0, 1)
                    ? PQgetvalue(took, 0, 1)
                    : "unknown";
            log_warn(
                "lane mark refused",
                "mark=%s slot=%d holder_pid=%s reason=\"another session holds this relay's "
                "mark lock (not a relay's: outbox_lane_squatters counts it); the other relays read "
                "this one as reaching kafka, and it keeps its lanes\"",
                l->want_mark == LANE_MARK_AWAY ? "away" : "trying", l->slot, holder);
            l->refused_said = l->want_mark;
        }
    }
    if (l->want_mark == LANE_MARK_NONE || l->mark == l->want_mark)
        l->refused_said = LANE_MARK_NONE; /* the episode is over */
    PGresult *res = results[n - 1];
    int count = PQntuples(res);
    size_t room = (size_t)(count ? count : 1);
    int *slots = calloc(room, sizeof(int));
    int *sharing = calloc(room, sizeof(int));
    LaneMark *marks = calloc(room, sizeof(LaneMark));
    if (!slots || !sharing || !marks) {
        free(slots);
        free(sharing);
        free(marks);
        /* Nothing locked or unlocked yet: the next rebalance tries again. */
        log_warn("lane rebalance failed; retrying", "step=members error=\"out of memory\"");
        finish(l, pg, true);
        return;
    }
    uint64_t members = (uint64_t)count;
    for (int i = 0; i < count; i++) {
        slots[i] = atoi(PQgetvalue(res, i, 0));
        int mark = PQnfields(res) > 1 ? atoi(PQgetvalue(res, i, 1)) : 0;
        marks[i] =
            mark == LANE_MARK_AWAY || mark == LANE_MARK_TRYING ? (LaneMark)mark : LANE_MARK_NONE;
        /* In slot order (the statement sorts); a member's mark changes the group too. */
        members = mix(members ^ (uint32_t)slots[i] ^ ((uint64_t)marks[i] << 32));
    }

    bool desired[LANE_COUNT];
    int n_sharing = lanes_sharing(slots, marks, count, sharing);
    lanes_assign(sharing, n_sharing, l->slot, desired);
    free(slots);
    free(sharing);
    free(marks);

    strbuf_array_begin(&l->lock_array);
    strbuf_array_begin(&l->unlock_array);
    for (int lane = 0; lane < LANE_COUNT; lane++) {
        if (desired[lane] && !l->owned[lane])
            strbuf_array_int(&l->lock_array, lane);
        if (!desired[lane] && l->owned[lane]) {
            strbuf_array_int(&l->unlock_array, lane);
            l->owned[lane] = false;
        }
    }
    strbuf_array_end(&l->lock_array);
    strbuf_array_end(&l->unlock_array);
    members = members ? members : 1;
    if (members != l->members)
        log_info("relay sessions in the group changed", "live_sessions=%d slot=%d", count, l->slot);
    l->live_sessions = count;
    l->members = members;

    const char *lock_params[1] = {l->lock_array.s};
    const char *unlock_params[1] = {l->unlock_array.s};
    PgQuery queries[2];
    int nq = 0;
    if (!strbuf_array_empty(&l->lock_array))
        queries[nq++] = (PgQuery){SQL_LOCK_LANES, 1, lock_params, false};
    if (!strbuf_array_empty(&l->unlock_array))
        queries[nq++] = (PgQuery){SQL_UNLOCK_LANES, 1, unlock_params, false};
    if (nq == 0) {
        finish(l, pg, true);
        return;
    }
    if (!pg_conn_send(pg, queries, nq, on_locked, l)) {
        /* The lanes to unlock are already marked not owned while the server still holds their
         * locks: drop the session (which releases them all) rather than leave lanes that no
         * session claims and no other can take. */
        log_warn("lane rebalance failed; reconnecting", "step=lock error=\"could not send\"");
        l->error_state[0] = '\0'; /* no statement's fault: the reconnect cures it */
        snprintf(l->error, sizeof(l->error), "could not send");
        finish(l, pg, false);
    }
}

/* The look at the members, behind the mark lock taken and given up when the relay's state
 * changed: in the same pipeline, so the look sees it. The new mark is taken before the old one
 * goes: between the two statements another session's look may come, and with neither held it
 * saw a healthy member for a relay switching between away and trying (lanes moved to it, or
 * away from the other away members, for one --rebalance-interval). With both held it sees away
 * (SQL_LANES_MEMBERS' min): the state before a trial, or after one that failed. */
static bool send_members(Lanes *l, PgConn *pg)
{
    snprintf(l->old_param, sizeof(l->old_param), "%d", mark_key(l->slot, l->mark));
    snprintf(l->new_param, sizeof(l->new_param), "%d", mark_key(l->slot, l->want_mark));
    l->old_params[0] = l->old_param;
    l->new_params[0] = l->new_param;
    PgQuery q[3];
    int nq = 0;
    if (l->want_mark != l->mark && l->want_mark != LANE_MARK_NONE)
        q[nq++] = (PgQuery){SQL_LANES_MARK, 1, l->new_params, false};
    if (l->want_mark != l->mark && l->mark != LANE_MARK_NONE)
        q[nq++] = (PgQuery){SQL_LANES_UNMARK, 1, l->old_params, false};
    q[nq++] = (PgQuery){SQL_LANES_MEMBERS, 0, NULL, false};
    return pg_conn_send(pg, q, nq, on_members, l);
}

static void on_joined(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Lanes *l = arg;
    if (query_failed(l, pg, results, n, error, "join"))
        return;
    if (PQntuples(results[0]) == 0) {
        /* Once, not at every --rebalance-interval while the group stays full. */
        log_write(l->no_slot_logged ? LOG_DEBUG : LOG_WARN,
                  "no free member slot: too many relays on this outbox; retrying", "max=%d",
                  LANE_MAX_MEMBERS);
        l->no_slot_logged = true;
        finish(l, pg, true); /* no lanes: the next rebalance tries again */
        return;
    }
    l->slot = atoi(PQgetvalue(results[0], 0, 0));
    log_write(l->no_slot_logged ? LOG_INFO : LOG_DEBUG, "joined the relay group", "slot=%d",
              l->slot);
    l->no_slot_logged = false;
    if (!send_members(l, pg))
        finish(l, pg, true); /* nothing locked yet: the next rebalance tries again */
}

/* The start of a rebalance or a leave: pg must be idle (else false, and done is not called). */
static bool begin_request(Lanes *l, PgConn *pg, LanesDoneFn done, void *arg)
{
    if (!pg_conn_idle(pg))
        return false;
    l->done = done;
    l->arg = arg;
    l->gained = false;
    return true;
}

bool lanes_rebalance(Lanes *l, PgConn *pg, LaneMark mark, LanesDoneFn done, void *arg)
{
    if (!begin_request(l, pg, done, arg))
        return false;
    l->want_mark = mark;
    if (l->slot >= 0)
        return send_members(l, pg);
    char max[16];
    snprintf(max, sizeof(max), "%d", LANE_MAX_MEMBERS);
    const char *params[1] = {max};
    PgQuery q = {SQL_LANES_JOIN, 1, params, false};
    return pg_conn_send(pg, &q, 1, on_joined, l);
}

static void on_left(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Lanes *l = arg;
    if (query_failed(l, pg, results, n, error, "leave"))
        return;
    lanes_reset(l);
    finish(l, pg, true);
}

bool lanes_leave(Lanes *l, PgConn *pg, LanesDoneFn done, void *arg)
{
    if (!begin_request(l, pg, done, arg))
        return false;
    char slot[16];
    snprintf(slot, sizeof(slot), "%d", l->slot);
    const char *unlock_params[1] = {l->owned_array.s};
    const char *slot_params[1] = {slot};
    PgQuery queries[3];
    int nq = 0;
    if (l->n_owned > 0)
        queries[nq++] = (PgQuery){SQL_UNLOCK_LANES, 1, unlock_params, false};
    char mark[16];
    snprintf(mark, sizeof(mark), "%d", mark_key(l->slot, l->mark));
    const char *mark_params[1] = {mark};
    if (l->slot >= 0 && l->mark != LANE_MARK_NONE)
        queries[nq++] = (PgQuery){SQL_LANES_UNMARK, 1, mark_params, false};
    if (l->slot >= 0)
        queries[nq++] = (PgQuery){SQL_LANES_LEAVE, 1, slot_params, false};
    if (nq == 0) {
        lanes_reset(l);
        finish(l, pg, true);
        return true;
    }
    return pg_conn_send(pg, queries, nq, on_left, l);
}
