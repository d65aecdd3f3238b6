#!/usr/bin/env bash
# A storage error is its own kind, never a device's: 2 ranks of rk train under rk run with
# their --ckpt-dir on a real 5 MB tmpfs (a private mount namespace: unshare -m) that fills up
# at the third checkpoint. rk run stops at once, exit 1, with one line naming the directory
# and "No space left on device"; no relaunch, no quarantine, the run does not end with
# "devices left", and the checkpoints saved before are intact (rk ckpt verify). On a
# read-only tmpfs ("Read-only file system") rk run refuses to start in the same words. Needs root and mounts (skips, 77, otherwise),
# mpirun and Fashion-MNIST.
set -u
command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
command -v unshare >/dev/null || { echo "SKIP: unshare not found (util-linux)"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_need_data
it_init it_storage
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export RUNDIR=$work RK
mnt=$work/mnt
mkdir -p "$mnt"
if ! unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs "$1" && umount "$1"' _ "$mnt" 2>"$work/probe"; then
  echo "SKIP: cannot mount a tmpfs in a private mount namespace here (needs root and" \
    "CAP_SYS_ADMIN): $(head -1 "$work/probe")"
  exit 77
fi

python3 "$RK_SRC/tests/make_subset.py" "$DATA" "$work/sub" 640 100 >/dev/null || { bad "make subset"; exit 1; }
# mlp: a checkpoint is 1.9 MB; 5 MB hold two, the third fills the disk
train=("$RK" train --data "$work/sub" --model mlp --threads 1 --seed 3 --epochs 10
       --max-steps 60 --ckpt-every 10)

# in_tmpfs OPTS NAME: rk run with --ckpt-dir on a fresh tmpfs mounted with OPTS, then rk ckpt
# verify of that directory, inside one private mount namespace (gone when it ends)
in_tmpfs() {
  local opts=$1 name=$2
  unshare -m bash -c '
    mount -t tmpfs -o "$1" tmpfs "$2" || exit 99
    shift 2
    "$@"; st=$?
    echo "rk run exit $st" >"$RUNDIR/run.status"
    "$RK" ckpt verify "$RUNDIR/mnt/ck" >"$RUNDIR/verify.out" 2>&1
    echo "$?" >"$RUNDIR/verify.status"
    exit $st' _ "$opts" "$mnt" \
    "$RK" run -n 2 --ckpt-dir "$mnt/ck" --quiet --failure-threshold 1 --max-restarts 3 \
    --events "$work/$name.ev" --summary-json "$work/$name.sum" -- "${train[@]}" \
    </dev/null >"$work/$name.out" 2>&1
}

# check NAME ERRNO_TEXT: what rk run did about the storage error
check() {
  local name=$1 text=$2 st=$3
  [[ $st == 1 ]] && ok "$name: rk run exits 1" || bad "$name: exit $st: $(grep 'rk run' "$work/$name.out" | tail -4)"
  grep -q "storage error on the checkpoint directory $mnt/ck: .*$text" "$work/$name.out" \
    && ok "$name: one line names the directory and '$text'" \
    || bad "$name: no message naming $mnt/ck and '$text': $(grep 'rk run' "$work/$name.out" | tail -3)"
  grep -qE "relaunch [0-9]|devices? left|quarantined after" "$work/$name.out" \
    && bad "$name: relaunched or quarantined: $(grep 'rk run' "$work/$name.out" | tail -4)" \
    || ok "$name: no relaunch, no quarantine, no 'devices left'"
  python3 - "$work/$name.ev" "$work/$name.sum" <<'PY' && ok "$name: one storage event (stop), counted against no device" || bad "$name: events/summary"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
ev = [e for e in ev if e["kind"] not in ("snapshot_on", "snapshot_held", "snapshot_peak")]  # notes
assert [(e["kind"], e["action"], e["device"]) for e in ev] == [("storage", "stop", None)], ev
s = json.load(open(sys.argv[2]))
assert s["quarantined"] == 0 and s["restarts"] == 0 and s["final_ranks"] == 2, s
assert s["incidents"] == {"storage": 1}, s
PY
}

in_tmpfs size=5m full
st=$?
check full "No space left on device" "$st"
[[ $(cat "$work/verify.status" 2>/dev/null) == 0 ]] \
  && ok "full: the checkpoints saved before the disk filled verify ($(grep -c . "$work/verify.out") lines)" \
  || bad "full: rk ckpt verify: $(cat "$work/verify.out" 2>/dev/null | tail -3)"
[[ $(json "$work/full.sum" steps) == 30 ]] && ok "full: it stopped at the failed save of step 30" \
  || bad "full: steps $(json "$work/full.sum" steps)"

# read-only: rk run cannot even take the directory's writer lock, so it refuses to start
# with the same words, and no job ran (no events, no summary)
in_tmpfs ro,size=1m ro
st=$?
[[ $st == 1 ]] && ok "ro: rk run exits 1" || bad "ro: exit $st: $(grep 'rk run' "$work/ro.out" | tail -4)"
grep -q "storage error on the checkpoint directory $mnt/ck: .*Read-only file system" "$work/ro.out" \
  && ok "ro: one line names the directory and 'Read-only file system'" \
  || bad "ro: no message naming $mnt/ck and 'Read-only file system': $(tail -3 "$work/ro.out")"
[[ ! -s $work/ro.ev && ! -e $work/ro.sum ]] && ok "ro: no job started (no events, no summary)" \
  || bad "ro: a job ran: $(cat "$work/ro.ev" 2>/dev/null | head -3)"

it_finish
