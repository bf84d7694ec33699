/* batch: the rows one claim transaction holds, their delivery states, and the parameters of the
 * statements that record the outcome.
 *
 * Rows are kept in claim order (id order); their strings point into the claim's PGresult, which
 * the batch owns until it is cleared. A batch also tracks which aggregates are "held": once a row
 * of an aggregate failed, later rows of that aggregate in the same batch are not produced (they
 * stay unsent, no attempt counted), so a failure never lets a later event overtake an earlier
 * one. The held set is a bitmap of hashes: a collision only holds back an unrelated row until
 * the next batch, which is harmless. */
#ifndef OUTBOX_BATCH_H
#define OUTBOX_BATCH_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "route.h"
#include "strbuf.h"

typedef enum {
    ROW_PENDING, /* not produced (yet): stays unsent */
    ROW_QUEUED,  /* handed to the producer, report not in */
    ROW_ACKED,   /* acknowledged by the broker */
    ROW_FAILED,  /* not delivered; error says why */
} RowState;

/* One row of a batch and the message it becomes: built once when claimed and produced, handed
 * to librdkafka as the message's opaque, and found again through it in the delivery report. */
typedef struct BatchRow {
    OutboxRow row;
    void *owner;            /* the batch's owner (the engine's session), for the delivery report */
    char *topic;            /* the topic it was produced to (owned), NULL until then */
    bool dead_letter;       /* a dead event being published to the dead-letter topic */
    int attempts;           /* as claimed */
    const char *last_error; /* as claimed (dead-letter rows only), else NULL */
    RowState state;
    bool permanent; /* the failure will not go away by retrying */
    char *error;    /* why it failed; owned */
    double age_s;   /* seconds since created_at when claimed (database clock); < 0: unknown */
    rd_kafka_headers_t *headers; /* built ahead of producing; owned until produced, else freed */
    char *value; /* the encoded value (--value-format avro/json-schema), owned; NULL: the
                  * payload as it is */
    size_t value_len;
    size_t message_bytes; /* every column of its message (statements.c, SQL_WITHIN_BUDGET), also
                           * when its large columns were not loaded */
    bool undecodable;     /* a bytea payload whose text form did not decode (never expected: the
                           * server writes it); failed, never sent empty */
    bool too_large;       /* over the producer's message.max.bytes: the claim left its large columns
                           * (payload, headers, additional fields) out */
    int32_t partition;    /* the partition it was produced to (its partition column), or
                           * MESSAGE_PARTITION_ANY: by its key, or not produced */
    bool setup_fault;     /* Kafka refused it for a fault of the setup (kafka_error_setup): left
                           * unsent (ROW_PENDING), no attempt counted, its aggregate held */

    /* The message's bytes as last produced, for a "message too large" error. */
    size_t sent_value, sent_key, sent_headers;
    /* Left unsent for no fault of its own (batch_leave_unsent): its purge by a failed producer,
     * or kept apart (Unrecordable). A later event of its aggregate delivered is an order break. */
    bool cancelled;
    /* For a broker's "too large" (produce.c): something else of the relay was in flight when it
     * was produced, and the relay's message count (Relay.produced) once it was. */
    bool shared;
    unsigned long long produced_seq;
    bool isolated; /* produced alone (Isolate, engine.h), its report awaited by every session */
    /* A dead event's copy refused as too large alone and bare (produce.c, copy_unfit): recorded
     * as a failed publication that is not retried (SQL_MARK_DEAD_LETTER_FAILED). */
    bool parked;
} BatchRow;

#define BATCH_HELD_BITS 65536

typedef struct Batch {
    void *owner;     /* given to every row (BatchRow.owner); set by the owner after batch_init */
    PGresult *claim; /* event rows; owns their strings */
    PGresult *dead;  /* dead-letter rows; owns their strings */
    /* Results of a batch given up while Kafka still held some of its messages (shutdown): the
     * producer does not copy payloads, so they are freed only with the batch (see batch_retire). */
    PGresult *retired[2];
    /* The encoded values (BatchRow.value) of that batch, for the same reason. */
    char **retired_values;
    int n_retired_values;
    BatchRow *rows;
    int capacity;
    int n;         /* rows loaded */
    int next;      /* next row to produce */
    int prepared;  /* rows before this one had their headers built (or tried) */
    int in_flight; /* produced, report not yet in */
    int acked, failed;
    size_t
        bytes; /* of the rows loaded, every column of their messages: what --batch-bytes bounds */
    bool abandoned; /* the transaction is gone; drop once every report is in */
    bool timed_out; /* the delivery timeout cancelled what was left */
    bool any_held;
    bool held_whole;   /* the claim's recheck held every row: nothing to publish (claim.c) */
    int setup_faults;  /* rows left unsent for a Kafka setup fault (batch_unsent) */
    int cancelled;     /* rows left unsent for no fault of theirs (batch_leave_unsent) */
    bool isolated_out; /* a row produced alone (BatchRow.isolated) awaits its report */
    rd_kafka_resp_err_t setup_err;         /* the first one's error */
    char setup_topic[ROUTE_TOPIC_MAX + 1]; /* and its topic ("" when not known) */
    double claimed_at;    /* monotonic time (monotime.h) when the claim's rows arrived, for latency
                             metrics */
    double claim_sent_at; /* monotonic time when its claim was sent (with the last marks, if
                             chained) */
    uint8_t held[BATCH_HELD_BITS / 8];
} Batch;

/* The array parameters of the statements that record a batch's outcome. */
typedef struct BatchMarks {
    StrBuf sent;                                        /* ids delivered */
    StrBuf failed_ids, failed_errors, failed_permanent; /* parallel arrays */
    StrBuf dl_sent;                                     /* ids published to the dead-letter topic */
    StrBuf dl_failed_ids;    /* ids whose copy failed (the error is logged, last_error kept) */
    StrBuf dl_failed_parked; /* parallel to dl_failed_ids: "t" for a copy not retried (parked) */
} BatchMarks;

/* Allocates room for capacity rows. Returns false when out of memory. */
bool batch_init(Batch *b, int capacity);
void batch_free(Batch *b);

/* Forgets the rows and frees the results; keeps the allocation. */
void batch_clear(Batch *b);

/* Keeps the results of the loaded rows alive until batch_free, however the batch is cleared:
 * for a batch given up (the shutdown timeout) while the producer still holds messages whose
 * payloads point into them. Call it at most once per batch lifetime (later calls do nothing). */
void batch_retire(Batch *b);

/* Whether b was given up (batch_retire) since it was made: the producer may still hold messages
 * whose payloads point into the results b keeps, however empty b is now. */
bool batch_given_up(const Batch *b);
/* What a given-up batch keeps for the producer (batch_retire), once taken out of it. */
typedef struct BatchRetired {
    PGresult *results[2];
    char **values;
    int n_values;
} BatchRetired;
/* Moves what b keeps for the producer into *out: b no longer frees it (batch_free), the caller
 * frees it with batch_retired_free once the producer is destroyed, on any thread. */
void batch_take_retired(Batch *b, BatchRetired *out);
void batch_retired_free(BatchRetired *r);

/* Makes room for capacity rows (a larger batch size after a reload); never shrinks. Only while
 * the batch is empty. Returns false (keeping the old room) when out of memory or not empty. */
bool batch_reserve(Batch *b, int capacity) __attribute__((warn_unused_result));

/* Loads the rows of the claim result, then those of the dead-letter result (either may be NULL;
 * at most capacity rows in all). The batch takes ownership of both results. */
void batch_load(Batch *b, PGresult *claim, PGresult *dead);

/* Records a failure (copying why) and holds the row's aggregate for the rest of the batch; counts
 * it in the failure metrics. */
void batch_fail(Batch *b, BatchRow *br, const char *why, bool permanent);

/* Leaves an event row (not a dead-letter copy) unsent for a fault of the setup, not of the row
 * (kafka_error_setup: not authorised, unknown topic): back to ROW_PENDING, so that no attempt is
 * counted against it and nothing of it is recorded (its aggregate type is then held out of the
 * claims until a probe after the hold backoff: engine.h, TopicHold), and its aggregate is held
 * for the rest of the batch, like a failure, so nothing overtakes it. */
void batch_unsent(Batch *b, BatchRow *br, rd_kafka_resp_err_t err);

/* Leaves a row unsent because the producer failed fatally (its purge cancelled the row's
 * message, or the row was never produced): neither the row's fault nor its topic's, so no
 * attempt is counted and nothing of it is recorded, like batch_unsent but holding no type; an
 * event row's aggregate is held for the rest of the batch. */
void batch_cancelled(Batch *b, BatchRow *br);
/* The same for a row not produced at all (marks_skip_unrecordable), counting no failure. */
void batch_leave_unsent(Batch *b, BatchRow *br);

/* Holds / tests an aggregate for the rest of the batch. */
void batch_hold(Batch *b, const OutboxRow *row);
bool batch_is_held(const Batch *b, const OutboxRow *row);

/* Fills m from the row states. Returns the first failed event row (for logging), or NULL. */
const BatchRow *batch_marks(const Batch *b, BatchMarks *m);
/* The same for rows [from, to) only: to record one row's outcome on its own. */
const BatchRow *batch_marks_range(const Batch *b, int from, int to, BatchMarks *m);
/* True when the row has an outcome to record (acknowledged or failed); PENDING and QUEUED rows
 * stay as they are. */
bool batch_row_recorded(const BatchRow *br);
void batch_marks_free(BatchMarks *m);

/* Counts acknowledged rows that come after a failed row of the same aggregate: an order break
 * (possible only when the broker rejected a message after later ones of its partition were
 * already written). With per_topic_template (--order-scope topic or partition: order is promised
 * within each topic only), only rows whose topics under that template are the same count; with
 * per_partition as well (--order-scope partition), only rows produced to the same partition (or
 * one of them by its key, whose partition the relay does not know). Logs each one as an error;
 * returns how many. */
int batch_order_breaks(const Batch *b, const char *per_topic_template, bool per_partition);

#endif
