"""Build hook: compile the kubelet API protos while building (wheel, sdist install, -e).

Everything else about the package is declared in pyproject.toml. The generated
modules land in the build tree (wheels, ``pip install .``) or, for editable installs,
next to the sources in ``src/gpuk8s/services/node/api/`` (git-ignored).
"""

from __future__ import annotations

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS_PY = os.path.join(HERE, "src", "gpuk8s", "services", "node", "protos.py")
API_SUBDIR = os.path.join("gpuk8s", "services", "node", "api")


def _protos_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("_gpuk8s_protos", PROTOS_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        super().run()
        protos = _protos_module()
        if getattr(self, "editable_mode", False):
            out_dir = os.path.join(HERE, "src", API_SUBDIR)
        else:
            out_dir = os.path.join(self.build_lib, API_SUBDIR)
        protos.generate(out_dir)


setup(cmdclass={"build_py": BuildPyWithProtos})
