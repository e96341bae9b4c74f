"""Crash-safe file operations on a host: atomic writes and journalled tree installs.

``install_tree`` copies a directory tree over a root file by file (each file through a
temp file + ``rename``), after backing up every file it will replace and writing a
journal that names what it created and replaced. ``rollback`` undoes it from the journal,
so a process that died half-way (or a later step that failed) leaves the host as it was;
``commit`` forgets the backup. The journal lives where a restarted process finds it.

The journal records paths relative to the root it installed onto, the backup's too when
it lies inside that root, so a process that sees the host's tree at another mount point
(``/host`` in a pod, ``/`` on the host) replays it exactly. A journal of the first format
(absolute ``root`` and ``backup``) is translated the same way, or refused with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import GpuK8sError


class HostFileError(GpuK8sError):
    """A file operation on the host failed; the message names the path."""


TEMP_MARK = ".tmp"  # atomic_write's temp file: .<name>.tmp<pid> beside <name>
JOURNAL_FORMAT = 2  # paths relative to the root; 1 (no "format"): absolute root and backup


def atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` in one rename (readers see old or new, never half)."""
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f"{temp_prefix(path)}{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as err:
        raise HostFileError(f"writing {path} failed: {err.strerror or err}") from err


def temp_prefix(path: str) -> str:
    """The name ``atomic_write`` gives its temp file of ``path``, less the pid:
    ``.<name>.tmp`` (a process killed mid-write leaves ``.<name>.tmp<pid>``)."""
    return f".{os.path.basename(path)}{TEMP_MARK}"


def atomic_symlink(target: str, path: str) -> None:
    """Make ``path`` a symlink to ``target`` in one rename (readers see the old link or the
    new one, never none). Raises ``OSError``."""
    tmp = f"{path}.gpuk8s-new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    """Decoded JSON of ``path``; None when it does not exist or is not valid JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_json(path: str, data: Any, mode: int = 0o644) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode)


def remove(path: str) -> bool:
    """Remove a file, symlink or tree; True when something was there."""
    try:
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)
        else:
            return False
    except OSError as err:
        raise HostFileError(f"removing {path} failed: {err.strerror or err}") from err
    return True


@dataclass
class TreeJournal:
    """What ``install_tree`` did: paths relative to the root it installed onto.
    ``backup``: relative to that root when it lies inside it, else absolute; ``root``: the
    root as the writer saw it (format 1 journals: needed to translate their paths)."""

    root: str
    backup: str
    created: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    made_dirs: list[str] = field(default_factory=list)
    format: int = JOURNAL_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "root": self.root, "backup": self.backup,
                "created": self.created, "replaced": self.replaced,
                "made_dirs": self.made_dirs}

    @classmethod
    def from_dict(cls, data: Any) -> TreeJournal | None:
        if not isinstance(data, dict) or not isinstance(data.get("root"), str):
            return None
        fmt = data.get("format", 1)
        return cls(data["root"], str(data.get("backup", "")),
                   [str(p) for p in data.get("created", [])],
                   [str(p) for p in data.get("replaced", [])],
                   [str(p) for p in data.get("made_dirs", [])],
                   fmt if isinstance(fmt, int) else 0)

    def backup_under(self, root: str, journal_path: str) -> str:
        """The backup directory as seen from ``root`` (where the caller sees the tree the
        journal describes). HostFileError when the journal cannot be replayed from there."""
        if self.format == JOURNAL_FORMAT:
            if not self.backup or os.path.isabs(self.backup):
                return self.backup
            return os.path.join(root, self.backup)
        if self.format != 1:
            raise HostFileError(f"{journal_path}: journal format {self.format!r} is not one "
                                f"this version reads (1, {JOURNAL_FORMAT}); nothing was "
                                "changed: finish it with the version that wrote it")
        if not os.path.isabs(self.root) or (self.backup and not os.path.isabs(self.backup)):
            raise HostFileError(f"{journal_path}: a format 1 journal with relative root "
                                f"{self.root!r} / backup {self.backup!r}; nothing was changed")
        if not self.backup:
            return ""
        inside = os.path.relpath(self.backup, self.root)
        if not inside.startswith(os.pardir):
            return os.path.join(root, inside)
        if os.path.realpath(self.root) == os.path.realpath(root):
            return self.backup
        raise HostFileError(
            f"{journal_path} was written for the tree at {self.root} with its backup at "
            f"{self.backup}, outside that tree: it cannot be replayed from {root}; run the "
            f"recovery where the tree is {self.root}, or restore the files named in the "
            "journal by hand; nothing was changed")


def _entries(source: str) -> tuple[list[str], list[str]]:
    """(dirs, files-and-symlinks) of a tree, relative, dirs parents first."""
    dirs: list[str] = []
    files: list[str] = []
    for current, subdirs, names in os.walk(source):
        rel = os.path.relpath(current, source)
        for name in sorted(subdirs):
            path = os.path.normpath(os.path.join(rel, name))
            if os.path.islink(os.path.join(source, path)):
                files.append(path)  # a symlink to a dir is copied as a link
            else:
                dirs.append(path)
        files.extend(os.path.normpath(os.path.join(rel, n)) for n in sorted(names))
        subdirs[:] = sorted(d for d in subdirs if not os.path.islink(os.path.join(current, d)))
    return dirs, files


def _temp_of(dest: str) -> str:
    """Where ``_copy_entry`` writes ``dest`` before renaming it into place."""
    return os.path.join(os.path.dirname(dest), f".{os.path.basename(dest)}.gpuk8s-new")


def _copy_entry(src: str, dest: str) -> None:
    tmp = _temp_of(dest)
    if os.path.lexists(tmp):
        os.unlink(tmp)
    if os.path.islink(src):
        os.symlink(os.readlink(src), tmp)
    else:
        shutil.copy2(src, tmp)
    os.replace(tmp, dest)


def install_tree(source: str, root: str, journal_path: str, backup_dir: str) -> TreeJournal:
    """Copy ``source`` over ``root``; back up what it replaces; journal every step.

    On any error the caller runs ``rollback(journal_path)``; the journal is written before
    the first file is replaced, so that also works after a crash.
    """
    dirs, files = _entries(source)
    inside = os.path.relpath(backup_dir, root)
    journal = TreeJournal(root, backup_dir if inside.startswith(os.pardir) else inside)
    try:
        for rel in dirs:
            target = os.path.join(root, rel)
            if os.path.lexists(target) and not os.path.isdir(target):
                raise HostFileError(f"{target} exists and is not a directory")
            if not os.path.lexists(target):
                journal.made_dirs.append(rel)
        for rel in files:
            target = os.path.join(root, rel)
            if os.path.isdir(target) and not os.path.islink(target):
                raise HostFileError(f"{target} is a directory; the payload has a file there")
            if os.path.lexists(target):
                saved = os.path.join(backup_dir, rel)
                os.makedirs(os.path.dirname(saved), exist_ok=True)
                if os.path.islink(target):
                    if os.path.lexists(saved):
                        os.unlink(saved)
                    os.symlink(os.readlink(target), saved)
                else:
                    shutil.copy2(target, saved)
                journal.replaced.append(rel)
            else:
                journal.created.append(rel)
        write_json(journal_path, journal.to_dict())
        for rel in dirs:
            os.makedirs(os.path.join(root, rel), exist_ok=True)
        for rel in files:
            _copy_entry(os.path.join(source, rel), os.path.join(root, rel))
    except OSError as err:
        raise HostFileError(
            f"copying {source} onto {root} failed: {err.strerror or err} "
            f"({getattr(err, 'filename', '') or ''})"
        ) from err
    return journal


def rollback(journal_path: str, root: str) -> TreeJournal | None:
    """Undo an ``install_tree`` onto ``root`` (the tree as this process sees it) from its
    journal (idempotent); None when there is none. Refuses (HostFileError, nothing
    changed) a journal that cannot be replayed from ``root`` or whose backup of a replaced
    file is gone."""
    journal = TreeJournal.from_dict(read_json(journal_path))
    if journal is None:
        return None
    backup = journal.backup_under(root, journal_path)
    missing = [rel for rel in journal.replaced
               if not backup or not os.path.lexists(os.path.join(backup, rel))]
    if missing:
        raise HostFileError(
            f"{journal_path}: the backup of {len(missing)} replaced file(s) is gone "
            f"({', '.join(missing[:3])} under {backup or 'no backup directory'}): they "
            "cannot be restored; nothing was changed, the journal is kept")
    try:
        for rel in journal.created + journal.replaced:  # a copy killed before its rename
            tmp = _temp_of(os.path.join(root, rel))
            if os.path.lexists(tmp):
                os.unlink(tmp)
        for rel in journal.created:
            path = os.path.join(root, rel)
            if os.path.lexists(path):
                os.unlink(path)
        for rel in journal.replaced:
            _copy_entry(os.path.join(backup, rel), os.path.join(root, rel))
        for rel in reversed(journal.made_dirs):
            path = os.path.join(root, rel)
            if os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)
    except OSError as err:
        raise HostFileError(f"rolling back {journal_path} failed: {err.strerror or err}") from err
    commit(journal_path, root)
    return journal


def commit(journal_path: str, root: str) -> None:
    """Forget the backup and the journal of a finished ``install_tree`` onto ``root``."""
    journal = TreeJournal.from_dict(read_json(journal_path))
    backup = journal.backup_under(root, journal_path) if journal is not None else ""
    if backup:
        remove(backup)
    if os.path.lexists(journal_path):
        remove(journal_path)
