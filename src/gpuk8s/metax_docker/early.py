"""The health check started first: ``run --gpus`` needs one run of mx-smi
(``--show-unavailable-reason``), the slowest step before docker; it starts in a thread as
soon as the command line asks for GPUs, and the rest of the wrapper (the CDI edits,
docker's questions) is imported while it runs.

Only discovery's tool finder is imported here; ``plan`` imports the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from ..discovery import metax
from ..discovery.tools import Runner, find_tool, runner_for

ENV_ROOT = "METAX_DOCKER_HOST_ROOT"
HEALTH_ARGS = ("--show-unavailable-reason",)  # what discovery.check_health asks mx-smi

T = TypeVar("T")


class Background(Generic[T]):
    """``fn()`` in a thread (the work is waiting on subprocesses); ``result()`` returns its
    value or raises its exception."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as err:  # handed to the caller of result()
            self._error = err

    def wait(self) -> None:
        """Until ``fn()`` has returned or raised."""
        self._thread.join()

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class EarlyHealth:
    """mx-smi's health answer under ``root``, asked at once. ``runner`` is a discovery
    runner: it hands that answer to the first call with the same argv (check_health's)
    and runs every other call as discovery's own runner would."""

    def __init__(self, root: str) -> None:
        self._base = runner_for(root)
        tool = find_tool(root, "mx-smi", metax.MXSMI_CANDIDATES)
        self.argv = [tool, *HEALTH_ARGS] if tool is not None else None
        self._answer: Background[tuple[int, str, str]] | None = None
        if self.argv is not None:
            argv = self.argv
            self._answer = Background(lambda: self._base(argv))

    def runner(self, argv: list[str]) -> tuple[int, str, str]:
        answer = self._answer
        if answer is not None and argv == self.argv:
            self._answer = None  # once: a second check asks again
            return answer.result()
        return self._base(argv)


def start_health(env: Mapping[str, str]) -> Runner | None:
    """The runner of an ``EarlyHealth`` for the host root of ``env``; None when the root is
    not a valid one (``plan.Host.from_env`` then says why)."""
    root = env.get(ENV_ROOT) or "/"
    if not root.startswith("/"):
        return None
    return EarlyHealth(root).runner
