"""rekindle.torch's recovery in place (docs/recovery.md, "In place"): under `rk run --recovery
inplace` (RK_REJOIN=1) a rank whose collective fails because a peer died does not exit. It
waits for rk run's rejoin command (docs/protocol.md: a new epoch and MASTER_PORT), leaves the
old process group, joins the new one with the replacement rank that rk run started, replays
the collectives the replacement's DDP constructor makes (by constructing a DDP of its own on
the new group, whose internals then replace the old one's), restores the agreed step from the
node's snapshot with every rank (the relaunch's _mem_resume, collective) and goes on from
there. A mixin of Job (its attributes); relies on _Memory and the comm hook."""

import array
import copy
import gc
import os
import random
import socket
import struct
import sys
import threading
import time
import weakref

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout
from torch.nn.parallel import DistributedDataParallel as _DDP

from rekindle import ckpt as _ckpt
from rekindle import snap as _snap
from rekindle import worker as _worker
from rekindle.torch._hook import _comm_hook
from rekindle.torch._memory import _py_rng_same
from rekindle.torch._state import _item

_NP_TAIL = struct.Struct("<iid")  # numpy's MT19937 after its 624 keys: pos, has_gauss, cached
_PY_TAIL = struct.Struct("<i?d")  # Python's random around its 625 words: version, whether gauss_next, it
_NP_BYTES = 624 * 4 + _NP_TAIL.size


def _py_rng_pack(n, r):
    """numpy's and Python's global RNG states (get_state(), getstate()) as bytes for a slot
    (about 12 us: the words as arrays, not one by one)."""
    if n[0] != "MT19937" or len(n[1]) != 624 or len(r[1]) != 625:
        raise ValueError(f"RNG states of another kind ({n[0]}, {len(r[1])} words) than a slot holds")
    return b"".join((np.asarray(n[1], dtype="<u4").tobytes(), _NP_TAIL.pack(int(n[2]), int(n[3]), float(n[4])),
                     array.array("I", r[1]).tobytes(), _PY_TAIL.pack(r[0], r[2] is not None, r[2] or 0.0)))


def _py_rng_unpack(b):
    """_py_rng_pack's states back: (numpy's, Python's)."""
    keys = np.frombuffer(b, dtype="<u4", count=624).astype(np.uint32)
    pos, has_gauss, cached = _NP_TAIL.unpack_from(b, 624 * 4)
    words = array.array("I")
    words.frombytes(b[_NP_BYTES:_NP_BYTES + 625 * 4])
    version, has, g = _PY_TAIL.unpack_from(b, _NP_BYTES + 625 * 4)
    return ("MT19937", keys, pos, has_gauss, cached), (version, tuple(words), g if has else None)


_REJOIN_WAIT_S = 30.0  # how long a survivor waits for rk run's rejoin command
_EPOCH_ENV = "RK_REJOIN_EPOCH"  # set for a replacement: the epoch of the group it joins


def await_store(addr, port, wait_s=_REJOIN_WAIT_S, void=None):
    """Returns once rank 0's store of a new rendezvous accepts connections on addr:port (a
    probe connection, closed at once; the store counts only clients that say so), or after
    wait_s; with `void`, not before the store accepts, however long rank 0 (a replacement that
    starts cold on a busy host) takes, unless `void()` says the rendezvous is void (_Void): a
    survivor must not go on to torch's store client, whose retries of a refused connection
    hold the GIL for its whole timeout where _Watch cannot end them. A rank other than 0 joins
    a new group while rank 0 is still making it: torch's store client retries a refused
    connection only after a second (torch 1.13: 0.95 s lost when it came 50 ms early), which
    was most of a replacement's time in place."""
    deadline = time.monotonic() + wait_s
    while void is not None or time.monotonic() < deadline:
        if void is not None and void():
            raise _Void(f"the rendezvous on port {port} is void: rk run started a newer one")
        try:
            socket.create_connection((addr, int(port)), timeout=0.2).close()
            return
        except (ConnectionRefusedError, socket.timeout):
            time.sleep(0.002)
        except OSError:
            return  # not a refusal (no route, a bad name): the store's client says what is wrong


class _Void(RuntimeError):
    """The rendezvous this rank is joining is void: rk run sent a newer rejoin command (a
    failure during the recovery)."""


def _sockets_to(port):
    """This process's descriptors of TCP connections to `port` (a rendezvous store's): (fd,
    inode) pairs, from /proc/self/fd and the namespace's /proc/self/net/tcp{,6}."""
    inodes = set()
    for name in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(name, "rb") as f:
                lines = f.read(1 << 22).splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if len(f) > 9 and f[2].rpartition(b":")[2] and int(f[2].rpartition(b":")[2], 16) == port:
                inodes.add(int(f[9]))
    out = []
    if not inodes:
        return out
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and int(link[8:-1]) in inodes:
            out.append((int(fd), int(link[8:-1])))
    return out


def _shut_store(port):
    """Shuts down (both ways) this process's connections to the store on `port`: a call of
    torch's blocked on them (a store wait of init_process_group, for a rank that will not
    come) raises at once. Each descriptor is duplicated and checked to be the same socket
    first (a descriptor closed and reused meanwhile is not touched); the store's own listening
    and accepted sockets (rank 0's) are left alone. The number shut."""
    n = 0
    for fd, ino in _sockets_to(port):
        try:
            d = os.dup(fd)
        except OSError:
            continue
        try:
            if os.fstat(d).st_ino != ino:
                continue
            with socket.socket(fileno=d) as sk:
                d = -1
                try:
                    sk.shutdown(socket.SHUT_RDWR)
                    n += 1
                except OSError:
                    pass
        finally:
            if d >= 0:
                os.close(d)
    return n


class _Watch:
    """While a survivor joins the rendezvous of `epoch` on `port`: a thread that watches for
    rk run's newer rejoin command (a failure during this recovery voids the rendezvous) and
    then shuts this process's connections to the store (_shut_store), so that a wait on a
    rank that will never come (it died, or rk run killed it to start it again) raises instead
    of lasting torch's timeout. `void()` says whether it came."""

    def __init__(self, w, epoch, port):
        self._w, self._epoch, self._port = w, epoch, int(port)
        self._done = threading.Event()
        self._void = False
        self._t = threading.Thread(target=self._run, name="rekindle-rejoin-watch", daemon=True)
        self._t.start()

    def void(self):
        return self._void

    def _newer(self):
        alive = self._w.alive()  # reads what arrived (the lock is the Worker's); keeps commands
        r = self._w.rejoin
        return not alive or (r is not None and r["epoch"] > self._epoch)

    def _run(self):
        while not self._done.wait(0.005):
            try:
                if not self._void and self._newer():
                    self._void = True
                if self._void:  # again while the main thread is in it: a store client made later
                    _shut_store(self._port)
            except Exception:  # noqa: BLE001 - the watch goes on (an unreadable /proc entry)
                pass

    def close(self):
        self._done.set()
        self._t.join()


class _Rejoined(Exception):
    """Raised out of a collective at a step boundary once the rank has rejoined: the loop
    goes on from the restored step."""


class _InPlace:
    """Job's rejoin methods (Job defines the state they read and write)."""

    def _inplace_init(self):
        """Rejoin on when rk run asks for it (RK_REJOIN=1), with DDP over gloo, 2 ranks or
        more, and snapshots in node memory to restore from."""
        self._broken = None  # the collective error the comm hook swallowed in this attempt
        self._rejoining = False  # inside _rejoin: a collective that fails there ends the rank
        try:
            self._rejoin_epoch = int(os.environ.get(_EPOCH_ENV, "0") or 0)
        except ValueError:
            self._rejoin_epoch = 0
        self._replacement = self._rejoin_epoch > 0
        self._rejoin_ok = bool(
            os.environ.get("RK_REJOIN") == "1" and self.distributed and self.world > 1
            and isinstance(self.model, _DDP) and dist.get_backend() == "gloo" and self._mem_dir
            and self.w.heartbeat)
        self._slot = None  # this rank's RNG slot (rekindle.snap.RngSlot), written at each attempt
        self._slot_more = False  # numpy's and Python's states too (the script draws from them: _mem_step)
        self._healed = None  # the survivor whose state the last heal sent (None: not healed)
        # rank 0's buffers, where DDP broadcasts them at each forward (BatchNorm's statistics:
        # rank 0's own, which no survivor holds), go in its slot too (the same size on its
        # replacement, which reads them)
        nbytes = sum(b.numel() * b.element_size() for b in self._buffers)
        self._slot_bufs = self.rank == 0 and not self._hash_buffers and 0 < nbytes <= _snap.RNG_SLOT_EXTRA_MAX
        self._slot_extra = nbytes if self._slot_bufs else 0
        if self._rejoin_ok:
            try:
                self._slot = _snap.RngSlot(self._mem_dir, self.rank, self._slot_extra)
            except (_ckpt.CheckpointError, OSError) as e:
                self._say(f"no RNG slot ({e}): a replacement of this rank restores the node's snapshot")

    def _slot_put(self):
        """At an attempt's start: this rank's RNG states of the step into its slot (a few us)."""
        st = self._step_rng
        bufs = b"".join(b.cpu().contiguous().numpy().tobytes() for b in self._step_bufs) if self._slot_bufs else b""
        try:
            more = _py_rng_pack(st["numpy"], st["random"]) if "numpy" in st else b""
            self._slot.write(self.step_no, self.w.launch, self._serial, st["torch"].numpy().tobytes(),
                             st["cuda"].numpy().tobytes() if "cuda" in st else b"", bufs, more)
        except (OSError, ValueError) as e:
            self._say(f"RNG slot off ({e}): a replacement of this rank restores the node's snapshot")
            self._slot.close()
            self._slot = None

    # ------------------------------------------------------------- healed from the survivors

    def _heal_offer(self):
        """A survivor's part of the heal's first all-gather (None from a replacement): the step
        it holds, the attempt whose RNG slot the dead rank must have written for it (this
        attempt's, or at a boundary the next one's), its launch, its last put's step, whether
        numpy's or Python's global RNG moved since that put (then the replacement needs them
        from its slot: its generation of the put is stale), and whether it can be a source: a
        survivor inside an attempt puts back the attempt's draws, which it can for numpy's and
        Python's only where its attempt saved them (_slot_more)."""
        if self._replacement:
            return None
        mid = self._attempt is not None
        moved = True
        if self._mem_rng is not None:
            moved = not _py_rng_same(self._mem_rng, (None, np.random.get_state(), random.getstate()))
        ok, why = True, ""
        if moved and mid and "numpy" not in (self._step_rng or {}):
            ok, why = False, (f"numpy's or Python's global RNG was drawn from since step "
                              f"{self._mem_rng[0] if self._mem_rng else 0} and this attempt did not save them")
        return {"step": self.step_no, "serial": self._serial if mid else self._serial + 1, "launch": self.w.launch,
                "put": self._mem_rng[0] if self._mem_rng else -1, "moved": moved, "ok": ok, "why": why,
                "mode": self._mode}

    def _heal_rng(self, plan):
        """A replacement's own RNG states of the plan's step: torch's (and CUDA's) from the dead
        rank's slot, numpy's and Python's from its generation of the survivors' last put; as
        items named as rank 0's (rng.*), which _apply takes when the rank's own are absent. And
        rank 0's buffers from its slot where DDP broadcasts them (bytes; b"" elsewhere)."""
        if self.rank == 0 and not self._hash_buffers and not self._slot_bufs:
            raise _ckpt.CheckpointError("rank 0's module buffers (DDP broadcasts them at each forward) are not in "
                                        f"its slot (more than {_snap.RNG_SLOT_EXTRA_MAX} bytes)")
        t, c, bufs, more = _snap.rng_slot_read(self._mem_dir, self.rank, plan["step"], plan["launch"],
                                               plan["serial"], self._slot_extra)
        if len(bufs) != self._slot_extra:
            raise _ckpt.CheckpointError(f"rank 0's slot of step {plan['step']} holds {len(bufs)} bytes of buffers, "
                                        f"not {self._slot_extra}")
        rng = {"torch": torch.frombuffer(bytearray(t), dtype=torch.uint8)}
        if c:
            rng["cuda"] = torch.frombuffer(bytearray(c), dtype=torch.uint8)
        if more:  # the slot's own: the states at the step's start, as a checkpoint's items
            rng["numpy"], rng["random"] = _py_rng_unpack(more)
            return {it.name: it for it in self._rng_items(rng, "")}, bufs
        if plan["moved"]:  # (also when a survivor has made no put: nothing to compare with)
            raise _ckpt.CheckpointError(f"numpy's and Python's RNG states of step {plan['step']} are not in this "
                                        "rank's slot, and they moved since the last snapshot")
        # unchanged since the put: its generation's
        items = {"rng.torch": _item("rng.torch", rng["torch"])}
        if c:
            items["rng.cuda"] = _item("rng.cuda", rng["cuda"])
        gen = _snap.get(self._mem_dir, self.rank, plan["put"])
        suffix = "" if self.rank == 0 else f".rank{self.rank}"
        for k in ("numpy", "random"):
            it = gen.items[f"rng.{k}{suffix}"]
            items[f"rng.{k}"] = _ckpt.Item(f"rng.{k}", it.dtype, it.shape, bytes(it.data))
        return items, bufs

    def _load_bufs(self, data):
        """The module's buffers from the bytes of a slot (their order, dtypes and shapes)."""
        off = 0
        with torch.no_grad():
            for b in self._buffers:
                n = b.numel() * b.element_size()
                b.copy_(torch.frombuffer(bytearray(data[off:off + n]), dtype=b.dtype).view(b.shape))
                off += n

    def _heal_rewind(self):
        """A survivor that failed inside a step attempt puts back what the attempt changed (the
        RNG states, the buffers, the hyperparameters, the scheduler): its state is the step's
        start, as the source's must be."""
        if self._attempt is None:
            return
        self._redo()
        self._put_back(self._restore_next)

    def _heal(self):
        """Collective, on every rank once the new group formed (the survivors in _rejoin, the
        replacement in Job.__init__). The survivors keep their state and the replacement takes
        it from the lowest survivor (its model, optimiser, scheduler and guard window, sent as
        the bytes of a generation and verified), with its own RNG states (and rank 0 its
        buffers) from the dead rank's slot: the step in flight is all that is lost. When that
        cannot be (the survivors hold different steps: a collective completed on some; the slot
        holds another step or is torn; numpy's or Python's RNG moved and no slot or attempt saved
        them; RK_HEAL=0), every rank restores the node's snapshot instead (_mem_resume). True
        when the state was restored either way."""
        offers = [None] * self.world
        self._collective(dist.all_gather_object, offers, self._heal_offer())
        kept = [(r, o) for r, o in enumerate(offers) if o is not None]
        plan, why = (kept[0][1] if kept else None), None
        keys = ("step", "serial", "launch", "put", "moved")
        if os.environ.get("RK_HEAL") == "0":  # for A/B benches: the snapshot always
            why = "RK_HEAL=0"
        elif not kept:
            why = "no rank was kept"
        elif any(not o["ok"] for _, o in kept):
            why = next(f"rank {r}: {o['why']}" for r, o in kept if not o["ok"])
        elif any(tuple(o[k] for k in keys) != tuple(plan[k] for k in keys) for _, o in kept):
            why = "the ranks kept do not agree on the step, the attempt or the RNG states: " + ", ".join(
                f"rank {r} step {o['step']} attempt {o['serial']} put {o['put']}{' moved' if o['moved'] else ''}"
                for r, o in kept)
        rng, bufs = None, b""
        if why is None:
            mine = None
            if self._replacement:
                try:
                    rng, bufs = self._heal_rng(plan)
                except (_ckpt.CheckpointError, OSError, KeyError) as e:
                    mine = str(e)
            whys = [None] * self.world
            self._collective(dist.all_gather_object, whys, mine)
            why = next((f"rank {r}: {w}" for r, w in enumerate(whys) if w), None)
        if why is None:
            src, step = kept[0][0], plan["step"]
            if not self._replacement:
                self._heal_rewind()
            buf = None
            if self.rank == src:
                try:
                    hdr, views = _ckpt.encode(step, self._items([]), epoch=self.epoch, cursor=self.cursor,
                                              world_size=self.world, config=self._ckpt_config(),
                                              label=f"rank {src}'s state of step {step}")
                    buf = bytearray(hdr)
                    for v in views:
                        buf += memoryview(v).cast("B")
                except _ckpt.CheckpointError as e:
                    self._say(f"cannot send the state of step {step} to the replacement: {e}")
            buf = self._bcast_bytes(src, buf, self._replacement)
            mine = None if buf is not None else f"rank {src} sent nothing"
            if buf is not None and self._replacement:
                try:
                    ck = _snap.from_bytes(buf, step, f"rank {src}'s state of step {step}, sent by it")
                    ck.items.update(rng)
                    self._apply(ck)
                    if bufs:  # rank 0's own, not the source's
                        self._load_bufs(bufs)
                    self.restored_from = "peer"
                except (_ckpt.CheckpointError, KeyError, ValueError, RuntimeError) as e:
                    mine = str(e)
            whys = [None] * self.world
            self._collective(dist.all_gather_object, whys, mine)
            why = next((f"rank {r}: {w}" for r, w in enumerate(whys) if w), None)
            if why is None:
                self.start_step = self._saved_step = step
                self._mem_last = self._mem_next = step
                self._healed = src
                return True
        self._healed = None
        says = self.rank == (kept[0][0] if kept else 0)  # one rank says why
        if any(o["mode"] == "epochs" for _, o in kept):
            # job.epochs: a survivor's loader cannot go back to an older step of its epoch (or
            # an epoch before): the rank ends, and rk run relaunches the job
            if says:
                self._say(f"not healed from the ranks kept ({why}), and a job.epochs loop cannot go back to the "
                          "node's snapshot in place")
            return False
        if says:
            self._say(f"not healed from the ranks kept ({why}): every rank restores the node's snapshot")
        return self._mem_resume()

    def _rejoin_sync(self):
        """The last collective of a rejoin, on every rank (survivors and the replacement): the
        snapshot interval K and whether it is still being timed are the survivors' (the
        replacement never times nor broadcasts its own), and so are whether rk run writes the
        checkpoints (a disk checkpoint is written the same way on every rank), the count of
        attempts and whether they save numpy's and Python's states (the RNG slots')."""
        mine = {"survivor": not self._replacement, "every": self._mem_every, "timed": self._mem_timed,
                "snap_save": self._snap_save, "serial": self._serial, "more": self._slot_more}
        every = [None] * self.world
        dist.all_gather_object(every, mine)
        first = next((x for x in every if x["survivor"]), mine)
        self._mem_every, self._mem_timed = first["every"], first["timed"]
        self._snap_save = first["snap_save"]
        self._serial = first["serial"]  # the attempts' count, which the RNG slots are keyed by
        # whether the attempts save numpy's and Python's states: the survivors saw the script
        # draw from them (a replacement would see it only at its second put)
        self._slot_more = self._slot_more or (self._slot is not None and first["more"])
        self._mem_next = self.step_no  # the restored step is put again, on every rank

    def _rejoin(self, exc):
        """A survivor: the collective failed with `exc`. Waits for the rejoin command, joins
        the new group, restores the agreed step from the node's snapshot. Returns when the
        rank is at that step; exits as before (commfail) when it cannot."""
        if self._mode not in ("steps", "epochs"):  # not in the loop yet
            self._comm_failed(exc)
        _worker.trace_phase("py.failed")  # RK_TRACE_LAUNCH: the collective failed here
        what = " ".join(str(exc).split())[:200]
        self._say(f"collective failed at step {self.step_no}: {type(exc).__name__}: {what}; waiting for rk run's "
                  "rejoin command")
        backend, kw = self._ddp_args()
        self._leave_group(exc)
        _worker.trace_phase("py.left")  # the old group dropped: waits for the rejoin command
        # a survivor of this failure, whatever it was at its start: the one whose K and timing
        # the new replacement takes (a process that was itself a replacement once is still
        # `_replacement` from its start; once every original rank had been replaced, no rank
        # counted as a survivor, the new replacement kept its own untimed K, and its lone
        # broadcast of K three puts later hung the job: every 10-minute PyTorch run of
        # bench/run_goodput on 2026-12-07, at about 540 s)
        self._replacement = False
        t0 = None
        was = self.step_no
        mid = self._attempt is not None  # in job.step(): the loop's code after it runs next
        tries = []  # the rendezvous voided by a failure during the recovery, and why
        while True:
            r = self._rejoin_wait(what if not tries else tries[-1])
            t0 = t0 or time.monotonic()
            _worker.trace_phase("py.rejoin")  # RK_TRACE_LAUNCH: the rejoin command is here
            self._rejoining = True
            watch = _Watch(self.w, self._rejoin_epoch, r["port"])
            try:
                self._rejoin_group(r["port"], backend, kw, watch.void)
                _worker.trace_phase("py.grouped")  # the new group formed: the replacement is in it
                restored = self._heal()
                if restored:
                    self._rejoin_sync()
                break
            except (RuntimeError, OSError) as e:  # a peer failed during this rejoin (gloo's, the
                # store's errors; _Void): rk run's next command has the rendezvous to join
                why = f"rejoin {r['epoch']} on port {r['port']}: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
                self._say(f"{why}; waiting for rk run's next rejoin command")
                tries.append(why)
                e.__traceback__ = None
                self._leave_group(e)
            except Exception as e:  # noqa: BLE001 - this rank's own: it ends as a comm failure
                self._rejoin_failed(f"rejoin {r['epoch']} on port {r['port']}: {type(e).__name__}: "
                                    f"{' '.join(str(e).split())[:200]}")
            finally:
                watch.close()
        if not restored:
            self._rejoin_failed(f"rejoin {r['epoch']}: the node's snapshot could not be restored on every rank")
        self._rejoining = False
        self._rejoin_reset()
        if mid:
            # job.step() returns to the loop, whose code after it (a scheduler's step, a learning
            # rate it sets) belongs to the step not applied: put back at the next attempt's start
            self._restore_next = self._held_now()
        _worker.trace_phase("py.rejoined")
        how = (f"kept its state, the replacement took rank {self._healed}'s" if self._healed is not None
               else "restored from the node's snapshot")
        again = f", after {len(tries)} void rendezvous" if tries else ""
        self._say(f"rejoined in place (epoch {r['epoch']}, port {r['port']}{again}) in {time.monotonic() - t0:.3f} s: "
                  f"step {was} -> {self.step_no}, {how}")

    def _rejoin_wait(self, after):
        """Waits for a rejoin command newer than the last one joined (at most _REJOIN_WAIT_S;
        exits as a communication failure without one): its arguments, its epoch taken."""
        deadline = time.monotonic() + _REJOIN_WAIT_S
        while True:
            cmds = self.w.poll()
            if "stop" in cmds:
                self._stop_local = True
            r = self.w.rejoin
            if r is not None and r["epoch"] > self._rejoin_epoch:
                break
            if not self.w.alive() or time.monotonic() > deadline:
                self._rejoin_failed(f"no rejoin command within {_REJOIN_WAIT_S:.0f} s after: {after}")
            time.sleep(0.002)
        self._rejoin_epoch = r["epoch"]
        return r

    def _ddp_args(self):
        """(backend, DDP arguments) for the new group and DDP, from the old ones."""
        ddp = self.model
        kw = dict(device_ids=ddp.device_ids, output_device=ddp.output_device, dim=ddp.dim,
                  broadcast_buffers=ddp.broadcast_buffers, bucket_cap_mb=ddp.bucket_bytes_cap / (1024 * 1024),
                  find_unused_parameters=ddp.find_unused_parameters,
                  gradient_as_bucket_view=ddp.gradient_as_bucket_view, static_graph=bool(ddp.static_graph))
        return dist.get_backend(), kw

    def _leave_group(self, exc):
        """Drops every reference this process holds to the old group (the registry's, the
        Job's, the DDP object's reducer, logger and group, the failed collective's through its
        traceback), so that gloo closes its connections at once: a peer blocked on this rank
        (with 3 or more ranks a ring neighbour, not the dead rank's) gets an error and rejoins
        too, instead of waiting in the old group while this rank waits for it in the new one.
        Also after a rejoin that failed part way (no group, or one not yet the DDP's)."""
        ddp = self.model
        try:  # the group's Python object: freed once dropped
            old = weakref.ref(dist.group.WORLD)
        except TypeError:  # none (a rendezvous that failed), or a group without weak references
            old = (lambda: None) if dist.group.WORLD is None else (lambda: True)  # noqa: E731
        exc.__traceback__ = None
        self._broken = None
        self._pg = None
        self._vec = None
        try:
            dist.destroy_process_group()
        except (RuntimeError, AssertionError, ValueError):
            pass
        for k in ("reducer", "logger", "process_group"):
            ddp.__dict__.pop(k, None)
        # what still holds it is in a cycle: the young generations first (the failed
        # collective's futures and frames), a full collection (20-50 ms with torch's objects
        # here, in the survivors' path) only if that did not free it
        if old() is not None:
            gc.collect(1)
        if old() is not None:
            gc.collect()

    def _rejoin_group(self, port, backend, kw, void=None):
        """Joins the new group (MASTER_PORT `port`, the same rank and world) and makes the
        script's DDP object a new one on it: the constructor's collectives (parameter shapes,
        the module states' broadcast) are the replacement's, and its reducer rebuilds its
        buckets when the replacement's does. `void()`: the rendezvous is void (_Watch)."""
        ddp = self.model
        os.environ["MASTER_PORT"] = str(port)
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        # torch names the default group by a count of the groups made since the last
        # destroy_process_group (the prefix of its keys in the store): one whose making failed
        # (a void rendezvous) counted, and destroying nothing resets nothing; a replacement's
        # is "0", so must this rank's be, or each waits for the other's keys forever
        c10d = dist.distributed_c10d
        if not dist.is_initialized() and getattr(c10d, "_group_count", 0) != 0:
            c10d._group_count = 0
        if self.rank != 0:  # rank 0 makes the store: not a second lost to the client's retry
            await_store(addr, port, void=void)
            dist.init_process_group(backend, rank=self.rank, world_size=self.world)
        else:
            # the store env:// makes, but not waiting for the other ranks in its constructor,
            # which holds the GIL (torch 1.13) and so would keep _Watch from voiding a
            # rendezvous a dead rank will never join: init_process_group's own wait for them
            # (its store-based barrier, gloo's exchange of addresses) lets it run
            store = dist.TCPStore(addr, int(port), self.world, True, default_pg_timeout,
                                  wait_for_workers=False, multi_tenant=True)
            dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=0,
                                    world_size=self.world)
            del store
        if void is not None and void():  # formed, but a newer one is asked for
            raise _Void(f"the rendezvous on port {port} is void: rk run started a newer one")
        # the constructor broadcasts rank 0's parameters and buffers: a replacement's initial
        # ones when rank 0 is the one replaced; this rank's own come back after (the heal sends
        # them to the replacement)
        with torch.no_grad():
            held = [t.detach().clone() for t in self.module.state_dict().values()]
            try:
                new = _DDP(self.module, **kw)
            finally:  # also when the broadcast failed part way: no bucket of it stays
                for t, h in zip(self.module.state_dict().values(), held):
                    t.copy_(h)
        del held
        hooks = {k: v for k, v in ddp.__dict__.items() if k.endswith("hooks")}
        ddp.__dict__.update({k: v for k, v in new.__dict__.items() if not k.endswith("hooks")})
        ddp.__dict__.update(hooks)
        del new
        ddp.register_comm_hook(weakref.ref(self), _comm_hook)
        self._pg = ddp.process_group

    def _held_now(self):
        """The state a redo would put back, taken now (a _restore_next)."""
        return {"rng": self._capture_rng(), "bufs": [b.detach().clone() for b in self._buffers],
                "groups": [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in self.opt.param_groups],
                "sched": copy.deepcopy(self.scheduler.state_dict()) if self.scheduler is not None else None}

    def _rejoin_reset(self):
        """A survivor's Job state as a replacement's is after its resume: no verified snapshot,
        no hash pending, no guard trip, nothing to put back, no attempt."""
        self._snap = None
        self._fresh = False
        self._pending = None
        self._trips = 0
        self._suspect = None
        self._spiked = None
        self._rolled_at = -1
        self._restore_next = None
        self._flags = [0.0] * len(self._flags)  # none set (Job.__init__ sizes them)
        self._local_ckpt = False
        self._attempt = None
        self._loss_t = None
        self._broken = None
        self._vec = None
        self._sumsq = None
        self._redsums = []
        self._red_bad = False
        self._deferred = None
        self._t0_step = -1
        self._rolled_back = True
        # the new DDP has not rebuilt its buckets: as in a resumed process, the next backward
        # is reduced in the run's layout and DDP rebuilds from it (Job._defers, 3 ranks or more)
        self._rebuilt = False
        self._backwards = 0

    def _rejoin_failed(self, why):
        self._say(f"cannot rejoin: {why}")
        self.w.exit_event(self.step_no, "commfail", f"cannot rejoin in place: {why}"[:400])
        sys.stdout.flush()
        self._exit(3)
