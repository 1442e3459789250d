"""Run by torch.distributed.run in tests/test_shard.py: each rank loads its shard and the
indices are all-gathered over gloo; rank 0 prints them as JSON."""

import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]

import numpy as np  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fastload  # noqa: E402

if __name__ == "__main__":
    dist.init_process_group("gloo")
    data = np.arange(103, dtype=np.int64)
    out = []
    with fastload.Loader(data, 8, shuffle=True, seed=4, num_workers=1, shard="auto",
                         return_mask=True) as loader:
        for epoch in range(2):
            idx, mask = [], []
            for b, m in loader:
                idx += b.tolist()
                mask += m.tolist()
            out.append({"idx": idx, "mask": mask, "batches": len(loader)})
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": dist.get_rank(), "epochs": out})
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.destroy_process_group()
