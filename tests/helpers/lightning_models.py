"""A LightningModule that records the batches it sees (tests/test_compat_torch.py and
tests/helpers/lightning_ddp.py); imported only where Lightning is installed."""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch


class Recorder(L.LightningModule):
    """Trains a linear layer on (B, 3) batches (tensors, or fastload.Loader's arrays) and keeps
    ``seen``: ("train", epoch, first column) per training batch, ("val", global step, first
    column) per validation batch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.seen: list[tuple[str, int, list[int]]] = []

    def _rows(self, batch: Any) -> torch.Tensor:
        return torch.from_numpy(batch) if isinstance(batch, np.ndarray) else batch

    def training_step(self, batch: Any, i: int) -> torch.Tensor:
        x = self._rows(batch)
        self.seen.append(("train", self.current_epoch, x[:, 0].int().tolist()))
        return self.layer(x).sum()

    def validation_step(self, batch: Any, i: int) -> None:
        self.seen.append(("val", self.global_step, self._rows(batch)[:, 0].int().tolist()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)
