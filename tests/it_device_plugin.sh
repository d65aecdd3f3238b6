#!/usr/bin/env bash
# rk device-plugin against a fake kubelet over the real device-plugin gRPC API
# (tests/k8s/fake_kubelet.py, stubs generated from the vendored api.proto): (1) bad flags exit
# 2 naming the problem (T + H over 100 naming both flags); no NVML and no --sim exits 1, and
# so does a regular file at the socket's path (left alone); (2) with --sim 3 --interval 0.5
# --hysteresis 20 --textfile-dir, started before the kubelet (it says it waits): registration
# (resource, endpoint, version), all devices Healthy, a crit textfile makes device 1 Unhealthy
# on the stream (the delay printed), Allocate refuses it with a gRPC error
# naming it and returns the envs for healthy ones, GetPreferredAllocation leaves it out, a
# warn-level textfile keeps it Unhealthy (hysteresis), removing the file heals it, the PCIe
# switch preference, malformed requests refused; the kubelet restarting (its directory wiped)
# brings a new Register; (3) every log line says simulated; SIGTERM ends it with status 0 and
# its socket removed; a kubelet socket nobody answers on is retried with a growing backoff, one
# line each; its directory removed and made again is served again; (3d) two instances on one
# directory (tests/k8s/check_socket_owner.py): the second exits 1 "served by another process",
# the first keeps its socket, registration and stream; an unknown method answered at once; a
# stale socket replaced; the first's socket taken over by another process stops it, leaving
# that socket; (4) `kubectl create --dry-run=client` accepts deploy/k8s/'s DaemonSet.
# Skips (77) without /usr/bin/python3's grpc and grpc_tools modules.
set -u
PY=/usr/bin/python3 # the grpc modules are Debian's (python3-grpcio, python3-grpc-tools)
if ! "$PY" -c 'import grpc, grpc_tools.protoc' 2>/dev/null; then
  echo "SKIP: $PY cannot import grpc and grpc_tools (install python3-grpcio python3-grpc-tools)"
  exit 77
fi
source "$(dirname "${BASH_SOURCE[0]}")/itlib.sh"
it_init it_device_plugin
dp=$work/dp tf=$work/tf
mkdir -p "$dp" "$tf"

# ---- (1) bad usage ------------------------------------------------------------------------
usage() { # usage WHAT ARGS...: exit 2 and a first line naming the problem
  local what=$1 out rc; shift
  out=$("$RK" device-plugin "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc == 2 && $(head -1 <<<"$out") == "rk device-plugin: "*"$what"* ]]; then
    ok "bad usage ($*): exit 2, $(head -1 <<<"$out")"
  else
    bad "bad usage ($*): exit $rc, $(head -1 <<<"$out")"
  fi
}
usage "--bogus" --bogus
usage "--interval" --sim 1 --interval 0
usage "--threshold" --sim 1 --threshold 101
usage "--hysteresis" --sim 1 --hysteresis -1
usage "--sim" --sim 0
usage "--seed" --seed 3
usage "--resource" --sim 1 --resource gpu
usage "--resource" --sim 1 --resource "Rekindle.io/gpu"
usage "--threshold 95 + --hysteresis 10 is over 100" --sim 1 --threshold 95 --hysteresis 10
usage "--threshold 60 + --hysteresis 41 is over 100" --sim 1 --hysteresis 41
usage "socket name 'kubelet.sock'" --sim 1 --plugin-dir "$dp" --socket kubelet.sock
usage "socket name 'a/b'" --sim 1 --plugin-dir "$dp" --socket a/b
usage "--plugin-dir" --sim 1 --plugin-dir "$work/nope"
usage "unexpected argument" --sim 1 extra
long=$work/$(printf 'd%.0s' $(seq 1 100))
mkdir -p "$long"
out=$("$RK" device-plugin --sim 1 --plugin-dir "$long" 2>&1)
rc=$?
[[ $rc == 2 && $out == *"Unix socket path"* ]] && ok "a socket path too long for AF_UNIX: exit 2" \
  || bad "a socket path too long: exit $rc: $out"
out=$(env RK_NVML_LIB=/nonexistent "$RK" device-plugin --plugin-dir "$dp" 2>&1)
rc=$?
# RK_NVML_LIB names a library that is not there: no NVML, even on a machine with a GPU
if [[ $rc == 1 && $(wc -l <<<"$out") == 1 && $out == *"--sim N"* ]]; then
  ok "no NVML and no --sim: exit 1, one line: $out"
else
  bad "no NVML and no --sim: exit $rc: $out"
fi
# a regular file where the socket goes: not replaced, exit 1 (it cannot be served: no usage error)
reg=$work/regular
mkdir -p "$reg"
echo keep >"$reg/rekindle.sock"
out=$("$RK" device-plugin --sim 1 --plugin-dir "$reg" 2>&1)
rc=$?
if [[ $rc == 1 && $(tail -1 <<<"$out") == *"$reg/rekindle.sock exists and is not a socket"* &&
      $(cat "$reg/rekindle.sock") == keep ]]; then
  ok "a regular file at the socket's path: exit 1, left alone: $(tail -1 <<<"$out")"
else
  bad "a regular file at the socket's path: exit $rc: $(tail -1 <<<"$out")"
fi
"$RK" device-plugin --help | grep -q -- '--hysteresis H' && ok "--help lists the options" \
  || bad "--help"

# ---- (2) the scenario against the fake kubelet --------------------------------------------
"$RK" device-plugin --plugin-dir "$dp" --sim 3 --seed 1 --interval 0.5 --hysteresis 20 \
  --textfile-dir "$tf" 2>"$work/dp.log" &
pid=$!
pids+=("$pid")
for _ in $(seq 1 100); do
  [[ -S $dp/rekindle.sock ]] && break
  sleep 0.1
done
[[ -S $dp/rekindle.sock ]] && ok "serving $dp/rekindle.sock" || bad "no socket: $(cat "$work/dp.log")"
grep -q "waiting for the kubelet: $dp/kubelet.sock does not exist" "$work/dp.log" \
  && ok "without a kubelet: it says it waits" || bad "no waiting line"
it_count "$PY" "$RK_SRC/tests/k8s/check_device_plugin.py" \
  "$RK_SRC/third_party/deviceplugin/v1beta1/api.proto" "$dp" "$tf" "$work/dp.log" 0.5 60 20

# ---- (3) the log and SIGTERM ----------------------------------------------------------------
kill -TERM "$pid"
t0=$(date +%s%N)
rc=running
for _ in $(seq 1 50); do
  if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; rc=$?; break; fi
  sleep 0.1
done
ms=$((($(date +%s%N) - t0) / 1000000))
[[ $rc == 0 ]] && ok "SIGTERM: exit 0 within $ms ms" || bad "SIGTERM: $rc"
[[ ! -e $dp/rekindle.sock ]] && ok "its socket removed" || bad "its socket is still there"
lines=$(wc -l <"$work/dp.log")
unsim=$(grep -vc '^rk device-plugin: \[simulated\] ' "$work/dp.log")
[[ $lines -gt 10 && $unsim == 0 ]] && ok "all $lines log lines say [simulated]" \
  || bad "$unsim of $lines log lines do not say [simulated]"
n=$(grep -c "registered rekindle.io/gpu with the kubelet ($dp/kubelet.sock): endpoint rekindle.sock" "$work/dp.log")
[[ $n -ge 2 ]] && ok "successful registrations logged ($n: the first and after the kubelet's restart)" \
  || bad "$n successful registrations in the log"
echo "--- the plugin's log"
cat "$work/dp.log"
echo "---"

# ---- (3b) a kubelet socket nobody answers on: one clear line per try, a growing backoff ------
stale=$work/stale
mkdir -p "$stale"
"$PY" -c 'import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.close()' \
  "$stale/kubelet.sock"
"$RK" device-plugin --plugin-dir "$stale" --sim 1 --interval 0.5 2>"$work/stale.log" &
spid=$!
pids+=("$spid")
for _ in $(seq 1 60); do
  grep -q "retrying in 2 s" "$work/stale.log" && break
  sleep 0.1
done
if grep -q "cannot register with the kubelet at $stale/kubelet.sock: .*; retrying in 1 s" "$work/stale.log" &&
   grep -q "; retrying in 2 s" "$work/stale.log"; then
  ok "a dead kubelet socket: $(grep -m1 'cannot register' "$work/stale.log" | cut -c1-160)... then 2 s"
else
  bad "a dead kubelet socket: $(cat "$work/stale.log")"
fi
kill -TERM "$spid"
wait "$spid"
rc=$?
[[ $rc == 0 ]] && ok "still running while the kubelet is gone; SIGTERM: exit 0" || bad "stale: exit $rc"

# ---- (3c) the directory itself removed and made again: said once, served again ---------------
gone=$work/gone
mkdir -p "$gone"
"$RK" device-plugin --plugin-dir "$gone" --sim 1 --interval 0.5 2>"$work/gone.log" &
gpid=$!
pids+=("$gpid")
for _ in $(seq 1 50); do [[ -S $gone/rekindle.sock ]] && break; sleep 0.1; done
rm -rf "$gone"
# once it has said so, two more of its binds (one a second) fail while the directory is gone:
# none may say it again
for _ in $(seq 1 300); do grep -q "the directory $gone is gone" "$work/gone.log" && break; sleep 0.1; done
sleep 2.5
mkdir "$gone"
for _ in $(seq 1 50); do [[ -S $gone/rekindle.sock ]] && break; sleep 0.1; done
said=$(grep -c "the directory $gone is gone" "$work/gone.log")
[[ -S $gone/rekindle.sock && $said == 1 ]] && ok "its directory removed and made again: said once, served again" \
  || bad "directory gone: socket $( [[ -S $gone/rekindle.sock ]] && echo back || echo missing), said $said times"
kill -TERM "$gpid"
wait "$gpid"
rc=$?
others=$(grep -vc '^rk device-plugin: \[simulated\] ' "$work/gone.log" "$work/stale.log" | awk -F: '{n += $2} END {print n}')
[[ $rc == 0 && $others == 0 ]] && ok "exit 0; no line but its own (gRPC's log kept quiet)" \
  || bad "gone: exit $rc, $others foreign lines: $(grep -v '^rk device-plugin' "$work/gone.log" | head -2)"

# ---- (3d) who owns the socket: a second instance on the same directory is refused ------------
owner=$work/owner
mkdir -p "$owner"
it_count "$PY" "$RK_SRC/tests/k8s/check_socket_owner.py" \
  "$RK_SRC/third_party/deviceplugin/v1beta1/api.proto" "$owner" "$RK" "$work"

# ---- (4) the DaemonSet --------------------------------------------------------------------
# kubectl maps kinds to resources through the API server's discovery even for a client-side
# dry run: tests/k8s/fake_apiserver.py serves only that (and accepts nothing).
if [[ -x /usr/bin/kubectl ]]; then
  "$PY" "$RK_SRC/tests/k8s/fake_apiserver.py" >"$work/api.port" &
  pids+=($!)
  for _ in $(seq 1 50); do [[ -s $work/api.port ]] && break; sleep 0.1; done
  kc=(env HOME="$work" /usr/bin/kubectl --server="http://127.0.0.1:$(cat "$work/api.port")")
  yaml=$RK_SRC/deploy/k8s/rk-device-plugin.yaml
  if out=$("${kc[@]}" create --dry-run=client --validate=false -f "$yaml" 2>&1); then
    ok "kubectl create --dry-run=client --validate=false accepts deploy/k8s/rk-device-plugin.yaml: $out"
  else
    bad "kubectl refuses deploy/k8s/rk-device-plugin.yaml: $out"
  fi
  "${kc[@]}" create --dry-run=client --validate=false -o json -f "$yaml" >"$work/ds.json" 2>&1
  it_count "$PY" - "$work/ds.json" <<'PY'
import json, sys
ds = json.load(open(sys.argv[1]))
spec = ds["spec"]["template"]["spec"]
c = spec["containers"][0]
paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
mounts = {m["name"]: m for m in c["volumeMounts"]}
def check(cond, msg):
    print(("ok - " if cond else "FAIL - ") + msg)
check(ds["kind"] == "DaemonSet", "the manifest is a DaemonSet")
for name, path in (("device-plugins", "/var/lib/kubelet/device-plugins"), ("dev", "/dev")):
    m = mounts.get(name, {})
    check(paths.get(name) == path and m.get("mountPath") == path,
          "host path %s mounted at the same place" % path)
check(not mounts["device-plugins"].get("readOnly"), "the device-plugin directory writable")
check(c["securityContext"].get("privileged") is True, "privileged (NVML opens the device nodes)")
check(c["command"][:2] == ["rk", "device-plugin"], "runs rk device-plugin: %s" % c["command"])
check(not spec.get("hostNetwork") and spec.get("automountServiceAccountToken") is False,
      "no host network, no service account token")
PY
else
  echo "(kubectl not found: the DaemonSet's dry run is skipped; install kubernetes-client)"
fi
it_finish
