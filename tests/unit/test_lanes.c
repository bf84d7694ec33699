/* Unit tests for lanes_assign and lanes_sharing: the rendezvous split of lanes among relays, and
 * which members take part in it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "lanes.h"

/* Every lane has exactly one owner among the members, whatever the member set. */
static void test_each_lane_has_one_owner(void **state)
{
    const int sets[][4] = {{0}, {0, 1}, {3, 7, 9}, {0, 1, 2, 1023}};
    const int sizes[] = {1, 2, 3, 4};
    for (int s = 0; s < 4; s++) {
        int owners[LANE_COUNT] = {0};
        for (int m = 0; m < sizes[s]; m++) {
            bool mine[LANE_COUNT];
            lanes_assign(sets[s], sizes[s], sets[s][m], mine);
            for (int l = 0; l < LANE_COUNT; l++)
                owners[l] += mine[l];
        }
        for (int l = 0; l < LANE_COUNT; l++)
            assert_int_equal(owners[l], 1);
    }
}

/* A lone relay owns everything; a slot that is not a member owns nothing. */
static void test_single_member_and_outsider(void **state)
{
    const int one[] = {5};
    bool mine[LANE_COUNT];
    lanes_assign(one, 1, 5, mine);
    for (int l = 0; l < LANE_COUNT; l++)
        assert_true(mine[l]);
    lanes_assign(one, 1, 6, mine);
    for (int l = 0; l < LANE_COUNT; l++)
        assert_false(mine[l]);
}

/* Three relays each get a fair share (none starved, none with more than half). */
static void test_three_members_share(void **state)
{
    const int members[] = {0, 1, 2};
    for (int m = 0; m < 3; m++) {
        bool mine[LANE_COUNT];
        int count = 0;
        lanes_assign(members, 3, members[m], mine);
        for (int l = 0; l < LANE_COUNT; l++)
            count += mine[l];
        assert_in_range(count, 10, 32);
    }
}

/* When a relay leaves, only its lanes move: the survivors keep every lane they had. */
static void test_leaving_member_moves_only_its_lanes(void **state)
{
    const int before[] = {0, 1, 2};
    const int after[] = {0, 2};
    const int survivors[] = {0, 2};
    for (int s = 0; s < 2; s++) {
        bool had[LANE_COUNT], has[LANE_COUNT];
        lanes_assign(before, 3, survivors[s], had);
        lanes_assign(after, 2, survivors[s], has);
        for (int l = 0; l < LANE_COUNT; l++)
            if (had[l])
                assert_true(has[l]);
    }
}

/* An away member (its relay cannot reach Kafka) shares no lane while another member is healthy;
 * when none is, all share as if none were away: an outage for everyone moves no lane. A member
 * trying again shares beside the healthy ones, and takes no lane from away ones when none is
 * healthy. */
static void test_away_members_share_only_when_all_are(void **state)
{
    const int slots[] = {0, 3, 5};
    int out[3];
    const LaneMark one_away[] = {LANE_MARK_NONE, LANE_MARK_AWAY, LANE_MARK_NONE};
    assert_int_equal(lanes_sharing(slots, one_away, 3, out), 2);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 5);
    bool mine[LANE_COUNT];
    lanes_assign(out, 2, 3, mine);
    for (int l = 0; l < LANE_COUNT; l++)
        assert_false(mine[l]);
    const LaneMark all_away[] = {LANE_MARK_AWAY, LANE_MARK_AWAY, LANE_MARK_AWAY};
    assert_int_equal(lanes_sharing(slots, all_away, 3, out), 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(out[i], slots[i]);
    const LaneMark none_away[] = {LANE_MARK_NONE, LANE_MARK_NONE, LANE_MARK_NONE};
    assert_int_equal(lanes_sharing(slots, none_away, 3, out), 3);
    /* Trying beside a healthy member: both share, the away one does not. */
    const LaneMark trying[] = {LANE_MARK_TRYING, LANE_MARK_AWAY, LANE_MARK_NONE};
    assert_int_equal(lanes_sharing(slots, trying, 3, out), 2);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 5);
    /* Trying while every other member is away: all share (the trial takes only its share). */
    const LaneMark trying_alone[] = {LANE_MARK_TRYING, LANE_MARK_AWAY, LANE_MARK_AWAY};
    assert_int_equal(lanes_sharing(slots, trying_alone, 3, out), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_lane_has_one_owner),
        cmocka_unit_test(test_single_member_and_outsider),
        cmocka_unit_test(test_three_members_share),
        cmocka_unit_test(test_leaving_member_moves_only_its_lanes),
        cmocka_unit_test(test_away_members_share_only_when_all_are),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
