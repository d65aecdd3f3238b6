#!/usr/bin/env bash
# The ranks get stdin, stdout and stderr from rk run and no other descriptor, under every
# launcher; no process but rk run (and its keeper, a fork of it) holds its --events, --steps
# and --gate-log files (issue 30: the ranks, and with --hosts the agents and the rsh
# processes, held them open for writing: fopen "a" without close-on-exec). A rank of
# tests/fds_worker.py lists its own /proc/self/fd, and every process on the machine that holds
# one of the three files, as soon as it starts, under (a) --launcher local, (b) mpirun
# (skipped without it), (c) --hosts 127.0.0.1:1,127.0.0.2:1: two agents on this host started
# by an --rsh that runs the command here (sh -c), the agents starting the ranks (c2: with a
# descriptor of rk run's caller that none of them may get), (d) srun in
# an allocation of the Slurm test rig (tests/slurm/rig; skipped without root or Slurm); and
# (e) under local, a descriptor rk run itself inherited (fd 7) does not reach the rank either.
# Each rank also reads its ancestors that are rk (rk run, the keepers, the agents): none holds
# a descriptor above 2 without close-on-exec, which the next program it starts would inherit.
# rk run is started with no descriptor above 2 (whatever ctest or a shell left open would
# reach the ranks through it, as any inherited descriptor does: not rk's to close). The check
# sees rk run itself hold each file (else it could not fail). Skips (77) without python3.
set -u
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_fds
# the interpreter itself: a wrapper script (pyenv's shim) holds descriptors of its own
py=$(python3 -c 'import sys; print(sys.executable)')

# clean CMD...: CMD with every descriptor above 2 of this shell closed
clean() {
  (
    for f in /proc/$BASHPID/fd/*; do
      n=${f##*/}
      ((n > 2)) && eval "exec $n>&-"
    done
    exec "$@"
  )
}

# run NAME RANKS RK-RUN-ARGS...: rk run with the three files under $work/NAME, the worker
# told to watch them; its output in $work/NAME.out, its status in $st
run() {
  local name=$1 n=$2
  shift 2
  local d=$work/$name
  mkdir -p "$d"
  clean timeout 120 "$@" --health sim --quiet --events "$d/events" --steps "$d/steps" \
    --gate-log "$d/gate" -- "$py" "$RK_SRC/tests/fds_worker.py" --out "$d" \
    --watch "$d/events" --watch "$d/steps" --watch "$d/gate" </dev/null >"$work/$name.out" 2>&1
  st=$?
  [[ $st == 0 ]] && ok "$name: rk run exit 0" \
    || bad "$name: rk run exit $st: $(grep -v '^rk agent' "$work/$name.out" | tail -5)"
  it_count python3 - "$name" "$n" "$d" <<'PY'
import glob, json, os, sys
name, n, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def check(cond, what):
    print(("ok - " if cond else "FAIL - ") + f"{name}: {what}")
got = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(d, "fds.0.*.json")))]
check(len(got) == n, f"{len(got)} ranks of launch 0 wrote what they hold (want {n})")
extra = sorted({f"{fd} -> {t}" for g in got for fd, t in g["fds"].items() if fd not in "012"})
check(not extra and all(set(g["fds"]) == {"0", "1", "2"} for g in got),
      "each rank holds stdin, stdout and stderr only" + (f"; also: {extra}" if extra else ""))
files = {os.path.realpath(os.path.join(d, f)) for f in ("events", "steps", "gate")}
def is_rk_run(h):
    return len(h["argv"]) > 1 and os.path.basename(h["argv"][0]) == "rk" and h["argv"][1] == "run"
seen = {f for g in got for h in g["holders"] if is_rk_run(h) for f in h["files"]}
check(bool(got) and seen == files, "rk run holds its --events, --steps and --gate-log files "
      "(the scan sees them)")
others = sorted({f"pid {h['pid']} ({' '.join(h['argv'])[:100]}): "
                 + ", ".join(os.path.basename(f) for f in h["files"])
                 for g in got for h in g["holders"] if not is_rk_run(h)})
check(not others, "no other process holds them" + (": " + "; ".join(others) if others else ""))
anc = [h for g in got for h in g["rk_ancestors"]]
check(bool(anc) or name == "srun", f"the ranks' rk ancestors read: {len(anc)}")
leaks = sorted({f"pid {h['pid']} ({' '.join(h['argv'][:2])}): {fd} -> {t}"
                for h in anc for fd, t in h["inheritable"].items()})
check(not leaks, "rk run, its keeper, the agents hold no descriptor above 2 without close-on-exec"
      + (": " + "; ".join(leaks) if leaks else ""))
PY
}

# --- (a) local, (b) mpirun ---------------------------------------------------------------------
run local 2 "$RK" run -n 2 --launcher local
if command -v mpirun >/dev/null; then
  run mpirun 2 "$RK" run -n 2 --launcher mpirun
else
  echo "skip - mpirun not found: (b) not run"
fi

# --- (e) local, rk run started with a descriptor of its caller's: the ranks do not get it -------
mkdir -p "$work/inh"
clean bash -c 'exec 7>>"$1"; shift; exec "$@"' - "$work/inh/caller" timeout 120 "$RK" run -n 1 \
  --launcher local --health off --quiet -- "$py" "$RK_SRC/tests/fds_worker.py" --out "$work/inh" \
  --watch "$work/inh/caller" </dev/null >"$work/inh.out" 2>&1
st=$?
[[ $st == 0 && -e $work/inh/fds.0.0.json ]] \
  && python3 -c 'import json, sys
g = json.load(open(sys.argv[1]))
sys.exit(not (set(g["fds"]) == {"0", "1", "2"} and any(h["files"] for h in g["holders"])))' \
    "$work/inh/fds.0.0.json" \
  && ok "local: a descriptor rk run inherited (fd 7) does not reach the rank (the scan sees rk run hold it)" \
  || bad "inherited fd 7: exit $st, the rank's descriptors: $(json "$work/inh/fds.0.0.json" fds 2>&1) $(tail -3 "$work/inh.out")"

# --- (c) --hosts: agents started through an --rsh, here on this host --------------------------
printf '#!/bin/sh\n# as ssh: HOST WORDS..., the words one command line for sh -c\nshift\nexec sh -c "$*"\n' \
  >"$work/rsh"
chmod +x "$work/rsh"
run hosts 2 "$RK" run --hosts 127.0.0.1:1,127.0.0.2:1 --listen 127.0.0.1:0 --rsh "$work/rsh" \
  --startup-timeout 60

# --- (c2) --hosts, rk run started with a descriptor of its caller's: neither the rsh, the agents
# nor the ranks get it (only rk run holds it)
mkdir -p "$work/inh2"
clean bash -c 'exec 7>>"$1"; shift; exec "$@"' - "$work/inh2/caller" timeout 120 "$RK" run \
  --hosts 127.0.0.1:1,127.0.0.2:1 --listen 127.0.0.1:0 --rsh "$work/rsh" --startup-timeout 60 \
  --health off --quiet -- "$py" "$RK_SRC/tests/fds_worker.py" --out "$work/inh2" \
  --watch "$work/inh2/caller" </dev/null >"$work/inh2.out" 2>&1
st=$?
said=$(python3 - "$work/inh2" <<'PY' 2>&1
import glob, json, os, sys
got = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(sys.argv[1], "fds.0.*.json")))]
holders = {(h["pid"], " ".join(h["argv"])[:80]) for g in got for h in g["holders"]  # rk run's
           if h["files"] and os.path.basename(h["argv"][0]) != "timeout"}  # parent is no heir
rk_run = [h for h in holders if h[1].split(" ")[1:2] == ["run"]]
others = sorted(h for h in holders if h not in rk_run)
print(f"{len(got)} ranks; held by rk run: {len(rk_run)}; by others: {others}")
sys.exit(not (len(got) == 2 and len(rk_run) == 1 and not others))
PY
)
[[ $st == 0 ]] && [[ $said != *"others: [("* ]] && [[ $said == "2 ranks; held by rk run: 1;"* ]] \
  && ok "hosts: a descriptor rk run inherited (fd 7) reaches no rsh, agent nor rank ($said)" \
  || bad "hosts, inherited fd 7: exit $st: $said $(grep -v '^rk agent' "$work/inh2.out" | tail -3)"

# --- (d) srun, in an allocation of the Slurm test rig -------------------------------------------
R=$RK_SRC/tests/slurm/rig
why=
[[ $(id -u) == 0 ]] || why="not root"
for c in /usr/sbin/slurmctld /usr/sbin/slurmd srun salloc; do
  [[ -z $why ]] && ! command -v "$c" >/dev/null && why="$c not found"
done
if [[ -n $why ]]; then
  echo "skip - $why: (d) srun not run"
else
  rig=rkfd$$
  atexit+=("\"$R\" down $rig >/dev/null 2>&1")
  if RIG_CPUS=2 "$R" up "$rig" 1 >"$work/rig.log" 2>&1; then
    eval "$("$R" env "$rig")"
    run srun 2 salloc -N1 -n2 -Q "$RK" run -n 2 --launcher srun
  else
    bad "srun: the Slurm rig did not start: $(tail -3 "$work/rig.log")"
  fi
fi
it_finish
