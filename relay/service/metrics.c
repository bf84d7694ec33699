#include "metrics.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "route.h"

#ifndef OUTBOX_RELAY_VERSION
#define OUTBOX_RELAY_VERSION "dev"
#endif

/* Upper bounds of the latency buckets, in seconds: from a few milliseconds (a relay that keeps
 * up) to an hour (a backlog after an outage). */
static const double latency_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                        2.5,   5,    10,    30,   60,  300,  900, 3600};
/* Upper bounds of the claim-duration buckets, in seconds: a claim over a healthy index takes a
 * millisecond or two; one that walks dead versions an old snapshot keeps
 * (docs/operations.md#dead-rows-and-old-snapshots) takes tens or hundreds. */
static const double claim_bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                      0.1,    0.25,  0.5,    1,     2.5,  5,     10};
#define MAX_BOUNDS 16

/* A Prometheus histogram: per-bucket counts (not cumulative; the last is +Inf), count, sum. */
typedef struct Histogram {
    unsigned long long buckets[MAX_BOUNDS + 1];
    unsigned long long count;
    double sum;
} Histogram;

typedef struct TopicCount {
    char *topic; /* NULL: free slot */
    unsigned long long published;
} TopicCount;

struct MetricsDb {
    char *name; /* NULL: the process's own registry (no database label) */
    /* Open addressing over a power-of-two table, at most half full. */
    TopicCount *topics;
    size_t topics_cap, topics_len;
    unsigned long long other_published; /* beyond METRICS_MAX_TOPICS */
    unsigned long long failures[2];     /* [0] transient, [1] permanent */
    unsigned long long dead_lettered, batches, retention_deleted;
    Histogram latency; /* over latency_bounds */
    Histogram claims;  /* over claim_bounds */
    bool backlog_known;
    long long backlog, dead_rows, dead_letter_failed;
    double oldest_age_s;
    time_t backlog_refreshed;
    bool pace_known;
    double backlog_pace_s;
    bool retention_known;
    double retention_overdue_s;
    bool squatters_known;
    int squatters;
    bool horizon_known;
    long long horizon_xids;
    double horizon_held_s;
};

static MetricsDb own;
/* The registry the counting functions count into: the loop's thread only. */
static MetricsDb *cur = &own;

static void db_clear(MetricsDb *d)
{
    for (size_t i = 0; i < d->topics_cap; i++)
        free(d->topics[i].topic);
    free(d->topics);
    char *name = d->name;
    memset(d, 0, sizeof(*d));
    d->name = name;
}

void metrics_reset(void)
{
    db_clear(&own);
    cur = &own;
}

MetricsDb *metrics_db_new(const char *name)
{
    MetricsDb *d = calloc(1, sizeof(*d));
    if (d && !(d->name = strdup(name))) {
        free(d);
        return NULL;
    }
    return d;
}

void metrics_db_free(MetricsDb *d)
{
    if (!d)
        return;
    if (cur == d)
        cur = &own;
    db_clear(d);
    free(d->name);
    free(d);
}

void metrics_select(MetricsDb *d)
{
    cur = d ? d : &own;
}

MetricsDb *metrics_selected(void)
{
    return cur == &own ? NULL : cur;
}

static uint64_t hash(const char *s)
{
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The slot of topic, or the free slot where it would go. */
static TopicCount *slot_of(TopicCount *table, size_t cap, const char *topic)
{
    size_t i = (size_t)hash(topic) & (cap - 1);
    while (table[i].topic && strcmp(table[i].topic, topic) != 0)
        i = (i + 1) & (cap - 1);
    return &table[i];
}

static bool grow(void)
{
    size_t cap = cur->topics_cap ? cur->topics_cap * 2 : 16;
    TopicCount *table = calloc(cap, sizeof(*table));
    if (!table)
        return false;
    for (size_t i = 0; i < cur->topics_cap; i++)
        if (cur->topics[i].topic)
            *slot_of(table, cap, cur->topics[i].topic) = cur->topics[i];
    free(cur->topics);
    cur->topics = table;
    cur->topics_cap = cap;
    return true;
}

static unsigned long long *published_counter(const char *topic)
{
    if (cur->topics_cap) {
        TopicCount *t = slot_of(cur->topics, cur->topics_cap, topic);
        if (t->topic)
            return &t->published;
    }
    if (cur->topics_len >= METRICS_MAX_TOPICS ||
        ((cur->topics_len + 1) * 2 > cur->topics_cap && !grow()))
        return &cur->other_published;
    TopicCount *t = slot_of(cur->topics, cur->topics_cap, topic);
    t->topic = strdup(topic);
    if (!t->topic)
        return &cur->other_published;
    cur->topics_len++;
    return &t->published;
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(N_OF(latency_bounds) <= MAX_BOUNDS && N_OF(claim_bounds) <= MAX_BOUNDS,
               "Histogram has room for every bound");

static void observe(Histogram *h, const double *bounds, size_t n, double value)
{
    size_t b = 0;
    while (b < n && value > bounds[b])
        b++;
    h->buckets[b]++;
    h->count++;
    h->sum += value;
}

void metrics_event_published(const char *topic, double latency_s)
{
    (*published_counter(topic))++;
    if (latency_s >= 0)
        observe(&cur->latency, latency_bounds, N_OF(latency_bounds), latency_s);
}

void metrics_claim_done(double seconds)
{
    if (seconds >= 0)
        observe(&cur->claims, claim_bounds, N_OF(claim_bounds), seconds);
}

void metrics_failure(bool permanent)
{
    cur->failures[permanent ? 1 : 0]++;
}

void metrics_dead_lettered(void)
{
    cur->dead_lettered++;
}

void metrics_batch_committed(void)
{
    cur->batches++;
}

void metrics_retention_deleted(long long rows)
{
    if (rows > 0)
        cur->retention_deleted += (unsigned long long)rows;
}

void metrics_set_lane_squatters(int sessions)
{
    cur->squatters_known = true;
    cur->squatters = sessions;
}

void metrics_set_vacuum_horizon(long long xids, double held_s)
{
    cur->horizon_known = true;
    cur->horizon_xids = xids;
    cur->horizon_held_s = held_s;
}

void metrics_set_backlog(long long unsent, long long dead, long long dead_letter_failed,
                         double oldest_age_s)
{
    cur->backlog_known = true;
    cur->backlog = unsent;
    cur->dead_rows = dead;
    cur->dead_letter_failed = dead_letter_failed;
    cur->oldest_age_s = oldest_age_s;
    cur->backlog_refreshed = time(NULL);
}

void metrics_set_retention_overdue(bool known, double overdue_s)
{
    cur->retention_known = known;
    cur->retention_overdue_s = overdue_s;
}

void metrics_set_backlog_pace(double every_s)
{
    cur->pace_known = true;
    cur->backlog_pace_s = every_s;
}

void metrics_row_acked(const Batch *b, const BatchRow *br, double now)
{
    if (br->dead_letter || !br->topic)
        return;
    double since_claim = now - b->claimed_at;
    metrics_event_published(br->topic,
                            br->age_s < 0 ? -1.0 : br->age_s + (since_claim > 0 ? since_claim : 0));
}

/* ---- exposition ------------------------------------------------------------------------------ */

static void printf_to(StrBuf *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends the formatted text whole, however long: a line cut short (a HELP text that grew, say)
 * would lose what follows it, such as its family's # TYPE line. */
static void printf_to(StrBuf *out, const char *fmt, ...)
{
    char line[512];
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof(line)) {
        strbuf_append(out, line, (size_t)n);
    } else if (n > 0) {
        char *longer = malloc((size_t)n + 1);
        if (longer && vsnprintf(longer, (size_t)n + 1, fmt, again) == n)
            strbuf_append(out, longer, (size_t)n);
        free(longer);
    }
    va_end(again);
}

static void header(StrBuf *out, const char *name, const char *type, const char *help)
{
    printf_to(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \, " and newlines escaped, as the text format requires. */
static void label_value(StrBuf *out, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            strbuf_append(out, "\\", 1);
        if (*v == '\n')
            strbuf_append(out, "\\n", 2);
        else
            strbuf_append(out, v, 1);
    }
}

/* The start of one sample: name, then its labels (the database's first, then extra: label text
 * already escaped, or NULL), then a space. */
static void series(StrBuf *out, const char *name, const MetricsDb *d, const char *extra)
{
    strbuf_puts(out, name);
    if (!d->name && !extra) {
        strbuf_puts(out, " ");
        return;
    }
    strbuf_puts(out, "{");
    if (d->name) {
        strbuf_puts(out, "database=\"");
        label_value(out, d->name);
        strbuf_puts(out, extra ? "\"," : "\"");
    }
    if (extra)
        strbuf_puts(out, extra);
    strbuf_puts(out, "} ");
}

/* What is rendered: each database's registry beside its live state. */
typedef struct Set {
    const MetricsDb *const *dbs;
    const MetricsLive *lives;
    int n;
} Set;

static int by_topic(const void *a, const void *b)
{
    return strcmp((*(const TopicCount *const *)a)->topic, (*(const TopicCount *const *)b)->topic);
}

static void render_published(StrBuf *out, const Set *set)
{
    header(out, "outbox_events_published_total", "counter",
           "Events acknowledged by Kafka (acks=all), by topic. At least once: an event sent again "
           "after a crash or a lost connection counts again. Dead-letter copies are not counted.");
    StrBuf label = {0};
    for (int k = 0; k < set->n; k++) {
        const MetricsDb *d = set->dbs[k];
        TopicCount **sorted = calloc(d->topics_len ? d->topics_len : 1, sizeof(*sorted));
        size_t n = 0;
        for (size_t i = 0; sorted && i < d->topics_cap; i++)
            if (d->topics[i].topic)
                sorted[n++] = &d->topics[i];
        qsort(sorted, n, sizeof(*sorted), by_topic);
        for (size_t i = 0; i < n; i++) {
            strbuf_reset(&label);
            strbuf_puts(&label, "topic=\"");
            label_value(&label, sorted[i]->topic);
            strbuf_puts(&label, "\"");
            series(out, "outbox_events_published_total", d, label.s);
            printf_to(out, "%llu\n", sorted[i]->published);
        }
        free(sorted);
        if (d->other_published) {
            series(out, "outbox_events_published_total", d, "topic=\"_other\"");
            printf_to(out, "%llu\n", d->other_published);
        }
    }
    strbuf_free(&label);
}

/* A counter or gauge of one value per database: offset of an unsigned long long field. */
static void family_counter(StrBuf *out, const Set *set, const char *name, const char *help,
                           size_t offset)
{
    header(out, name, "counter", help);
    for (int k = 0; k < set->n; k++) {
        series(out, name, set->dbs[k], NULL);
        printf_to(out, "%llu\n", *(const unsigned long long *)((const char *)set->dbs[k] + offset));
    }
}

/* Integer gauges print as integers; second gauges with three decimals, negative values
 * (unknown) as 0. Only the databases with known set (its byte offset; -1: all) are shown. */
typedef enum { G_INT, G_LLONG, G_SECONDS, G_TIME } GaugeKind;

static void family_gauge(StrBuf *out, const Set *set, const char *name, const char *help,
                         long known, size_t offset, GaugeKind kind)
{
    bool any = false;
    for (int k = 0; k < set->n; k++) {
        const char *d = (const char *)set->dbs[k];
        if (known >= 0 && !*(const bool *)(d + known))
            continue;
        if (!any)
            header(out, name, "gauge", help);
        any = true;
        series(out, name, set->dbs[k], NULL);
        if (kind == G_INT)
            printf_to(out, "%d\n", *(const int *)(d + offset));
        else if (kind == G_LLONG)
            printf_to(out, "%lld\n", *(const long long *)(d + offset));
        else if (kind == G_TIME)
            printf_to(out, "%lld\n", (long long)*(const time_t *)(d + offset));
        else {
            /* +Inf as the exposition format spells it (a sent row at -infinity is that far past
             * --retention); -Inf is below 0, so 0. */
            double v = *(const double *)(d + offset);
            if (isinf(v) && v > 0)
                printf_to(out, "+Inf\n");
            else
                printf_to(out, "%.3f\n", v > 0 ? v : 0.0);
        }
    }
}

static void render_histogram(StrBuf *out, const Set *set, const char *name, const char *help,
                             size_t offset, const double *bounds, size_t n)
{
    header(out, name, "histogram", help);
    char bucket[200], le[40];
    snprintf(bucket, sizeof(bucket), "%s_bucket", name);
    for (int k = 0; k < set->n; k++) {
        const MetricsDb *d = set->dbs[k];
        const Histogram *h = (const Histogram *)((const char *)d + offset);
        unsigned long long cumulative = 0;
        for (size_t b = 0; b <= n; b++) {
            cumulative += h->buckets[b];
            if (b < n)
                snprintf(le, sizeof(le), "le=\"%g\"", bounds[b]);
            else
                snprintf(le, sizeof(le), "le=\"+Inf\"");
            series(out, bucket, d, le);
            printf_to(out, "%llu\n", cumulative);
        }
        printf_to(out, "%s_sum", name);
        series(out, "", d, NULL);
        printf_to(out, "%.6f\n%s_count", h->sum, name);
        series(out, "", d, NULL);
        printf_to(out, "%llu\n", h->count);
    }
}

static void render_latency(StrBuf *out, const Set *set)
{
    render_histogram(
        out, set, "outbox_created_to_ack_seconds",
        "Seconds from an event's created_at (the start of the transaction that inserted it) to "
        "the broker's acknowledgement of its message: time waiting in the outbox plus claim, "
        "produce and replication. Measured as the row's age when claimed (database clock) plus "
        "the time from claim to acknowledgement (relay clock), so clock skew does not enter. A "
        "retried event counts from its original created_at; a copy sent again counts again.",
        offsetof(MetricsDb, latency), latency_bounds, N_OF(latency_bounds));
    render_histogram(
        out, set, "outbox_claim_duration_seconds",
        "Seconds from sending a claim (BEGIN, the claim statement) to its rows arriving, empty "
        "claims included; a claim sent behind the last batch's marks and COMMIT, in one round "
        "trip, counts their time too. Claims that grow slower while the backlog does not are "
        "walking dead row versions an old snapshot keeps from vacuum: see "
        "outbox_vacuum_horizon_held_seconds.",
        offsetof(MetricsDb, claims), claim_bounds, N_OF(claim_bounds));
}

/* A gauge of the live state, one sample per database. */
static void family_live(StrBuf *out, const Set *set, const char *name, const char *help,
                        size_t offset, bool is_bool)
{
    header(out, name, "gauge", help);
    for (int k = 0; k < set->n; k++) {
        const char *l = (const char *)&set->lives[k];
        series(out, name, set->dbs[k], NULL);
        printf_to(out, "%d\n",
                  is_bool ? (*(const bool *)(l + offset) ? 1 : 0) : *(const int *)(l + offset));
    }
}

#define DB(f) offsetof(MetricsDb, f)
#define LIVE(f) offsetof(MetricsLive, f)

static void render_set(StrBuf *out, const Set *set)
{
    header(out, "outbox_build_info", "gauge", "Always 1; the version label tells the build.");
    printf_to(out, "outbox_build_info{version=\"%s\"} 1\n", OUTBOX_RELAY_VERSION);

    render_published(out, set);
    header(out, "outbox_failures_total", "counter",
           "Failed delivery attempts of events and dead-letter copies, by class: transient "
           "(broker down, timeouts, a topic the relay may not write or that does not exist; "
           "retried soon, never dead-lettered) or permanent (rejected, too large, illegal "
           "topic; retried with backoff, then dead-lettered).");
    for (int k = 0; k < set->n; k++) {
        series(out, "outbox_failures_total", set->dbs[k], "class=\"transient\"");
        printf_to(out, "%llu\n", set->dbs[k]->failures[0]);
        series(out, "outbox_failures_total", set->dbs[k], "class=\"permanent\"");
        printf_to(out, "%llu\n", set->dbs[k]->failures[1]);
    }
    family_counter(out, set, "outbox_events_dead_lettered_total",
                   "Events this relay dead-lettered after --max-attempts rejections.",
                   DB(dead_lettered));
    family_counter(out, set, "outbox_batches_total",
                   "Claim transactions that delivered or recorded rows and committed.",
                   DB(batches));
    family_counter(out, set, "outbox_retention_deleted_rows_total",
                   "Sent rows deleted by this relay because they were older than --retention.",
                   DB(retention_deleted));
    render_latency(out, set);

    long backlog = (long)DB(backlog_known);
    family_gauge(out, set, "outbox_backlog_rows",
                 "Unsent events that are not dead-lettered (waiting for a retry included), as of "
                 "the last refresh (every 5 s; 15 s for a database of a list).",
                 backlog, DB(backlog), G_LLONG);
    family_gauge(out, set, "outbox_oldest_unsent_age_seconds",
                 "Age (now() - created_at, database clock) of the oldest unsent event that "
                 "is not dead-lettered, as of the last refresh; 0 when there is none (rows "
                 "created at infinity or -infinity left out).",
                 backlog, DB(oldest_age_s), G_SECONDS);
    family_gauge(out, set, "outbox_dead_letter_rows",
                 "Dead-lettered events in the outbox (kept until requeued or purged), as of the "
                 "last refresh.",
                 backlog, DB(dead_rows), G_LLONG);
    family_gauge(
        out, set, "outbox_dead_letter_unpublished_rows",
        "Of the dead-lettered events, those whose copy to the dead-letter topic failed "
        "(or whose record of it the row refused) and waits for a retry, or was parked as too "
        "large for that topic even without its payload (never retried until requeued), as of "
        "the last refresh. It stays above 0 while copies keep failing; the log warns once a "
        "streak.",
        backlog, DB(dead_letter_failed), G_LLONG);
    family_gauge(
        out, set, "outbox_backlog_refresh_timestamp_seconds",
        "Unix time of the last successful refresh of the backlog gauges (with --retention, "
        "outbox_retention_overdue_seconds among them: one that fails stops this).",
        backlog, DB(backlog_refreshed), G_TIME);
    family_gauge(out, set, "outbox_backlog_refresh_interval_seconds",
                 "Seconds between backlog refreshes now: every 5 s (15 s for a database of a "
                 "list), or ten times as long as the last count took when that is longer. The "
                 "next refresh is due this long after outbox_backlog_refresh_timestamp_seconds, "
                 "plus the count's own time.",
                 (long)DB(pace_known), DB(backlog_pace_s), G_SECONDS);
    family_gauge(out, set, "outbox_retention_overdue_seconds",
                 "How long past --retention the oldest sent row is (now() - sent_at - retention, "
                 "database clock), as of the last backlog refresh; 0 while retention keeps up. "
                 "Served while --retention is on.",
                 (long)DB(retention_known), DB(retention_overdue_s), G_SECONDS);
    family_gauge(out, set, "outbox_lane_squatters",
                 "Sessions that are not relays holding the lane group's advisory locks (the "
                 "aggregates of their lanes wait for them); the relay is not ready while any do.",
                 (long)DB(squatters_known), DB(squatters), G_INT);
    long horizon = (long)DB(horizon_known);
    family_gauge(out, set, "outbox_vacuum_horizon_age_xids",
                 "Age in transactions of the oldest snapshot that keeps vacuum from removing dead "
                 "rows (a long transaction, a replication slot, a prepared transaction); claims "
                 "slow down while it grows. 0 when none.",
                 horizon, DB(horizon_xids), G_LLONG);
    family_gauge(
        out, set, "outbox_vacuum_horizon_held_seconds",
        "How long the holder of that snapshot has been in its transaction (a "
        "replication slot, or a standby's feedback through its walsender: since this relay first "
        "saw a transaction after its xmin); 0 when "
        "none.",
        horizon, DB(horizon_held_s), G_SECONDS);

    family_live(out, set, "outbox_postgres_up",
                "1 while every claim session's PostgreSQL connection is up, else 0 (it keeps "
                "reconnecting).",
                LIVE(postgres_up), true);
    family_live(
        out, set, "outbox_kafka_up",
        "1 while a Kafka broker is reachable (a connection up in the last statistics, or an "
        "acknowledgement since all brokers were last reported down), else 0.",
        LIVE(kafka_up), true);
    family_live(out, set, "outbox_schema_registry_up",
                "1 while the Schema Registry answers (always 1 without --value-format avro or "
                "json-schema), else 0: rows wait for it, no attempt counted.",
                LIVE(registry_up), true);
    family_live(out, set, "outbox_lanes_owned", "Lanes (of 64) this relay owns and claims from.",
                LIVE(lanes_owned), false);
    family_live(out, set, "outbox_relay_sessions",
                "Live claim sessions of all relays on this outbox (lane group members: "
                "--min-sessions to --sessions per relay) seen at the last lane rebalance, this "
                "relay's included.",
                LIVE(live_sessions), false);
    family_live(out, set, "outbox_claim_sessions",
                "This relay's sessions that claim now: --min-sessions, and up to --sessions while "
                "claims come back full (until --session-rest-after without one).",
                LIVE(claim_sessions), false);
    family_live(out, set, "outbox_kafka_away",
                "What this relay says of its Kafka to the relays of its outbox: 0 it delivers (or "
                "has not timed out --kafka-away-after times in a row), 1 away (its deliveries time "
                "out: its lanes go to the relays that reach Kafka, if any; not ready), 2 trying "
                "(its share of the lanes taken back on a trial after the away backoff, until an "
                "acknowledgement makes it 0 or a delivery timeout 1).",
                LIVE(kafka_away), false);
    family_live(out, set, "outbox_held_aggregate_types",
                "Aggregate types this relay's sessions hold out of their claims because Kafka "
                "refuses their topic for a fault of the setup (a topic deleted, an ACL revoked): "
                "their events wait, probed after each hold backoff, while the others go; the "
                "relay is not ready meanwhile, and its log names each type and topic.",
                LIVE(held_aggregate_types), false);
}

void metrics_render(StrBuf *out, const MetricsLive *live)
{
    const MetricsDb *dbs[1] = {&own};
    Set set = {dbs, live, 1};
    render_set(out, &set);
    family_live(out, &set, "outbox_ready",
                "Without --databases: 1 while /readyz answers 200 (PostgreSQL and Kafka reachable, "
                "not away from Kafka, the Schema Registry available, no setup fault, no lane "
                "squatters), else 0; "
                "/readyz says why.",
                LIVE(ready), true);
}

void metrics_render_databases(StrBuf *out, MetricsDb *const *dbs, const MetricsLive *lives, int n)
{
    Set set = {(const MetricsDb *const *)dbs, lives, n};
    render_set(out, &set);
    family_live(out, &set, "outbox_database_ready",
                "With --databases: 1 while the database is ready (its sessions connected and "
                "claiming, Kafka reachable and not away, no setup fault, no lane squatters), else "
                "0; /readyz "
                "says why. The process is ready while any database is.",
                LIVE(ready), true);
}
