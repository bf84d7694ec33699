/*
 * produce: writes chosen messages to Kafka for tests, headers included.
 *
 *   produce --brokers B --topic T < messages.jsonl
 *
 * Each stdin line is one JSON object:
 *   {"key": K, "value": V, "headers": [[NAME, VALUE], ...], "partition": P}
 * where K and V are strings (sent as their bytes; \u0000 is a NUL byte) or null/absent (no key,
 * a null value), headers may repeat names (an object {NAME: VALUE} works too), and partition is
 * optional (default: by key, as any producer would). Messages go out in input order
 * (acks=all, idempotent), and the program waits for every delivery report.
 * Output: "produced N" on stdout. Exit: 0 when every message was acknowledged, 1 otherwise,
 * 2 on bad flags or a malformed input line.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

static long delivered, failed;

static void usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "produce: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk, (void)opaque;
    if (m->err) {
        failed++;
        fprintf(stderr, "produce: delivery failed: %s\n", rd_kafka_err2str(m->err));
    } else {
        delivered++;
    }
}

static bool add_header(rd_kafka_headers_t *hdrs, const char *name, json_t *value)
{
    if (json_is_null(value))
        return rd_kafka_header_add(hdrs, name, -1, NULL, 0) == RD_KAFKA_RESP_ERR_NO_ERROR;
    if (!json_is_string(value))
        return false;
    return rd_kafka_header_add(hdrs, name, -1, json_string_value(value),
                               json_string_length(value)) == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* Builds the headers of one line; NULL when "headers" has the wrong shape. */
static rd_kafka_headers_t *parse_headers(json_t *h)
{
    rd_kafka_headers_t *hdrs = rd_kafka_headers_new(8);
    size_t i;
    json_t *pair;
    const char *name;
    json_t *value;
    if (!h || json_is_null(h))
        return hdrs;
    if (json_is_array(h)) {
        json_array_foreach(h, i, pair)
        {
            if (!json_is_array(pair) || json_array_size(pair) != 2 ||
                !json_is_string(json_array_get(pair, 0)) ||
                !add_header(hdrs, json_string_value(json_array_get(pair, 0)),
                            json_array_get(pair, 1)))
                goto bad;
        }
        return hdrs;
    }
    if (json_is_object(h)) {
        json_object_foreach(h, name, value)
        {
            if (!add_header(hdrs, name, value))
                goto bad;
        }
        return hdrs;
    }
bad:
    rd_kafka_headers_destroy(hdrs);
    return NULL;
}

/* A string or null/absent field: its bytes, or NULL. False for other types. */
static bool bytes_field(json_t *o, const char *name, const char **p, size_t *len)
{
    json_t *v = json_object_get(o, name);
    *p = NULL;
    *len = 0;
    if (!v || json_is_null(v))
        return true;
    if (!json_is_string(v))
        return false;
    *p = json_string_value(v);
    *len = json_string_length(v);
    return true;
}

int main(int argc, char **argv)
{
    const char *brokers = NULL, *topic = NULL;
    static const struct option opts[] = {{"brokers", required_argument, NULL, 'b'},
                                         {"topic", required_argument, NULL, 't'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'b')
            brokers = optarg;
        else if (c == 't')
            topic = optarg;
        else
            usage_error("unknown or incomplete option", argv[optind - 1]);
    }
    if (optind < argc)
        usage_error("unexpected argument", argv[optind]);
    if (!brokers || !topic)
        usage_error("--brokers and --topic are required", NULL);

    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "enable.idempotence", "true", errstr, sizeof(errstr)) ||
        rd_kafka_conf_set(conf, "message.timeout.ms", "10000", errstr, sizeof(errstr)))
        usage_error(errstr, NULL);
    rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!rk)
        usage_error(errstr, NULL);

    char *line = NULL;
    size_t cap = 0;
    long lineno = 0, sent = 0;
    while (getline(&line, &cap, stdin) > 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line))
            continue;
        json_error_t jerr;
        json_t *o = json_loads(line, JSON_ALLOW_NUL, &jerr); /* \u0000: a NUL byte */
        const char *key, *value;
        size_t key_len, value_len;
        rd_kafka_headers_t *hdrs = NULL;
        json_t *part = json_object_get(o, "partition");
        if (!json_is_object(o) || (part && !json_is_integer(part)) ||
            !bytes_field(o, "key", &key, &key_len) ||
            !bytes_field(o, "value", &value, &value_len) ||
            !(hdrs = parse_headers(json_object_get(o, "headers")))) {
            fprintf(
                stderr,
                "produce: line %ld: expected {\"key\", \"value\", \"headers\", \"partition\"}\n",
                lineno);
            exit(2);
        }
        rd_kafka_resp_err_t err;
        do {
            int32_t partition = part ? (int32_t)json_integer_value(part) : RD_KAFKA_PARTITION_UA;
            err = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
                RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE((void *)value, value_len),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_END);
            if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(rk, 100);
        } while (err == RD_KAFKA_RESP_ERR__QUEUE_FULL);
        if (err) {
            rd_kafka_headers_destroy(hdrs);
            fprintf(stderr, "produce: line %ld: %s\n", lineno, rd_kafka_err2str(err));
            failed++;
        } else {
            sent++;
        }
        json_decref(o);
        rd_kafka_poll(rk, 0);
    }
    free(line);
    rd_kafka_flush(rk, 30000);
    rd_kafka_destroy(rk);
    printf("produced %ld\n", delivered);
    return failed == 0 && delivered == sent ? 0 : 1;
}
