"""Write rekindle checkpoints as docs/checkpoint.md describes, with the standard library only
(an implementation independent of the C one, so tests check the C reader against the doc).

usage: ckpt_mk.py DIR STEP [--config JSON] [--latest] [--tiny] [--nan TENSOR:INDEX]
         write DIR/ckpt-<STEP>.safetensors (an mlp's tensors, optimiser state, an RNG blob);
         --nan puts a NaN at that element of that tensor, checksums computed over it; prints
         the xxh64 of the model tensors (as `rk train --metrics-json` reports weights_xxh64)
       ckpt_mk.py --set FILE TENSOR INDEX VALUE
         set one F32 element of a checkpoint written by anyone (VALUE: a float, nan, inf,
         -inf) and seal it again: that tensor's checksum and the manifest recomputed"""
import json, random, struct, sys
P1, P2, P3 = 11400714785074694791, 14029467366897019727, 1609587929392839161
P4, P5, M = 9650029242287828579, 2870177450012600261, (1 << 64) - 1
def rotl(x, r): return ((x << r) | (x >> (64 - r))) & M
def rnd(acc, v): return (rotl((acc + v * P2) & M, 31) * P1) & M
def xxh64(d):
    n, i = len(d), 0
    if n >= 32:
        v = [(P1 + P2) & M, P2, 0, (-P1) & M]
        lanes = struct.unpack_from("<%dQ" % (n // 32 * 4), d)
        for j in range(0, len(lanes), 4):
            v = [rnd(v[k], lanes[j + k]) for k in range(4)]
        i = n // 32 * 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M
        for x in v: h = ((h ^ rnd(0, x)) * P1 + P4) & M
    else:
        h = P5
    h = (h + n) & M
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", d, i)[0]), 27) * P1 + P4) & M; i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (struct.unpack_from("<I", d, i)[0] * P1 & M), 23) * P2 + P3) & M; i += 4
    while i < n:
        h = (rotl(h ^ (d[i] * P5 & M), 11) * P1) & M; i += 1
    h ^= h >> 33; h = (h * P2) & M; h ^= h >> 29; h = (h * P3) & M; h ^= h >> 32
    return h

def manifest(meta, tensors):
    """xxh64.__manifest__ over the metadata (sorted by key bytes) and the tensor table."""
    text = b""
    for k in sorted(meta, key=lambda k: k.encode()):
        if k != "xxh64.__manifest__":
            text += k.encode() + b"\0" + meta[k].encode() + b"\0"
    for name, dt, shape, begin, end in tensors:
        text += b"\0".join(x.encode() for x in
                           [name, dt, ",".join(map(str, shape)), str(begin), str(end)]) + b"\0"
    return "%016x" % xxh64(text)

def write(path, meta, table, data):
    hdr = json.dumps({"__metadata__": meta, **table}, separators=(",", ":")).encode()
    hdr += b" " * (-len(hdr) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr + data)

def set_element(path, tensor, index, value):
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b)[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__")
    data = bytearray(b[8 + n:])
    begin, end = h[tensor]["data_offsets"]
    assert h[tensor]["dtype"] == "F32" and begin + 4 * index + 4 <= end, (tensor, index)
    struct.pack_into("<f", data, begin + 4 * index, value)
    meta["xxh64." + tensor] = "%016x" % xxh64(bytes(data[begin:end]))
    order = sorted(h, key=lambda k: h[k]["data_offsets"][0])
    meta["xxh64.__manifest__"] = manifest(
        meta, [(k, h[k]["dtype"], h[k]["shape"], *h[k]["data_offsets"]) for k in order])
    write(path, meta, h, bytes(data))

if sys.argv[1:2] == ["--set"]:
    _, path, tensor, index, value = sys.argv[1:]
    set_element(path, tensor, int(index), float(value))
    sys.exit(0)

args = sys.argv[1:]
d, step = args[0], int(args[1])
config = args[args.index("--config") + 1] if "--config" in args else '{"model":"mlp","batch":64}'
mlp = [("fc1.weight", [256, 784]), ("fc1.bias", [256]), ("fc2.weight", [128, 256]),
       ("fc2.bias", [128]), ("fc3.weight", [10, 128]), ("fc3.bias", [10])]
if "--tiny" in args: mlp = [("fc.weight", [2, 3]), ("fc.bias", [2])]
nan = args[args.index("--nan") + 1].split(":") if "--nan" in args else None
r = random.Random(step)
tensors = []
for name, shape in mlp:
    n = 1
    for s in shape: n *= s
    v = [r.uniform(-0.05, 0.05) for _ in range(n)]
    if nan and nan[0] == "model." + name: v[int(nan[1])] = float("nan")
    tensors.append(("model." + name, "F32", shape, struct.pack("<%df" % n, *v)))
tensors.append(("optim.momentum", "F32", [4], struct.pack("<4f", 1, 2, 3, step)))
tensors.append(("rng.state", "U8", [13], bytes((step + k) & 255 for k in range(13))))
meta = {"format": "rekindle-ckpt-1", "step": str(step), "epoch": str(step // 100),
        "cursor": str(step * 64 % 60000), "world_size": "3", "config": config}
for name, _, _, data in tensors: meta["xxh64." + name] = "%016x" % xxh64(data)
off, table, rows = 0, {}, []
for name, dt, shape, data in tensors:
    table[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
    rows.append((name, dt, shape, off, off + len(data)))
    off += len(data)
meta["xxh64.__manifest__"] = manifest(meta, rows)
name = "ckpt-%012d.safetensors" % step
write(f"{d}/{name}", meta, table, b"".join(t[3] for t in tensors))
if "--latest" in args:
    open(f"{d}/latest", "w").write(name + "\n")
# weights_xxh64 of the model tensors, as `rk train --metrics-json` reports it (docs/weights.md)
print("%016x" % xxh64(b"".join(t[3] for t in tensors if t[0].startswith("model."))))
