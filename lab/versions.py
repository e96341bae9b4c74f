"""lab/versions.env, with the Kubernetes release chosen for this run.

``GPUK8S_KUBE_VERSION`` in the environment picks another release than the lab's
``KUBE_VERSION`` (one of ``KUBE_VERSIONS``); ``KUBE_FEATURE_GATES`` and
``KUBE_RUNTIME_CONFIG`` are then that release's ``KUBE_FEATURE_GATES_v1_<minor>`` and
``KUBE_RUNTIME_CONFIG_v1_<minor>``. The one reader of versions.env: the shell scripts take
``python3 lab/versions.py --shell`` (lab/versions.sh), the tests and benchmarks ``load()``.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

ENV_FILE = Path(__file__).resolve().parent / "versions.env"
OVERRIDE = "GPUK8S_KUBE_VERSION"


def minor_key(release: str) -> str:
    """``v1.37.2`` -> ``v1_37`` (the suffix of that minor's gate and runtime-config lists)."""
    parts = release.lstrip("v").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or parts[0] != "1":
        raise ValueError(f"Kubernetes release {release!r}: expected v1.<minor>.<patch>")
    return f"v1_{parts[1]}"


def read(path: Path = ENV_FILE) -> dict[str, str]:
    """The KEY=value lines of versions.env, as written (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def load(environ: Mapping[str, str] | None = None, path: Path = ENV_FILE) -> dict[str, str]:
    """versions.env with KUBE_VERSION, KUBE_FEATURE_GATES and KUBE_RUNTIME_CONFIG resolved
    for the release ``environ[GPUK8S_KUBE_VERSION]`` names (default: versions.env's)."""
    env = os.environ if environ is None else environ
    out = read(path)
    known = [v for v in out.get("KUBE_VERSIONS", out["KUBE_VERSION"]).split(",") if v]
    release = env.get(OVERRIDE) or out["KUBE_VERSION"]
    if release not in known:
        raise ValueError(f"{OVERRIDE}={release!r}: not a release the lab knows; "
                         f"allowed: {', '.join(known)}")
    key = minor_key(release)
    out["KUBE_VERSION"] = release
    for name in ("KUBE_FEATURE_GATES", "KUBE_RUNTIME_CONFIG"):
        if f"{name}_{key}" not in out:
            raise ValueError(f"{path}: {name}_{key} missing for {release}")
        out[name] = out[f"{name}_{key}"]
    return out


def main(argv: list[str]) -> int:
    if argv != ["--shell"]:
        print("usage: versions.py --shell   (prints the resolved versions as shell assignments)",
              file=sys.stderr)
        return 2
    try:
        resolved = load()
    except ValueError as exc:
        print(f"lab/versions: {exc}", file=sys.stderr)
        return 2
    for key, value in resolved.items():
        print(f"{key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
