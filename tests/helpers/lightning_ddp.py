"""Run by tests/test_compat_torch.py: ``python lightning_ddp.py OUT torch|fastload``. Trains a
tiny model with Lightning's Trainer on 2 CPU processes (strategy="ddp", gloo) and writes, per
rank, the sample indices of every training batch and the loader class that delivered them to
``OUT/<kind>-rank<R>.json``. Lightning starts the second rank by running this script again."""

from __future__ import annotations

import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

from fastload.compat.torch import DataLoader  # noqa: E402
from helpers.compat import ArrayDS  # noqa: E402
from helpers.lightning_models import Recorder  # noqa: E402


class Model(Recorder):
    """Also notes the type of the loader Lightning hands the training loop."""

    def __init__(self) -> None:
        super().__init__()
        self.loader_types: set[str] = set()

    def on_train_epoch_start(self) -> None:
        dl = self.trainer.train_dataloader
        self.loader_types.add(f"{type(dl).__module__}.{type(dl).__name__}")


def main() -> None:
    out, kind = sys.argv[1], sys.argv[2]
    make = DataLoader if kind == "fastload" else TorchDataLoader
    torch.manual_seed(0)
    dl = make(ArrayDS(40), batch_size=4, num_workers=2, shuffle=True)
    model = Model()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, train_dataloaders=dl)
    with open(os.path.join(out, f"{kind}-rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"seen": [rows for _, _, rows in model.seen],
                   "types": sorted(model.loader_types),
                   "world": trainer.world_size}, f)


if __name__ == "__main__":
    main()
