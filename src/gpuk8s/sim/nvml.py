"""Builds the simulated ``libnvidia-ml.so.1`` (``fake/nvml.c``) into a simulated root.

The library is compiled on the machine with the system C compiler (``$CC``, else ``cc``
or ``gcc``) and given the soname ``libnvidia-ml.so.1``, so NVML clients (``pynvml``)
load it the way they load the real one. Without a compiler the root simply has no NVML
library, like a node whose driver lacks it; ``install`` then returns a reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from . import tree


def compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def install(root: str) -> str | None:
    """Compile the library into ``<root>/usr/lib/x86_64-linux-gnu``; None when done,
    else why not."""
    cc = compiler()
    if cc is None:
        return "no C compiler (cc/gcc): the simulated libnvidia-ml.so.1 was not built"
    # a plain path: importlib.resources.files() is 3.9+ and host-Python tests run on 3.8
    with open(os.path.join(os.path.dirname(__file__), "fake", "nvml.c"), encoding="utf-8") as f:
        source = f.read()
    target = os.path.join(root, tree.NVML_LIB_PATH)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuk8s-nvml-") as work:
        src = os.path.join(work, "nvml.c")
        with open(src, "w", encoding="utf-8") as handle:
            handle.write(source)
        out = os.path.join(work, "libnvidia-ml.so.1")
        argv = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wl,-soname,libnvidia-ml.so.1",
                "-o", out, src, "-ldl"]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return f"building the simulated libnvidia-ml.so.1 failed: {proc.stderr.strip()}"
        shutil.copyfile(out, target + ".tmp")
        os.chmod(target + ".tmp", 0o755)
        os.replace(target + ".tmp", target)
    return None
