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
    for attempt in range(3):
        procs, outs = _start(d, n, steps, env, extra)
        # free_port's port can be taken by another process before rank 0 binds it (a busy
        # machine): nothing has run yet then, so the launch is made again on another port
        if not (procs[0].returncode and "Address already in use" in outs[0][1]):
            break
    for r, p in enumerate(procs):
        test.assertEqual(p.returncode, 0, f"rank {r}: {outs[r][1][-2000:]}")
    with open(os.path.join(d, "result0.json")) as f:
        return json.load(f), outs[0][1]


def _start(d, n, steps, env, extra):
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
    outs = [procs[0].communicate(timeout=600)]
    if procs[0].returncode and "Address already in use" in outs[0][1]:
        for p in procs[1:]:  # they would wait for a store that is not there
            p.kill()
    return procs, outs + [p.communicate(timeout=600) for p in procs[1:]]


# A small 2-rank job (gloo, a file store): argv rank, steps, store, result file. CKPT_AT: a
# `checkpoint` command arrives at that step; DROPOUT=1: a dropout layer, torch seeded per rank;
# BN=1: a BatchNorm layer; PLAIN=1: no DDP (guards off); COMMLOG=1: prints "COMM <step>" at
# each comm heartbeat and "FWD <step>" as the module's forward begins; GB: the Job's
# global_batch (default 32).
SMALL = r"""
import os, sys
import numpy as np, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import rekindle.torch as rkt
rank, steps, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
if os.environ.get("SNAPDIRS"):  # each rank its own node's snapshot directory (two nodes)
    os.environ["RK_SNAP_DIR"] = os.environ["SNAPDIRS"].split(",")[rank]
torch.set_num_threads(1); torch.use_deterministic_algorithms(True)
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
N, B = 256, 32
g = torch.Generator().manual_seed(7); X = torch.randn(N, 12, generator=g); Y = (X[:, 0] > 0).long()
torch.manual_seed(3)
drop = [torch.nn.Dropout(0.3)] if os.environ.get("DROPOUT") else []
bn = [torch.nn.BatchNorm1d(16)] if os.environ.get("BN") else []
inner = torch.nn.Sequential(torch.nn.Linear(12, 16), *bn, torch.nn.Tanh(), *drop, torch.nn.Linear(16, 2))
model = inner if os.environ.get("PLAIN") else DDP(inner)
if drop:
    torch.manual_seed(100 + rank)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
job = rkt.Job(model, opt, global_batch=int(os.environ.get("GB", B)), data_size=N, verbose=True, ckpt_every=int(os.environ.get("CKE", "0")),
              guard=not os.environ.get("PLAIN"))
if os.environ.get("COMMLOG"):
    job.w.comm = lambda step: print("COMM", step, file=sys.stderr, flush=True)
    inner.register_forward_pre_hook(lambda m, i: print("FWD", job.step_no, file=sys.stderr, flush=True))
at, asked = int(os.environ.get("CKPT_AT", "-1")), []
poll = job.w.poll
def ask():
    if job.step_no == at and not asked:
        asked.append(1); return {"checkpoint"}
    return poll()
job.w.poll = ask
rot = int(os.environ.get("SNAPROT", "-1"))
for step in job.steps(steps):
    if step == rot and rank == 0 and job._snap is not None:  # memory corruption in the snapshot
        w = next(iter(job._snap["model"].values())).view(-1).view(torch.int32)
        w[0] ^= 1 << 22
        rot = -1
    per = N // B
    idx = torch.from_numpy(np.random.default_rng([1, step // per]).permutation(N)[(step % per) * B:(step % per + 1) * B])
    idx = idx[rank * 16:(rank + 1) * 16]
    opt.zero_grad()
    loss = job.scale(torch.nn.functional.cross_entropy(model(X[idx]), Y[idx]), len(idx))
    loss.backward(); job.step()
if rank == 0:
    open(out, "w").write(rkt.params_hash(inner))
dist.destroy_process_group()
"""


def small(test, steps, env=None, rc=0, logs=None):
    """Runs SMALL on 2 ranks, each to exit status rc; returns (rank 0's params hash, or None
    when rc is not 0, and rank 0's stderr); each rank's stderr appended to `logs`, a list."""
    d = rktest.tmpdir(test)
    script = os.path.join(d, "small.py")
    with open(script, "w") as f:
        f.write(SMALL)
    e = rktest.env_with_pythonpath(dict(env or {}))
    for k in ("RK_HEARTBEAT", "RK_STACK_DIR", "RK_INJECT", "RK_INJECT_DONE", "RK_RESUME", "RK_CKPT_DIR"):
        if k not in (env or {}):
            e.pop(k, None)
    out = os.path.join(d, "hash")
    store = os.path.join(d, "store")
    procs = [subprocess.Popen([sys.executable, script, str(r), str(steps), store, out], env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    if logs is not None:
        logs.extend(o[1] for o in outs)
    for r, p in enumerate(procs):
        test.assertEqual(p.returncode, rc, f"rank {r}: {outs[r][1][-2000:]}")
    if rc:
        return None, outs[0][1]
    with open(out) as f:
        return f.read(), outs[0][1]


class SmallRanks(unittest.TestCase):
    def test_checkpoint_after_a_redo_is_verified(self):
        # a bit flip in the attempt of step 20 that is redone (nan), then a checkpoint at 20:
        # the replicas are compared again; the checkpoint is the clean run's
        from rekindle import ckpt
        clean, faulted = rktest.tmpdir(self), rktest.tmpdir(self)
        small(self, 22, env={"RK_CKPT_DIR": clean, "CKE": "20"})
        _, log = small(self, 22, env={"RK_CKPT_DIR": faulted, "CKPT_AT": "20",
                                      "RK_INJECT": "bitflip@step=20:rank=0,nan@step=20"})
        self.assertIn("nan (blame 0, redo)", log)
        self.assertIn("replica_mismatch (blame -1, rollback): replica hashes of ranks 0 and 1 differ "
                      "(no majority: rank 0's copy kept)", log)
        a = ckpt.load(os.path.join(clean, ckpt.file_name(20)))
        b = ckpt.load(os.path.join(faulted, ckpt.file_name(20)))
        diff = [n for n in a.items if n.startswith(("model.", "optim."))
                and bytes(a.items[n].data) != bytes(b.items[n].data)]
        self.assertEqual(diff, [])

    def test_damaged_snapshot_is_not_the_repair(self):
        # rank 0's verified snapshot of step 10 changes in memory at step 12, rank 1's
        # parameters at step 15: the repair at step 20 must come from rank 1's intact copy
        ref, _ = small(self, 30)
        got, log = small(self, 30, env={"SNAPROT": "12", "RK_INJECT": "bitflip@step=15:rank=1"})
        self.assertIn("the snapshot of rank(s) 0 changed in memory since it was verified", log)
        self.assertIn("rank 1's copy broadcast", log)
        self.assertEqual(got, ref)

    def test_resume_restores_each_ranks_rng(self):
        # dropout seeded per rank: each rank gets its own torch RNG state back on resume
        ref, _ = small(self, 40, env={"DROPOUT": "1"})
        ck = rktest.tmpdir(self)
        small(self, 25, env={"DROPOUT": "1", "RK_CKPT_DIR": ck})
        got, log = small(self, 40, env={"DROPOUT": "1", "RK_CKPT_DIR": ck, "RK_RESUME": "1"})
        self.assertIn("resumed from", log)
        self.assertEqual(got, ref)

    def test_resume_from_two_nodes_memory(self):
        """Snapshots in memory on two nodes (a directory a rank, as across hosts): the resume
        agrees on a step from what each rank holds, rank 0 sends its generation to rank 1
        (whose node has none of rank 0's), and a generation that does not verify on rank 1
        moves both ranks to the next older step, never mixed; the weights are the fault-free
        run's (docs/recovery.md, "PyTorch jobs")."""
        from rekindle import snap
        ref, _ = small(self, 40, env={"DROPOUT": "1"})
        for flip in (False, True):
            d = rktest.tmpdir(self)
            dirs = [snap.make_dir(d), snap.make_dir(d)]
            env = {"DROPOUT": "1", "RK_CKPT_DIR": os.path.join(d, "ck"), "CKE": "10", "RK_SNAP_EVERY": "1",
                   "SNAPDIRS": ",".join(dirs)}
            small(self, 25, env=env)
            # as if the job had died after step 24's snapshot: the end's checkpoint (25) gone
            os.unlink(os.path.join(d, "ck", "ckpt-000000000025.safetensors"))
            with open(os.path.join(d, "ck", "latest"), "w") as f:
                f.write("ckpt-000000000020.safetensors\n")
            self.assertEqual((snap.steps(dirs[0], 0), snap.steps(dirs[0], 1)), ([24, 23], []))
            self.assertEqual((snap.steps(dirs[1], 1), snap.steps(dirs[1], 0)), ([24, 23], []))
            want = 24
            if flip:  # rank 1's newest: a bit flipped in its data
                p = os.path.join(dirs[1], "rank-1", snap.file_name(24))
                with open(p, "r+b") as f:
                    f.seek(-3, os.SEEK_END)
                    b = f.read(1)
                    f.seek(-3, os.SEEK_END)
                    f.write(bytes([b[0] ^ 0x40]))
                want = 23
            logs = []
            got, log0 = small(self, 40, env=dict(env, RK_RESUME="1"), logs=logs)
            self.assertIn(f"snap-{want:012d}.safetensors (step {want}", log0)
            self.assertIn("node memory", log0)
            self.assertIn(f"resumed from rank 0's snapshot of step {want}, sent by rank 0", logs[1])
            if flip:
                self.assertIn("snapshot of step 24 not restored", logs[1])
            self.assertEqual(got, ref, f"flip={flip}")

    def test_global_batch_below_the_ranks_is_refused(self):
        # a rank without samples has no mean loss: its norm read as 0.0 pulled the guards'
        # median down (every other rank an outlier); refused at the start, as rk train does
        _, log = small(self, 5, env={"GB": "1"}, rc=2)
        self.assertIn("global_batch 1 is smaller than the 2 ranks", log)

    def test_comm_before_every_collective(self):
        def marks(log):
            return [ln for ln in log.splitlines() if ln.startswith(("COMM", "FWD"))]

        # not DDP: the vector's own all-reduce, after the forward
        _, log = small(self, 5, env={"PLAIN": "1", "COMMLOG": "1"})
        self.assertEqual(marks(log), [x for s in range(5) for x in (f"FWD {s}", f"COMM {s}")])
        # DDP with buffers: the forward begins with their broadcast
        _, log = small(self, 5, env={"BN": "1", "COMMLOG": "1"})
        self.assertEqual(marks(log), [x for s in range(5) for x in (f"COMM {s}", f"FWD {s}")])
        # the ranks' own batch statistics in the buffers are no replica mismatch (rank 0's are
        # broadcast at each forward): the run ends, with no rollback
        self.assertNotIn("replica_mismatch", log)


# N ranks of plain DDP or of a Job (gloo, a file store): argv rank, world, steps, store, result
# file. Two micro-batches a step, the first in no_sync (ACC=1: every micro-batch all-reduced),
# dropout seeded per rank, clipping, a model of 1,618 parameters in one bucket: with 3 or more
# ranks the ring all-reduce's sums depend on where each element sits in it. PLAIN=1: DDP alone, as
# people write it (loss / 2, optimizer.step()); CKE: the Job's ckpt_every.
LAYOUT = r"""
import contextlib, os, sys
import numpy as np, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
rank, world, steps, store, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
N, B, K = 384, 48, 2
g = torch.Generator().manual_seed(7); X = torch.randn(N, 12, generator=g); Y = (X[:, 0] > 0).long()
torch.manual_seed(3)
L = torch.nn.Linear
inner = torch.nn.Sequential(L(12, 32), torch.nn.Tanh(), L(32, 32), torch.nn.Tanh(), torch.nn.Dropout(0.2), L(32, 2))
model = DDP(inner)
torch.manual_seed(100 + rank)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
plain = bool(os.environ.get("PLAIN"))
if not plain:
    import rekindle.torch as rkt
    job = rkt.Job(model, opt, global_batch=B, data_size=N, ckpt_every=int(os.environ.get("CKE", "0")))
sync_all = bool(os.environ.get("ACC"))
micro = B // (world * K)
for step in (range(steps) if plain else job.steps(steps)):
    idx = torch.from_numpy(np.random.default_rng([1, step]).permutation(N)[:B])
    idx = idx[rank * K * micro:(rank + 1) * K * micro]
    for m in range(K):
        i = idx[m * micro:(m + 1) * micro]
        with model.no_sync() if m < K - 1 and not sync_all else contextlib.nullcontext():
            loss = torch.nn.functional.cross_entropy(model(X[i]), Y[i])
            (loss / K if plain else job.scale(loss, len(i))).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # reads the reduced gradients
    opt.step() if plain else job.step()
    opt.zero_grad(set_to_none=True)
if rank == 0:
    import rekindle.torch as rkt
    open(out, "w").write(rkt.params_hash(inner))
dist.destroy_process_group()
"""


def layout(test, world, steps, env=None):
    """Runs LAYOUT on `world` ranks; returns (rank 0's params hash, rank 0's stderr)."""
    d = rktest.tmpdir(test)
    script = os.path.join(d, "layout.py")
    with open(script, "w") as f:
        f.write(LAYOUT)
    e = rktest.env_with_pythonpath(dict(env or {}))
    for k in ("RK_HEARTBEAT", "RK_STACK_DIR", "RK_INJECT", "RK_INJECT_DONE", "RK_RESUME", "RK_CKPT_DIR"):
        if k not in (env or {}):
            e.pop(k, None)
    out, store = os.path.join(d, "hash"), os.path.join(d, "store")
    procs = [subprocess.Popen([sys.executable, script, str(r), str(world), str(steps), store, out], env=e,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = [p.communicate(timeout=300) for p in procs]
    for r, p in enumerate(procs):
        test.assertEqual(p.returncode, 0, f"rank {r}: {outs[r][1][-2000:]}")
    with open(out) as f:
        return f.read(), outs[0][1]


class Layouts(unittest.TestCase):
    """With 3 or more ranks the Job's sums are plain DDP's: the same bucket layout in every
    backward (DDP's initial one in the run's first, the rebuilt one after), the step's vector
    in its own all-reduce, through a resume (its first step before the resumed DDP rebuilt)
    and a redo of step 0 (after it)."""

    def test_four_ranks_plain_resume_and_step0_redo(self):
        plain, _ = layout(self, 4, 12, env={"PLAIN": "1"})
        ref, _ = layout(self, 4, 12)
        self.assertEqual(ref, plain, "the Job on 4 ranks ends with other bits than plain DDP")
        ck = rktest.tmpdir(self)
        layout(self, 4, 7, env={"RK_CKPT_DIR": ck, "CKE": "5"})
        got, log = layout(self, 4, 12, env={"RK_CKPT_DIR": ck, "RK_RESUME": "1"})
        self.assertIn("resumed from", log)
        self.assertEqual(got, ref, "a resume at step 7 on 4 ranks ends with other bits")
        got, log = layout(self, 4, 12, env={"RK_INJECT": "nan@step=0:rank=2"})
        self.assertIn("nan (blame 2, redo)", log)
        self.assertEqual(got, ref, "a redo of step 0 on 4 ranks ends with other bits")

    def test_three_ranks_every_micro_batch_reduced(self):
        # no no_sync: a resumed process's first step all-reduces twice, the first before its
        # DDP rebuilt (reduced before the second forward)
        plain, _ = layout(self, 3, 8, env={"PLAIN": "1", "ACC": "1"})
        ck = rktest.tmpdir(self)
        layout(self, 3, 4, env={"RK_CKPT_DIR": ck, "ACC": "1"})
        got, log = layout(self, 3, 8, env={"RK_CKPT_DIR": ck, "RK_RESUME": "1", "ACC": "1"})
        self.assertIn("resumed from", log)
        self.assertEqual(got, plain)


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
