"""rekindle.Worker against a real Unix socket server in the test (the supervisor's side of
docs/protocol.md, checked line by line) and against real `rk run` (skipped without rk or
mpirun)."""

import ctypes
import json
import math
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import rktest  # noqa: F401  (python/ on sys.path)
import rekindle
from rekindle import ckpt
from rekindle import worker as wmod


class Sup:
    """A supervisor's socket: listens, accepts one connection, reads lines, sends commands."""

    def __init__(self, test):
        d = tempfile.mkdtemp(prefix="rkhb.")  # short: a socket path has at most 107 bytes
        test.addCleanup(shutil.rmtree, d, True)
        self.path = os.path.join(d, "hb.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(8)
        self.srv.settimeout(10)
        self.conn = None
        self.buf = b""
        test.addCleanup(self.close)

    def accept(self):
        self.conn, _ = self.srv.accept()
        self.conn.settimeout(10)
        return self.conn

    def peer_pid(self):
        pid, _, _ = struct.unpack("3i", self.conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
        return pid

    def raw_lines(self, n):
        while self.buf.count(b"\n") < n:
            data = self.conn.recv(65536)
            if not data:
                break
            self.buf += data
        out = []
        for _ in range(n):
            if b"\n" not in self.buf:
                break
            line, self.buf = self.buf.split(b"\n", 1)
            out.append(line + b"\n")
        return out

    def lines(self, n):
        return [json.loads(x) for x in self.raw_lines(n)]

    def nothing_more(self, wait=0.2):
        self.conn.settimeout(wait)
        try:
            data = self.conn.recv(65536)
        except socket.timeout:
            data = b""
        finally:
            self.conn.settimeout(10)
        return not data and b"\n" not in self.buf

    def send(self, b):
        self.conn.sendall(b)

    def close(self):
        for s in (self.conn, self.srv):
            if s is not None:
                s.close()


def env_for(sup, **kw):
    env = {"RK_HEARTBEAT": sup.path, "RANK": "1", "WORLD_SIZE": "2", "RK_DEVICES": "3,5"}
    env.update(kw)
    return env


class Idx:
    """An integer that is not an int (numpy's and torch's integers behave so)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


class TestEnvironment(unittest.TestCase):
    def test_supervised_means_under_rk_run_until_lost(self):
        d = rktest.tmpdir(self)
        w = rekindle.Worker(env={"RK_HEARTBEAT": os.path.join(d, "none.sock"),
                                 "RK_DEVICES": "3,5", "RANK": "1", "WORLD_SIZE": "2"})
        self.assertEqual(w.device, "5")  # RK_DEVICES[rank], as rk run --devices gives it
        self.assertTrue(w.supervised)  # before hello too
        w.hello(0)  # nobody there: lost, no longer supervised
        self.assertTrue(w.lost)
        self.assertFalse(w.supervised)

    def test_unsupervised_is_a_no_op(self):
        w = rekindle.Worker(env={})
        self.assertEqual((w.rank, w.world, w.local_rank, w.launch), (0, 1, 0, 0))
        self.assertEqual(w.device, "cpu")
        self.assertFalse(w.supervised)
        self.assertIsNone(w.ckpt_dir)
        self.assertFalse(w.resume)
        w.hello(0)
        w.comm(0)
        w.step(1, float("nan"), 0.1)
        w.event(1, "nan", detail="x")
        w.exit_event(1, "usage", "x")
        w.ckpt(1, 0.1)
        w.inject(1, 0, "crash")
        w.bye(1, "done")
        self.assertEqual(w.poll(), set())
        self.assertTrue(w.alive())
        self.assertFalse(w.lost)
        rekindle.Worker("x" * 100, env={}).hello(0)  # even a device hello would refuse

    def test_rank_world_sources_in_order(self):
        rw = wmod.rank_world
        both = {"RANK": "2", "WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1",
                "OMPI_COMM_WORLD_SIZE": "3"}
        self.assertEqual(rw(both), (2, 4))
        self.assertEqual(rw({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3",
                             "PMI_RANK": "0", "PMI_SIZE": "5"}), (1, 3))
        self.assertEqual(rw({"PMI_RANK": "4", "PMI_SIZE": "5", "SLURM_PROCID": "0",
                             "SLURM_NTASKS": "2"}), (4, 5))
        self.assertEqual(rw({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}), (1, 2))
        self.assertEqual(rw({"RANK": "1"}), (0, 1))  # a pair or nothing
        self.assertEqual(rw({}), (0, 1))
        for bad in ({"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "-1", "WORLD_SIZE": "2"},
                    {"RANK": "1", "WORLD_SIZE": "x"}, {"RANK": "0", "WORLD_SIZE": "0"}):
            with self.assertRaises(ValueError):
                rw(bad)

    def test_worker_fields(self):
        env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "RK_DEVICES": "3,5",
               "RK_LAUNCH": "4", "RK_CKPT_DIR": "/tmp/x", "RK_RESUME": "1"}
        w = rekindle.Worker(env=env)
        self.assertEqual((w.rank, w.world, w.local_rank, w.launch), (1, 2, 1, 4))
        self.assertEqual(w.device, "5")
        self.assertEqual((w.ckpt_dir, w.resume), ("/tmp/x", True))
        # rk run's checkpoint variables, read in one place (as rk_worker_ckpt_env in C)
        for e, want in (({}, (None, False)), ({"RK_CKPT_DIR": "", "RK_RESUME": "1"}, (None, True)),
                        ({"RK_CKPT_DIR": "/c", "RK_RESUME": "0"}, ("/c", False)),
                        ({"RK_CKPT_DIR": "/c", "RK_RESUME": "yes"}, ("/c", False)),
                        ({"RK_CKPT_DIR": "/c", "RK_RESUME": "1 "}, ("/c", False)),
                        ({"RK_CKPT_DIR": "/c", "RK_RESUME": "1"}, ("/c", True))):
            self.assertEqual(wmod.ckpt_env(e), want)
            self.assertEqual((lambda w: (w.ckpt_dir, w.resume))(rekindle.Worker(env=e)), want)
        self.assertEqual(rekindle.Worker("cuda:0", env=env).device, "cuda:0")
        self.assertEqual(rekindle.Worker(env={"RANK": "2", "WORLD_SIZE": "3",
                                              "RK_DEVICES": "0,1"}).device, "cpu")
        self.assertEqual(rekindle.EXIT_STORAGE, 6)
        self.assertEqual([rekindle.EXIT_OK, rekindle.EXIT_FAIL, rekindle.EXIT_USAGE,
                          rekindle.EXIT_COMM, rekindle.EXIT_STOPPED, rekindle.EXIT_GUARD],
                         list(range(6)))

    def test_clean_text(self):
        c = wmod.clean_text
        self.assertEqual(c("a\nb\x1b[0m\x7f\u0085\u00e9"), "a?b?[0m??\u00e9")
        self.assertEqual(c(b"ok \xff\xfe \xc3\xa9"), "ok ?? \u00e9")
        self.assertEqual(c("\ud800x"), "?x")
        s = c("\u20ac" * 300)  # 3 bytes each: 170 fit in 512
        self.assertEqual(s, "\u20ac" * 170)
        self.assertEqual(len(c("a" * 600).encode()), 512)
        self.assertEqual(c(None), "")

    def test_parse_command(self):
        p = wmod.parse_command
        self.assertEqual(p(b'{"cmd":"stop"}'), "stop")
        self.assertEqual(p(b' {"cmd":"checkpoint","later":[1,2]} \r'), "checkpoint")
        for bad in (b'{"cmd":"reboot"}', b'{"cmd":1}', b"[]", b"{", b'{"x":1}',
                    b'{"cmd":"stop","cmd":"stop"}', b"\xff", b'{"cmd":"stop","x":NaN}',
                    b'{"cmd":"stop","x":' + b"[" * 2000 + b"]" * 2000 + b"}", b'{"cmd":"stop"}' + b" " * 5000):
            with self.assertRaises(ValueError, msg=bad[:40]):
                p(bad)

    def test_parse_rejoin(self):
        """The rejoin command (recovery in place, docs/protocol.md): its epoch and port are
        whole numbers in range, checked; the Worker keeps the newest epoch's."""
        p = wmod.parse_command_args
        self.assertEqual(p(b'{"cmd":"rejoin","epoch":3,"port":29500}'), ("rejoin", {"epoch": 3, "port": 29500}))
        self.assertEqual(wmod.parse_command(b'{"cmd":"rejoin","epoch":1,"port":1,"x":0}'), "rejoin")
        self.assertEqual(p(b'{"cmd":"stop","epoch":"x"}'), ("stop", {}))
        for bad, field in ((b'{"cmd":"rejoin","port":29500}', "epoch"), (b'{"cmd":"rejoin","epoch":1}', "port"),
                           (b'{"cmd":"rejoin","epoch":0,"port":2}', "epoch"),
                           (b'{"cmd":"rejoin","epoch":2147483648,"port":2}', "epoch"),
                           (b'{"cmd":"rejoin","epoch":1,"port":65536}', "port"),
                           (b'{"cmd":"rejoin","epoch":1,"port":0}', "port"),
                           (b'{"cmd":"rejoin","epoch":true,"port":2}', "epoch"),
                           (b'{"cmd":"rejoin","epoch":1.0,"port":2}', "epoch"),
                           (b'{"cmd":"rejoin","epoch":1,"port":"2"}', "port"),
                           (b'{"cmd":"rejoin","epoch":1,"port":null}', "port")):
            with self.assertRaises(ValueError, msg=bad) as cm:
                p(bad)
            self.assertIn(f'field "{field}"', str(cm.exception))
        w = wmod.Worker(env={"RANK": "0", "WORLD_SIZE": "2"}, install_stacks=False)
        w._take_lines(b'{"cmd":"rejoin","epoch":2,"port":5}\n{"cmd":"rejoin","epoch":1,"port":6}\n'
                      b'{"cmd":"rejoin","epoch":0,"port":7}\n')
        self.assertEqual(w.rejoin, {"epoch": 2, "port": 5})  # an older epoch, a bad line: kept
        self.assertEqual(w._pending, {"rejoin"})

    def test_parse_command_fuzz(self):
        import random

        r = random.Random(9)
        seeds = [b'{"cmd":"stop"}', b'{"cmd":"checkpoint","x":[1,{"y":"z"}]}',
                 b'{"cmd":"rejoin","epoch":12,"port":29500}']
        for _ in range(3000):
            b = bytearray(r.choice(seeds))
            for _ in range(r.randint(1, 4)):
                i = r.randrange(len(b) + 1)
                op = r.randrange(3)
                if op == 0 and b:
                    del b[min(i, len(b) - 1)]
                elif op == 1:
                    b.insert(i, r.randrange(256))
                else:
                    b[i:i] = r.choice([b'"', b"{", b"[" * 3000, b"\\u0000", b"1e999", b"NaN"])
            try:
                self.assertIn(wmod.parse_command(bytes(b)), wmod.COMMANDS)
            except ValueError as e:
                self.assertTrue(str(e).startswith("heartbeat command: "), e)


class TestTracePhase(unittest.TestCase):
    """RK_TRACE_LAUNCH (docs/run.md): "PHASE T PID LAUNCH RANK" lines, the C side's format."""

    def setUp(self):
        self.addCleanup(self._reset)
        self._reset()
        d = tempfile.mkdtemp(prefix="rktrace.")
        self.addCleanup(shutil.rmtree, d, True)
        self.path = os.path.join(d, "trace")

    def _reset(self):
        if wmod._trace[0] is not None and wmod._trace[0] >= 0:
            os.close(wmod._trace[0])
        wmod._trace[0] = wmod._trace[1] = None

    def _env(self, **kv):
        old = {k: os.environ.get(k) for k in kv}
        for k, v in kv.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
                                 for k, v in old.items()])

    def test_lines(self):
        self._env(RK_TRACE_LAUNCH=self.path, RK_LAUNCH="3", RANK="1")
        t0 = time.monotonic()
        wmod.trace_phase("worker.hello")
        self._env(RANK=None)
        wmod.trace_phase("worker.step")
        with open(self.path) as f:
            lines = [l.split() for l in f]
        self.assertEqual([(l[0], l[2], l[3], l[4]) for l in lines],
                         [("worker.hello", str(os.getpid()), "3", "1"),
                          ("worker.step", str(os.getpid()), "3", "-1")])
        ts = [float(l[1]) for l in lines]
        self.assertTrue(t0 <= ts[0] <= ts[1] <= time.monotonic(), ts)  # CLOCK_MONOTONIC

    def test_off(self):
        self._env(RK_TRACE_LAUNCH=None)
        wmod.trace_phase("worker.hello")
        self.assertEqual(wmod._trace[0], -1)
        self._reset()
        self._env(RK_TRACE_LAUNCH="relative/trace")  # refused: the ranks may run elsewhere
        wmod.trace_phase("worker.hello")
        self.assertEqual(wmod._trace[0], -1)
        self.assertFalse(os.path.exists("relative/trace"))
        self._reset()
        self._env(RK_TRACE_LAUNCH=os.path.join(self.path, "no", "such"))  # best effort
        wmod.trace_phase("worker.hello")
        self.assertEqual(wmod._trace[0], -1)


class TestSupervised(unittest.TestCase):
    def connect(self, sup, step=0, **kw):
        w = rekindle.Worker(env=env_for(sup, **kw))
        w.hello(step)
        sup.accept()
        self.addCleanup(w.close)
        return w

    def test_hello(self):
        sup = Sup(self)
        w = self.connect(sup, 7)
        self.assertTrue(w.supervised)
        raw = sup.raw_lines(1)[0]
        self.assertEqual(raw, ('{"type":"hello","v":1,"rank":1,"world":2,"pid":%d,"device":"5",'
                               '"step":7}\n' % os.getpid()).encode())
        self.assertEqual(sup.peer_pid(), os.getpid())
        w.hello(9)  # once only
        self.assertTrue(sup.nothing_more())

    def test_hello_says_where_the_state_came_from(self):
        sup = Sup(self)
        with self.assertRaises(ValueError):
            rekindle.Worker(env=env_for(sup)).hello(3, restore="ram")
        # RK_HB_RESTORE_MEMORY, RK_HB_RESTORE_PEER
        for word, code in (("memory", 3), ("peer", 4)):
            sup = Sup(self)
            w = rekindle.Worker(env=env_for(sup))
            w.hello(3, restore=word)
            sup.accept()
            self.addCleanup(w.close)
            raw = sup.raw_lines(1)[0]
            self.assertEqual(json.loads(raw)["restore"], word, raw)
            if rktest.librekindle() is not None:  # rk run's parser reads it back
                lib = ctypes.CDLL(rktest.librekindle())
                lib.rk_hb_msg_parse.argtypes = [ctypes.c_char_p, ctypes.c_size_t,
                                                ctypes.POINTER(RkHbMsg), ctypes.POINTER(RkErr)]
                m, e = RkHbMsg(), RkErr()
                line = raw.rstrip(b"\n")
                self.assertEqual(lib.rk_hb_msg_parse(line, len(line), ctypes.byref(m), ctypes.byref(e)), 0)
                self.assertEqual((m.step, m.restore), (3, code))

    def test_hello_refuses_a_bad_device(self):
        sup = Sup(self)
        for dev in ("x" * 64, "cuda\n0"):
            with self.assertRaises(ValueError):
                rekindle.Worker(dev, env=env_for(sup)).hello(0)
        w = rekindle.Worker("y" * 63, env=env_for(sup))
        w.hello(0)
        sup.accept()
        self.addCleanup(w.close)
        self.assertEqual(sup.lines(1)[0]["device"], "y" * 63)

    def test_messages_exactly(self):
        sup = Sup(self)
        w = self.connect(sup, 100)
        sup.lines(1)
        w.comm(Idx(100))
        w.step(101, 0.4127, 0.052)
        w.step(102, float("inf"), 0)
        w.step(103, None, 1e-9)
        w.step(104, -0.0, 0.5)
        w.event(104, "nan", 1, "redo", 1, "non-finite gradient; step redone")
        w.exit_event(104, "storage", "disk full")
        w.ckpt(104, 0.21)
        w.inject(104, 3, "crash")
        w.save(104, 3)
        w.bye(104, "stopped")
        got = [x.decode() for x in sup.raw_lines(11)]
        self.assertEqual(got, [
            '{"type":"comm","rank":1,"step":100}\n',
            '{"type":"step","rank":1,"step":101,"loss":0.4127,"dt":0.052}\n',
            '{"type":"step","rank":1,"step":102,"loss":null,"dt":0.0}\n',
            '{"type":"step","rank":1,"step":103,"loss":null,"dt":1e-09}\n',
            '{"type":"step","rank":1,"step":104,"loss":-0.0,"dt":0.5}\n',
            '{"type":"event","rank":1,"step":104,"kind":"nan","blame":1,"action":"redo",'
            '"lost_steps":1,"detail":"non-finite gradient; step redone"}\n',
            '{"type":"event","rank":1,"step":104,"kind":"storage","blame":-1,"action":"exit",'
            '"lost_steps":0,"detail":"disk full"}\n',
            '{"type":"ckpt","rank":1,"step":104,"seconds":0.21}\n',
            '{"type":"inject","rank":1,"step":104,"index":3,"kind":"crash"}\n',
            '{"type":"save","rank":1,"step":104,"keep":3}\n',
            '{"type":"bye","rank":1,"step":104,"status":"stopped"}\n',
        ])

    def test_numbers_read_back_exactly(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)
        vals = [0.1, 1 / 3, 5e-324, 1.7976931348623157e308, 123456789.00000001, 2.0**52 + 1]
        for i, v in enumerate(vals):
            w.step(i + 1, v, v)
        for v, m in zip(vals, sup.lines(len(vals))):
            self.assertEqual(m["loss"], v)
            self.assertIsInstance(m["step"], int)

    def test_bad_arguments_refused_and_worker_alive(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)
        bad = [lambda: w.step(-1, 0.0, 0.1), lambda: w.step(2**53 + 1, 0.0, 0.1),
               lambda: w.step(1.0, 0.0, 0.1), lambda: w.step(True, 0.0, 0.1),
               lambda: w.step(1, 0.0, -0.1), lambda: w.step(1, 0.0, float("nan")),
               lambda: w.event(1, "Nan"), lambda: w.event(1, "x" * 32),
               lambda: w.event(1, "nan", blame=-2), lambda: w.event(1, "nan", action="re do"),
               lambda: w.event(1, "nan", lost_steps=-1), lambda: w.bye(1, "ok"),
               lambda: w.inject(1, -1, "crash"), lambda: w.ckpt(1, -1.0), lambda: w.save(1, 0),
               lambda: w.save(1, 1001)]
        for f in bad:
            with self.assertRaises(ValueError):
                f()
        self.assertTrue(sup.nothing_more())
        w.step(2**53, 1.0, 0.0)
        self.assertEqual(sup.lines(1)[0]["step"], 2**53)
        self.assertTrue(w.alive())

    def test_detail_cleaned_and_cut(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)
        w.event(1, "slow_rank", detail="tab\there\nnew \u009b \U0001f600 \ud83d " + "\u00e9" * 400)
        w.event(1, "slow_rank", detail=b"\xff\xc3(" + b"y" * 1000)
        raw = sup.raw_lines(2)
        for line in raw:
            self.assertLessEqual(len(line), 4096)
        m1, m2 = (json.loads(x) for x in raw)
        self.assertTrue(m1["detail"].startswith("tab?here?new ? \U0001f600 ? \u00e9"))
        self.assertLessEqual(len(m1["detail"].encode()), 512)
        self.assertGreater(len(m1["detail"].encode()), 509)
        self.assertTrue(m2["detail"].startswith("??(yyy"))
        self.assertEqual(len(m2["detail"].encode()), 512)

    def test_commands_poll_and_alive(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)
        self.assertEqual(w.poll(), set())
        # (a Unix stream socket: what sendall sent is in the worker's socket when it returns,
        # and a close is seen at once; no wait is needed here or in the tests below)
        sup.send(b'{"cmd":"checkpoint"}\n{"cmd":"st')
        self.assertTrue(w.alive())  # reads, keeps what it read for poll
        self.assertEqual(w.poll(), {"checkpoint"})
        sup.send(b'op"}\r\n')
        self.assertEqual(w.poll(), {"stop"})
        self.assertEqual(w.poll(), set())

    def test_bad_command_lines_are_skipped(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)
        sup.send(b'{"cmd":"reboot"}\nnot json\n' + b"x" * 5000 + b'{"cmd":"stop"}\n'
                 + b'{"cmd":"checkpoint"}\n')
        self.assertEqual(w.poll(), {"checkpoint"})  # the stop was inside the long line
        self.assertIn("line", w.error)
        self.assertTrue(w.alive())

    def test_supervisor_gone(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)
        sup.send(b'{"cmd":"stop"}\n')
        sup.conn.close()
        sup.conn = None
        self.assertFalse(w.alive())
        self.assertTrue(w.lost)
        self.assertFalse(w.supervised)
        self.assertIn("has gone", w.error)
        self.assertEqual(w.poll(), {"stop"})  # what came before the end of file still counts
        for i in range(3):  # sends after that do nothing, and never raise
            w.step(i + 1, 1.0, 0.1)
        w.bye(3, "done")

    def test_send_to_a_gone_supervisor(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)
        sup.conn.close()
        sup.conn = None
        for i in range(50):  # the first send may still land in the buffer; then EPIPE
            w.step(i + 1, 1.0, 0.1)
        self.assertTrue(w.lost)
        self.assertFalse(w.alive())

    def test_send_interrupted_by_an_exception(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)

        class Boom(Exception):
            pass

        real = w._sock

        class Sock:  # a send a signal handler interrupts (PEP 475: only when it raises)
            def sendall(self, *a):
                raise Boom()

            def close(self):
                real.close()

        w._sock = Sock()
        with self.assertRaises(Boom):
            w.step(1, 1.0, 0.1)
        self.assertTrue(w.lost)
        self.assertFalse(w.alive())
        w.step(2, 1.0, 0.1)  # nothing, no exception

    def test_no_supervisor_at_the_path(self):
        d = rktest.tmpdir(self)
        w = rekindle.Worker(env={"RK_HEARTBEAT": os.path.join(d, "nothing")})
        self.assertTrue(w.supervised)
        w.hello(0)  # never raises: the supervisor went, the worker stops
        self.assertTrue(w.lost)
        self.assertFalse(w.alive())
        self.assertIn("cannot connect", w.error)

    def test_threads_never_mix_lines(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)
        n, per = 4, 300

        def run(k):
            for i in range(per):
                w.event(i, "slow_rank", blame=k, detail=f"thread {k} " + "z" * 400)

        ts = [threading.Thread(target=run, args=(k,)) for k in range(n)]
        reader = []
        rt = threading.Thread(target=lambda: reader.extend(sup.lines(n * per)))
        rt.start()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        rt.join(20)
        self.assertEqual(len(reader), n * per)
        for k in range(n):
            self.assertEqual(sum(1 for m in reader if m["blame"] == k), per)

    def test_forked_child_sends_nothing(self):
        sup = Sup(self)
        w = self.connect(sup)
        sup.lines(1)
        pid = os.fork()
        if pid == 0:
            try:
                w.step(1, 1.0, 0.1)
                w.bye(1, "done")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        self.assertTrue(sup.nothing_more())
        w.step(1, 2.0, 0.1)
        self.assertEqual(sup.lines(1)[0]["loss"], 2.0)

    def test_no_sigpipe(self):
        """With SIGPIPE's default action restored (it kills), sends to a gone supervisor still
        only turn the worker lost. The worker sends its steps once the test says go (a line on
        its stdin), after the supervisor's end closed."""
        sup = Sup(self)
        code = ("import os, signal, sys, time; sys.path.insert(0, %r); import rekindle\n"
                "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
                "w = rekindle.Worker(); w.hello(0); sys.stdin.readline()\n"
                "for i in range(100): w.step(i + 1, 1.0, 0.1)\n"
                "print('lost' if w.lost else 'alive')\n") % rktest.PYDIR
        p = subprocess.Popen([sys.executable, "-c", code], env=env_for(sup), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        sup.accept()
        sup.lines(1)
        sup.conn.close()
        sup.conn = None
        out, err = p.communicate(b"go\n", timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out.strip(), b"lost")


WORKER = r'''
import json, os, struct, sys, time
import rekindle
from rekindle import ckpt, inject
steps, out = int(sys.argv[1]), sys.argv[2]
w = rekindle.Worker()
start = 0
if w.ckpt_dir and w.resume:
    c, skipped = ckpt.load_latest(w.ckpt_dir)
    if c is not None:
        start = c.step
inj = inject.from_env(w.rank, w.launch)
sync = os.path.join(os.path.dirname(out), "sync")
os.makedirs(sync, exist_ok=True)


def agree(tag, flags):
    """The ranks' bitwise OR of `flags` at `tag`: an all-reduce and barrier through files."""
    name = lambda t, r: os.path.join(sync, f"launch{w.launch}.{t}.rank{r}")
    mine = name(tag, w.rank)
    with open(mine + ".tmp", "w") as f:
        f.write(str(flags))
    os.rename(mine + ".tmp", mine)
    got, t0 = 0, time.monotonic()
    for r in range(w.world):
        while True:
            try:
                with open(name(tag, r)) as f:
                    got |= int(f.read())
                break
            except FileNotFoundError:
                if time.monotonic() - t0 > 60:  # a peer died: the launcher ends this one too
                    sys.exit(rekindle.EXIT_FAIL)
                time.sleep(0.002)
    if isinstance(tag, int) and tag > start + 1:  # every peer has read it: it passed this one
        os.unlink(name(tag - 1, w.rank))
    return got


w.hello(start)
with open(f"{out}.rank{w.rank}.launch{w.launch}", "w") as f:
    json.dump({"rank": w.rank, "world": w.world, "launch": w.launch, "start": start,
               "supervised": w.supervised, "pid": rekindle.worker.outside_pid(),
               "done": os.environ.get("RK_INJECT_DONE")}, f)
step = start
while step < steps:
    for fault in (inj.due(step) if inj else []):
        w.inject(step, fault.index, fault.kind)
        if fault.kind == "crash":
            t = time.monotonic()  # ranks do not step together here: let rank 0 checkpoint first
            latest = os.path.join(w.ckpt_dir or ".", "latest")
            while not os.path.exists(latest) and time.monotonic() - t < 20:
                time.sleep(0.02)
            os.kill(os.getpid(), 9)
    w.comm(step)
    time.sleep(0.03)
    step += 1
    w.step(step, 1.0 / step, 0.03)
    cmds = w.poll()
    # all ranks act on a command at the same step: they agree on the commands and on a gone
    # supervisor every step (an all-reduce in a real job; files here, as this test has no
    # process group)
    flags = agree(step, ("stop" in cmds) | ("checkpoint" in cmds) << 1 | (not w.alive()) << 2)
    if flags & 4:
        sys.exit(rekindle.EXIT_FAIL)
    if (step % 5 == 0 or flags & 3) and w.rank == 0 and w.ckpt_dir and w.alive():
        t = time.monotonic()
        ckpt.save(w.ckpt_dir, step, [ckpt.Item("model.w", "F64", (1,), struct.pack("<d", step))],
                  world_size=w.world, config='{"model":"toy"}')
        w.ckpt(step, time.monotonic() - t)
    if flags & 1:
        # nobody leaves before rank 0's checkpoint is out: under mpirun a rank that exits first
        # gets the others killed, rank 0 in the middle of its save
        agree(f"saved{step}", 0)
        with open(f"{out}.stopped.rank{w.rank}", "w") as f:
            f.write(str(step))
        w.bye(step, "stopped")
        sys.exit(rekindle.EXIT_STOPPED)
w.bye(step, "done")
'''


class TestUnderRkRun(unittest.TestCase):
    def setUp(self):
        self.rk = rktest.need_rk(self)
        if not shutil.which("mpirun"):
            self.skipTest("mpirun not found (rk run's launcher here)")
        self.d = rktest.tmpdir(self)
        self.script = os.path.join(self.d, "worker.py")
        with open(self.script, "w") as f:
            f.write(WORKER)
        self.env = rktest.env_with_pythonpath({"OMPI_MCA_btl": "self,vader",
                                               "OMPI_MCA_btl_vader_single_copy_mechanism": "none"})

    def rk_run(self, *args, steps=20):
        out = os.path.join(self.d, "out")
        cmd = [self.rk, "run", *args, "--quiet", "--summary-json", os.path.join(self.d, "sum.json"),
               "--", sys.executable, self.script, str(steps), out]
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def facts(self, rank, launch):
        with open(os.path.join(self.d, f"out.rank{rank}.launch{launch}")) as f:
            return json.load(f)

    def test_two_ranks_finish(self):
        p = self.rk_run("-n", "2", "--ckpt-dir", os.path.join(self.d, "ck"))
        out, _ = p.communicate(timeout=600)
        self.assertEqual(p.returncode, 0, out.decode(errors="replace")[-3000:])
        for r in (0, 1):
            f = self.facts(r, 0)
            self.assertEqual((f["rank"], f["world"], f["supervised"]), (r, 2, True))
        with open(os.path.join(self.d, "sum.json")) as f:
            s = json.load(f)
        self.assertEqual(s["steps"], 20)
        self.assertEqual(s["restarts"], 0)
        v = subprocess.run([self.rk, "ckpt", "verify", os.path.join(self.d, "ck")],
                           capture_output=True, text=True)
        self.assertEqual(v.returncode, 0, v.stdout + v.stderr)

    def test_injected_crash_relaunch_resumes(self):
        p = self.rk_run("-n", "2", "--ckpt-dir", os.path.join(self.d, "ck"), "--inject",
                        "crash@step=7:rank=1", steps=15)
        out, _ = p.communicate(timeout=180)
        text = out.decode(errors="replace")
        self.assertEqual(p.returncode, 0, text[-3000:])
        again = self.facts(1, 1)
        self.assertEqual(again["launch"], 1)
        self.assertIn(again["start"], (5, 10))  # rank 0's checkpoint of step 5 (or 10)
        self.assertEqual(again["done"], "0")  # the fault fired: never again
        with open(os.path.join(self.d, "sum.json")) as f:
            s = json.load(f)
        self.assertEqual((s["steps"], s["restarts"]), (15, 1), s)

    def test_stop_on_interrupt(self):
        # two ranks under mpirun: both stop at one step and neither leaves before rank 0's
        # checkpoint of that step is out (a rank that exits first gets the others killed, rank 0
        # in the middle of its save: `latest` at an older step, a temporary file left)
        ck = os.path.join(self.d, "ck")
        p = self.rk_run("-n", "2", "--launcher", "mpirun", "--ckpt-dir", ck, steps=100000)
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(ck, "latest")) and time.monotonic() < deadline:
            time.sleep(0.05)
        # the signal: both ranks are past step 5 (they step together) and said hello; rk run
        # sends the stop to a hello it has not read yet when that hello comes
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
        text = out.decode(errors="replace")[-3000:]
        self.assertEqual(p.returncode, 130, text)
        stops = []
        for r in (0, 1):
            with open(os.path.join(self.d, f"out.stopped.rank{r}")) as f:
                stops.append(int(f.read()))
        self.assertEqual(stops[0], stops[1], text)
        with open(os.path.join(ck, "latest")) as f:
            self.assertEqual(f.read(), ckpt.file_name(stops[0]) + "\n", text)
        self.assertEqual(ckpt.load(os.path.join(ck, ckpt.file_name(stops[0]))).step, stops[0])
        self.assertEqual([n for n in os.listdir(ck) if ".tmp." in n], [])
        v = subprocess.run([self.rk, "ckpt", "verify", ck], capture_output=True, text=True)
        self.assertEqual(v.returncode, 0, v.stdout + v.stderr)

if __name__ == "__main__":
    unittest.main()


class RkHbMsg(ctypes.Structure):
    """rk_hb_msg of rekindle/heartbeat.h."""

    _fields_ = [("type", ctypes.c_int), ("rank", ctypes.c_int), ("world", ctypes.c_int),
                ("blame", ctypes.c_int), ("index", ctypes.c_int), ("version", ctypes.c_int),
                ("pid", ctypes.c_long), ("step", ctypes.c_int64), ("lost_steps", ctypes.c_int64),
                ("loss", ctypes.c_double), ("dt", ctypes.c_double), ("seconds", ctypes.c_double),
                ("loss_finite", ctypes.c_bool), ("stacks", ctypes.c_bool),
                ("device", ctypes.c_char * 64), ("kind", ctypes.c_char * 32),
                ("action", ctypes.c_char * 32), ("status", ctypes.c_char * 16),
                ("detail", ctypes.c_char * 513), ("restore", ctypes.c_int)]


class RkErr(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 512)]


@unittest.skipIf(rktest.librekindle() is None, "librekindle.so not built")
class TestAgainstTheCParser(unittest.TestCase):
    """Every line the Worker writes is one rk run's parser (rk_hb_msg_parse of librekindle.so,
    through ctypes) accepts, and reads back with the same step, loss bits and detail: random
    steps, losses (NaN, infinities, -0.0, subnormals, huge), details of random Unicode and raw
    bytes, every message type."""

    def test_random_lines(self):
        lib = ctypes.CDLL(rktest.librekindle())
        lib.rk_hb_msg_parse.argtypes = [ctypes.c_char_p, ctypes.c_size_t,
                                        ctypes.POINTER(RkHbMsg), ctypes.POINTER(RkErr)]
        sup = Sup(self)
        w = rekindle.Worker(env=env_for(sup))
        w.hello(0)
        sup.accept()
        self.addCleanup(w.close)
        sup.raw_lines(1)  # the hello
        r = random.Random(int(os.environ.get("RK_FUZZ_SEED", "15")))
        n = int(os.environ.get("RK_FUZZ_N", "3000"))
        odd = [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308, 0.1, 1e-300]

        def text():
            k = r.randrange(4)
            if k == 0:
                return "".join(chr(r.choice([r.randrange(32, 127), r.randrange(0x80, 0x800),
                                             r.randrange(0xE000, 0x110000), r.randrange(0, 32)]))
                               for _ in range(r.randrange(0, 700)))
            if k == 1:
                return bytes(r.randrange(256) for _ in range(r.randrange(0, 300)))
            return "".join(r.choice("ab \"\\\u00e9\u2028\U0001f600") for _ in range(r.randrange(0, 40)))

        sent, got = [], []
        for _ in range(n):
            step = r.choice([0, 1, r.randrange(1 << 20), (1 << 53)])
            t = r.randrange(6)
            if t == 0:
                loss = r.choice(odd) if r.random() < 0.5 else r.uniform(-1e6, 1e6)
                w.step(step, loss, r.random())
                sent.append(("step", step, loss, None))
            elif t == 1:
                d = text()
                w.event(step, "nan", blame=r.randrange(-1, 2), action="redo",
                        lost_steps=r.randrange(10), detail=d)
                sent.append(("event", step, None, d))
            elif t == 2:
                w.comm(step)
                sent.append(("comm", step, None, None))
            elif t == 3:
                w.ckpt(step, r.random() * 10)
                sent.append(("ckpt", step, None, None))
            elif t == 4:
                w.inject(step, r.randrange(256), r.choice(["crash", "nan", "bitflip"]))
                sent.append(("inject", step, None, None))
            else:
                w.exit_event(step, "exception", detail=text())
                sent.append(("event", step, None, ""))
            got.extend(sup.raw_lines(1))  # read as it goes: the socket buffer is not endless
        self.assertEqual(len(got), len(sent))
        for raw, (kind, step, loss, detail) in zip(got, sent):
            m, e = RkHbMsg(), RkErr()
            line = raw.rstrip(b"\n")
            rc = lib.rk_hb_msg_parse(line, len(line), ctypes.byref(m), ctypes.byref(e))
            self.assertEqual(rc, 0, f"{raw!r}: {e.msg.decode(errors='replace')}")
            self.assertEqual(m.step, step, raw)
            if loss is not None:
                if math.isfinite(loss):
                    self.assertTrue(m.loss_finite, raw)
                    self.assertEqual(struct.pack("<d", m.loss), struct.pack("<d", loss), raw)
                else:
                    self.assertFalse(m.loss_finite, raw)
            if detail is not None:
                self.assertEqual(m.detail.decode(), json.loads(line).get("detail", ""), raw)
