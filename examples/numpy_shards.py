"""A NumPy-only pipeline over a folder of .npy shards.

The script first writes a small dataset to a temporary folder: ``--shards`` pairs of files
``images-00000.npy`` (uint8, N x 32 x 32 x 3) and ``labels-00000.npy`` (int64, N). The dataset
below maps a global sample index to (shard, row) and reads rows through memory maps, which each
worker opens lazily, on first use: an open memory map is never pickled or shared, and the
dataset object that is sent to the workers stays tiny.

Then it runs two shuffled epochs with two workers, checks that every sample arrives exactly once
per epoch, and prints the throughput.

    python examples/numpy_shards.py [--shards 8] [--per-shard 512] [--workers 2]
"""

from __future__ import annotations

import argparse
import bisect
import os
import tempfile
import time
from typing import Any

import numpy as np

import fastload


def write_shards(folder: str, shards: int, per_shard: int) -> None:
    """Shard s holds samples s * per_shard ... (s + 1) * per_shard - 1; label = global index."""
    rng = np.random.default_rng(0)
    for s in range(shards):
        images = rng.integers(0, 256, (per_shard, 32, 32, 3), dtype=np.uint8)
        labels = np.arange(s * per_shard, (s + 1) * per_shard, dtype=np.int64)
        np.save(os.path.join(folder, f"images-{s:05d}.npy"), images)
        np.save(os.path.join(folder, f"labels-{s:05d}.npy"), labels)


class NpyShards:
    """Samples ``{"image": uint8 (32, 32, 3), "label": int64}`` from a folder of shard pairs."""

    def __init__(self, folder: str) -> None:
        self.image_files = sorted(
            os.path.join(folder, f) for f in os.listdir(folder) if f.startswith("images-")
        )
        self.label_files = [f.replace("images-", "labels-") for f in self.image_files]
        # Shard lengths from the .npy headers (mmap_mode reads no data).
        sizes = [len(np.load(f, mmap_mode="r")) for f in self.label_files]
        self.starts = np.cumsum([0, *sizes]).tolist()  # shard s covers [starts[s], starts[s+1])
        self._open: dict[int, tuple[Any, Any]] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = {}  # memory maps are reopened in each worker, never pickled
        return state

    def _shard(self, s: int) -> tuple[Any, Any]:
        if s not in self._open:
            self._open[s] = (
                np.load(self.image_files[s], mmap_mode="r"),
                np.load(self.label_files[s], mmap_mode="r"),
            )
        return self._open[s]

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = bisect.bisect_right(self.starts, i) - 1
        images, labels = self._shard(s)
        row = i - self.starts[s]
        # np.asarray: a plain array view of the mapped row (fastload copies it into the batch).
        return {"image": np.asarray(images[row]), "label": int(labels[row])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="fastload-shards-") as folder:
        write_shards(folder, args.shards, args.per_shard)
        dataset = NpyShards(folder)
        n = len(dataset)
        print(f"{args.shards} shards, {n} samples in {folder}")
        with fastload.Loader(
            dataset, batch_size=args.batch_size, shuffle=True, seed=0, num_workers=args.workers
        ) as loader:
            for epoch in range(args.epochs):
                seen = np.zeros(n, dtype=np.int64)
                checksum = 0
                t0 = time.perf_counter()
                for batch in loader:
                    images, labels = batch["image"], batch["label"]
                    assert images.dtype == np.uint8 and images.shape[1:] == (32, 32, 3)
                    np.add.at(seen, labels, 1)
                    checksum += int(images[:, 0, 0, 0].sum())
                dt = time.perf_counter() - t0
                assert (seen == 1).all(), "every sample exactly once per epoch"
                print(f"epoch {epoch}: {n / dt:,.0f} samples/s, checksum {checksum}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
