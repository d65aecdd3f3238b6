"""store_retry.py: how long torch's store client takes to connect when it comes before the
store listens (the cost a replacement rank paid in place before it waited for rank 0's store:
docs/recovery.md "The warm spare"). A server process makes a TCPStore DELAY seconds after the
client starts; the client either connects at once (torch retries a refused connection on its
own schedule) or first waits for the port with a probe (rekindle.torch._inplace.await_store).
Prints, for each of ROUNDS rounds alternating, the seconds from the server's listen to the
client's connect. Usage: /usr/bin/python3 bench/store_retry.py [ROUNDS] [DELAY]
(defaults 3, 0.05); needs torch and rekindle on PYTHONPATH (python/)."""

import datetime
import socket
import subprocess
import sys
import time

import torch.distributed as dist

from rekindle.torch._inplace import await_store

SERVER = """
import datetime, sys, time
import torch.distributed as dist
port, delay = int(sys.argv[1]), float(sys.argv[2])
print("READY", flush=True)
sys.stdin.readline()
time.sleep(delay)
t = time.time()
st = dist.TCPStore("127.0.0.1", port, 2, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
print("LISTEN %.6f" % t, flush=True)
sys.stdin.readline()
"""


def one(probe, delay):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(delay)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        srv.stdout.readline()  # torch imported: the delay starts now
        srv.stdin.write("go\n")
        srv.stdin.flush()
        if probe:
            await_store("127.0.0.1", port)
        dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
        t1 = time.time()
        listen = float(srv.stdout.readline().split()[1])
        return t1 - listen
    finally:
        srv.stdin.write("end\n")
        srv.stdin.flush()
        srv.wait()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    delay = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
    got = {False: [], True: []}
    for r in range(rounds):
        for probe in ((False, True) if r % 2 == 0 else (True, False)):
            got[probe].append(one(probe, delay))
    for probe in (False, True):
        name = "probe first (await_store)" if probe else "torch's own retry"
        print(f"{name}: listen -> connect " + ", ".join(f"{x:.3f}" for x in got[probe]) + " s")


if __name__ == "__main__":
    main()
