"""Run in two spawned processes by tests/test_shard.py: a real gloo process group on localhost,
initialized with an explicit rank and no RANK/WORLD_SIZE in the environment (as Lightning and
``mp.spawn`` scripts do); each rank loads its shard with shard="auto"."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import fastload

N, BATCH = 103, 8


def gloo_rank(rank: int, port: int, out: Any) -> None:
    """Put (rank, indices, mask, len(loader), error raised on a contradicting RANK) on ``out``."""
    import torch.distributed as dist

    assert "RANK" not in os.environ and "WORLD_SIZE" not in os.environ
    dist.init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        idx: list[int] = []
        mask: list[bool] = []
        with fastload.Loader(np.arange(N), BATCH, shuffle=True, seed=5, shard="auto",
                             return_mask=True, num_workers=0) as loader:
            for b, m in loader:
                idx += b.tolist()
                mask += m.tolist()
            batches = len(loader)
        # the group says this rank; variables that say another are refused, naming both
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(1 - rank), "2"
        try:
            fastload.Loader(np.arange(N), BATCH, shard="auto", num_workers=0)
            refused = ""
        except ValueError as e:
            refused = str(e)
        out.put((rank, idx, mask, batches, refused))
        dist.barrier()
    finally:
        dist.destroy_process_group()
