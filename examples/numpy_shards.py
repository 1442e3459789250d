"""A NumPy-only pipeline over a folder of .npy shards, with ``fastload.NpyShards``.

The script first writes a small dataset to a temporary folder: ``--shards`` pairs of files
``images-00000.npy`` (uint8, N x 32 x 32 x 3) and ``labels-00000.npy`` (int64, N). Then
``fastload.NpyShards(image_files, labels=label_files)`` reads them as one stream of
``(image, label)`` samples: it checks every file's dtype and row shape from its header, the
workers memory-map the files themselves (nothing is pickled but the paths), and a batch's rows
are copied from the maps into shared memory in C, with no Python call per sample.

Then it runs two shuffled epochs with two workers (shards in a new order each epoch, rows
shuffled within windows of ``--shuffle-buffer``), checks that every sample arrives exactly once
per epoch, and prints the throughput.

    python examples/numpy_shards.py [--shards 8] [--per-shard 512] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import fastload


def write_shards(folder: str, shards: int, per_shard: int) -> tuple[list[str], list[str]]:
    """Shard s holds samples s * per_shard ... (s + 1) * per_shard - 1; label = global index.
    Returns the image files and the label files, in shard order."""
    rng = np.random.default_rng(0)
    images, labels = [], []
    for s in range(shards):
        images.append(os.path.join(folder, f"images-{s:05d}.npy"))
        labels.append(os.path.join(folder, f"labels-{s:05d}.npy"))
        np.save(images[-1], rng.integers(0, 256, (per_shard, 32, 32, 3), dtype=np.uint8))
        np.save(labels[-1], np.arange(s * per_shard, (s + 1) * per_shard, dtype=np.int64))
    return images, labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--shuffle-buffer", type=int, default=256)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="fastload-shards-") as folder:
        image_files, label_files = write_shards(folder, args.shards, args.per_shard)
        dataset = fastload.NpyShards(image_files, labels=label_files)
        n = sum(dataset.lengths)
        print(f"{args.shards} shards, {n} samples in {folder}")
        with fastload.Loader(
            dataset, batch_size=args.batch_size, shuffle=True, seed=0,
            shuffle_buffer=args.shuffle_buffer, num_workers=args.workers,
        ) as loader:
            for epoch in range(args.epochs):
                seen = np.zeros(n, dtype=np.int64)
                checksum = 0
                t0 = time.perf_counter()
                for images, labels in loader:
                    assert images.dtype == np.uint8 and images.shape[1:] == (32, 32, 3)
                    np.add.at(seen, labels, 1)
                    checksum += int(images[:, 0, 0, 0].sum())
                dt = time.perf_counter() - t0
                assert (seen == 1).all(), "every sample exactly once per epoch"
                print(f"epoch {epoch}: {n / dt:,.0f} samples/s, checksum {checksum}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
