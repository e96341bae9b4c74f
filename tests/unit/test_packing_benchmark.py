"""benchmarks/packing.py and benchmarks/paper_policies.py on small synthetic traces
(openb's file format): the protocol's bookkeeping, the paper's policies (FGD, BestFit,
DotProd, Random) with GPU sharing, the summary's mean and range, and the product's
replay. Behaviour only: no test asserts an allocation figure."""

from __future__ import annotations

import importlib.util
import random
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MILLI = 1000


def load_benchmark() -> ModuleType:
    name = "gpuk8s_packing_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "packing.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look the module up while building
        spec.loader.exec_module(module)
    return sys.modules[name]


def write_trace(
    directory: Path,
    nodes: list[tuple[int, int, int]],
    pods: list[tuple[int, int, int, int]],
    trace: str = "default",
) -> Path:
    bench = load_benchmark()
    return bench.save(
        directory,
        [bench.NodeSpec(f"syn-node-{i:03d}", *n) for i, n in enumerate(nodes)],
        [bench.PodSpec(f"syn-pod-{i:04d}", *p) for i, p in enumerate(pods)],
        trace,
    )


NODES = ([(96_000, 393_216, 8)] * 12 + [(96_000, 393_216, 4)] * 8
         + [(104_000, 524_288, 2)] * 16 + [(16_000, 65_536, 1)] * 8)


@pytest.fixture(scope="module")
def multi_gpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """44 nodes of the four openb shapes; a mix heavy in 2-, 4- and 8-GPU pods."""
    pods = ([(8000, 16_384, 1, 1000)] * 60 + [(4000, 8192, 1, 500)] * 30
            + [(16_000, 32_768, 2, 1000)] * 10 + [(32_000, 65_536, 4, 1000)] * 8
            + [(64_000, 262_144, 8, 1000)] * 8 + [(16_000, 32_768, 0, 0)] * 10)
    return write_trace(tmp_path_factory.mktemp("trace"), NODES, pods)


@pytest.fixture(scope="module")
def sharing_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same nodes; mostly fractional pods (openb's common shares), some whole GPUs,
    pods without GPUs -- under a second trace name, ``sharing``."""
    pods = ([(6000, 12_288, 1, 460)] * 40 + [(4000, 8192, 1, 250)] * 40
            + [(8000, 16_384, 1, 810)] * 20 + [(12_000, 16_384, 1, 1000)] * 20
            + [(32_000, 65_536, 4, 1000)] * 4 + [(8000, 16_384, 0, 0)] * 20)
    return write_trace(tmp_path_factory.mktemp("trace"), NODES, pods, trace="sharing")


def rows_by_policy(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["policy"]: row for row in rows}


def test_workload_follows_the_protocol(multi_gpu_trace: Path) -> None:
    bench = load_benchmark()
    nodes, pods = bench.load(multi_gpu_trace)
    capacity = sum(n.gpus for n in nodes)
    order = bench.workload(pods, capacity, 42)
    assert order[: len(pods)] != pods and sorted(order[: len(pods)], key=id) == sorted(
        pods, key=id)  # a shuffle of the whole trace first
    requested = [p.requested for p in order]
    assert sum(requested) >= 1.3 * capacity * 1000 > sum(requested[:-1])  # then resampled
    assert bench.workload(pods, capacity, 42) == order  # the seed decides
    assert bench.workload(pods, capacity, 43) != order
    assert bench.seeds_arg("42-44,50") == [42, 43, 44, 50]


def test_a_trace_is_chosen_by_name(sharing_trace: Path) -> None:
    bench = load_benchmark()
    _, pods = bench.load(sharing_trace, "sharing")
    assert len(pods) == 144 and sum(1 for p in pods if p.gpus and p.milli < 1000) == 100
    with pytest.raises(FileNotFoundError):
        bench.load(sharing_trace)  # no openb_pod_list_default.csv there
    with pytest.raises(ValueError, match="known are"):
        bench.run([42], ("bestfitt",), data=sharing_trace, trace="sharing")


def test_gpu_model_constraints_are_reported_not_silently_dropped(
    sharing_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``gpuspecNN`` list names GPU models, which the replays do not model: ``main``
    says how many pods do, before the figures (which are those without the column)."""
    bench = load_benchmark()
    assert bench.model_note(sharing_trace, "sharing") == ""
    lines = (sharing_trace / "openb_pod_list_sharing.csv").read_text().splitlines()
    header = lines[0].split(",")
    at = header.index("gpu_spec")
    for i in (1, 5, 9):  # three pods ask for a model, one of them for either of two
        row = lines[i].split(",")
        row[at] = "V100M16|V100M32" if i == 5 else "T4"
        lines[i] = ",".join(row)
    (tmp_path / "openb_pod_list_spec.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(
        (sharing_trace / "openb_node_list_gpu_node.csv").read_text())
    assert bench.model_note(tmp_path, "spec").startswith(
        "note: 3 pods of 'spec' name GPU models (gpu_spec)")
    assert bench.load(tmp_path, "spec")[1] == bench.load(sharing_trace, "sharing")[1]
    assert bench.main(["--data", str(tmp_path), "--trace", "spec", "--seeds", "42",
                       "--jobs", "1", "--policies", "bestfit", "--every", "4"]) == 0
    out = capsys.readouterr().out
    assert "note: 3 pods of 'spec' name GPU models (gpu_spec)" in out
    assert out.index("note: 3 pods") < out.index("| policy |")


def test_typical_pods_cover_the_popular_shapes_cpu_pods_included() -> None:
    bench = load_benchmark()
    from paper_policies import typical_pods

    spec = bench.PodSpec
    pods = ([spec("a", 4000, 1, 1, 500)] * 50 + [spec("b", 8000, 1, 0, 0)] * 30
            + [spec("c", 2000, 1, 8, 1000)] * 15 + [spec("d", 1000, 1, 1, 100)] * 5)
    typical = typical_pods(pods)  # 50 + 30 + 15 = 95 % of the pods: the fourth is left out
    assert [k for k, _ in typical] == [(4000, 500, 1), (8000, 0, 0), (2000, 1000, 8)]
    assert [p for _, p in typical] == pytest.approx([50 / 95, 30 / 95, 15 / 95])
    assert [k for k, _ in typical_pods(pods, popularity=1.0)][-1] == (1000, 100, 1)


def test_fgd_fragmentation_is_the_papers_measure() -> None:
    """Free milli-GPUs a shape cannot use, weighted by its frequency: all of them when
    the CPU or the GPUs are short, and always for a CPU-only shape."""
    from paper_policies import Fragmentation

    typical = [((4000, 500, 1), 0.5), ((8000, 1000, 2), 0.25), ((2000, 0, 0), 0.25)]
    frag = Fragmentation(typical)
    gpus = (300, 600, 1000, 1000)  # sorted ascending, 2,900 free
    # 0.5: only the 300 is too small for 500; 0.25: two whole GPUs free, the 300 and
    # the 600 lost for it; 0.25 (CPU only): all 2,900
    assert frag(10_000, gpus) == pytest.approx(0.5 * 300 + 0.25 * 900 + 0.25 * 2900)
    # 6 cores: the 2-GPU shape (8 cores) cannot be fed -- all free GPUs lost for it
    assert frag(6000, gpus) == pytest.approx(0.5 * 300 + 0.25 * 2900 + 0.25 * 2900)
    # one whole GPU left: the 2-GPU shape cannot fit
    assert frag(10_000, (300, 600, 700, 1000)) == pytest.approx(
        0.5 * 300 + 0.25 * 2600 + 0.25 * 2600)
    assert frag(10_000, (0, 0)) == 0.0


@pytest.mark.parametrize("policy", ["fgd", "bestfit", "dotprod", "random"])
def test_paper_policies_share_gpus_and_hold_what_they_place(policy: str) -> None:
    """Every policy packs fractional pods onto shared GPUs, never over-commits a GPU,
    the CPU or the memory, gives whole GPUs to nobody else, and the cluster holds
    exactly the pods ``place`` reported placed."""
    bench = load_benchmark()
    from paper_policies import PaperScheduler, typical_pods

    nodes = [bench.NodeSpec(f"n{i}", 32_000, 131_072, g) for i, g in enumerate([8, 4, 2, 1])]
    spec = bench.PodSpec
    pods = ([spec("s", 2000, 4096, 1, 300)] * 30 + [spec("w", 4000, 8192, 1, 1000)] * 6
            + [spec("m", 4000, 8192, 2, 1000)] * 2 + [spec("c", 3000, 4096, 0, 0)] * 4)
    random.Random(7).shuffle(pods)
    scheduler = PaperScheduler(policy, nodes, typical_pods(pods), random.Random(1))
    held: list[list[list[str]]] = [[[] for _ in range(n.gpus)] for n in nodes]
    placed = []
    for pod in pods:
        where = scheduler.place(pod)
        if where is None:
            continue
        index, gpus = where
        assert len(gpus) == pod.gpus
        for g in gpus:
            held[index][g].append(pod.name)
        placed.append((index, pod))
    assert any(len(h) > 1 for node in held for h in node)  # fractional pods shared GPUs
    for i, node in enumerate(scheduler.nodes):
        mine = [p for j, p in placed if j == i]
        assert node.cpu == nodes[i].cpu - sum(p.cpu for p in mine) >= 0
        assert node.memory == nodes[i].memory - sum(p.memory for p in mine) >= 0
        for g, left in enumerate(node.gpus):
            users = [p for j, p in placed if j == i and p.name in held[i][g]]
            assert left == MILLI - 300 * held[i][g].count("s") - MILLI * (
                held[i][g].count("w") + held[i][g].count("m")) >= 0
            if any(p.milli == MILLI for p in users):
                assert len(held[i][g]) == 1  # a whole GPU is nobody else's


def test_the_paper_tie_break_is_one_random_node_order() -> None:
    """Among equal scores the node first in an order drawn once per run wins (the
    paper's simulator): equal pods on equal nodes fill one node before the next."""
    bench = load_benchmark()
    from paper_policies import PaperScheduler

    nodes = [bench.NodeSpec(f"n{i}", 64_000, 262_144, 8) for i in range(6)]
    pod = bench.PodSpec("p", 1000, 1024, 1, 1000)
    for policy in ("bestfit", "dotprod"):
        scheduler = PaperScheduler(policy, nodes, [], random.Random(3))
        first = min(range(6), key=scheduler.rank.__getitem__)
        where = [scheduler.place(pod) for _ in range(8)]
        assert {w[0] for w in where if w is not None} == {first}


def test_summary_mean_and_range_come_from_the_seeds() -> None:
    bench = load_benchmark()
    results = []
    for seed, (a, b) in zip((42, 43, 44), ((95.0, 95.5), (94.0, 94.2), (96.5, 96.6)),
                            strict=True):
        result = bench.Result("x", seed)
        result.allocation = {"100": a, "130": b}
        result.failed = {"100": {1: seed - 40}, "130": {8: 1}}
        results.append(result)
    (row,) = bench.summarise(results)
    assert row["alloc100_seeds"] == [95.0, 94.0, 96.5]
    assert row["alloc100_range"] == {"mean": statistics.mean([95.0, 94.0, 96.5]),
                                     "min": 94.0, "max": 96.5}
    assert row["alloc100"] == row["alloc100_range"]["mean"]
    assert row["alloc130_range"]["max"] == 96.6
    assert row["failed100"] == {1: 3.0}  # per seed: (2 + 3 + 4) / 3
    other = dict(row, alloc100_seeds=[94.8, 94.9, 95.0],
                 alloc100_range={"mean": 94.9, "min": 94.8, "max": 95.0})
    # "above" only beyond the other's range: 95.17 > 95.0 here, not within 94.0-96.0
    assert "above its range" in bench.compare(row, other)
    wide = dict(other, alloc100_range={"mean": 95.0, "min": 94.0, "max": 96.0})
    assert "within its range" in bench.compare(row, wide)
    low = dict(other, alloc100_range={"mean": 93.0, "min": 92.9, "max": 93.1})
    assert "below its range" in bench.compare(low, row)
    # the paired differences, same seeds: 95.0-94.8, 94.0-94.9, 96.5-95.0
    assert "per seed -0.90 to +1.50" in bench.compare(row, other)


def test_whole_gpu_mode_keeps_multi_gpu_pods_in_link_groups(multi_gpu_trace: Path) -> None:
    """The product in whole-GPU mode (and the whole-GPU baselines, labelled as such):
    every 2/4/8-GPU pod inside one link group, a prioritize timing per pod, and never
    more allocated than the cluster without fragmentation."""
    bench = load_benchmark()
    rows = rows_by_policy(bench.run(range(42, 45), ("gpu-aware", "bestfit-whole",
                                                    "firstfit-whole"),
                                    data=multi_gpu_trace))
    aware, bound = rows["gpu-aware"], rows[bench.POOLED]
    for mark in ("100", "130"):
        for policy in ("gpu-aware", "bestfit-whole", "firstfit-whole"):
            assert rows[policy][f"alloc{mark}"] <= bound[f"alloc{mark}"] + 1e-9, mark
    inside, placed = aware["inside"]
    assert placed > 50 and inside == placed
    assert set(aware["inside_by_size"]) == {2, 4, 8}
    assert aware["prioritize_ms_mean"] > 0 and "prioritize_ms_mean" not in rows["bestfit-whole"]
    assert aware["filter_ms_mean"] > 0 and "bind_ms_mean" not in aware  # no bind verb here
    table = bench.table(list(rows.values()))
    assert "| BestFit, whole GPUs (no sharing) |" in table
    assert "| FirstFit, whole GPUs (no sharing) |" in table


def test_sharing_replay_shares_gpus_in_the_product_and_the_baselines(
    sharing_trace: Path,
) -> None:
    """The same pods through the extender's sharing path (vcuda mode: filter,
    prioritize, bind) and through the paper's policies: all share GPUs, so each places
    more than whole GPUs could hold, and never more than the shared-GPU bound; the
    product's whole multi-GPU pods stay inside one link group."""
    bench = load_benchmark()
    policies = (bench.SHARING, "fgd", "bestfit", "dotprod", "random")
    rows = rows_by_policy(bench.run([42, 43], policies, data=sharing_trace, trace="sharing"))
    for policy in policies:
        for mark in ("100", "130"):
            assert rows[policy][f"alloc{mark}"] > rows[bench.POOLED][f"alloc{mark}"], policy
            assert rows[policy][f"alloc{mark}"] <= rows[bench.POOLED_SHARED][f"alloc{mark}"] \
                + 1e-9, policy
        # the configuration-LP bound holds for every policy at arrived 100 %
        assert rows[policy]["alloc100"] <= rows[bench.SHARES_PACKED]["alloc100"] + 1e-9, policy
    inside, placed = rows[bench.SHARING]["inside"]
    assert placed > 0 and inside == placed
    # the pods without GPUs went through the extender's second entry (prioritize-nogpu)
    assert rows[bench.SHARING]["nogpu_ms_mean"] > 0
    # the cost of every verb gpu-aware answers for a GPU pod is measured and printed
    shared = rows[bench.SHARING]
    assert min(shared[f"{v}_ms_mean"] for v in ("filter", "prioritize", "bind")) > 0
    assert "| filter " in bench.table([shared]) and "; bind " in bench.table([shared])
    alone = rows_by_policy(bench.run([42], (bench.SHARING,), data=sharing_trace,
                                     trace="sharing", nogpu=False))
    assert "nogpu_ms_mean" not in alone[bench.SHARING]


def _best_packing(items: list[int], gpus: int) -> int:
    """The most milli-GPUs of ``items`` that ``gpus`` GPUs hold: every assignment tried."""
    best = 0

    def place(i: int, free: list[int], held: int) -> None:
        nonlocal best
        if i == len(items):
            best = max(best, held)
            return
        place(i + 1, free, held)  # left out
        for g in range(len(free)):
            if free[g] >= items[i]:
                free[g] -= items[i]
                place(i + 1, free, held + items[i])
                free[g] += items[i]

    place(0, [MILLI] * gpus, 0)
    return best


@pytest.mark.parametrize(
    ("shares", "gpus", "expected"),
    [
        ({600: 2, 400: 2}, 2, 2000),  # two perfect pairs
        ({810: 3, 160: 1}, 2, 1780),  # one 81 % share finds its partner, one does not
        ({510: 3}, 2, 1020),  # no two fit together
        ({470: 4, 320: 2, 650: 2}, 4, 3820),  # 47+47 twice, 65+32 twice: all placed
        ({250: 8}, 3, 2000),  # more than the GPUs hold
        ({}, 3, 0),
        ({500: 2}, 0, 0),
    ],
)
def test_shares_lp_on_packings_worked_by_hand(
    shares: dict[int, int], gpus: int, expected: int
) -> None:
    assert load_benchmark().shares_lp(shares, gpus) == pytest.approx(expected)


def test_shares_lp_bounds_every_packing_from_above() -> None:
    """On small random cases the LP is never below the best packing found by trying
    every assignment, and never above the shares' total nor the GPUs' capacity; most
    cases are tight (the LP's rounding gap is small)."""
    bench = load_benchmark()
    rng = random.Random(7)
    tight = 0
    for _ in range(40):
        items = [rng.choice((110, 160, 230, 320, 370, 470, 550, 650, 810))
                 for _ in range(rng.randint(2, 7))]
        gpus = rng.randint(1, 3)
        shares: dict[int, int] = {}
        for m in items:
            shares[m] = shares.get(m, 0) + 1
        lp = bench.shares_lp(shares, gpus)
        best = _best_packing(sorted(items, reverse=True), gpus)
        assert best - 1e-6 <= lp <= min(sum(items), gpus * MILLI) + 1e-6, (items, gpus)
        tight += lp < best + 1
    assert tight >= 20


def test_the_share_bound_places_every_whole_gpu_and_packs_the_shares() -> None:
    """``shares_packed``: the pods up to arrived 100 %, whole GPUs all placed, the shares
    in the GPUs left; CPU and memory play no part."""
    bench = load_benchmark()
    specs = [bench.NodeSpec("n0", 1000, 1024, 4)]
    pods = [bench.PodSpec("w", 64_000, 1, 2, MILLI),  # 2 whole GPUs
            bench.PodSpec("a", 64_000, 1, 1, 810), bench.PodSpec("b", 1, 1, 1, 810),
            bench.PodSpec("c", 1, 1, 1, 160),
            bench.PodSpec("d", 1, 1, 1, MILLI),  # arrived 100 %: 4,780 of 4,000
            bench.PodSpec("late", 1, 1, 1, 190)]  # after the mark: not counted
    result = bench.shares_packed(specs, pods, 42)
    # three whole GPUs, then 81 + 16 % on the last one
    assert result.allocation["100"] == pytest.approx(100 * (3000 + 970) / 4000)


def replay_sharing(trace: Path, policy: str, seed: int) -> tuple[list[Any], Any]:
    """The ``sharing`` trace's nodes and one policy's replay of it with ``seed``."""
    bench = load_benchmark()
    specs, pods = bench.load(trace, "sharing")
    order = bench.workload(pods, sum(s.gpus for s in specs), seed)
    if policy in bench.PAPER_POLICIES:
        from paper_policies import typical_pods

        return specs, bench.PaperReplay(policy, specs, typical_pods(pods), seed).run(order)
    return specs, bench.Replay(policy, specs, bench._shapes(), seed, 0).run(order)


@pytest.mark.parametrize("policy", ["gpu-aware-sharing", "fgd", "bestfit", "dotprod"])
def test_each_policy_holds_exactly_the_pods_it_reports(sharing_trace: Path, policy: str) -> None:
    """The milli-GPUs the allocation figure counts are the ones the cluster's own
    accounting holds at the end: the extender's ledger (from the pods' annotations)
    for the product, the nodes' free milli-GPUs for the paper's policies."""
    specs, result = replay_sharing(sharing_trace, policy, 44)
    assert result.reported > 0 and result.held == result.reported
    capacity = sum(s.gpus for s in specs) * MILLI
    assert result.allocation["130"] == pytest.approx(100 * result.reported / capacity)


@pytest.mark.parametrize("policy", ["gpu-aware-sharing", "fgd"])
def test_free_capacity_by_node_shape_adds_up_to_what_was_not_placed(
    sharing_trace: Path, policy: str
) -> None:
    """``by_shape`` at arrived 100 %: every node counted under its shape, the free GPUs
    over all shapes the capacity less the milli-GPUs placed by then (the trace's shares
    are whole percents, so the product's percent accounting is exact), each shape's
    free GPUs and cores within what its nodes have, and ``whole8`` (8-GPU nodes with
    all eight free) no more than the 8-GPU nodes' free GPUs allow."""
    specs, result = replay_sharing(sharing_trace, policy, 45)
    shapes: dict[str, int] = {}
    for spec in specs:
        key = f"{spec.gpus}x{spec.cpu // 1000}"
        shapes[key] = shapes.get(key, 0) + 1
    assert {k: v[0] for k, v in result.by_shape.items()} == shapes
    capacity = sum(s.gpus for s in specs) * MILLI
    free = sum(v[1] for v in result.by_shape.values())
    assert free * MILLI == pytest.approx(capacity * (1 - result.allocation["100"] / 100))
    assert free > 0  # the mark is read before the cluster is full
    for key, (nodes, gpus, cores) in result.by_shape.items():
        size, cpu = map(int, key.split("x"))
        assert 0 <= gpus <= nodes * size and 0 <= cores <= nodes * cpu
    assert result.whole8["100"] <= result.by_shape["8x96"][1] / 8


def test_the_shape_table_has_a_row_per_shape_and_a_column_per_policy(
    multi_gpu_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark()
    assert bench.main(["--data", str(multi_gpu_trace), "--seeds", "42,43", "--jobs", "1",
                       "--policies", "gpu-aware-sharing,fgd", "--by-shape"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| node shape"))
    assert "gpu-aware-sharing: free GPUs / cores" in header
    assert "FGD (sharing): free GPUs / cores" in header
    rows = [line for line in out.splitlines() if line.startswith(("| 1x", "| 2x", "| 4x", "| 8x"))]
    assert [row.split(",")[0] for row in rows] == ["| 1x16", "| 2x104", "| 4x96", "| 8x96"]
    assert all(row.count("/") == 2 for row in rows)


def test_quick_replay_of_the_openb_trace() -> None:
    """``--quick`` on the real trace (``../shared/data/openb`` next to the checkout, or
    ``$OPENB_DIR``; not in the repository: the Alibaba cluster-trace terms): every
    policy reports both marks and a range."""
    bench = load_benchmark()
    if not (bench.DATA / "openb_pod_list_default.csv").is_file():
        pytest.skip(f"the openb trace is not at {bench.DATA} (set OPENB_DIR)")
    assert bench.main(["--quick", "--jobs", "1", "--policies", "fgd,bestfit"]) == 0


def test_cpu_scale_shrinks_every_nodes_cpu_and_nothing_else(multi_gpu_trace: Path) -> None:
    bench = load_benchmark()
    nodes, _ = bench.load(multi_gpu_trace)
    short = bench.scale_cpu(nodes, 0.75)
    assert [n.cpu for n in short] == [int(n.cpu * 0.75) for n in nodes]
    assert [(n.name, n.memory, n.gpus) for n in short] == [
        (n.name, n.memory, n.gpus) for n in nodes]
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=r"cpu scale .*above 0"):
            bench.run([42], ("bestfit",), data=multi_gpu_trace, cpu_scale=bad)


def test_nodes_scale_repeats_every_node_under_a_name_of_its_own(
    multi_gpu_trace: Path,
) -> None:
    """``--nodes-scale``: the (sub-)cluster's nodes N times over, each copy named apart,
    the CPU scale applied to every copy; the fill protocol fills the larger capacity."""
    bench = load_benchmark()
    nodes, _ = bench.load(multi_gpu_trace)
    big = bench.cluster(nodes, 1, 0.5, 3)
    assert len(big) == 3 * len(nodes)
    assert len({n.name for n in big}) == len(big)
    assert [(n.memory, n.gpus, n.cpu) for n in big] == [
        (n.memory, n.gpus, int(n.cpu * 0.5)) for n in nodes] * 3
    assert bench.cluster(nodes, 2) == nodes[::2]
    for bad in (0, 101):
        with pytest.raises(ValueError, match=r"nodes scale .*from 1 to 100"):
            bench.run([42], ("bestfit",), data=multi_gpu_trace, times=bad)
    one = rows_by_policy(bench.run([42], ("bestfit",), data=multi_gpu_trace))
    four = rows_by_policy(bench.run([42], ("bestfit",), data=multi_gpu_trace, times=4))
    row, row4 = one["bestfit"]["by_shape"], four["bestfit"]["by_shape"]
    assert {k: v[0] * 4 for k, v in row.items()} == {k: v[0] for k, v in row4.items()}


def test_a_cpu_short_cluster_fails_pods_without_gpus_the_full_one_places(
    tmp_path: Path,
) -> None:
    """Pods without GPUs that the trace's cluster holds find too little CPU once every
    node keeps half of it: the replay counts them, by class, for every policy."""
    bench = load_benchmark()
    nodes = [(32_000, 262_144, 4)] * 4
    pods = [(1000, 1024, 1, 1000)] * 16 + [(6000, 1024, 0, 0)] * 16
    data = write_trace(tmp_path, nodes, pods)
    policies = ("gpu-aware-sharing", "fgd", "bestfit")
    full = rows_by_policy(bench.run([42], policies, data=data))
    short = rows_by_policy(bench.run([42], policies, data=data, cpu_scale=0.5))
    for policy in policies:
        assert full[policy]["failed100"].get("none", 0) == 0
        assert short[policy]["failed100"].get("none", 0) > 0


def test_trace_durations_are_read_and_written(tmp_path: Path) -> None:
    bench = load_benchmark()
    spec = bench.PodSpec
    pods = [spec("a", 1000, 1, 1, 500, 30), spec("b", 1000, 1, 0, 0, 0)]
    bench.save(tmp_path, [bench.NodeSpec("n", 8000, 8192, 1)], pods)
    assert [p.duration for p in bench.load(tmp_path)[1]] == [30, 0]
    assert bench._lifetime({"creation_time": "100", "deletion_time": "40"}) == 0
    assert bench._lifetime({}) == 0


def test_churn_gap_holds_the_offered_load_at_the_horizon() -> None:
    bench = load_benchmark()
    spec = bench.PodSpec
    pods = [spec("a", 1, 1, 1, 1000)] * 10
    # equal lifetimes 10, no truncation: 10 pods x 1000 x 10 / 10 = g x offered
    gap = bench.churn_gap(pods, [10.0] * 10, 2000.0)
    assert gap == pytest.approx(5.0, rel=1e-6)  # horizon 50 > 10
    # one very long life: held = (9 x 1000 x 1 + 1000 x 10 g) / 10 = 900 + 1000 g,
    # so 2000 g = 900 + 1000 g at g = 0.9; without the horizon it would be 5e7
    lives = [1.0] * 9 + [1e9]
    gap = bench.churn_gap(pods, lives, 2000.0)
    assert gap == pytest.approx(0.9, rel=1e-6)
    with pytest.raises(ValueError, match="lifetime"):
        bench.churn_gap([spec("c", 1, 1, 0, 0)], [1.0], 1000.0)


def test_churn_options_name_the_allowed_values() -> None:
    bench = load_benchmark()
    with pytest.raises(ValueError, match="allowed are trace, exp"):
        bench.Churn(lifetimes="weibull")
    with pytest.raises(ValueError, match="churn span"):
        bench.Churn(span=0.5)
    with pytest.raises(ValueError, match="churn load"):
        bench.Churn(load=0)


def test_churn_replay_releases_what_it_placed_at_the_right_times() -> None:
    """A cluster of one GPU: a pod that lives two gaps leaves before the third arrives,
    so every other pod fits; the time-weighted mean counts the GPU held half the time."""
    bench = load_benchmark()
    spec = bench.PodSpec
    pods = [spec(f"p{i}", 1, 1, 1, 1000) for i in range(8)]
    lives = [2.0] * 8
    held: list[str] = []
    events: list[tuple[str, str]] = []

    def place(pod: Any) -> str | None:
        if held:
            return None
        held.append(pod.name)
        events.append(("in", pod.name))
        return pod.name

    def release(token: str) -> None:
        held.remove(token)
        events.append(("out", token))

    result = bench.churn_replay(pods, lives, 1.0, place, release, 1000, bench.Result("x", 1),
                                lambda: [])
    assert events[:5] == [("in", "p0"), ("out", "p0"), ("in", "p2"), ("out", "p2"),
                          ("in", "p4")]
    assert result.departed == 3 and result.reported == 1000
    assert sorted(result.allocation, key=float) == [str(m) for m in range(100, 801, 50)]
    assert result.failed["800"] == {"1": 4}
    assert result.failed["churn"] == {"1": 4}  # p1, p3, p5, p7 after arrived 100 % (p0)
    assert result.churn_mean == pytest.approx(100.0)  # always one pod on the GPU


@pytest.mark.parametrize("lifetimes", ["exp", "trace"])
def test_churn_run_frees_capacity_and_every_policy_sees_the_same_pods(
    tmp_path: Path, lifetimes: str
) -> None:
    """Pods leave in every policy; the cluster's own accounting holds exactly the pods
    still placed at the end (the extender's ledger for gpu-aware), and an arrival
    stream that overfills the cluster without departures is placed almost whole."""
    bench = load_benchmark()
    nodes = [(64_000, 262_144, 4)] * 3 + [(32_000, 131_072, 2)] * 2
    pods = ([(2000, 4096, 1, 500, 50)] * 20 + [(4000, 8192, 1, 1000, 80)] * 10
            + [(8000, 16_384, 2, 1000, 120)] * 4 + [(2000, 4096, 0, 0, 60)] * 6)
    data = write_trace(tmp_path, nodes, pods)
    policies = ("gpu-aware-sharing", "fgd", "bestfit")
    churn = bench.Churn(load=0.5, span=6, lifetimes=lifetimes)
    rows = rows_by_policy(bench.run([42, 43], policies, data=data, churn=churn))
    for policy in policies:
        row = rows[policy]
        assert row["departed"] > 0
        assert row["marks"][0] == "100" and row["marks"][-1] == "600"
        # six capacities arrived at half the capacity offered: most pods placed
        assert row["alloc600"] > 0 and row["allocchurn_range"]["mean"] > 0
    results = bench.run_seed(42, policies, str(data), 1, 0.0, churn=churn)
    for result in results:
        assert result.held == result.reported > 0
    table = bench.churn_table(list(rows.values()))
    assert table.count("\n") == 2 + len(policies) - 1 and "600 %" in table


def test_pods_replays_only_a_prefix_of_each_seeds_pods(multi_gpu_trace: Path) -> None:
    """``--pods N``: each policy decides exactly the first N pods of the seed's fill
    protocol (its GPU pods' decisions timed), the same pods as the whole run's first N;
    a prefix below 1, or with churn, is refused."""
    bench = load_benchmark()
    nodes, pods = bench.load(multi_gpu_trace)
    order = bench.workload(pods, sum(n.gpus for n in nodes), 42)
    for prefix in (1, 25, 70):
        gpu_pods = sum(1 for p in order[:prefix] if p.gpus)
        results = bench.run_seed(42, ("bestfit", "gpu-aware-sharing"), str(multi_gpu_trace),
                                 1, 0.0, prefix=prefix)
        timed = {r.policy: len(r.pod_ms) for r in results if r.pod_ms}
        assert timed == {"bestfit": gpu_pods, "gpu-aware-sharing": gpu_pods}, prefix
    whole = bench.run_seed(42, ("bestfit",), str(multi_gpu_trace), 1, 0.0)
    assert len(whole[-1].pod_ms) == sum(1 for p in order if p.gpus) > gpu_pods
    for bad, churn in ((0, None), (-3, None), (10, bench.Churn())):
        with pytest.raises(ValueError, match=r"pods .*above 0.*not with churn"):
            bench.run([42], ("bestfit",), data=multi_gpu_trace, churn=churn, prefix=bad)


def load_churn_detail() -> ModuleType:
    """``benchmarks/churn_detail.py`` (it imports ``packing`` as the scripts do)."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    import churn_detail

    return churn_detail


def test_churn_detail_says_why_a_gpu_pod_fits_nowhere() -> None:
    detail = load_churn_detail()
    spec = detail.packing.PodSpec
    one, half = spec("one", 8000, 1000, 1, 1000), spec("half", 8000, 1000, 1, 500)
    # (free CPU, free memory, free milli-GPUs per GPU) per node
    assert detail.why_failed([(64_000, 9000, [600, 0])], one) == "no-gpu-room"
    assert detail.why_failed([(4000, 9000, [1000]), (64_000, 9000, [0])], one) == "cpu"
    assert detail.why_failed([(64_000, 500, [1000])], one) == "memory"
    assert detail.why_failed([(4000, 500, [1000])], one) == "cpu+memory"
    assert detail.why_failed([(4000, 9000, [1000]), (64_000, 500, [600])], half) == "cpu"
    assert detail.why_failed([(64_000, 9000, [400])], half) == "no-gpu-room"


def test_churn_detail_accounts_for_every_gpu(multi_gpu_trace: Path) -> None:
    """What stays placed and what is free (on partly used or whole free GPUs) add up to
    the cluster's GPUs at every reading (FGD books exactly the milli-GPUs asked); the
    run's figure is ``packing.py --churn``'s."""
    detail = load_churn_detail()
    out = detail.detail("fgd", 42, every=1, lifetimes="exp", steady=100.0, every_pods=5,
                        data=multi_gpu_trace)
    assert out["readings"] > 0
    placed = out["placed, % of GPUs, by class and lifetime"]
    free = out["free, % of GPUs, by where"]
    by_class = sum(v for k, v in placed.items() if " " not in k)
    assert by_class + sum(free.values()) == pytest.approx(100.0, abs=0.05)
    assert sum(v for k, v in placed.items() if " " in k) == pytest.approx(by_class, abs=0.05)
    for reasons in out["GPU pods failed after the steady mark, by class and why"].values():
        assert set(reasons) <= {"no-gpu-room", "cpu", "memory", "cpu+memory"}
    bench = detail.packing
    churn = bench.Churn(lifetimes="exp")
    results = bench.run_seed(42, ["fgd"], str(multi_gpu_trace), 1, 0.0, churn=churn)
    assert out["time-weighted alloc after 100 %"] == pytest.approx(results[0].churn_mean, abs=0.01)
