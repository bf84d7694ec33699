#include "kafka_stats.h"

#include <jansson.h>
#include <string.h>

int kafka_stats_brokers_up(const char *json, size_t len)
{
    json_t *root = json_loadb(json, len, 0, NULL);
    json_t *brokers = json_object_get(root, "brokers");
    int up = -1;
    if (json_is_object(brokers)) {
        const char *name;
        json_t *b;
        up = 0;
        json_object_foreach(brokers, name, b)
        {
            const char *state = json_string_value(json_object_get(b, "state"));
            if (state && strcmp(state, "UP") == 0)
                up = 1;
        }
    }
    json_decref(root);
    return up;
}
