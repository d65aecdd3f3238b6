#!/usr/bin/env bash
# `make install` needs only the build group of scripts/install-deps.sh: cmocka, which only the
# tests use, is a test package, and a build tree configures without it.
# - the build group lists no test package (cmocka, clang-format, prometheus, chromium, torch);
# - with cmocka hidden from pkg-config, RK_TESTS=AUTO (the default) configures, says once that
#   the tests are not built, and the build system has rk and librekindle but no test target;
# - RK_TESTS=ON (make test's) refuses to configure without cmocka, naming it; RK_TESTS=maybe
#   is refused by name.
set -u
. "$(dirname "$0")/itlib.sh"
it_init it_build_groups

groups=$(sed -n '/^group\[build\]=/,/"$/p' "$RK_SRC/scripts/install-deps.sh")
leaked=""
for p in libcmocka-dev clang-format prometheus chromium python3-torch lintian tmux; do
  grep -qw -- "$p" <<<"$groups" && leaked="$leaked $p"
done
if [[ -n $groups && -z $leaked ]]; then ok "the build group lists no test package"
else bad "the build group lists test packages:${leaked:- (group not found)}"; fi

# pkg-config's search path with every .pc file it finds but cmocka's
mkdir -p "$work/pc"
for d in $(pkg-config --variable pc_path pkg-config | tr : ' '); do
  for f in "$d"/*.pc; do
    [[ -e $f && $(basename "$f") != cmocka.pc && ! -e "$work/pc/$(basename "$f")" ]] &&
      ln -s "$f" "$work/pc/"
  done
done
export PKG_CONFIG_LIBDIR=$work/pc
if pkg-config --exists cmocka; then bad "cmocka still visible to pkg-config"; fi

if cmake -S "$RK_SRC" -B "$work/auto" -DCMAKE_BUILD_TYPE=Release >"$work/auto.log" 2>&1; then
  ok "RK_TESTS=AUTO configures without cmocka"
  n=$(grep -c "cmocka not found: the tests are not built" "$work/auto.log")
  [[ $n == 1 ]] && ok "it says once that the tests are not built" ||
    bad "'cmocka not found' said $n times: $(tail -3 "$work/auto.log")"
  targets=$(cmake --build "$work/auto" --target help 2>/dev/null)
  if grep -qw rk <<<"$targets" && grep -qw rekindle <<<"$targets" &&
     ! grep -qE 'test_ckpt|fake_nvml' <<<"$targets"; then
    ok "its build system has rk and librekindle and no test target"
  else bad "targets without cmocka: $(grep -cE 'test_|fake_' <<<"$targets") test targets, rk: $(grep -cw rk <<<"$targets")"; fi
else
  bad "RK_TESTS=AUTO without cmocka failed to configure: $(tail -5 "$work/auto.log")"
fi

if cmake -S "$RK_SRC" -B "$work/on" -DRK_TESTS=ON >"$work/on.log" 2>&1; then
  bad "RK_TESTS=ON configured without cmocka"
else
  grep -q "RK_TESTS=ON needs cmocka" "$work/on.log" && ok "RK_TESTS=ON without cmocka is refused, naming cmocka" ||
    bad "RK_TESTS=ON failed without naming cmocka: $(tail -3 "$work/on.log")"
fi
if cmake -S "$RK_SRC" -B "$work/bad" -DRK_TESTS=maybe >"$work/bad.log" 2>&1; then
  bad "RK_TESTS=maybe configured"
else
  grep -q "RK_TESTS is 'maybe'" "$work/bad.log" && ok "RK_TESTS=maybe is refused by name" ||
    bad "RK_TESTS=maybe failed without naming it: $(tail -3 "$work/bad.log")"
fi
it_finish
