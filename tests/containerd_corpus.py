"""The corpus of containerd configs under tests/data/containerd (its README says what each
is): one ``Case`` per directory, and one per node dialect of the fleet lab
(lab/fleet/dialects, rendered with the lab's values: ``fleet-<dialect>``), for the unit tests
(the editor) and the integration tests (the real containerd of its generation)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.fleet_dialects import dialects

CORPUS = Path(__file__).resolve().parent / "data/containerd"
DROP_INS = "/etc/containerd/conf.d"  # where each case's conf.d lies on the node
# what container-runtime does with each fleet dialect (see tests/data/containerd/README.md)
FLEET_EXPECT = {"containerd2": "drop-in", "k3s-rke2": "edit", "kubeadm": "edit",
                "kubespray": "edit"}


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    drop_ins: dict[str, str]  # node path -> text
    refusal: str | None  # None: edited; else words of the reason
    drop_in: bool  # edited by a drop-in of ours (containerd 2.x imports), not in the file

    @property
    def generation(self) -> str:
        """The containerd that reads it: ``1.6`` (versions 1, 2) or ``2.x`` (3, 4)."""
        head = self.text.split("[", 1)[0]
        return "2.x" if "version = 3" in head or "version = 4" in head else "1.6"


def cases() -> list[Case]:
    found = []
    for directory in sorted(p for p in CORPUS.iterdir() if p.is_dir()):
        expect = (directory / "expect").read_text().strip()
        assert expect in ("edit", "drop-in") or expect.startswith("refuse "), (directory,
                                                                             expect)
        drop_ins = {f"{DROP_INS}/{p.name}": p.read_text()
                    for p in sorted((directory / "conf.d").glob("*.toml"))}
        found.append(Case(directory.name, (directory / "config.toml").read_text(), drop_ins,
                          expect[len("refuse "):] if expect.startswith("refuse ") else None,
                          expect == "drop-in"))
    for dialect in dialects():
        found.append(Case(f"fleet-{dialect.name}", dialect.config,
                          {path: text for path, text in dialect.files.items()
                           if path.startswith(DROP_INS + "/")},
                          None, FLEET_EXPECT[dialect.name] == "drop-in"))
    return found
