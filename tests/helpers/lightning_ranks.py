"""Run by tests/test_resume.py: ``python lightning_ranks.py OUT MODE DEVICES``. Lightning's
Trainer on DEVICES CPU processes (strategy="ddp", gloo; Lightning starts the other ranks by
running this script again, with WORLD_SIZE and LOCAL_RANK but no RANK) trains on a
fastload.Loader(shard="auto") built in train_dataloader(). MODE "crash": a checkpoint after
step 3 (rank 0 saves the loader's state, as Lightning does), a crash at step 4; MODE "resume":
from that checkpoint, every rank loading rank 0's state. Each rank writes the sample indices of
its training batches to ``OUT/<MODE><DEVICES>-rank<R>.json``."""

from __future__ import annotations

import json
import os
import sys
import warnings

# this checkout's fastload and tests/ first (Lightning runs this file again for each other rank)
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import lightning as L  # noqa: E402

import fastload  # noqa: E402
from helpers.compat import ArrayDS  # noqa: E402
from helpers.lightning_models import Recorder  # noqa: E402

N, BATCH, CRASH_AT = 54, 4, 4


class Model(Recorder):
    def __init__(self, out: str, tag: str) -> None:
        super().__init__()
        self.out, self.tag = out, tag

    def train_dataloader(self) -> fastload.Loader:  # built once the ranks exist
        return fastload.Loader(ArrayDS(N), BATCH, shuffle=True, seed=5, shard="auto",
                               num_workers=0)

    def dump(self) -> None:
        with open(os.path.join(self.out, f"{self.tag}-rank{self.global_rank}.json"), "w") as f:
            json.dump({"seen": [rows for _, _, rows in self.seen],
                       "world": self.trainer.world_size}, f)


class Crash(L.Callback):
    def on_train_batch_end(self, trainer: L.Trainer, model: Model, *args: object) -> None:
        if trainer.global_step == CRASH_AT:
            model.dump()
            raise SystemExit(3)  # a simulated crash, after the checkpoint of step 3


def main() -> None:
    out, mode, devices = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model = Model(out, f"{mode}{devices}")
    callbacks: list[L.Callback] = []
    if mode == "crash":
        callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=out, every_n_train_steps=3,
                                                         save_top_k=-1), Crash()]
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp", max_epochs=1,
                        logger=False, enable_checkpointing=bool(callbacks), callbacks=callbacks,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, ckpt_path=os.path.join(out, "epoch=0-step=3.ckpt")
                    if mode == "resume" else None)
    model.dump()


if __name__ == "__main__":
    main()
