#!/usr/bin/env python3
"""A tiny TCP peer for the test cluster's self-test (it_rig.sh); standard library only.

  tcp.py serve READY [ADDR]        listen on ADDR (default 0.0.0.0), a port the kernel picks,
                                   written to the file READY once listening; each connection:
                                   read to EOF, answer "ok BYTES"
  tcp.py probe ADDR PORT TIMEOUT   connect, send "ping", exit 0 on the answer, 1 otherwise;
                                   a failure prints the seconds it took on stdout
  tcp.py send ADDR PORT BYTES TIMEOUT
                                   send BYTES bytes, wait for the answer; print the seconds
                                   from connect to answer
"""
import os
import socket
import sys
import threading
import time


def serve(ready, addr):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 0))
    s.listen(64)
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % s.getsockname()[1])
    os.rename(tmp, ready)

    def answer(c):
        n = 0
        with c:
            while True:
                b = c.recv(1 << 16)
                if not b:
                    break
                n += len(b)
            c.sendall(b"ok %d\n" % n)

    while True:
        c, _ = s.accept()
        threading.Thread(target=answer, args=(c,), daemon=True).start()


def exchange(addr, port, data, timeout):
    t0 = time.monotonic()
    with socket.create_connection((addr, port), timeout=timeout) as c:
        c.settimeout(max(0.1, timeout - (time.monotonic() - t0)))
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        reply = c.recv(64)
    if reply != b"ok %d\n" % len(data):
        raise OSError("unexpected answer %r" % reply)
    return time.monotonic() - t0


def main(argv):
    t0 = time.monotonic()
    try:
        if argv[:1] == ["serve"] and len(argv) in (2, 3):
            serve(argv[1], argv[2] if len(argv) == 3 else "0.0.0.0")
        elif argv[:1] == ["probe"] and len(argv) == 4:
            exchange(argv[1], int(argv[2]), b"ping", float(argv[3]))
        elif argv[:1] == ["send"] and len(argv) == 5:
            dt = exchange(argv[1], int(argv[2]), b"x" * int(argv[3]), float(argv[4]))
            print("%.3f" % dt)
        else:
            sys.stderr.write(__doc__)
            return 2
    except (OSError, ValueError) as e:
        sys.stderr.write("tcp.py %s: %s\n" % (" ".join(argv[:3]), e))
        if argv[:1] == ["probe"]:
            print("%.3f" % (time.monotonic() - t0))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
