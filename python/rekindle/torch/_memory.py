"""rekindle.torch's snapshots in memory (docs/recovery.md "Relaunch from memory", PyTorch):
under rk run with RK_SNAP_DIR, every K steps each rank puts its generation into the node's
snapshot store (rekindle.snap), with no collective: rank 0 the disk checkpoint's items (model,
optimiser, its RNG states, data position, scheduler, guard losses), every other rank its own
RNG states; each with its replica hash. A resume restores the newest step every rank holds and
that verifies, when it is at least as new as the newest disk checkpoint and the replicas'
hashes agree. A mixin of Job (its attributes); relies on the store's checks and _Checkpoints."""

import math
import os
import re
import statistics
import struct
import time

import numpy as np
import torch
import torch.distributed as dist

from rekindle import ckpt as _ckpt
from rekindle import snap as _snap
from rekindle.torch._state import state_hash

_TIMED = 3  # puts timed (after the first, which makes the directory) before K is first chosen
# K is chosen again at these counts of puts, from the puts and steps since it last was: the
# first steps are slow (the other ranks' start, DDP's first buckets), and a K from them alone
# was 8 where the rule wanted 13 (a profiled run of the example: steps timed at 20.6 ms that
# settled at 11.6 ms; 2.1 % of rank 0's step time in puts, against the 1 % of the rule)
_RETIMED = (16, 64, 256)
_SETTLED = 8  # steps seen before a choice from which the median counts, not the fastest
_COST_MAX = 0.01  # a put may cost at most this share of the K steps between puts
_EVERY_CAP = 20  # K at most this with no disk checkpoint interval (RK_CKPT_EVERY_DEFAULT)
_HEADER_BYTES = 65536  # the room rule's allowance for a generation's header
_HASH_ITEM = "guard.state_hash"  # a generation's replica hash (state_hash), I64
# a rank's generations at most while rk run writes checkpoints from them: two rolling, the
# pinned one it writes, a pinned one waiting, and rk run's copy in RAM of the one it writes
_SNAP_SAVE_GENS = 5


def _py_rng_same(a, b):
    """Whether two (step, numpy state, Python state) hold the same numpy and Python states."""
    na, nb = a[1], b[1]
    return a[2] == b[2] and na[0] == nb[0] and np.array_equal(na[1], nb[1]) and tuple(na[2:]) == tuple(nb[2:])


def snap_every(put_s, step_s, cap, forced=0):
    """K, the steps between puts: the smallest K >= 1 with the puts' time at most 1 % of the
    steps', at most `cap` (the disk checkpoints' interval); `cap` when the step time is unknown
    (<= 0). Without forced puts that is put_s / (K x step_s) <= 1 %. With a put forced every
    `forced` steps (each disk checkpoint's step: memory is never older than the disk) and K
    counted from each put, (forced - 1) // K + 1 puts fall in each `forced` steps: the smallest K
    with that many within the budget (the forced ones alone over it: `cap`). The worker
    runtime's rule too (rk_worker_snap_every, src/runtime/worker_snap.c)."""
    cap = max(1, int(cap))
    if not step_s > 0:
        return cap
    if forced > 1:
        budget = forced if put_s <= 0 else math.floor(min(_COST_MAX * forced * step_s / put_s, forced) + 1e-9)
        if budget < 1:
            return cap
        k = 1 if budget >= forced else (forced - 1) // budget + 1
    else:
        k = math.ceil(put_s / (_COST_MAX * step_s) - 1e-9)
    return max(1, min(cap, k))


def snap_every_env(text):
    """RK_SNAP_EVERY's K (a whole number >= 1), None when unset or empty; ValueError otherwise."""
    if not text:
        return None
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) < 1:
        raise ValueError(f"RK_SNAP_EVERY={text[:40]!r} is not a whole number >= 1")
    return int(text)


class _Memory:
    """Job's snapshot methods (Job defines the state they read and write)."""

    def _mem_init(self):
        """Snapshots on with RK_SNAP_DIR and a checkpoint directory (the resume weighs the
        two); K from RK_SNAP_EVERY (not timed), else timed at run time."""
        d = os.environ.get(_snap.DIR_ENV) or None
        self.restored_from = "none"  # where the state came from: memory, disk or none
        self._mem_dir = d if d and self.ckpt_dir else None
        self._mem_put_ok = True  # this rank's puts go on (False: off, said once)
        self._mem_every = 1
        self._mem_next = 0
        self._mem_last = -1  # the step of the last put
        self._mem_timed = 0  # puts due so far (made or not), up to the last choice of K
        self._mem_puts = []  # rank 0's timed puts since K was last chosen (s)
        self._mem_steps = []  # the steps before them (s)
        self._mem_room = False
        self._mem_refused = None  # (step, why): the store refused this rank's put of that step
        self._mem_rng = None  # (step, numpy state, Python state) of this rank's last put
        self._last_step_s = 0.0
        # rk run writes the disk checkpoints from the snapshots (RK_CKPT_FROM_SNAP=1: it keeps
        # them in a directory of its host); off for good once a rank's puts are (agreed)
        self._snap_save = (os.environ.get("RK_CKPT_FROM_SNAP") == "1" and self._mem_dir is not None
                           and self.w.heartbeat is not None)
        self._snap_asked = None  # the step rank 0 asks rk run to save at the next boundary
        self._snap_short = False  # rank 0 found no room for the pins of rk run's writes
        try:
            k = snap_every_env(os.environ.get("RK_SNAP_EVERY", ""))
        except ValueError as e:
            self._say(f"{e}: ignored")
            k = None
        if k is not None:
            self._mem_every = k
            self._mem_timed = _RETIMED[-1]  # fixed: never timed

    def _mem_cap(self):
        return self.ckpt_every if self.ckpt_every > 0 else _EVERY_CAP

    def _mem_off(self, why):
        """No more puts from this rank; one snapshot_off event (no rank blamed: memory is short,
        no device is at fault); rk run gives later launches no RK_SNAP_DIR."""
        self._mem_put_ok = False
        self._say(f"snapshots in memory off, checkpoints on disk only: {why}")
        self.w.event(self.step_no, "snapshot_off", blame=-1, action="disk_only", lost_steps=0, detail=why)

    def _mem_hash(self):
        """This rank's replica hash of the state now: the one the boundary computed, if any."""
        for s in (self._pending, self._snap):
            if s is not None and s.get("step") == self.step_no and "hash" in s and (s is self._pending or self._fresh):
                return s["hash"]
        return state_hash(self.module, self.opt, self._hash_buffers)

    def _mem_items(self):
        """This rank's generation: rank 0 the disk checkpoint's items with its own RNG states
        (rng.*), every other rank its own RNG states (rng.*.rank<R>); each with its replica
        hash (guard.state_hash), which a resume compares. (items, the RNG states put)."""
        rng = self._capture_rng()
        items = self._items([rng]) if self.rank == 0 else self._rng_items(rng, f".rank{self.rank}")
        h = self._mem_hash()
        items.append(_ckpt.Item(_HASH_ITEM, "I64", (), struct.pack("<q", h - (1 << 64) if h >= 1 << 63 else h)))
        return items, rng

    def _mem_step(self, force=False):
        """At a step boundary, on every rank, with no collective: when a put is due (K steps
        after the last, or the boundary is before the last one: a rollback) or `force`d (a disk
        checkpoint of this step was saved: memory is never older than the disk, so a rank
        replaced in place or a relaunch restores from memory), this rank puts its generation of
        this step. Rank 0 times its first puts and broadcasts K once."""
        if self._mem_dir is None or not (self.step_no >= self._mem_next or self.step_no < self._mem_last
                                         or (force and self.step_no != self._mem_last)):
            return
        self._mem_last, self._mem_next = self.step_no, self.step_no + self._mem_every
        took = None
        if self._mem_put_ok:
            t0 = time.monotonic()
            items, put_rng = self._mem_items()
            if self.rank == 0 and not self._mem_room:  # the size is known only now
                self._mem_room = True
                mine = sum(it.nbytes + 128 for it in items) + _HEADER_BYTES
                rng = sum(it.nbytes + 128 for it in items if it.name.startswith("rng.")) + _HEADER_BYTES
                per = -(-(mine + (self.world - 1) * rng) // self.world)
                try:  # every rank's two generations: rank 0's, and the others' RNG states
                    ok, why = _snap.room(self._mem_dir, per, self.world)
                    if ok and self._snap_save:  # and what rk run's writes hold (_SNAP_SAVE_GENS,
                        # docs/recovery.md, "Disk checkpoints from the snapshots")
                        more, short = _snap.room(self._mem_dir, per, self.world, keep=_SNAP_SAVE_GENS)
                        if not more:
                            self._snap_short = True
                            self._say(f"snapshots in memory on, but no room for rk run to write the checkpoints "
                                      f"from them: rank 0 writes them ({short})")
                except (_ckpt.CheckpointError, OSError) as e:
                    ok, why = False, str(e)
                if not ok:
                    self._mem_off(why)
            if self._mem_put_ok:
                try:
                    _snap.put(self._mem_dir, self.rank, self.step_no, items, epoch=self.epoch, cursor=self.cursor,
                              world_size=self.world, config=self._ckpt_config())
                    took = time.monotonic() - t0
                    now = (self.step_no, put_rng["numpy"], put_rng["random"])  # a heal compares them (_inplace.py)
                    if self._slot is not None and not self._slot_more and self._mem_rng is not None \
                            and not _py_rng_same(self._mem_rng, now):
                        self._slot_more = True  # recovery in place: the RNG slot holds them from now on
                        self._say(f"numpy's or Python's global RNG was drawn from between steps {self._mem_rng[0]} "
                                  f"and {self.step_no}: each step attempt saves them too (for a redo, and for a "
                                  "replacement in place)")
                    self._mem_rng = now
                except _ckpt.NonFiniteError as e:  # the store's rule: this step is not put, the next may be
                    self._mem_refused = (self.step_no, str(e))
                    self._say(f"snapshot of step {self.step_no} refused: {e}")
                except (_ckpt.CheckpointError, OSError) as e:  # StorageError (the tmpfs is full) among them
                    self._mem_off(f"rank {self.rank} could not put its snapshot of step {self.step_no}: {e}")
        if self._mem_timed >= _RETIMED[-1]:
            return
        # K: the first put makes the directory and is not timed; the next are (rank 0's): K is
        # chosen at the (_TIMED + 1)th put and again at each count of _RETIMED, from the puts
        # and steps since; counted on every rank whether its put was made, so that every rank
        # meets the broadcasts
        self._mem_timed += 1
        if self._mem_timed > 1 and took is not None:
            self._mem_puts.append(took)
            if self._last_step_s > 0:
                self._mem_steps.append(self._last_step_s)
        if self._mem_timed != _TIMED + 1 and self._mem_timed not in _RETIMED:
            return
        k = was = self._mem_every
        if self.rank == 0 and self._mem_puts:
            put = sum(self._mem_puts) / len(self._mem_puts)
            steps = self._mem_steps
            # the fastest of a few steps (a slow first step does not hide the cost), the median
            # of many (a put costs its mean share of the steps' time); rk_median_sort's in C
            step = 0.0 if not steps else min(steps) if len(steps) < _SETTLED else statistics.median(steps)
            k = snap_every(put, step, self._mem_cap(), self.ckpt_every if self.ckpt_every > 0 else 0)
            if self._mem_timed == _TIMED + 1 or k != was:
                self._say(f"snapshot: a put takes {put * 1e3:.2f} ms, a step {step * 1e3:.2f} ms"
                          f"{'' if len(steps) < _SETTLED else f' (the median of {len(steps)})'}: one every "
                          f"{k} step{'' if k == 1 else 's'}{'' if self._mem_timed == _TIMED + 1 else f' (was {was})'} "
                          f"(at most {_COST_MAX * 100:.0f}% of the steps' time, at most every {self._mem_cap()})")
        self._mem_puts, self._mem_steps = [], []
        if self.distributed and self.world > 1:
            box = [k]
            self._collective(dist.broadcast_object_list, box, 0)
            k = box[0]
        self._mem_every = k
        self._mem_next = self.step_no + k

    def _snap_ckpt(self, now):
        """A checkpoint of this step, written by rk run from the snapshots: every rank puts its
        generation of the step and pins it (its bytes stay while rk run reads them, whatever the
        later puts). Rank 0 asks for the checkpoint at the next boundary, when every rank has
        pinned (each took part in a step since); `now` (the last step, a stop): at once, after
        an all-gather of whether every rank pinned (if one could not, rank 0 writes it itself,
        as without rk run's writes). A put the store refuses for a NaN or an infinity is refused as the checkpoint would
        be (exit 5, ckpt_refused); a rank whose put failed turns its snapshots off, which every
        rank learns at the next step (rank 0 then writes the checkpoints)."""
        self._saved_step = step = self.step_no
        self._mem_step(force=True)
        if self._mem_refused is not None and self._mem_refused[0] == step:
            self._ckpt_refused(f"checkpoint of step {step} refused: {self._mem_refused[1]}")
        pinned = False
        if self._mem_put_ok and self._mem_last == step:
            try:
                _snap.pin(self._mem_dir, self.rank, step)
                pinned = True
            except (_ckpt.CheckpointError, OSError) as e:
                self._mem_off(f"rank {self.rank} could not pin its snapshot of step {step}: {e}")
        if not now:
            self._snap_asked = step
            return
        oks = [pinned]  # the last checkpoint is not left to a later step: every rank's part, or rank 0's own
        if self.distributed and self.world > 1:
            oks = [None] * self.world
            self._collective(dist.all_gather_object, oks, pinned)
        if all(oks):
            if self.rank == 0:
                self.w.save(step, self.keep)
        else:
            self._snap_save = False
            self._save()

    def _mem_send_head(self, step, far):
        """Rank 0 sends its generation of `step` to every rank (a broadcast of its bytes; across
        hosts the ranks on other nodes than rank 0's have no copy of it); a rank with `far`
        keeps it once it verifies. (bad, ck): bad the first rank that could not (None: none),
        ck the verified generation (on a rank with `far`)."""
        buf = None
        if self.rank == 0:
            try:
                buf = _snap.raw(self._mem_dir, 0, step)
            except (_ckpt.CheckpointError, OSError) as e:
                self._say(f"snapshot of step {step}: cannot send it to the ranks on other nodes: {e}")
        buf = self._bcast_bytes(0, buf, far)
        if buf is None:
            return 0, None
        ck, why = None, None
        if far:
            try:
                ck = _snap.from_bytes(buf, step, f"rank 0's snapshot of step {step}, sent by rank 0")
            except _ckpt.CheckpointError as e:
                why = str(e)
                self._say(f"snapshot of step {step} not restored: {e}")
        oks = [None] * self.world
        self._collective(dist.all_gather_object, oks, why is None)
        return next((r for r, ok in enumerate(oks) if not ok), None), ck

    def _bcast_bytes(self, root, buf, want=True):
        """`buf` (a bytearray, or None: nothing to send) broadcast from rank `root` (its length
        first, then its bytes): the bytes on every rank (on a GPU, copied back only where they
        are `want`ed), None on every rank when the root had nothing."""
        box = [len(buf) if self.rank == root and buf is not None else -1]
        self._collective(dist.broadcast_object_list, box, root)
        n = box[0]
        if n <= 0:
            return None
        if buf is None or self.rank != root:
            buf = bytearray(n)
        t = torch.frombuffer(buf, dtype=torch.uint8)  # the broadcast fills buf in place on the CPU
        on = t if self.device.type == "cpu" else t.to(self.device)
        self._collective(dist.broadcast, on, root)
        if want and on is not t:
            t.copy_(on.cpu())
        return buf

    def _mem_take(self, step, head, ck):
        """Every rank's part of restoring `step`, which rank 0 verified (its generation `ck` on
        rank 0, its replica hash `head`): every other rank verifies its own generation of it
        and takes rank 0's; one all-gather of whether each could. (the generation to apply,
        this rank's RNG items), or (None, {}) on every rank when some rank could not."""
        why, far, rng = None, False, {}
        if self.rank != 0:
            try:
                own = _snap.get(self._mem_dir, self.rank, step)
                if bytes(own.items[_HASH_ITEM].data) != head:
                    why = (f"{own.path}: this rank's replica hash differs from rank 0's: the replicas were not "
                           "verified at that step")
                else:
                    try:  # a rank-0 directory here from before a move is not rank 0's now
                        ck = _snap.get(self._mem_dir, 0, step)
                        far = bytes(ck.items[_HASH_ITEM].data) != head
                    except _snap.SnapshotMissing:
                        far = True
                    rng = {n: it for n, it in own.items.items() if n.startswith("rng.")}
            except (_ckpt.CheckpointError, OSError, KeyError) as e:
                why = str(e)
        if why:
            self._say(f"snapshot of step {step} not restored: {why}")
        oks = [(why is None, far)]
        if self.distributed and self.world > 1:
            oks = [None] * self.world
            self._collective(dist.all_gather_object, oks, (why is None, far))
        bad = next((r for r, (ok, _) in enumerate(oks) if not ok), None)
        if bad is None and any(f for _, f in oks):
            bad, sent = self._mem_send_head(step, far)
            if bad is None and far:
                ck = sent
        if bad is not None:
            if self.rank == 0:
                self._say(f"snapshot: rank {bad} could not restore step {step} from memory")
            return None, {}
        return ck, rng

    def _mem_resume(self):
        """The relaunch's resume from memory, collective. Every rank lists its own generations
        in its node's directory and every rank learns every rank's (one all-gather): no
        directory needs to hold every rank's (across hosts each node holds its own ranks').
        The candidates are the steps every rank holds, newest first, at least as new as the
        newest disk checkpoint (by its file name). For each, until one is restored: rank 0
        verifies its generation (every checksum) and that it is this run's and broadcasts the
        step and its replica hash; every other rank verifies its own generation of it, checks
        its replica hash against rank 0's and takes rank 0's generation (the replicated state:
        from its own node's directory when rank 0 is on its node, else sent by rank 0 and
        verified here); every rank learns (one all-gather) whether all could. A generation is
        read and verified only when its step is a candidate: the newest, in the common case.
        Never mixed steps. True when the state came from memory."""
        mine = []
        try:
            mine = _snap.steps(self._mem_dir, self.rank)
        except (_ckpt.CheckpointError, OSError) as e:
            self._say(f"snapshot: {e}")
        lists = [mine]
        if self.distributed and self.world > 1:
            lists = [None] * self.world
            self._collective(dist.all_gather_object, lists, mine)
        cands = []
        if self.rank == 0:
            cands = [s for s in lists[0] if all(s in v for v in lists)]
            if not cands and any(lists):  # none at all: a first launch, nothing to say
                self._say("snapshot: no step that every rank holds in memory: resuming from disk")
            try:
                disk = max((s for s, _ in _ckpt.list_checkpoints(self.ckpt_dir)), default=-1)
            except (_ckpt.CheckpointError, OSError):
                disk = -1
            if cands and cands[0] < disk:
                self._say(f"snapshot: step {cands[0]} in memory is older than the checkpoint of step {disk} on "
                          "disk: resuming from disk")
            cands = [s for s in cands if s >= disk]
        tried = False
        while True:
            step, head, ck = None, None, None
            if self.rank == 0 and tried and not cands:
                self._say("snapshot: no other step that every rank holds in memory: resuming from disk")
            tried = True
            while self.rank == 0 and cands and step is None:
                s = cands.pop(0)
                try:
                    ck = _snap.get(self._mem_dir, 0, s)
                    why = self._mismatch(ck)
                    if why is None and ck.world_size != self.world:  # the disk path resumes on another world
                        why = f"{ck.path}: written by {ck.world_size} ranks, now {self.world}"
                    head = bytes(ck.items[_HASH_ITEM].data)
                except (_ckpt.CheckpointError, OSError, KeyError) as e:
                    why = str(e)
                if why:
                    self._say(f"snapshot of step {s} not restored: {why}")
                    ck = None
                else:
                    step = s
            if self.distributed and self.world > 1:
                box = [step, head]
                self._collective(dist.broadcast_object_list, box, 0)
                step, head = box
            if step is None:
                return False
            ok, rng = self._mem_take(step, head, ck)
            if ok is not None:
                ck = ok
                break
        if self.rank != 0:
            ck.items.update(rng)
        try:
            self._apply(ck)
        except (KeyError, ValueError, RuntimeError) as e:
            self._usage(f"{ck.path}: cannot resume this model from it: {e}")
        self.restored_from = "memory"
        self._mem_last = self._mem_next = step  # the resumed step is put again (it makes the directory)
        self._say(f"resumed from {ck.path} (step {ck.step}, epoch {ck.epoch}, cursor {ck.cursor}, written by "
                  f"{ck.world_size} ranks; now {self.world}): node memory")
        return True
