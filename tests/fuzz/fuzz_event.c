/* fuzz_event: consumer-demo's reading of a Kafka message (event_parse, event_uuid): the id and
 * event_type headers and the payload, written by whoever can produce to the topic.
 *
 * Input: ID \0 TYPE \0 PAYLOAD; a part made of the single byte 0xff stands for "absent". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_ERROR + 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Each part is copied to its own buffer of exactly its length, so ASan sees any read past
     * it (the parts are not NUL-terminated for event_parse). */
    const uint8_t *parts[3] = {NULL, NULL, NULL};
    size_t lens[3] = {0, 0, 0};
    const uint8_t *p = data, *end = data + size;
    for (int i = 0; i < 3; i++) {
        const uint8_t *z = i < 2 ? memchr(p, 0, (size_t)(end - p)) : NULL;
        size_t n = z ? (size_t)(z - p) : (size_t)(end - p);
        if (!(n == 1 && p[0] == 0xff)) {
            parts[i] = p;
            lens[i] = n;
        }
        p = z ? z + 1 : end;
    }
    char *copy[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++)
        if (parts[i]) {
            copy[i] = malloc(lens[i] ? lens[i] : 1);
            memcpy(copy[i], parts[i], lens[i]);
        }
    EventInput in = {.id = copy[0],
                     .id_len = lens[0],
                     .type = copy[1],
                     .type_len = lens[1],
                     .payload = copy[2],
                     .payload_len = lens[2]};
    OrderEvent out;
    char reason[256];
    EventVerdict v = event_parse(&in, &out, reason, sizeof(reason));
    if (v == EVENT_APPLY) {
        char uuid[37];
        if (!copy[0] || !event_uuid(copy[0], lens[0], uuid) || out.amount_cents <= 0 ||
            strlen(out.currency) != 3 || out.version < 1)
            abort();
    } else {
        for (const char *r = reason; *r; r++)
            if (*r < 0x20 || *r > 0x7e)
                abort(); /* the contract: one line of printable ASCII */
    }
    for (int i = 0; i < 3; i++)
        free(copy[i]);
    return 0;
}
