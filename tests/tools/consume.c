/*
 * consume: reads topics back from Kafka for tests, one JSON object per message on stdout (one
 * tab-separated line with --tsv).
 *
 *   consume --brokers B --topic T [--topic T2]... [--count N] [--timeout-ms MS] [--idle-ms MS]
 *           [--to-end] [--tsv HEADER] [--hex] [--kafka KEY=VALUE]...
 *
 * Assigns every partition of the topics from the beginning (no consumer group, nothing
 * committed), so it can be run any number of times and always sees the whole log.
 * --kafka sets a librdkafka consumer property after the defaults below (the benchmark sets
 * fetch.wait.max.ms=1 for low latency).
 * Output (without --tsv):
 * {"topic","partition","offset","key","value","headers":{name:value},"header_list":[[n,v]],
 * "timestamp_ms","received_us"}: the message's Kafka timestamp (the producer's CreateTime, ms;
 * -1 if none) and the CLOCK_REALTIME microsecond at which the consumer handed the message over
 * (for latency measurements on one machine).
 * --tsv HEADER prints instead one line of four tab-separated fields per message: received_us,
 * timestamp_ms, the value of header HEADER (the last one; empty if none) and the message value,
 * with every tab, newline and carriage return in the last two printed as a space. It is for the
 * benchmark's latency runs, where building each JSON object cost the consumer most of its CPU
 * (perf: jansson and malloc, 0.3 of a CPU at 10,000 messages/s) on the CPUs it shares with what
 * it measures.
 * --hex adds "value_hex": the value's bytes in hex (binary payloads, Schema Registry framing),
 * since "value" shows bytes that are not UTF-8 as '?'.
 * --to-end first asks each partition's leader for its end offset (high watermark), then reads
 * every partition up to that offset and stops: everything Kafka acknowledged before consume
 * started, duplicates included, with no idle-time guess. A message acknowledged later may be
 * printed too, or not. An empty partition is read to its end at once, and so is a topic the
 * cluster's metadata does not list (a topic no message was ever produced to; one line on stderr
 * says so): it is not waited for, where without --to-end a topic is looked for until the timeout.
 * Exit: 0 when --count messages were read, when --idle-ms passed without a new message, when
 * --to-end read every partition up to its end offset, or at the timeout without --count or
 * --to-end; 1 at the timeout with --count unmet or --to-end short of an end (or no end offset
 * known); 2 on bad flags.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#define MAX_TOPICS 32
#define MAX_PROPS 32

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "consume: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

static long parse_long(const char *s, long min, const char *flag)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min)
        usage_error(flag, s);
    return v;
}

/* A JSON string of raw bytes; bytes that are not valid UTF-8 become '?' so a line is never
 * lost (test payloads are UTF-8, so this only matters when something is already wrong). */
static json_t *bytes_json(const void *data, size_t len)
{
    if (!data)
        return json_null();
    json_t *s = json_stringn(data, len);
    if (s)
        return s;
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return json_null();
    for (size_t i = 0; i < len; i++) {
        unsigned char c = ((const unsigned char *)data)[i];
        copy[i] = c < 0x80 ? (char)c : '?';
    }
    s = json_stringn(copy, len);
    free(copy);
    return s ? s : json_null();
}

static int64_t realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static bool hex_values; /* --hex */

static json_t *hex_json(const void *data, size_t len)
{
    if (!data)
        return json_null();
    char *hex = malloc(len * 2 + 1);
    if (!hex)
        return json_null();
    for (size_t i = 0; i < len; i++)
        snprintf(hex + i * 2, 3, "%02x", ((const unsigned char *)data)[i]);
    hex[len * 2] = '\0';
    json_t *s = json_string(hex);
    free(hex);
    return s ? s : json_null();
}

static void print_message(const rd_kafka_message_t *m, int64_t received_us)
{
    json_t *headers = json_object(), *list = json_array();
    rd_kafka_headers_t *hdrs;
    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char *name;
        const void *val;
        size_t size;
        for (size_t i = 0; !rd_kafka_header_get_all(hdrs, i, &name, &val, &size); i++) {
            json_object_set_new(headers, name, bytes_json(val, size)); /* last one wins */
            json_array_append_new(list, json_pack("[so]", name, bytes_json(val, size)));
        }
    }
    json_t *obj = json_object();
    json_object_set_new(obj, "topic", json_string(rd_kafka_topic_name(m->rkt)));
    json_object_set_new(obj, "partition", json_integer(m->partition));
    json_object_set_new(obj, "offset", json_integer(m->offset));
    json_object_set_new(obj, "key", bytes_json(m->key, m->key_len));
    json_object_set_new(obj, "value", bytes_json(m->payload, m->len));
    if (hex_values)
        json_object_set_new(obj, "value_hex", hex_json(m->payload, m->len));
    json_object_set_new(obj, "headers", headers);
    json_object_set_new(obj, "header_list", list);
    json_object_set_new(obj, "timestamp_ms", json_integer(rd_kafka_message_timestamp(m, NULL)));
    json_object_set_new(obj, "received_us", json_integer(received_us));
    char *line = json_dumps(obj, JSON_COMPACT);
    if (line)
        puts(line);
    free(line);
    json_decref(obj);
}

/* Writes len bytes of s with tabs, newlines and carriage returns as spaces (--tsv fields). */
static void print_tsv_field(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        putchar(s[i] == '\t' || s[i] == '\n' || s[i] == '\r' ? ' ' : s[i]);
}

/* --tsv: received_us, timestamp_ms, header `header`'s value, the value. */
static void print_message_tsv(const rd_kafka_message_t *m, int64_t received_us, const char *header)
{
    rd_kafka_headers_t *hdrs;
    const void *hval = NULL;
    size_t hsize = 0;
    if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
        rd_kafka_header_get_last(hdrs, header, &hval, &hsize) != RD_KAFKA_RESP_ERR_NO_ERROR)
        hval = NULL;
    printf("%lld\t%lld\t", (long long)received_us, (long long)rd_kafka_message_timestamp(m, NULL));
    if (hval)
        print_tsv_field(hval, hsize);
    putchar('\t');
    if (m->payload)
        print_tsv_field(m->payload, m->len);
    putchar('\n');
}

/* --to-end: one partition, the offset it must be read up to, and whether it has been. */
struct part_end {
    const char *topic; /* owned by the partition list it was read from */
    int32_t partition;
    int64_t end; /* the high watermark read before any message */
    bool done;
};

/* The entry of `ends` for topic/partition, or NULL (a partition not assigned). */
static struct part_end *part_end_of(struct part_end *ends, int n, const char *topic,
                                    int32_t partition)
{
    for (int i = 0; i < n; i++)
        if (ends[i].partition == partition && !strcmp(ends[i].topic, topic))
            return &ends[i];
    return NULL;
}

/* Reads each partition's high watermark into `ends`, retrying each (a leader just elected, a
 * broker down for a moment) until `deadline`; false if one is still unknown then. An empty
 * partition (low == high) is done at once. Each query waits at most a second, so a dead broker
 * does not hold one query past the deadline by more than that. */
static bool read_ends(rd_kafka_t *rk, struct part_end *ends, int n, int64_t deadline)
{
    for (int i = 0; i < n; i++) {
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t err;
        while ((err = rd_kafka_query_watermark_offsets(rk, ends[i].topic, ends[i].partition, &lo,
                                                       &hi, 1000)) != RD_KAFKA_RESP_ERR_NO_ERROR) {
            if (now_ms() >= deadline) {
                fprintf(stderr, "consume: no end offset for %s [%d] before the timeout: %s\n",
                        ends[i].topic, (int)ends[i].partition, rd_kafka_err2str(err));
                return false;
            }
            rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100); /* serves errors meanwhile */
            if (m)
                rd_kafka_message_destroy(m);
        }
        ends[i].end = hi;
        ends[i].done = hi <= lo;
    }
    return true;
}

/* What one metadata lookup found of the topics. */
enum topics_found {
    TOPICS_ALL,       /* every topic, each with its partitions */
    TOPICS_MISSING,   /* the cluster answered, and lists some topics not at all (the rest: all) */
    TOPICS_NOT_READY, /* no answer, or a topic listed with an error or without partitions */
};

/* Fills `parts` with every partition of the topics found and says what was found; `missing`
 * gets how many the cluster's answer does not list. */
static enum topics_found find_partitions(rd_kafka_t *rk, const char **topics, int ntopics,
                                         rd_kafka_topic_partition_list_t *parts, int timeout_ms,
                                         int *missing)
{
    const struct rd_kafka_metadata *md;
    *missing = 0;
    /* all_topics=1 so the lookup itself never auto-creates a topic. */
    if (rd_kafka_metadata(rk, 1, NULL, &md, timeout_ms) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return TOPICS_NOT_READY;
    int found = 0;
    for (int t = 0; t < ntopics; t++) {
        bool listed = false;
        for (int i = 0; i < md->topic_cnt; i++) {
            const struct rd_kafka_metadata_topic *mt = &md->topics[i];
            if (strcmp(mt->topic, topics[t]))
                continue;
            listed = true;
            if (mt->err || mt->partition_cnt == 0)
                continue;
            found++;
            for (int p = 0; p < mt->partition_cnt; p++)
                rd_kafka_topic_partition_list_add(parts, mt->topic, mt->partitions[p].id)->offset =
                    RD_KAFKA_OFFSET_BEGINNING;
        }
        *missing += !listed;
    }
    rd_kafka_metadata_destroy(md);
    if (found == ntopics)
        return TOPICS_ALL;
    return found + *missing == ntopics ? TOPICS_MISSING : TOPICS_NOT_READY;
}

int main(int argc, char **argv)
{
    /* clang-format off */
    static const struct option opts[] = {
        {"brokers", required_argument, NULL, 'b'},
        {"topic", required_argument, NULL, 't'},
        {"count", required_argument, NULL, 'n'},
        {"timeout-ms", required_argument, NULL, 'T'},
        {"idle-ms", required_argument, NULL, 'i'},
        {"to-end", no_argument, NULL, 'e'},
        {"tsv", required_argument, NULL, 's'},
        {"hex", no_argument, NULL, 'x'},
        {"kafka", required_argument, NULL, 'k'},
        {NULL, 0, NULL, 0},
    };
    /* clang-format on */
    const char *brokers = NULL, *topics[MAX_TOPICS], *tsv_header = NULL;
    char *props[MAX_PROPS];
    int ntopics = 0, nprops = 0, c;
    long count = -1, timeout_ms = 10000, idle_ms = -1;
    bool to_end = false;

    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            brokers = optarg;
            break;
        case 't':
            if (ntopics == MAX_TOPICS)
                usage_error("too many --topic flags", NULL);
            topics[ntopics++] = optarg;
            break;
        case 'n':
            count = parse_long(optarg, 1, "--count must be a positive integer");
            break;
        case 'e':
            to_end = true;
            break;
        case 's':
            tsv_header = optarg;
            break;
        case 'T':
            timeout_ms = parse_long(optarg, 1, "--timeout-ms must be a positive integer");
            break;
        case 'i':
            idle_ms = parse_long(optarg, 1, "--idle-ms must be a positive integer");
            break;
        case 'k':
            if (nprops == MAX_PROPS)
                usage_error("too many --kafka flags", NULL);
            if (!strchr(optarg, '=') || optarg[0] == '=')
                usage_error("--kafka must be KEY=VALUE", optarg);
            props[nprops++] = optarg;
            break;
        case 'x':
            hex_values = true;
            break;
        default:
            usage_error("unknown or incomplete option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        usage_error("unexpected argument", argv[optind]);
    if (!brokers || ntopics == 0)
        usage_error("--brokers and at least one --topic are required", NULL);

    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *settings[][2] = {
        {"bootstrap.servers", brokers},
        {"group.id", "outbox-relay-tests-consume"}, /* never joined: we assign() */
        {"enable.auto.commit", "false"},
        {"enable.auto.offset.store", "false"},
        {"fetch.wait.max.ms", "100"}, /* keeps --idle-ms responsive */
        {"reconnect.backoff.max.ms", "500"},
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
    if (to_end && rd_kafka_conf_set(conf, "enable.partition.eof", "true", errstr, sizeof(errstr)))
        usage_error("enable.partition.eof", errstr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "consume: %s\n", errstr);
        return 1;
    }
    rd_kafka_poll_set_consumer(rk);

    int64_t deadline = now_ms() + timeout_ms;
    rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(16);
    /* A topic appears when its first message is produced, so retry until the deadline; but
     * with --to-end a topic the cluster does not list holds nothing Kafka acknowledged before
     * now, which is all --to-end reads: it is read as empty at once. (The mock cluster's
     * answers are current; a real cluster's broker may lag its controller for a moment.) */
    enum topics_found found;
    int missing = 0;
    while ((found = find_partitions(rk, topics, ntopics, parts, 1000, &missing)) != TOPICS_ALL &&
           !(to_end && found == TOPICS_MISSING) && now_ms() < deadline) {
        rd_kafka_topic_partition_list_destroy(parts);
        parts = rd_kafka_topic_partition_list_new(16);
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200); /* serves errors meanwhile */
        if (m)
            rd_kafka_message_destroy(m);
    }
    /* --to-end: every topic is either read below or known not to exist. */
    bool topics_known = found == TOPICS_ALL || (to_end && found == TOPICS_MISSING);
    if (to_end && found == TOPICS_MISSING)
        fprintf(stderr, "consume: %d of %d topics do not exist: read as empty\n", missing, ntopics);
    else if (parts->cnt == 0)
        fprintf(stderr, "consume: no partitions found for the given topic(s)\n");
    int partitions = parts->cnt;
    /* --to-end: the end offsets are read before the assignment, so that every message
     * acknowledged before consume started lies below them. */
    struct part_end *ends = calloc(partitions ? (size_t)partitions : 1, sizeof(*ends));
    if (!ends) {
        fprintf(stderr, "consume: out of memory\n");
        return 1;
    }
    for (int i = 0; i < partitions; i++) {
        ends[i].topic = parts->elems[i].topic;
        ends[i].partition = parts->elems[i].partition;
    }
    bool ends_known = to_end && topics_known && read_ends(rk, ends, partitions, deadline);
    int done = 0; /* --to-end: partitions read up to their end offset */
    for (int i = 0; i < partitions; i++)
        done += ends[i].done;
    rd_kafka_assign(rk, parts);

    long got = 0;
    int64_t last = now_ms();
    while ((count < 0 || got < count) && !(ends_known && done == partitions) &&
           !(to_end && !ends_known)) {
        int64_t now = now_ms();
        if (now >= deadline || (idle_ms > 0 && now - last >= idle_ms))
            break;
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        /* A message at end - 1 or the partition's end reached (an offset at or past the end
         * offset read first) completes its partition; each partition counts once, however
         * often librdkafka reports its end as more messages arrive. */
        struct part_end *pe = NULL;
        int64_t next = -1;
        if (!m->err) {
            if (tsv_header)
                print_message_tsv(m, realtime_us(), tsv_header);
            else
                print_message(m, realtime_us());
            got++;
            last = now_ms();
            next = m->offset + 1;
        } else if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            next = m->offset;
        } else {
            fprintf(stderr, "consume: %s\n", rd_kafka_message_errstr(m));
        }
        if (ends_known && next >= 0 && m->rkt)
            pe = part_end_of(ends, partitions, rd_kafka_topic_name(m->rkt), m->partition);
        if (pe && !pe->done && next >= pe->end) {
            pe->done = true;
            done++;
        }
        rd_kafka_message_destroy(m);
    }
    fflush(stdout);

    int rc = 0;
    if (count >= 0 && got < count) {
        fprintf(stderr, "consume: got %ld of %ld messages before the timeout\n", got, count);
        rc = 1;
    }
    if (to_end && (!ends_known || done < partitions)) {
        for (int i = 0; i < partitions && ends_known; i++)
            if (!ends[i].done)
                fprintf(stderr, "consume: %s [%d] not read up to its end offset %lld\n",
                        ends[i].topic, (int)ends[i].partition, (long long)ends[i].end);
        fprintf(stderr, "consume: %d of %d partitions read to their end before the timeout\n", done,
                partitions);
        rc = 1;
    }
    free(ends);
    rd_kafka_topic_partition_list_destroy(parts);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return rc;
}
