# Shared by the integration tests (tests/it_*.sh; this file is not one: no it_ prefix),
# sourced after `set -u`:
#   it_init NAME      check RK, RK_SRC, RK_TMP; make $work (removed on exit, with any pid in $pids
#                     and after each command in $atexit; kept in $RK_KEEP_FAILED when set and a
#                     check failed)
#   it_need_data      skip (exit 77) when Fashion-MNIST is not in $DATA
#   ok / bad MSG      count a check; it_finish prints "N passed, N failed" and sets the status
#   it_count CMD...   run CMD (a checker script); each "ok - MSG" / "FAIL - MSG" line it prints
#                     counts as ok / bad here, other lines are shown
#   json FILE KEY     one key of a JSON file
#   mpi               mpirun argv for this sandbox: as root, more ranks than cores, shared memory
#   start NAME ARGS   rk exporter ARGS in the background until it serves: sets $pid and $addr
#   rank_pid SUP R SCRIPT  the pid of rank R's process running SCRIPT under the rk run SUP, found
#                     in the kernel's process tree (never a pid a worker reported)
RK=${RK:?} RK_SRC=${RK_SRC:?} RK_TMP=${RK_TMP:?}
DATA=${RK_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
pass=0 fail=0
pids=()
atexit=()
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
     --mca btl_vader_single_copy_mechanism none)

it_init() {
  work=$(mktemp -d "$RK_TMP/$1.XXXXXX")
  # RK_KEEP_FAILED=DIR: a test that failed leaves its files in DIR/NAME.XXXXXX to look at
  trap 'for c in "${atexit[@]}"; do eval "$c"; done
        for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
        if ((fail)) && [[ -n ${RK_KEEP_FAILED:-} ]]; then mkdir -p "$RK_KEEP_FAILED" && cp -a "$work" "$RK_KEEP_FAILED/"; fi
        rm -rf "$work"' EXIT
}

it_need_data() {
  if [[ ! -e "$DATA/train-images-idx3-ubyte.gz" && ! -e "$DATA/train-images-idx3-ubyte" ]]; then
    echo "SKIP: Fashion-MNIST not found in $DATA (install dataset-fashion-mnist)"
    exit 77
  fi
}

ok() { echo "ok - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1"; fail=$((fail + 1)); }
# Run a checker, counting its "ok - " and "FAIL - " lines; a checker that exits non-zero (a
# traceback before any FAIL line) is a failure too.
it_count() {
  local line out rc
  out=$(mktemp)
  "$@" >"$out" 2>&1
  rc=$?
  while IFS= read -r line; do
    case $line in
      "ok - "*) ok "${line#ok - }" ;;
      "FAIL - "*) bad "${line#FAIL - }" ;;
      *) echo "$line" ;;
    esac
  done <"$out"
  rm -f "$out"
  [[ $rc == 0 ]] || bad "checker ${*:1:2} exited with status $rc"
}
json() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

# start NAME ARGS...: run `rk exporter ARGS` in the background (stdout $work/NAME.out, stderr
# $work/NAME.err), wait up to 10 s for its "serving http://ADDR/metrics" line; sets $pid (also
# appended to $pids, which it_init's cleanup stops) and $addr. Status 1 if it never served.
start() {
  local name=$1; shift
  "$RK" exporter "$@" >"$work/$name.out" 2>"$work/$name.err" &
  pid=$!
  pids+=("$pid")
  addr=
  for _ in $(seq 1 100); do
    addr=$(sed -n 's|.*serving http://\([^/]*\)/metrics.*|\1|p' "$work/$name.out")
    [[ -n $addr ]] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}

it_finish() {
  echo "$pass passed, $fail failed"
  [[ $fail -eq 0 ]]
}

# descendants PID: every process below PID, by the kernel's process tree
descendants() {
  local frontier=("$1") p c
  while ((${#frontier[@]})); do
    p=${frontier[0]}
    frontier=("${frontier[@]:1}")
    for c in $(ps -o pid= --ppid "$p"); do
      echo "$c"
      frontier+=("$c")
    done
  done
}
# rank_pid SUPERVISOR RANK SCRIPT: the pid of that rank's process running SCRIPT under rk run
# (descendants lists a rank before its DataLoader workers, which have its command line too)
rank_pid() {
  local p
  for p in $(descendants "$1"); do
    tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null | grep -q "$3" || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return 0; }
  done
  return 1
}
