"""rekindle.torch's tensors as checkpoint items, and the state hashes."""

import json

import torch
import xxhash

from rekindle import ckpt as _ckpt

_DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
_TORCH = {v: k for k, v in _DTYPES.items()}
# dtypes whose tensors numpy() takes as they are (bfloat16 has no numpy type)
_NUMPY = frozenset((torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16,
                    torch.int8, torch.uint8, torch.bool))


def _raw(t):
    """The bytes of a tensor, C order, little-endian (as the checkpoint stores them): a view of
    the tensor's own memory when it is on the CPU and contiguous, not a copy. The callers (a
    disk checkpoint, a snapshot put, a hash) use them before the tensor can change. A copy of
    a 768 MiB state into fresh bytes was half of a snapshot put's time (bench/snap_scale.py)."""
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy()


def _item(name, t):
    return _ckpt.Item(name, _DTYPES[t.dtype], tuple(t.shape), _raw(t))


def _tensor(item):
    dtype = _TORCH.get(item.dtype)
    if dtype is None:
        raise ValueError(f"tensor '{item.name}': dtype {item.dtype} is not one torch reads here")
    shape = tuple(item.shape)
    if len(item.data) == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(item.data), dtype=dtype).reshape(shape).clone()


def _blob(name, obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    return _ckpt.Item(name, "U8", (len(data),), data)


def _hash_tensors(tensors):
    """xxh64 of the tensors' bytes one after the other: in place on the CPU, one transfer from
    a GPU."""
    if all(t.device.type == "cpu" for t in tensors):
        h = xxhash.xxh64()
        for t in tensors:
            if t.numel() == 0:
                continue
            if t.dtype in _NUMPY and t.is_contiguous():  # its bytes as they are: no view to make
                h.update((t.detach() if t.requires_grad else t).numpy())
            else:
                h.update(t.detach().reshape(-1).view(torch.uint8).numpy())
        return h.intdigest()
    parts = [t.detach().reshape(-1).view(torch.uint8) for t in tensors if t.numel() > 0]
    parts = [torch.cat(parts).cpu()] if parts else []
    h = xxhash.xxh64()
    for t in parts:
        h.update(t.numpy())
    return h.intdigest()


def params_hash(module):
    """xxh64 (hex) of every tensor of the module's state dict, in state_dict order."""
    h = xxhash.xxh64()
    for t in module.state_dict().values():
        h.update(_raw(t))
    return h.hexdigest()


def _optim_tensors(opt):
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            for k in sorted(opt.state.get(p, {})):
                v = opt.state[p][k]
                if torch.is_tensor(v):
                    out.append(v)
    return out


def state_hash(module, opt, buffers=True):
    """xxh64 (int) of the parameters and buffers (without them: buffers=False) and the
    optimiser's state tensors."""
    tensors = list(module.state_dict().values()) if buffers else list(module.parameters())
    return _hash_tensors(tensors + _optim_tensors(opt))
