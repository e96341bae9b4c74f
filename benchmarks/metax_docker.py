"""metax-docker benchmark: what `metax-docker run` costs over a plain `docker run`.

On a simulated C500 x8 host (``gpuk8s sim create --preset c500-8``, real char device
nodes) and a real dockerd of its own (Debian ``docker.io``, started here with
``--bridge=none --iptables=false`` and its own data root, exec root, pid file and socket:
tests/dockerd.py), with a tiny image imported from a busybox-static root file system (no
pull), it times in the same run, round after round, each of:

- ``docker run --rm --network none IMAGE true`` (the baseline);
- ``metax-docker run --rm --network none --gpus all IMAGE true`` (and ``--gpus 2``,
  ``--gpus [SERIAL]``), the zipapp as the ``.run`` installer installs it;
- ``docker ps`` and ``metax-docker ps`` (a command that only passes through).

and prints mean and range side by side, with the difference of the means (the target:
``metax-docker run`` at most 0.5 s over ``docker run``). One extra ``metax-docker run`` of
an image it has never seen comes first and is shown apart: it creates and removes the probe
container that looks for the image's own /opt/maca (the answer is then kept per image id).

The simulator's mx-smi is a Python script (``#!/usr/bin/env python3``); it runs with this
interpreter's directory first on PATH, as the tests run it. Its own cost (one
``--show-unavailable-reason``) is shown as a row too: a real host's mx-smi is a native
program with a cost of its own. Needs root, docker.io and busybox-static
(``scripts/prereqs integration``).

    python benchmarks/metax_docker.py [--rounds 10] [--python /usr/bin/python3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "src"))

from gpuk8s import sim  # noqa: E402
from tests.dockerd import DOCKER, busybox_rootfs, missing, private_dockerd  # noqa: E402

VERSION = "0.0.0-bench"
IMAGE = "metax-docker-bench/plain:1"
TARGET_S = 0.5


def timed(argv: Sequence[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return took


def install(work: Path, python: str) -> str:
    """metax-docker_VERSION.tar built and unpacked as the manual does, installed with the
    host's installer into a prefix under ``work``."""
    out = subprocess.run([sys.executable, os.path.join(REPO, "package/metax_docker.py"),
                          VERSION, "--out", str(work), "--arch", os.uname().machine],
                         capture_output=True, text=True, check=True).stdout.strip()
    (work / "x").mkdir()
    subprocess.run(["tar", "-C", str(work / "x"), "-xf", out], check=True)
    run_file = work / "x" / f"metax-docker_{VERSION}.{os.uname().machine}.run"
    subprocess.run([str(run_file), "install", "--prefix", str(work / "prefix"), "--python",
                    python], capture_output=True, check=True)
    return str(work / "prefix/bin/metax-docker")


def row(label: str, times: Sequence[float], base: Sequence[float] | None = None) -> str:
    mean = statistics.mean(times)
    text = (f"{label:<44} mean {mean:6.3f} s  range {min(times):6.3f} .. {max(times):6.3f} s"
            f"  (n={len(times)})")
    if base is not None:
        over = mean - statistics.mean(base)
        verdict = "within" if over <= TARGET_S else "OVER"
        text += f"  +{over:5.3f} s over docker ({verdict} the {TARGET_S} s target)"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--python", default="/usr/bin/python3" if os.access(
        "/usr/bin/python3", os.X_OK) else sys.executable,
        help="the interpreter the installed metax-docker runs with (default: the system's)")
    args = parser.parse_args(argv)
    why = missing()
    if why:
        raise SystemExit(f"cannot benchmark: {why}")
    with tempfile.TemporaryDirectory(prefix="mdbench") as tmp, private_dockerd() as daemon:
        work = Path(tmp)
        root = work / "node"
        sim.create(str(root), "c500-8", device_nodes="char")
        serial = sim.state(str(root))["gpus"][5]["serial"]
        program = install(work, args.python)
        daemon.import_image(IMAGE, busybox_rootfs())
        env = {**daemon.env, "METAX_DOCKER_DOCKER": DOCKER, "METAX_DOCKER_HOST_ROOT": str(root),
               "METAX_DOCKER_CACHE_DIR": str(work / "cache"),
               "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
        run = ["run", "--rm", "--network", "none"]
        cases = {
            "docker run": [DOCKER, *run, IMAGE, "true"],
            "metax-docker run --gpus all": [program, *run, "--gpus", "all", IMAGE, "true"],
            "metax-docker run --gpus 2": [program, *run, "--gpus", "2", IMAGE, "true"],
            f"metax-docker run --gpus [{serial}]": [program, *run, "--gpus", f"[{serial}]",
                                                    IMAGE, "true"],
            "docker ps": [DOCKER, "ps", "-q"],
            "metax-docker ps": [program, "ps", "-q"],
            "mx-smi --show-unavailable-reason (sim)": [
                str(root / "opt/mxdriver/bin/mx-smi"), "--show-unavailable-reason"],
        }
        first = timed(cases["metax-docker run --gpus all"], env)  # probes the new image
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, command in cases.items():  # interleaved: load changes hit all alike
                times[name].append(timed(command, env))
        base = times["docker run"]
        print(f"metax-docker vs docker on a simulated c500-8, {args.rounds} rounds, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
              f"python {args.python}")
        print(row("docker run (baseline)", base))
        for name in ("metax-docker run --gpus all", "metax-docker run --gpus 2",
                     f"metax-docker run --gpus [{serial}]"):
            print(row(name, times[name], base))
        print(row("metax-docker run --gpus all, image never seen", [first], base))
        print(row("docker ps (baseline)", times["docker ps"]))
        print(row("metax-docker ps (passes through)", times["metax-docker ps"],
                  times["docker ps"]).replace("over docker", "over docker ps"))
        print(row("mx-smi --show-unavailable-reason (sim)",
                  times["mx-smi --show-unavailable-reason (sim)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
