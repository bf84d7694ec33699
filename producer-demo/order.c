#include "order.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* ISO 4217 codes of circulating currencies (fund codes, precious metals and test codes left
 * out: an order is paid in money). Sorted, for bsearch. */
static const char *const currencies[] = {
    "AED", "AFN", "ALL", "AMD", "ANG", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT",
    "BGN", "BHD", "BIF", "BMD", "BND", "BOB", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD",
    "CDF", "CHF", "CLP", "CNY", "COP", "CRC", "CUP", "CVE", "CZK", "DJF", "DKK", "DOP", "DZD",
    "EGP", "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS", "GIP", "GMD", "GNF", "GTQ",
    "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IQD", "IRR", "ISK", "JMD", "JOD",
    "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW", "KWD", "KYD", "KZT", "LAK", "LBP", "LKR",
    "LRD", "LSL", "LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR", "MVR",
    "MWK", "MXN", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB", "PEN",
    "PGK", "PHP", "PKR", "PLN", "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD", "SCR",
    "SDG", "SEK", "SGD", "SHP", "SLE", "SOS", "SRD", "SSP", "STN", "SVC", "SYP", "SZL", "THB",
    "TJS", "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX", "USD", "UYU", "UZS",
    "VES", "VND", "VUV", "WST", "XAF", "XCD", "XCG", "XOF", "XPF", "YER", "ZAR", "ZMW", "ZWG",
};

static int compare_code(const void *key, const void *elem)
{
    return strcmp(key, *(const char *const *)elem);
}

bool order_currency_known(const char *code)
{
    return bsearch(code, currencies, sizeof(currencies) / sizeof(currencies[0]),
                   sizeof(currencies[0]), compare_code) != NULL;
}

/* Formats err and returns status, so each rule below reads as one line. */
static int reject(int status, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int reject(int status, char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    for (char *p = err; *p; p++) /* jansson's messages may echo input */
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    return status;
}

/* How many bytes of a client's field name an error message quotes: at most max, cut where a
 * character ends, so that a long name cut short is still UTF-8 (the problem document that
 * carries the message must be). */
static int name_prefix(const char *name, size_t max)
{
    size_t n = 0;
    while (name[n]) {
        int32_t cp;
        size_t len = utf8_decode(name + n, &cp);
        if (n + len > max)
            break;
        n += len;
    }
    return (int)n;
}

#define NAME_QUOTED_MAX 64 /* bytes of an unknown field's name quoted back */

static int check_customer(json_t *v, OrderInput *out, char *err, size_t errlen)
{
    if (!json_is_string(v))
        return reject(422, err, errlen, "customer_id must be a string");
    size_t len = json_string_length(v);
    const char *s = json_string_value(v);
    if (len == 0 || len > ORDER_CUSTOMER_ID_MAX)
        return reject(422, err, errlen, "customer_id must be 1 to %d bytes long",
                      ORDER_CUSTOMER_ID_MAX);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return reject(422, err, errlen, "customer_id must not contain control characters");
    memcpy(out->customer_id, s, len + 1);
    return 0;
}

static int check_amount(json_t *v, OrderInput *out, char *err, size_t errlen)
{
    /* 12.0 is a real in JSON terms and booleans are not numbers: both are the wrong type. */
    if (!json_is_integer(v))
        return reject(422, err, errlen, "amount_cents must be an integer number of cents");
    if (json_integer_value(v) <= 0)
        return reject(422, err, errlen, "amount_cents must be greater than 0");
    out->amount_cents = json_integer_value(v);
    return 0;
}

static int check_currency(json_t *v, OrderInput *out, char *err, size_t errlen)
{
    if (!json_is_string(v))
        return reject(422, err, errlen, "currency must be a string");
    const char *s = json_string_value(v);
    if (json_string_length(v) != 3 || !order_currency_known(s))
        return reject(422, err, errlen,
                      "currency must be an ISO 4217 code in upper case, like \"EUR\"");
    memcpy(out->currency, s, 4);
    return 0;
}

/* Parses a request body as JSON (duplicate keys refused) into *root (the caller's). Returns 0,
 * or the HTTP status for a body that is not JSON, with the reason in err. */
static int load_body(const char *body, size_t len, json_t **root, char *err, size_t errlen)
{
    json_error_t jerr;
    *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (*root)
        return 0;
    if (json_error_code(&jerr) == json_error_numeric_overflow)
        return reject(422, err, errlen, "a number is out of range: %s", jerr.text);
    return reject(400, err, errlen, "body is not valid JSON: %s at byte %d", jerr.text,
                  jerr.position);
}

int order_parse(const char *body, size_t len, OrderInput *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    json_t *root;
    int bad = load_body(body, len, &root, err, errlen);
    if (bad)
        return bad;
    int status = 0;
    if (!json_is_object(root)) {
        status = reject(400, err, errlen, "body must be a JSON object");
        goto done;
    }
    static const char *const fields[] = {"customer_id", "amount_cents", "currency"};
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            known = known || strcmp(key, fields[i]) == 0;
        if (!known) {
            status = reject(422, err, errlen, "unknown field \"%.*s\"",
                            name_prefix(key, NAME_QUOTED_MAX), key);
            goto done;
        }
    }
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if (!json_object_get(root, fields[i])) {
            status = reject(422, err, errlen, "missing field \"%s\"", fields[i]);
            goto done;
        }
    if ((status = check_customer(json_object_get(root, "customer_id"), out, err, errlen)) ||
        (status = check_amount(json_object_get(root, "amount_cents"), out, err, errlen)) ||
        (status = check_currency(json_object_get(root, "currency"), out, err, errlen)))
        goto done;
done:
    json_decref(root);
    return status;
}

char *order_json(const char *id, const char *customer_id, long long amount_cents,
                 const char *currency, const char *status, long long version,
                 const char *created_at)
{
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:s, s:s, s:I, s:s}", "id", id, "customer_id", customer_id,
                  "amount_cents", (json_int_t)amount_cents, "currency", currency, "status", status,
                  "version", (json_int_t)version, "created_at", created_at);
    if (!o)
        return NULL;
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

bool order_id_valid(const char *s)
{
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !isxdigit((unsigned char)s[i]))
            return false;
    }
    return s[36] == '\0';
}

/* Statuses in life-cycle order: a patch may move forward only. */
static const char *const statuses[] = {"created", "confirmed", "cancelled"};

static int status_rank(const char *s)
{
    for (int i = 0; i < (int)(sizeof(statuses) / sizeof(statuses[0])); i++)
        if (strcmp(s, statuses[i]) == 0)
            return i;
    return -1;
}

int order_patch_parse(const char *body, size_t len, OrderPatch *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    json_t *root;
    int bad = load_body(body, len, &root, err, errlen);
    if (bad)
        return bad;
    int status = 0;
    const char *key;
    json_t *value;
    if (!json_is_object(root)) {
        status = reject(400, err, errlen, "body must be a JSON object");
        goto done;
    }
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "amount_cents") == 0) {
            OrderInput tmp;
            if ((status = check_amount(value, &tmp, err, errlen)))
                goto done;
            out->has_amount = true;
            out->amount_cents = tmp.amount_cents;
        } else if (strcmp(key, "status") == 0) {
            if (!json_is_string(value) || status_rank(json_string_value(value)) < 0) {
                status = reject(422, err, errlen,
                                "status must be \"created\", \"confirmed\" or \"cancelled\"");
                goto done;
            }
            out->has_status = true;
            snprintf(out->status, sizeof(out->status), "%s", json_string_value(value));
        } else {
            status = reject(422, err, errlen, "field \"%.*s\" cannot be changed",
                            name_prefix(key, NAME_QUOTED_MAX), key);
            goto done;
        }
    }
    if (!out->has_amount && !out->has_status)
        status = reject(422, err, errlen, "nothing to change: send amount_cents or status");
done:
    json_decref(root);
    return status;
}

bool order_patch_allowed(const char *from, const OrderPatch *p, char *err, size_t errlen)
{
    int have = status_rank(from);
    if (have < 0) {
        reject(409, err, errlen, "the order's status \"%.32s\" cannot be changed", from);
        return false;
    }
    if (strcmp(from, "cancelled") == 0) {
        reject(409, err, errlen, "the order is cancelled; it cannot be changed");
        return false;
    }
    if (p->has_status && status_rank(p->status) < have) {
        reject(409, err, errlen, "status cannot go back from \"%s\" to \"%s\"", from, p->status);
        return false;
    }
    return true;
}

/* One entity tag of an If-Match list: W/ or not, and the bytes between the quotes. */
typedef struct EntityTag {
    bool weak;
    const char *opaque;
    size_t len;
} EntityTag;

static bool ows(char c)
{
    return c == ' ' || c == '\t';
}

/* etagc (RFC 9110 section 8.8.3): any visible byte but '"', and obs-text. */
static bool etagc(unsigned char c)
{
    return c == 0x21 || (c >= 0x23 && c <= 0x7e) || c >= 0x80;
}

/* Reads the next entity tag of the list at *pp into t and moves *pp past it. after_tag says a
 * tag was read before, so that only a comma may follow it. Returns 1 with a tag, 0 at the end
 * of the list, -1 on bad syntax. */
static int next_tag(const char **pp, bool after_tag, EntityTag *t)
{
    const char *p = *pp;
    while (ows(*p))
        p++;
    if (after_tag && *p != '\0' && *p != ',')
        return -1; /* "1" "2": two tags need a comma between them */
    while (ows(*p) || *p == ',')
        p++;
    if (*p == '\0')
        return 0;
    t->weak = p[0] == 'W' && p[1] == '/';
    if (t->weak)
        p += 2;
    if (*p++ != '"')
        return -1;
    t->opaque = p;
    while (etagc((unsigned char)*p))
        p++;
    t->len = (size_t)(p - t->opaque);
    if (*p++ != '"')
        return -1;
    *pp = p;
    return 1;
}

bool order_if_match_parse(const char *value, OrderIfMatch *out)
{
    *out = (OrderIfMatch){.value = value};
    const char *p = value;
    while (ows(*p))
        p++;
    if (*p == '*') {
        p++;
        while (ows(*p))
            p++;
        out->any = *p == '\0';
        return out->any;
    }
    EntityTag t;
    int n = 0, got;
    while ((got = next_tag(&p, n > 0, &t)) == 1) {
        n++;
        out->weak = out->weak || t.weak;
    }
    return got == 0 && n > 0;
}

bool order_if_match_matches(const OrderIfMatch *m, long long version)
{
    if (m->any)
        return true;
    char want[24];
    int wlen = snprintf(want, sizeof(want), "%lld", version);
    const char *p = m->value;
    EntityTag t;
    for (bool after = false; next_tag(&p, after, &t) == 1; after = true)
        if (!t.weak && t.len == (size_t)wlen && memcmp(t.opaque, want, t.len) == 0)
            return true;
    return false;
}

bool order_if_match_canon(const OrderIfMatch *m, char *out, size_t outlen)
{
    if (outlen < strlen(m->value) + 1 || outlen < 2)
        return false;
    if (m->any) {
        strcpy(out, "*");
        return true;
    }
    const char *p = m->value;
    EntityTag t;
    size_t n = 0;
    int tags = 0;
    bool digits = false;
    for (; next_tag(&p, tags > 0, &t) == 1; tags++) {
        if (tags > 0)
            out[n++] = ',';
        size_t whole = t.len + 2 + (t.weak ? 2 : 0); /* the tag as written: W/"..." */
        memcpy(out + n, t.opaque - 1 - (t.weak ? 2 : 0), whole);
        n += whole;
        digits = !t.weak && t.len > 0 && strspn(t.opaque, "0123456789") >= t.len;
    }
    out[n] = '\0';
    if (tags == 1 && digits) { /* "3" -> 3 */
        memmove(out, out + 1, n - 2);
        out[n - 2] = '\0';
    }
    return true;
}
