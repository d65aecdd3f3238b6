"""rekindle.torch's checkpoints: what a Job saves (model, optimiser, every rank's RNG states,
the data position, the guards' loss window) in rekindle's store format, how it checks that a
checkpoint is this run's, and how it resumes from one. A mixin of Job (its attributes)."""

import json
import struct
import time

import numpy as np
import torch
import torch.distributed as dist

from rekindle import ckpt as _ckpt
from rekindle.torch._state import _DTYPES, _blob, _item, _tensor


def _jsonable(obj):
    """A scheduler's state dict as JSON can hold it (what it cannot, a function, becomes None)."""
    return json.loads(json.dumps(obj, default=lambda o: None))


def _like(saved, cur):
    """`saved` (read back from JSON) with the containers of `cur`: tuples where it had tuples
    (Adam's betas), its keys' order first."""
    if isinstance(cur, dict) and isinstance(saved, dict):
        out = {k: _like(saved[k], cur[k]) for k in cur if k in saved}
        out.update((k, v) for k, v in saved.items() if k not in out)
        return out
    if isinstance(cur, (tuple, list)) and isinstance(saved, list) and len(cur) == len(saved):
        return type(cur)(_like(a, b) for a, b in zip(saved, cur))
    return saved



class _Checkpoints:
    """Job's checkpoint methods (Job defines the state they read and write)."""

    @property
    def epoch(self):
        """The epoch of the current step (the data position, with `cursor`): job.epochs' own,
        else the steps over data_size // global_batch steps an epoch."""
        if self._mode == "epochs":
            return self._epoch_no
        per = self.data_size // self.global_batch if self.data_size else 0
        return self.step_no // per if per else 0

    @property
    def cursor(self):
        """Global samples of the current epoch consumed before the current step."""
        if self._mode == "epochs":
            return (self.step_no - self._epoch_start) * self.global_batch
        per = self.data_size // self.global_batch if self.data_size else 0
        return (self.step_no % per if per else self.step_no) * self.global_batch

    def _param_names(self):
        names = {id(p): n for n, p in self.module.named_parameters()}
        out = []
        for group in self.opt.param_groups:
            for p in group["params"]:
                out.append((names.get(id(p), f"param{len(out)}"), p))
        return out

    def _state_items(self):
        """The state dict as items: model.<key>, but a buffer that holds a NaN or an infinity (a
        causal mask of -inf) is buffer.<key>, outside the store's rule that the weights and the
        optimiser state be finite (buffers are the model's business; rk ckpt export leaves
        them out)."""
        items = []
        for k, v in self.module.state_dict(keep_vars=True).items():
            if not isinstance(v, torch.nn.Parameter) and v.is_floating_point() and not bool(torch.isfinite(v).all()):
                if k not in self._nf_buffers and k not in self._nf_told:
                    self._nf_told.add(k)
                    self._say(f"buffer '{k}' holds a NaN or an infinity (it was finite when the job started); "
                              f"saved as it is, as buffer.{k}")
                items.append(_item("buffer." + k, v.detach()))
            else:
                items.append(_item("model." + k, v.detach()))
        return items

    def _items(self, rngs):
        items = self._state_items()
        extra, order = {}, {}
        for pname, p in self._param_names():
            order[pname] = list(self.opt.state.get(p, {}))
            for k in sorted(self.opt.state.get(p, {})):
                v = self.opt.state[p][k]
                if torch.is_tensor(v):
                    items.append(_item(f"optim.{pname}.{k}", v))
                else:
                    extra.setdefault(pname, {})[k] = v
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.opt.param_groups]
        items.append(_blob("optim.param_groups", {"groups": groups, "extra": extra, "order": order}))
        if self.scheduler is not None:
            items.append(_blob("sched", _jsonable(self.scheduler.state_dict())))
        for r, rng in enumerate(rngs):  # rank 0's as rng.*, the others' as rng.*.rank<R>
            items += self._rng_items(rng, "" if r == 0 else f".rank{r}")
        for k, val in (("epoch", self.epoch), ("cursor", self.cursor), ("global_batch", self.global_batch),
                       ("size", self.data_size), ("accum", self.accum or 0)):
            items.append(_ckpt.Item("data." + k, "I64", (), struct.pack("<q", val)))
        items.append(_ckpt.Item("guard.losses", "F64", (len(self._losses),),
                                struct.pack(f"<{len(self._losses)}d", *self._losses)))
        return items

    @staticmethod
    def _rng_items(rng, suffix):
        items = [_item("rng.torch" + suffix, rng["torch"])]
        if "cuda" in rng:
            items.append(_item("rng.cuda" + suffix, rng["cuda"]))
        kind, keys, pos, has_gauss, cached = rng["numpy"]
        items.append(_blob("rng.numpy" + suffix, {"kind": kind, "keys": [int(k) for k in keys], "pos": int(pos),
                                                  "has_gauss": int(has_gauss), "cached": float(cached)}))
        version, state, gauss = rng["random"]
        items.append(_blob("rng.random" + suffix, {"version": version, "state": list(state), "gauss": gauss}))
        return items

    def _rank_rngs(self):
        """Every rank's RNG states, on rank 0 (one gather of a few KiB, at a checkpoint)."""
        mine = self._capture_rng()
        if not (self.distributed and self.world > 1):
            return [mine]
        mine = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in mine.items()}
        out = [None] * self.world
        self._collective(dist.all_gather_object, out, mine)
        return out

    def _ckpt_config(self):
        """The run's config as a checkpoint (and a snapshot) records it: JSON text."""
        config = dict(self.extra_config, model=self.name, framework="pytorch", global_batch=self.global_batch)
        return json.dumps(config, sort_keys=True)

    def _save(self):
        self._saved_step = self.step_no
        rngs = self._rank_rngs()
        if self.rank != 0:
            return
        if not self.w.alive():
            self._say("the supervisor is gone: no checkpoint written")
            return
        t = time.monotonic()
        try:
            _ckpt.save(self.ckpt_dir, self.step_no, self._items(rngs), epoch=self.epoch, cursor=self.cursor,
                       world_size=self.world, config=self._ckpt_config(), keep=self.keep)
        except _ckpt.StorageError as e:
            self._storage(f"{self.ckpt_dir}: cannot save the checkpoint of step {self.step_no}: {e}")
        except _ckpt.CheckpointError as e:  # the store's own rule (non-finite weights): the job's, no device's
            self._ckpt_refused(f"checkpoint of step {self.step_no} refused: {e}")
        self.w.ckpt(self.step_no, time.monotonic() - t)

    def _mismatch(self, ck):
        """What makes checkpoint `ck` another run's (None: none): the config's model, framework
        and global batch, the state dict's tensors, the data size, the parameter groups."""
        try:
            have = json.loads(ck.config).get("global_batch")
        except (ValueError, AttributeError):
            have = None
        if isinstance(have, int) and not isinstance(have, bool) and have != self.global_batch:
            if ck.world_size != self.world and have * self.world == self.global_batch * ck.world_size:
                return (f"{ck.path}: global batch {have} on {ck.world_size} ranks, this run's {self.global_batch} on "
                        f"{self.world}: global_batch changes with the number of ranks (computed from it, as micro-"
                        "batch x accumulation x world?); the global batch must be fixed: give the Job the same "
                        "global_batch on any number of ranks and split it over them (a share of global_batch // "
                        "world, rekindle.torch.batch_indices; or a micro-batch of global_batch // (world x "
                        "accumulation))")
            return (f"{ck.path}: global batch {have}, this run's {self.global_batch}: a resumed run keeps its "
                    "global batch")
        names = {k: ("buffer." + k if "buffer." + k in ck.items else "model." + k)
                 for k in self.module.state_dict()}
        expect = {"config": {"model": self.name, "framework": "pytorch", "global_batch": self.global_batch},
                  "items": {names[k]: (_DTYPES.get(v.dtype, str(v.dtype)), tuple(v.shape))
                            for k, v in self.module.state_dict().items()}}
        try:
            _ckpt.check(ck, expect)
        except _ckpt.CheckpointError as e:
            return str(e)
        it = ck.items.get("data.size")
        if it is not None and self.data_size:
            size = struct.unpack("<q", bytes(it.data))[0]
            if size and size != self.data_size:
                return f"{ck.path}: data size {size}, this run's is {self.data_size}"
        it = ck.items.get("optim.param_groups")
        if it is not None:
            n = len(json.loads(bytes(it.data).decode()).get("groups", []))
            if n != len(self.opt.param_groups):
                return f"{ck.path}: {n} parameter groups, this run's optimiser has {len(self.opt.param_groups)}"
        return None

    def _resume(self):
        path = None
        bad = None
        if self.rank == 0:
            try:
                ck, skipped = _ckpt.load_latest(self.ckpt_dir)
            except _ckpt.StorageError as e:
                self._storage(str(e))
            except _ckpt.CheckpointError as e:  # exists but cannot be read: not skipped
                self._storage(str(e))
            for s in skipped:
                self._say(f"resume skipped {s}")
            if ck is not None:
                path = ck.path
                bad = self._mismatch(ck)
        if self.distributed and self.world > 1:
            box = [path, bad]
            self._collective(dist.broadcast_object_list, box, 0)
            path, bad = box
            if bad is not None:
                ck = None
            ck = _ckpt.load(path) if path and self.rank != 0 else (ck if self.rank == 0 else None)
        if bad is not None:  # training from scratch over another run's checkpoints is no resume
            self._usage(f"cannot resume from another run's checkpoint: {bad}")
        if path is None:
            return
        try:
            self._apply(ck)
        except (KeyError, ValueError, RuntimeError) as e:
            self._usage(f"{path}: cannot resume this model from it: {e}")
        self.restored_from = "disk"
        self._say(f"resumed from {path} (step {ck.step}, epoch {ck.epoch}, cursor {ck.cursor}, "
                  f"written by {ck.world_size} ranks; now {self.world})")

    def _apply(self, ck):
        items = ck.items
        sd = self.module.state_dict()
        state = {}
        for k in sd:
            state[k] = _tensor(items["buffer." + k] if "buffer." + k in items else items["model." + k])
        self.module.load_state_dict(state)
        meta = json.loads(bytes(items["optim.param_groups"].data).decode())
        osd = self.opt.state_dict()
        new_state = {}
        for i, (pname, p) in enumerate(self._param_names()):
            pre = f"optim.{pname}."
            s = {n[len(pre):]: _tensor(it) for n, it in items.items()
                 if n.startswith(pre) and "." not in n[len(pre):]}
            s.update(meta["extra"].get(pname, {}))
            keys = meta.get("order", {}).get(pname)
            if keys and sorted(keys) == sorted(s):  # the optimiser's own key order
                s = {k: s[k] for k in keys}
            if s:
                new_state[i] = s
        groups = []
        for g, saved in zip(osd["param_groups"], meta["groups"]):
            groups.append(dict(_like(saved, {k: v for k, v in g.items() if k != "params"}), params=g["params"]))
        self.opt.load_state_dict({"state": new_state, "param_groups": groups})
        # this rank's own RNG states when the world size is the checkpoint's; on another world
        # size (or from a checkpoint without them) rank 0's on every rank
        suffix = f".rank{self.rank}" if self.rank > 0 and ck.world_size == self.world else ""
        if "rng.torch" + suffix not in items:
            suffix = ""
        rng = {"torch": _tensor(items["rng.torch" + suffix])}
        if "rng.cuda" + suffix in items and self.device.type == "cuda":
            rng["cuda"] = _tensor(items["rng.cuda" + suffix])
        n = json.loads(bytes(items["rng.numpy" + suffix].data).decode())
        rng["numpy"] = (n["kind"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached"])
        r = json.loads(bytes(items["rng.random" + suffix].data).decode())
        rng["random"] = (r["version"], tuple(r["state"]), r["gauss"])
        self._restore_rng(rng)
        if self.scheduler is not None and "sched" in items:
            saved = json.loads(bytes(items["sched"].data).decode())
            self.scheduler.load_state_dict(_like(saved, self.scheduler.state_dict()))
        if "guard.losses" in items:
            d = bytes(items["guard.losses"].data)
            self._losses = list(struct.unpack(f"<{len(d) // 8}d", d))
        self.step_no = self.start_step = self._saved_step = ck.step
        # job.epochs: the resumed epoch, the steps of it done before; the first pass over the
        # loader leaves them out and undoes the RNG draws of opening the loader
        self._epoch_no = ck.epoch
        self._skip_steps = ck.cursor // self.global_batch
        self._epoch_start = ck.step - self._skip_steps
        self._discard_rng = True
        if "data.accum" in items:
            self._resume_accum = struct.unpack("<q", bytes(items["data.accum"].data))[0]

