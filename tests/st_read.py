#!/usr/bin/env python3
"""Read a safetensors file the way Python's `safetensors` package does, with the standard
library only, and print one line per tensor, in data order:

    name dtype shape sum

shape is written without spaces ("[2,3]", "[]" for a scalar); sum is the sum of all elements
as a float, printed with "%.9g" (BOOL counts true values). With --meta, "__metadata__" entries
follow as lines "meta key value". Exit status: 0 ok, 1 malformed file, 2 usage.

Usage: st_read.py FILE [--meta]
"""
import json
import struct
import sys

DTYPES = {  # name: (struct code, size); None = converted by hand
    "F64": ("d", 8), "F32": ("f", 4), "F16": ("e", 2), "BF16": (None, 2),
    "I64": ("q", 8), "I32": ("i", 4), "I16": ("h", 2), "I8": ("b", 1),
    "U64": ("Q", 8), "U32": ("I", 4), "U16": ("H", 2), "U8": ("B", 1), "BOOL": ("?", 1),
}
MAX_HEADER = 100_000_000


def fail(msg):
    print(f"st_read: {msg}", file=sys.stderr)
    sys.exit(1)


def values(dtype, raw):
    code, size = DTYPES[dtype]
    n = len(raw) // size
    if code is None:  # BF16: the top half of an F32
        widened = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
        return struct.unpack(f"<{n}f", widened)
    return struct.unpack(f"<{n}{code}", raw)


def main(argv):
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--meta"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    path = argv[1]
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < 8:
        fail(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        fail(f"{path}: bad header length {n}")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        fail(f"{path}: bad header: {e}")
    if not isinstance(header, dict):
        fail(f"{path}: header is not an object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        fail(f"{path}: __metadata__ is not a map of strings")
    body = data[8 + n:]
    tensors = []
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            fail(f"{path}: tensor {name}: needs dtype, shape and two data_offsets")
        if dtype not in DTYPES:
            fail(f"{path}: tensor {name}: unsupported dtype {dtype}")
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= begin <= end <= len(body) or end - begin != numel * DTYPES[dtype][1]:
            fail(f"{path}: tensor {name}: bad data_offsets {begin},{end}")
        tensors.append((begin, end, name, dtype, shape))
    tensors.sort()
    pos = 0
    for begin, end, name, _, _ in tensors:
        if begin != pos:
            fail(f"{path}: tensor {name}: overlap or hole at {begin}")
        pos = end
    if pos != len(body):
        fail(f"{path}: {len(body) - pos} trailing bytes")
    for begin, end, name, dtype, shape in tensors:
        total = float(sum(values(dtype, body[begin:end])))
        print(f"{name} {dtype} [{','.join(str(d) for d in shape)}] {total:.9g}")
    if len(argv) == 3:
        for k, v in meta.items():
            print(f"meta {k} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
