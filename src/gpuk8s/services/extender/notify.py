"""Change callbacks of the extender's views of the cluster (nodes, rooms, running pods):
who caches something per node learns which node moved."""

from __future__ import annotations

from collections.abc import Callable

Touch = Callable[[str | None], None]  # a node that may have changed (None: any)


class Notifier:
    """Change callbacks: ``callback(name)`` after one node changed, ``callback(None)``
    after a relist (anything may have changed); ``changes`` moves after the callbacks
    ran, so whoever sees it moved has been told which node."""

    def __init__(self) -> None:
        self._listeners: list[Touch] = []
        self.changes = 0  # moves at every change

    def listen(self, callback: Touch) -> None:
        self._listeners.append(callback)

    def _notify(self, name: str | None) -> None:
        for callback in self._listeners:
            callback(name)
        self.changes += 1
