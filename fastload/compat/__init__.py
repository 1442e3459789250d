"""Drop-in front ends for other data-loading APIs.

``fastload.compat.torch.DataLoader`` mirrors ``torch.utils.data.DataLoader``. Importing this
package imports nothing else: torch is imported only when ``fastload.compat.torch`` is.
"""

from __future__ import annotations

__all__: list[str] = []
