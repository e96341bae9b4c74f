"""lab/versions.env, with the Kubernetes release chosen for this run.

The release is, first match wins: ``GPUK8S_KUBE_VERSION`` in the environment (what
``lab/up --kube`` sets), else the release the lab was brought up with (recorded by lab/up
in ``$GPUK8S_LAB_STATE/kube-version``; a lab started before that record existed: the
release in its recorded kube-apiserver command line), else versions.env's ``KUBE_VERSION``.
It must be one of ``KUBE_VERSIONS`` (``v`` optional: ``1.35.4`` is ``v1.35.4``);
``KUBE_FEATURE_GATES`` and ``KUBE_RUNTIME_CONFIG`` are then that release's
``KUBE_FEATURE_GATES_v1_<minor>`` and ``KUBE_RUNTIME_CONFIG_v1_<minor>``. For the commands that
act on the lab (``lab=True``, ``--lab``: lab/lib.sh, the e2e tier) a ``GPUK8S_KUBE_VERSION``
other than the lab's recorded release is refused: the lab changes release only through
lab/down and lab/up. Tearing a lab down (``teardown=True``, ``--teardown``: lab/down) must
work whatever its release: a recorded release versions.env no longer lists is then used with
a warning naming it (its programs stop what runs; its gate lists, if gone, are empty). The
one reader of versions.env: the shell scripts take
``python3 lab/versions.py --shell [--lab]`` (lab/versions.sh), the tests and benchmarks
``load()``.

Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

ENV_FILE = Path(__file__).resolve().parent / "versions.env"
OVERRIDE = "GPUK8S_KUBE_VERSION"
STATE_ENV = "GPUK8S_LAB_STATE"
DEFAULT_STATE = "/var/lib/gpuk8s-lab"
RECORD = "kube-version"  # $STATE/kube-version: the release lab/up brought the lab up with
# the release a lab started before the record existed runs: in its apiserver's command line
APISERVER_CMD = re.compile(r"/kube-(v1\.\d+\.\d+)/kube-apiserver\x00")


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


def normalise(release: str) -> str:
    """``1.35.4`` -> ``v1.35.4`` (the form versions.env and the build directories use)."""
    release = release.strip()
    return release if release.startswith("v") or not release else f"v{release}"


def state_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get(STATE_ENV) or DEFAULT_STATE)


def recorded(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(release, where it was read) of the lab in ``$GPUK8S_LAB_STATE``, or None (no lab, or
    one a user cannot read: the lab scripts resolve again as root, lab/lib.sh as_root):
    lab/up's record, else the release of the kube-apiserver an older lab/up started."""
    state = state_dir(environ)
    record = state / RECORD
    try:
        release = record.read_text().strip()
        if release:
            return release, str(record)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        pass
    cmd = state / "run" / "kube-apiserver.cmd"
    try:
        found = APISERVER_CMD.search(cmd.read_text(errors="replace"))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    return (found.group(1), str(cmd)) if found else None


def chosen(environ: Mapping[str, str]) -> bool:
    """Whether the release was chosen (``GPUK8S_KUBE_VERSION`` or a lab's record), not
    versions.env's default: then nothing but that release's programs may stand in."""
    return bool(environ.get(OVERRIDE)) or recorded(environ) is not None


def release_for(environ: Mapping[str, str], pinned: Mapping[str, str],
                lab: bool = False, teardown: bool = False) -> str:
    """The release this run uses (the module docstring's order), one of KUBE_VERSIONS;
    ``teardown``: the lab's recorded release also when it is not (warned on stderr)."""
    known = [v for v in pinned.get("KUBE_VERSIONS", pinned["KUBE_VERSION"]).split(",") if v]
    asked = environ.get(OVERRIDE, "")
    lab_release = recorded(environ)
    if asked:
        release, source = normalise(asked), f"{OVERRIDE}={asked!r}"
        if lab and lab_release and lab_release[0] != release:
            raise ValueError(
                f"{source}: the lab in {state_dir(environ)} runs {lab_release[0]} (from "
                f"{lab_release[1]}); unset {OVERRIDE} to use it, or change the lab's release "
                f"with lab/down, then lab/up --kube {release}")
    elif lab_release:
        release, source = lab_release[0], f"the lab's release {lab_release[0]!r} (from " \
            f"{lab_release[1]})"
    else:
        release, source = pinned["KUBE_VERSION"], f"KUBE_VERSION={pinned['KUBE_VERSION']!r}"
    if release not in known:
        unknown = f"{source}: not a release the lab knows; allowed: {', '.join(known)}"
        if not (teardown and lab_release and lab_release[0] == release):
            raise ValueError(unknown)
        print(f"lab/versions: warning: {unknown}; tearing the lab down anyway",
              file=sys.stderr)
    return release


def load(environ: Mapping[str, str] | None = None, path: Path = ENV_FILE,
         lab: bool = False, teardown: bool = False) -> dict[str, str]:
    """versions.env with KUBE_VERSION, KUBE_FEATURE_GATES and KUBE_RUNTIME_CONFIG resolved
    for the release this run uses (``release_for``; ``lab``: a command acting on the lab;
    ``teardown``: lab/down, which tolerates a recorded release versions.env no longer has)."""
    env = os.environ if environ is None else environ
    out = read(path)
    release = release_for(env, out, lab, teardown)
    out["KUBE_VERSION"] = release
    try:
        key = minor_key(release)
    except ValueError:
        if not teardown:
            raise
        key = ""
    for name in ("KUBE_FEATURE_GATES", "KUBE_RUNTIME_CONFIG"):
        value = out.get(f"{name}_{key}") if key else None
        if value is None:
            if not teardown:
                raise ValueError(f"{path}: {name}_{key} missing for {release}")
            value = ""  # nothing is started on the way down
        out[name] = value
    return out


def main(argv: list[str]) -> int:
    if argv[:1] != ["--shell"] or not set(argv[1:]) <= {"--lab", "--teardown"}:
        print("usage: versions.py --shell [--lab] [--teardown]   (prints the resolved versions "
              "as shell assignments; --lab: for a command acting on the lab; --teardown: "
              "lab/down, which accepts the lab's recorded release even when versions.env no "
              "longer lists it)", file=sys.stderr)
        return 2
    try:
        resolved = load(lab="--lab" in argv, teardown="--teardown" in argv)
    except ValueError as exc:
        print(f"lab/versions: {exc}", file=sys.stderr)
        return 2
    for key, value in resolved.items():
        print(f"{key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
