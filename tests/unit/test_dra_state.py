"""gpu-dra's checkpoint across one release each way (``services.dra.state``): this version
reads what version 1 wrote and what the next version may write, and version 1's reader
reads what this version writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuk8s.services.dra import state
from gpuk8s.services.dra.grpcapi import PreparedDevice
from gpuk8s.services.dra.state import Checkpoint, PreparedClaim

DEVICE = {"requests": ["gpus"], "pool": "n1", "device": "gpu-3",
          "cdiDeviceIds": ["gpu.metax-tech.com/claim=u1-0-gpu-3"]}
CLAIM = {"namespace": "team", "name": "train", "devices": [DEVICE], "gpus": [3],
         "cdiSpec": "/var/run/cdi/gpu.metax-tech.com-claim_u1.json"}


def _write(directory: Path, body: dict[str, Any]) -> None:
    (directory / state.FILE_NAME).write_text(json.dumps(body))


def _read(directory: Path) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((directory / state.FILE_NAME).read_text())
    return body


def version1_reads(body: dict[str, Any]) -> dict[str, tuple[str, str, list[str], list[int]]]:
    """What gpu-dra version 1 (the first release) loads from a file: it wants format 1 and
    reads these keys, ignoring any other (its ``_load`` and ``from_json``, verbatim in
    effect); anything else it moves aside."""
    if body.get("format") != 1:
        raise ValueError(f"format {body.get('format')!r}, expected 1")
    return {uid: (str(c["namespace"]), str(c["name"]),
                  [str(d["device"]) for d in c["devices"]], [int(g) for g in c["gpus"]])
            for uid, c in body["claims"].items()}


def test_this_version_reads_version_1s_file(tmp_path: Path) -> None:
    """Backwards: a file exactly as version 1 wrote it (no ``version`` key)."""
    _write(tmp_path, {"format": 1, "claims": {"u1": CLAIM}})
    got = Checkpoint(str(tmp_path)).get("u1")
    assert got is not None and got.devices[0].device == "gpu-3" and got.gpus == (3,)
    assert not (tmp_path / "checkpoint.json.corrupt").exists()


def test_version_1_reads_what_this_version_writes(tmp_path: Path) -> None:
    """A rollback to version 1 keeps every prepared claim."""
    point = Checkpoint(str(tmp_path))
    point.put("u1", PreparedClaim.from_json(dict(CLAIM)))
    body = _read(tmp_path)
    assert (body["format"], body["version"]) == (1, state.VERSION)
    assert version1_reads(body) == {"u1": ("team", "train", ["gpu-3"], [3])}


def test_this_version_reads_the_next_versions_file_and_keeps_its_keys(tmp_path: Path) -> None:
    """Forwards: the next version adds keys (to the file and to a claim); this one reads
    the claims, and writes the claim's new keys back, so a rollback then an upgrade loses
    nothing."""
    newer = dict(CLAIM, preparedAt="2026-12-07T10:00:00Z", driverState={"x": 1})
    _write(tmp_path, {"format": 1, "version": state.VERSION + 1, "checksum": 7,
                      "claims": {"u1": newer}})
    point = Checkpoint(str(tmp_path))
    assert point.get("u1") is not None
    point.put("u2", PreparedClaim("team", "other", (PreparedDevice(
        ("gpus",), "n1", "gpu-4", ("gpu.metax-tech.com/claim=u2-0-gpu-4",)),), (4,), "/x"))
    kept = _read(tmp_path)["claims"]["u1"]
    assert kept["preparedAt"] == "2026-12-07T10:00:00Z" and kept["driverState"] == {"x": 1}
    assert Checkpoint(str(tmp_path)).claims().keys() == {"u1", "u2"}


def test_a_format_this_version_does_not_know_is_moved_aside(tmp_path: Path) -> None:
    """Two releases ahead (a new format) or not a format at all: moved aside, never
    deleted, and the plugin starts empty."""
    for form in (2, "1", None, True):
        text = json.dumps({"format": form, "version": 3, "claims": {"u1": CLAIM}})
        (tmp_path / state.FILE_NAME).write_text(text)
        assert Checkpoint(str(tmp_path)).claims() == {}, form
        assert (tmp_path / "checkpoint.json.corrupt").read_text() == text
        assert not (tmp_path / state.FILE_NAME).exists()


def test_claims_name_their_gpus_by_stable_id_and_a_restart_after_a_loss_finds_them(
    tmp_path: Path,
) -> None:
    """Version 3 records each claim's GPUs by UUID (else PCI address) beside the indexes;
    a plugin restarted after GPU 3 left the bus (discovery renumbers the GPUs above it)
    counts the claim on the card it holds, not on the card renumbered into its place. A
    claim of versions 1 and 2 (no ids) is read by its indexes as written."""
    from gpuk8s import sim
    from gpuk8s.core.dra import PoolOptions
    from gpuk8s.discovery import discover
    from gpuk8s.services.dra.driver import Driver
    from gpuk8s.services.node.devices import DeviceSet

    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    before = discover(root)
    card = before.gpu(5).uuid
    assert card is not None
    point = Checkpoint(str(tmp_path))
    point.put("u1", PreparedClaim.from_json(dict(CLAIM, gpus=[5], ids=[card])))
    assert _read(tmp_path)["claims"]["u1"]["ids"] == [card]
    assert version1_reads(_read(tmp_path))["u1"][3] == [5]  # a rollback still reads it
    point.put("old", PreparedClaim.from_json(dict(CLAIM, gpus=[6])))  # no ids: version 2
    assert "ids" not in _read(tmp_path)["claims"]["old"]

    def busy() -> set[int]:
        inventory = discover(root)
        driver = Driver(DeviceSet(inventory, "metax-tech.com/gpu"), PoolOptions(), "n1",
                        claims=None,  # type: ignore[arg-type]  # never asked here
                        checkpoint=Checkpoint(str(tmp_path)), cdi_dir=str(tmp_path / "cdi"))
        return driver.busy_gpus()

    assert busy() == {5, 6}
    sim.fail(root, 3, "remove")
    assert discover(root).gpu(4).uuid == card  # renumbered
    assert busy() == {4, 6}  # the claim's card is GPU 4 now; the old claim as written
    sim.heal(root, 3)
    assert busy() == {5, 6}


def test_a_claim_of_the_release_before_stable_names_finds_its_cards_by_id() -> None:
    """A version-3 claim names its devices by index (``gpu-5``) with the cards' ids
    beside the indexes: the index in such a name is mapped to the card's index now; a
    claim without ids (versions 1-2) keeps its indexes; a card off the bus is left out."""
    old = PreparedClaim.from_json(dict(CLAIM, gpus=[5, 6], ids=["GPU-a", "GPU-b"]))
    assert old.indexes_of([5], {"GPU-a": 4, "GPU-b": 5}) == (4,)
    assert old.indexes_of([6, 5], {"GPU-a": 4, "GPU-b": 5}) == (5, 4)
    assert old.indexes_of([5], {"GPU-b": 5}) == ()
    assert PreparedClaim.from_json(dict(CLAIM, gpus=[5])).indexes_of([5], {"GPU-a": 4}) == (5,)
