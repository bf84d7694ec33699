#include "readiness.h"

#include "log.h"

bool readiness_judge(const RelayStatus *st, int lane_squatters, StrBuf *why)
{
    bool away = st->kafka_away == 1; /* LANE_MARK_AWAY; trying holds its share: ready */
    bool ready = st->postgres_up && st->kafka_up && !away && st->registry_up && !st->stopping &&
                 !st->setup_error[0] && !lane_squatters;
    if (ready || !why)
        return ready;
    if (!st->postgres_up)
        strbuf_puts(why, " postgres unreachable;");
    if (!st->kafka_up)
        strbuf_puts(why, " kafka unreachable;");
    /* Away, it holds no lanes while another relay reaches Kafka: by design, and not working.
     * With lanes, no member reaches Kafka (an outage for all, or no other relay runs): it keeps
     * them (lanes_sharing), and a reason saying they went to others would send the operator
     * looking for relays that deliver when none does. */
    if (away && st->lanes_owned > 0)
        strbuf_puts(why, " kafka away: deliveries time out from this relay, and no relay of its "
                         "outbox reaches kafka: it keeps its lanes;");
    else if (away)
        strbuf_puts(why, " kafka away: deliveries time out from this relay, its lanes go to "
                         "relays that reach kafka;");
    if (!st->registry_up) /* rows wait for it, no attempt counted (serializer.h) */
        strbuf_puts(why, " schema registry unavailable;");
    if (st->stopping)
        strbuf_puts(why, " shutting down;");
    if (lane_squatters) /* the aggregates of their lanes wait (upkeep.c) */
        strbuf_puts(why, " sessions that are not relays hold lane locks;");
    if (st->setup_error[0]) { /* other relays carry its lanes meanwhile */
        /* A server's or libpq's error text, which may echo a value of the configuration (a
         * password of the connection string): scrubbed as a log line scrubs it, and escaped to
         * stay one line. /readyz answers anyone who reaches the metrics port. */
        char shown[4 * sizeof(st->setup_error) + 8];
        strbuf_puts(why, " claims fail until the setup is fixed: ");
        strbuf_puts(why, log_escape(st->setup_error, shown, sizeof(shown)));
        strbuf_puts(why, ";");
    }
    return false;
}
