/* fuzz_config: the relay's option engine, config file, --kafka-file and what config_load checks
 * with them (lib/opts.c, lib/optval.c, relay/config.c, relay/kafka_guard.c, the table mapping of
 * relay/outbox/table.c), then the topic template check and the TLS statement's judgement.
 *
 * Input: CONFIG_JSON \0 KAFKA_FILE \0 ARG \n ARG \n ... The first part becomes the file of
 * --config, the second the file of --kafka-file (each only when non-empty); the rest are
 * argv[1..] (the command first). Who writes these: the operator, or whoever can write the
 * config files or the unit's command line (README, "Security"). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "route.h"
#include "tls_report.h"

static char config_path[] = "/tmp/fuzz_config.json.XXXXXX";
static char kafka_path[] = "/tmp/fuzz_kafka.properties.XXXXXX";
static int config_fd = -1, kafka_fd = -1;

static void remove_files(void)
{
    unlink(config_path);
    unlink(kafka_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    config_fd = mkstemp(config_path);
    kafka_fd = mkstemp(kafka_path);
    if (config_fd < 0 || kafka_fd < 0)
        abort();
    atexit(remove_files);
    log_set_level(LOG_ERROR + 1); /* quiet: warnings about the input are not findings */
    /* The environment is part of the input of config_load; keep the fuzzer's own out of it. */
    unsetenv("DATABASE_URL");
    unsetenv("DATABASE_URL_FILE");
    unsetenv("KAFKA_BROKERS");
    /* So is the installed service's configuration (config_set_installed_dir): not this host's. */
    config_set_installed_dir("/nonexistent/outbox-relay");
    return 0;
}

static void put_file(int fd, const uint8_t *data, size_t len)
{
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, len, 0) != (ssize_t)len)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *end = data + size;
    const uint8_t *z1 = memchr(data, 0, size);
    if (!z1)
        return 0;
    const uint8_t *z2 = memchr(z1 + 1, 0, (size_t)(end - z1 - 1));
    if (!z2)
        return 0;
    size_t clen = (size_t)(z1 - data), klen = (size_t)(z2 - z1 - 1);
    put_file(config_fd, data, clen);
    put_file(kafka_fd, z1 + 1, klen);

    /* argv: the program, the rest split at newlines (at most 64), then the files. */
    size_t alen = (size_t)(end - z2 - 1);
    char *args = malloc(alen + 1);
    memcpy(args, z2 + 1, alen);
    args[alen] = '\0';
    char *argv[64 + 6];
    int argc = 0;
    argv[argc++] = "outbox-relay";
    for (char *p = args, *nl; p && argc < 64; p = nl ? nl + 1 : NULL) {
        nl = memchr(p, '\n', (size_t)(args + alen - p));
        if (nl)
            *nl = '\0';
        argv[argc++] = p;
        if (!nl)
            break;
    }
    if (clen) {
        argv[argc++] = "--config";
        argv[argc++] = config_path;
    }
    if (klen) {
        argv[argc++] = "--kafka-file";
        argv[argc++] = kafka_path;
    }
    argv[argc] = NULL;

    Config cfg;
    char err[1024];
    if (config_load(&cfg, argc, argv, err, sizeof(err))) {
        if (cfg.command == CMD_RUN) {
            (void)route_template_check(cfg.topic_template, cfg.order_scope == ORDER_PER_TOPIC, err,
                                       sizeof(err));
            TlsSide pg, kafka;
            tls_report_judge(&cfg, &pg, &kafka);
        }
    } else if (memchr(err, '\n', strnlen(err, sizeof(err)))) {
        /* The contract: one line. */
        fprintf(stderr, "config_load error with a newline: %s\n", err);
        abort();
    }
    config_free(&cfg);
    free(args);
    return 0;
}
