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

and prints, per command, the median and range of its wall time and of its CPU time (user +
system of the command and every process it waited for: the docker client, mx-smi; not the
daemon's), and for each ``metax-docker`` row the median and range of what it adds, round by
round, over the plain docker command of the same round (the target: ``metax-docker run``
at most 0.15 s median over ``docker run``). The machine's load average is printed with
it. One extra ``metax-docker run`` of an image it has never seen comes first and is shown
apart: it creates and removes the probe container that looks for the image's own
/opt/maca (the answer is then kept per image id).

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
import resource
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
TARGET_S = 0.15


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``argv``."""
    cpu = children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return took, children_cpu() - cpu


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


Sample = tuple[float, float]  # (wall s, CPU s)


def spread(values: Sequence[float]) -> str:
    return (f"median {statistics.median(values):6.3f} s "
            f"[{min(values):6.3f} .. {max(values):6.3f}]")


def row(label: str, samples: Sequence[Sample], base: Sequence[Sample] | None = None,
        target: float | None = None) -> str:
    """One command: wall and CPU time; with ``base`` (the plain docker command's samples of
    the same rounds), what it adds round by round, judged against ``target``."""
    text = (f"{label:<40} wall {spread([w for w, _ in samples])}  "
            f"cpu {spread([c for _, c in samples])}  (n={len(samples)})")
    if base is not None:
        wall = [w - b for (w, _), (b, _) in zip(samples, base, strict=True)]
        cpu = [c - b for (_, c), (_, b) in zip(samples, base, strict=True)]
        text += f"\n{'':<40} added: wall {spread(wall)}  cpu {spread(cpu)}"
        if target is not None:
            verdict = "within" if statistics.median(wall) <= target else "OVER"
            text += f"  ({verdict} the +{target} s median target)"
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
        samples: dict[str, list[Sample]] = {name: [] for name in cases}
        load_before = os.getloadavg()
        for _ in range(args.rounds):
            for name, command in cases.items():  # interleaved: load changes hit all alike
                samples[name].append(timed(command, env))
        load = [max(a, b) for a, b in zip(load_before, os.getloadavg(), strict=True)]
        base = samples["docker run"]
        version = daemon.docker("version", "--format", "{{.Server.Version}}").stdout.strip()
        print(f"metax-docker vs docker on a simulated c500-8 and a real dockerd "
              f"(docker {version}), {args.rounds} rounds, {os.cpu_count()} CPUs, "
              f"load average (1/5/15 min, the higher of start and end) "
              f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, python {args.python}")
        print(row("docker run (baseline)", base))
        for name in ("metax-docker run --gpus all", "metax-docker run --gpus 2",
                     f"metax-docker run --gpus [{serial}]"):
            print(row(name, samples[name], base, TARGET_S))
        print(row("metax-docker run --gpus all, new image", [first], base[:1]))
        print(row("docker ps (baseline)", samples["docker ps"]))
        print(row("metax-docker ps (passes through)", samples["metax-docker ps"],
                  samples["docker ps"]))
        print(row("mx-smi --show-unavailable-reason (sim)",
                  samples["mx-smi --show-unavailable-reason (sim)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
