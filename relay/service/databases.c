/* databases: several databases in one process (databases.h). */
#include "databases.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backoff.h"
#include "db.h"
#include "kafka.h"
#include "log.h"
#include "monotime.h"
#include "pg.h"
#include "readiness.h"
#include "route.h"
#include "secrets.h"
#include "tls_report.h"
#include "upkeep.h"

/* One database: its configuration (moved out of the loaded Config), relay, upkeep, registry. */
typedef struct Db {
    Databases *owner;
    Config cfg;
    char log_context[80]; /* "database=NAME" */
    MetricsDb *metrics;
    Relay *relay;
    Upkeep *upkeep;
    bool started;
    bool stopped; /* every session of its relay has stopped */
    bool removed; /* SIGHUP dropped it (or it reaches another's database): it drains, then goes */
    /* Which cluster and database its URL reaches, asked of the server (on_probe_answer) once,
     * and again when another's server turns out to have started after the answer
     * (probe_compare): "database oid|name", "" until known; the cluster's system identifier,
     * "" when the role may not read it; the server's start and the server's clock at the
     * answer, seconds since the epoch. Two entries whose URLs differ (a host name and its
     * address, an alias, a proxy) may still reach one database. */
    PgConn *probe;
    ev_timer probe_close; /* frees probe outside its own callbacks */
    char identity[160];
    char system_id[32];
    double server_start, asked_at;
    bool asking_again;    /* asked again, the answer not in yet */
    int asked_again;      /* times, up to PROBE_ASKED_AGAIN_MAX */
    bool unanswered_said; /* the first answer is late: said once (on_probe_answer) */
    /* The query failed (an error, not a lost answer: a function revoked, a statement_timeout,
     * a server refusing it for now): asked again on a new connection after probe_backoff, said
     * once until an answer comes (on_probe_answer). */
    ev_timer probe_retry;
    Backoff probe_backoff;
    bool refused_said;
} Db;

/* An entry stopped because another reaches its database (probe_compare), remembered by its
 * spelling: a SIGHUP whose list still has it as it was, beside the same twin, leaves it stopped
 * instead of adding it again only for it to stop again, a line more at each reload. */
typedef struct Twin {
    char *name, *url; /* the stopped entry's name and URL as the list spelled them */
    char *kept;       /* the entry it reaches the database of, which goes on */
} Twin;

struct Databases {
    struct ev_loop *loop;
    rd_kafka_conf_t *kconf; /* the template every database's producer is made from */
    bool gauges;
    Db *dbs[CONFIG_MAX_DATABASES];
    int n;
    bool stopping;
    int signals;
    int exit_status;
    ev_signal sigterm, sigint;
    ev_timer reap; /* frees removed databases outside the callbacks that may still touch them */
    Twin twins[CONFIG_MAX_DATABASES];
    int n_twins;
};

static void twin_forget(Databases *d, int i)
{
    free(d->twins[i].name);
    secrets_free_zeroed(d->twins[i].url); /* holds the password */
    free(d->twins[i].kept);
    d->twins[i] = d->twins[--d->n_twins];
}

/* Remembers that stopped reaches kept's database (the older memory of that name goes). Without
 * the memory to keep it, nothing changes but a reload adding it again. */
static void twin_remember(Databases *d, const Db *stopped, const Db *kept)
{
    for (int i = 0; i < d->n_twins; i++)
        if (strcmp(d->twins[i].name, stopped->cfg.database_name) == 0)
            twin_forget(d, i--);
    if (d->n_twins >= CONFIG_MAX_DATABASES)
        return;
    Twin t = {strdup(stopped->cfg.database_name),
              strdup(stopped->cfg.database_url ? stopped->cfg.database_url : ""),
              strdup(kept->cfg.database_name)};
    if (!t.name || !t.url || !t.kept) {
        free(t.name);
        secrets_free_zeroed(t.url);
        free(t.kept);
        return;
    }
    d->twins[d->n_twins++] = t;
}

/* flush_ms: how long the producer's last messages may take (relay_free_within). The databases
 * are freed one after another on the loop's thread, so a wait each would add up (a second a
 * database with Kafka down) and, for a database removed by SIGHUP, stall the others. */
static void db_free(Db *db, int flush_ms)
{
    if (!db)
        return;
    log_set_context(db->log_context);
    if (db->relay && db->started)
        (void)relay_finish(db->relay);
    ev_timer_stop(db->owner->loop, &db->probe_close);
    ev_timer_stop(db->owner->loop, &db->probe_retry);
    pg_conn_free(db->probe);
    upkeep_free(db->upkeep);
    relay_free_within(db->relay, flush_ms);
    metrics_db_free(db->metrics);
    config_free(&db->cfg);
    log_set_context(NULL);
    free(db);
}

static void on_relay_stopped(Relay *r, void *arg)
{
    Db *db = arg;
    Databases *d = db->owner;
    db->stopped = true;
    if (db->removed) {
        log_info("database removed", NULL);
        ev_feed_event(d->loop, &d->reap, EV_TIMER);
        if (!d->stopping)
            return; /* the others go on; when stopping, the last one ends the loop below */
    } else if (!d->stopping) {
        /* A relay stops on its own only when the process cannot go on (relay_fail: a producer
         * that cannot be recreated): as with one database, the process stops, exit status 1, for
         * its supervisor to restart it. */
        log_error("a database's relay failed; stopping every database", NULL);
        d->exit_status = 1;
        d->stopping = true;
        for (int i = 0; i < d->n; i++)
            if (!d->dbs[i]->stopped)
                relay_drain(d->dbs[i]->relay);
    }
    for (int i = 0; i < d->n; i++)
        if (!d->dbs[i]->stopped)
            return;
    ev_break(d->loop, EVBREAK_ALL);
}

static void on_reap(struct ev_loop *loop, ev_timer *w, int revents)
{
    Databases *d = w->data;
    int kept = 0;
    for (int i = 0; i < d->n; i++) {
        Db *db = d->dbs[i];
        if (db->removed && db->stopped)
            db_free(db, 0); /* drained: what is left was given up on */
        else
            d->dbs[kept++] = db;
    }
    d->n = kept;
    log_set_context(NULL);
}

/* One database's input that run refuses before anything connects; also each entry a SIGHUP adds.
 * The error names the database when it has a name (an entry of a list). */
bool databases_entry_check(const Config *cfg, char *err, size_t errlen)
{
    char why[900];
    bool ok =
        db_check_writer_conninfo(cfg->database_url, why, sizeof(why)) &&
        route_template_check(cfg->topic_template, cfg->order_scope != ORDER_PER_AGGREGATE, why,
                             sizeof(why)) &&
        (!cfg->dead_letter_topic ||
         route_topic_name_check("--dead-letter-topic", cfg->dead_letter_topic, why, sizeof(why))) &&
        route_dead_letter_check(cfg->topic_template, cfg->dead_letter_topic, why, sizeof(why)) &&
        (!cfg->database_name || tls_report_require(cfg, cfg->require_tls, why, sizeof(why)));
    if (!ok && cfg->database_name)
        snprintf(err, errlen, "database %s: %s", cfg->database_name, why);
    else if (!ok)
        snprintf(err, errlen, "%s", why);
    return ok;
}

static void on_probe_close(struct ev_loop *loop, ev_timer *w, int revents);
static void on_probe_retry(struct ev_loop *loop, ev_timer *w, int revents);

/* A probe whose query failed is asked again after 1 s, doubling (with jitter) up to a minute: a
 * passing refusal (a statement_timeout or lock_timeout set for the role) is over in a few
 * tries, and a lasting one (a function revoked from the relay's role) costs the server one
 * failed query, and one line in its log, a minute, not one a round trip. */
#define PROBE_RETRY_BASE_S 1.0
#define PROBE_RETRY_CAP_S 60.0

/* Builds db from cfg (moved into it: cfg is zeroed). */
static Db *db_new(Databases *d, Config *cfg, char *err, size_t errlen)
{
    Db *db = calloc(1, sizeof(*db));
    if (!db) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    db->owner = d;
    ev_timer_init(&db->probe_close, on_probe_close, 0.0, 0.0);
    db->probe_close.data = db;
    ev_timer_init(&db->probe_retry, on_probe_retry, 0.0, 0.0);
    db->probe_retry.data = db;
    backoff_init(&db->probe_backoff, PROBE_RETRY_BASE_S, PROBE_RETRY_CAP_S, 0);
    db->cfg = *cfg;
    memset(cfg, 0, sizeof(*cfg));
    snprintf(db->log_context, sizeof(db->log_context), "database=%s", db->cfg.database_name);
    db->metrics = metrics_db_new(db->cfg.database_name);
    rd_kafka_conf_t *kconf = rd_kafka_conf_dup(d->kconf);
    /* Its log context first: the producer's, connections' and upkeep's log lines carry it. */
    log_set_context(db->log_context);
    metrics_select(db->metrics);
    char why[900];
    db->relay =
        db->metrics && kconf ? relay_new_quiet(d->loop, &db->cfg, kconf, why, sizeof(why)) : NULL;
    if (!db->relay) {
        if (!db->metrics || !kconf) {
            snprintf(why, sizeof(why), "out of memory");
            if (kconf)
                rd_kafka_conf_destroy(kconf);
        }
        snprintf(err, errlen, "database %s: %s", db->cfg.database_name, why);
        db_free(db, 0);
        return NULL;
    }
    relay_set_database(db->relay, db->log_context, db->metrics);
    relay_set_stopped_hook(db->relay, on_relay_stopped, db);
    log_set_context(NULL);
    metrics_select(NULL);
    return db;
}

/* Asked of each database once its probe connects: the database (oid and name), the server's
 * start and the server's clock now, as seconds since the epoch; then the cluster (the system
 * identifier initdb drew). Nothing the first needs a privilege for; pg_control_system is
 * PUBLIC's by default, but a server may revoke it: the second statement may fail alone (the
 * first's answer has come), and the identifier is then left out of the comparison. */
static const char *const SQL_IDENTITY =
    "SELECT d.oid::text || '|' || d.datname,"
    " pg_catalog.date_part('epoch', pg_catalog.pg_postmaster_start_time()),"
    " pg_catalog.date_part('epoch', pg_catalog.now())"
    " FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()";
static const char *const SQL_SYSTEM_ID =
    "SELECT s.system_identifier::text FROM pg_catalog.pg_control_system() s";

/* Whether a and b, both known, name one database of one cluster (the server's start aside). */
static bool same_identity(const Db *a, const Db *b)
{
    return strcmp(a->identity, b->identity) == 0 &&
           (!a->system_id[0] || !b->system_id[0] || strcmp(a->system_id, b->system_id) == 0);
}

/* How often one entry is asked again because another's server started after its answer
 * (probe_compare): once per restart in between is all it takes; the bound only keeps two
 * servers whose clocks disagree from asking each other for ever. */
enum { PROBE_ASKED_AGAIN_MAX = 8 };

static void on_probe_close(struct ev_loop *loop, ev_timer *w, int revents)
{
    Db *db = w->data;
    pg_conn_free(db->probe);
    db->probe = NULL;
}

static void on_probe_state(PgConn *pg, bool up, const char *reason, void *arg);
static void on_probe_notify(PgConn *pg, const char *channel, const char *payload, void *arg) {}

/* Opens db's identity connection, which asks once connected (on_probe_state) and is closed after
 * the answer (probe_close). Not from one of db's own probe callbacks. */
static void probe_open(Databases *d, Db *db)
{
    ev_timer_stop(d->loop, &db->probe_close);
    ev_timer_stop(d->loop, &db->probe_retry);
    pg_conn_free(db->probe);
    db->probe = pg_conn_new_named(d->loop, db->cfg.database_url, "identity", on_probe_state,
                                  on_probe_notify, db);
    /* Its sessions say "postgres connected" (and unreachable) for this server already. */
    if (db->probe)
        pg_conn_seen_before(db->probe);
}

/* db's identity is known: when another running entry reached the same database of the same
 * server, the later of the two in the list drains (as if a SIGHUP had dropped it), so that the
 * database's lane group is one entry's again and none of its rows waits for the other's table.
 * Said once, naming both.
 *
 * The same cluster and database is not enough: a copy made from a cluster's files (pg_basebackup
 * then promoted, a disk snapshot, a cloud clone or branch) has its system identifier and oids,
 * but is another database, which two entries may well serve. The server's start tells them
 * apart, but it changes at a restart, and entries are asked at different moments (one added by
 * SIGHUP long after the others): when db's server started after the other's answer, that answer
 * may be from before a restart of this very server, and the other is asked again; its new
 * answer, compared in turn, decides. */
static void probe_compare(Databases *d, Db *db)
{
    if (d->stopping)
        return;
    for (int i = 0; i < d->n; i++) {
        Db *other = d->dbs[i];
        if (other == db || other->removed || db->removed || !other->identity[0] ||
            !same_identity(other, db))
            continue;
        if (other->server_start != db->server_start) {
            if (db->server_start > other->asked_at && !other->asking_again &&
                other->asked_again < PROBE_ASKED_AGAIN_MAX) {
                other->asking_again = true;
                other->asked_again++;
                log_set_context(other->log_context);
                probe_open(d, other);
                log_set_context(db->log_context);
            }
            continue;
        }
        int at = 0;
        while (at < d->n && d->dbs[at] != db)
            at++;
        Db *first = i < at ? other : db, *later = i < at ? db : other;
        char q[200], shown[200];
        snprintf(shown, sizeof(shown), "%s|%s", db->system_id[0] ? db->system_id : "?",
                 db->identity);
        log_set_context(NULL);
        log_error("two databases of the list reach the same database: the later one stops; list "
                  "each database once (its lanes are one group, which two entries would split, "
                  "each leaving rows of its table unclaimed)",
                  "database=%s stopping=%s server_database=%s", first->cfg.database_name,
                  later->cfg.database_name, log_quote(shown, q, sizeof(q)));
        twin_remember(d, later, first);
        log_set_context(later->log_context);
        later->removed = true;
        if (!later->stopped)
            relay_drain(later->relay);
        log_set_context(db->log_context);
        return;
    }
}

static void on_probe_answer(PgConn *pg, PGresult **results, int n, const char *error, void *arg)
{
    Db *db = arg;
    log_set_context(db->log_context);
    if (!results) {
        /* Connection lost, or no answer within the round trip's deadline: on_probe_state asks
         * again once it is back, for as long as it takes (each attempt bounded by
         * --session-timeout, the reconnects by pg.c's backoff). Meanwhile the entry runs
         * unchecked, as every entry does until its answer comes; a probe that never answers (a
         * proxy or pooler that holds it, a lock on pg_database) left that unsaid, the only
         * lines the connection's own, which read as an outage of a database that works. */
        if (!db->identity[0] && !db->unanswered_said) {
            char q[300];
            log_warn("cannot tell yet which server this database's URL reaches (its identity "
                     "probe got no answer; asking again): until it answers, two entries of the "
                     "list on one database are not detected for it",
                     "error=%s", log_quote(error ? error : "connection lost", q, sizeof(q)));
            db->unanswered_said = true;
        }
        return;
    }
    PGresult *r = n == 2 ? results[0] : NULL, *sys = n == 2 ? results[1] : NULL;
    if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 || PQnfields(r) != 3 ||
        PQgetisnull(r, 0, 0) || PQgetisnull(r, 0, 1) || PQgetisnull(r, 0, 2)) {
        /* Refused, not lost: the connection is fine, so nothing else would ever ask again, and
         * the entry would go unchecked for the process's life over what may be a passing
         * error. Asked again on a new connection after the backoff (asking_again, when set,
         * stays set: the answer that decides is still to come). */
        if (!db->refused_said) {
            char q[300];
            log_warn("cannot tell yet which server this database's URL reaches (its identity "
                     "probe failed; asking again, backing off to once a minute): until it "
                     "answers, two entries of the list on one database are not detected for it",
                     "error=%s", log_quote(error ? error : "no row", q, sizeof(q)));
            db->refused_said = true;
        }
        if (!db->owner->stopping && !db->removed) {
            ev_timer_set(&db->probe_retry, backoff_next(&db->probe_backoff), 0.0);
            ev_timer_start(db->owner->loop, &db->probe_retry);
        }
    } else {
        db->asking_again = false;
        backoff_reset(&db->probe_backoff);
        bool known = sys && PQresultStatus(sys) == PGRES_TUPLES_OK && PQntuples(sys) == 1 &&
                     !PQgetisnull(sys, 0, 0);
        snprintf(db->system_id, sizeof(db->system_id), "%s", known ? PQgetvalue(sys, 0, 0) : "");
        snprintf(db->identity, sizeof(db->identity), "%s", PQgetvalue(r, 0, 0));
        db->server_start = strtod(PQgetvalue(r, 0, 1), NULL);
        db->asked_at = strtod(PQgetvalue(r, 0, 2), NULL);
        if (db->unanswered_said || db->refused_said)
            log_info("the identity probe answered: this database's URL is checked against the "
                     "other entries now",
                     NULL);
        db->unanswered_said = false;
        db->refused_said = false;
        probe_compare(db->owner, db);
    }
    ev_timer_start(db->owner->loop, &db->probe_close);
}

static void on_probe_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    Db *db = w->data;
    if (db->owner->stopping || db->removed)
        return;
    log_set_context(db->log_context);
    probe_open(db->owner, db);
    log_set_context(NULL);
}

static void on_probe_state(PgConn *pg, bool up, const char *reason, void *arg)
{
    Db *db = arg;
    if (!up)
        return;
    PgQuery q[2] = {{SQL_IDENTITY, 0, NULL, false}, {SQL_SYSTEM_ID, 0, NULL, false}};
    if (!pg_conn_send(pg, q, 2, on_probe_answer, db)) {
        /* Not asked: a later entry's answer may ask again (probe_compare). */
        db->asking_again = false;
        ev_timer_start(db->owner->loop, &db->probe_close);
    }
}

static void db_start(Databases *d, Db *db)
{
    log_set_context(db->log_context);
    metrics_select(db->metrics);
    probe_open(d, db);
    /* On demand: an idle database holds its claim session's connection and no other. */
    db->upkeep = upkeep_new_on_demand(d->loop, &db->cfg, d->gauges);
    relay_start(db->relay);
    db->started = true;
    log_set_context(NULL);
    metrics_select(NULL);
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    Databases *d = w->data;
    if (++d->signals > 1) {
        /* Second signal: leave now; the servers roll back the open transactions. */
        static const char msg[] = "level=warn msg=\"second signal, exiting immediately\"\n";
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)ignored;
        _exit(128 + w->signum);
    }
    log_set_context(NULL);
    log_info("shutting down", "signal=%s databases=%d", strsignal(w->signum), d->n);
    d->stopping = true;
    for (int i = 0; i < d->n; i++)
        if (!d->dbs[i]->stopped)
            relay_drain(d->dbs[i]->relay);
    log_set_context(NULL);
    bool all = true;
    for (int i = 0; i < d->n; i++)
        all = all && d->dbs[i]->stopped;
    if (all)
        ev_break(loop, EVBREAK_ALL);
}

Databases *databases_new(struct ev_loop *loop, Config *cfg, const rd_kafka_conf_t *kconf,
                         bool gauges, char *err, size_t errlen)
{
    Databases *d = calloc(1, sizeof(*d));
    if (!d || !(d->kconf = rd_kafka_conf_dup(kconf))) {
        free(d);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    d->loop = loop;
    d->gauges = gauges;
    ev_init(&d->reap, on_reap);
    d->reap.data = d;
    ev_signal_init(&d->sigterm, on_signal, SIGTERM);
    d->sigterm.data = d;
    ev_signal_init(&d->sigint, on_signal, SIGINT);
    d->sigint.data = d;
    for (int i = 0; i < cfg->n_dbs; i++) {
        Db *db = db_new(d, &cfg->dbs[i], err, errlen);
        if (!db) {
            databases_free(d);
            return NULL;
        }
        d->dbs[d->n++] = db;
    }
    return d;
}

bool databases_check_registries(Databases *d, char *err, size_t errlen)
{
    /* The registry's URLs and credentials are the process's: one probe, by the first database
     * whose value format uses them, whose answer the others start from (the URL it took, the
     * URLs it was told to wait for): they asked those at once. */
    for (int i = 0; i < d->n; i++) {
        if (d->dbs[i]->cfg.value_format == VALUE_JSON)
            continue;
        log_set_context(d->dbs[i]->log_context);
        bool ok = relay_check_registry(d->dbs[i]->relay, err, errlen);
        log_set_context(NULL);
        for (int j = i + 1; ok && j < d->n; j++)
            relay_take_registry_probe(d->dbs[j]->relay, d->dbs[i]->relay);
        return ok;
    }
    return true;
}

/* A database a SIGHUP adds starts its registry client as a running database's stands: the URL it
 * took and the URLs a 429's or 503's Retry-After holds (the start-up probe's, or a lookup's since).
 * Unprobed, it asked the URL the others were told to wait for at its first lookup, and the URL
 * the probe had passed over. A draining one's stands as well (its holds are the registry's, kept
 * on the same monotonic clock; they are copied, not shared): a rename, the way to change what a
 * reload cannot, drops the only running database as it adds the new one, and skipped, the new one
 * asked the gateway at once. One whose URLs differ (a reload that changed --schema-registry-url
 * gives the databases it adds the new list) is passed for the next. Running ones first. */
static void registry_from_running(Databases *d, Db *db)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < d->n; i++) {
            const Db *from = d->dbs[i];
            if (from != db && from->removed == (pass == 1) &&
                from->cfg.value_format != VALUE_JSON &&
                relay_take_registry_probe(db->relay, from->relay))
                return;
        }
}

void databases_start(Databases *d)
{
    ev_signal_start(d->loop, &d->sigterm);
    ev_signal_start(d->loop, &d->sigint);
    for (int i = 0; i < d->n; i++)
        db_start(d, d->dbs[i]);
}

int databases_run(Databases *d)
{
    ev_run(d->loop, 0);
    return d->exit_status;
}

static Db *find(const Databases *d, const char *name)
{
    for (int i = 0; i < d->n; i++)
        if (!d->dbs[i]->removed && strcmp(d->dbs[i]->cfg.database_name, name) == 0)
            return d->dbs[i];
    return NULL;
}

static const Config *find_fresh(const Config *fresh, const char *name)
{
    for (int i = 0; i < fresh->n_dbs; i++)
        if (fresh->dbs[i].database_name && strcmp(fresh->dbs[i].database_name, name) == 0)
            return &fresh->dbs[i];
    return NULL;
}

/* Whether a database of that name is still draining (dropped by an earlier SIGHUP, not gone). */
static bool draining(const Databases *d, const char *name)
{
    for (int i = 0; i < d->n; i++)
        if (d->dbs[i]->removed && strcmp(d->dbs[i]->cfg.database_name, name) == 0)
            return true;
    return false;
}

/* Whether c, an entry of fresh, is one stopped because it reaches another's database
 * (twin_remember) that fresh lists as it was (its URL spelled the same) beside the entry it
 * reaches the database of, which runs on and which fresh keeps: it stays stopped, unsaid. A
 * changed URL, or the other entry gone or going, adds it again (probed again). */
static bool held_twin(const Databases *d, const Config *fresh, const Config *c)
{
    for (int i = 0; i < d->n_twins; i++)
        if (c->database_name && strcmp(d->twins[i].name, c->database_name) == 0)
            return strcmp(d->twins[i].url, c->database_url ? c->database_url : "") == 0 &&
                   find(d, d->twins[i].kept) && find_fresh(fresh, d->twins[i].kept);
    return false;
}

/* The running database that fresh keeps whose URL names the same database as url, or NULL.
 * The new list was checked for two entries of one database (config.c) by the URLs it gives, but
 * a kept entry goes on with its running URL whatever the list now says (restart-only): an entry
 * the list adds with that URL would be a second one serving the database. Its 64 lanes are one
 * group, which two entries would split, each leaving its own table's rows in the other's lanes
 * unclaimed. One draining, or that fresh drops (it drains), is not counted: it gives its lanes
 * up (a rename). */
static const Db *serving(const Databases *d, const Config *fresh, const char *url)
{
    for (int i = 0; i < d->n; i++)
        if (!d->dbs[i]->removed && find_fresh(fresh, d->dbs[i]->cfg.database_name) &&
            db_same_database(d->dbs[i]->cfg.database_url, url))
            return d->dbs[i];
    return NULL;
}

bool databases_reload_check(const Databases *d, const Config *fresh, char *err, size_t errlen)
{
    if (d->stopping || fresh->n_dbs == 0)
        return true; /* databases_reload takes nothing over then */
    int adding = 0;
    for (int i = 0; i < fresh->n_dbs; i++) {
        const Config *c = &fresh->dbs[i];
        if (!c->database_name || find(d, c->database_name) || held_twin(d, fresh, c))
            continue;
        /* The new one would claim beside the old one's last batch (both are lane members, so
         * order would hold, but two registries of one name would not). */
        if (draining(d, c->database_name)) {
            snprintf(err, errlen,
                     "database %s: listed again while it still drains from an earlier reload: "
                     "send SIGHUP again once it is gone (\"database removed\")",
                     c->database_name);
            return false;
        }
        const Db *twin = serving(d, fresh, c->database_url);
        if (twin) {
            snprintf(err, errlen,
                     "database %s: names the same database (host, port and dbname) as database "
                     "%s, which still serves it (a kept entry's URL changes only at a restart): "
                     "restart, or remove %s first",
                     c->database_name, twin->cfg.database_name, twin->cfg.database_name);
            return false;
        }
        /* Its producer is made on the loop (db_new), and librdkafka opens the TLS files then. */
        char why[600];
        if (adding == 0 && !kafka_conf_files_ok(d->kconf, why, sizeof(why))) {
            snprintf(err, errlen, "database %s: %s", c->database_name, why);
            return false;
        }
        adding++;
    }
    /* Draining databases hold their place until they are gone (those this reload drops too). */
    if (d->n + adding > CONFIG_MAX_DATABASES) {
        snprintf(err, errlen,
                 "adding %d databases to the %d running (draining ones included) would pass the "
                 "most one process serves (%d): send SIGHUP again once the draining ones are gone",
                 adding, d->n, CONFIG_MAX_DATABASES);
        return false;
    }
    return true;
}

/* Collects the names of changed options that need a restart (config_diff). */
static void note_restart_only(const char *option, bool reloadable, void *arg)
{
    StrBuf *names = arg;
    if (reloadable || strcmp(option, "databases") == 0)
        return;
    if (names->len)
        strbuf_puts(names, ",");
    strbuf_puts(names, option);
}

void databases_reload(Databases *d, Config *fresh)
{
    /* Neither comes from a SIGHUP (ops.c ignores one while shutting down, reload.c refuses a
     * configuration without a list before anything is said): kept as the array's guards. */
    if (d->stopping || fresh->n_dbs == 0)
        return;
    int removed = 0, added = 0;
    for (int i = 0; i < d->n; i++) {
        Db *db = d->dbs[i];
        if (db->removed)
            continue;
        const Config *now = find_fresh(fresh, db->cfg.database_name);
        log_set_context(db->log_context);
        if (!now) {
            db->removed = true;
            removed++;
            log_info("database no longer listed: draining it", NULL);
            relay_drain(db->relay);
            continue;
        }
        StrBuf restart = {0};
        config_diff(&db->cfg, now, note_restart_only, &restart);
        if (restart.len)
            log_warn("changed options of this database need a restart (or a remove and an add "
                     "under another name); they keep their running values",
                     "options=%s", restart.s);
        strbuf_free(&restart);
        config_apply_reloadable(&db->cfg, now);
        metrics_select(db->metrics);
        if (db->upkeep)
            upkeep_reconfigure(db->upkeep);
    }
    log_set_context(NULL);
    metrics_select(NULL);
    /* An entry stopped as another's twin is remembered while fresh lists it as it was. */
    for (int i = 0; i < d->n_twins; i++) {
        const Config *c = find_fresh(fresh, d->twins[i].name);
        if (!c || !held_twin(d, fresh, c))
            twin_forget(d, i--);
    }
    /* databases_reload_check refused what this loop cannot take (a name still draining, a twin
     * of a kept entry, too many databases) and reload.c each entry start-up refuses, before
     * anything was applied. */
    for (int i = 0; i < fresh->n_dbs; i++) {
        Config *c = &fresh->dbs[i];
        if (!c->database_name || find(d, c->database_name) || held_twin(d, fresh, c))
            continue;
        char err[1024], q[1100];
        if (d->n >= CONFIG_MAX_DATABASES) { /* checked before: the array's bound, kept anyway */
            log_error("configuration reload: too many databases; not adding", "database=%s max=%d",
                      log_quote(c->database_name, q, sizeof(q)), CONFIG_MAX_DATABASES);
            continue;
        }
        Db *db = db_new(d, c, err, sizeof(err));
        if (!db) {
            log_error("configuration reload: cannot add a database", "error=%s",
                      log_quote(err, q, sizeof(q)));
            continue;
        }
        d->dbs[d->n++] = db;
        log_set_context(db->log_context);
        log_info("database added", NULL);
        registry_from_running(d, db);
        db_start(d, db);
        added++;
    }
    /* running: the entries that serve their database now; draining: those dropped (by this
     * reload, an earlier one, or as another's twin) that have not left yet. d->n - removed
     * counted an earlier reload's entries still draining as running. */
    int running = 0, draining_now = 0;
    for (int i = 0; i < d->n; i++) {
        if (d->dbs[i]->removed)
            draining_now++;
        else
            running++;
    }
    log_set_context(NULL);
    log_info("databases reloaded", "added=%d removed=%d running=%d draining=%d", added, removed,
             running, draining_now);
}

/* Whether db is ready; its reasons go to why (when not NULL). */
static bool db_ready(const Db *db, StrBuf *why)
{
    RelayStatus st;
    relay_status(db->relay, &st);
    st.stopping = st.stopping && !db->removed; /* said as "removed, draining" below */
    bool ready =
        readiness_judge(&st, upkeep_lane_squatters(db->upkeep), why) && db->started && !db->removed;
    if (why && db->removed)
        strbuf_puts(why, " removed, draining;");
    return ready;
}

void databases_status(const Databases *d, DatabasesStatus *out)
{
    memset(out, 0, sizeof(*out));
    out->stopping = d->stopping;
    out->total = d->n;
    for (int i = 0; i < d->n; i++) {
        RelayStatus st;
        relay_status(d->dbs[i]->relay, &st);
        out->all.lanes_owned += st.lanes_owned;
        out->all.claim_sessions += st.claim_sessions;
        out->all.postgres_up = out->all.postgres_up || st.postgres_up;
        out->all.kafka_up = out->all.kafka_up || st.kafka_up;
        if (db_ready(d->dbs[i], NULL))
            out->ready++;
    }
    out->all.stopping = d->stopping;
}

void databases_sd_status(const void *arg, RelayStatus *st, char *status, size_t len)
{
    const Databases *d = arg;
    DatabasesStatus all;
    databases_status(d, &all);
    *st = all.all;
    const char *first = NULL;
    for (int i = 0; i < d->n && !first; i++)
        if (!db_ready(d->dbs[i], NULL))
            first = d->dbs[i]->cfg.database_name;
    if (all.stopping)
        snprintf(status, len, "shutting down");
    else
        snprintf(status, len, "%s: %d of %d databases ready%s%s", all.ready ? "ready" : "not ready",
                 all.ready, all.total, first ? "; not: " : "", first ? first : "");
}

void databases_readyz(const Databases *d, StrBuf *body)
{
    StrBuf why = {0};
    for (int i = 0; i < d->n; i++) {
        strbuf_reset(&why);
        bool ready = db_ready(d->dbs[i], &why);
        strbuf_puts(body, d->dbs[i]->cfg.database_name);
        strbuf_puts(body, ready ? " ready\n" : " not ready:");
        if (!ready) {
            strbuf_puts(body, why.s ? why.s : "");
            strbuf_puts(body, "\n");
        }
    }
    strbuf_free(&why);
}

void databases_metrics(const Databases *d, StrBuf *out)
{
    MetricsLive lives[CONFIG_MAX_DATABASES];
    MetricsDb *regs[CONFIG_MAX_DATABASES];
    for (int i = 0; i < d->n; i++) {
        RelayStatus st;
        relay_status(d->dbs[i]->relay, &st);
        lives[i] = (MetricsLive){.postgres_up = st.postgres_up,
                                 .kafka_up = st.kafka_up,
                                 .registry_up = st.registry_up,
                                 .lanes_owned = st.lanes_owned,
                                 .live_sessions = st.live_sessions,
                                 .claim_sessions = st.claim_sessions,
                                 .held_aggregate_types = st.held_aggregate_types,
                                 .kafka_away = st.kafka_away,
                                 .ready = db_ready(d->dbs[i], NULL)};
        regs[i] = d->dbs[i]->metrics;
    }
    metrics_render_databases(out, regs, lives, d->n);
}

void databases_free(Databases *d)
{
    if (!d)
        return;
    ev_signal_stop(d->loop, &d->sigterm);
    ev_signal_stop(d->loop, &d->sigint);
    ev_timer_stop(d->loop, &d->reap);
    while (d->n_twins > 0)
        twin_forget(d, 0);
    /* One second for all the producers' last messages, as one database's relay has. */
    double deadline = monotime_now() + 1.0;
    for (int i = 0; i < d->n; i++) {
        double left_ms = (deadline - monotime_now()) * 1000.0;
        db_free(d->dbs[i], left_ms > 0 ? (int)left_ms : 0);
    }
    rd_kafka_conf_destroy(d->kconf);
    free(d);
}
