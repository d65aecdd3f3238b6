"""The device plugin's scenario against the fake kubelet (run by tests/it_device_plugin.sh):
rk device-plugin already runs with --sim 3 --interval I --hysteresis H --textfile-dir TF on
DIR, started before any kubelet. Prints "ok - ..." / "FAIL - ..." lines (tests/itlib.sh's
it_count) and the delays it measured (printed only: a loaded machine is slower, so no check
bounds them). Every wait is for something the plugin says (a stream update, an answer), with a
deadline of WAIT s.

    check_device_plugin.py PROTO DIR TF LOG INTERVAL THRESHOLD HYSTERESIS
"""
import os
import re
import sys
import tempfile
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_kubelet import FakeKubelet, load_stubs, check, failed  # noqa: E402

proto, pdir, tf, log, interval, threshold, hyst = sys.argv[1:8]
interval, threshold, hyst = float(interval), float(threshold), float(hyst)
WAIT = 30  # the most any wait here takes: generous, a loaded machine is slow, not stuck


def write_textfile(name, lines):
    """Atomically (a dot-file the reader skips, then a rename), as a sensor script would."""
    tmp = os.path.join(tf, "." + name + ".tmp")
    with open(tmp, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    os.rename(tmp, os.path.join(tf, name))


def scores():
    """The scores the plugin announced at start: {id: score}."""
    out = {}
    with open(log) as f:
        for line in f:
            m = re.search(r"device (\d+): GPU \d+ .* score (\d+), (Healthy|Unhealthy)$", line)
            if m:
                out[m.group(1)] = int(m.group(2))
    return out


def rpc_error(fn):
    try:
        fn()
        return None
    except grpc.RpcError as e:
        return e


tmp = tempfile.mkdtemp(prefix="dp-stubs-")
pb, pbg = load_stubs(proto, tmp)

# ---- registration, at once when the kubelet's socket appears -------------------------------
k = FakeKubelet(pb, pbg, pdir)
t0 = time.monotonic()
k.start()
reg = k.wait_registration(1, timeout=WAIT)
if not check(reg is not None, "the plugin registered with the kubelet that appeared after it"):
    sys.exit(1)
t, r = reg
print("registration %.2f s after the kubelet's socket appeared" % (t - t0))
check(r.version == "v1beta1" and r.endpoint == "rekindle.sock"
      and r.resource_name == "rekindle.io/gpu" and r.options.get_preferred_allocation_available,
      "RegisterRequest: version %s, endpoint %s, resource %s, preferred allocation %s"
      % (r.version, r.endpoint, r.resource_name, r.options.get_preferred_allocation_available))
first = k.wait_health(lambda h: len(h) == 3, timeout=WAIT)
check(first is not None and first[1] == {"0": "Healthy", "1": "Healthy", "2": "Healthy"},
      "ListAndWatch: the three simulated devices 0, 1, 2, all Healthy: %s"
      % (first[1] if first else k.errors))
check(k.options is not None and k.options.get_preferred_allocation_available
      and not k.options.pre_start_required,
      "GetDevicePluginOptions: preferred allocation available, no PreStartContainer")
s0 = scores()
print("announced scores: %s" % s0)

# ---- Allocate of a healthy device -------------------------------------------------------
a = k.allocate(["0"], ["2", "1"])
c0, c1 = a.container_responses
check(dict(c0.envs) == {"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"}
      and dict(c1.envs) == {"NVIDIA_VISIBLE_DEVICES": "2,1", "CUDA_VISIBLE_DEVICES": "2,1"}
      and len(c0.devices) == 0,
      "Allocate of healthy devices: per container NVIDIA_/CUDA_VISIBLE_DEVICES %s, %s; no "
      "device nodes for simulated GPUs" % (dict(c0.envs), dict(c1.envs)))

# ---- device 1 fails: a crit VRM ripple and fan vibration ---------------------------------
n = len(k.updates)
t_write = time.monotonic()
write_textfile("gpu1.prom", ['rk_sensor_vrm_ripple_volts{gpu="1"} 0.150',
                             'rk_sensor_fan_vibration_hertz{gpu="1"} 450'])
u = k.wait_health(lambda h: h.get("1") == "Unhealthy", timeout=WAIT, since=n)
if check(u is not None, "device 1 streamed Unhealthy after its textfile"):
    print("device 1 Unhealthy on the stream %.3f s after the textfile (interval %g s)"
          % (u[0] - t_write, interval))
    check(u[1]["0"] == "Healthy" and u[1]["2"] == "Healthy",
          "the others stay Healthy in the same update: %s" % u[1])
e = rpc_error(lambda: k.allocate(["1"]))
check(e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION
      and "device 1" in e.details() and "score" in e.details(),
      "Allocate of device 1 refused: %s" % (("%s: %s" % (e.code(), e.details())) if e else "it was not"))
e = rpc_error(lambda: k.allocate(["0", "1"]))
check(e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION,
      "Allocate of a container holding devices 0 and 1 refused as a whole")
e = rpc_error(lambda: k.allocate(["7"]))
check(e is not None and e.code() == grpc.StatusCode.NOT_FOUND and "7" in e.details(),
      "Allocate of an unknown device: %s" % (e.code() if e else "not refused"))
p2 = k.preferred(["0", "1", "2"], [], 2)
p3 = k.preferred(["0", "1", "2"], [], 3)
check("1" not in p2 and sorted(p2) == ["0", "2"] and p3[-1] == "1",
      "GetPreferredAllocation leaves the unhealthy device out (size 2: %s) and last (size 3: %s)"
      % (p2, p3))

# ---- hysteresis: a warn-level textfile is not enough to be Healthy again ------------------
# The plugin has read the file once Allocate's refusal says the score "has not recovered"
# (between T and T + H; the crit score was "below the threshold"): the signal waited for.
n = len(k.updates)
write_textfile("gpu1.prom", ['rk_sensor_vrm_ripple_volts{gpu="1"} 0.060',
                             'rk_sensor_fan_vibration_hertz{gpu="1"} 300'])
end = time.monotonic() + WAIT
while True:
    e = rpc_error(lambda: k.allocate(["1"]))
    if (e is not None and "has not recovered" in e.details()) or time.monotonic() > end:
        break
    time.sleep(0.2)  # each refusal is a line in the plugin's log: a few, not hundreds
back = k.wait_health(lambda h: h.get("1") == "Healthy", timeout=0, since=n)
check(back is None and e is not None and "has not recovered" in e.details(),
      "hysteresis: device 1 at warn level (%s - 30 points, below %g + %g) stays Unhealthy once "
      "read, never streamed Healthy; Allocate says: %s"
      % (s0.get("1"), threshold, hyst, e.details() if e else "nothing"))

# ---- healed: the textfile removed -----------------------------------------------------------
n = len(k.updates)
t_rm = time.monotonic()
os.unlink(os.path.join(tf, "gpu1.prom"))
u = k.wait_health(lambda h: h.get("1") == "Healthy", timeout=WAIT, since=n)
if check(u is not None, "device 1 streamed Healthy again once its textfile was removed"):
    print("device 1 Healthy again %.3f s after the textfile was removed" % (u[0] - t_rm))
a = rpc_error(lambda: k.allocate(["1"]))
check(a is None, "Allocate of the healed device 1 succeeds")

# ---- the PCIe switch: simulated GPUs 0 and 1 share a switch, 2 is alone -------------------
# device 0 lowered by 15 points (a VRM warning) stays Healthy but scores below device 2: the
# switch preference must still pair it with 1
need = s0.get("0", 0) - 15 >= threshold and s0.get("2", 0) > s0.get("0", 0) - 15
if check(need, "the fleet has the scores this check needs (0 - 15 >= %g, 2 > 0 - 15): %s"
         % (threshold, s0)):
    write_textfile("gpu0.prom", ['rk_sensor_vrm_ripple_volts{gpu="0"} 0.060'])
    # read once the plugin prefers 2 over 0 alone (size 1: the anchor is the switch of the
    # higher score); at once if 2 already scored higher
    end = time.monotonic() + WAIT
    while (p1 := k.preferred(["0", "2"], [], 1)) != ["2"] and time.monotonic() < end:
        time.sleep(0.05)
    check(p1 == ["2"], "device 0's warn-level textfile read: of 0 and 2, size 1: %s (2)" % p1)
    pm = k.preferred(["0", "1", "2"], ["1"], 2)
    pb2 = k.preferred(["0", "1", "2"], [], 2)
    check(pm == ["1", "0"], "must_include [1], size 2: %s (its switch-mate 0 before the "
          "higher-scoring 2)" % pm)
    check(sorted(pb2) == ["0", "1"], "size 2 without must_include: %s (the switch holding two "
          "healthy devices)" % pb2)
    pm3 = k.preferred(["0", "1", "2"], ["2"], 2)
    check(pm3[0] == "2" and len(pm3) == 2, "must_include [2] comes first: %s" % pm3)
    os.unlink(os.path.join(tf, "gpu0.prom"))

# ---- malformed requests: gRPC errors, the plugin keeps serving ------------------------------
e = rpc_error(lambda: k.raw("Allocate", b"\x0a\x05\x0a\x03\xff\xfe"))
check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT,
      "a malformed AllocateRequest: %s" % (("%s %s" % (e.code(), e.details())) if e else "accepted"))
e = rpc_error(lambda: k.raw("Allocate", b"\x0a\x41\x0a\x3f" + b"x" * 10))
check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT,
      "a truncated AllocateRequest: %s" % (e.code() if e else "accepted"))
e = rpc_error(lambda: k.raw("Allocate", pb.AllocateRequest(container_requests=[
    pb.ContainerAllocateRequest(devices_ids=["x" * 64])]).SerializeToString()))
check(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and "63" in e.details(),
      "a 64-byte device id: %s" % (e.details() if e else "accepted"))
e = rpc_error(lambda: k.raw("NoSuchMethod", b""))
check(e is not None and e.code() == grpc.StatusCode.UNIMPLEMENTED,
      "an unknown method: %s" % (e.code() if e else "accepted"))
check(rpc_error(lambda: k.allocate(["0"])) is None, "still serving after them")

# ---- the kubelet restarts: it wipes the directory, comes back, and is registered with -------
nupd = len(k.updates)
k.stop()
for name in os.listdir(pdir):
    os.unlink(os.path.join(pdir, name))
k2 = FakeKubelet(pb, pbg, pdir)
t0 = time.monotonic()
k2.start()
reg = k2.wait_registration(1, timeout=WAIT)
if check(reg is not None, "a new Register after the kubelet restarted (its directory wiped)"):
    print("re-registration %.2f s after the new kubelet's socket appeared" % (reg[0] - t0))
    u = k2.wait_health(lambda h: len(h) == 3, timeout=WAIT)
    check(u is not None and all(v == "Healthy" for v in u[1].values()),
          "the new kubelet's ListAndWatch: %s" % (u[1] if u else k2.errors))
    check(rpc_error(lambda: k2.allocate(["2"])) is None, "Allocate through the new socket")
check(not k.errors and not k2.errors, "no stream errors: %s" % (k.errors + k2.errors))
# the plugin logs a registration once the kubelet's answer reached it: the fake kubelet counts
# the request before it answers, and a stop before the plugin read the answer cancelled it
# ("UNAVAILABLE: Cancelling all calls"; the log then had one registration: a busy machine)
registered = "registered rekindle.io/gpu with the kubelet (%s): endpoint" % os.path.join(pdir, "kubelet.sock")
deadline = time.monotonic() + WAIT
while time.monotonic() < deadline:
    with open(log) as f:
        if sum(registered in line for line in f) >= 2:
            break
    time.sleep(0.02)
k2.stop()
sys.exit(1 if failed() else 0)
