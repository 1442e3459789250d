"""Run by tests/test_compat_torch.py under ``torchrun --nproc_per_node N`` (gloo, CPU): each rank
prepares a fastload DataLoader and torch's with accelerate and writes, as JSON to
``<out>/rank<R>.json``, the sample indices of every batch of two epochs from each, and what
loaded fastload's (the inner loader's type and how many batches fastload's workers published).
"""

from __future__ import annotations

import json
import os
import sys

# tests/ first; not tests/helpers/ (the script's own directory, which Python puts first): its
# datasets.py would shadow Hugging Face's `datasets`, which accelerate imports when installed
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
sys.path.insert(0, os.path.dirname(_here))

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import DataLoaderConfiguration  # noqa: E402
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

from fastload.compat.torch import DataLoader  # noqa: E402
from helpers.compat import ArrayDS  # noqa: E402


def epochs(dl, n=2):
    dl_epochs = []
    for e in range(n):
        if hasattr(dl, "set_epoch"):
            dl.set_epoch(e)
        dl_epochs.append([b[:, 0].int().tolist() for b in dl])
    return dl_epochs


def main() -> None:
    out, split, n = sys.argv[1], sys.argv[2] == "split", int(sys.argv[3])
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=split))
    torch.manual_seed(0)
    dl = acc.prepare(DataLoader(ArrayDS(n), batch_size=4, num_workers=2, shuffle=True))
    got = epochs(dl)
    inner = dl.base_dataloader
    published = inner._loader.stats()["ring"]["published"] if inner._loader is not None else 0
    torch.manual_seed(0)
    ref = epochs(acc.prepare(TorchDataLoader(ArrayDS(n), batch_size=4, num_workers=2,
                                             shuffle=True)))
    inner.close()
    with open(os.path.join(out, f"rank{acc.process_index}.json"), "w") as f:
        json.dump({"got": got, "ref": ref, "inner": type(inner).__module__,
                   "published": published, "world": acc.num_processes}, f)


if __name__ == "__main__":
    main()
