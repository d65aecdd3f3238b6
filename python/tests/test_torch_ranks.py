"""rekindle.torch with several real ranks (the example, gloo on CPU, ranks started here with
RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, no rk run): the gradflip and bitflip guards give
the uninterrupted run's weights bit for bit, and a checkpoint of 2 ranks resumes on 3 with
the global batch kept. Skips without torch or without the Fashion-MNIST data."""

import json
import os
import socket
import subprocess
import sys
import unittest

import rktest

try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import xxhash  # noqa: F401
except ImportError as e:  # pragma: no cover
    raise unittest.SkipTest(f"SKIP: torch, numpy or xxhash missing ({e})")

EXAMPLE = os.path.join(rktest.SRC, "examples", "pytorch", "train_fashion_mnist.py")
DATA = os.environ.get("RK_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
ARGS = ["--subset", "2048", "--batch", "32", "--hash-every", "10"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(test, n, steps, env=None, extra=()):
    """Start n ranks of the example; returns (rank 0's result dict, rank 0's stderr)."""
    d = rktest.tmpdir(test)
    port = str(free_port())
    procs = []
    for r in range(n):
        e = rktest.env_with_pythonpath(dict(env or {}, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
        for k in ("RK_HEARTBEAT", "RK_STACK_DIR"):
            e.pop(k, None)
        out = os.path.join(d, f"result{r}.json")
        procs.append(subprocess.Popen([sys.executable, EXAMPLE, *ARGS, "--steps", str(steps), "--result", out,
                                       *extra], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for r, p in enumerate(procs):
        test.assertEqual(p.returncode, 0, f"rank {r}: {outs[r][1][-2000:]}")
    with open(os.path.join(d, "result0.json")) as f:
        return json.load(f), outs[0][1]


@unittest.skipUnless(os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")),
                     f"SKIP: Fashion-MNIST not found in {DATA}")
class Ranks(unittest.TestCase):
    def test_flips_leave_no_trace(self):
        ref, _ = launch(self, 2, 60)
        got, log = launch(self, 2, 60, env={"RK_INJECT": "gradflip@step=12:rank=1,bitflip@step=25:rank=1"})
        self.assertIn("grad_suspect (blame 1, redo)", log)
        self.assertIn("grad_outlier (blame 1, redo)", log)
        self.assertIn("replica_mismatch (blame -1, rollback)", log)
        self.assertEqual(got["hash"], ref["hash"])

    def test_four_ranks_blame_the_minority(self):
        ref, _ = launch(self, 4, 30)
        got, log = launch(self, 4, 30, env={"RK_INJECT": "bitflip@step=5:rank=2"})
        self.assertIn("replica_mismatch (blame 2, rollback)", log)
        self.assertEqual(got["hash"], ref["hash"])

    def test_two_ranks_checkpoint_resumes_on_three(self):
        ck = rktest.tmpdir(self)
        launch(self, 2, 30, env={"RK_CKPT_DIR": ck}, extra=["--ckpt-every", "20"])
        got, log = launch(self, 3, 40, env={"RK_CKPT_DIR": ck, "RK_RESUME": "1"})
        self.assertIn("step 30, epoch 0, cursor 960, written by 2 ranks; now 3", log)
        self.assertEqual((got["step"], got["world"]), (40, 3))


if __name__ == "__main__":
    unittest.main()
