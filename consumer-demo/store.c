#include "store.h"

#include <inttypes.h>
#include <stdio.h>

StoreResult store_apply(PGconn *conn, const OrderEvent *ev, const MessagePos *pos, long ttl_s,
                        DbError *e)
{
    char partition[16], offset[32], amount[32], version[32], ttl[32];
    snprintf(ttl, sizeof(ttl), "%ld", ttl_s);
    snprintf(partition, sizeof(partition), "%" PRId32, pos->partition);
    snprintf(offset, sizeof(offset), "%" PRId64, pos->offset);
    snprintf(amount, sizeof(amount), "%lld", ev->amount_cents);
    snprintf(version, sizeof(version), "%lld", ev->version);

    if (!db_exec(conn, "BEGIN", e))
        return STORE_FAILED;
    const char *pv[5] = {ev->event_id, pos->topic, partition, offset, ttl};
    PGresult *res = db_query(conn,
                             "INSERT INTO processed_events (event_id, topic, \"partition\","
                             " \"offset\", expires_at)"
                             " VALUES ($1, $2, $3, $4, now() + $5 * interval '1 second')"
                             " ON CONFLICT (event_id) DO NOTHING RETURNING 1",
                             5, pv, e);
    if (!res)
        goto failed;
    bool first_time = PQntuples(res) == 1;
    PQclear(res);
    if (!first_time) {
        db_rollback(conn);
        return STORE_DUPLICATE;
    }
    /* The version comparison happens under the row lock the upsert takes, so two consumers
     * racing on one order (a rebalance) still end at the highest version. A cancelled order
     * cancels its shipment. */
    const char *sv[7] = {ev->order_id, ev->event_id, ev->customer_id, amount,
                         ev->currency, ev->status,   version};
    res = db_query(conn,
                   "INSERT INTO shipments (order_id, event_id, customer_id, amount_cents, currency,"
                   " order_status, order_version, last_event_id, status)"
                   " VALUES ($1, $2, $3, $4, $5, $6, $7, $2,"
                   " CASE WHEN $6 = 'cancelled' THEN 'cancelled' ELSE 'pending' END)"
                   " ON CONFLICT (order_id) DO UPDATE SET customer_id = EXCLUDED.customer_id,"
                   " amount_cents = EXCLUDED.amount_cents, currency = EXCLUDED.currency,"
                   " order_status = EXCLUDED.order_status, order_version = EXCLUDED.order_version,"
                   " last_event_id = EXCLUDED.last_event_id, updated_at = now(),"
                   " status = CASE WHEN EXCLUDED.order_status = 'cancelled' THEN 'cancelled'"
                   " ELSE shipments.status END"
                   " WHERE shipments.order_version < EXCLUDED.order_version"
                   " RETURNING 1",
                   7, sv, e);
    if (!res)
        goto failed;
    bool changed = PQntuples(res) == 1;
    PQclear(res);
    /* A stale event still commits its processed_events row: it is dealt with, and its
     * redelivery is then a plain duplicate. */
    if (!db_exec(conn, "COMMIT", e))
        goto failed;
    return changed ? STORE_APPLIED : STORE_STALE;
failed:
    db_rollback(conn);
    return STORE_FAILED;
}

bool store_park(PGconn *conn, const ParkedMessage *m, DbError *e)
{
    char partition[16], offset[32];
    snprintf(partition, sizeof(partition), "%" PRId32, m->pos.partition);
    snprintf(offset, sizeof(offset), "%" PRId64, m->pos.offset);
    /* Key and payload are arbitrary bytes: sent as binary bytea, never as text. */
    const char *values[7] = {m->pos.topic,    partition,  offset,   m->key,
                             m->headers_json, m->payload, m->reason};
    const int lengths[7] = {0, 0, 0, (int)m->key_len, 0, (int)m->payload_len, 0};
    const int formats[7] = {0, 0, 0, 1, 0, 1, 0};
    PGresult *res = db_query_bin(conn,
                                 "INSERT INTO parked_messages (topic, \"partition\", \"offset\","
                                 " key, headers, payload, reason)"
                                 " VALUES ($1, $2, $3, $4::bytea, $5, $6::bytea, $7)"
                                 " ON CONFLICT (topic, \"partition\", \"offset\") DO NOTHING",
                                 7, values, lengths, formats, e);
    PQclear(res);
    return res != NULL;
}
