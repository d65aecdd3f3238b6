#!/usr/bin/env bash
# Progress lines in a real terminal (docs/cli.md, "Progress output"): `rk train` and `rk burn`
# (on the simulated GPU, tests/fake_cuda.c) run in tmux panes of 60, 80 and 200 columns. While
# the bar is up (the process stopped with SIGSTOP, so the pane holds still) and at the end, the
# pane (capture-pane -J: a wrapped line comes back whole) has no line wider than the pane, one
# progress line and not a flood of them, the ETA dropped at 60 columns and shown at 200, and
# the raw bytes (pipe-pane) show the redraws ("\r" ... "\033[K"). With TERM=dumb, NO_COLOR and
# output to a file: plain lines, with no "\r" and no escape bytes.
# Skips (77) without tmux; the train half skips without Fashion-MNIST.
set -u
. "$(dirname "$0")/itlib.sh"
if ! command -v tmux >/dev/null; then
  echo "SKIP: tmux not installed (scripts/install-deps.sh test)"
  exit 77
fi
it_init term
sock=rk-it-$$
atexit+=("tmux -L $sock kill-server 2>/dev/null")
tmx() { tmux -L "$sock" -f /dev/null "$@"; }

fake_cuda=$RK_BUILD/tests/libfake_cuda.so fake_nvml=$RK_BUILD/tests/libfake_nvml.so
export XDG_CACHE_HOME=$work/cache RK_BURN_STATE=$work/burn.json RK_CUDA_LIB=$fake_cuda \
  RK_NVML_LIB=$fake_nvml
unset NO_COLOR RK_HEARTBEAT OMPI_COMM_WORLD_SIZE

# The pane's program: waits for NAME.go (so pipe-pane records from its first byte), runs the
# command with its pid in NAME.pid, its status in NAME.rc, then holds the pane open.
cat >"$work/pane.sh" <<'EOF'
#!/usr/bin/env bash
p=$1; shift
while [[ ! -e $p.go ]]; do sleep 0.05; done
"$@" &
echo $! >"$p.pid"
wait $!
echo $? >"$p.rc"
exec sleep 3600
EOF

# pane NAME COLS ENV-AND-COMMAND...: a detached session NAME, COLS x 20, running the command,
# its raw output recorded in NAME.raw; returns once the command has started.
pane() {
  local name=$1 cols=$2
  shift 2
  tmx new-session -d -s "$name" -x "$cols" -y 20 \
    "$(printf '%q ' bash "$work/pane.sh" "$work/$name" env "$@")" || return 1
  tmx pipe-pane -o -t "$name" "cat >$(printf '%q' "$work/$name.raw")"
  touch "$work/$name.go"
  for _ in $(seq 600); do [[ -s $work/$name.pid ]] && return 0; sleep 0.05; done
  return 1
}
# capture NAME FILE: the pane and its history, wrapped lines joined, blank lines left out.
capture() { tmx capture-pane -p -J -S - -t "$1" | sed '/^ *$/d' >"$2"; }
# wait_pane NAME REGEX: until the pane shows a line matching REGEX (60 s at most; 1 when never).
wait_pane() {
  for _ in $(seq 600); do
    tmx capture-pane -p -J -t "$1" | grep -Eq "$2" && return 0
    [[ -e $work/$1.rc ]] && return 1
    sleep 0.1
  done
  return 1
}
# synced NAME: until tmux has taken in all that was written to the pane so far, and passed it
# on to NAME.raw (30 s at most): a title set through the pane's terminal after it (OSC 2,
# ESC ] 2 ; rk-sync-N ESC \) shows in #{pane_title} and has reached NAME.raw.
synced() {
  local tty mark=rk-sync-$RANDOM$RANDOM
  tty=$(tmx display -p -t "$1" '#{pane_tty}') || return 1
  # shellcheck disable=SC1003 # ESC \ ends the OSC
  printf '\033]2;%s\033\\' "$mark" >"$tty" || return 1
  for _ in $(seq 600); do
    [[ $(tmx display -p -t "$1" '#{pane_title}') == "$mark" ]] && grep -qF "$mark" "$work/$1.raw" &&
      return 0
    sleep 0.05
  done
  return 1
}
# wait_end NAME: until the command has exited (300 s at most), and tmux has taken in its last
# output.
wait_end() {
  for _ in $(seq 3000); do [[ -s $work/$1.rc ]] && { synced "$1"; return; }; sleep 0.1; done
  return 1
}
# widest FILE: the longest line's length in characters.
widest() { python3 -c 'import sys; print(max([len(l.rstrip("\n")) for l in open(sys.argv[1], encoding="utf-8")] + [0]))' "$1"; }
# no_ctl FILE: no "\r" but in "\r\n" (the terminal's own newline) and no escape byte (but the
# titles synced wrote).
no_ctl() { python3 -c 'import re,sys; d=open(sys.argv[1],"rb").read().replace(b"\r\n",b"\n"); d=re.sub(rb"\x1b\]2;rk-sync-[0-9]+\x1b\\",b"",d); sys.exit(b"\r" in d or b"\x1b" in d)' "$1"; }
# redraws FILE: the raw output has "\r" ... "\033[K" redraws.
redraws() { python3 -c 'import sys,re; d=open(sys.argv[1],"rb").read(); sys.exit(len(re.findall(rb"\r[^\r\n]*\x1b\[K", d)) < 2)' "$1"; }

# live NAME COLS BAR-REGEX DONE-REGEX COMMAND...: the checks above for one command at one width.
live() {
  local name=$1 cols=$2 bar=$3 done=$4
  shift 4
  if ! pane "$name" "$cols" "$@"; then
    bad "$name: the pane did not start"
    return
  fi
  local pid
  pid=$(cat "$work/$name.pid")
  if wait_pane "$name" "$bar"; then
    kill -STOP "$pid"
    synced "$name" || bad "$name: tmux did not take in the pane's output within 30 s"
    capture "$name" "$work/$name.live"
    kill -CONT "$pid"
    local w n line
    w=$(widest "$work/$name.live")
    n=$(grep -Ec "$bar" "$work/$name.live")
    line=$(grep -E "$bar" "$work/$name.live" | tail -1)
    ((w <= cols)) && ok "$name: live, no line wider than $cols columns (widest $w)" ||
      bad "$name: live, a line of $w columns: $(cat "$work/$name.live")"
    ((${#line} <= cols - 1)) && ok "$name: the bar leaves the last column free (${#line})" ||
      bad "$name: the bar takes ${#line} of $cols columns: $line"
    [[ $n == 1 ]] && ok "$name: one progress line, redrawn in place" ||
      bad "$name: $n progress lines: $(cat "$work/$name.live")"
    if ((cols <= 60)); then
      [[ $line != *ETA* ]] && ok "$name: at $cols columns the ETA is dropped" ||
        bad "$name: ETA at $cols columns: $line"
    elif ((cols >= 200)); then
      [[ $line == *ETA* ]] && ok "$name: at $cols columns the ETA is shown" ||
        bad "$name: no ETA at $cols columns: $line"
    fi
  else
    bad "$name: no progress line came: $(tmx capture-pane -p -J -t "$name" | sed '/^ *$/d')"
  fi
  if ! wait_end "$name"; then
    bad "$name: did not finish"
    return
  fi
  capture "$name" "$work/$name.end"
  local rc w
  rc=$(cat "$work/$name.rc")
  w=$(widest "$work/$name.end")
  [[ $rc == 0 ]] && grep -Eq "$done" "$work/$name.end" && ok "$name: exit 0, closing lines shown" ||
    bad "$name: exit $rc: $(cat "$work/$name.end")"
  ((w <= cols)) && ok "$name: at the end, no line wider than $cols columns (widest $w)" ||
    bad "$name: at the end, a line of $w columns: $(cat "$work/$name.end")"
  ! grep -Eq "$bar" "$work/$name.end" && ok "$name: the bar is gone at the end" ||
    bad "$name: a bar left at the end: $(grep -E "$bar" "$work/$name.end")"
  redraws "$work/$name.raw" && ok "$name: the raw output redraws with \\r ... ESC[K" ||
    bad "$name: no redraws in the raw output"
}

# plain NAME PLAIN-REGEX COMMAND...: TERM=dumb or NO_COLOR in a 60-column pane: plain lines,
# no bar, no "\r", no escapes.
plain() {
  local name=$1 want=$2
  shift 2
  if ! pane "$name" 60 "$@" || ! wait_end "$name"; then
    bad "$name: did not run"
    return
  fi
  capture "$name" "$work/$name.end"
  [[ $(cat "$work/$name.rc") == 0 ]] && grep -Eq "$want" "$work/$name.end" &&
    ok "$name: plain progress lines" || bad "$name: $(cat "$work/$name.end")"
  ! grep -q '\[[#.]*\]' "$work/$name.end" && ok "$name: no bar" || bad "$name: a bar"
  no_ctl "$work/$name.raw" && ok "$name: no \\r, no escape bytes" ||
    bad "$name: control bytes: $(head -c 300 "$work/$name.raw" | od -c | head -5)"
}

# ---- rk train --------------------------------------------------------------------------------
if [[ -e "$DATA/train-images-idx3-ubyte.gz" || -e "$DATA/train-images-idx3-ubyte" ]]; then
  train=("$RK" train --data "$DATA" --max-steps 300 --no-eval --threads 1)
  tbar='^epoch 1/1  \[[#.]+\]'
  tdone='^epoch 1/1  steps 300 .*samples/s$'
  for cols in 60 80 200; do
    live "train$cols" "$cols" "$tbar" "$tdone" "${train[@]}"
  done
  plain train_dumb '^epoch 1/1  step [0-9]+/300  loss [0-9.]+  [0-9]+ samples/s  ETA [0-9]+:[0-9]+$' \
    TERM=dumb "${train[@]}"
  plain train_nocolor '^epoch 1/1  step [0-9]+/300  ' NO_COLOR=1 "${train[@]}"
  "${train[@]}" >"$work/train.file" 2>&1
  rc=$?
  [[ $rc == 0 ]] && grep -q '^epoch 1/1  step [0-9]*/300  loss' "$work/train.file" &&
    grep -q '^trained 300 steps' "$work/train.file" && ok "train to a file: plain lines" ||
    bad "train to a file: exit $rc: $(head -5 "$work/train.file")"
  no_ctl "$work/train.file" && ok "train to a file: no \\r, no escape bytes" ||
    bad "train to a file: control bytes"
else
  echo "SKIP (train half): Fashion-MNIST not found in $DATA (install dataset-fashion-mnist)"
fi

# ---- rk burn on the simulated GPU --------------------------------------------------------------
if [[ ! -f $fake_cuda || ! -f $fake_nvml ]]; then
  bad "fake libraries missing ($fake_cuda, $fake_nvml)"
  it_finish
  exit
fi
# the first burn autotunes (slow on the simulated GPU); the cache makes the others quick
"$RK" burn --duration 1s --json >"$work/tune.json" 2>"$work/tune.err" && ok "burn: tuned" ||
  bad "burn: the tuning run failed: $(head -3 "$work/tune.err")"
burn=("$RK" burn --duration 3s)
bbar='^burn [0-9]+s  \[[#.]+\]'
for cols in 60 80 200; do
  live "burn$cols" "$cols" "$bbar" 'verdict: OK' "${burn[@]}"
done
plain burn_dumb '^burn [0-9]+s  gpu0 [0-9]+% [a-z]+ .*GFLOP/s  ETA [0-9]+:[0-9]+$' TERM=dumb "${burn[@]}"
"${burn[@]}" >"$work/burn.out" 2>"$work/burn.err"
rc=$?
[[ $rc == 0 ]] && grep -q '^burn [0-9]*s  gpu0 [0-9]*% ' "$work/burn.err" &&
  grep -q 'verdict: OK' "$work/burn.out" && ok "burn to files: plain progress lines on stderr" ||
  bad "burn to files: exit $rc: $(head -3 "$work/burn.err")"
no_ctl "$work/burn.err" && no_ctl "$work/burn.out" && ok "burn to files: no \\r, no escape bytes" ||
  bad "burn to files: control bytes"

it_finish
