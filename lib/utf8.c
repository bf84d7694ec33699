#include "utf8.h"

size_t utf8_decode(const char *s, int32_t *cp)
{
    const unsigned char *p = (const unsigned char *)s;
    unsigned char c = p[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    int32_t v, min;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2, v = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3, v = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        *cp = -1; /* a continuation byte, 0xc0/0xc1 (always overlong) or 0xf5 and up */
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        /* A NUL is not a continuation byte, so a cut sequence stops here, in bounds. */
        if ((p[i] & 0xc0) != 0x80) {
            *cp = -1;
            return 1;
        }
        v = (v << 6) | (p[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) {
        *cp = -1;
        return 1;
    }
    *cp = v;
    return len;
}

bool utf8_valid(const char *s)
{
    int32_t cp = 0;
    for (const char *p = s; *p && cp >= 0; p += utf8_decode(p, &cp))
        ;
    return cp >= 0;
}

bool utf8_unsafe(int32_t cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0xad || cp == 0x34f || cp == 0x61c ||
           cp == 0x115f || cp == 0x1160 || cp == 0x17b4 || cp == 0x17b5 ||
           (cp >= 0x180b && cp <= 0x180f) || (cp >= 0x200b && cp <= 0x200f) ||
           (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x206f) || cp == 0x3164 ||
           (cp >= 0xfe00 && cp <= 0xfe0f) || cp == 0xfeff || cp == 0xffa0 ||
           (cp >= 0xfff0 && cp <= 0xfffb) || (cp >= 0x1d173 && cp <= 0x1d17a) ||
           (cp >= 0xe0000 && cp <= 0xe0fff);
}

bool utf8_combining(int32_t cp)
{
    return (cp >= 0x300 && cp <= 0x36f) || (cp >= 0x1ab0 && cp <= 0x1aff) ||
           (cp >= 0x1dc0 && cp <= 0x1dff) || (cp >= 0x20d0 && cp <= 0x20ff) ||
           (cp >= 0xfe20 && cp <= 0xfe2f);
}
