#!/usr/bin/env bash
# Every input is bounded, end to end through the CLI: a FIFO, /dev/zero or a directory given
# where a file belongs (a model for --init, Fashion-MNIST files, C-MAPSS files, a checkpoint,
# a predictor model) is refused at once with a message naming it, exit 2 (each command runs
# under `timeout`, so a reader that blocks on the FIFO fails the check instead of hanging);
# a 3 GB sparse model with a small header is refused from its header with little memory; a
# textfile directory holding a link to a root-only file neither follows it nor shows its
# content; and RK_NVML_LIB is ignored by a set-user-ID copy of rk (run by `nobody` through
# setpriv, the copy outside the clone: itlib.sh's as_nobody) while the same copy without the
# bit loads it (skipped, saying why, without root, setpriv or a directory nobody can reach).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_inputs
T=30

# expect NAME STATUS TEXT CMD...: CMD exits STATUS within $T s with TEXT in its stderr
expect() {
  local name=$1 want=$2 text=$3
  shift 3
  timeout $T "$@" >"$work/out" 2>"$work/err"
  local st=$?
  if [[ $st == "$want" ]] && grep -qF -- "$text" "$work/err"; then
    ok "$name: exit $want, '$text'"
  else
    bad "$name: exit $st (want $want; 124 is a hang): $(head -c 400 "$work/err")"
  fi
}

mkfifo "$work/fifo"

# --- a model (safetensors) ----------------------------------------------------------------
expect "--init FIFO" 2 "$work/fifo: is a FIFO, not a regular file" \
  "$RK" train --init "$work/fifo" --epochs 0
expect "--init /dev/zero" 2 "/dev/zero: is a character device, not a regular file" \
  "$RK" train --init /dev/zero --epochs 0
expect "--init DIR" 2 "is a directory, not a regular file" "$RK" train --init "$work" --epochs 0

# a 3 GB sparse file whose header (16 bytes, no tensors) does not describe its data: refused
# from the header, without reading 3 GB (peak RSS well under the file's size)
printf '\x10\x00\x00\x00\x00\x00\x00\x00{}              ' >"$work/big.safetensors"
truncate -s 3G "$work/big.safetensors"
/usr/bin/time -f '%M' -o "$work/rss" timeout $T "$RK" train --init "$work/big.safetensors" \
  --epochs 0 >/dev/null 2>"$work/err"
st=$?
rss=$(tail -n 1 "$work/rss")
if [[ $st == 2 ]] && grep -qF "tensors cover only 0" "$work/err" && ((rss < 400000)); then
  ok "3 GB sparse model refused from its header (peak RSS ${rss} KiB)"
else
  bad "3 GB sparse model: exit $st, peak RSS ${rss} KiB: $(head -c 300 "$work/err")"
fi

# --- Fashion-MNIST (IDX) and C-MAPSS (text) ---------------------------------------------
mkdir "$work/fm" "$work/cm"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
  t10k-labels-idx1-ubyte; do
  mkfifo "$work/fm/$f"
done
expect "--data with FIFOs" 2 "train-images-idx3-ubyte: is a FIFO" \
  "$RK" train --data "$work/fm" --epochs 1
for f in train_FD001.txt test_FD001.txt RUL_FD001.txt; do mkfifo "$work/cm/$f"; done
expect "cmapss with FIFOs" 2 "train_FD001.txt: is a FIFO, not a regular file" \
  "$RK" predict cmapss --data "$work/cm"

# --- a checkpoint, a predictor model ----------------------------------------------------
mkdir "$work/ck"
mkfifo "$work/ck/ckpt-000000000001.safetensors"
echo ckpt-000000000001.safetensors >"$work/ck/latest"
timeout $T "$RK" ckpt verify "$work/ck" >"$work/out" 2>"$work/err"
st=$?
[[ $st != 0 && $st != 124 ]] && grep -qF "ckpt-000000000001.safetensors: is a FIFO" "$work/err" &&
  ok "ckpt verify with a FIFO checkpoint: refused at once (exit $st)" ||
  bad "ckpt verify FIFO: exit $st: $(head -c 300 "$work/err")"
expect "ckpt verify /dev/zero" 2 "/dev/zero" "$RK" ckpt verify /dev/zero
timeout $T "$RK" run -n 1 --health sim --predictor "$work/fifo" -- true >"$work/out" 2>"$work/err"
st=$?
[[ $st != 0 && $st != 124 ]] && grep -qF "fifo: is a FIFO, not a regular file" "$work/err" &&
  ok "rk run --predictor FIFO: refused at once (exit $st)" ||
  bad "rk run --predictor FIFO: exit $st: $(head -c 300 "$work/err")"

# --- textfiles: no link out of the directory, no content in messages --------------------
mkdir "$work/tf"
printf 'SECRET-ROOT-ONLY-CONTENT 1\n' >"$work/secret"
chmod 0400 "$work/secret"
ln -s "$work/secret" "$work/tf/a.prom"
mkfifo "$work/tf/b.prom"
printf 'SECRET_name{k="SECRET"} SECRET\n' >"$work/tf/c.prom"
timeout $T "$RK" doctor --sim 2 --samples 1 --textfile-dir "$work/tf" >"$work/out" 2>"$work/err"
st=$?
if [[ $st != 124 ]] && grep -qF "a.prom: is a symbolic link out of the textfile directory" \
  "$work/err" && ! grep -q SECRET "$work/out" "$work/err"; then
  ok "textfile link to a root-only file: not followed, nothing of it shown"
else
  bad "textfile link: exit $st: $(cat "$work/err")"
fi

# --- RK_NVML_LIB and a privileged process ------------------------------------------------
# nobody runs a copy of rk in $nobody_dir (itlib.sh): a clone under a 0700 home is out of its
# reach, and as_nobody hides the clone in any checkout
if it_nobody_dir --suid; then
  s=$nobody_dir/rk
  cp "$RK" "$s"
  chmod 0755 "$s"
  evil=/nonexistent/evil-nvml.so
  run_nobody() {
    as_nobody timeout $T env RK_NVML_LIB=$evil "$s" doctor --samples 1 >"$work/out" 2>"$work/err"
  }
  run_nobody
  grep -qF "$evil" "$work/err" && ok "unprivileged: RK_NVML_LIB is used" ||
    bad "unprivileged: RK_NVML_LIB not used: $(head -c 300 "$work/err")"
  chmod 4755 "$s"
  run_nobody
  st=$?
  if [[ $st != 124 ]] && ! grep -qF "$evil" "$work/out" "$work/err" &&
    grep -qF "NVML" "$work/err" "$work/out"; then
    ok "set-user-ID: RK_NVML_LIB ignored (exit $st: $(head -c 120 "$work/err"))"
  else
    bad "set-user-ID: exit $st: $(head -c 300 "$work/err")"
  fi
  # rk run reads RK_INJECT itself (the spec it passes to the workers): ignored there too.
  # --launcher srun (absent here) ends the run before anything starts.
  inj_nobody() {
    as_nobody timeout $T env RK_INJECT=not-a-fault "$s" run -n 1 --health off --launcher srun -- true \
      >"$work/out" 2>"$work/err"
  }
  inj_nobody
  ! grep -qF "not-a-fault" "$work/err" && grep -qF "srun" "$work/err" &&
    ok "set-user-ID rk run: RK_INJECT ignored ($(head -c 100 "$work/err"))" ||
    bad "set-user-ID rk run: RK_INJECT used: $(head -c 300 "$work/err")"
  chmod 0755 "$s"
  inj_nobody
  grep -qF "not-a-fault" "$work/err" && ok "unprivileged rk run: RK_INJECT is read" ||
    bad "unprivileged rk run: RK_INJECT not read: $(head -c 300 "$work/err")"
fi

it_finish
