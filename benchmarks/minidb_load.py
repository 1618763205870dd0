"""Loading a large minidb of parameters: time, and peak memory against the data size.

Writes a minidb of float32 parameters (about 1 GB by default, in Caffe2's default chunks of 1,000,000
elements, as `Save` writes them), then loads it with `rnn2jax.read_blobs` in a fresh subprocess that does
nothing else, and reports the load time and that process's peak RSS above its RSS before loading. A
reader that streams needs about one copy of the data (the arrays it returns); one that read the file
whole first would need two.

    python benchmarks/minidb_load.py [--gib 1.0] [--blobs 16] [--chunk-size N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

import rnn2jax

LOADER = r"""
import json, sys, time
import numpy as np
import rnn2jax
from rnn2jax.storage import read_blobs

def status(field):  # from /proc/self/status, in bytes; VmHWM is the peak RSS of this process image
    # (getrusage's ru_maxrss would carry over the parent's peak across fork and exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

def rss():
    return status("VmRSS")

before = rss()
start = time.perf_counter()
blobs = read_blobs(sys.argv[1])
seconds = time.perf_counter() - start
peak = status("VmHWM")
checksum = float(sum(float(np.float64(b.ravel()[-1])) for b in blobs.values()))
data = sum(b.nbytes for b in blobs.values())
print(json.dumps({"seconds": seconds, "before": before, "peak": peak, "data": data, "checksum": checksum}))
"""


class LazyParams(Mapping):
    """Parameters made one at a time as the writer asks, so writing needs no copy of the whole model."""

    def __init__(self, blobs: int, elements: int):
        self.names = [f"layer{i}/w" for i in range(blobs)]
        self.elements = elements

    def __getitem__(self, name: str) -> np.ndarray:
        index = self.names.index(name)
        return np.random.default_rng(index).standard_normal(self.elements, dtype=np.float32).reshape(-1, 1024)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def checksum(self) -> float:
        return float(sum(float(np.float64(self[n].ravel()[-1])) for n in self.names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="data size in GiB")
    parser.add_argument("--blobs", type=int, default=16)
    parser.add_argument("--chunk-size", type=int, default=None, help="elements per chunk (default Caffe2's 1e6)")
    parser.add_argument("--dir", default=None, help="where to write the DB (default: a temporary directory)")
    args = parser.parse_args()

    elements = int(args.gib * 2**30 / 4 / args.blobs) // 1024 * 1024
    params = LazyParams(args.blobs, elements)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = Path(folder) / "params.minidb"
        start = time.perf_counter()
        rnn2jax.write_blobs(path, params, chunk_size=args.chunk_size)
        write_seconds = time.perf_counter() - start
        size = path.stat().st_size
        answer = subprocess.run([sys.executable, "-c", LOADER, str(path)], capture_output=True, text=True, check=True)
        result = json.loads(answer.stdout)
    data, grown = result["data"], result["peak"] - result["before"]
    assert data == args.blobs * elements * 4
    assert result["checksum"] == params.checksum(), "the loaded values differ from the written ones"
    print(f"minidb: {args.blobs} float32 blobs, {data / 2**30:.3f} GiB of data, file {size / 2**30:.3f} GiB")
    print(f"write: {write_seconds:.2f} s ({size / 2**20 / write_seconds:.0f} MiB/s)")
    print(f"load:  {result['seconds']:.2f} s ({size / 2**20 / result['seconds']:.0f} MiB/s)")
    print(
        f"peak RSS of the loading process: {result['peak'] / 2**30:.3f} GiB; above its RSS before loading "
        f"({result['before'] / 2**20:.0f} MiB): {grown / 2**30:.3f} GiB = {grown / data:.3f}x the data"
    )


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
