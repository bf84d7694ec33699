#include "xiddate.h"

void xiddate_init(XidDates *d)
{
    d->n = 0;
    d->dated_xid = -1;
    d->dated_since = -1;
}

bool xiddate_sample(XidDates *d, long long next_xid, double now)
{
    int n = d->n;
    if (n > 0 && next_xid == d->s[n - 1].next_xid)
        return false;
    /* Kept, the samples took none of the new server's until its ids passed the old one's last,
     * and dated its ids by when the old server passed them: a slot made after a failover was
     * held since the old server's first look past its xmin (the relay's first look: days). */
    bool reset = n > 0 && next_xid < d->s[n - 1].next_xid;
    if (reset) {
        xiddate_init(d);
        n = 0;
    }
    if (n == XIDDATE_SAMPLES) {
        /* Drop the sample whose loss coarsens a date least for its age: an id it dated is then
         * dated by the next one, (at[i+1] - at[i-1]) at most, against (now - at[i-1]). The
         * first (the lower bound for any older id) and the last stay. The samples space out
         * geometrically: 64 date an id to within a third of its age after a year of looks every
         * 5 s (0.67 of it at worst, measured).
         * Thinned as "the first and every other after", a sample moved down an index at each
         * thinning and was dropped at index 1: none but the first lived past six thinnings
         * (16 minutes of looks every 5 s). */
        int drop = 1;
        double best = 2.0;
        for (int i = 1; i < n - 1; i++) {
            double cost = (d->s[i + 1].at - d->s[i - 1].at) / (now - d->s[i - 1].at);
            if (cost < best) {
                best = cost;
                drop = i;
            }
        }
        for (int i = drop; i < n - 1; i++)
            d->s[i] = d->s[i + 1];
        n--;
    }
    d->s[n].at = now;
    d->s[n].next_xid = next_xid;
    d->n = n + 1;
    return reset;
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
