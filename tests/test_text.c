/*
 * base/text.h and base/bytes.h: the one UTF-8 decoder accepts exactly the well-formed
 * sequences of the Unicode standard's table (checked here against an independent decoder
 * over every 1-, 2- and 3-byte sequence and the 4-byte edges); the cleaning rule turns C0,
 * DEL, C1 and each byte that is not UTF-8 into one '?' and cuts between characters; the
 * message sanitiser adds "..." only when the text does not fit; little-endian loads and
 * stores round-trip and have the documented byte order.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "base/bytes.h"
#include "base/text.h"

/* Independent reference: decode by the definition (lengths by lead byte, then reject
 * overlong, surrogates and > U+10FFFF by value). */
static size_t ref_len(const unsigned char *p, size_t avail)
{
    unsigned c = p[0];
    size_t n = c < 0x80             ? 1
               : (c & 0xe0) == 0xc0 ? 2
               : (c & 0xf0) == 0xe0 ? 3
               : (c & 0xf8) == 0xf0 ? 4
                                    : 0;
    if (n == 0 || n > avail)
        return 0;
    uint32_t v = n == 1 ? c : c & (0xffu >> (n + 1));
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        v = v << 6 | (p[i] & 0x3fu);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    return n;
}

static void decoder_matches_the_definition(void **state)
{
    (void)state;
    unsigned char b[4];
    for (unsigned x = 0; x < 0x1000000u; x++) { /* every 3-byte prefix */
        b[0] = (unsigned char)(x >> 16), b[1] = (unsigned char)(x >> 8), b[2] = (unsigned char)x;
        b[3] = 0x80;
        for (size_t avail = 1; avail <= 3; avail++) {
            size_t want = ref_len(b, avail), got = rk_utf8_next(b, avail, NULL);
            if (want != got)
                fail_msg("%02x %02x %02x (avail %zu): %zu, want %zu", b[0], b[1], b[2], avail, got,
                         want);
        }
        if (b[0] >= 0xf0 && b[0] <= 0xf7) { /* the 4-byte forms, with a continuation last */
            size_t want = ref_len(b, 4), got = rk_utf8_next(b, 4, NULL);
            if (want != got)
                fail_msg("%02x %02x %02x 80: %zu, want %zu", b[0], b[1], b[2], got, want);
        }
    }
    uint32_t cp = 0;
    assert_int_equal(rk_utf8_next("\xf4\x8f\xbf\xbf", 4, &cp), 4);
    assert_int_equal(cp, 0x10ffff);
    assert_int_equal(rk_utf8_next("\xc3\xa9", 2, &cp), 2);
    assert_int_equal(cp, 0xe9);
    assert_int_equal(rk_utf8_next("\xe2\x82", 4, NULL), 0); /* stops at the NUL */
    assert_int_equal(rk_utf8_bad_at("ab\xc3\xa9\xff", 5), 4);
    assert_true(rk_utf8_valid("\xe2\x82\xac", 3));
    assert_false(rk_utf8_valid("\xed\xa0\x80", 3));
}

static void control_characters_are_c0_del_and_c1(void **state)
{
    (void)state;
    for (uint32_t c = 0; c < 0x200; c++)
        assert_int_equal(rk_text_is_control(c), c < 0x20 || (c >= 0x7f && c <= 0x9f));
    assert_true(rk_text_ok("caf\xc3\xa9 ok", 8));
    assert_false(rk_text_ok("a\xc2\x85", 3)); /* NEL, a C1 control */
    assert_false(rk_text_ok("a\tb", 3));
}

static void clean_replaces_and_cuts_between_characters(void **state)
{
    (void)state;
    char d[64];
    const char *s = "a\nb\tc\x01"
                    "d\x7f"
                    "e\xc2\x85"
                    "f\xff"
                    "g\xe2\x82"
                    "h\xed\xa0\x80"
                    "i";
    assert_int_equal(rk_text_clean(d, sizeof d, s), strlen(s));
    assert_string_equal(d, "a?b?c?d?e?f?g??h???i");
    /* "x\xc3\xa9y" in 3 bytes of room: the 2-byte character does not fit, the cut is before it */
    assert_int_equal(rk_text_clean(d, 3, "x\xc3\xa9y"), 1);
    assert_string_equal(d, "x");
    assert_int_equal(rk_text_clean(d, 4, "x\xc3\xa9y"), 3);
    assert_string_equal(d, "x\xc3\xa9");
}

static void show_adds_dots_only_when_cut(void **state)
{
    (void)state;
    char d[8];
    assert_string_equal(rk_msg_show(d, sizeof d, "1234567"), "1234567"); /* fits exactly */
    assert_string_equal(rk_msg_show(d, sizeof d, "12345678"), "1234...");
    assert_string_equal(rk_msg_show(d, sizeof d, "123\xc3\xa9xyz"), "123...");
    assert_string_equal(rk_msg_show(d, sizeof d, "a\xff\x1b[2J"), "a??[2J");
    assert_string_equal(rk_msg_show(d, sizeof d,
                                    "\xc2\x9b"
                                    "31m"),
                        "?31m"); /* CSI as a C1 character */
}

static void hex_decodes_both_cases_and_names_the_bad_character(void **state)
{
    (void)state;
    uint8_t out[4] = {0};
    assert_int_equal(rk_hex_decode("00fFa9B1", 4, out), -1);
    assert_int_equal(out[0], 0x00);
    assert_int_equal(out[1], 0xff);
    assert_int_equal(out[2], 0xa9);
    assert_int_equal(out[3], 0xb1);
    assert_int_equal(rk_hex_decode("0g", 1, out), 1);
    assert_int_equal(rk_hex_decode("x0", 1, out), 0);
    assert_int_equal(rk_hex_decode("0011 2", 3, out), 4);
    assert_int_equal(rk_hex_decode("", 0, out), -1);
}

static void little_endian_round_trips(void **state)
{
    (void)state;
    uint8_t b[8];
    rk_le64_store(b, 0x0102030405060708ull);
    static const uint8_t want[8] = {8, 7, 6, 5, 4, 3, 2, 1};
    assert_memory_equal(b, want, 8);
    assert_int_equal(rk_le64_load(b), 0x0102030405060708ull);
    assert_int_equal(rk_le32_load(b + 1), 0x04050607u);
    assert_int_equal(rk_le16_load(b + 6), 0x0102u);
    rk_le32_store(b, 0xdeadbeefu);
    assert_int_equal(rk_le32_load(b), 0xdeadbeefu);
    rk_le16_store(b, 0xbeefu);
    assert_int_equal(b[0], 0xef);
    assert_int_equal(b[1], 0xbe);
}

static void list_item_reads_one_item_or_none(void **state)
{
    (void)state;
    char out[8];
    assert_int_equal(rk_text_list_item("0,h1:2,7", 1, out, sizeof out), 1);
    assert_string_equal(out, "h1:2");
    assert_int_equal(rk_text_list_item("0,h1:2,7", 2, out, sizeof out), 1);
    assert_string_equal(out, "7");
    assert_int_equal(rk_text_list_item("0,h1:2,7", 3, out, sizeof out), 0); /* no such item */
    assert_string_equal(out, "");
    assert_int_equal(rk_text_list_item("0,,7", 1, out, sizeof out), 0);        /* empty */
    assert_int_equal(rk_text_list_item("0,123456789", 1, out, sizeof out), 0); /* too long */
    assert_string_equal(out, "");
    assert_int_equal(rk_text_list_item("0,", 1, out, sizeof out), 0);
    assert_int_equal(rk_text_list_item(NULL, 0, out, sizeof out), 0);
    assert_int_equal(rk_text_list_item("a", -1, out, sizeof out), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decoder_matches_the_definition),
        cmocka_unit_test(control_characters_are_c0_del_and_c1),
        cmocka_unit_test(clean_replaces_and_cuts_between_characters),
        cmocka_unit_test(show_adds_dots_only_when_cut),
        cmocka_unit_test(little_endian_round_trips),
        cmocka_unit_test(hex_decodes_both_cases_and_names_the_bad_character),
        cmocka_unit_test(list_item_reads_one_item_or_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
