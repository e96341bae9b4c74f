"""The fleet lab's node dialects under lab/fleet/dialects (its README says what each is):
one ``Dialect`` per directory, filled in with the lab's values by lab/lib.sh's own
``fill_template`` (``lab_lib`` runs the lab's shell functions), for the unit tests (the
kube-scheduler manifests) and the integration tests (the real containerd of its
generation)."""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DIALECTS = REPO / "lab/fleet/dialects"
LAB_LIB = REPO / "lab/lib.sh"
# a dialect's placeholders (@NAME@, filled by lab/lib.sh's fill_template; the dialects'
# README names each); @BASE@ is the integration tests' own (a private node's root)
PLACEHOLDER = re.compile(r"@[A-Z_]+@")
TEMPLATES = ("config.toml", "conf.d/*.toml", "kube-scheduler.yaml")
CONFIG_DIR = "/etc/containerd"  # where config.toml, conf.d/ and the other files go
# the kube-scheduler configuration files a dialect's manifest names (file -> node path)
SCHEDULER_FILES = {
    "kubescheduler-config.yaml": "/etc/kubernetes/kubescheduler-config.yaml",
    "scheduler-config.yaml": "/etc/kubernetes/scheduler-config.yaml",
}


def lab_lib(script: str, *args: str) -> str:
    """The output of bash ``script`` (``args`` its "$@") run after sourcing lab/lib.sh:
    the lab's own functions and values, the one definition of each."""
    return subprocess.run(["bash", "-c", f'. "{LAB_LIB}" && {script}', "lab-lib", *args],
                          capture_output=True, text=True, check=True, timeout=120).stdout


@functools.lru_cache(maxsize=1)
def _filled() -> dict[Path, str]:
    """Every dialect's templates filled in with the lab's values by lab/lib.sh's
    ``fill_template`` (what lab/fleetctl writes on the nodes), in one bash run."""
    paths = sorted(p for d in DIALECTS.iterdir() if d.is_dir()
                   for pattern in TEMPLATES for p in d.glob(pattern))
    texts = lab_lib('for f; do fill_template "$f" || exit; printf "\\0"; done',
                    *map(str, paths)).split("\0")
    assert len(texts) == len(paths) + 1 and not texts[-1], texts[-1]
    return dict(zip(paths, texts[:-1], strict=True))


def render(path: Path) -> str:
    text = _filled()[path]
    left = set(PLACEHOLDER.findall(text)) - {"@BASE@"}
    assert not left, f"{path}: fill_template has no value for {sorted(left)}"
    return text


@dataclass(frozen=True)
class Dialect:
    name: str
    directory: Path

    @property
    def config(self) -> str:
        return render(self.directory / "config.toml")

    @property
    def generation(self) -> str:
        """The containerd that reads it: ``1.6`` (config version 2) or ``2.x`` (3)."""
        head = self.config.split("[", 1)[0]
        return "2.x" if "version = 3" in head else "1.6"

    @property
    def files(self) -> dict[str, str]:
        """Its other containerd files (drop-ins, cri-base.json): node path -> text."""
        found = {f"{CONFIG_DIR}/conf.d/{p.name}": render(p)
                 for p in sorted((self.directory / "conf.d").glob("*.toml"))}
        found.update({f"{CONFIG_DIR}/{p.name}": p.read_text()
                      for p in sorted(self.directory.glob("*.json"))})
        return found

    @property
    def scheduler(self) -> str:
        return render(self.directory / "kube-scheduler.yaml")

    @property
    def scheduler_files(self) -> dict[str, str]:
        """The scheduler configuration its manifest names: node path -> text."""
        return {path: (self.directory / name).read_text()
                for name, path in SCHEDULER_FILES.items() if (self.directory / name).exists()}


def dialects() -> list[Dialect]:
    return [Dialect(p.name, p) for p in sorted(DIALECTS.iterdir()) if p.is_dir()]
