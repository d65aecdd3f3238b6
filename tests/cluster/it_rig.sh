#!/usr/bin/env bash
# The test cluster on one machine (tests/cluster/net.sh, the rig CLI): 3 hosts reach each
# other by ping and TCP and nothing else (the root namespace cannot reach them, nor they it);
# a cut link fails TCP within a second or two and heal restores it; tbf shaping slows a
# transfer; rig down stops every process left in the hosts and leaves no namespace or
# interface behind, also when the test using the rig is sent SIGTERM or SIGINT, and after a
# SIGKILL once rig gc runs. Bad arguments exit 2; not root: skip (77). Needs root and ping.
# ok and bad always succeed: `check && ok ... || bad ...` is an if-then-else here.
# shellcheck disable=SC2015
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/itlib.sh
. "$here/../itlib.sh"
# shellcheck source=tests/cluster/net.sh
. "$here/net.sh"
rig_need || exit $?
if ! command -v ping >/dev/null; then
  echo "SKIP: ping not found (iputils-ping, in scripts/install-deps.sh test)"
  exit 77
fi
it_init rig
R=$here/rig
T=$here/tcp.py
name=$(rig_name rt)
rig_autoclean "$name"

# alive PID: the process exists and is not a zombie.
alive() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [[ ${s:0:1} != Z ]]
}
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
root_links() { ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | sort; }
leftovers() { # what is left of rig $1 anywhere: namespaces, state, /etc/netns
  ip netns list | awk '{print $1}' | grep -E "^$1-" || true
  ls -d "$RIG_RUN/$1" /etc/netns/"$1"-* 2>/dev/null || true
}
wait_file() { # wait_file FILE SECONDS
  local t
  for ((t = 0; t < $2 * 10; t++)); do
    [[ -s $1 ]] && return 0
    sleep 0.1
  done
  return 1
}

links0=$(root_links)

# ---- bad usage exits 2 with a message; not root is a skip ----------------------------------
for args in "" "up" "up $name-x" "up bad/name 2" "up x 0" "up x 251" "up -x 2" "down" \
  "exec $name-no h1 true" "cut $name-no h1" "shape $name-no h1 1gbit" "bogus" "gc extra"; do
  # shellcheck disable=SC2086
  "$R" $args >"$work/out" 2>"$work/err"
  rc=$?
  if [[ $rc == 2 && -s $work/err ]]; then
    ok "rig $args: exit 2 ($(head -c 70 "$work/err" | head -1))"
  else
    bad "rig $args: exit $rc (want 2), stderr '$(head -c 200 "$work/err")'"
  fi
done
# not root: nobody runs a copy of the rig in $nobody_dir (itlib.sh; a clone under a 0700 home
# is out of its reach)
# shellcheck disable=SC2119 # no --suid
if it_nobody_dir; then
  cp "$here/rig" "$here/net.sh" "$nobody_dir/" && chmod 0755 "$nobody_dir/rig"
  as_nobody "$nobody_dir/rig" up "$name-u" 2 >"$work/out" 2>&1
  rc=$?
  if [[ $rc == 77 ]] && grep -q '^SKIP: .*root' "$work/out"; then
    ok "not root: rig up exits 77 with '$(head -1 "$work/out")'"
  else
    bad "not root: rig up exit $rc (want 77 and SKIP), output '$(cat "$work/out")'"
  fi
fi

# ---- up: 3 hosts, nothing in the root namespace --------------------------------------------
t0=$(now)
if ! rig_up "$name" 3; then
  bad "rig up $name 3 failed"
  it_finish
  exit
fi
ok "rig up $name 3 in $(since "$t0") s"
if [[ $("$R" up "$name" 3 2>&1) == *exists* ]]; then
  ok "a second rig up of the same name is refused"
else
  bad "a second rig up of the same name was not refused"
fi
for a in "cut $name h4" "cut $name 1" "heal $name h0" "shape $name h1 fast" \
  "shape $name h1 10mbit soon" "shape $name h1 10mbit 1ms extra" "exec $name h1" "addr $name h9"; do
  # shellcheck disable=SC2086
  "$R" $a >/dev/null 2>&1
  rc=$?
  [[ $rc == 2 ]] && ok "rig $a: exit 2" || bad "rig $a: exit $rc (want 2)"
done
if [[ $(root_links) == "$links0" ]]; then
  ok "no interface added to the root namespace ($(echo "$links0" | wc -l) links, as before)"
else
  bad "root namespace links changed: $(diff <(echo "$links0") <(root_links) | tr '\n' ' ')"
fi
for h in h1 h2 h3; do
  ns=$(rig_ns "$name" "$h")
  routes=$(ip -n "$ns" -4 route show)
  if [[ $(echo "$routes" | wc -l) == 1 && $routes != *default* && $routes == *"dev eth0"* ]]; then
    ok "$h: one route, its subnet on eth0 ($routes)"
  else
    bad "$h: routes '$routes'"
  fi
  [[ $(ip -n "$ns" link show lo) == *"<LOOPBACK,UP"* ]] && ok "$h: lo up" || bad "$h: lo not up"
done
[[ $(rig_exec "$name" h2 hostname) == h2 ]] && ok "rig exec runs with hostname h2" ||
  bad "hostname in h2: $(rig_exec "$name" h2 hostname)"
# As an rsh from inside another host (a coordinator in h1 starting an agent in h3): the words
# are joined into one command line, and h2 resolves to its address there.
# shellcheck disable=SC2016 # expanded in h3
out=$(rig_exec "$name" h1 "$R" rsh "$name" h3 'echo $(hostname)' '$(getent hosts h2)')
if [[ $out == "h3 $(rig_addr "$name" h2) h2 $name-h2" ]]; then
  ok "rig rsh from h1 to h3 runs a command line there: '$out'"
else
  bad "rig rsh from h1 to h3 printed '$out'"
fi

# ---- every host reaches the others, by ping and TCP ----------------------------------------
declare -A port addr
for k in 1 2 3; do
  addr[h$k]=$(rig_addr "$name" "h$k")
  rig_spawn "$name" "h$k" python3 "$T" serve "$work/ready$k"
  pids+=("$RIG_PID")
done
for k in 1 2 3; do
  if wait_file "$work/ready$k" 10; then
    port[h$k]=$(cat "$work/ready$k")
  else
    bad "the listener in h$k did not start"
    it_finish
    exit
  fi
done
for i in h1 h2 h3; do
  for j in h1 h2 h3; do
    [[ $i != "$j" ]] || continue
    if rig_exec "$name" "$i" ping -c1 -W2 -q "${addr[$j]}" >/dev/null; then
      ok "$i pings $j (${addr[$j]})"
    else
      bad "$i cannot ping $j (${addr[$j]})"
    fi
    if rig_exec "$name" "$i" python3 "$T" probe "$j" "${port[$j]}" 3; then
      ok "$i reaches $j by TCP (by name $j, port ${port[$j]})"
    else
      bad "$i cannot reach $j by TCP"
    fi
  done
done

# ---- a second rig at the same time: another subnet, and the two do not reach each other ----
other=$(rig_name ro)
rig_autoclean "$other"
if rig_up "$other" 2; then
  oaddr=$(rig_addr "$other" h1)
  [[ ${oaddr%.*} != "${addr[h1]%.*}" ]] &&
    ok "a second rig gets another subnet (${oaddr%.*}.0/24)" ||
    bad "a second rig got the same subnet (${oaddr%.*}.0/24)"
  for h in h1 h2 h3; do
    if rig_exec "$other" h1 python3 "$T" probe "${addr[$h]}" "${port[$h]}" 1 >/dev/null 2>&1; then
      bad "h1 of the second rig reaches $h of the first"
    else
      ok "h1 of the second rig cannot reach $h of the first (${addr[$h]})"
    fi
  done
  rig_down "$other" || bad "rig down of the second rig failed"
else
  bad "a second rig could not be made"
fi

# ---- isolation: the root namespace and the rig do not reach each other ---------------------
# From the root namespace nothing is sent to the rig's addresses (a probe there would leave
# through the machine's own default route, onto its real network): its routing table is read
# instead. No address of 198.18.0.0/15 is the root's, and the only route to a host's address
# is the default one, off this machine, where the benchmarking range is not routed here.
if ip -o -4 addr show | awk '{print $4}' | grep -q '^198\.1[89]\.'; then
  bad "the root namespace has an address in 198.18.0.0/15: $(ip -o -4 addr show | grep ' 198\.1[89]\.')"
else
  ok "the root namespace has no address in 198.18.0.0/15"
fi
for h in h1 h2 h3; do
  routes=$(ip -4 -o route show table all to match "${addr[$h]}" 2>/dev/null |
    grep -v '^default\|^broadcast\|^local 127\.' || true)
  if [[ -z $routes ]]; then
    ok "the root namespace has no route of its own to $h (${addr[$h]})"
  else
    bad "the root namespace routes $h (${addr[$h]}) through: $routes"
  fi
done
python3 "$T" serve "$work/ready-root" &
pids+=($!)
if wait_file "$work/ready-root" 10; then
  rport=$(cat "$work/ready-root")
  mapfile -t raddrs < <(ip -4 -o addr show | awk '{ sub(/\/.*/, "", $4); print $4 }')
  for a in "${raddrs[@]}"; do
    # The same probe from the root namespace succeeds: the check below can fail.
    if ! python3 "$T" probe "$a" "$rport" 2; then
      bad "the root namespace's own listener is not reachable on $a"
      continue
    fi
    if [[ $rport == "${port[h1]}" ]]; then
      ok "(port $rport is also h1's: the TCP check on $a is skipped)"
    elif rig_exec "$name" h1 python3 "$T" probe "$a" "$rport" 1 >/dev/null 2>&1; then
      bad "h1 reaches the root namespace's listener on $a:$rport"
    else
      ok "h1 cannot reach the root namespace's listener on $a:$rport (root itself can)"
    fi
    if [[ $a != 127.* ]]; then
      if rig_exec "$name" h1 ping -c1 -W1 -q "$a" >/dev/null 2>&1; then
        bad "h1 pings the root namespace's $a"
      else
        ok "h1 cannot ping the root namespace's $a"
      fi
    fi
  done
else
  bad "the root namespace's listener did not start"
fi

# ---- cut and heal --------------------------------------------------------------------------
rig_cut "$name" h2 || bad "rig cut $name h2 failed"
eth=$(ip -n "$name-h2" link show eth0)
if [[ $eth == *NO-CARRIER* && $eth == *",UP>"* ]] &&
  [[ $(ip -n "$name-h2" -4 addr show eth0) == *"${addr[h2]}/24"* ]]; then
  ok "cut h2: its eth0 is still up and addressed, without carrier (a pulled cable)"
else
  bad "cut h2: its eth0 is '$eth'"
fi
[[ $(rig_status "$name") == *"h2 ns=$name-h2 addr=${addr[h2]} link=cut"* ]] &&
  ok "rig status shows h2 cut" || bad "rig status: $(rig_status "$name")"
# The time to fail is the probe's own (from its connect on): python's start in a loaded
# machine is not the link's.
t0=$(now)
if dt=$(rig_exec "$name" h1 python3 "$T" probe h2 "${port[h2]}" 1.5 2>/dev/null); then
  bad "h1 still reaches h2 by TCP after the cut"
else
  ge 2.5 "${dt:-9}" &&
    ok "h1 -> h2 TCP fails after the cut, in $dt s ($(since "$t0") s with python's start)" ||
    bad "h1 -> h2 TCP took '$dt' s to fail (want <= 2.5)"
fi
if rig_exec "$name" h2 python3 "$T" probe h1 "${port[h1]}" 1.5 >/dev/null 2>&1; then
  bad "h2 still reaches h1 by TCP after the cut"
else
  ok "h2 -> h1 TCP fails after the cut"
fi
rig_exec "$name" h1 python3 "$T" probe h3 "${port[h3]}" 3 && ok "h1 -> h3 unaffected by h2's cut" ||
  bad "h1 -> h3 broken by h2's cut"
rig_heal "$name" h2 || bad "rig heal $name h2 failed"
t0=$(now)
healed=
for ((t = 0; t < 25; t++)); do
  if rig_exec "$name" h1 python3 "$T" probe h2 "${port[h2]}" 1 >/dev/null 2>&1; then
    healed=1
    break
  fi
  sleep 0.2
done
[[ -n $healed ]] && ok "heal h2: h1 -> h2 TCP works again after $(since "$t0") s" ||
  bad "heal h2: h1 -> h2 TCP still fails after 5 s"

# ---- shaping -------------------------------------------------------------------------------
# 2 MB at 10 Mbit/s is 1.6 s; unshaped it is milliseconds. Loose bounds only.
send() { rig_exec "$name" "$1" python3 "$T" send "$2" "${port[$2]}" 2000000 30; }
if d=$(send h1 h3) && ! ge "$d" 1.2; then
  ok "unshaped: 2 MB h1 -> h3 in $d s (< 1.2)"
else
  bad "unshaped: 2 MB h1 -> h3 took '$d' s"
fi
if rig_shape "$name" h3 10mbit; then
  ok "rig shape $name h3 10mbit ($(rig_status "$name" | grep '^h3 '))"
  for p in "h1 h3" "h3 h1"; do
    # shellcheck disable=SC2086
    if d=$(send $p) && ge "$d" 1.2 && ge 20 "$d"; then
      ok "shaped 10mbit: 2 MB ${p/ / -> } in $d s (>= 1.2)"
    else
      bad "shaped 10mbit: 2 MB ${p/ / -> } took '$d' s (want 1.2 to 20)"
    fi
  done
else
  bad "rig shape $name h3 10mbit failed"
fi
if rig_has_netem; then
  rig_shape "$name" h3 1gbit 20ms || bad "rig shape $name h3 1gbit 20ms failed"
  rtt=$(rig_exec "$name" h1 ping -c3 -i0.2 -q h3 | awk -F/ '/^rtt/ { print $5 }')
  ge "${rtt:-0}" 40 && ok "20ms each way at both ends of h3's link: rtt h1 <-> h3 ${rtt} ms" ||
    bad "20ms delay: rtt h1 <-> h3 '${rtt}' ms (want >= 40)"
else
  rig_shape "$name" h3 10mbit 1ms >"$work/out"
  rc=$?
  if [[ $rc == 77 ]] && grep -q netem "$work/out"; then
    ok "no netem in this kernel: a delay is refused with 77 ($(head -c 60 "$work/out")...)"
  else
    bad "a delay without netem: exit $rc, '$(cat "$work/out")'"
  fi
fi
rig_shape "$name" h3 off || bad "rig shape $name h3 off failed"
if d=$(send h1 h3) && ! ge "$d" 1.2; then
  ok "shape off: 2 MB h1 -> h3 in $d s again"
else
  bad "shape off: 2 MB h1 -> h3 took '$d' s"
fi

# ---- down: every process in the hosts is stopped, nothing is left -------------------------
rig_spawn "$name" h2 python3 -c \
  'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'
deaf=$RIG_PID
rig_spawn "$name" h3 sh -c 'sleep 600 & sleep 600 & wait'
shp=$RIG_PID
# until the python ignores SIGTERM (bit 15 of SigIgn) and the sh has forked both sleeps
ready=
for ((t = 0; t < 600; t++)); do
  ign=$(awk '/^SigIgn:/ { print $2 }' "/proc/$deaf/status" 2>/dev/null)
  kids=$(cat /proc/"$shp"/task/*/children 2>/dev/null | wc -w)
  if [[ -n $ign ]] && (((16#$ign >> 14) & 1)) && ((kids >= 2)); then
    ready=1
    break
  fi
  sleep 0.05
done
[[ -n $ready ]] || bad "the processes in h2 and h3 were not ready within 30 s (SigIgn '$ign', $kids children)"
mapfile -t inside < <(for ns in $(_rig_list_ns "$name"); do ip netns pids "$ns"; done)
t0=$(now)
rig_down "$name" &&
  ok "rig down $name in $(since "$t0") s (a process ignores TERM: KILL after ${RIG_GRACE} s)" ||
  bad "rig down $name failed"
left=()
for p in "${inside[@]}"; do alive "$p" && left+=("$p"); done
[[ ${#left[@]} == 0 && ${#inside[@]} -ge 6 ]] &&
  ok "the ${#inside[@]} processes in the hosts are gone (one ignored TERM: $deaf)" ||
  bad "of ${#inside[@]} processes in the hosts, still alive: ${left[*]}"
[[ -z $(leftovers "$name") ]] && ok "no namespace, state or /etc/netns file left" ||
  bad "left after down: $(leftovers "$name" | tr '\n' ' ')"
[[ $(root_links) == "$links0" ]] && ok "root namespace links as before" ||
  bad "root namespace links changed after down"
rig_down "$name" && ok "rig down again: 0 (idempotent)" || bad "a second rig down failed"

# ---- a test sent SIGTERM or SIGINT, or killed, leaves nothing ------------------------------
# The sub-run keeps an EXIT trap of its own (removing its waiter) set before rig_autoclean.
cat >"$work/sub.sh" <<'EOF'
set -u
. "$1"
w=
trap 'rm -f "$3.w"; [[ -z $w ]] || kill "$w" 2>/dev/null' EXIT
rig_autoclean "$2"
rig_up "$2" 2 || exit 1
rig_spawn "$2" h1 sleep 600
echo "$RIG_PID" >"$3.pid"
sleep 600 &
w=$!
echo "$w" >"$3.w"
mv "$3.pid" "$3"
wait "$w"
EOF
for sig in TERM INT KILL; do
  sub=$(rig_name rs)
  rig_autoclean "$sub"
  rdy=$work/ready-$sig
  # Its own output to a file: nothing it leaves behind may hold this test's stdout open.
  env --default-signal=INT bash "$work/sub.sh" "$here/net.sh" "$sub" "$rdy" \
    >"$work/sub-$sig.log" 2>&1 &
  spid=$!
  if ! wait_file "$rdy" 10; then
    bad "SIG$sig sub-run: its rig did not come up: $(cat "$work/sub-$sig.log")"
    kill -KILL "$spid"
    continue
  fi
  inner=$(cat "$rdy")
  waiter=$(cat "$rdy.w")
  kill "-$sig" "$spid"
  wait "$spid"
  rc=$?
  if [[ $sig == KILL ]]; then
    kill "$waiter" 2>/dev/null
    [[ -n $(leftovers "$sub") ]] && ok "SIGKILL sub-run: its rig is left, as expected" ||
      bad "SIGKILL sub-run: its rig vanished without gc"
    "$R" gc 2>"$work/err"
    grep -q "owner (pid $spid) is gone" "$work/err" && ok "rig gc: $(cat "$work/err")" ||
      bad "rig gc said '$(cat "$work/err")'"
  else
    want=130
    [[ $sig != TERM ]] || want=143
    [[ $rc == "$want" ]] && ok "SIG$sig sub-run exits $rc" ||
      bad "SIG$sig sub-run exit $rc (want $want)"
    [[ ! -e $rdy.w ]] && ok "SIG$sig sub-run: its own EXIT trap ran too" ||
      bad "SIG$sig sub-run: its own EXIT trap did not run"
  fi
  alive "$inner" && bad "SIG$sig: the process in its h1 ($inner) is alive" ||
    ok "SIG$sig: the process in its h1 is gone"
  [[ -z $(leftovers "$sub") ]] && ok "SIG$sig: nothing of its rig is left" ||
    bad "SIG$sig: left: $(leftovers "$sub" | tr '\n' ' ')"
done
# ---- gc leaves alone a rig being made: its state dir is there, its owner line not yet ------
# rig up writes the owner under $RIG_RUN/.lock; gc must read owners under that lock too. A
# make test once ran it_rig's gc beside it_cluster's rig up, and the new rig was removed.
mk=$(rig_name mk)
mkdir -p "$RIG_RUN"
exec {lk}>"$RIG_RUN/.lock"
flock "$lk"
mkdir "$RIG_RUN/$mk" && echo 198.19.255 >"$RIG_RUN/$mk/net" && echo 1 >"$RIG_RUN/$mk/n"
"$R" gc {lk}>&- 2>"$work/gc-mk.err" &  # not holding the test's lock itself
gpid=$!
gc_waits() { # a flock of gc's blocked on the lock (the waiter's parent is gc)
  local p
  # shellcheck disable=SC2013 # one pid a line
  for p in $(awk '$2 == "->" {print $6}' /proc/locks); do
    [[ $(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) == "$gpid" ]] && return 0
  done
  return 1
}
# Either gc is done (it did not wait for the lock) or it waits for it.
# shellcheck disable=SC2016 # wait_for evals it
wait_for '! alive $gpid || gc_waits' 30 || bad "rig gc neither ended nor waited for the lock"
echo "$$ $(_rig_start_time $$)" >"$RIG_RUN/$mk/owner"
exec {lk}>&-
wait "$gpid"
[[ -d $RIG_RUN/$mk ]] && ok "rig gc leaves a rig being made alone (it waits for rig up's lock)" ||
  bad "rig gc removed a rig being made: $(cat "$work/gc-mk.err")"
rm -rf "${RIG_RUN:?}/$mk"

# ---- the functions hold under set -euo pipefail (a test may use them so) -------------------
cat >"$work/sete.sh" <<'EOF'
set -euo pipefail
. "$1"
n=$2
rig_autoclean "$n"
rig_up "$n" 2
rig_spawn "$n" h1 sleep 100
rig_exec "$n" h1 ping -c1 -W2 -q h2 >/dev/null
rig_cut "$n" h2
rig_heal "$n" h2
rig_shape "$n" h2 100mbit
rig_status "$n" >/dev/null
rig_shape "$n" h2 off
rig_status "$n" >/dev/null
rig_status >/dev/null
rig_has_netem || true
rig_down "$n"
rig_down "$n"
echo "all done"
EOF
sub=$(rig_name re)
rig_autoclean "$sub"
out=$(bash "$work/sete.sh" "$here/net.sh" "$sub" 2>&1)
[[ $out == *"all done" && -z $(leftovers "$sub") ]] &&
  ok "up, spawn, exec, cut, heal, shape, status and down under set -euo pipefail" ||
  bad "under set -euo pipefail: '$out'"

[[ $(root_links) == "$links0" ]] && ok "root namespace links as at the start" ||
  bad "root namespace links changed"

it_finish
