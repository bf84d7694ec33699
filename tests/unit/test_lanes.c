/* Unit tests for lanes_assign: the rendezvous split of lanes among relays. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_lane_has_one_owner),
        cmocka_unit_test(test_single_member_and_outsider),
        cmocka_unit_test(test_three_members_share),
        cmocka_unit_test(test_leaving_member_moves_only_its_lanes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
