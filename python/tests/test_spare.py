"""The warm spare of recovery in place (python/rekindle/torch/_spare.py) as rk run's keeper runs
it: `python -m rekindle.torch._spare SCRIPT ARGS` with RK_SPARE_FD, a real pipe and a real
process. Skips without torch."""

import json
import os
import socket
import subprocess
import sys
import time
import unittest

import rktest

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover
    raise unittest.SkipTest(f"SKIP: torch missing ({e})")

from rekindle.torch import _spare

SCRIPT = """\
import json, os, sys
import numpy  # a top-level import the spare imports before its rank comes
import helper_of_the_script  # the script's own module: imported by the script, not the spare
print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                  "rank": os.environ.get("RANK"), "local": os.environ.get("LOCAL_RANK"),
                  "port": os.environ.get("MASTER_PORT"), "fd": os.environ.get("RK_SPARE_FD"),
                  "helper": helper_of_the_script.ENV_RANK_AT_IMPORT,
                  "torch": "torch" in sys.modules}))
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""
HELPER = 'import os\nENV_RANK_AT_IMPORT = os.environ.get("RANK")\n'


class Spare(unittest.TestCase):
    def setUp(self):
        self.dir = rktest.tmpdir(self)
        self.script = os.path.join(self.dir, "train.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT)
        with open(os.path.join(self.dir, "helper_of_the_script.py"), "w") as f:
            f.write(HELPER)

    def start(self, script=None, **extra):
        r, w = os.pipe()
        env = dict(os.environ, RK_SPARE_FD=str(r), PYTHONPATH=rktest.PYDIR)
        env.update(extra)
        env.pop("RANK", None)
        env.pop("LOCAL_RANK", None)
        p = subprocess.Popen([sys.executable, "-m", "rekindle.torch._spare", script or self.script, "--lr", "0.1"],
                             env=env, pass_fds=(r,), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             cwd="/")
        os.close(r)
        self.addCleanup(lambda: p.poll() is None and p.kill())
        return p, w

    def listener(self):
        """A socket listening on 127.0.0.1 (rank 0's store of the new rendezvous), its port."""
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        s.setblocking(False)
        self.addCleanup(s.close)
        return s, s.getsockname()[1]

    @staticmethod
    def probed(s):
        try:
            s.accept()[0].close()
            return True
        except BlockingIOError:
            return False

    def test_a_rank_given_runs_the_script_as_python_would(self):
        p, w = self.start()
        ls, port = self.listener()
        os.write(w, b"RANK=3\0LOCAL_RANK=1\0MASTER_ADDR=127.0.0.1\0MASTER_PORT=%d\0EXIT_WITH=5\0" % port)
        os.close(w)
        out, err = p.communicate(timeout=300)
        # rank 3 waited for rank 0's store to listen before its script ran (a probe connection)
        self.assertTrue(self.probed(ls), "no probe of MASTER_PORT before the script")
        self.assertEqual(p.returncode, 5, err.decode())  # the script's sys.exit status
        got = json.loads(out.decode().strip().splitlines()[-1])
        self.assertEqual(got["name"], "__main__")
        self.assertEqual(got["argv"], [self.script, "--lr", "0.1"])
        self.assertEqual(got["path0"], self.dir)  # the script's own modules import
        self.assertEqual((got["rank"], got["local"], got["port"]), ("3", "1", str(port)))
        self.assertIsNone(got["fd"])  # not left for the script
        self.assertEqual(got["helper"], "3")  # imported after the rank came, not before
        self.assertTrue(got["torch"])
        # the script ran ahead until its helper module read RANK
        self.assertRegex(err.decode(), r"rekindle: warm spare \(pid [0-9]+, warmed in [0-9.]+ s, the script run "
                                       r"[0-9.]+ s ahead to its read of RANK\) is rank 3\n")

    def test_rank_0_does_not_wait_for_a_store(self):
        p, w = self.start()
        ls, port = self.listener()
        os.write(w, b"RANK=0\0LOCAL_RANK=0\0MASTER_ADDR=127.0.0.1\0MASTER_PORT=%d\0" % port)
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual(p.returncode, 0, err.decode())
        self.assertFalse(self.probed(ls), "rank 0 makes the store: it probes nothing")

    def test_await_store(self):
        from rekindle.torch._inplace import await_store
        ls, port = self.listener()
        await_store("127.0.0.1", port)  # listening: at once, one probe
        self.assertTrue(self.probed(ls))
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
        s.close()
        t0 = time.monotonic()
        await_store("127.0.0.1", free, wait_s=0.3)  # refused throughout: gives up after wait_s
        self.assertGreaterEqual(time.monotonic() - t0, 0.3)

    def test_end_of_file_with_no_rank_runs_nothing(self):
        p, w = self.start()
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual(p.returncode, 0, err.decode())
        self.assertEqual(out, b"")

    def test_a_malformed_assignment_is_refused_and_runs_nothing(self):
        p, w = self.start()
        os.write(w, b"RANK=1\0no equals sign\0")
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"not NAME=VALUE", err)
        self.assertEqual(out, b"")

    def test_an_oversized_assignment_is_refused(self):
        p, w = self.start()
        try:
            os.write(w, b"X=" + b"y" * (_spare._MAX + 10) + b"\0")
        except BrokenPipeError:
            pass
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(b"over", err)
        self.assertEqual(out, b"")

    def test_without_its_descriptor_it_says_so(self):
        env = dict(os.environ, PYTHONPATH=rktest.PYDIR)
        env.pop("RK_SPARE_FD", None)
        p = subprocess.run([sys.executable, "-m", "rekindle.torch._spare", self.script], env=env,
                           capture_output=True, timeout=300)
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"RK_SPARE_FD", p.stderr)

    @staticmethod
    def phases(trace):
        """The phases of an RK_TRACE_LAUNCH file so far (none before it exists)."""
        try:
            with open(trace) as f:
                return [line.split(" ", 1)[0] for line in f]
        except FileNotFoundError:
            return []

    def ahead(self, body, **extra):
        """A spare of a script BODY with RK_TRACE_LAUNCH, started and run ahead: returns once
        its trace says the script waits for its rank (spare.ahead: a line the spare writes),
        or fails after 300 s."""
        script = os.path.join(self.dir, "ahead.py")
        with open(script, "w") as f:
            f.write(body)
        trace = os.path.join(self.dir, "trace")
        p, w = self.start(script, RK_TRACE_LAUNCH=trace, **extra)
        deadline = time.monotonic() + 300
        while "spare.ahead" not in self.phases(trace):
            if p.poll() is not None:
                self.fail("the spare ended before its script waited for a rank: %r" % (p.communicate()[1][-400:],))
            self.assertLess(time.monotonic(), deadline, "no spare.ahead in the trace after 300 s")
            time.sleep(0.02)
        return p, w

    SETUP = """\
import os, sys
open(os.path.join(os.path.dirname(__file__), "set-up-done"), "w").close()
print("set-up done", flush=True)
sys.stderr.write("a warning of the set-up\\n")
os.write(1, b"said by C\\n")  # the descriptor, as torch's C++ would
"""

    def test_the_script_runs_ahead_with_its_output_held_until_the_rank_comes(self):
        p, w = self.ahead(self.SETUP + 'print("rank", os.environ["RANK"], os.environ.get("WORLD_SIZE"))\n',
                          WORLD_SIZE="4")
        # the set-up ran before the rank came, what it said is held back
        self.assertTrue(os.path.exists(os.path.join(self.dir, "set-up-done")))
        os.set_blocking(p.stdout.fileno(), False)
        self.assertIsNone(p.stdout.read(), "output before the rank came")
        os.set_blocking(p.stdout.fileno(), True)
        os.write(w, b"RANK=0\0LOCAL_RANK=0\0")
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual(p.returncode, 0, err.decode())
        self.assertEqual(out.decode(), "set-up done\nsaid by C\nrank 0 4\n")
        line = (r"rekindle: warm spare \(pid [0-9]+, warmed in [0-9.]+ s, the script run [0-9.]+ s ahead to its "
                r"read of RANK\) is rank 0\na warning of the set-up\n")
        self.assertRegex(err.decode(), line)  # the spare's line, then what the set-up said

    def test_end_of_file_after_running_ahead_says_nothing(self):
        p, w = self.ahead(self.SETUP + 'print(os.environ.get("LOCAL_RANK"))\n')
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual((p.returncode, out, err), (0, b"", b""))

    def test_init_process_group_waits_for_the_rank(self):
        # no variable read: the rank and store given as arguments; the process group waits,
        # and once made the process environment (C's getenv, as torch's C++ reads it) is the rank's
        store = os.path.join(self.dir, "store")
        p, w = self.ahead(self.SETUP + f"""\
import ctypes, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
getenv = ctypes.CDLL(None).getenv
getenv.restype = ctypes.c_char_p
print("C sees RANK", getenv(b"RANK").decode(), dist.get_world_size())
""")
        os.write(w, b"RANK=0\0LOCAL_RANK=0\0")
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual(p.returncode, 0, err.decode())
        self.assertTrue(out.decode().endswith("C sees RANK 0 1\n"), out)
        self.assertIn("ahead to its init_process_group) is rank 0", err.decode())

    def test_iterating_the_environment_waits_for_the_rank(self):
        p, w = self.ahead("import os\nprint(sorted(k for k in dict(os.environ) if k.endswith('RANK')))\n")
        os.write(w, b"RANK=2\0LOCAL_RANK=0\0")
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual(p.returncode, 0, err.decode())
        self.assertEqual(out.decode(), "['LOCAL_RANK', 'RANK']\n")
        self.assertIn("ahead to its look at the whole environment) is rank 2", err.decode())

    def test_a_script_that_fails_ahead_fails_as_the_rank_with_what_it_said(self):
        p, w = self.ahead(self.SETUP + "raise SystemExit('bad flag')\n")
        os.write(w, b"RANK=0\0LOCAL_RANK=0\0")
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(out.decode(), "set-up done\nsaid by C\n")
        self.assertRegex(err.decode(), r"ahead to its end\) is rank 0\na warning of the set-up\nbad flag\n$")

    def test_a_process_forked_ahead_of_the_rank_does_not_wait_for_it(self):
        # a child of the set-up (no thread to read the rank in it): the launch's environment at
        # once, its output not held; the script itself still waits for its rank
        p, w = self.ahead("import os\npid = os.fork()\nif pid == 0:\n"
                          "    print('child sees', os.environ.get('RANK'), flush=True)\n    os._exit(0)\n"
                          "os.waitpid(pid, 0)\nprint('rank', os.environ['RANK'])\n")
        os.write(w, b"RANK=1\0LOCAL_RANK=0\0")
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual((p.returncode, out.decode()), (0, "child sees None\nrank 1\n"), err.decode())

    def test_an_installed_module_that_reads_the_rank_when_imported_gets_it(self):
        lib = os.path.join(self.dir, "site")
        os.mkdir(lib)
        with open(os.path.join(lib, "rank_at_import.py"), "w") as f:
            f.write("import os\nRANK = os.environ.get('RANK')\n")
        p, w = self.ahead("import rank_at_import\nprint(rank_at_import.RANK)\n",
                          PYTHONPATH=rktest.PYDIR + os.pathsep + lib)
        os.write(w, b"RANK=2\0LOCAL_RANK=0\0")
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual((p.returncode, out.decode()), (0, "2\n"), err.decode())
        self.assertIn("ahead to its read of RANK) is rank 2", err.decode())

    def test_ahead_off_runs_nothing_before_the_rank(self):
        trace = os.path.join(self.dir, "trace")
        p, w = self.start(RK_TRACE_LAUNCH=trace, RK_SPARE_AHEAD="0")
        os.write(w, b"RANK=0\0LOCAL_RANK=0\0")
        os.close(w)
        out, err = p.communicate(timeout=300)
        self.assertEqual(p.returncode, 0, err.decode())
        self.assertRegex(err.decode(), r"rekindle: warm spare \(pid [0-9]+, warmed in [0-9.]+ s\) is rank 0\n")
        self.assertNotIn("spare.ahead", self.phases(trace))

    def test_script_imports_are_those_outside_its_directory(self):
        got = _spare._script_imports(self.script)
        self.assertIn("numpy", got)
        self.assertIn("json", got)
        self.assertNotIn("helper_of_the_script", got)
        self.assertEqual(_spare._script_imports(os.path.join(self.dir, "missing.py")), [])
        fifo = os.path.join(self.dir, "fifo.py")
        os.mkfifo(fifo)
        self.assertEqual(_spare._script_imports(fifo), [])  # refused, not read (nor blocked on)


if __name__ == "__main__":
    unittest.main()
