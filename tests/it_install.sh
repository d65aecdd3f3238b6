#!/usr/bin/env bash
# `make install` gives a library user exactly librekindle's API, and it works:
# - cmake --install into a scratch prefix installs rk, librekindle.so, the headers, rekindle.pc;
# - every installed header compiles on its own;
# - librekindle.so exports (nm -D --defined-only) exactly the functions and variables that the
#   installed headers declare, each declared with RK_API: nothing is missing, no internal
#   (rk_msg_*, rk_sim_*, rk_comm_mpi_ops, ...) leaks out. tests/api_symbols.py lists the
#   declarations from clang's AST of the installed headers;
# - a C file that includes every installed header and takes the address of every declared
#   symbol compiles with -Wall -Wextra -Wpedantic -Werror and links with nothing but
#   `pkg-config --cflags --libs rekindle`, and so does a small user program, which runs.
set -u
. "$(dirname "$0")/itlib.sh"
RK_BUILD=${RK_BUILD:?}
it_init it_install
cflags=(-std=c17 -Wall -Wextra -Wpedantic -Werror)

if ! cmake --install "$RK_BUILD" --prefix "$work/prefix" >"$work/install.log" 2>&1; then
  bad "cmake --install: $(tail -3 "$work/install.log")"
  it_finish
  exit
fi
pc=$(find "$work/prefix" -name rekindle.pc | head -1)
so=$(find "$work/prefix" -name librekindle.so | head -1)
inc=$work/prefix/include
if [[ -n "$pc" && -n "$so" && -x "$work/prefix/bin/rk" ]] && ls "$inc"/rekindle/*.h >/dev/null 2>&1
then ok "installed: bin/rk, $(basename "$so"), include/rekindle/ ($(ls "$inc"/rekindle/*.h | wc -l) headers), rekindle.pc"
else
  bad "install incomplete: rk, librekindle.so, headers or rekindle.pc missing under $work/prefix"
  it_finish
  exit
fi
# The .pc file finds its prefix from where it lies: no editing after a relocated install.
export PKG_CONFIG_PATH=$(dirname "$pc")
if [[ $(cd "$(pkg-config --variable=includedir rekindle)" 2>/dev/null && pwd -P) == \
      $(cd "$inc" && pwd -P) ]]
then ok "rekindle.pc points into the prefix it was installed to"
else bad "rekindle.pc includedir $(pkg-config --variable=includedir rekindle) is not $inc"; fi
# shellcheck disable=SC2207
pcflags=($(pkg-config --cflags --libs rekindle))

# Headers of the source tree that are not installed (they belong to libraries that are not).
notinst=""
for h in "$RK_SRC"/include/rekindle/*.h; do
  [[ -e "$inc/rekindle/$(basename "$h")" ]] || notinst="$notinst $(basename "$h")"
done
[[ -z "$notinst" ]] || echo "note: include/rekindle/ headers not installed:$notinst"

# Each installed header on its own.
alone_bad=""
for h in "$inc"/rekindle/*.h; do
  # (the typedef: a header of macros only would leave ISO C an empty translation unit)
  printf '#include "rekindle/%s"\ntypedef int it_nonempty;\n' "$(basename "$h")" >"$work/alone.c"
  cc "${cflags[@]}" -I"$inc" -fsyntax-only "$work/alone.c" >"$work/alone.log" 2>&1 ||
    alone_bad="$alone_bad $(basename "$h")"
done
if [[ -z "$alone_bad" ]]; then ok "every installed header compiles on its own"
else bad "headers that do not compile on their own:$alone_bad"; fi

# Declared (from the installed headers) against exported (from the installed library).
if ! python3 "$RK_SRC/tests/api_symbols.py" "$inc" 2>"$work/api.err" | sort -u >"$work/decls"
then
  bad "listing the installed declarations: $(tail -3 "$work/api.err")"
  it_finish
  exit
fi
awk '{print $1}' "$work/decls" | sort -u >"$work/declared"
nm -D --defined-only "$so" | awk '{print $NF}' | sort -u >"$work/exported"
unmarked=$(awk '$4 == "no" {printf " %s (%s)", $1, $3}' "$work/decls")
missing=$(comm -23 "$work/declared" "$work/exported" | tr '\n' ' ')
extra=$(comm -13 "$work/declared" "$work/exported" | tr '\n' ' ')
if [[ -z "$unmarked" ]]; then ok "every one of the $(wc -l <"$work/declared") declarations carries RK_API"
else bad "declared without RK_API:$unmarked"; fi
if [[ -z "$missing" ]]; then ok "every declared symbol is exported"
else bad "declared but not exported by $(basename "$so"): $missing"; fi
if [[ -z "$extra" ]]; then ok "librekindle.so exports nothing else ($(wc -l <"$work/exported") symbols)"
else bad "exported but not declared by an installed header: $extra"; fi

# Every installed header in one file, every declared symbol referenced: links only if the
# library defines each one.
{
  for h in "$inc"/rekindle/*.h; do printf '#include "rekindle/%s"\n' "$(basename "$h")"; done
  echo '#include <stdio.h>'
  echo 'typedef void (*any_fn)(void);'
  echo 'static any_fn const fns[] = {'
  awk '$2 == "function" {printf "    (any_fn)%s,\n", $1}' "$work/decls"
  echo '    NULL};'
  echo 'static const void *const vars[] = {'
  awk '$2 == "variable" {printf "    (const void *)&%s,\n", $1}' "$work/decls"
  echo '    NULL};'
  echo 'int main(void)'
  echo '{'
  echo '    printf("%zu %zu\n", sizeof fns / sizeof fns[0] - 1, sizeof vars / sizeof vars[0] - 1);'
  echo '    return 0;'
  echo '}'
} >"$work/all.c"
nfn=$(awk '$2 == "function"' "$work/decls" | wc -l)
nvar=$(awk '$2 == "variable"' "$work/decls" | wc -l)
if cc "${cflags[@]}" "$work/all.c" -o "$work/all" "${pcflags[@]}" >"$work/all.log" 2>&1; then
  out=$(LD_LIBRARY_PATH=$(pkg-config --variable=libdir rekindle) "$work/all" 2>&1)
  if [[ "$out" == "$nfn $nvar" ]]; then
    ok "every installed header in one file, $nfn functions and $nvar variables, links with pkg-config rekindle"
  else bad "the all-headers program printed '$out', expected '$nfn $nvar'"; fi
else
  bad "all headers and symbols against pkg-config rekindle: $(head -5 "$work/all.log")"
fi

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
    if (argc != 2 || rk_st_write(argv[1], &e, 1, NULL, &err)) {
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
if cc "${cflags[@]}" "$work/user.c" -o "$work/user" "${pcflags[@]}" >"$work/cc.log" 2>&1; then
  out=$(LD_LIBRARY_PATH=$(pkg-config --variable=libdir rekindle) "$work/user" "$work/t.safetensors" 2>&1)
  if [[ "$out" == "roundtrip-ok malformed input" ]]; then
    ok "a user program built with pkg-config rekindle runs (safetensors round trip)"
  else bad "the user program printed: $out"; fi
else
  bad "compiling a user program against pkg-config rekindle: $(head -5 "$work/cc.log")"
fi
it_finish
