"""Run a module of ``library/`` in-process, the way AnsiballZ would (for tests).

On a host, AnsiballZ ships ``src/gpuk8s/...`` as ``ansible.module_utils.gpuk8s...``.
In a development checkout the package is importable as ``gpuk8s``, so
``alias_module_utils()`` makes ``ansible.module_utils.gpuk8s.X`` *the same module
object* as ``gpuk8s.X`` (one set of classes, so exceptions compare as expected).
``run_module()`` then feeds arguments through ansible-core's own
``patch_module_args`` and returns the result dict of ``exit_json`` / ``fail_json``.

Needs ansible-core (a dev dependency); never imported by the modules themselves.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

PREFIX = "ansible.module_utils.gpuk8s"
LIBRARY = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "library"))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Already executed under its real name."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != PREFIX and not fullname.startswith(PREFIX + "."):
            return None
        real = "gpuk8s" + fullname[len(PREFIX):]
        real_spec = importlib.util.find_spec(real)
        if real_spec is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(real), is_package=real_spec.submodule_search_locations
            is not None
        )


def alias_module_utils() -> None:
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


class ModuleExit(Exception):
    """Raised instead of exiting the interpreter; carries the module's result."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("msg", ""))
        self.result = result


def load_module(name: str, library: str = LIBRARY) -> ModuleType:
    """Import ``library/<name>.py`` as a fresh module object."""
    alias_module_utils()
    path = os.path.join(library, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"gpuk8s_library_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load module {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_module(
    name: str,
    args: dict[str, Any],
    *,
    check_mode: bool = False,
    diff: bool = False,
    library: str = LIBRARY,
) -> dict[str, Any]:
    """``main()`` of ``library/<name>.py`` with ``args``; the result, with ``failed``
    set when the module called ``fail_json``."""
    from unittest import mock

    from ansible.module_utils import basic  # type: ignore[import-untyped]
    from ansible.module_utils.testing import patch_module_args  # type: ignore[import-untyped]

    module = load_module(name, library)
    full = dict(args)
    full["_ansible_check_mode"] = check_mode
    full["_ansible_diff"] = diff

    def exit_json(_self: Any, **result: Any) -> None:
        result.setdefault("changed", False)
        raise ModuleExit(result)

    def fail_json(_self: Any, msg: str, **result: Any) -> None:
        result.update(failed=True, msg=msg)
        raise ModuleExit(result)

    with patch_module_args(full), mock.patch.object(
        basic.AnsibleModule, "exit_json", exit_json
    ), mock.patch.object(basic.AnsibleModule, "fail_json", fail_json):
        try:
            module.main()
        except ModuleExit as done:
            return done.result
    raise AssertionError(f"{name}.main() returned without exit_json/fail_json")
