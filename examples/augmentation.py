"""Data augmentation with per-sample random numbers.

Inside ``__getitem__``, ``fastload.sample_rng()`` returns a NumPy Generator seeded from
``(seed, epoch, index)``: the loader's seed, the epoch the sample is being loaded for, and the
sample's index. It is the generator ``np.random.default_rng((seed, epoch, index))`` (this script
checks that). The augmented batches then depend only on the seed, never on which worker loaded
which sample or when: the same run gives the same batches with 0, 1 or 8 workers, under any start
method, and each epoch sees a fresh augmentation of every image.

Why not compute ``np.random.default_rng((seed, epoch, index))`` yourself, with the epoch in a
``multiprocessing.Value`` that the main loop sets before each epoch? Because fastload's workers
run ahead: while your loop consumes the last batches of epoch e, they already load the first
batches of epoch e + 1, and would read the old epoch number. ``sample_rng()`` gets the epoch
from the task itself. (A per-worker generator seeded in ``worker_init`` is not reproducible
either: a sample's random numbers would depend on which worker loaded it.)

    python examples/augmentation.py [--epochs 3] [--workers 2]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import fastload


def augment(img: Any, rng: np.random.Generator) -> Any:
    """Random horizontal flip, random shift by up to 2 pixels, brightness jitter."""
    if rng.random() < 0.5:
        img = img[:, ::-1]
    dy, dx = rng.integers(-2, 3, size=2)
    img = np.roll(img, (int(dy), int(dx)), axis=(0, 1))
    gain = rng.uniform(0.8, 1.2)
    return np.clip(img.astype(np.float32) * gain, 0, 255).astype(np.uint8)


class AugmentedImages:
    """Image i is a 16 x 16 RGB gradient tinted by i, randomly augmented."""

    def __len__(self) -> int:
        return 512

    def image(self, i: int) -> Any:
        ramp = np.linspace(0, 200, 16, dtype=np.float32)
        img = np.stack(np.broadcast_arrays(ramp[:, None], ramp[None, :], np.float32(i % 50)), -1)
        return img.astype(np.uint8)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return augment(self.image(i), fastload.sample_rng()), i


def run(epochs: int, workers: int, seed: int) -> list[list[tuple[Any, Any]]]:
    """Every batch of ``epochs`` shuffled epochs, as (images, indices) copies, per epoch."""
    out: list[list[tuple[Any, Any]]] = []
    with fastload.Loader(
        AugmentedImages(), batch_size=64, shuffle=True, seed=seed, num_workers=workers
    ) as loader:
        for _ in range(epochs):
            # ... a training step would use the batches here; copies are kept for the checks ...
            out.append([(images.copy(), indices.copy()) for images, indices in loader])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    seed = args.seed

    with_workers = run(args.epochs, args.workers, seed)
    in_process = run(args.epochs, 0, seed)

    # 1. Reproducible: the same batches with workers as in-process.
    for epoch_a, epoch_b in zip(with_workers, in_process):
        for (a, ia), (b, ib) in zip(epoch_a, epoch_b):
            assert (ia == ib).all() and (a == b).all()
    # 2. Each sample's augmentation is np.random.default_rng((seed, epoch, index)).
    data = AugmentedImages()
    for epoch, batches in enumerate(with_workers):
        images, indices = batches[0]
        for img, i in zip(images, indices.tolist()):
            expected = augment(data.image(i), np.random.default_rng((seed, epoch, i)))
            assert (img == expected).all()
    # 3. Every epoch augments image 0 afresh.
    def image0(epoch: int) -> Any:
        for images, indices in with_workers[epoch]:
            if (indices == 0).any():
                return images[np.flatnonzero(indices == 0)[0]]
        raise AssertionError("image 0 missing")

    changed = [bool((image0(e) != image0(e - 1)).any()) for e in range(1, args.epochs)]
    print(f"{args.epochs} epochs x {len(data)} images: identical with {args.workers} workers and "
          f"in-process; image 0 re-augmented in later epochs: {changed}")
    assert all(changed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
