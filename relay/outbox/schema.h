/* schema: the numbers the migrations (the .sql files of migrations/) and the C code must agree on,
 * named once.
 *
 * SQL cannot include this file, so tests/unit/test_schema.c reads the embedded migrations and
 * checks that each number below appears in them where it is used: change one side and that test
 * fails. tests/lib.sh spells the lock keys too, to read pg_locks. */
#ifndef OUTBOX_SCHEMA_H
#define OUTBOX_SCHEMA_H

/* Every aggregate hashes into one of LANE_COUNT lanes: the generated column outbox.lane is
 * hashtextextended(aggregate_type || '/' || aggregate_id, 0) & LANE_MASK (0003). */
#define LANE_COUNT 64
#define LANE_MASK "63"

/* First keys of the two-key advisory locks of the lane group (values unlikely to clash with
 * applications'): a session's member slot (what shows it alive in pg_locks), and each lane. */
#define LOCK_NS_MEMBER "1331849729"
#define LOCK_NS_LANE "1331849730"
/* Held, keyed by its member slot, by a session whose relay cannot reach Kafka (an away member:
 * the lanes go to the members that reach it, if any; lanes.h). */
#define LOCK_NS_AWAY "1331849733"
/* The wakeup's advisory locks: producers mid-transaction (0004) and the guard's (0007). */
#define LOCK_KEY_PRODUCING "1331849731"
#define LOCK_KEY_WAKEUP "1331849732"
/* The relay's bookkeeping columns, as migrations 0001 and 0003 create them in its own table and
 * `migrate` adds them to an adopted one (X(name, definition)); test_schema checks each definition
 * against the migrations. */
#define SCHEMA_BOOKKEEPING_COLUMNS(X)                                                              \
    X("created_at", "timestamptz NOT NULL DEFAULT now()")                                          \
    X("sent_at", "timestamptz")                                                                    \
    X("attempts", "integer NOT NULL DEFAULT 0")                                                    \
    X("rejections", "integer NOT NULL DEFAULT 0")                                                  \
    X("last_error", "text")                                                                        \
    X("next_attempt_at", "timestamptz")                                                            \
    X("dead_at", "timestamptz")                                                                    \
    X("dead_letter_topic", "text")

/* Held by `migrate` while it applies migrations, so two never run at once. */
#define LOCK_KEY_MIGRATE "7243016118520431001"

#endif
