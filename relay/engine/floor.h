/* floor: where a session's claims start in the unsent index
 * (docs/architecture.md#the-claim-and-its-floor).
 *
 * Marking a row sent (or deleting it) leaves its old version in the partial index on unsent
 * rows until vacuum removes it, and vacuum cannot while any snapshot older than the mark is
 * open (a forgotten BEGIN, a long report, a standby's hot_standby_feedback, a logical slot). A
 * claim that walks the index from its start pays for every such version before it finds the
 * first unsent row: with an old snapshot held, claims got slower with every minute. So each
 * session keeps a floor: its claims read the unsent index from the floor on, and failed rows
 * below it from the retry index (SQL_CLAIM in relay/outbox/statements.c).
 *
 * The floor may pass a row only once that row can no longer be claimed with attempts = 0: it
 * was sent or failed (failed rows are found below the floor), or was rolled back. The hard case
 * is a row whose transaction has not committed yet: its {seq} may be lower than rows already
 * sent. The rule that makes it safe:
 *
 *   {seq} is an identity column GENERATED ALWAYS whose sequence has no cache (values are handed
 *   out in time order; checked by SQL_FLOOR_CHECK, else the floor stays 0), and an INSERT takes
 *   RowExclusiveLock on the table before it draws its {seq}, holding it to the end of its
 *   transaction (a prepared transaction's locks, pid NULL, hold every candidate). So once the
 *   sequence has handed out L, every transaction that drew a {seq} up to L holds that lock, or
 *   has ended, at any later moment. Before each claim the session reads L (SQL_FLOOR_HELD),
 *   after it the lock's holders (SQL_FLOOR_WRITERS), and makes L + 1 a candidate; once a later
 *   look finds every listed holder gone, every row below the candidate is committed or rolled
 *   back, and the claims from then on see all of those that committed (the candidate is
 *   confirmed). L comes from the sequence, not from the rows: a {seq} given by hand above it
 *   (OVERRIDING SYSTEM VALUE) never lifts the floor over rows drawn later.
 *
 * A claim that starts after the confirmation then lets the floor rise to the confirmed
 * candidate, but never past a row it left out: rows after its last row (its limit or byte
 * budget cut there), and rows an earlier failed row holds back (SQL_FLOOR_HELD gives the lowest
 * failed row, read before the claim, of the types not held). A claim that went around locked rows
 * does not move it. The new floor takes effect when the claim's transaction commits with every row
 * recorded.
 *
 * What keeps the floor where it is: a transaction that wrote to the table and stays open (its
 * row may still commit), and with --on-poison hold a dead event until it is requeued or purged.
 * Not the session's hold (TopicHold, engine.h): the claims that leave held aggregate types out
 * move the floor past their rows like any other (held for hours at a high rate, a floor kept
 * below them made every claim read past every row sent since the hold began). Those rows, unsent
 * with attempts 0, are then below the floor where no such claim looks, which is right while they
 * are held; the probe (the claim that takes the held types too) reads from where the floor was
 * when the hold began (floor_hold_param), and when a type is let go, or the hold dropped, the
 * floor goes back there (floor_hold_release), so the released rows are claimed next, in order.
 * A floor that starts again from 0 (below) takes that point with it.
 * Rows a relay gains with new lanes may lie anywhere: the floor starts again from 0. Rows made
 * unsent again by hand (sent_at cleared, attempts set back to 0, another aggregate) get attempts
 * 1 from migrations/0008's trigger, so they are failed rows to the claims; it is enabled ALWAYS
 * (0011), since a session with session_replication_role = replica (a logical replication apply
 * worker) skips ordinary triggers and its rows would stay below the floor with attempts 0, never
 * claimed until the floor starts again, after the later events of their aggregates. A sequence set
 * back starts the floor again from 0: seen by identity, as a new relfilenode of the table
 * (TRUNCATE) or of the sequence (TRUNCATE ... RESTART IDENTITY, ALTER SEQUENCE ... RESTART), which
 * a look sees even when the rows inserted since have drawn the sequence past its old last value;
 * and by value, as a last value lower than at the last look (setval, which keeps the relfilenode).
 * Every claim on a floor above 0 checks the same against what the last look saw (floor_param,
 * FLOOR_GUARD in relay/outbox/statements.c), under the sequence's lock, and reads from the
 * table's start when anything differs: the claims between a reset and the look that sees it
 * read from 0 too, and send no new row above the floor before those below it (but for the
 * setval that follows). Not seen: a setval down that new
 * rows overtook before the next look (setval changes nothing else a statement can read: not the
 * relfilenode, not the sequence tuple's xmin, which stays frozen; its log_cnt 0 is what the
 * sequence shows after every 32 values drawn too), and a {seq} given by hand below the floor
 * (docs/operations.md#dead-rows-and-old-snapshots). */
#ifndef OUTBOX_FLOOR_H
#define OUTBOX_FLOOR_H

#include <stdbool.h>

typedef struct ClaimFloor {
    bool enabled;        /* {seq} is drawn in order (SQL_FLOOR_CHECK); else the floor stays 0 */
    long long floor;     /* claims read the unsent index from here */
    long long high;      /* one past the highest last value read since the floor last restarted */
    long long confirmed; /* every row below it is committed or rolled back; 0: none yet */
    long long candidate; /* waiting for the writers listed with it to end; 0: none */
    char *writers;       /* those writers, as a text[] literal (owned) */
    long long on_commit; /* the floor this claim's commit brings; 0: none */
    unsigned restarts;   /* times the sequence was found set back (floor_after_claim) */
    unsigned table_node; /* the table's relfilenode at the last look; 0: not known */
    unsigned seq_node;   /* the sequence's relfilenode at the last look; 0: not known */
    unsigned seq_oid;    /* the sequence's oid at the last look; 0: not known */
    bool holding;        /* aggregate types are held out of the claims (floor_hold_begin) */
    long long hold_from; /* while holding: the floor when the hold began, or lower (a restart) */
    char text[128];      /* floor and the above, as the claim's parameter (floor_param) */
} ClaimFloor;

/* What one claim learnt (relay/engine/claim.c fills it from the claim's results). */
typedef struct FloorClaim {
    bool plain;          /* the claim in order (not the one around locked rows) */
    int rows;            /* rows the claim returned */
    long long last_seq;  /* {seq} of its last row, when rows > 0 */
    long long held;      /* SQL_FLOOR_HELD: the lowest failed row; -1: none */
    bool writers_ended;  /* SQL_FLOOR_WRITERS: the writers sent with it have all ended */
    const char *writers; /* and the writers now (text[] literal) */
    long long seq_last;  /* SQL_FLOOR_HELD: the sequence's last value; -1: none yet */
    bool seq_in_order;   /* SQL_FLOOR_HELD: the sequence still has no cache, no cycle */
    unsigned table_node; /* SQL_FLOOR_HELD: the table's relfilenode; 0: not known */
    unsigned seq_node;   /* SQL_FLOOR_HELD: the sequence's relfilenode; 0: not known */
    unsigned seq_oid;    /* SQL_FLOOR_HELD: the sequence's oid; 0: not known */
} FloorClaim;

/* Back to 0, forgetting candidates and the relfilenodes seen (lanes gained, a new connection).
 * Keeps `enabled`, and a hold (its probe then reads from 0 too). */
void floor_reset(ClaimFloor *f);
/* Releases what f owns; f may be reset and used again. */
void floor_free(ClaimFloor *f);
/* The claim's $5 (valid until the next call that changes f): "{0}" while the floor is 0 or off,
 * else {floor, table relfilenode, sequence oid, sequence relfilenode, last value} as the looks
 * saw them (the last value: the highest seen, -1 for none). The claim reads from 0 instead when
 * the table or sequence it finds differs (FLOOR_GUARD in relay/outbox/statements.c). */
const char *floor_param(ClaimFloor *f);
/* The probe's $5 while aggregate types are held: as floor_param, with the floor the hold began
 * at (hold_from), below every held row; "{0}" when none is recorded. */
const char *floor_hold_param(ClaimFloor *f);
/* Types are held out of the claims from now on (a batch's refused types taken in): remembers the
 * floor as the probe's start, unless a hold is on already (the earlier start is lower or equal:
 * the floor only rises, and each restart lowers hold_from with it). Call before the batch's
 * commit: the floor must not have passed the refused rows (a batch with rows left unsent is
 * never committed whole, so it does not move the floor). */
void floor_hold_begin(ClaimFloor *f);
/* Held types were let go (ended: none is held any more): their rows may lie below the floor, so
 * it goes back to where the hold began, and what a claim in flight allowed (on_commit) is
 * dropped. Keeps the candidates: lowering the floor is always safe. */
void floor_hold_release(ClaimFloor *f, bool ended);
/* The writers to ask SQL_FLOOR_WRITERS about, as its $1 (valid until the next change). */
const char *floor_writers_param(const ClaimFloor *f);
/* Takes in what a claim learnt: the floor its commit may bring (floor_commit), a confirmed
 * candidate for the claims after it, a new candidate. When the table's or the sequence's
 * relfilenode differs from the one seen before (both known and not 0: TRUNCATE, TRUNCATE ...
 * RESTART IDENTITY, ALTER SEQUENCE ... RESTART; also VACUUM FULL, CLUSTER and any ALTER
 * SEQUENCE, which cost a restart and nothing else), or the sequence's last value is below the one
 * seen before (setval), new rows may have been drawn below the floor: the floor starts again from
 * 0, forgetting its candidates, and f->restarts counts it. When the sequence no longer hands its
 * values out in order (given a cache, or cycling, while the relay runs), the floor goes back to 0
 * and is turned off (f->enabled false) until the session's check of the table passes again
 * (SQL_FLOOR_CHECK: asked every FLOOR_CHECK_AGAIN_S, engine.h, and at each connection). Returns
 * false when out of memory (the floor then stays where it is, which is always safe). */
bool floor_after_claim(ClaimFloor *f, const FloorClaim *c);
/* The claim's transaction committed with every row of its batch recorded: the floor rises to
 * what floor_after_claim allowed. Returns true when it moved. */
bool floor_commit(ClaimFloor *f);
/* The claim's transaction ended otherwise (rolled back, rows left unrecorded): the floor stays. */
void floor_abandon(ClaimFloor *f);

#endif
