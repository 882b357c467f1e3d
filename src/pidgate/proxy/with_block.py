"""The one shape of the objects pidgate uses as ``with thing:`` (the background proxy, the
``pidgate quotas`` client, the demo's embedded broker): the block's end ends the thing, whether
the block raised or not.

Owns: ``WithBlock``. Pure Python with no IO of its own: must not import any pidgate module, so
every room of the proxy and the demo can build on it.
"""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self

__all__ = ["WithBlock"]


class WithBlock(abc.ABC):
    """Usable as ``with thing:``. Entering gives the thing itself (a subclass that starts there
    overrides ``__enter__``); leaving the block calls ``_on_exit``, errors propagating."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._on_exit()

    @abc.abstractmethod
    def _on_exit(self) -> None:
        """What the end of the ``with`` block does: stop, close or clean up."""
