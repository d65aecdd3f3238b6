#!/usr/bin/env python3
"""The slow-client attack on `rk exporter` (used by tests/it_exporter_slow.sh and
bench/exporter_load; not a test itself: no it_ prefix).

    slowclient.py HOST:PORT [--idle N] [--trickle N] [--every S] [--seconds S]
                  [--max-connects N] [--ready FILE]

Holds N idle connections (connected, never a byte sent) and N trickling ones (a request that
never ends, one byte every S seconds) open to HOST:PORT from this machine's address, for
--seconds. A connection the server closes is opened again at once, up to --max-connects
connections in all, so the attack stays in force for as long as it runs; both bounds keep it
finite; SIGTERM ends it early. --ready FILE is written once every slot has connected once. At the end it prints one
JSON object: connects, closed_by_server (the server ended it), refused (connect failed),
max_open (the most connected at once, as this side sees it), responses (trickling
connections that got an HTTP answer: a 4xx or nothing is expected, never a 200),
ok_responses (of those, 200s) and seconds.
"""
import argparse
import errno
import json
import selectors
import signal
import socket
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("addr")
ap.add_argument("--idle", type=int, default=500)
ap.add_argument("--trickle", type=int, default=130)
ap.add_argument("--every", type=float, default=0.2)
ap.add_argument("--seconds", type=float, default=20)
ap.add_argument("--max-connects", type=int, default=200000)
ap.add_argument("--ready")
a = ap.parse_args()
host, port = a.addr.rsplit(":", 1)
port = int(port)

# the request a trickler sends, a byte at a time, that never reaches its blank line
HEAD = b"GET /metrics HTTP/1.1\r\nHost: exporter\r\nX-Trickle: "

sel = selectors.DefaultSelector()
stats = dict(connects=0, closed_by_server=0, refused=0, max_open=0, responses=0,
             ok_responses=0)
slots = []  # per slot: dict(kind, sock, connected, sent, next)
open_now = 0
ready_written = False
ever = set()


def open_slot(i):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    e = s.connect_ex((host, port))
    stats["connects"] += 1
    if e not in (0, errno.EINPROGRESS):
        s.close()
        stats["refused"] += 1
        slots[i]["sock"] = None
        slots[i]["next"] = time.monotonic() + 0.05
        return
    slots[i].update(sock=s, connected=False, sent=0, next=time.monotonic() + a.every)
    sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, i)


def close_slot(i, by_server):
    global open_now
    sl = slots[i]
    s = sl["sock"]
    if s is None:
        return
    sel.unregister(s)
    s.close()
    if sl["connected"]:
        open_now -= 1
    if by_server:
        stats["closed_by_server"] += 1
    sl["sock"] = None
    sl["next"] = time.monotonic()


for i in range(a.idle + a.trickle):
    slots.append(dict(kind="idle" if i < a.idle else "trickle", sock=None, connected=False,
                      sent=0, next=0.0))
t0 = time.monotonic()
end = t0 + a.seconds
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # stop early, still print the stats
for i in range(len(slots)):
    open_slot(i)

while time.monotonic() < end and not stop:
    now = time.monotonic()
    for key, ev in sel.select(timeout=0.02):
        i = key.data
        sl = slots[i]
        s = sl["sock"]
        if not sl["connected"] and ev & selectors.EVENT_WRITE:
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                stats["refused"] += 1
                close_slot(i, False)
                continue
            sl["connected"] = True
            open_now += 1
            stats["max_open"] = max(stats["max_open"], open_now)
            ever.add(i)
            sel.modify(s, selectors.EVENT_READ, i)
        if ev & selectors.EVENT_READ:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if data:
                if data.startswith(b"HTTP/"):
                    stats["responses"] += 1
                    if data.startswith(b"HTTP/1.1 200") or data.startswith(b"HTTP/1.0 200"):
                        stats["ok_responses"] += 1
                continue  # the server closes after an error answer: noticed next round
            close_slot(i, True)
    if not ready_written and len(ever) == len(slots) and a.ready:
        open(a.ready, "w").write("%d\n" % len(ever))
        ready_written = True
    now = time.monotonic()
    for i, sl in enumerate(slots):
        if sl["sock"] is None:
            if now >= sl["next"] and stats["connects"] < a.max_connects:
                open_slot(i)
        elif sl["kind"] == "trickle" and sl["connected"] and now >= sl["next"]:
            b = HEAD[sl["sent"]:sl["sent"] + 1] if sl["sent"] < len(HEAD) else b"a"
            try:
                sl["sock"].send(b)
                sl["sent"] += 1
            except OSError:
                close_slot(i, True)
                continue
            sl["next"] = now + a.every

for i in range(len(slots)):
    close_slot(i, False)
stats["seconds"] = round(time.monotonic() - t0, 2)
stats["ready"] = ready_written
print(json.dumps(stats))
sys.exit(0)
