"""Drop-in front ends for other data-loading APIs.

``fastload.compat.torch.DataLoader`` mirrors ``torch.utils.data.DataLoader``;
``fastload.compat.chainer.MultiprocessIterator`` mirrors Chainer 7.8.1's
``chainer.iterators.MultiprocessIterator``. Importing this package imports nothing else: torch
(chainer) is imported only when ``fastload.compat.torch`` (``fastload.compat.chainer``) is.
"""

from __future__ import annotations

__all__: list[str] = []
