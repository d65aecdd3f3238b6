"""rekindle.stacks: SIGUSR1 writes every thread's Python stack to
$RK_STACK_DIR/stacks-rank<R>-launch<L>.txt and the process lives on; a Worker that installed it
says "stacks": true in its hello."""

import errno
import os
import signal
import subprocess
import sys
import time
import unittest

import rktest
from rekindle import stacks
from test_worker import Sup

CHILD = r'''
import sys, threading, time
sys.path.insert(0, sys.argv[1])
import rekindle

ready = threading.Event()
def stuck_in_collective():
    ready.set()
    while True:
        time.sleep(0.05)

w = rekindle.Worker()
w.hello(0)
threading.Thread(target=stuck_in_collective, daemon=True, name="allreduce").start()
ready.wait(60)
def main_loop_waiting():
    print(w.stacks_path, flush=True)  # the test's signal: both functions are on the stacks now
    time.sleep(60)
main_loop_waiting()
'''


class TestStacks(unittest.TestCase):
    def test_no_stack_dir_no_install(self):
        self.assertIsNone(stacks.default_path(env={}))
        self.assertEqual(stacks.default_path(env={"RK_STACK_DIR": "/s", "RANK": "3", "WORLD_SIZE": "4",
                                                  "RK_LAUNCH": "2"}), "/s/stacks-rank3-launch2.txt")

    def test_only_a_regular_file(self):
        # a FIFO without a reader, a device or a link at the path: OSError at once, no install
        d = rktest.tmpdir(self)
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo)
        link = os.path.join(d, "link")
        os.symlink(os.path.join(d, "target"), link)
        code = ("import sys; sys.path.insert(0, sys.argv[1])\nfrom rekindle import stacks\n"
                "for p in sys.argv[2:]:\n    try:\n        stacks.install(p)\n"
                "    except OSError as e:\n        print('refused', e.errno)\n    else:\n"
                "        print('installed')\nprint(stacks.installed())\n")
        r = subprocess.run([sys.executable, "-c", code, rktest.PYDIR, fifo, "/dev/null", link],
                           capture_output=True, text=True, timeout=20)
        self.assertEqual(r.stdout.split("\n"), ["refused %d" % errno.ENXIO, "refused %d" % errno.EINVAL,
                                               "refused %d" % errno.ELOOP, "None", ""], r.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "target")))

    def test_sigusr1_dumps_every_thread(self):
        d = rktest.tmpdir(self)
        sup = Sup(self)
        env = dict(os.environ, RK_HEARTBEAT=sup.path, RANK="1", WORLD_SIZE="2", RK_LAUNCH="2",
                   RK_STACK_DIR=d)
        script = os.path.join(d, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        p = subprocess.Popen([sys.executable, script, rktest.PYDIR], env=env, stdout=subprocess.PIPE)
        self.addCleanup(p.stdout.close)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        sup.accept()
        hello = sup.lines(1)[0]
        self.assertIs(hello["stacks"], True)
        path = p.stdout.readline().decode().strip()
        self.assertEqual(path, os.path.join(d, "stacks-rank1-launch2.txt"))
        self.assertEqual(os.path.getsize(path), 0)

        def dump(n):  # SIGUSR1, and the file's text once it holds n dumps (30 s at most)
            os.kill(p.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 30
            while True:
                with open(path) as f:
                    text = f.read()
                if (text.count("main_loop_waiting") >= n and text.count("stuck_in_collective") >= n
                        or time.monotonic() > deadline):
                    return text
                time.sleep(0.05)

        text = dump(1)
        self.assertIn("stuck_in_collective", text)
        self.assertIn("main_loop_waiting", text)
        self.assertGreaterEqual(text.count("hread 0x"), 2)  # "Current thread", "Thread"
        # it lives on (rk run decides what happens next): it answers a second SIGUSR1 too
        text = dump(2)
        self.assertEqual(text.count("main_loop_waiting"), 2, text)
        self.assertIsNone(p.poll())


if __name__ == "__main__":
    unittest.main()
