/* fuzz_order: producer-demo's request parsing that is ours (libmicrohttpd parses the HTTP
 * itself): the POST /orders body (order_parse), the order id of GET /orders/ID
 * (order_id_valid) and the Idempotency-Key header (idem_key_parse). All three come from any
 * HTTP client.
 *
 * Input: the first byte picks the parser; the rest is its input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"
#include "log.h"
#include "order.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_ERROR + 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t len = size - 1;
    char *text = malloc(len + 1);
    memcpy(text, data + 1, len);
    text[len] = '\0';
    char err[512];
    switch (data[0] % 3) {
    case 0: {
        OrderInput in;
        int status = order_parse(text, len, &in, err, sizeof(err));
        if (status == 0) {
            /* What was accepted is what the rules say. */
            size_t n = strnlen(in.customer_id, sizeof(in.customer_id));
            if (n == 0 || n > ORDER_CUSTOMER_ID_MAX || in.amount_cents <= 0 ||
                !order_currency_known(in.currency))
                abort();
            char *json = order_json("00000000-0000-0000-0000-000000000000", in.customer_id,
                                    in.amount_cents, in.currency, "created", 1, "now");
            free(json);
        } else if (status != 400 && status != 413 && status != 415 && status != 422) {
            abort();
        }
        break;
    }
    case 1:
        (void)order_id_valid(text);
        break;
    case 2: {
        char key[IDEM_KEY_MAX + 1];
        if (idem_key_parse(text, key, err, sizeof(err))) {
            size_t n = strlen(key);
            if (n == 0 || n > IDEM_KEY_MAX)
                abort();
            for (size_t i = 0; i < n; i++)
                if (key[i] < 0x21 || key[i] > 0x7e)
                    abort();
        }
        break;
    }
    }
    free(text);
    return 0;
}
