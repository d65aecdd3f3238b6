"""Who owns the plugin's socket (run by tests/it_device_plugin.sh): two rk device-plugin on one
directory must not evict each other. With the fake kubelet on DIR and instance A serving and
registered: a second instance B on DIR exits 1 with one line naming the socket "served by
another process", and A keeps its socket, its one registration and its ListAndWatch stream;
an unknown method is answered UNIMPLEMENTED at once (no request message waited for); a stale
socket (nothing listens) at the path is replaced at start; A's socket replaced by one another
process listens on stops A (exit 1, the line) and leaves that socket in place. Prints
"ok - ..." / "FAIL - ..." lines (tests/itlib.sh's it_count).

    check_socket_owner.py PROTO DIR RK LOGDIR
"""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_kubelet import FakeKubelet, load_stubs, check, failed  # noqa: E402

proto, pdir, rk, logdir = sys.argv[1:5]
sock = os.path.join(pdir, "rekindle.sock")


def plugin(log, d=pdir):
    return subprocess.Popen([rk, "device-plugin", "--plugin-dir", d, "--sim", "2",
                             "--interval", "0.5"], stderr=open(log, "w"))


def last_line(path):
    with open(path) as f:
        lines = f.read().splitlines()
    return lines[-1] if lines else ""


def wait_exit(p, timeout):
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


pb, pbg = load_stubs(proto, tempfile.mkdtemp(prefix="dp-stubs-"))
k = FakeKubelet(pb, pbg, pdir)
k.start()
alog = os.path.join(logdir, "owner-a.log")
a = plugin(alog)
try:
    reg = k.wait_registration(1, timeout=10)
    first = k.wait_health(lambda h: len(h) == 2, timeout=5)
    check(reg is not None and first is not None, "instance A registered and streams 2 devices")
    ino = os.stat(sock).st_ino

    # a second instance on the same directory: refused, A untouched
    blog = os.path.join(logdir, "owner-b.log")
    b = plugin(blog)
    rc = wait_exit(b, 10)
    line = last_line(blog)
    check(rc == 1 and line.endswith(sock + " is served by another process: not replaced"),
          "a second instance on the same directory: exit %s, %s" % (rc, line))
    # A quiet window, kept: what is checked is that A says nothing. A's watch looks every 0.2 s,
    # so a lost socket would be seen and said by now; a late A can only make this pass without
    # meaning, never fail, and the socket's inode below is checked whatever A has done.
    time.sleep(1.5)
    with open(alog) as f:
        said = [x for x in f if "was removed" in x or "was replaced" in x]
    check(a.poll() is None and os.stat(sock).st_ino == ino and not said,
          "instance A still serves its own socket (%d lines of a lost socket)" % len(said))
    with k.cond:
        nreg, ended, errors = len(k.registrations), k.watch_ended, list(k.errors)
    check(nreg == 1, "instance A registered once, not again (%d registrations)" % nreg)
    check(ended is None and not errors,
          "instance A's ListAndWatch stream still open (%s)" % (errors or "no error"))
    check(k.stub.GetDevicePluginOptions(pb.Empty(), timeout=5).get_preferred_allocation_available,
          "instance A still answers")

    # an unknown method: UNIMPLEMENTED before any request message is sent
    hold = threading.Event()

    def never():
        hold.wait(10)
        return
        yield  # a generator that sends nothing until released

    call = k.channel.stream_stream("/v1beta1.DevicePlugin/NoSuchMethod",
                                   request_serializer=None, response_deserializer=None)
    t0 = time.monotonic()
    code = None
    try:
        for _ in call(never(), timeout=4):
            pass
    except grpc.RpcError as e:
        code = e.code()
    dt = time.monotonic() - t0
    hold.set()
    check(code == grpc.StatusCode.UNIMPLEMENTED and dt < 2,
          "an unknown method with no request message: %s after %.2f s" % (code, dt))

    # a stale socket (nothing listens) is replaced at start
    sdir = os.path.join(logdir, "stale-sock")
    os.makedirs(sdir, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(sdir, "rekindle.sock"))
    s.close()
    slog = os.path.join(logdir, "owner-stale.log")
    c = plugin(slog, sdir)
    served = False
    for _ in range(50):
        with open(slog) as f:
            if "serving " + os.path.join(sdir, "rekindle.sock") in f.read():
                served = True
                break
        time.sleep(0.1)
    check(served and c.poll() is None, "a stale socket at the path is replaced at start")
    c.terminate()
    check(wait_exit(c, 10) == 0, "the stale socket's instance: SIGTERM, exit 0")

    # A's socket replaced by one another process listens on: A stops, the socket stays
    os.unlink(sock)
    other = socket.socket(socket.AF_UNIX)
    other.bind(sock)
    other.listen(8)
    oino = os.stat(sock).st_ino
    rc = wait_exit(a, 10)
    line = last_line(alog)
    check(rc == 1 and line.endswith(sock + " is served by another process: stopping"),
          "its socket replaced by another process's: exit %s, %s" % (rc, line))
    check(os.path.exists(sock) and os.stat(sock).st_ino == oino,
          "the other process's socket left in place")
    other.close()
finally:
    if a.poll() is None:
        a.kill()
    k.stop()
sys.exit(1 if failed() else 0)
