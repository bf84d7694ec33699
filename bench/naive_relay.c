/*
 * naive-relay: the benchmark's baseline, the seed's relay loop written the obvious way, with
 * blocking libpq and librdkafka and no event loop.
 *
 *   naive-relay --database-url URL --brokers LIST [--batch-size N] [--kafka KEY=VALUE]...
 *
 * Loop until SIGTERM/SIGINT:
 *   BEGIN; SELECT up to --batch-size (100) unsent rows in id order FOR UPDATE SKIP LOCKED;
 *   for each row: produce it (topic outbox.event.{aggregate_type}, key aggregate_id, value
 *   payload, headers: the row's own, then id, event_type, aggregate_type), then
 *   UPDATE outbox SET sent_at = now() WHERE id = $1 (one statement and round trip per row);
 *   flush the producer (wait for every acknowledgement); COMMIT, or ROLLBACK when a delivery
 *   failed; sleep 1 s when a batch comes back empty (or failed).
 *
 * Statements are prepared once, and the producer has the relay's guarantees (idempotent,
 * acks=all), so the baseline is naive in its shape only, not handicapped. It does not reconnect:
 * a lost connection ends it with status 1. On exit it prints "naive-relay: sent N" on stderr.
 * Exit: 0 after a signal, 1 on a runtime failure, 2 on bad flags.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#define MAX_PROPS 32
#define FLUSH_TIMEOUT_MS 30000
#define IDLE_SLEEP_S 1

static volatile sig_atomic_t run = 1;

static void on_signal(int sig)
{
    (void)sig;
    run = 0;
}

static void usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "naive-relay: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

/* Delivery reports of the current batch: how many failed, and the first reason. */
static long failed;
static char first_error[256];

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk, (void)opaque;
    if (m->err && failed++ == 0)
        snprintf(first_error, sizeof(first_error), "%s", rd_kafka_err2str(m->err));
}

/* Runs a statement without parameters; false (and a message) unless it returned `want`. */
static bool exec_ok(PGconn *pg, const char *sql, ExecStatusType want)
{
    PGresult *res = PQexec(pg, sql);
    bool ok = PQresultStatus(res) == want;
    if (!ok)
        fprintf(stderr, "naive-relay: %s: %s", sql, PQerrorMessage(pg));
    PQclear(res);
    return ok;
}

static bool prepare(PGconn *pg, const char *name, const char *sql, int nparams)
{
    PGresult *res = PQprepare(pg, name, sql, nparams, NULL);
    bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "naive-relay: prepare %s: %s", name, PQerrorMessage(pg));
    PQclear(res);
    return ok;
}

/* The row's own headers (a JSON object; strings as they are, other values as compact JSON),
 * then id, event_type and aggregate_type, as the relay sends them. NULL on malformed headers. */
static rd_kafka_headers_t *build_headers(PGresult *res, int i)
{
    rd_kafka_headers_t *hdrs = rd_kafka_headers_new(8);
    if (!PQgetisnull(res, i, 6)) {
        json_t *obj = json_loads(PQgetvalue(res, i, 6), 0, NULL);
        if (!json_is_object(obj)) {
            json_decref(obj);
            rd_kafka_headers_destroy(hdrs);
            return NULL;
        }
        const char *name;
        json_t *val;
        json_object_foreach(obj, name, val)
        {
            if (!strcmp(name, "id") || !strcmp(name, "event_type") ||
                !strcmp(name, "aggregate_type"))
                continue;
            if (json_is_string(val)) {
                rd_kafka_header_add(hdrs, name, -1, json_string_value(val),
                                    (ssize_t)json_string_length(val));
            } else {
                char *text = json_dumps(val, JSON_COMPACT | JSON_ENCODE_ANY);
                rd_kafka_header_add(hdrs, name, -1, text ? text : "", -1);
                free(text);
            }
        }
        json_decref(obj);
    }
    rd_kafka_header_add(hdrs, "id", -1, PQgetvalue(res, i, 1), -1);
    rd_kafka_header_add(hdrs, "event_type", -1, PQgetvalue(res, i, 4), -1);
    rd_kafka_header_add(hdrs, "aggregate_type", -1, PQgetvalue(res, i, 2), -1);
    return hdrs;
}

/* Produces row i of the claim; retries while the local queue is full. */
static bool produce_row(rd_kafka_t *rk, PGresult *res, int i)
{
    char topic[300];
    snprintf(topic, sizeof(topic), "outbox.event.%s", PQgetvalue(res, i, 2));
    rd_kafka_headers_t *hdrs = build_headers(res, i);
    if (!hdrs) {
        fprintf(stderr, "naive-relay: row %s: malformed headers\n", PQgetvalue(res, i, 0));
        return false;
    }
    const char *key = PQgetvalue(res, i, 3);
    bool null_payload = PQgetisnull(res, i, 5);
    for (;;) {
        rd_kafka_resp_err_t err = rd_kafka_producev(
            rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
            RD_KAFKA_V_VALUE(null_payload ? NULL : PQgetvalue(res, i, 5),
                             null_payload ? 0 : (size_t)PQgetlength(res, i, 5)),
            RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
            return true; /* the producer owns hdrs now */
        if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            fprintf(stderr, "naive-relay: produce row %s: %s\n", PQgetvalue(res, i, 0),
                    rd_kafka_err2str(err));
            rd_kafka_headers_destroy(hdrs);
            return false;
        }
        rd_kafka_poll(rk, 100);
    }
}

/* One claim-produce-mark-commit cycle. Returns the rows committed as sent, 0 when there was
 * nothing to send or the batch failed (and was rolled back), -1 on a database error. */
static long relay_batch(PGconn *pg, rd_kafka_t *rk, const char *limit)
{
    if (!exec_ok(pg, "BEGIN", PGRES_COMMAND_OK))
        return -1;
    const char *claim_params[1] = {limit};
    PGresult *rows = PQexecPrepared(pg, "claim", 1, claim_params, NULL, NULL, 0);
    if (PQresultStatus(rows) != PGRES_TUPLES_OK) {
        fprintf(stderr, "naive-relay: claim: %s", PQerrorMessage(pg));
        PQclear(rows);
        return -1;
    }
    int n = PQntuples(rows);
    failed = 0;
    bool ok = true;
    for (int i = 0; i < n; i++) {
        if (!produce_row(rk, rows, i)) {
            ok = false;
            break;
        }
        const char *mark_params[1] = {PQgetvalue(rows, i, 0)};
        PGresult *res = PQexecPrepared(pg, "mark", 1, mark_params, NULL, NULL, 0);
        bool marked = PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!marked)
            fprintf(stderr, "naive-relay: mark: %s", PQerrorMessage(pg));
        PQclear(res);
        if (!marked) {
            PQclear(rows);
            return -1;
        }
    }
    PQclear(rows);
    if (n > 0 && rd_kafka_flush(rk, FLUSH_TIMEOUT_MS) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "naive-relay: not acknowledged within %d ms\n", FLUSH_TIMEOUT_MS);
        ok = false;
    }
    if (failed > 0) {
        fprintf(stderr, "naive-relay: %ld deliveries failed: %s\n", failed, first_error);
        ok = false;
    }
    if (!ok) {
        /* Unacknowledged messages must not stay queued into the next batch. */
        rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_flush(rk, 1000);
        return exec_ok(pg, "ROLLBACK", PGRES_COMMAND_OK) ? 0 : -1;
    }
    return exec_ok(pg, "COMMIT", PGRES_COMMAND_OK) ? n : -1;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"database-url", required_argument, NULL, 'd'},
        {"brokers", required_argument, NULL, 'b'},
        {"batch-size", required_argument, NULL, 'n'},
        {"kafka", required_argument, NULL, 'k'},
        {NULL, 0, NULL, 0},
    };
    const char *url = NULL, *brokers = NULL, *limit = "100";
    char *props[MAX_PROPS];
    int nprops = 0, c;

    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd':
            url = optarg;
            break;
        case 'b':
            brokers = optarg;
            break;
        case 'n': {
            char *end;
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || v < 1 || v > 100000)
                usage_error("--batch-size must be an integer 1..100000", optarg);
            limit = optarg;
            break;
        }
        case 'k':
            if (nprops == MAX_PROPS)
                usage_error("too many --kafka flags", NULL);
            if (!strchr(optarg, '=') || optarg[0] == '=')
                usage_error("--kafka must be KEY=VALUE", optarg);
            props[nprops++] = optarg;
            break;
        default:
            usage_error("unknown or incomplete option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        usage_error("unexpected argument", argv[optind]);
    if (!url || !brokers)
        usage_error("--database-url and --brokers are required", NULL);

    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *settings[][2] = {
        {"bootstrap.servers", brokers},
        {"enable.idempotence", "true"}, /* acks=all, in order per partition, as the relay */
        {"client.id", "naive-relay"},
    };
    for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
        if (rd_kafka_conf_set(conf, settings[i][0], settings[i][1], errstr, sizeof(errstr)))
            usage_error(settings[i][0], errstr);
    for (int i = 0; i < nprops; i++) {
        char *eq = strchr(props[i], '=');
        *eq = '\0';
        if (rd_kafka_conf_set(conf, props[i], eq + 1, errstr, sizeof(errstr)))
            usage_error(props[i], errstr);
    }
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);

    /* No SA_RESTART: a signal cuts the idle sleep short. librdkafka's threads inherit the mask
     * in force at rd_kafka_new, so the signals are blocked there and reach this thread only. */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    pthread_sigmask(SIG_UNBLOCK, &block, NULL);
    if (!rk) {
        fprintf(stderr, "naive-relay: %s\n", errstr);
        return 1;
    }
    PGconn *pg = PQconnectdb(url);
    int rc = 1;
    long sent = 0;
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "naive-relay: connect: %s", PQerrorMessage(pg));
        goto done;
    }
    if (!prepare(pg, "claim",
                 "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload::text,"
                 " headers::text FROM outbox WHERE sent_at IS NULL"
                 " ORDER BY id LIMIT $1::int FOR UPDATE SKIP LOCKED",
                 1) ||
        !prepare(pg, "mark", "UPDATE outbox SET sent_at = now() WHERE id = $1::bigint", 1))
        goto done;

    while (run) {
        long n = relay_batch(pg, rk, limit);
        if (n < 0)
            goto done;
        sent += n;
        if (n == 0 && run) {
            struct timespec idle = {IDLE_SLEEP_S, 0};
            nanosleep(&idle, NULL);
        }
    }
    rc = 0;
done:
    fprintf(stderr, "naive-relay: sent %ld\n", sent);
    PQfinish(pg);
    rd_kafka_flush(rk, 1000);
    rd_kafka_destroy(rk);
    return rc;
}
