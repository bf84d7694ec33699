#include "jsontext.h"

#include <stddef.h>
#include <string.h>

const char *jsontext_string(const char *p, const char *end)
{
    if (p >= end)
        return p;
    for (p++; p < end && *p != '"'; p++)
        if (*p == '\\' && ++p == end)
            return end;
    return p < end ? p + 1 : end;
}

const char *jsontext_value(const char *p, const char *end)
{
    if (p >= end)
        return p;
    if (*p == '"')
        return jsontext_string(p, end);
    if (*p != '{' && *p != '[') {
        while (p < end && !strchr(",}] \t\r\n", *p)) /* strchr finds a NUL too: it stops there */
            p++;
        return p;
    }
    size_t depth = 0;
    do {
        if (*p == '"') {
            p = jsontext_string(p, end);
            continue;
        }
        if (*p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            depth--;
        p++;
    } while (depth > 0 && p < end);
    return p;
}
