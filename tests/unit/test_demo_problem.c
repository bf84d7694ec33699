/* Unit tests for producer-demo's problem documents (api_problem): whatever the detail holds, the
 * body is a JSON object with the response's own status and title. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "api.h"

/* api_problem's body, parsed; fails the test when it is not a JSON object with type, title,
 * status and detail. */
static json_t *problem(int status, const char *detail)
{
    ApiResponse r = {0};
    api_problem(&r, status, detail);
    assert_int_equal(r.status, status);
    assert_string_equal(r.content_type, "application/problem+json");
    json_error_t jerr;
    json_t *o = json_loads(r.body, 0, &jerr);
    if (!json_is_object(o))
        fail_msg("not a JSON object: %s", r.body);
    api_response_free(&r);
    assert_string_equal(json_string_value(json_object_get(o, "type")), "about:blank");
    assert_int_equal(json_integer_value(json_object_get(o, "status")), status);
    assert_true(json_is_string(json_object_get(o, "detail")));
    return o;
}

static void test_plain_detail(void **state)
{
    json_t *o = problem(404, "no such order");
    assert_string_equal(json_string_value(json_object_get(o, "title")), "Not Found");
    assert_string_equal(json_string_value(json_object_get(o, "detail")), "no such order");
    json_decref(o);
}

static void test_detail_not_utf8_keeps_status_and_title(void **state)
{
    /* A character cut in half (the 422 for an unknown field did that before order.c cut names
     * between characters), a lone continuation byte and an overlong form: each bad byte becomes
     * '?', the rest is kept. Before the fix the body was the fallback
     * {"type":"about:blank","title":"Internal Server Error"} under a 422 status. */
    json_t *o = problem(422, "unknown field \"a\xc3\xa9\xc3\"; \x80 \xc0\xaf");
    assert_string_equal(json_string_value(json_object_get(o, "title")), "Unprocessable Content");
    assert_string_equal(json_string_value(json_object_get(o, "detail")),
                        "unknown field \"a\xc3\xa9?\"; ? ??");
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_detail),
        cmocka_unit_test(test_detail_not_utf8_keeps_status_and_title),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
