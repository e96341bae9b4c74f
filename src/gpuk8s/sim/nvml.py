"""Builds the simulated ``libnvidia-ml.so`` (``fake/nvml.c``) for NVIDIA presets.

The library is compiled on the machine with the system C compiler (``$CC``, else ``cc``
or ``gcc``) with the soname ``libnvidia-ml.so.1``, so NVML clients (``pynvml``) load it
the way they load the real one; the driver layout (``fake/nvidia_driver.py``) installs it
as ``libnvidia-ml.so.<driver version>`` with its soname link. Without a compiler a root
simply has no NVML library, like a node whose driver lacks it; ``build`` then says why.
One compile per process and source text.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

_BUILT: dict[str, bytes] = {}


def compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def build() -> tuple[bytes | None, str | None]:
    """(the library, None) or (None, why it could not be built)."""
    # a plain path: importlib.resources.files() is 3.9+ and host-Python tests run on 3.8
    with open(os.path.join(os.path.dirname(__file__), "fake", "nvml.c"), encoding="utf-8") as f:
        source = f.read()
    key = hashlib.sha256(source.encode()).hexdigest()
    if key in _BUILT:
        return _BUILT[key], None
    cc = compiler()
    if cc is None:
        return None, "no C compiler (cc/gcc): the simulated libnvidia-ml.so.1 was not built"
    with tempfile.TemporaryDirectory(prefix="gpuk8s-nvml-") as work:
        src = os.path.join(work, "nvml.c")
        with open(src, "w", encoding="utf-8") as handle:
            handle.write(source)
        out = os.path.join(work, "libnvidia-ml.so.1")
        # -Bsymbolic: the library's calls into itself (nvmlInit_v2 -> nvmlInitWithFlags)
        # stay inside it, even when another root's copy was loaded RTLD_GLOBAL earlier in
        # the same process (the exporter's pynvml): else that copy's state answers
        argv = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wl,-soname,libnvidia-ml.so.1",
                "-Wl,-Bsymbolic", "-o", out, src, "-ldl"]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return None, f"building the simulated libnvidia-ml.so.1 failed: {proc.stderr.strip()}"
        with open(out, "rb") as handle:
            _BUILT[key] = handle.read()
    return _BUILT[key], None
