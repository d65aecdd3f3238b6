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
#   wait_for COND S   until the shell condition COND holds (eval), S seconds at most: 0, else 1
#   it_collected ADDR N  wait until the exporter at ADDR has made N collections
#   it_nobody_dir [--suid]  make $nobody_dir for steps run as another user (see below)
#   as_nobody CMD...  run CMD as user nobody, the clone and build tree hidden from it
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

# wait_for COND SECONDS: poll the shell condition COND (eval'd) every 50 ms until it holds (0)
# or SECONDS have passed (1): how a test waits for a signal the program gives
wait_for() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do eval "$1" && return 0; sleep 0.05; done
  return 1
}

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

# it_collected ADDR N [SECONDS]: wait (30 s unless told) until the exporter at ADDR reports N
# collections or more (rk_exporter_collections_total): what a check of re-reads waits for.
it_collected() {
  local i n
  for ((i = 0; i < ${3:-30} * 10; i++)); do
    n=$(python3 -c "import urllib.request,sys
for l in urllib.request.urlopen('http://$1/metrics', timeout=5).read().decode().splitlines():
    if l.startswith('rk_exporter_collections_total '): print(int(float(l.split()[1])))" 2>/dev/null)
    [[ -n $n ]] && ((n >= $2)) && return 0
    sleep 0.1
  done
  return 1
}

# A step run as another user (nobody, uid and gid 65534, through setpriv) cannot reach the
# clone when it lies under a 0700 home (/root, a private $HOME): everything such a step
# executes or reads (a copy of rk, a set-user-ID copy, scripts, data) goes in $nobody_dir.
#
# it_nobody_dir [--suid]: make $nobody_dir, a fresh directory (0755, removed on exit) under
# $TMPDIR or /tmp (else /var/tmp, /dev/shm) that nobody can reach; with --suid on a
# filesystem mounted without nosuid. Status 1 with a "skip - ..." line saying why when it
# cannot: not root, no setpriv, no such directory.
it_nobody_dir() {
  local d base
  nobody_dir=
  if [[ $(id -u) != 0 ]] || ! command -v setpriv >/dev/null; then
    echo "skip - a step as another user needs root and setpriv (util-linux)"
    return 1
  fi
  for base in "${TMPDIR:-/tmp}" /tmp /var/tmp /dev/shm; do
    [[ -d $base ]] || continue
    if [[ ${1-} == --suid ]] && findmnt -n -o OPTIONS --target "$base" 2>/dev/null | grep -qw nosuid; then
      continue
    fi
    d=$(mktemp -d "$base/rk-nobody.XXXXXX") || continue
    atexit+=("rm -rf $(printf %q "$d")")
    chmod 0755 "$d"
    if setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$d" 2>/dev/null; then
      nobody_dir=$d
      unshare -m true 2>/dev/null ||
        echo "# unshare -m is not permitted here: as_nobody runs without hiding the clone"
      return 0
    fi
  done
  echo "skip - no directory that user nobody can reach${1:+ on a filesystem that honours set-user-ID}" \
    "(tried \$TMPDIR, /tmp, /var/tmp, /dev/shm)"
  return 1
}

# as_nobody CMD...: run CMD as nobody in $nobody_dir. In a mount namespace of its own (where
# unshare -m works) an empty 0700 directory covers the source tree, the build tree and $RK_TMP,
# as a 0700 home covers a clone: a step that still reaches into them fails in every checkout,
# not only in a newcomer's. (setpriv keeps its capabilities until it executes CMD, so even a
# CMD inside a 0700 directory starts; what it then opens there is refused.)
as_nobody() {
  local drop=(setpriv --reuid=65534 --regid=65534 --clear-groups) hide=() trees p q
  # the trees, outermost first, each once: one inside another is covered with it
  # (rk's own directory unless it is a system one: RK=/usr/bin/rk must not hide setpriv)
  q=$(dirname "$(realpath "$RK")")
  [[ $q == /usr/* || $q == /bin || $q == /sbin ]] && q=
  mapfile -t trees < <(for q in "$RK_SRC" "$q" "${RK_BUILD:-}" "$RK_TMP"; do
    [[ -n $q && -d $q ]] && realpath "$q"; done | awk '{ print length($0) "\t" $0 }' | sort -n | cut -f2-)
  for p in "${trees[@]}"; do
    for q in "${hide[@]}"; do [[ $p/ == "$q"/* ]] && continue 2; done
    # never over $nobody_dir itself (RK_TMP=/tmp), nor over /
    [[ $p != / && $(realpath "$nobody_dir")/ != "$p"/* ]] && hide+=("$p")
  done
  if ((${#hide[@]})) && unshare -m true 2>/dev/null; then # else said by it_nobody_dir
    (cd "$nobody_dir" && exec unshare -m --propagation private -- bash -c \
      'n=$1; shift; for p in "${@:1:n}"; do mount -t tmpfs -o mode=0700,size=4k rk-hidden "$p" || exit 125; done
       shift "$n"; exec "$@"' \
      as_nobody "${#hide[@]}" "${hide[@]}" "${drop[@]}" "$@")
  else
    (cd "$nobody_dir" && exec "${drop[@]}" "$@")
  fi
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
    # RANK as the local launcher or an exec'd worker has it; OMPI_COMM_WORLD_RANK under mpirun,
    # where rk _rank-env runs rk train in its own process: /proc/PID/environ is the one the
    # process was exec'd with, before _rank-env set RANK
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxE "(OMPI_COMM_WORLD_)?RANK=$2" \
      && { echo "$p"; return 0; }
  done
  return 1
}
