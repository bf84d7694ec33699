/* Unit tests for floor.c: when the claim floor may rise, and when it must stay (floor.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "floor.h"

/* A plain claim that returned rows first..last (none when last < first), with no failed row,
 * whether the writers listed before have ended, the writers now and the sequence's last value. */
static FloorClaim claim(long long first, long long last, bool ended, const char *writers,
                        long long seq_last)
{
    return (FloorClaim){.plain = true,
                        .rows = last >= first ? (int)(last - first + 1) : 0,
                        .last_seq = last,
                        .held = -1,
                        .writers_ended = ended,
                        .writers = writers,
                        .seq_last = seq_last,
                        .seq_in_order = true};
}

static void after_and_commit(ClaimFloor *f, FloorClaim c)
{
    assert_true(floor_after_claim(f, &c));
    floor_commit(f);
}

/* The floor rises one confirmation behind: a candidate after the first claim, confirmed by the
 * second claim's look at the writers, taken by the third claim's commit. */
static void test_rises_after_confirmation(void **state)
{
    ClaimFloor f = {.enabled = true};
    assert_string_equal(floor_param(&f), "{0}");
    after_and_commit(&f, claim(1, 100, true, "{3/7}", 100));
    assert_int_equal(f.floor, 0);
    assert_int_equal(f.candidate, 101);
    assert_string_equal(floor_writers_param(&f), "{3/7}");
    after_and_commit(&f, claim(101, 200, true, "{}", 200));
    assert_int_equal(f.floor, 0); /* confirmed now, for the claims after this one */
    assert_int_equal(f.confirmed, 101);
    after_and_commit(&f, claim(201, 300, true, "{}", 300));
    assert_int_equal(f.floor, 101);
    assert_string_equal(floor_param(&f), "{101,0,0,0,300}");
    floor_free(&f);
}

/* While a writer listed with the candidate has not ended (a transaction that inserted a row and
 * stays open), nothing is confirmed and the floor stays, however many rows go out. */
static void test_open_writer_holds_it(void **state)
{
    ClaimFloor f = {.enabled = true};
    after_and_commit(&f, claim(1, 10, true, "{5/1}", 12));
    for (long long first = 13; first < 10000; first += 100)
        after_and_commit(&f, claim(first, first + 99, false, "{5/1,6/2}", first + 99));
    assert_int_equal(f.floor, 0);
    assert_int_equal(f.confirmed, 0);
    assert_int_equal(f.candidate, 13); /* kept, not replaced by newer ones */
    floor_free(&f);
}

/* The floor never passes a row the claim left out: rows after its last row, or a failed row
 * that holds its aggregate's later events back. */
static void test_never_passes_left_out_rows(void **state)
{
    ClaimFloor f = {.enabled = true};
    after_and_commit(&f, claim(1, 1000, true, "{}", 5000));
    after_and_commit(&f, claim(1001, 2000, true, "{}", 5000));
    assert_int_equal(f.confirmed, 5001);
    /* this claim stopped at 2500 (its limit): the floor goes to 2501, not to 5001 */
    after_and_commit(&f, claim(2001, 2500, true, "{}", 5000));
    assert_int_equal(f.floor, 2501);
    /* a failed row at 2600 holds its aggregate back */
    FloorClaim c = claim(2501, 3000, true, "{}", 5000);
    c.held = 2600;
    after_and_commit(&f, c);
    assert_int_equal(f.floor, 2600);
    /* an empty claim: up to the confirmed candidate */
    after_and_commit(&f, claim(1, 0, true, "{}", 5000));
    assert_int_equal(f.floor, 5001);
    floor_free(&f);
}

/* Candidates come from the sequence's last value, not from the rows: a {seq} given by hand far
 * above the sequence (OVERRIDING SYSTEM VALUE) does not lift the floor over rows drawn later. */
static void test_hand_given_seq_does_not_lift_it(void **state)
{
    ClaimFloor f = {.enabled = true};
    after_and_commit(&f, claim(1000000000000LL, 1000000000000LL, true, "{}", 100));
    after_and_commit(&f, claim(1, 0, true, "{}", 100));
    after_and_commit(&f, claim(1, 0, true, "{}", 100));
    assert_int_equal(f.floor, 101);
    floor_free(&f);
}

/* Only a commit with every row recorded moves it; a claim around locked rows never does; a
 * reset (lanes gained, a new connection) starts again from 0. */
static void test_commit_abandon_reset(void **state)
{
    ClaimFloor f = {.enabled = true};
    after_and_commit(&f, claim(1, 10, true, "{}", 10));
    after_and_commit(&f, claim(11, 20, true, "{}", 20));
    FloorClaim c = claim(21, 30, true, "{}", 30);
    assert_true(floor_after_claim(&f, &c));
    floor_abandon(&f);
    assert_false(floor_commit(&f));
    assert_int_equal(f.floor, 0);
    c = claim(31, 40, true, "{}", 40);
    c.plain = false;
    assert_true(floor_after_claim(&f, &c));
    assert_false(floor_commit(&f));
    c = claim(41, 50, true, "{}", 50);
    assert_true(floor_after_claim(&f, &c));
    assert_true(floor_commit(&f));
    assert_true(f.floor > 0);
    floor_reset(&f);
    assert_true(f.enabled);
    assert_int_equal(f.floor, 0);
    assert_int_equal(f.candidate, 0);
    assert_string_equal(floor_writers_param(&f), "{}");
    f.enabled = false; /* a table whose order column is not drawn in order */
    after_and_commit(&f, claim(1, 10, true, "{}", 10));
    after_and_commit(&f, claim(11, 20, true, "{}", 20));
    after_and_commit(&f, claim(21, 30, true, "{}", 30));
    assert_string_equal(floor_param(&f), "{0}");
    floor_free(&f);
}

/* A sequence set back (TRUNCATE ... RESTART IDENTITY, setval) hands out ids below the floor
 * again: the floor starts again from 0 at the first look that sees it, whether the sequence
 * reads as never used (NULL, -1) or as a lower value, and rises again from there. */
static void test_sequence_set_back(void **state)
{
    ClaimFloor f = {.enabled = true};
    after_and_commit(&f, claim(1, 1000, true, "{}", 1000));
    after_and_commit(&f, claim(1001, 1000, true, "{}", 1000));
    after_and_commit(&f, claim(1001, 1000, true, "{}", 1000));
    assert_int_equal(f.floor, 1001);
    /* RESTART IDENTITY: the sequence reads NULL until its first value is drawn */
    FloorClaim c = claim(1001, 1000, true, "{}", -1);
    assert_true(floor_after_claim(&f, &c));
    assert_false(floor_commit(&f));
    assert_int_equal(f.floor, 0);
    assert_int_equal(f.restarts, 1);
    assert_string_equal(floor_param(&f), "{0}");
    /* ids 1-50 drawn since: the floor rises again, one confirmation behind */
    after_and_commit(&f, claim(1, 50, true, "{}", 50));
    after_and_commit(&f, claim(51, 50, true, "{}", 50));
    after_and_commit(&f, claim(51, 50, true, "{}", 50));
    assert_int_equal(f.floor, 51);
    /* setval to a lower value (not NULL): the same */
    after_and_commit(&f, claim(51, 50, true, "{}", 20));
    assert_int_equal(f.floor, 0);
    assert_int_equal(f.restarts, 2);
    /* the sequence going on as before moves nothing back */
    after_and_commit(&f, claim(21, 30, true, "{}", 30));
    after_and_commit(&f, claim(31, 40, true, "{}", 40));
    assert_int_equal(f.restarts, 2);
    floor_free(&f);
}

/* A claim as claim() makes it, with the relfilenodes its look read. */
static FloorClaim claim_nodes(long long first, long long last, long long seq_last,
                              unsigned table_node, unsigned seq_node)
{
    FloorClaim c = claim(first, last, true, "{}", seq_last);
    c.table_node = table_node;
    c.seq_node = seq_node;
    return c;
}

/* A reset that new rows overtook before the next look: TRUNCATE ... RESTART IDENTITY, then one
 * transaction of more rows than the floor's height. The last value is above the one seen before,
 * so only the new relfilenodes tell; rows 1-1000 (attempts 0) lie below the floor. */
static void test_reset_overtaken(void **state)
{
    ClaimFloor f = {.enabled = true};
    after_and_commit(&f, claim_nodes(1, 1000, 1000, 500, 600));
    after_and_commit(&f, claim_nodes(1001, 1000, 1000, 500, 600));
    after_and_commit(&f, claim_nodes(1001, 1000, 1000, 500, 600));
    assert_int_equal(f.floor, 1001);
    /* TRUNCATE ... RESTART IDENTITY (both replaced) and 3,000 rows: the claim from 1001 finds
     * 1001-2000, and the look says 3000 */
    FloorClaim c = claim_nodes(1001, 2000, 3000, 501, 601);
    assert_true(floor_after_claim(&f, &c));
    assert_false(floor_commit(&f));
    assert_int_equal(f.restarts, 1);
    assert_string_equal(floor_param(&f), "{0}");
    /* the floor rises again from there, and the same relfilenodes restart nothing */
    after_and_commit(&f, claim_nodes(1, 1000, 3000, 501, 601));
    after_and_commit(&f, claim_nodes(2001, 3000, 3000, 501, 601));
    after_and_commit(&f, claim_nodes(3001, 3000, 3000, 501, 601));
    assert_int_equal(f.floor, 3001);
    assert_int_equal(f.restarts, 1);
    /* ALTER SEQUENCE ... RESTART alone (the sequence's relfilenode), overtaken */
    after_and_commit(&f, claim_nodes(3001, 3000, 5000, 501, 602));
    assert_int_equal(f.restarts, 2);
    assert_string_equal(floor_param(&f), "{0}");
    /* plain TRUNCATE (the table's relfilenode): a restart too */
    after_and_commit(&f, claim_nodes(1, 100, 5100, 502, 602));
    assert_int_equal(f.restarts, 3);
    /* 0 is nothing to compare: after a reset (a new connection: other relfilenodes), or not
     * known */
    floor_reset(&f);
    after_and_commit(&f, claim_nodes(1, 10, 5100, 503, 603));
    after_and_commit(&f, claim_nodes(11, 10, 5100, 0, 0));
    assert_int_equal(f.restarts, 0);
    floor_free(&f);
}

/* The claim's $5 carries what the floor was computed against, so that the claim itself reads
 * from 0 when the table or the sequence changed after the last look (FLOOR_GUARD, statements.c):
 * the table's relfilenode, the sequence's oid and relfilenode, and the highest last value seen
 * (not the latest: a lower one is a setval down). */
static void test_param_carries_what_the_floor_saw(void **state)
{
    ClaimFloor f = {.enabled = true};
    FloorClaim c = claim_nodes(1, 1000, 1000, 500, 600);
    c.seq_oid = 700;
    after_and_commit(&f, c);
    assert_string_equal(floor_param(&f), "{0}"); /* no floor: nothing to check */
    c = claim_nodes(1001, 1000, 1200, 500, 600);
    c.seq_oid = 700;
    after_and_commit(&f, c);
    after_and_commit(&f, c);
    assert_int_equal(f.floor, 1001);
    assert_string_equal(floor_param(&f), "{1001,500,700,600,1200}");
    f.enabled = false;
    assert_string_equal(floor_param(&f), "{0}");
    floor_free(&f);
}

/* A sequence given a cache (or a cycle) while the relay runs: a session that cached values
 * inserts rows below the floor later. The floor goes back to 0 and off, and stays off. */
static void test_sequence_out_of_order(void **state)
{
    ClaimFloor f = {.enabled = true};
    after_and_commit(&f, claim(1, 100, true, "{}", 100));
    after_and_commit(&f, claim(101, 100, true, "{}", 100));
    after_and_commit(&f, claim(101, 100, true, "{}", 100));
    assert_int_equal(f.floor, 101);
    FloorClaim c = claim(101, 140, true, "{}", 140);
    c.seq_in_order = false;
    assert_true(floor_after_claim(&f, &c));
    assert_false(floor_commit(&f));
    assert_false(f.enabled);
    assert_string_equal(floor_param(&f), "{0}");
    for (long long first = 141; first < 1000; first += 100)
        after_and_commit(&f, claim(first, first + 99, true, "{}", first + 99));
    assert_string_equal(floor_param(&f), "{0}");
    floor_free(&f);
}

/* A hold (TopicHold) lets the floor rise past the held rows; the probe reads from where it was
 * when the hold began, a release takes the floor back there (dropping what a claim in flight
 * allowed), and a restart of the floor (a sequence set back) takes the hold's start to 0. */
static void test_hold_start_and_release(void **state)
{
    ClaimFloor f = {.enabled = true};
    after_and_commit(&f, claim(1, 100, true, "{}", 100));
    after_and_commit(&f, claim(101, 200, true, "{}", 200));
    after_and_commit(&f, claim(201, 300, true, "{}", 300));
    assert_int_equal(f.floor, 101);
    floor_hold_begin(&f);
    after_and_commit(&f, claim(301, 400, true, "{}", 400));
    floor_hold_begin(&f); /* another type: the start stays */
    assert_int_equal(f.floor, 201);
    assert_string_equal(floor_hold_param(&f), "{101,0,0,0,400}");
    FloorClaim c = claim(401, 500, true, "{}", 500);
    assert_true(floor_after_claim(&f, &c));
    floor_hold_release(&f, false);  /* one type let go, one still held */
    assert_false(floor_commit(&f)); /* what the claim allowed is dropped */
    assert_int_equal(f.floor, 101);
    after_and_commit(&f, claim(101, 600, true, "{}", 600));
    assert_int_equal(f.floor, 401); /* rises again */
    assert_true(f.holding);
    FloorClaim back = claim(1, 0, true, "{}", 5); /* setval down: the floor restarts */
    assert_true(floor_after_claim(&f, &back));
    assert_int_equal(f.floor, 0);
    assert_string_equal(floor_hold_param(&f), "{0}");
    floor_hold_release(&f, true);
    assert_false(f.holding);
    assert_int_equal(f.floor, 0);
    floor_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rises_after_confirmation),
        cmocka_unit_test(test_open_writer_holds_it),
        cmocka_unit_test(test_never_passes_left_out_rows),
        cmocka_unit_test(test_hold_start_and_release),
        cmocka_unit_test(test_hand_given_seq_does_not_lift_it),
        cmocka_unit_test(test_commit_abandon_reset),
        cmocka_unit_test(test_sequence_set_back),
        cmocka_unit_test(test_reset_overtaken),
        cmocka_unit_test(test_param_carries_what_the_floor_saw),
        cmocka_unit_test(test_sequence_out_of_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
