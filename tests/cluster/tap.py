#!/usr/bin/env python3
"""A recording relay for the test cluster (it_cluster.sh's replay check): what an attacker on
the wire between an agent and the coordinator would see, and send again. Standard library only.

  tap.py relay ADDR PORT TARGET_ADDR TARGET_PORT RECORD
        listen on ADDR:PORT; each connection is relayed to TARGET both ways, and the bytes the
        client sent on its first connection are appended to RECORD as they pass (the agent's
        HELLO, its PINGs, ...: sealed frames the relay cannot read or forge)
  tap.py replay TARGET_ADDR TARGET_PORT RECORD TIMEOUT
        connect to TARGET, send RECORD's bytes as they are, and print what happened: "closed
        after N bytes" when the peer closed the connection, "open" when it was still open
        after TIMEOUT seconds
"""
import socket
import sys
import threading


def pump(src, dst, record):
    try:
        while True:
            b = src.recv(65536)
            if not b:
                break
            if record is not None:
                record.write(b)
                record.flush()
            dst.sendall(b)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def relay(addr, port, taddr, tport, path):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, int(port)))
    s.listen(8)
    first = True
    while True:
        c, _ = s.accept()
        try:
            t = socket.create_connection((taddr, int(tport)), timeout=5)
            t.settimeout(None)
        except OSError:
            c.close()
            continue
        record = open(path, "ab") if first else None
        first = False
        threading.Thread(target=pump, args=(c, t, record), daemon=True).start()
        threading.Thread(target=pump, args=(t, c, None), daemon=True).start()


def replay(taddr, tport, path, timeout):
    data = open(path, "rb").read()
    s = socket.create_connection((taddr, int(tport)), timeout=5)
    try:
        s.sendall(data)
    except OSError:
        pass
    s.settimeout(float(timeout))
    try:
        while True:
            b = s.recv(65536)
            if not b:
                print(f"closed after {len(data)} bytes")
                return 0
    except socket.timeout:
        print("open")
        return 1
    except OSError as e:
        print(f"closed after {len(data)} bytes ({e.strerror})")
        return 0


def main():
    a = sys.argv[1:]
    if len(a) == 6 and a[0] == "relay":
        relay(*a[1:])
        return 0
    if len(a) == 5 and a[0] == "replay":
        return replay(*a[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
