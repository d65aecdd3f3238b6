# shellcheck shell=bash
# A test cluster on one machine: N "hosts" as network namespaces, joined by a Linux bridge
# that lives in a separate "switch" namespace. Sourced by multi-host tests (the rig_*
# functions below, safe under `set -u` and `set -e`) and wrapped as a CLI by tests/cluster/rig.
# Relies on root, iproute2 (ip, tc) and util-linux (unshare, flock). See tests/cluster/README.md.
#
# Rig NAME with N hosts, its subnet P = 198.18.X (a /24 of 198.18.0.0/15 chosen per rig):
#   NAME-sw   the switch: lo, bridge br0, ports h1..hN (the switch ends of the veth pairs)
#   NAME-hK   host K: lo, eth0 = P.K/24 (the host end of the pair), no other route
# Nothing is made in the root namespace and nothing is routed or NATed out: a host reaches
# only the other hosts of its rig. Interface names are the same in every rig (each lives in
# its own namespace), so only the namespace names carry NAME.
#
# Functions (status 0 ok, 1 failed, 2 bad arguments, 77 this machine cannot: SKIP):
#   rig_need                   77 with a "SKIP: ..." line unless root with netns/veth/bridge
#   rig_name [PREFIX]          print a name unique to this test run (PREFIX, pid, random)
#   rig_up NAME N              make the rig (N 1..250); owner = $RIG_OWNER or this shell
#   rig_down NAME              kill every process in its namespaces (TERM, KILL after
#                              $RIG_GRACE s, default 2), remove everything; idempotent
#   rig_autoclean NAME         rig_down NAME on every exit of this shell (EXIT, INT, TERM,
#                              HUP); keeps an EXIT trap set before it
#   rig_exec NAME hK CMD...    run CMD in host K (hostname hK), in the foreground
#   rig_spawn NAME hK CMD...   the same in the background; RIG_PID = CMD's own pid
#   rig_cut NAME hK            pull host K's cable (its switch port down); rig_heal: plug in
#   rig_shape NAME hK RATE [DELAY]   limit host K's link to RATE each way (tbf), plus DELAY
#                              each way (netem; 77 if the kernel lacks it); RATE off: unshape
#   rig_addr NAME hK / rig_ns NAME hK / rig_hosts NAME   host K's address / namespace / h1..hN
#   rig_status [NAME]          the rigs, or one rig's hosts, links and shaping
#   rig_gc                     rig_down every rig whose owner process is gone (after SIGKILL)
#   rig_has_netem              0 if this kernel can delay packets (netem), else 1

RIG_RUN=${RIG_RUN:-/run/rk-rig}
RIG_GRACE=${RIG_GRACE:-2}
_rig_auto=()

_rig_err() { echo "rig: $*" >&2; }

_rig_name_ok() {
  if [[ ! ${1-} =~ ^[A-Za-z0-9][A-Za-z0-9_-]{0,23}$ ]]; then
    _rig_err "bad rig name '${1-}': 1 to 24 of A-Z a-z 0-9 _ -, not starting with _ or -"
    return 2
  fi
}

# rig_host_ok NAME hK: hK names a host of an existing rig NAME.
_rig_host_ok() {
  _rig_name_ok "$1" || return 2
  local n
  if ! n=$(cat "$RIG_RUN/$1/n" 2>/dev/null); then
    _rig_err "no rig '$1' (rig up $1 N makes it)"
    return 2
  fi
  if [[ ! ${2-} =~ ^h([1-9][0-9]*)$ ]] || ((BASH_REMATCH[1] > n)); then
    _rig_err "bad host '${2-}' for rig '$1': h1..h$n"
    return 2
  fi
}

# The start time of process PID (field 22 of /proc/PID/stat), empty when it is gone.
_rig_start_time() {
  local stat rest f
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  rest=${stat##*) }
  read -ra f <<<"$rest"
  echo "${f[19]}"
}

rig_need() {
  local c
  if [[ $(id -u) -ne 0 ]]; then
    echo "SKIP: the test cluster needs root (network namespaces, veth, bridge)"
    return 77
  fi
  for c in ip tc unshare flock; do
    if ! command -v "$c" >/dev/null; then
      echo "SKIP: the test cluster needs $c (iproute2, util-linux)"
      return 77
    fi
  done
  if ! ip netns list >/dev/null 2>&1; then
    echo "SKIP: ip netns is not available here"
    return 77
  fi
  # In a throwaway namespace: can this kernel make one, with a veth pair and a bridge?
  if ! unshare --net sh -c 'ip link add r0 type veth peer name r1 &&
      ip link add rb type bridge' >/dev/null 2>&1; then
    echo "SKIP: this kernel refuses a network namespace, veth or bridge (ip netns add)"
    return 77
  fi
}

rig_name() {
  local p=${1:-rig}
  echo "${p:0:10}$$r$RANDOM"
}

rig_addr() {
  _rig_host_ok "$@" || return 2
  echo "$(cat "$RIG_RUN/$1/net").${2#h}"
}
rig_ns() {
  _rig_host_ok "$@" || return 2
  echo "$1-$2"
}
rig_hosts() {
  _rig_name_ok "${1-}" || return 2
  local n k
  n=$(cat "$RIG_RUN/$1/n" 2>/dev/null) || { _rig_err "no rig '$1'"; return 2; }
  for ((k = 1; k <= n; k++)); do echo "h$k"; done
}

rig_up() {
  if [[ $# -ne 2 ]]; then
    _rig_err "usage: rig up NAME N"
    return 2
  fi
  local name=$1 n=$2 owner=${RIG_OWNER:-$$} fd f i used net st pre
  _rig_name_ok "$name" || return 2
  if [[ ! $n =~ ^[1-9][0-9]{0,2}$ ]] || ((n > 250)); then
    _rig_err "bad host count '$n': 1 to 250"
    return 2
  fi
  if [[ ! $owner =~ ^([0-9]+|none)$ ]]; then
    _rig_err "bad RIG_OWNER '$owner': a pid or none"
    return 2
  fi
  rig_need >&2 || return 77
  rig_gc
  mkdir -p "$RIG_RUN" || return 1
  # The subnet is chosen and the state written under one lock, so two rigs made at the same
  # time get different subnets (they are isolated anyway; distinct subnets keep logs clear).
  exec {fd}>"$RIG_RUN/.lock"
  flock "$fd"
  if [[ -e $RIG_RUN/$name ]] || ip netns list | grep -qE "^$name-(sw|h[0-9]+)( |$)"; then
    exec {fd}>&-
    _rig_err "rig '$name' exists (rig down $name removes it)"
    return 1
  fi
  used=" "
  for f in "$RIG_RUN"/*/net; do
    if [[ -f $f ]]; then used+="$(<"$f") "; fi
  done
  net=
  for ((i = 0; i < 512; i++)); do
    pre="198.$((18 + i / 256)).$((i % 256))"
    if [[ $used != *" $pre "* ]]; then
      net=$pre
      break
    fi
  done
  if [[ -z $net ]]; then
    exec {fd}>&-
    _rig_err "all 512 subnets of 198.18.0.0/15 are in use"
    return 1
  fi
  st=$RIG_RUN/$name
  if ! { mkdir "$st" && echo "$net" >"$st/net" && echo "$n" >"$st/n"; }; then
    exec {fd}>&-
    return 1
  fi
  if [[ $owner == none ]]; then
    echo none >"$st/owner"
  else
    echo "$owner $(_rig_start_time "$owner")" >"$st/owner"
  fi
  exec {fd}>&-

  if ! _rig_build "$name" "$n" "$net"; then
    _rig_err "could not make rig '$name'; removed what was made"
    rig_down "$name"
    return 1
  fi
}

_rig_build() {
  local name=$1 n=$2 net=$3 sw=$1-sw h k j
  ip netns add "$sw" &&
    ip -n "$sw" link set lo up &&
    ip -n "$sw" link add br0 type bridge &&
    ip -n "$sw" link set br0 up || return 1
  for ((k = 1; k <= n; k++)); do
    h=$name-h$k
    # The pair is made inside the switch with its peer sent straight into the host: no
    # interface of the rig ever exists in the root namespace, not even for a moment.
    ip netns add "$h" &&
      ip -n "$h" link set lo up &&
      ip -n "$sw" link add "h$k" type veth peer name eth0 netns "$h" &&
      ip -n "$sw" link set "h$k" master br0 up &&
      ip -n "$h" addr add "$net.$k/24" dev eth0 &&
      ip -n "$h" link set eth0 up || return 1
    # ip netns exec binds the files of /etc/netns/NS over /etc: each host resolves h1..hN.
    mkdir -p "/etc/netns/$h" || return 1
    {
      echo "127.0.0.1 localhost"
      echo "::1 localhost"
      for ((j = 1; j <= n; j++)); do echo "$net.$j h$j $name-h$j"; done
    } >"/etc/netns/$h/hosts" || return 1
  done
}

# The rig's namespaces that exist (also those of a half-made or half-removed rig).
_rig_list_ns() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(sw|h[0-9]+)$"
}

# The pids of every process in the namespaces given, but this shell's own.
_rig_ns_pids() {
  local ns p
  for ns in "$@"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      [[ $p == "$$" || $p == "$BASHPID" ]] || echo "$p"
    done
  done
}

# Is PID a live process (not gone, not a zombie)? Builtins only: it is polled.
_rig_alive() {
  local s
  { read -r s <"/proc/$1/stat"; } 2>/dev/null || return 1
  s=${s##*) }
  [[ ${s:0:1} != Z ]]
}

# Stop every process in the namespaces given: TERM, then KILL what is left after RIG_GRACE
# seconds; rescanned, for what was forked meanwhile. Returns 1 if something survives KILL (a
# process stuck in the kernel).
_rig_kill_ns() {
  local pids p live round end
  for ((round = 0; round < 3; round++)); do
    pids=$(_rig_ns_pids "$@")
    [[ -n $pids ]] || return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    end=$((${EPOCHREALTIME/./} + RIG_GRACE * 1000000))
    while :; do
      live=
      for p in $pids; do _rig_alive "$p" && live+=" $p"; done
      [[ -n $live && ${EPOCHREALTIME/./} -lt $end ]] || break
      sleep 0.05
    done
    [[ -n $live ]] || continue
    # shellcheck disable=SC2086
    kill -KILL $live 2>/dev/null || true
    end=$((${EPOCHREALTIME/./} + 5000000))
    while :; do
      pids=$live live=
      for p in $pids; do _rig_alive "$p" && live+=" $p"; done
      [[ -n $live && ${EPOCHREALTIME/./} -lt $end ]] || break
      sleep 0.05
    done
  done
  pids=$(_rig_ns_pids "$@")
  [[ -n $pids ]] || return 0
  _rig_err "processes survive SIGKILL in $*: ${pids//$'\n'/ }"
  return 1
}

rig_down() {
  if [[ $# -ne 1 ]]; then
    _rig_err "usage: rig down NAME"
    return 2
  fi
  _rig_name_ok "$1" || return 2
  local name=$1 rc=0 ns nss=() d
  mapfile -t nss < <(_rig_list_ns "$name")
  if [[ ${#nss[@]} -gt 0 ]]; then
    _rig_kill_ns "${nss[@]}" || rc=1
    # Hosts first, then the switch (deleting a host's namespace takes its veth pair along).
    for ns in "${nss[@]}"; do
      [[ $ns == "$name-sw" ]] || ip netns del "$ns" 2>/dev/null || rc=1
    done
    [[ " ${nss[*]} " != *" $name-sw "* ]] || ip netns del "$name-sw" 2>/dev/null || rc=1
  fi
  for d in /etc/netns/"$name"-h*; do
    [[ ! -d $d || ! ${d##*/} =~ ^$name-h[0-9]+$ ]] || rm -rf "$d"
  done
  rmdir /etc/netns 2>/dev/null || true
  rm -rf "${RIG_RUN:?}/$name"
  return $rc
}

rig_gc() {
  local d name pid start now fd dead=() msg=()
  [[ -d $RIG_RUN ]] || return 0
  # Owners are read under the lock rig_up holds from a rig's mkdir to its owner line: read
  # without it, a rig being made has no owner yet and looks orphaned (a make test ran it_rig
  # beside it_cluster, and it_rig's gc removed it_cluster's new rig).
  exec {fd}>"$RIG_RUN/.lock"
  flock "$fd"
  for d in "$RIG_RUN"/*/; do
    [[ -d $d ]] || continue
    name=${d%/}
    name=${name##*/}
    read -r pid start <"$d/owner" 2>/dev/null || pid=
    [[ $pid != none ]] || continue
    now=
    [[ -z $pid ]] || now=$(_rig_start_time "$pid")
    if [[ -z $now || $now != "${start-}" ]]; then
      dead+=("$name")
      msg+=("removing rig '$name': its owner (pid ${pid:-?}) is gone")
    fi
  done
  exec {fd}>&-
  for ((d = 0; d < ${#dead[@]}; d++)); do
    _rig_err "${msg[d]}"
    rig_down "${dead[d]}" || true
  done
}

rig_autoclean() {
  _rig_name_ok "${1-}" || return 2
  _rig_auto+=("$1")
  [[ -z ${_rig_trapped-} ]] || return 0
  _rig_trapped=1
  local prev
  prev=$(trap -p EXIT)
  _rig_prev_exit=
  if [[ -n $prev ]]; then
    eval "set -- $prev"
    _rig_prev_exit=$3
  fi
  # Not a function: the earlier trap's text runs where it would have run, with the script's
  # own positional parameters.
  # shellcheck disable=SC2154 # _rig_rc is set by the trap itself
  trap '_rig_rc=$?; _rig_down_auto; eval "$_rig_prev_exit"; exit "$_rig_rc"' EXIT
  # A signal becomes an exit, which runs the EXIT trap. Bash acts on a signal only once its
  # foreground command returns: a test waits with `sleep N & wait $!`, never a long `sleep N`.
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

_rig_down_auto() {
  local n
  trap '' INT TERM HUP
  for n in "${_rig_auto[@]}"; do rig_down "$n" || true; done
}

# The argv that runs a command in host K: its namespace, and its own hostname hK.
_rig_exec_argv() {
  _rig_host_ok "$1" "${2-}" || return 2
  # shellcheck disable=SC2016 # $0 and $@ are sh's, not ours
  _rig_argv=(ip netns exec "$1-$2" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$2")
}

rig_exec() {
  if [[ $# -lt 3 ]]; then
    _rig_err "usage: rig exec NAME hK CMD..."
    return 2
  fi
  _rig_exec_argv "$1" "$2" || return 2
  local a=("${_rig_argv[@]}")
  shift 2
  "${a[@]}" "$@"
}

rig_spawn() {
  if [[ $# -lt 3 ]]; then
    _rig_err "usage: rig_spawn NAME hK CMD..."
    return 2
  fi
  _rig_exec_argv "$1" "$2" || return 2
  local a=("${_rig_argv[@]}")
  shift 2
  # ip, unshare and sh each exec the next: $! is CMD's own pid.
  "${a[@]}" "$@" &
  # shellcheck disable=SC2034 # the caller's
  RIG_PID=$!
}

# Pulling a host's cable is modelled at the switch end: the host's eth0 stays configured and
# administratively up, and only loses its carrier (NO-CARRIER), as a real NIC does when the
# cable is pulled or the switch port dies. Taking the host end down instead would be the host
# disabling its own interface, which also flushes its routes.
rig_cut() {
  if [[ $# -ne 2 ]]; then
    _rig_err "usage: rig cut NAME hK"
    return 2
  fi
  _rig_host_ok "$1" "$2" || return 2
  ip -n "$1-sw" link set "$2" down
}

rig_heal() {
  if [[ $# -ne 2 ]]; then
    _rig_err "usage: rig heal NAME hK"
    return 2
  fi
  _rig_host_ok "$1" "$2" || return 2
  ip -n "$1-sw" link set "$2" up
}

# Bytes per second of a tc rate (integer with unit: bit kbit mbit gbit, or bps kbps mbps gbps,
# SI multiples as tc reads them), empty if it is not one.
_rig_rate_bytes() {
  [[ $1 =~ ^([1-9][0-9]{0,5})(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$ ]] || return 0
  local v=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in
    bit) echo $((v / 8)) ;;
    kbit) echo $((v * 1000 / 8)) ;;
    mbit) echo $((v * 1000000 / 8)) ;;
    gbit) echo $((v * 1000000000 / 8)) ;;
    bps) echo "$v" ;;
    kbps) echo $((v * 1000)) ;;
    mbps) echo $((v * 1000000)) ;;
    gbps) echo $((v * 1000000000)) ;;
  esac
}

# Does this kernel have netem (the delay qdisc)? Asked in a throwaway namespace.
rig_has_netem() {
  unshare --net tc qdisc add dev lo root netem delay 1ms >/dev/null 2>&1
}

rig_shape() {
  if [[ $# -lt 3 || $# -gt 4 ]]; then
    _rig_err "usage: rig shape NAME hK RATE [DELAY] (RATE e.g. 1gbit, or off; DELAY e.g. 1ms)"
    return 2
  fi
  _rig_host_ok "$1" "$2" || return 2
  local name=$1 h=$2 rate=$3 delay=${4:-0} bytes burst ends end
  ends=("$name-$h eth0" "$name-sw $h")
  if [[ $rate == off ]]; then
    for end in "${ends[@]}"; do
      # shellcheck disable=SC2086
      set -- $end
      tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
    done
    return 0
  fi
  bytes=$(_rig_rate_bytes "$rate")
  if [[ -z $bytes || $bytes -lt 1000 ]]; then
    _rig_err "bad rate '$rate': an integer with bit, kbit, mbit, gbit, bps, kbps, mbps" \
      "or gbps, at least 8kbit (or off)"
    return 2
  fi
  if [[ ! $delay =~ ^(0|[1-9][0-9]{0,6}(us|ms|s))$ ]]; then
    _rig_err "bad delay '$delay': 0, or an integer with us, ms or s"
    return 2
  fi
  if [[ $delay != 0 ]] && ! rig_has_netem; then
    echo "SKIP: this kernel has no netem (CONFIG_NET_SCH_NETEM): a link delay cannot be" \
      "emulated here; rate shaping (tbf) works"
    return 77
  fi
  # tbf's bucket: 10 ms at the rate, at least 16 KiB (several full-size frames); its queue
  # holds 50 ms more.
  burst=$((bytes / 100))
  ((burst >= 16384)) || burst=16384
  # Each end shapes what it sends: the host end the host's uplink, the switch end its downlink.
  for end in "${ends[@]}"; do
    # shellcheck disable=SC2086
    set -- $end
    tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
    if [[ $delay == 0 ]]; then
      tc -n "$1" qdisc add dev "$2" root handle 1: tbf rate "$rate" burst "$burst" \
        latency 50ms || return 1
    else
      tc -n "$1" qdisc add dev "$2" root handle 1: netem delay "$delay" &&
        tc -n "$1" qdisc add dev "$2" parent 1:1 handle 10: tbf rate "$rate" \
          burst "$burst" latency 50ms || return 1
    fi
  done
}

rig_status() {
  local name n k h state q
  if [[ $# -eq 0 ]]; then
    for name in "$RIG_RUN"/*/; do
      [[ -d $name ]] || continue
      name=${name%/}
      name=${name##*/}
      echo "$name hosts=$(cat "$RIG_RUN/$name/n") net=$(cat "$RIG_RUN/$name/net").0/24" \
        "owner=$(cut -d' ' -f1 "$RIG_RUN/$name/owner")"
    done
    return 0
  fi
  if [[ $# -ne 1 ]]; then
    _rig_err "usage: rig status [NAME]"
    return 2
  fi
  _rig_name_ok "$1" || return 2
  name=$1
  n=$(cat "$RIG_RUN/$name/n" 2>/dev/null) || { _rig_err "no rig '$name'"; return 1; }
  echo "rig $name: switch $name-sw, net $(cat "$RIG_RUN/$name/net").0/24"
  for ((k = 1; k <= n; k++)); do
    h=h$k
    if ip -n "$name-sw" -o link show "$h" 2>/dev/null | grep -q '<[^>]*\bUP\b'; then
      state='up'
    else
      state='cut'
    fi
    q=$(tc -n "$name-$h" qdisc show dev eth0 2>/dev/null | grep -oE '(tbf|netem) .*' |
      sed -E -e 's/ [0-9a-f]+: (root|parent [0-9a-f:]+) refcnt [0-9]+//' \
        -e 's/ (burst|lat|limit|seed) .*//' | tr '\n' ' ' || true)
    echo "$h ns=$name-$h addr=$(rig_addr "$name" "$h") link=$state shape=${q:-none}"
  done
}
