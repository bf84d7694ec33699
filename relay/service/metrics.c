#include "metrics.h"

#include <stdarg.h>
#include <stdint.h>
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

static struct {
    /* Open addressing over a power-of-two table, at most half full. */
    TopicCount *topics;
    size_t topics_cap, topics_len;
    unsigned long long other_published; /* beyond METRICS_MAX_TOPICS */
    unsigned long long failures[2];     /* [0] transient, [1] permanent */
    unsigned long long dead_lettered, batches, retention_deleted;
    Histogram latency; /* over latency_bounds */
    Histogram claims;  /* over claim_bounds */
    bool backlog_known;
    long long backlog, dead_rows;
    double oldest_age_s;
    time_t backlog_refreshed;
    bool squatters_known;
    int squatters;
    bool horizon_known;
    long long horizon_xids;
    double horizon_held_s;
} m;

void metrics_reset(void)
{
    for (size_t i = 0; i < m.topics_cap; i++)
        free(m.topics[i].topic);
    free(m.topics);
    memset(&m, 0, sizeof(m));
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
    size_t cap = m.topics_cap ? m.topics_cap * 2 : 16;
    TopicCount *table = calloc(cap, sizeof(*table));
    if (!table)
        return false;
    for (size_t i = 0; i < m.topics_cap; i++)
        if (m.topics[i].topic)
            *slot_of(table, cap, m.topics[i].topic) = m.topics[i];
    free(m.topics);
    m.topics = table;
    m.topics_cap = cap;
    return true;
}

static unsigned long long *published_counter(const char *topic)
{
    if (m.topics_cap) {
        TopicCount *t = slot_of(m.topics, m.topics_cap, topic);
        if (t->topic)
            return &t->published;
    }
    if (m.topics_len >= METRICS_MAX_TOPICS || ((m.topics_len + 1) * 2 > m.topics_cap && !grow()))
        return &m.other_published;
    TopicCount *t = slot_of(m.topics, m.topics_cap, topic);
    t->topic = strdup(topic);
    if (!t->topic)
        return &m.other_published;
    m.topics_len++;
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
        observe(&m.latency, latency_bounds, N_OF(latency_bounds), latency_s);
}

void metrics_claim_done(double seconds)
{
    if (seconds >= 0)
        observe(&m.claims, claim_bounds, N_OF(claim_bounds), seconds);
}

void metrics_failure(bool permanent)
{
    m.failures[permanent ? 1 : 0]++;
}

void metrics_dead_lettered(void)
{
    m.dead_lettered++;
}

void metrics_batch_committed(void)
{
    m.batches++;
}

void metrics_retention_deleted(long long rows)
{
    if (rows > 0)
        m.retention_deleted += (unsigned long long)rows;
}

void metrics_set_lane_squatters(int sessions)
{
    m.squatters_known = true;
    m.squatters = sessions;
}

void metrics_set_vacuum_horizon(long long xids, double held_s)
{
    m.horizon_known = true;
    m.horizon_xids = xids;
    m.horizon_held_s = held_s;
}

void metrics_set_backlog(long long unsent, long long dead, double oldest_age_s)
{
    m.backlog_known = true;
    m.backlog = unsent;
    m.dead_rows = dead;
    m.oldest_age_s = oldest_age_s;
    m.backlog_refreshed = time(NULL);
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

static void printf_to(StrBuf *out, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n > 0)
        strbuf_append(out, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
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

static int by_topic(const void *a, const void *b)
{
    return strcmp((*(const TopicCount *const *)a)->topic, (*(const TopicCount *const *)b)->topic);
}

static void render_published(StrBuf *out)
{
    header(out, "outbox_events_published_total", "counter",
           "Events acknowledged by Kafka (acks=all), by topic. At least once: an event sent again "
           "after a crash or a lost connection counts again. Dead-letter copies are not counted.");
    TopicCount **sorted = calloc(m.topics_len ? m.topics_len : 1, sizeof(*sorted));
    size_t n = 0;
    for (size_t i = 0; sorted && i < m.topics_cap; i++)
        if (m.topics[i].topic)
            sorted[n++] = &m.topics[i];
    qsort(sorted, n, sizeof(*sorted), by_topic);
    for (size_t i = 0; i < n; i++) {
        strbuf_puts(out, "outbox_events_published_total{topic=\"");
        label_value(out, sorted[i]->topic);
        printf_to(out, "\"} %llu\n", sorted[i]->published);
    }
    free(sorted);
    if (m.other_published)
        printf_to(out, "outbox_events_published_total{topic=\"_other\"} %llu\n", m.other_published);
}

/* One gauge: its HELP and TYPE lines, then its sample. Integer gauges print as integers; the
 * others with three decimals, negative values (unknown) as 0. */
static void gauge_int(StrBuf *out, const char *name, const char *help, long long value)
{
    header(out, name, "gauge", help);
    printf_to(out, "%s %lld\n", name, value);
}

static void gauge_seconds(StrBuf *out, const char *name, const char *help, double value)
{
    header(out, name, "gauge", help);
    printf_to(out, "%s %.3f\n", name, value > 0 ? value : 0.0);
}

static void render_histogram(StrBuf *out, const char *name, const char *help, const Histogram *h,
                             const double *bounds, size_t n)
{
    header(out, name, "histogram", help);
    unsigned long long cumulative = 0;
    for (size_t b = 0; b < n; b++) {
        cumulative += h->buckets[b];
        printf_to(out, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[b], cumulative);
    }
    cumulative += h->buckets[n];
    printf_to(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, cumulative,
              name, h->sum, name, h->count);
}

static void render_latency(StrBuf *out)
{
    render_histogram(
        out, "outbox_created_to_ack_seconds",
        "Seconds from an event's created_at (the start of the transaction that inserted it) to "
        "the broker's acknowledgement of its message: time waiting in the outbox plus claim, "
        "produce and replication. Measured as the row's age when claimed (database clock) plus "
        "the time from claim to acknowledgement (relay clock), so clock skew does not enter. A "
        "retried event counts from its original created_at; a copy sent again counts again.",
        &m.latency, latency_bounds, N_OF(latency_bounds));
    render_histogram(
        out, "outbox_claim_duration_seconds",
        "Seconds from sending a claim (BEGIN, the claim statement) to its rows arriving, empty "
        "claims included; a claim sent behind the last batch's marks and COMMIT, in one round "
        "trip, counts their time too. Claims that grow slower while the backlog does not are "
        "walking dead row versions an old snapshot keeps from vacuum: see "
        "outbox_vacuum_horizon_held_seconds.",
        &m.claims, claim_bounds, N_OF(claim_bounds));
}

void metrics_render(StrBuf *out, const MetricsLive *live)
{
    header(out, "outbox_build_info", "gauge", "Always 1; the version label tells the build.");
    printf_to(out, "outbox_build_info{version=\"%s\"} 1\n", OUTBOX_RELAY_VERSION);

    render_published(out);
    header(out, "outbox_failures_total", "counter",
           "Failed delivery attempts of events and dead-letter copies, by class: transient "
           "(broker down, timeouts; retried soon) or permanent (rejected, too large, illegal "
           "topic; retried with backoff, then dead-lettered).");
    printf_to(out, "outbox_failures_total{class=\"transient\"} %llu\n", m.failures[0]);
    printf_to(out, "outbox_failures_total{class=\"permanent\"} %llu\n", m.failures[1]);
    header(out, "outbox_events_dead_lettered_total", "counter",
           "Events this relay dead-lettered after --max-attempts rejections.");
    printf_to(out, "outbox_events_dead_lettered_total %llu\n", m.dead_lettered);
    header(out, "outbox_batches_total", "counter",
           "Claim transactions that delivered or recorded rows and committed.");
    printf_to(out, "outbox_batches_total %llu\n", m.batches);
    header(out, "outbox_retention_deleted_rows_total", "counter",
           "Sent rows deleted by this relay because they were older than --retention.");
    printf_to(out, "outbox_retention_deleted_rows_total %llu\n", m.retention_deleted);
    render_latency(out);

    if (m.backlog_known) {
        gauge_int(out, "outbox_backlog_rows",
                  "Unsent events that are not dead-lettered (waiting for a retry included), as of "
                  "the last refresh (every 5 s).",
                  m.backlog);
        gauge_seconds(out, "outbox_oldest_unsent_age_seconds",
                      "Age (now() - created_at, database clock) of the oldest unsent event that "
                      "is not dead-lettered, as of the last refresh; 0 when there is none.",
                      m.oldest_age_s);
        gauge_int(out, "outbox_dead_letter_rows",
                  "Dead-lettered events in the outbox (kept until requeued or purged), as of the "
                  "last refresh.",
                  m.dead_rows);
        gauge_int(out, "outbox_backlog_refresh_timestamp_seconds",
                  "Unix time of the last successful refresh of the backlog gauges.",
                  (long long)m.backlog_refreshed);
    }

    if (m.squatters_known)
        gauge_int(out, "outbox_lane_squatters",
                  "Sessions that are not relays holding the lane group's advisory locks (the "
                  "aggregates of their lanes wait for them); the relay is not ready while any do.",
                  m.squatters);
    if (m.horizon_known) {
        gauge_int(out, "outbox_vacuum_horizon_age_xids",
                  "Age in transactions of the oldest snapshot that keeps vacuum from removing dead "
                  "rows (a long transaction, a replication slot, a prepared transaction); claims "
                  "slow down while it grows. 0 when none.",
                  m.horizon_xids);
        gauge_seconds(out, "outbox_vacuum_horizon_held_seconds",
                      "How long the holder of that snapshot has been in its transaction; 0 when "
                      "not known (a replication slot) or none.",
                      m.horizon_held_s);
    }

    header(out, "outbox_postgres_up", "gauge",
           "1 while every PostgreSQL connection of the relay is up, else 0 (it keeps "
           "reconnecting).");
    printf_to(out, "outbox_postgres_up %d\n", live->postgres_up ? 1 : 0);
    header(out, "outbox_kafka_up", "gauge",
           "1 while a Kafka broker is reachable (a connection up in the last statistics, or an "
           "acknowledgement since all brokers were last reported down), else 0.");
    printf_to(out, "outbox_kafka_up %d\n", live->kafka_up ? 1 : 0);
    header(out, "outbox_schema_registry_up", "gauge",
           "1 while the Schema Registry answers (always 1 without --value-format avro or "
           "json-schema), else 0: rows wait for it, no attempt counted.");
    printf_to(out, "outbox_schema_registry_up %d\n", live->registry_up ? 1 : 0);
    header(out, "outbox_lanes_owned", "gauge", "Lanes (of 64) this relay owns and claims from.");
    printf_to(out, "outbox_lanes_owned %d\n", live->lanes_owned);
    header(out, "outbox_relay_sessions", "gauge",
           "Live claim sessions of all relays on this outbox (lane group members: --min-sessions "
           "to --sessions per relay) seen at the last lane rebalance, this relay's included.");
    printf_to(out, "outbox_relay_sessions %d\n", live->live_sessions);
    header(out, "outbox_claim_sessions", "gauge",
           "This relay's sessions that claim now: --min-sessions, and up to --sessions while "
           "claims come back full (until --session-rest-after without one).");
    printf_to(out, "outbox_claim_sessions %d\n", live->claim_sessions);
}
