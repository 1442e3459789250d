"""Run by torch.distributed.run in tests/test_stream.py: each rank iterates a ShardedStream
of uneven shards with shard="auto"; results are all-gathered over gloo and rank 0 prints
them as JSON. argv: mode ("full", "stop" after 3 batches saving each rank's state, or
"resume" from the states), the folder for states."""

import json
import os
import sys

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import torch.distributed as dist  # noqa: E402

import fastload  # noqa: E402
from helpers.streams import Counted  # noqa: E402

SIZES = [1, 7, 100, 33, 0]

if __name__ == "__main__":
    mode, folder = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    got, mask = [], []
    with fastload.Loader(Counted(SIZES), 8, shuffle=True, seed=11, num_workers=2,
                         shard="auto", return_mask=True, shuffle_buffer=16) as loader:
        if mode == "resume":  # a rank of the new run takes the state of the old rank it is
            with open(os.path.join(folder, f"state{min(rank, 1)}.json")) as f:
                loader.load_state_dict(json.load(f))
        n = 0
        for b, m in loader:
            got += b.tolist()
            mask += m.tolist()
            n += 1
            if mode == "stop" and n == 3:
                with open(os.path.join(folder, f"state{rank}.json"), "w") as f:
                    json.dump(loader.state_dict(), f)
                break
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "got": got, "mask": mask, "batches": n})
    if rank == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.destroy_process_group()
