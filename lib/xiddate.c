#include "xiddate.h"

void xiddate_init(XidDates *d)
{
    d->n = 0;
    d->dated_xid = -1;
    d->dated_since = -1;
}

void xiddate_sample(XidDates *d, long long next_xid, double now)
{
    int n = d->n;
    if (n > 0 && next_xid <= d->s[n - 1].next_xid)
        return;
    if (n == XIDDATE_SAMPLES) { /* keep the first and every other after it */
        int kept = 1;
        for (int i = 2; i < n; i += 2)
            d->s[kept++] = d->s[i];
        n = kept;
    }
    d->s[n].at = now;
    d->s[n].next_xid = next_xid;
    d->n = n + 1;
}

double xiddate_held(XidDates *d, long long xid, double now)
{
    if (xid != d->dated_xid || d->dated_since < 0) {
        d->dated_xid = xid;
        d->dated_since = -1;
        for (int i = 0; i < d->n && d->dated_since < 0; i++)
            if (d->s[i].next_xid > xid)
                d->dated_since = d->s[i].at;
    }
    return d->dated_since < 0 ? 0.0 : now - d->dated_since;
}
