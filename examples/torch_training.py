"""A tiny PyTorch training loop fed by fastload.

The dataset makes 2-D points from two Gaussian blobs (label 0 or 1); a small MLP learns to
separate them. fastload's workers produce NumPy batches in shared memory; ``torch.from_numpy``
wraps them without a copy (the tensor keeps the batch alive), and ``.to(device)`` moves them.

Without PyTorch installed the script says so and exits 0.

    python examples/torch_training.py [--epochs 3] [--workers 2]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import fastload


class Blobs:
    """Sample i: a point drawn around (+2, +2) or (-2, -2), and its blob as the label."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, int]:
        rng = np.random.default_rng(i)
        label = i % 2
        center = 2.0 if label else -2.0
        point = (center + rng.standard_normal(2)).astype(np.float32)
        return point, label


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4096)
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("PyTorch is not installed (pip install torch): skipping this example")
        return 0

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the workers are processes; keep the trainer from oversubscribing
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()

    with fastload.Loader(
        Blobs(args.samples), batch_size=64, shuffle=True, seed=0, num_workers=args.workers
    ) as loader:
        for epoch in range(args.epochs):
            total, correct, loss_sum = 0, 0, 0.0
            for points, labels in loader:
                x = torch.from_numpy(points).to(device, non_blocking=True)
                y = torch.from_numpy(labels).to(device, non_blocking=True)
                logits = model(x)
                loss = loss_fn(logits, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                loss_sum += loss.item() * len(y)
                correct += int((logits.argmax(1) == y).sum())
                total += len(y)
            print(f"epoch {epoch}: loss {loss_sum / total:.4f}, accuracy {correct / total:.3f}")
    assert correct / total > 0.95, "the blobs are easy to separate"
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
