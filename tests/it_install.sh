#!/usr/bin/env bash
# `make install` works for a library user: install the build into a scratch prefix, then
# compile and run a small C program against librekindle using only `pkg-config rekindle`.
set -u
RK_BUILD=${RK_BUILD:?} RK_TMP=${RK_TMP:?}
work=$(mktemp -d "$RK_TMP/it_install.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL - $1"; echo "0 passed, 1 failed"; exit 1; }

cmake --install "$RK_BUILD" --prefix "$work/prefix" >"$work/install.log" 2>&1 ||
  fail "cmake --install: $(tail -3 "$work/install.log")"
pc=$(find "$work/prefix" -name rekindle.pc | head -1)
[[ -n "$pc" ]] || fail "no rekindle.pc installed"
[[ -x "$work/prefix/bin/rk" ]] || fail "rk not installed"
export PKG_CONFIG_PATH=$(dirname "$pc")
# The .pc file carries the build-time prefix; point it at the scratch prefix.
sed -i "s|^prefix=.*|prefix=$work/prefix|" "$pc"

cat >"$work/user.c" <<'C'
#include <rekindle/error.h>
#include <rekindle/rng.h>
#include <rekindle/safetensors.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
    rk_rng r;
    rk_rng_seed(&r, 1);
    float w[6];
    for (int i = 0; i < 6; i++)
        w[i] = rk_rng_uniform(&r);
    int64_t shape[2] = {2, 3};
    rk_st_entry e = {.name = "w", .data = w, .ndim = 2, .shape = shape, .dtype = "F32"};
    rk_err err = {0};
    if (rk_st_write(argv[1], &e, 1, NULL, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    rk_st_file f;
    if (rk_st_read(argv[1], &f, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const rk_st_tensor *t = rk_st_find(&f, "w");
    int same = t && t->nbytes == sizeof w && memcmp(t->data, w, sizeof w) == 0;
    rk_st_free(&f);
    printf("%s %s\n", same ? "roundtrip-ok" : "roundtrip-bad", rk_strerror(RK_EFORMAT));
    return same ? 0 : 1;
}
C
# shellcheck disable=SC2046
cc -std=c17 -Wall -Werror "$work/user.c" -o "$work/user" $(pkg-config --cflags --libs rekindle) \
  >"$work/cc.log" 2>&1 || fail "compiling against pkg-config rekindle: $(cat "$work/cc.log")"
out=$(LD_LIBRARY_PATH=$(pkg-config --variable=libdir rekindle) "$work/user" "$work/t.safetensors") ||
  fail "running the user program: $out"
[[ "$out" == "roundtrip-ok malformed input" ]] || fail "unexpected output: $out"
echo "ok - installed library, headers and rekindle.pc build and run a user program"
echo "1 passed, 0 failed"
