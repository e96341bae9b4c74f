"""The GPUs a node has had: a stable ``gpu`` label per GPU, and the GPUs that left.

Discovery numbers a node's GPUs in PCI order, so when one leaves the bus (hot-unplug, a
card that fell off the link) every GPU above it moves down by one, and a GPU whose
driver is unbound loses its UUID. Series keyed on those numbers would change identity:
the lost GPU's series vanish, its neighbours take its number, and an alert on it clears
by itself. So the exporter keeps a book of every GPU it has seen, in a small JSON file
on the host (``--state-file``; the chart mounts ``/var/lib/gpuk8s/exporter`` of the
host, under ``hostPaths.root``), where a restarted exporter finds it:

* a GPU is matched to its entry by UUID, else (when one side has no UUID: an unbound
  GPU, a tool that reports none) by PCI address; a card with another UUID in the same
  slot is another GPU;
* a GPU seen for the first time gets its discovery index as its ``gpu`` label when no
  other entry holds that number, else the lowest free number; the label never changes
  afterwards (nor the ``uuid`` label, which keeps the last UUID seen);
* an entry whose GPU is not on the bus is *lost*: it stays in the book, and in the
  metrics (``gpuk8s_gpu_lost 1``, ``gpuk8s_gpu_healthy 0``, its own labels), until the GPU
  comes back or an administrator removes it with ``gpuk8s exporter forget GPU`` (in
  the exporter's pod: ``kubectl exec``), which refuses GPUs that are on the bus.

The file is read and written under an exclusive ``flock`` on ``<file>.lock``, written
atomically (temp file, fsync, rename), and re-read at every sample, so a ``forget``
run by another process takes effect at the next sample. An unreadable file is moved
aside to ``<file>.corrupt`` (kept for the administrator) and written again from what
the exporter has seen since it started; a file removed by hand is written again too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...core.errors import GpuK8sError
from ...core.gpuusage import KINDS, PGPU
from ...core.model import Gpu
from ...host.files import HostFileError, write_json

STATE_VERSION = 1
STATE_DIR = "/var/lib/gpuk8s/exporter"
STATE_NAME = "gpus.json"


class StateError(GpuK8sError):
    """The state file cannot be read, written or changed as asked (names the path)."""


@dataclass(frozen=True)
class KnownGpu:
    """One GPU of the book."""

    label: int  # the ``gpu`` label, fixed at first sight
    pci_address: str
    uuid: str = ""  # the last UUID seen ("" while none was)
    product: str = ""
    vendor: str = ""
    kind: str = PGPU  # the kind it had when last seen on the bus
    lost_since: float | None = None  # unix time it was first missed; None: on the bus

    @property
    def lost(self) -> bool:
        return self.lost_since is not None

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.label, "pci": self.pci_address, "uuid": self.uuid,
                "product": self.product, "vendor": self.vendor, "kind": self.kind,
                "lostSince": self.lost_since}

    def names(self, ref: str) -> bool:
        """Whether ``ref`` (the ``gpu`` label, UUID or PCI address) names this GPU."""
        ref = ref.strip().lower()
        return ref in (str(self.label), self.pci_address.lower()) or (
            bool(self.uuid) and ref == self.uuid.lower())


def _entry(item: Any, where: str) -> KnownGpu:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: must be an object")
    label, pci, lost = item.get("gpu"), item.get("pci"), item.get("lostSince")
    if isinstance(label, bool) or not isinstance(label, int) or label < 0:
        raise ValueError(f"{where}.gpu: must be an integer >= 0, got {label!r}")
    if not isinstance(pci, str) or not pci:
        raise ValueError(f"{where}.pci: must be a PCI address, got {pci!r}")
    texts = {key: item.get(key, "") for key in ("uuid", "product", "vendor")}
    for key, text in texts.items():
        if not isinstance(text, str):
            raise ValueError(f"{where}.{key}: must be a string, got {text!r}")
    kind = item.get("kind", PGPU)
    if kind not in KINDS:
        raise ValueError(f"{where}.kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    if lost is not None and (isinstance(lost, bool) or not isinstance(lost, (int, float))):
        raise ValueError(f"{where}.lostSince: must be a unix time or null, got {lost!r}")
    return KnownGpu(label, pci.lower(), texts["uuid"], texts["product"], texts["vendor"], kind,
                    None if lost is None else float(lost))


def parse_state(text: str) -> list[KnownGpu]:
    """The entries of a state file's text; ``ValueError`` naming the field when bad."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise ValueError(f"must be an object with version {STATE_VERSION}")
    items = data.get("gpus")
    if not isinstance(items, list):
        raise ValueError("gpus: must be a list")
    entries = [_entry(item, f"gpus[{n}]") for n, item in enumerate(items)]
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        raise ValueError("gpus: two entries share a gpu number")
    return entries


def match(known: Sequence[KnownGpu], gpus: Sequence[Gpu]) -> dict[int, KnownGpu]:
    """Discovery index -> the entry of that GPU, for the GPUs of ``gpus`` that have one:
    by UUID first, then by PCI address where one side has no UUID."""
    found: dict[int, KnownGpu] = {}
    taken: set[int] = set()
    by_uuid = {e.uuid.lower(): e for e in known if e.uuid}
    for gpu in gpus:
        entry = by_uuid.get((gpu.uuid or "").lower()) if gpu.uuid else None
        if entry is not None:
            found[gpu.index] = entry
            taken.add(entry.label)
    for gpu in gpus:
        if gpu.index in found:
            continue
        for entry in known:
            if (entry.label not in taken and entry.pci_address == gpu.pci_address.lower()
                    and (not entry.uuid or not gpu.uuid)):
                found[gpu.index] = entry
                taken.add(entry.label)
                break
    return found


class KnownGpus:
    """The book, kept in ``path`` ("" or None: in memory only)."""

    def __init__(self, path: str | None, clock: Callable[[], float] = time.time) -> None:
        self.path = path or ""
        self.clock = clock
        self.entries: list[KnownGpu] = []
        self._unsaved = False  # the file lags behind the book (not written, or moved aside)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if not self.path:
            yield
            return
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            handle = open(self.path + ".lock", "a")  # noqa: SIM115 - held across the yield
        except OSError as err:
            raise StateError(f"{self.path}.lock: cannot open: {err.strerror or err}") from err
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _load(self) -> list[str]:
        """Re-read the file into ``entries``; problems (a moved-aside file) as text."""
        if not self.path:
            return []
        try:
            with open(self.path, encoding="utf-8") as handle:
                text = handle.read(4 * 1024 * 1024)
        except FileNotFoundError:  # first start; or removed by hand: written again
            self._unsaved = bool(self.entries)
            return []
        except OSError as err:
            raise StateError(f"{self.path}: cannot read: {err.strerror or err}") from err
        try:
            self.entries = parse_state(text)
            return []
        except ValueError as err:
            try:
                os.replace(self.path, self.path + ".corrupt")
            except OSError as move:
                raise StateError(f"{self.path}: unreadable ({err}) and cannot be moved "
                                 f"aside: {move.strerror or move}") from move
            self._unsaved = True
            return [f"{self.path}: unreadable ({err}); moved to {self.path}.corrupt, the "
                    "book goes on from what this exporter has seen since it started"]

    def _save(self) -> None:
        if not self.path:
            return
        data = {"version": STATE_VERSION,
                "gpus": [e.to_dict() for e in sorted(self.entries, key=lambda e: e.label)]}
        try:
            write_json(self.path, data)
        except HostFileError as err:
            raise StateError(str(err)) from err

    def load(self) -> list[KnownGpu]:
        with self._locked():
            self._load()
        return list(self.entries)

    def observe(self, gpus: Sequence[tuple[Gpu, str]], on_bus: Callable[[Gpu], bool]
                ) -> tuple[dict[int, KnownGpu], list[KnownGpu], list[str]]:
        """Record a sample's GPUs ((GPU, kind) of the discovered inventory): discovery
        index -> entry of each of them, the lost entries (those of GPUs off the bus that
        discovery still lists included), and problems. Never raises: when the file
        cannot be read or written the book goes on in memory and a problem says so."""
        problems: list[str] = []
        by_index: dict[int, KnownGpu] | None = None
        try:
            with self._locked():
                try:
                    problems.extend(self._load())
                except StateError as err:
                    problems.append(str(err))
                by_index, changed = self._record(gpus, on_bus)
                if changed or self._unsaved:
                    self._unsaved = True
                    self._save()
                    self._unsaved = False
        except StateError as err:  # the book goes on in memory, saved once the file works
            problems.append(str(err))
            if by_index is None:
                by_index, _ = self._record(gpus, on_bus)
                self._unsaved = True
        lost = [e for e in self.entries if e.lost]
        return by_index, lost, problems

    def _record(self, gpus: Sequence[tuple[Gpu, str]], on_bus: Callable[[Gpu], bool]
                ) -> tuple[dict[int, KnownGpu], bool]:
        before = list(self.entries)
        found = match(self.entries, [g for g, _ in gpus])
        now = self.clock()
        updated = {e.label: e for e in self.entries}
        by_index: dict[int, KnownGpu] = {}
        for gpu, kind in gpus:
            entry = found.get(gpu.index)
            if entry is None:
                used = set(updated)
                label = gpu.index if gpu.index not in used else min(
                    n for n in range(len(used) + 1) if n not in used)
                entry = KnownGpu(label, gpu.pci_address.lower())
            here = on_bus(gpu)
            entry = replace(
                entry, pci_address=gpu.pci_address.lower(),
                uuid=gpu.uuid or entry.uuid, product=gpu.product or entry.product,
                vendor=gpu.vendor or entry.vendor, kind=kind if here else entry.kind,
                lost_since=None if here else (entry.lost_since or now))
            updated[entry.label] = entry
            by_index[gpu.index] = entry
        seen = {e.label for e in by_index.values()}
        for entry in self.entries:
            if entry.label not in seen and not entry.lost:
                updated[entry.label] = replace(entry, lost_since=now)
        self.entries = sorted(updated.values(), key=lambda e: e.label)
        return by_index, self.entries != before

    def forget(self, refs: Sequence[str]) -> list[KnownGpu]:
        """Remove the lost GPUs named by ``refs`` (``gpu`` label, UUID or PCI address);
        nothing is removed when one of them names no entry or a GPU on the bus."""
        with self._locked():
            problems = self._load()
            if problems:
                raise StateError(problems[0])
            gone: list[KnownGpu] = []
            for ref in refs:
                hits = [e for e in self.entries if e.names(ref)]
                if not hits:
                    known = ", ".join(_describe(e) for e in self.entries) or "none"
                    raise StateError(f"{ref!r} names no GPU in {self.path or 'the book'} "
                                     f"(known: {known})")
                for entry in hits:
                    if not entry.lost:
                        raise StateError(f"{ref!r} is GPU {_describe(entry)}, which is on the "
                                         "bus; only lost GPUs can be forgotten")
                    if entry not in gone:
                        gone.append(entry)
            self.entries = [e for e in self.entries if e not in gone]
            self._save()
        return gone


def _describe(entry: KnownGpu) -> str:
    return f"{entry.label} ({entry.uuid or 'no uuid'}, {entry.pci_address})"


def render(entries: Sequence[KnownGpu]) -> str:
    lines = [f"{'GPU':>3}  {'PCI':<13} {'UUID':<42} {'KIND':<5} STATE"]
    for e in entries:
        state = "on the bus" if not e.lost else time.strftime(
            "lost since %Y-%m-%dT%H:%M:%SZ", time.gmtime(e.lost_since or 0))
        lines.append(f"{e.label:>3}  {e.pci_address:<13} {e.uuid or '-':<42} {e.kind:<5} {state}")
    return "\n".join(lines)


def cli_main(argv: Sequence[str]) -> int:
    """``gpuk8s exporter gpus|forget``: list the book, remove lost GPUs from it."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="gpuk8s exporter",
        description="gpu-exporter's book of GPUs (run it in the exporter's pod: kubectl exec)")
    sub = parser.add_subparsers(dest="action", required=True)
    default = os.path.join(STATE_DIR, STATE_NAME)
    p = sub.add_parser("gpus", help="every GPU the exporter has seen, lost ones included")
    p.add_argument("--state-file", default=default, help=f"the book (default {default})")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("forget", help="remove lost GPUs: their series and alerts end")
    p.add_argument("gpu", nargs="+", help="the gpu label, UUID or PCI address of a lost GPU")
    p.add_argument("--state-file", default=default, help=f"the book (default {default})")
    args = parser.parse_args(list(argv))
    if not os.path.isfile(args.state_file):
        raise StateError(f"--state-file: {args.state_file} does not exist (is this the "
                         "exporter's node, or its pod?)")
    book = KnownGpus(args.state_file)
    if args.action == "gpus":
        entries = book.load()
        print(json.dumps([e.to_dict() for e in entries], indent=2) if args.json
              else render(entries))
        return 0
    for entry in book.forget(args.gpu):
        print(f"forgot GPU {_describe(entry)}: its series end at the exporter's next sample")
    return 0
