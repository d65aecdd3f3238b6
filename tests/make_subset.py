#!/usr/bin/env python3
"""Write the first N training and M test images of a Fashion-MNIST directory as raw
(uncompressed) IDX files into OUT, for fast integration tests. Standard library only.

usage: make_subset.py SRC_DIR OUT_DIR N_TRAIN N_TEST
"""
import gzip
import os
import struct
import sys


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return dims, data[4 + 4 * ndim:]


def write_idx(path, dims, payload):
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, len(dims)]))
        f.write(struct.pack(">" + "I" * len(dims), *dims))
        f.write(payload)


def find(src, name):
    for cand in (name + ".gz", name):
        p = os.path.join(src, cand)
        if os.path.exists(p):
            return p
    sys.exit(f"make_subset: {name} not found in {src}")


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    src, out, n_train, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.makedirs(out, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        dims, pix = read_idx(find(src, f"{prefix}-images-idx3-ubyte"))
        per = dims[1] * dims[2]
        write_idx(os.path.join(out, f"{prefix}-images-idx3-ubyte"), (n, dims[1], dims[2]),
                  pix[: n * per])
        _, lab = read_idx(find(src, f"{prefix}-labels-idx1-ubyte"))
        write_idx(os.path.join(out, f"{prefix}-labels-idx1-ubyte"), (n,), lab[:n])


if __name__ == "__main__":
    main()
