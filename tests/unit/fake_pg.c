/* fake_pg: the PgConn interface of pg.h without a server, for the engine's unit tests
 * (fake_pg.h says what it reproduces of pg.c and pg_request.c). */
#include "fake_pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct PgConn {
    struct ev_loop *loop;
    char name[32];
    PgStateFn on_state;
    PgNotifyFn on_notify;
    void *arg;
    bool up;
    bool busy;
    FakeRequest req;
    int resets;
    PGconn *quoter;   /* for pg_conn_libpq: PQescapeIdentifier needs a PGconn, not a server */
    int backend_pid;  /* pg_conn_backend: a new "server process" at each fake_pg_up */
    bool seen_before; /* pg_conn_seen_before was called */
};

void (*fake_pg_sent_hook)(PgConn *pg, const FakeRequest *req);
int fake_pg_refuse_sends;

static PgConn *conns[FAKE_PG_MAX];
static int nconns;

/* The SQLSTATE and message of each error result fake_pg_error made and nobody cleared yet. */
#define MAX_ERRORS 64
static struct {
    const PGresult *res;
    char state[6];
    char msg[600]; /* room for a server's long error line (a trigger's RAISE) */
} errors[MAX_ERRORS];

static int error_slot(const PGresult *res)
{
    for (int i = 0; res && i < MAX_ERRORS; i++)
        if (errors[i].res == res)
            return i;
    return -1;
}

/* Clears a result, forgetting its error entry (its address may be reused). */
static void clear_result(PGresult *res)
{
    int i = error_slot(res);
    if (i >= 0)
        errors[i].res = NULL;
    PQclear(res);
}

void fake_pg_forget(void)
{
    memset(errors, 0, sizeof(errors));
}

PGresult *fake_pg_command_ok(void)
{
    return PQmakeEmptyPGresult(NULL, PGRES_COMMAND_OK);
}

PGresult *fake_pg_aborted(void)
{
    return PQmakeEmptyPGresult(NULL, PGRES_PIPELINE_ABORTED);
}

PGresult *fake_pg_tuples(const char *cols, int nrows, const char *const *cells)
{
    PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    char names[512];
    snprintf(names, sizeof(names), "%s", cols);
    PGresAttDesc attrs[32];
    int ncols = 0;
    for (char *save = NULL, *c = strtok_r(names, ",", &save); c && ncols < 32;
         c = strtok_r(NULL, ",", &save)) {
        attrs[ncols] = (PGresAttDesc){
            .name = c, .format = 0, .typid = 25 /* text */, .typlen = -1, .atttypmod = -1};
        ncols++;
    }
    if (!res || !PQsetResultAttrs(res, ncols, attrs)) {
        PQclear(res);
        return NULL;
    }
    for (int r = 0; r < nrows; r++)
        for (int c = 0; c < ncols; c++) {
            const char *v = cells[r * ncols + c];
            /* len -1: SQL NULL (PQsetvalue copies the text). */
            if (!PQsetvalue(res, r, c, (char *)(v ? v : ""), v ? (int)strlen(v) : -1)) {
                PQclear(res);
                return NULL;
            }
        }
    return res;
}

PGresult *fake_pg_error(const char *sqlstate, const char *msg)
{
    PGresult *res = PQmakeEmptyPGresult(NULL, PGRES_FATAL_ERROR);
    for (int i = 0; res && i < MAX_ERRORS; i++) {
        if (errors[i].res)
            continue;
        errors[i].res = res;
        snprintf(errors[i].state, sizeof(errors[i].state), "%s", sqlstate ? sqlstate : "");
        snprintf(errors[i].msg, sizeof(errors[i].msg), "ERROR:  %s", msg);
        return res;
    }
    PQclear(res);
    return NULL;
}

int fake_pg_count(void)
{
    return nconns;
}

PgConn *fake_pg_at(int i)
{
    return i >= 0 && i < nconns ? conns[i] : NULL;
}

PgConn *fake_pg_named(const char *name)
{
    for (int i = 0; i < nconns; i++)
        if (strcmp(conns[i]->name, name) == 0)
            return conns[i];
    return NULL;
}

const char *fake_pg_name(const PgConn *pg)
{
    return pg->name;
}

int fake_pg_resets(const PgConn *pg)
{
    return pg->resets;
}

static void forget_request(PgConn *pg)
{
    for (int i = 0; i < pg->req.n; i++) {
        free(pg->req.sql[i]);
        free(pg->req.params[i]);
    }
    memset(&pg->req, 0, sizeof(pg->req));
    pg->busy = false;
}

void fake_pg_up(PgConn *pg)
{
    static int next_pid = 1000;
    pg->backend_pid = next_pid++;
    pg->up = true;
    pg->on_state(pg, true, NULL, pg->arg);
}

/* pg.c's pg_lose: the request in flight fails first (NULL results), then the owner hears. */
static void lose(PgConn *pg, const char *reason)
{
    bool was_up = pg->up;
    pg->up = false;
    if (pg->busy) {
        PgResultFn cb = pg->req.cb;
        void *arg = pg->req.arg;
        forget_request(pg);
        cb(pg, NULL, 0, reason, arg);
    }
    if (was_up)
        pg->on_state(pg, false, reason, pg->arg);
}

void fake_pg_drop(PgConn *pg, const char *reason)
{
    lose(pg, reason);
}

void fake_pg_notify(PgConn *pg, const char *channel, const char *payload)
{
    if (pg->up)
        pg->on_notify(pg, channel, payload, pg->arg);
}

const FakeRequest *fake_pg_pending(const PgConn *pg)
{
    return pg->busy ? &pg->req : NULL;
}

/* pg_request.c's session_unusable: after such an error the session is reset. */
static bool session_unusable(const char *sqlstate)
{
    return sqlstate && (strcmp(sqlstate, "25006") == 0 || strcmp(sqlstate, "57P01") == 0 ||
                        strcmp(sqlstate, "57P02") == 0 || strcmp(sqlstate, "57P03") == 0 ||
                        strncmp(sqlstate, "08", 2) == 0);
}

void fake_pg_answer(PgConn *pg, PGresult **given, int n)
{
    if (!pg->busy || n != pg->req.n) {
        fprintf(stderr, "fake_pg: answer of %d results to %s request of %d\n", n,
                pg->busy ? "a" : "no", pg->req.n);
        abort();
    }
    PGresult *results[PG_MAX_QUERIES] = {0};
    memcpy(results, given, sizeof(PGresult *) * (size_t)n);
    /* The first failure's message, as pg_request.c keeps it; the statements after it did not
     * run (a pipeline aborts the rest up to its Sync). */
    const char *error = NULL;
    const char *state = NULL;
    for (int i = 0; i < n; i++) {
        if (error) {
            clear_result(results[i]);
            results[i] = fake_pg_aborted();
            continue;
        }
        ExecStatusType st = PQresultStatus(results[i]);
        if (st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR) {
            int e = error_slot(results[i]);
            error = e >= 0 ? errors[e].msg : "ERROR:  failed";
            state = e >= 0 && errors[e].state[0] ? errors[e].state : NULL;
        }
    }
    char error_copy[600] = "";
    if (error)
        snprintf(error_copy, sizeof(error_copy), "%s", error);
    if (session_unusable(state)) {
        for (int i = 0; i < n; i++)
            clear_result(results[i]);
        char reason[660];
        snprintf(reason, sizeof(reason), "%s (SQLSTATE %s); reconnecting", error_copy, state);
        lose(pg, reason);
        return;
    }
    PgResultFn cb = pg->req.cb;
    void *arg = pg->req.arg;
    /* Idle again before the callback runs, so it can send the next request at once. */
    forget_request(pg);
    cb(pg, results, n, error ? error_copy : NULL, arg);
    for (int i = 0; i < n; i++)
        clear_result(results[i]);
}

/* ---- pg.h ---- */

void pg_set_session_timeout(long ms)
{
    (void)ms;
}

PgConn *pg_conn_new(struct ev_loop *loop, const char *conninfo, PgStateFn on_state,
                    PgNotifyFn on_notify, void *arg)
{
    return pg_conn_new_named(loop, conninfo, NULL, on_state, on_notify, arg);
}

PgConn *pg_conn_new_named(struct ev_loop *loop, const char *conninfo, const char *name,
                          PgStateFn on_state, PgNotifyFn on_notify, void *arg)
{
    if (nconns == FAKE_PG_MAX)
        return NULL;
    PgConn *pg = calloc(1, sizeof(*pg));
    if (!pg)
        return NULL;
    pg->loop = loop;
    snprintf(pg->name, sizeof(pg->name), "%s", name ? name : "");
    pg->on_state = on_state;
    pg->on_notify = on_notify;
    pg->arg = arg;
    /* Options libpq rejects leave a PGconn that never connects but quotes (SQL_ASCII). */
    pg->quoter = PQconnectStart("fake_pg_never_connects=1");
    conns[nconns++] = pg;
    return pg;
}

void pg_conn_set_request_timeout(PgConn *pg, double seconds)
{
    (void)pg;
    (void)seconds;
}

void pg_conn_seen_before(PgConn *pg)
{
    pg->seen_before = true; /* only log lines: the engine's tests read it (fake_pg_seen_before) */
}

bool fake_pg_seen_before(const PgConn *pg)
{
    return pg->seen_before;
}

void pg_conn_free(PgConn *pg)
{
    if (!pg)
        return;
    forget_request(pg); /* pg.h: the callback of a request in flight is not called */
    PQfinish(pg->quoter);
    for (int i = 0; i < nconns; i++)
        if (conns[i] == pg) {
            memmove(&conns[i], &conns[i + 1], sizeof(PgConn *) * (size_t)(nconns - i - 1));
            nconns--;
            break;
        }
    free(pg);
}

bool pg_conn_idle(const PgConn *pg)
{
    return pg->up && !pg->busy;
}

bool pg_conn_up(const PgConn *pg)
{
    return pg->up;
}

const char *pg_conn_refused(const PgConn *pg)
{
    (void)pg;
    return NULL; /* the engine's tests reach no server */
}

static char *join_params(const PgQuery *q)
{
    size_t len = 1;
    for (int i = 0; i < q->nparams; i++)
        len += (q->values[i] ? strlen(q->values[i]) : 4) + 1;
    char *s = calloc(1, len);
    for (int i = 0; s && i < q->nparams; i++) {
        if (i)
            strcat(s, "|");
        strcat(s, q->values[i] ? q->values[i] : "NULL");
    }
    return s;
}

bool pg_conn_send(PgConn *pg, const PgQuery *queries, int n, PgResultFn cb, void *arg)
{
    if (!pg_conn_idle(pg) || n < 1 || n > PG_MAX_QUERIES)
        return false;
    if (fake_pg_refuse_sends > 0) {
        fake_pg_refuse_sends--;
        return false;
    }
    pg->busy = true;
    pg->req.n = n;
    pg->req.cb = cb;
    pg->req.arg = arg;
    for (int i = 0; i < n; i++) {
        pg->req.sql[i] = strdup(queries[i].sql);
        pg->req.params[i] = join_params(&queries[i]);
    }
    if (fake_pg_sent_hook)
        fake_pg_sent_hook(pg, &pg->req);
    return true;
}

int pg_first_failed(PGresult *const *results, int n)
{
    for (int i = 0; i < n; i++) {
        ExecStatusType st = results[i] ? PQresultStatus(results[i]) : PGRES_PIPELINE_ABORTED;
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
            return i;
    }
    return n;
}

const char *pg_failed_sqlstate(PGresult *const *results, int n)
{
    int i = pg_first_failed(results, n);
    int e = i < n ? error_slot(results[i]) : -1;
    return e >= 0 && errors[e].state[0] ? errors[e].state : NULL;
}

void pg_conn_reset(PgConn *pg, const char *reason)
{
    pg->resets++;
    if (pg->up)
        lose(pg, reason);
}

bool pg_conn_backend(const PgConn *pg, int *pid, char *start)
{
    *pid = pg->backend_pid;
    snprintf(start, PG_BACKEND_START_LEN, "2026-11-28 18:00:00.%06d", pg->backend_pid);
    return pg->backend_pid > 0;
}

int fake_pg_backend_pid(const PgConn *pg)
{
    return pg->backend_pid;
}

PGconn *pg_conn_libpq(PgConn *pg)
{
    return pg->up ? pg->quoter : NULL;
}
