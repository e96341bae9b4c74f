# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Controller side of every gpuk8s module: run it, and explain an old host Python.

The gpuk8s modules (``library/``) and the code they ship (``src/gpuk8s/core``,
``discovery``, ``ansible``) need Python 3.8 or newer on the managed host. An older
interpreter never gets as far as our code: AnsiballZ's own wrapper (ansible-core 2.19
writes ``from __future__ import annotations`` into it) is compiled first, so the host
answers with a SyntaxError and Ansible reports "Module result deserialization failed".
A check inside the module cannot run at all, so the check lives here: after a failed
run whose output is not a module result, the interpreter that ran it is asked for its
version and, when it is older than 3.8, the failure says so and what to do.

Each module of ``library/`` has an action plugin of its own name that is this class
(``action_plugins/<module>.py``); successful runs cost nothing extra.
"""

from __future__ import annotations

import re
from typing import Any

from ansible.plugins.action.normal import ActionModule as _NormalAction

MIN_PYTHON = (3, 8)
_PROBE = "import sys; sys.stdout.write('%d.%d.%d' % tuple(sys.version_info[:3]))"


def interpreter_of(shebang: str | None) -> str | None:
    """``/usr/bin/python3.6`` from ``#!/usr/bin/python3.6`` (None without a shebang)."""
    if not shebang:
        return None
    return shebang[2:].strip() if shebang.startswith("#!") else shebang.strip()


def parse_version(text: str) -> tuple[int, ...] | None:
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return tuple(int(part) for part in match.groups()) if match else None


def too_old_message(module: str, interpreter: str, version: tuple[int, ...]) -> str:
    found = ".".join(str(part) for part in version)
    need = ".".join(str(part) for part in MIN_PYTHON)
    return (
        f"gpuk8s module {module} needs Python >= {need} on the managed host, but "
        f"{interpreter} is Python {found}. Set ansible_python_interpreter for this host to "
        f"a Python {need} or newer (Ubuntu 20.04: /usr/bin/python3 is 3.8; CentOS 8 / "
        f"RHEL 8: install python38 or python39 and use /usr/bin/python3.9)."
    )


def not_a_module_result(result: dict[str, Any]) -> bool:
    """True when the failure came from the interpreter, not from the module's code."""
    if not result.get("failed"):
        return False
    msg = str(result.get("msg", ""))
    return (
        "module_stderr" in result
        or "deserialization failed" in msg
        or "requires a minimum of Python" in msg
    )


class ActionModule(_NormalAction):  # type: ignore[misc]
    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        if not not_a_module_result(result):
            return result
        interpreter = interpreter_of(getattr(self, "_used_interpreter", None))
        if not interpreter:
            return result
        probe = self._low_level_execute_command(f"{interpreter} -c \"{_PROBE}\"")
        version = parse_version(probe.get("stdout", "")) if probe.get("rc") == 0 else None
        if version is not None and version[:2] < MIN_PYTHON:
            result["msg"] = too_old_message(self._task.action, interpreter, version)
            result["gpuk8s_host_python"] = ".".join(str(part) for part in version)
        return result
