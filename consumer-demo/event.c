#include "event.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "sha256.h"

static EventVerdict verdict(EventVerdict v, char *reason, size_t reasonlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static EventVerdict verdict(EventVerdict v, char *reason, size_t reasonlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, reasonlen, fmt, ap);
    va_end(ap);
    /* Reasons echo producer bytes; keep them printable ASCII (one log line, valid UTF-8 text
     * for parked_messages.reason). */
    for (char *p = reason; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            *p = '?';
    return v;
}

bool event_uuid(const char *text, size_t len, char out[37])
{
    if (len != 36)
        return false;
    for (size_t i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? text[i] != '-' : !isxdigit((unsigned char)text[i]))
            return false;
        out[i] = (char)tolower((unsigned char)text[i]);
    }
    out[36] = '\0';
    return true;
}

/* Copies a required text field: a non-empty string of at most EVENT_TEXT_MAX bytes without
 * control characters. */
static bool text_field(json_t *root, const char *name, char *out)
{
    json_t *v = json_object_get(root, name);
    if (!json_is_string(v))
        return false;
    size_t len = json_string_length(v);
    const char *s = json_string_value(v);
    if (len == 0 || len > EVENT_TEXT_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    memcpy(out, s, len + 1);
    return true;
}

static bool currency_field(json_t *root, char out[4])
{
    json_t *v = json_object_get(root, "currency");
    const char *s = json_string_value(v);
    if (!s || json_string_length(v) != 3)
        return false;
    for (int i = 0; i < 3; i++)
        if (s[i] < 'A' || s[i] > 'Z')
            return false;
    memcpy(out, s, 4);
    return true;
}

static bool is_type(const EventInput *in, const char *name)
{
    return in->type_len == strlen(name) && memcmp(in->type, name, in->type_len) == 0;
}

EventVerdict event_parse(const EventInput *in, OrderEvent *out, char *reason, size_t reasonlen)
{
    memset(out, 0, sizeof(*out));
    /* Two ids name two events, and which one a message is cannot be told: not applied under
     * either. The same for two event types. */
    if (in->id_differs)
        return verdict(EVENT_MALFORMED, reason, reasonlen, "id headers with different values");
    if (in->type_differs)
        return verdict(EVENT_MALFORMED, reason, reasonlen,
                       "event_type headers with different values");
    if (in->id_null)
        return verdict(EVENT_MALFORMED, reason, reasonlen, "id header without a value");
    if (!in->id)
        return verdict(EVENT_MALFORMED, reason, reasonlen, "no id header");
    if (!event_uuid(in->id, in->id_len, out->event_id))
        return verdict(EVENT_MALFORMED, reason, reasonlen, "id header is not a UUID: '%.*s'",
                       (int)(in->id_len > 64 ? 64 : in->id_len), in->id);
    if (in->type_null)
        return verdict(EVENT_MALFORMED, reason, reasonlen, "event_type header without a value");
    if (!in->type)
        return verdict(EVENT_MALFORMED, reason, reasonlen, "no event_type header");
    out->updated = is_type(in, "OrderUpdated");
    if (!out->updated && !is_type(in, "OrderCreated"))
        return verdict(EVENT_IGNORE, reason, reasonlen, "event_type '%.*s' is not handled",
                       (int)(in->type_len > 64 ? 64 : in->type_len), in->type);
    const char *type = out->updated ? "OrderUpdated" : "OrderCreated";
    if (!in->payload)
        return verdict(EVENT_MALFORMED, reason, reasonlen, "%s without a payload", type);

    /* A name that comes twice ({"amount_cents": 1, "amount_cents": 999}) means whatever its
     * reader decides (jansson keeps the last, other readers the first): not an order to apply,
     * as producer-demo refuses such a body too. */
    json_error_t jerr;
    json_t *root = json_loadb(in->payload, in->payload_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && json_error_code(&jerr) == json_error_duplicate_key)
        return verdict(EVENT_MALFORMED, reason, reasonlen, "payload has a field twice: %s",
                       jerr.text);
    if (!root)
        return verdict(EVENT_MALFORMED, reason, reasonlen, "payload is not JSON: %s", jerr.text);
    EventVerdict v = EVENT_APPLY;
    json_t *amount = json_object_get(root, "amount_cents");
    json_t *version = json_object_get(root, "version");
    json_t *status = json_object_get(root, "status");
    if (!json_is_object(root))
        v = verdict(EVENT_MALFORMED, reason, reasonlen, "payload is not a JSON object");
    else if (!text_field(root, "id", out->order_id))
        v = verdict(EVENT_MALFORMED, reason, reasonlen, "payload has no valid \"id\"");
    else if (!text_field(root, "customer_id", out->customer_id))
        v = verdict(EVENT_MALFORMED, reason, reasonlen, "payload has no valid \"customer_id\"");
    else if (!json_is_integer(amount) || json_integer_value(amount) <= 0)
        v = verdict(EVENT_MALFORMED, reason, reasonlen,
                    "payload has no valid \"amount_cents\" (an integer > 0)");
    else if (!currency_field(root, out->currency))
        v = verdict(EVENT_MALFORMED, reason, reasonlen, "payload has no valid \"currency\"");
    else if ((version || out->updated) &&
             (!json_is_integer(version) || json_integer_value(version) < 1 ||
              json_integer_value(version) > 2147483647))
        v = verdict(EVENT_MALFORMED, reason, reasonlen,
                    "%s payload has no valid \"version\" (an integer 1..2147483647)", type);
    else if ((status || out->updated) && !text_field(root, "status", out->status))
        v = verdict(EVENT_MALFORMED, reason, reasonlen, "%s payload has no valid \"status\"", type);
    else {
        out->amount_cents = json_integer_value(amount);
        out->version = version ? json_integer_value(version) : 1;
        if (!status)
            snprintf(out->status, sizeof(out->status), "created");
        sha256_hex(in->payload, in->payload_len, out->payload_sha256);
    }
    json_decref(root);
    return v;
}
