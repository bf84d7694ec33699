/* Unit tests for metrics.c (counters, histogram, gauges, the text format) and for the two small
 * parsers behind the ops endpoints: kafka_stats (broker states) and addr_parse_host_port. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "http.h"
#include "kafka_stats.h"
#include "metrics.h"
#include "upkeep.h"

static int reset(void **state)
{
    metrics_reset();
    return 0;
}

/* Renders with the given live state; caller frees. */
static char *render(MetricsLive live)
{
    StrBuf out = {0};
    metrics_render(&out, &live);
    return out.s;
}

static void assert_line(const char *text, const char *line)
{
    char want[512];
    snprintf(want, sizeof(want), "\n%s\n", line);
    if (!strstr(text, want))
        fail_msg("no line \"%s\" in:\n%s", line, text);
}

static void test_counters(void **state)
{
    metrics_event_published("outbox.event.order", 0.2);
    metrics_event_published("outbox.event.order", -1); /* latency unknown: counted, not observed */
    metrics_event_published("outbox.event.invoice", 3.0);
    metrics_failure(false);
    metrics_failure(true);
    metrics_failure(true);
    metrics_dead_lettered();
    metrics_batch_committed();
    metrics_batch_committed();
    metrics_retention_deleted(1000);
    metrics_retention_deleted(-5); /* ignored */
    char *t = render((MetricsLive){.postgres_up = true,
                                   .lanes_owned = 32,
                                   .live_sessions = 2,
                                   .claim_sessions = 1,
                                   .held_aggregate_types = 3,
                                   .kafka_away = 2});
    assert_line(t, "outbox_events_published_total{topic=\"outbox.event.order\"} 2");
    assert_line(t, "outbox_events_published_total{topic=\"outbox.event.invoice\"} 1");
    assert_line(t, "outbox_failures_total{class=\"transient\"} 1");
    assert_line(t, "outbox_failures_total{class=\"permanent\"} 2");
    assert_line(t, "outbox_events_dead_lettered_total 1");
    assert_line(t, "outbox_batches_total 2");
    assert_line(t, "outbox_retention_deleted_rows_total 1000");
    assert_line(t, "outbox_postgres_up 1");
    assert_line(t, "outbox_kafka_up 0");
    assert_line(t, "outbox_schema_registry_up 0");
    assert_line(t, "outbox_lanes_owned 32");
    assert_line(t, "outbox_relay_sessions 2");
    assert_line(t, "outbox_claim_sessions 1");
    assert_line(t, "outbox_held_aggregate_types 3");
    assert_line(t, "outbox_kafka_away 2"); /* trying Kafka again */
    assert_line(t, "outbox_ready 0");
    assert_line(t, "# TYPE outbox_events_published_total counter");
    /* topics sorted by name */
    assert_true(strstr(t, "outbox.event.invoice") < strstr(t, "outbox.event.order"));
    free(t);
}

static void test_histogram(void **state)
{
    metrics_event_published("t", 0.004);  /* le 0.005 */
    metrics_event_published("t", 0.005);  /* le 0.005: bounds are inclusive */
    metrics_event_published("t", 0.3);    /* le 0.5 */
    metrics_event_published("t", 7200.0); /* beyond the last bound: +Inf only */
    char *t = render((MetricsLive){0});
    assert_line(t, "# TYPE outbox_created_to_ack_seconds histogram");
    assert_line(t, "outbox_created_to_ack_seconds_bucket{le=\"0.005\"} 2");
    assert_line(t, "outbox_created_to_ack_seconds_bucket{le=\"0.25\"} 2");
    assert_line(t, "outbox_created_to_ack_seconds_bucket{le=\"0.5\"} 3");
    assert_line(t, "outbox_created_to_ack_seconds_bucket{le=\"3600\"} 3");
    assert_line(t, "outbox_created_to_ack_seconds_bucket{le=\"+Inf\"} 4");
    assert_line(t, "outbox_created_to_ack_seconds_count 4");
    assert_line(t, "outbox_created_to_ack_seconds_sum 7200.309000");
    free(t);
}

static void test_backlog_gauges(void **state)
{
    char *t = render((MetricsLive){0});
    assert_null(strstr(t, "outbox_backlog_rows")); /* not before the first refresh */
    free(t);
    metrics_set_backlog(40, 3, 2, 12.5);
    t = render((MetricsLive){0});
    assert_line(t, "outbox_backlog_rows 40");
    assert_line(t, "outbox_dead_letter_rows 3");
    assert_line(t, "outbox_dead_letter_unpublished_rows 2");
    assert_line(t, "outbox_oldest_unsent_age_seconds 12.500");
    free(t);
    metrics_set_backlog(0, 0, 0, -1);
    t = render((MetricsLive){0});
    assert_line(t, "outbox_oldest_unsent_age_seconds 0.000");
    assert_line(t, "outbox_dead_letter_unpublished_rows 0");
    assert_null(strstr(t, "outbox_backlog_refresh_interval_seconds ")); /* no count paced yet */
    free(t);
    metrics_set_backlog_pace(275.5); /* a count of 27.55 s */
    t = render((MetricsLive){0});
    assert_line(t, "outbox_backlog_refresh_interval_seconds 275.500");
    free(t);
}

static void test_topic_cap(void **state)
{
    char topic[32];
    for (int i = 0; i < METRICS_MAX_TOPICS + 5; i++) {
        snprintf(topic, sizeof(topic), "topic-%04d", i);
        metrics_event_published(topic, -1);
        metrics_event_published(topic, -1);
    }
    char *t = render((MetricsLive){0});
    assert_line(t, "outbox_events_published_total{topic=\"topic-0000\"} 2");
    assert_line(t, "outbox_events_published_total{topic=\"topic-0999\"} 2");
    assert_null(strstr(t, "topic-1000"));
    assert_line(t, "outbox_events_published_total{topic=\"_other\"} 10");
    free(t);
}

static void test_label_escaping(void **state)
{
    metrics_event_published("a\"b\\c\nd", -1);
    char *t = render((MetricsLive){0});
    assert_line(t, "outbox_events_published_total{topic=\"a\\\"b\\\\c\\nd\"} 1");
    free(t);
}

static void test_claim_duration(void **state)
{
    metrics_claim_done(0.0007); /* a healthy claim */
    metrics_claim_done(0.3);    /* one walking dead versions */
    metrics_claim_done(-1);     /* a clock step: not counted */
    char *t = render((MetricsLive){0});
    assert_line(t, "# TYPE outbox_claim_duration_seconds histogram");
    assert_line(t, "outbox_claim_duration_seconds_bucket{le=\"0.0005\"} 0");
    assert_line(t, "outbox_claim_duration_seconds_bucket{le=\"0.001\"} 1");
    assert_line(t, "outbox_claim_duration_seconds_bucket{le=\"0.25\"} 1");
    assert_line(t, "outbox_claim_duration_seconds_bucket{le=\"0.5\"} 2");
    assert_line(t, "outbox_claim_duration_seconds_bucket{le=\"+Inf\"} 2");
    assert_line(t, "outbox_claim_duration_seconds_count 2");
    assert_line(t, "outbox_claim_duration_seconds_sum 0.300700");
    free(t);
}

static void test_row_acked(void **state)
{
    Batch b;
    assert_true(batch_init(&b, 4));
    BatchRow *br = &b.rows[0];
    br->row.aggregate_type = "order";
    br->row.aggregate_id = "o-1";
    br->row.event_type = "Created";
    br->age_s = 1.5;           /* 1.5 s old when claimed */
    char topic[] = "ev.order"; /* the topic it was produced to */
    br->topic = topic;
    b.claimed_at = 100.0;
    metrics_row_acked(&b, br, 100.25); /* acked 0.25 s later */
    br->dead_letter = true;            /* a dead-letter copy is not an event published */
    metrics_row_acked(&b, br, 100.5);
    char *t = render((MetricsLive){0});
    assert_line(t, "outbox_events_published_total{topic=\"ev.order\"} 1");
    assert_line(t, "outbox_created_to_ack_seconds_sum 1.750000");
    assert_line(t, "outbox_created_to_ack_seconds_bucket{le=\"2.5\"} 1");
    free(t);
    br->topic = NULL; /* not the batch's to free */
    batch_free(&b);
}

static void test_every_sample_has_help_and_type(void **state)
{
    metrics_event_published("t", 1);
    metrics_set_backlog(1, 1, 1, 1);
    char *t = render((MetricsLive){
        .postgres_up = true, .kafka_up = true, .lanes_owned = 64, .live_sessions = 1});
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        char name[128];
        assert_int_equal(sscanf(line, "%127[a-z_]", name), 1);
        assert_true(strncmp(name, "outbox_", 7) == 0);
        char *suffix = strstr(name, "_bucket");
        if (!suffix)
            suffix = strstr(name, "_sum");
        if (!suffix)
            suffix = strstr(name, "_count");
        /* HELP and TYPE lines come earlier in the text; search a fresh render */
        char *all = render((MetricsLive){
            .postgres_up = true, .kafka_up = true, .lanes_owned = 64, .live_sessions = 1});
        if (suffix) { /* a histogram's series are described under its base name */
            char histogram[200];
            snprintf(histogram, sizeof(histogram), "# TYPE %.*s histogram\n", (int)(suffix - name),
                     name);
            if (strstr(all, histogram))
                *suffix = '\0';
        }
        char help[160], type[160];
        snprintf(help, sizeof(help), "# HELP %s ", name);
        snprintf(type, sizeof(type), "# TYPE %s ", name);
        if (!strstr(all, help) || !strstr(all, type))
            fail_msg("%s lacks HELP or TYPE", name);
        free(all);
    }
    free(t);
}

/* ---- kafka_stats ---------------------------------------------------------------------------- */

static void test_kafka_stats(void **state)
{
    const char *up = "{\"name\":\"p\",\"brokers\":{"
                     "\"h:1/1\":{\"nodeid\":1,\"state\":\"INIT\"},"
                     "\"h:2/2\":{\"nodeid\":2,\"state\":\"UP\"}}}";
    const char *down = "{\"brokers\":{\"h:1/1\":{\"state\":\"CONNECT\"},"
                       "\"h:2/2\":{\"state\":\"DOWN\"}}}";
    assert_int_equal(kafka_stats_brokers_up(up, strlen(up)), 1);
    assert_int_equal(kafka_stats_brokers_up(down, strlen(down)), 0);
    assert_int_equal(kafka_stats_brokers_up("{\"brokers\":{}}", 14), 0);
    assert_int_equal(kafka_stats_brokers_up("{}", 2), -1);
    assert_int_equal(kafka_stats_brokers_up("not json", 8), -1);
}

/* ---- addr_parse_host_port ----------------------------------------------------------------------
 */

static void test_parse_listen(void **state)
{
    char host[64], err[256];
    unsigned port;
    assert_true(addr_parse_host_port("--metrics-listen", "127.0.0.1:9187", host, sizeof(host),
                                     &port, err, sizeof(err)));
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9187);
    assert_true(addr_parse_host_port("--metrics-listen", "[::1]:0", host, sizeof(host), &port, err,
                                     sizeof(err)));
    assert_string_equal(host, "::1");
    assert_int_equal(port, 0);
    assert_true(addr_parse_host_port("--metrics-listen", "localhost:80", host, sizeof(host), &port,
                                     err, sizeof(err)));
    const char *bad[] = {"",
                         "9187",
                         ":9187",
                         "127.0.0.1:",
                         "127.0.0.1:65536",
                         "127.0.0.1:-1",
                         "127.0.0.1:http",
                         "::1:9187",
                         "[::1]9187",
                         "[::1",
                         "h:+80",
                         "h:80x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        if (addr_parse_host_port("--metrics-listen", bad[i], host, sizeof(host), &port, err,
                                 sizeof(err)))
            fail_msg("\"%s\" accepted", bad[i]);
        assert_non_null(strstr(err, "--metrics-listen"));
    }
}

/* ---- upkeep_retention_interval ------------------------------------------------------------- */

static void test_retention_interval(void **state)
{
    assert_true(upkeep_retention_interval(3) == 1.0);          /* at least 1 s */
    assert_true(upkeep_retention_interval(120) == 30.0);       /* a quarter */
    assert_true(upkeep_retention_interval(72 * 3600) == 60.0); /* at most a minute */
}

/* ---- several databases ------------------------------------------------------------------- */

/* Each database counts into its own registry (metrics_select); rendered together, every sample
 * carries database="NAME" first, each metric's HELP comes once, and outbox_database_ready says
 * which are ready. */
static void test_databases(void **state)
{
    MetricsDb *a = metrics_db_new("a"), *b = metrics_db_new("b-2");
    assert_non_null(a);
    assert_non_null(b);
    metrics_select(a);
    assert_ptr_equal(metrics_selected(), a);
    metrics_event_published("t.x", 0.001);
    metrics_batch_committed();
    metrics_select(b);
    metrics_failure(true);
    metrics_set_backlog(7, 0, 0, 1.5);
    metrics_select(NULL);
    assert_null(metrics_selected());
    metrics_batch_committed(); /* the process's own registry: not rendered below */
    MetricsDb *dbs[2] = {a, b};
    MetricsLive lives[2] = {{.postgres_up = true,
                             .kafka_up = true,
                             .registry_up = true,
                             .lanes_owned = 64,
                             .live_sessions = 1,
                             .claim_sessions = 1,
                             .held_aggregate_types = 2,
                             .ready = true},
                            {.kafka_up = true, .registry_up = true, .kafka_away = 1}};
    StrBuf out = {0};
    metrics_render_databases(&out, dbs, lives, 2);
    const char *t = out.s;
    assert_line(t, "outbox_events_published_total{database=\"a\",topic=\"t.x\"} 1");
    assert_line(t, "outbox_batches_total{database=\"a\"} 1");
    assert_line(t, "outbox_batches_total{database=\"b-2\"} 0");
    assert_line(t, "outbox_failures_total{database=\"b-2\",class=\"permanent\"} 1");
    assert_line(t, "outbox_backlog_rows{database=\"b-2\"} 7");
    assert_null(strstr(t, "outbox_backlog_rows{database=\"a\"}")); /* a's not refreshed yet */
    assert_line(t, "outbox_created_to_ack_seconds_count{database=\"a\"} 1");
    assert_line(t, "outbox_created_to_ack_seconds_bucket{database=\"a\",le=\"0.005\"} 1");
    assert_line(t, "outbox_lanes_owned{database=\"a\"} 64");
    assert_line(t, "outbox_postgres_up{database=\"b-2\"} 0");
    assert_line(t, "outbox_held_aggregate_types{database=\"a\"} 2");
    assert_line(t, "outbox_held_aggregate_types{database=\"b-2\"} 0");
    assert_line(t, "outbox_kafka_away{database=\"a\"} 0");
    assert_line(t, "outbox_kafka_away{database=\"b-2\"} 1"); /* away: its lanes to its peers */
    assert_line(t, "outbox_database_ready{database=\"a\"} 1");
    assert_line(t, "outbox_database_ready{database=\"b-2\"} 0");
    const char *help = strstr(t, "# HELP outbox_batches_total ");
    assert_non_null(help);
    assert_null(strstr(help + 1, "# HELP outbox_batches_total "));
    strbuf_free(&out);
    metrics_db_free(a);
    metrics_db_free(b);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, reset, reset)
    const struct CMUnitTest tests[] = {
        T(test_counters),           T(test_histogram),
        T(test_backlog_gauges),     T(test_topic_cap),
        T(test_label_escaping),     T(test_claim_duration),
        T(test_row_acked),          T(test_every_sample_has_help_and_type),
        T(test_kafka_stats),        T(test_parse_listen),
        T(test_retention_interval), T(test_databases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
