#!/usr/bin/env bash
# make build's front end to CMake: configures and builds BUILD_DIR with the full output of
# both going to BUILD_DIR/build.log, and prints only its progress: a line when it configures,
# a counter redrawn in place on a terminal, a closing line with what it compiled. When a step
# fails it shows the end of the log (the compiler's errors are there) and names the log.
#   scripts/quiet-build.sh BUILD_DIR [CMAKE_CONFIGURE_ARGUMENT...]
#   JOBS=N   parallel jobs (default: nproc);  V=1   the full output instead, as before
#   RK_TARGETS="a b"   build only these targets (default: all)
# Exit status: CMake's (0 built; non-zero: configuring or building failed).
set -uo pipefail
if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
  sed -n '2,9s/^# \{0,1\}//p' "$0"
  [[ $# -ge 1 ]] && exit 0
  exit 2
fi
build=$1
shift
jobs=${JOBS:-$(nproc)}
targets=()
[[ -z ${RK_TARGETS:-} ]] || read -r -a targets <<<"--target $RK_TARGETS"
if [[ ${V:-0} != 0 ]]; then
  cmake -S . -B "$build" "$@" && exec cmake --build "$build" -j "$jobs" "${targets[@]}"
fi
mkdir -p "$build" || exit
log=$build/build.log
start=$SECONDS
tty=0
[[ -t 1 && ${TERM:-dumb} != dumb ]] && tty=1

failed() {
  ((tty)) && printf '\n'
  echo "build: $1 failed; the last 40 lines of its log:" >&2
  tail -n 40 "$log" >&2
  echo "build: $1 failed (exit status $2); full log: $log" >&2
  exit "$2"
}

echo "build: configuring $build (full log: $log)"
cmake -S . -B "$build" "$@" >"$log" 2>&1 || failed configuring $?

compiled=0 linked=0 pct=0
while IFS= read -r line; do
  printf '%s\n' "$line" >>"$log"
  case $line in
    *"Building C object"*) compiled=$((compiled + 1)) ;;
    *"Linking C"*) linked=$((linked + 1)) ;;
  esac
  if [[ $line =~ ^\[\ *([0-9]+)%\] ]] && ((BASH_REMATCH[1] > pct)); then
    pct=${BASH_REMATCH[1]}
    ((tty)) && printf '\rbuild: %3d%% (%d compiled, %d linked)' "$pct" "$compiled" "$linked"
  fi
done < <(cmake --build "$build" -j "$jobs" "${targets[@]}" 2>&1; echo "__rk_build_status $?")
# the build's status travels as the last line (a process substitution has no PIPESTATUS)
status=$(tail -n 1 "$log" | sed -n 's/^__rk_build_status //p')
sed -i '$d' "$log"
[[ ${status:-1} == 0 ]] || failed building "${status:-1}"
((tty)) && printf '\r\033[K'
echo "build: done in $((SECONDS - start)) s: $compiled file(s) compiled, $linked target(s) linked"
