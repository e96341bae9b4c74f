"""The fleet lab's node dialects under lab/fleet/dialects (its README says what each is):
one ``Dialect`` per directory, rendered with the lab's values, for the unit tests (the
kube-scheduler manifests) and the integration tests (the real containerd of its
generation)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DIALECTS = Path(__file__).resolve().parents[1] / "lab/fleet/dialects"
# what lab/lib.sh gives the single-node lab (PAUSE_IMAGE, SCHEDULER_IMAGE)
VALUES = {
    "@SANDBOX_IMAGE@": "registry.k8s.io/pause:3.10-gpuk8s",
    "@IMAGE@": "registry.k8s.io/kube-scheduler:v1.35.4",
    "@FEATURE_GATES@": "DynamicResourceAllocation=true",
}
CONFIG_DIR = "/etc/containerd"  # where config.toml, conf.d/ and the other files go
# the kube-scheduler configuration files a dialect's manifest names (file -> node path)
SCHEDULER_FILES = {
    "kubescheduler-config.yaml": "/etc/kubernetes/kubescheduler-config.yaml",
    "scheduler-config.yaml": "/etc/kubernetes/scheduler-config.yaml",
}


def render(text: str) -> str:
    for placeholder, value in VALUES.items():
        text = text.replace(placeholder, value)
    assert "@" not in text.replace("@BASE@", ""), text  # every placeholder has a value
    return text


@dataclass(frozen=True)
class Dialect:
    name: str
    directory: Path

    @property
    def config(self) -> str:
        return render((self.directory / "config.toml").read_text())

    @property
    def generation(self) -> str:
        """The containerd that reads it: ``1.6`` (config version 2) or ``2.x`` (3)."""
        head = self.config.split("[", 1)[0]
        return "2.x" if "version = 3" in head else "1.6"

    @property
    def files(self) -> dict[str, str]:
        """Its other containerd files (drop-ins, cri-base.json): node path -> text."""
        found = {f"{CONFIG_DIR}/conf.d/{p.name}": render(p.read_text())
                 for p in sorted((self.directory / "conf.d").glob("*.toml"))}
        found.update({f"{CONFIG_DIR}/{p.name}": p.read_text()
                      for p in sorted(self.directory.glob("*.json"))})
        return found

    @property
    def scheduler(self) -> str:
        return render((self.directory / "kube-scheduler.yaml").read_text())

    @property
    def scheduler_files(self) -> dict[str, str]:
        """The scheduler configuration its manifest names: node path -> text."""
        return {path: (self.directory / name).read_text()
                for name, path in SCHEDULER_FILES.items() if (self.directory / name).exists()}


def dialects() -> list[Dialect]:
    return [Dialect(p.name, p) for p in sorted(DIALECTS.iterdir()) if p.is_dir()]
