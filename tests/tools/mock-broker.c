/*
 * mock-broker: a Kafka-protocol cluster for tests, on librdkafka's mock cluster.
 *
 *   mock-broker [--brokers N] [--partitions P] [--topic NAME]... [--control FIFO] [--tcp-nodelay]
 *
 * --tcp-nodelay disables Nagle's algorithm on the brokers' sockets, as real Kafka brokers do
 * (socket TCP_NODELAY). Without it, a client with several requests in flight on one connection
 * waits for the mock's delayed ACKs: about 40 ms per round on Linux loopback, which the
 * benchmark must not measure. The tests run without it, as before.
 *
 * Prints the bootstrap servers as the first line on stdout, then serves until SIGTERM/SIGINT.
 * Commands read from the control FIFO, one per line:
 *   down all|ID        up all|ID        rtt all|ID MS
 *   errors produce COUNT ERRCODE        create TOPIC PARTITIONS
 *   topic-error TOPIC ERRCODE   (0 lifts it)
 * topic-error makes the mock answer Metadata requests for TOPIC with ERRCODE (librdkafka 2.0.2's
 * rd_kafka_mock_topic_set_error: Metadata only), one topic refused and the others served, which
 * produce errors cannot do: 3 (UNKNOWN_TOPIC_OR_PART) is a topic that does not exist with
 * auto-creation off (a producer fails its messages after topic.metadata.propagation.max.ms).
 * A producer of librdkafka 2.0.2 does not fail messages on 29 (TOPIC_AUTHORIZATION_FAILED) in
 * metadata: they wait for message.timeout.ms.
 * Every command logs exactly one line starting with "mock-broker:" to stderr, so a test can
 * wait for that line to know the command took effect. Commands are applied synchronously, in
 * order; the mock thread may take up to ~1 s per command when several arrive at once.
 *
 * librdkafka 2.0.2's mock auto-creates unknown topics with a fixed 4 partitions and has no public
 * API to change that; --partitions therefore applies to --topic and 'create' only.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define MOCK_AUTO_PARTITIONS 4 /* librdkafka's built-in default for auto-created topics */
#define MAX_TOPICS 64

static volatile sig_atomic_t run = 1;

static void on_signal(int sig)
{
    (void)sig;
    run = 0;
}

static int replication_factor;

static void drop_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk, (void)level, (void)fac, (void)buf;
}

/* Parses a decimal int in [min, max]; false on junk or overflow. */
static bool parse_int(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return false;
    *out = v;
    return true;
}

/* "all" is -1 (every broker, as the mock API expects), otherwise a broker id >= 1. */
static bool parse_broker(const char *s, int32_t *id)
{
    long v;
    if (!strcmp(s, "all")) {
        *id = -1;
        return true;
    }
    if (!parse_int(s, 1, INT32_MAX, &v))
        return false;
    *id = (int32_t)v;
    return true;
}

static const char *broker_name(int32_t id, char *buf, size_t len)
{
    if (id == -1)
        return "brokers";
    snprintf(buf, len, "broker %d", (int)id);
    return buf;
}

static void log_result(rd_kafka_resp_err_t err, const char *what)
{
    if (err)
        fprintf(stderr, "mock-broker: error: %s: %s\n", what, rd_kafka_err2str(err));
    else
        fprintf(stderr, "mock-broker: %s\n", what);
}

/* Executes one control command line; always logs exactly one line. */
static void run_command(rd_kafka_mock_cluster_t *mc, char *line)
{
    char *argv[5], *save = NULL, what[300], name[32];
    int argc = 0;
    for (char *tok = strtok_r(line, " \t\r", &save); tok; tok = strtok_r(NULL, " \t\r", &save)) {
        if (argc == 5) {
            argc++;
            break;
        }
        argv[argc++] = tok;
    }
    if (argc == 0)
        return; /* blank line: nothing to do, nothing to log */

    int32_t id;
    long n, code;
    const char *cmd = argv[0];
    if ((!strcmp(cmd, "down") || !strcmp(cmd, "up")) && argc == 2 && parse_broker(argv[1], &id)) {
        bool down = cmd[0] == 'd';
        rd_kafka_resp_err_t err =
            down ? rd_kafka_mock_broker_set_down(mc, id) : rd_kafka_mock_broker_set_up(mc, id);
        snprintf(what, sizeof(what), "%s %s", broker_name(id, name, sizeof(name)), cmd);
        log_result(err, what);
    } else if (!strcmp(cmd, "rtt") && argc == 3 && parse_broker(argv[1], &id) &&
               parse_int(argv[2], 0, INT_MAX, &n)) {
        snprintf(what, sizeof(what), "%s rtt %ld ms", broker_name(id, name, sizeof(name)), n);
        log_result(rd_kafka_mock_broker_set_rtt(mc, id, (int)n), what);
    } else if (!strcmp(cmd, "errors") && argc == 4 && !strcmp(argv[1], "produce") &&
               parse_int(argv[2], 1, 100000, &n) && parse_int(argv[3], -1000, 1000, &code)) {
        rd_kafka_resp_err_t *errs = malloc(sizeof(*errs) * (size_t)n);
        if (!errs) {
            fprintf(stderr, "mock-broker: error: out of memory\n");
            return;
        }
        for (long i = 0; i < n; i++)
            errs[i] = (rd_kafka_resp_err_t)code;
        rd_kafka_mock_push_request_errors_array(mc, 0 /* ApiKey Produce */, (size_t)n, errs);
        free(errs);
        fprintf(stderr, "mock-broker: next %ld produce requests fail with %ld (%s)\n", n, code,
                rd_kafka_err2name((rd_kafka_resp_err_t)code));
    } else if (!strcmp(cmd, "topic-error") && argc == 3 && parse_int(argv[2], -1000, 1000, &code)) {
        rd_kafka_mock_topic_set_error(mc, argv[1], (rd_kafka_resp_err_t)code);
        fprintf(stderr, "mock-broker: metadata of topic %.200s answers %ld (%s)\n", argv[1], code,
                rd_kafka_err2name((rd_kafka_resp_err_t)code));
    } else if (!strcmp(cmd, "create") && argc == 3 && parse_int(argv[2], 1, 10000, &n)) {
        snprintf(what, sizeof(what), "topic %.200s created with %ld partitions", argv[1], n);
        log_result(rd_kafka_mock_topic_create(mc, argv[1], (int)n, replication_factor), what);
    } else {
        fprintf(stderr, "mock-broker: error: unknown or malformed command: %s%s\n", cmd,
                argc > 1 ? " ..." : "");
    }
}

/* Reads whatever is available on the FIFO and runs each complete line. */
static void drain_control(rd_kafka_mock_cluster_t *mc, int fd, char *buf, size_t cap, size_t *len)
{
    for (;;) {
        ssize_t r = read(fd, buf + *len, cap - 1 - *len);
        if (r <= 0)
            return; /* EAGAIN: drained; EOF cannot happen since we hold a write end */
        *len += (size_t)r;
        buf[*len] = '\0';
        char *start = buf, *nl;
        while ((nl = strchr(start, '\n'))) {
            *nl = '\0';
            run_command(mc, start);
            start = nl + 1;
        }
        *len -= (size_t)(start - buf);
        memmove(buf, start, *len);
        if (*len == cap - 1) { /* a line longer than the buffer is junk: drop it */
            fprintf(stderr, "mock-broker: error: control line too long, dropped\n");
            *len = 0;
        }
    }
}

static void usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "mock-broker: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"brokers", required_argument, NULL, 'b'}, {"partitions", required_argument, NULL, 'p'},
        {"topic", required_argument, NULL, 't'},   {"control", required_argument, NULL, 'c'},
        {"tcp-nodelay", no_argument, NULL, 'N'},   {NULL, 0, NULL, 0},
    };
    long brokers = 3, partitions = MOCK_AUTO_PARTITIONS;
    const char *topics[MAX_TOPICS], *control = NULL;
    int ntopics = 0, c;
    bool nodelay = false;

    opterr = 0; /* we print our own one-line errors */
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            if (!parse_int(optarg, 1, 100, &brokers))
                usage_error("--brokers must be an integer 1..100", optarg);
            break;
        case 'p':
            if (!parse_int(optarg, 1, 10000, &partitions))
                usage_error("--partitions must be an integer 1..10000", optarg);
            break;
        case 't':
            if (ntopics == MAX_TOPICS)
                usage_error("too many --topic flags", NULL);
            topics[ntopics++] = optarg;
            break;
        case 'c':
            control = optarg;
            break;
        case 'N':
            nodelay = true;
            break;
        default:
            usage_error("unknown or incomplete option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        usage_error("unexpected argument", argv[optind]);
    replication_factor = brokers < 3 ? (int)brokers : 3;

    /* Keep SIGTERM/SIGINT away from librdkafka's threads (they inherit this mask); the main
     * thread only takes them inside ppoll, so the flag check cannot miss one. */
    sigset_t block, waitmask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &waitmask);
    sigdelset(&waitmask, SIGTERM);
    sigdelset(&waitmask, SIGINT);
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int ctl_fd = -1;
    if (control) {
        if (mkfifo(control, 0600) != 0 && errno != EEXIST)
            usage_error("cannot create control fifo", control);
        /* O_RDWR: we hold a writer ourselves, so writers never block and we never see EOF. */
        ctl_fd = open(control, O_RDWR | O_NONBLOCK | O_CLOEXEC);
        if (ctl_fd < 0)
            usage_error("cannot open control fifo", control);
    }

    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    /* The handle only hosts the cluster; its own client chatter (it connects to the mock
     * brokers and complains while they are down) would only drown our command log. */
    rd_kafka_conf_set_log_cb(conf, drop_log);
    /* The mock brokers' sockets take their options from this handle's configuration. */
    if (nodelay && rd_kafka_conf_set(conf, "socket.nagle.disable", "true", errstr,
                                     sizeof(errstr)) != RD_KAFKA_CONF_OK)
        usage_error("--tcp-nodelay", errstr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "mock-broker: cannot create handle: %s\n", errstr);
        return 1;
    }
    rd_kafka_mock_cluster_t *mc = rd_kafka_mock_cluster_new(rk, (int)brokers);
    if (!mc) {
        fprintf(stderr, "mock-broker: cannot create mock cluster\n");
        rd_kafka_destroy(rk);
        return 1;
    }
    for (int i = 0; i < ntopics; i++) {
        rd_kafka_resp_err_t err =
            rd_kafka_mock_topic_create(mc, topics[i], (int)partitions, replication_factor);
        if (err)
            fprintf(stderr, "mock-broker: error: topic %s: %s\n", topics[i], rd_kafka_err2str(err));
    }
    if (partitions != MOCK_AUTO_PARTITIONS)
        fprintf(stderr, "mock-broker: note: auto-created topics still get %d partitions\n",
                MOCK_AUTO_PARTITIONS);

    printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
    fflush(stdout);

    char buf[4096];
    size_t len = 0;
    while (run) {
        struct pollfd pfd = {.fd = ctl_fd, .events = POLLIN};
        int n = ppoll(&pfd, ctl_fd >= 0 ? 1 : 0, NULL, &waitmask);
        if (n > 0 && (pfd.revents & POLLIN))
            drain_control(mc, ctl_fd, buf, sizeof(buf), &len);
    }

    fprintf(stderr, "mock-broker: shutting down\n");
    if (ctl_fd >= 0)
        close(ctl_fd);
    rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(rk);
    return 0;
}
