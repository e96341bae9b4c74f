"""gpu-label on simulated hosts: readiness files, reconcile, the loop, --once/--dry-run.

The node's labels live in ``LabelStore``, an in-memory stand-in for the API server
with its resourceVersion precondition (409 on a stale write); the same code runs
against a real kube-apiserver in tests/integration/test_labeller_apiserver.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from gpuk8s import sim
from gpuk8s.core.labels import PREFIX
from gpuk8s.discovery import discover
from gpuk8s.host.readiness import read_readiness
from gpuk8s.services.kube import PermanentApiError, TemporaryApiError
from gpuk8s.services.labeller.loop import Backoff, LabellerLoop
from gpuk8s.services.labeller.main import main
from gpuk8s.services.labeller.reconcile import (
    MAINTENANCE_ANNOTATION,
    format_diff,
    reconcile,
    wanted_labels,
)

OTHER = {"kubernetes.io/hostname": "gpu-1", "example.com/team": "ml",
         "metax-tech.com-other/x": "kept"}


class LabelStore:
    """Labels of nodes with a resourceVersion, like the apiserver's merge patch."""

    def __init__(self, nodes: Mapping[str, Mapping[str, str]]) -> None:
        self.labels = {n: dict(v) for n, v in nodes.items()}
        self.node_annotations: dict[str, dict[str, str]] = {}
        self.version = dict.fromkeys(nodes, 1)
        self.reads = 0
        self.patches: list[dict[str, str | None]] = []
        self.before_patch: Callable[[], None] | None = None
        self.fail_reads: list[Exception] = []

    def annotations(self, node: str) -> Mapping[str, str]:
        return self.node_annotations.get(node, {})

    def read(self, node: str) -> tuple[dict[str, str], str | None]:
        self.reads += 1
        if self.fail_reads:
            raise self.fail_reads.pop(0)
        if node not in self.labels:
            raise PermanentApiError(f"node {node!r} does not exist", 404)
        return dict(self.labels[node]), str(self.version[node])

    def patch(self, node: str, changes: Mapping[str, str | None], rv: str | None) -> None:
        if self.before_patch is not None:
            self.before_patch()
        if rv is not None and rv != str(self.version[node]):
            raise TemporaryApiError("patch: HTTP 409: the object has been modified", 409)
        for key, value in changes.items():
            if value is None:
                self.labels[node].pop(key, None)
            else:
                self.labels[node][key] = value
        self.version[node] += 1
        self.patches.append(dict(changes))


@pytest.fixture(autouse=True)
def _fast_python3(monkeypatch: pytest.MonkeyPatch) -> None:
    # the simulator's fake vendor tools run with this interpreter
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")


@pytest.fixture(scope="module")
def c500_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("c500") / "root")
    sim.create(root, "c500-8")
    return root


def ours(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith(PREFIX)}


# -- readiness -----------------------------------------------------------------------
def test_readiness_files(tmp_path: Path) -> None:
    assert read_readiness(str(tmp_path)) == {}
    status = tmp_path / "run" / "metax"
    status.mkdir(parents=True)
    (status / "maca.ready").write_text("true\n")
    assert read_readiness(str(tmp_path)) == {"maca.ready": True}
    (status / "runtime.ready").write_text("false")
    assert read_readiness(str(tmp_path)) == {"maca.ready": True, "runtime.ready": False}
    for text in ("", "yes", "truthy", "\x00\x01"):
        (status / "maca.ready").write_text(text)
        assert read_readiness(str(tmp_path))["maca.ready"] is False, text
    (status / "maca.ready").unlink()
    (status / "maca.ready").mkdir()  # unreadable: not ready
    assert read_readiness(str(tmp_path))["maca.ready"] is False


def test_wanted_labels_from_a_simulated_host(tmp_path: Path, c500_root: str) -> None:
    wanted, inventory = wanted_labels(c500_root, discover)
    assert len(inventory.gpus) == 8
    assert wanted[f"{PREFIX}gpu.product"] == "C500"
    assert wanted[f"{PREFIX}gpu.installed"] == "true"
    assert f"{PREFIX}maca.ready" not in wanted

    nogpu = str(tmp_path / "nogpu")
    sim.create(nogpu, "nogpu")
    os.makedirs(os.path.join(nogpu, "run/metax"))
    Path(nogpu, "run/metax/maca.ready").write_text("true")
    assert wanted_labels(nogpu, discover)[0] == {f"{PREFIX}gpu.installed": "false"}


def test_readiness_labels_follow_the_status_files(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    sim.create(root, "c500-8")
    status = Path(root, "run/metax")
    status.mkdir(parents=True)
    (status / "runtime.ready").write_text("true")
    wanted = wanted_labels(root, discover)[0]
    assert wanted[f"{PREFIX}runtime.ready"] == "true" and f"{PREFIX}maca.ready" not in wanted
    (status / "maca.ready").write_text("false")
    wanted = wanted_labels(root, discover, status_dir="/run/metax")[0]
    assert wanted[f"{PREFIX}maca.ready"] == "false"


# -- reconcile -------------------------------------------------------------------------
def test_reconcile_adds_updates_removes_only_ours(c500_root: str) -> None:
    stale = {f"{PREFIX}gpu.product": "C550", f"{PREFIX}gpu.removed-feature": "x",
             f"{PREFIX}maca.ready": "true"}
    store = LabelStore({"gpu-1": {**OTHER, **stale}})
    wanted = wanted_labels(c500_root, discover)[0]
    result = reconcile(store, "gpu-1", wanted)
    assert result.applied and result.changed
    assert result.changes[f"{PREFIX}gpu.product"] == "C500"
    assert result.changes[f"{PREFIX}gpu.removed-feature"] is None
    assert result.changes[f"{PREFIX}maca.ready"] is None
    labels = store.labels["gpu-1"]
    assert ours(labels) == wanted
    assert {k: labels[k] for k in OTHER} == OTHER  # untouched
    again = reconcile(store, "gpu-1", wanted)
    assert not again.changed and not again.applied and len(store.patches) == 1


def test_node_in_maintenance_keeps_its_labels_removed(c500_root: str) -> None:
    store = LabelStore({"gpu-1": dict(OTHER)})  # node_maintenance removed our labels
    store.node_annotations["gpu-1"] = {MAINTENANCE_ANNOTATION: "2026-11-22T10:00:00+00:00"}
    wanted = wanted_labels(c500_root, discover)[0]
    result = reconcile(store, "gpu-1", wanted)
    assert result.changed and not result.applied and store.patches == []
    assert any("maintenance" in p for p in result.problems)
    store.node_annotations["gpu-1"] = {}  # maintenance over: labels come back
    assert reconcile(store, "gpu-1", wanted).applied
    assert ours(store.labels["gpu-1"]) == wanted


def test_dry_run_changes_nothing_and_prints_the_diff(c500_root: str) -> None:
    store = LabelStore({"gpu-1": {**OTHER, f"{PREFIX}gpu.product": "C550",
                                  f"{PREFIX}old": "1"}})
    wanted = wanted_labels(c500_root, discover)[0]
    result = reconcile(store, "gpu-1", wanted, dry_run=True)
    assert result.changed and not result.applied and store.patches == []
    text = format_diff(result)
    assert f"~ {PREFIX}gpu.product: C550 -> C500" in text
    assert f"- {PREFIX}old (was 1)" in text
    assert f"+ {PREFIX}gpu.vfnum=0" in text
    assert "kubernetes.io/hostname" not in text


def test_a_concurrent_write_is_a_temporary_conflict(c500_root: str) -> None:
    store = LabelStore({"gpu-1": dict(OTHER)})

    def someone_else_writes() -> None:
        store.before_patch = None
        store.labels["gpu-1"][f"{PREFIX}gpu.product"] = "C280"
        store.version["gpu-1"] += 1

    store.before_patch = someone_else_writes
    wanted = wanted_labels(c500_root, discover)[0]
    with pytest.raises(TemporaryApiError):
        reconcile(store, "gpu-1", wanted)
    assert reconcile(store, "gpu-1", wanted).applied  # re-read, then it applies
    assert ours(store.labels["gpu-1"]) == wanted


# -- backoff and loop ---------------------------------------------------------------------
def test_backoff_grows_with_jitter_and_is_capped() -> None:
    backoff = Backoff(base=1, cap=8, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(8)]
    ceilings = [1, 2, 4, 8, 8, 8, 8, 8]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) == len(delays)  # jittered
    backoff.reset()
    assert backoff.next_delay() <= 1


def test_loop_step_backs_off_on_temporary_errors_only(c500_root: str) -> None:
    store = LabelStore({"gpu-1": {}})
    wanted = wanted_labels(c500_root, discover)[0]
    loop = LabellerLoop(lambda: reconcile(store, "gpu-1", wanted), interval=60,
                        backoff=Backoff(base=1, cap=30, rng=random.Random(1)))
    store.fail_reads = [TemporaryApiError("503"), TemporaryApiError("503"),
                        TemporaryApiError("503")]
    delays = [loop.step() for _ in range(3)]
    assert all(d < 60 for d in delays) and delays[2] > delays[0]
    assert loop.step() == 60 and ours(store.labels["gpu-1"]) == wanted
    assert loop.status.last_error is None and loop.status.passes == 4
    store.fail_reads = [PermanentApiError("403 forbidden", 403)]
    assert loop.step() == 60  # no fast retry on a permanent error
    assert "403" in (loop.status.last_error or "")
    assert loop.backoff.attempt == 0


def test_loop_rechecks_on_wake(c500_root: str) -> None:
    store = LabelStore({"gpu-1": {}})
    wanted = wanted_labels(c500_root, discover)[0]
    passes = threading.Semaphore(0)

    def one_pass():  # type: ignore[no-untyped-def]
        result = reconcile(store, "gpu-1", wanted)
        passes.release()
        return result

    loop = LabellerLoop(one_pass, interval=3600)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    assert passes.acquire(timeout=20)
    store.labels["gpu-1"].pop(f"{PREFIX}gpu.product")  # someone removed our label
    loop.wake()
    assert passes.acquire(timeout=20)
    assert store.labels["gpu-1"][f"{PREFIX}gpu.product"] == "C500"
    loop.stop()
    thread.join(timeout=20)
    assert not thread.is_alive()


# -- main ------------------------------------------------------------------------------------
def test_main_once_dry_run_and_json(c500_root: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = LabelStore({"gpu-1": dict(OTHER)})
    argv = ["--node-name", "gpu-1", "--host-root", c500_root, "--log-level", "error"]
    assert main([*argv, "--dry-run"], store=store, discover=discover) == 0
    assert store.patches == [] and "label change(s)" in capsys.readouterr().out
    assert main([*argv, "--once", "--json"], store=store, discover=discover) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["changed"] and out["applied"] and out["node"] == "gpu-1"
    assert ours(store.labels["gpu-1"]) == out["labels"]
    assert main([*argv, "--once", "--json"], store=store, discover=discover) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is False


@pytest.mark.parametrize(("argv", "code", "needle"), [
    (["--once"], 2, "--node-name"),
    (["--once", "--node-name", "n", "--host-root", "/does/not/exist"], 2, "--host-root"),
    (["--once", "--node-name", "n", "--interval", "0"], 2, "--interval"),
    (["--once", "--node-name", "missing"], 1, "does not exist"),
    (["--once", "--node-name", "n", "--log-level", "loud"], 2, "log.level"),
])
def test_main_errors(argv: list[str], code: int, needle: str, c500_root: str,
                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    store = LabelStore({"n": {}})
    if "--host-root" not in argv:
        argv = [*argv, "--host-root", c500_root]
    assert main(argv, store=store, discover=discover) == code
    assert needle in capsys.readouterr().err


def test_main_node_name_from_env(c500_root: str, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-1")
    store = LabelStore({"gpu-1": {}})
    assert main(["--once", "--host-root", c500_root], store=store, discover=discover) == 0
    assert ours(store.labels["gpu-1"])[f"{PREFIX}gpu.installed"] == "true"


def test_main_loop_rechecks_on_sighup_and_stops_on_sigterm(c500_root: str) -> None:
    """Runs the real loop in this (main) thread; signals come from a helper thread."""
    store = LabelStore({"gpu-1": dict(OTHER)})
    reads = threading.Semaphore(0)
    original_read = store.read

    def counting_read(node: str) -> tuple[dict[str, str], str | None]:
        try:
            return original_read(node)
        finally:
            reads.release()

    store.read = counting_read  # type: ignore[method-assign]
    sent: list[str] = []

    def conductor() -> None:
        if reads.acquire(timeout=30):  # first pass done
            store.labels["gpu-1"][f"{PREFIX}gpu.product"] = "tampered"
            sent.append("HUP")
            os.kill(os.getpid(), signal.SIGHUP)
            reads.acquire(timeout=30)  # second pass, only possible through SIGHUP
        sent.append("TERM")
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=conductor, daemon=True).start()
    code = main(["--node-name", "gpu-1", "--host-root", c500_root, "--interval", "3600",
                 "--log-level", "error"], store=store, discover=discover)
    assert code == 0 and sent == ["HUP", "TERM"]
    assert store.labels["gpu-1"][f"{PREFIX}gpu.product"] == "C500"
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored


def test_health_endpoint_reports_a_stuck_loop() -> None:
    import http.client
    import time

    from gpuk8s.services.labeller.loop import LoopStatus
    from gpuk8s.services.labeller.main import serve_health

    status = LoopStatus()
    server = serve_health(0, status, stale_after=60)
    try:
        port = server.server_address[1]

        def get(path: str) -> tuple[int, dict[str, object]]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", path)
            resp = conn.getresponse()
            data = json.loads(resp.read())
            conn.close()
            return resp.status, data

        status.record("HTTP 503: apiserver busy")
        code, data = get("/healthz")
        assert code == 200 and data["passes"] == 1 and "503" in str(data["lastError"])
        # ready only once a pass has written (or confirmed) the labels
        code, data = get("/readyz")
        assert code == 503 and "no label pass has succeeded" in str(data["reason"])
        status.record(None)
        assert get("/readyz")[0] == 200
        status.last_attempt = time.monotonic() - 120  # no pass attempted for 2 minutes
        code, data = get("/healthz")
        assert code == 503 and "no pass attempted" in str(data["reason"])
        assert get("/other")[0] == 404
    finally:
        server.shutdown()
        server.server_close()
