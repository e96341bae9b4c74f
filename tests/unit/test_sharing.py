"""core/sharing: resource families, validation, per-GPU fit, the pod annotation."""

from __future__ import annotations

import json
import math
import random

import pytest

from gpuk8s.core import sharing as s
from gpuk8s.core.model import index_by_id, stable_gpu_id


def test_sgpu_family_defaults_and_units() -> None:
    share = s.parse_share(
        {"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "50", "metax-tech.com/vmemory": "8"}
    )
    assert share == s.ShareRequest(s.MODE_SGPU, 1, 50, 8 * 1024)
    # HAMi's rule: a suffix means bytes, a bare number GiB
    share = s.parse_share({"metax-tech.com/sgpu": "2", "metax-tech.com/vmemory": "2048Mi"})
    assert share == s.ShareRequest(s.MODE_SGPU, 2, 0, 2048)
    full = s.parse_share({"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 100})
    assert full is not None and full.exclusive
    # the counted resource is required: without it the kubelet never calls Allocate
    with pytest.raises(s.SharingError, match=r"'metax-tech.com/sgpu'\]: required with "
                       r"metax-tech.com/vcore: the number of shared GPUs, 1 to 64"):
        s.parse_share({"metax-tech.com/vcore": "50"})
    assert s.parse_share({"metax-tech.com/gpu": "1", "cpu": "2"}) is None


def test_vcuda_family_fraction_and_whole_gpus() -> None:
    share = s.parse_share({"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "4"})
    assert share == s.ShareRequest(s.MODE_VCUDA, 1, 30, 4 * 256)
    whole = s.parse_share({"tencent.com/vcuda-core": "400"})
    assert whole == s.ShareRequest(s.MODE_VCUDA, 4, 100, 0, whole=True)
    with pytest.raises(s.SharingError, match=r"vcuda-core.*1-99.*multiple of 100.*got 150"):
        s.parse_share({"tencent.com/vcuda-core": "150"})
    with pytest.raises(s.SharingError, match=r"vcuda-core.*required.*1-99.*multiple of 100"):
        s.parse_share({"tencent.com/vcuda-memory": "4"})


def test_mps_family() -> None:
    share = s.parse_share({"nvidia.com/mps-core": "25", "nvidia.com/mps-memory": "1Gi"})
    assert share == s.ShareRequest(s.MODE_MPS, 1, 25, 1024)
    with pytest.raises(s.SharingError, match=r"mps-core.*1 to 100, got '101'"):
        s.parse_share({"nvidia.com/mps-core": "101"})
    # 0 ids: the kubelet would not call Allocate, and the container would get no GPU; the
    # accelerator manual allows 0 %, so the refusal says why
    with pytest.raises(s.SharingError, match=r"mps-core.*1 to 100, got '0': the kubelet calls "
                       r"the device plugin's Allocate only for a positive count.*without any "
                       r"GPU; for no compute limit ask for 100"):
        s.parse_share({"nvidia.com/mps-core": "0"})
    assert "%" not in s.ZERO_COUNT_WHY  # kube-scheduler formats the extender's reasons
    with pytest.raises(s.SharingError, match=r"mps-core'\]: required with nvidia.com/mps-memory"):
        s.parse_share({"nvidia.com/mps-memory": "1Gi"})


@pytest.mark.parametrize(
    ("limits", "match"),
    [
        ({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "abc"},
         r"\['metax-tech.com/vcore'\]"),
        ({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "-5"}, "vcore.*negative"),
        ({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "12.5"}, "vcore.*whole percent"),
        ({"metax-tech.com/sgpu": "0"}, "sgpu.*1 to 64, got 0: the kubelet calls"),
        ({"metax-tech.com/vcore": "5", "nvidia.com/mps-core": "5"}, "mixes sharing families"),
        ({"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": True}, "vcore.*quantity"),
        ({"tencent.com/vcuda-core": "0"}, "vcuda-core.*1-99.*got 0: the kubelet calls"),
    ],
)
def test_bad_requests_name_the_field(limits: dict[str, object], match: str) -> None:
    with pytest.raises(s.SharingError, match=match):
        s.parse_share(limits)


def test_pod_share_one_container() -> None:
    a = ("a", {"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "10"}, {},
         "spec.containers[0]")
    b = ("b", {}, {"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "20"},
         "spec.initContainers[0]")
    c = ("c", {}, {}, "spec.containers[1]")
    assert s.pod_share([a, c]) == s.ShareRequest(s.MODE_SGPU, 1, 10, 0, container="a")
    with pytest.raises(s.SharingError, match=r"spec.containers\[0\] and "
                       r"spec.initContainers\[0\] ask for shared GPUs; one container"):
        s.pod_share([a, b])


# -- one quantity grammar for GPU memory (issue 26, item 3) ---------------------------------
@pytest.mark.parametrize(
    ("value", "mib"),
    [("1000", 1000 * 1024), ("1e3", 1000 * 1024), ("1k", 1000 * 1024), ("1E3", 1000 * 1024),
     ("0.5", 512), ("500m", 512), (".5", 512), ("8", 8192), (8, 8192), ("+8", 8192),
     ("2048Mi", 2048), ("2Gi", 2048), ("1Ki", 1), ("1536Ki", 2), ("0", 0),
     ("1e-9", 1)],  # 1e-9 GiB is one byte: rounded up to 1 MiB
)
def test_memory_is_one_kubernetes_quantity_grammar(value: object, mib: int) -> None:
    # the number is read as Kubernetes reads it (1000 = 1e3 = 1k); without a binary
    # suffix it counts GiB, with one it is bytes. Before: "1e3" and "1k" were 1 MiB
    # (bytes), "0.5" 1 MiB
    assert s.memory_mib(value, "vmemory") == mib
    limits = {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": value}
    share = s.parse_share(limits)
    assert share is not None and share.memory_mib == mib
    mps = s.parse_share({"nvidia.com/mps-core": "10", "nvidia.com/mps-memory": value})
    assert mps is not None and mps.memory_mib == mib


def test_vcuda_memory_counts_256_mib_units_in_the_same_grammar() -> None:
    for value, mib in (("16", 4096), ("1k", 256_000), ("1e3", 256_000), ("0.5", 128),
                       ("4Gi", 4096), ("100Mi", 100)):
        share = s.parse_share({"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": value})
        assert share is not None and share.memory_mib == mib, value


@pytest.mark.parametrize("value", ["8G", "2M", "1E"])
def test_decimal_suffixes_multiply_the_unit_and_absurd_amounts_are_refused(value: str) -> None:
    # 8G is 8 x 10^9 GiB, not 8 GB: refused with the rule spelled out
    with pytest.raises(s.SharingError, match=r"vmemory'\]: .* more than 1 PiB per GPU; a number "
                       r"without a binary suffix counts GiB .* binary suffix \(8Gi, 512Mi\)"):
        s.parse_share({"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": value})


def test_sharing_in_init_and_sidecar_containers_counts() -> None:
    ask = {"metax-tech.com/sgpu": "1", "metax-tech.com/vcore": "30"}
    for kind in ({}, {"restartPolicy": "Always"}):
        pod = {"spec": {"initContainers": [{"name": "warm", "resources": {"limits": ask},
                                            **kind}],
                        "containers": [{"name": "main"}]}}
        share = s.pod_share_json(pod)
        assert share == s.ShareRequest(s.MODE_SGPU, 1, 30, 0, container="warm"), kind
    twice = {"spec": {"initContainers": [{"name": "warm", "resources": {"limits": ask}}],
                      "containers": [{"name": "main", "resources": {"requests": ask}}]}}
    with pytest.raises(s.SharingError, match="one container per pod"):
        s.pod_share_json(twice)


@pytest.mark.parametrize(
    ("whole", "share"),
    [("metax-tech.com/gpu", {"metax-tech.com/sgpu": "1"}),
     ("nvidia.com/gpu", {"tencent.com/vcuda-core": "30"}),
     ("nvidia.com/gpu", {"nvidia.com/mps-core": "30"}),
     ("metax-tech.com/gpu", {"tencent.com/vcuda-core": "200"})],
)
def test_whole_and_shared_gpus_in_one_pod_are_refused_alike(
    whole: str, share: dict[str, str]
) -> None:
    # before: vcuda-core beside nvidia.com/gpu was accepted, sgpu beside metax-tech.com/gpu
    # refused (and only by gpu-aware's filter)
    for where in ("same", "other"):
        containers = [{"name": "a", "resources": {"limits": {**share}}}]
        if where == "same":
            containers[0]["resources"]["limits"][whole] = "1"
        else:
            containers.append({"name": "b", "resources": {"limits": {whole: "1"}}})
        with pytest.raises(s.SharingError, match=rf"\['{whole}'\]: whole GPUs, and "
                           r"spec.containers\[0\] asks for shared GPUs .*not both"):
            s.pod_share_json({"spec": {"containers": containers}})
    zero = {"spec": {"containers": [{"name": "a", "resources": {"limits": {**share,
                                                                            whole: "0"}}}]}}
    assert s.pod_share_json(zero) is not None  # 0 whole GPUs is asking for none


def test_fit_and_best_fit() -> None:
    caps = [s.GpuCapacity(0, 65536), s.GpuCapacity(1, 65536), s.GpuCapacity(2, 65536)]
    half = s.ShareRequest(s.MODE_SGPU, 1, 50, 1024)
    usage: dict[int, s.GpuUsage] = {}
    # first pod: lowest index; second: onto the already-shared GPU
    chosen = s.choose_shared(caps, usage, half).gpus
    assert chosen == [0]
    usage.setdefault(0, s.GpuUsage()).add(half)
    usage.setdefault(1, s.GpuUsage()).add(s.ShareRequest(s.MODE_SGPU, 1, 70, 0))
    chosen = s.choose_shared(caps, usage, s.ShareRequest(s.MODE_SGPU, 1, 30, 0)).gpus
    assert chosen == [1]  # best fit: 0 % left on GPU 1, 20 % on GPU 0
    usage[0].add(half)
    assert s.fits(caps[0], usage[0], half) == "0 percent compute left, the pod needs 50 percent"
    excl = s.ShareRequest(s.MODE_SGPU, 1, 100, 0)
    assert "exclusively" in (s.fits(caps[1], usage[1], excl) or "")
    big = s.ShareRequest(s.MODE_SGPU, 1, 10, 70000)
    assert "MiB memory left" in (s.fits(caps[2], None, big) or "")
    chosen, why, _, _ = s.choose_shared(caps, usage, s.ShareRequest(s.MODE_SGPU, 2, 90, 0))
    assert chosen is None and "1 of 3 GPU(s)" in why
    nomem = s.GpuCapacity(3, None)
    assert "memory unknown" in (s.fits(nomem, None, half) or "")
    slots = s.GpuCapacity(4, None, slots=1)
    used = s.GpuUsage()
    used.add(s.ShareRequest(s.MODE_SGPU, 1, 0, 0))
    assert "slots" in (s.fits(slots, used, s.ShareRequest(s.MODE_SGPU, 1, 0, 0)) or "")


def test_reasons_are_safe_as_a_go_format_string() -> None:
    """kube-scheduler's event recorder formats the extender's reason (Eventf): a '%' in
    it was garbled on the lab ('0%!c(MISSING)ompute left'). No reason carries one."""
    full = s.GpuUsage()
    full.add(s.ShareRequest(s.MODE_SGPU, 1, 60, 0))
    reasons = [
        s.fits(s.GpuCapacity(0, 65536), full, s.ShareRequest(s.MODE_SGPU, 1, 50, 0)),
        s.fits(s.GpuCapacity(0, 65536, healthy=False), None, s.ShareRequest(s.MODE_SGPU, 1, 5, 0)),
        s.fits(s.GpuCapacity(0, 1024), None, s.ShareRequest(s.MODE_SGPU, 1, 5, 4096)),
        s.fits(s.GpuCapacity(0, 65536), full, s.ShareRequest(s.MODE_SGPU, 1, 100, 0)),
        s.choose_shared([s.GpuCapacity(0, 65536)], {0: full},
                        s.ShareRequest(s.MODE_SGPU, 1, 50, 0))[1],
    ]
    assert all(reasons), reasons
    assert not [r for r in reasons if r and "%" in r], reasons
    assert "40 percent compute left, the pod needs 50 percent" in str(reasons[0])


def test_assignment_round_trip_and_rebuild() -> None:
    a = s.Assignment("n1", (0,), s.ShareRequest(s.MODE_SGPU, 1, 50, 2048, container="c"))
    b = s.Assignment("n1", (0, 1), s.ShareRequest(s.MODE_SGPU, 2, 25, 0))
    assert s.parse_assignment(a.to_json()) == a
    usage = s.usage_from_assignments([a, b])
    assert usage["n1"][0].core == 75 and usage["n1"][0].shares == 2
    assert usage["n1"][1].core == 25 and usage["n1"][0].memory_mib == 2048
    assert s.parse_assignment(None) is None


UUID5 = "GPU-229b3f47-d17d-b38a-0cd6-ebe34d285343"
UUID6 = "GPU-e6b8cde0-4b40-e5c1-a8f1-930b57a23499"


def test_assignment_names_gpus_by_stable_id_and_finds_them_after_a_renumbering() -> None:
    a = s.Assignment("n1", (5, 6), s.ShareRequest(s.MODE_SGPU, 2, 25, 0), (UUID5, UUID6))
    raw = a.to_json()
    assert json.loads(raw)["ids"] == [UUID5, UUID6] and json.loads(raw)["gpus"] == [5, 6]
    assert s.parse_assignment(raw) == a
    before = index_by_id([(5, UUID5, "0000:85:00.0"), (6, UUID6, "0000:86:00.0")])
    assert a.current(before) == (5, 6)
    # GPU 3 left the bus: discovery numbers the two cards 4 and 5 now
    after = index_by_id([(4, UUID5, "0000:85:00.0"), (5, UUID6, "0000:86:00.0")])
    assert a.current(after) == (4, 5)
    assert a.current(index_by_id([(4, UUID5, "0000:85:00.0")])) == (4,)  # 6's card left
    assert a.current(None) == (5, 6)  # no inventory at hand: the indexes as written
    usage = s.usage_from_assignments([a], {"n1": after})["n1"]
    assert sorted(usage) == [4, 5] and usage[4].core == usage[5].core == 25
    assert sorted(s.usage_from_assignments([a])["n1"]) == [5, 6]


def test_a_gpu_without_uuid_is_named_by_its_pci_address() -> None:
    gpus = index_by_id([(0, None, "0000:03:00.0"), (1, UUID5, "0000:04:00.0")])
    assert gpus == {"0000:03:00.0": 0, "0000:04:00.0": 1, UUID5: 1}
    assert stable_gpu_id(None, "0000:03:00.0") == "0000:03:00.0"
    assert stable_gpu_id(UUID5, "0000:04:00.0") == UUID5
    a = s.Assignment("n1", (0,), s.ShareRequest(s.MODE_MPS, 1, 30, 0), ("0000:03:00.0",))
    assert s.parse_assignment(a.to_json()) == a and a.current(gpus) == (0,)


def test_an_old_assignment_without_ids_is_read_by_index_as_is() -> None:
    raw = '{"container":"main","core":50,"gpus":[5],"memoryMiB":0,"mode":"sgpu","node":"n",' \
          '"whole":false}'
    old = s.parse_assignment(raw)
    assert old is not None and old.ids == () and old.gpus == (5,)
    assert old.to_json() == raw  # written back unchanged: no ids invented
    # read after a loss it is taken as it is: the documented ambiguity
    assert old.current(index_by_id([(5, UUID6, "0000:86:00.0")])) == (5,)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("{", "not JSON"),
        ('{"node":"n","mode":"mps","gpus":[0,1],"ids":["a"],"core":1,"memoryMiB":0,'
         '"whole":false}', "'ids' must be 2 distinct GPU ids"),
        ('{"node":"n","mode":"mps","gpus":[0,1],"ids":["a","a"],"core":1,"memoryMiB":0,'
         '"whole":false}', "'ids' must be 2 distinct"),
        ('{"node":"n","mode":"mps","gpus":[0],"ids":[3],"core":1,"memoryMiB":0,'
         '"whole":false}', "'ids' must be 1 distinct"),
        ('{"node":"n","mode":"mps","gpus":[0],"ids":"GPU-1","core":1,"memoryMiB":0,'
         '"whole":false}', "'ids' must be"),
        ('{"node":"n","mode":"mps","gpus":[0],"ids":["' + "x" * 65 + '"],"core":1,'
         '"memoryMiB":0,"whole":false}', "1-64 characters"),
        ("[]", "JSON object"),
        ('{"node":"n","mode":"x","gpus":[0],"core":1,"memoryMiB":0,"whole":false}', "mode"),
        ('{"node":"n","mode":"mps","gpus":[0,0],"core":1,"memoryMiB":0,"whole":false}', "gpus"),
        ('{"node":"n","mode":"mps","gpus":[0],"core":101,"memoryMiB":0,"whole":false}', "core"),
        ('{"node":"n","mode":"mps","gpus":[0],"core":true,"memoryMiB":0,"whole":false}', "core"),
    ],
)
def test_bad_assignment(raw: str, match: str) -> None:
    with pytest.raises(s.SharingError, match=match):
        s.parse_assignment(raw)


def test_mode_label_and_memory_label() -> None:
    assert s.check_mode(None) == s.MODE_EXCLUSIVE
    assert s.check_mode("mps") == s.MODE_MPS
    with pytest.raises(s.SharingError, match=r"gpuk8s.io/sharing-mode.*exclusive, sgpu"):
        s.check_mode("half")
    assert s.memory_label_mib("64GB") == 65536
    assert s.memory_label_mib("80GiB") == 81920
    assert s.memory_label_mib("bogus") is None


def test_env_per_mode_and_mps_paths() -> None:
    uuid = "GPU-1234-abcd"
    assert s.mps_pipe_dir(uuid) == "/run/gpuk8s/mps/GPU-1234-abcd/pipe"
    assert s.mps_log_dir(uuid) == "/run/gpuk8s/mps/GPU-1234-abcd/log"
    with pytest.raises(s.SharingError):
        s.mps_pipe_dir("../etc")
    mps = s.Assignment("n", (0,), s.ShareRequest(s.MODE_MPS, 1, 30, 2048))
    assert s.share_env(mps, [uuid]) == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/gpuk8s/mps/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M",
    }
    assert s.share_mounts(mps, [uuid]) == [
        ("/run/gpuk8s/mps/GPU-1234-abcd/pipe", "/run/gpuk8s/mps/pipe")
    ]
    vcuda = s.Assignment("n", (0,), s.ShareRequest(s.MODE_VCUDA, 1, 40, 1024))
    assert s.share_env(vcuda) == {
        "CUDA_DEVICE_SM_LIMIT": "40",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "1024m",
    }
    sgpu = s.Assignment("n", (2,), s.ShareRequest(s.MODE_SGPU, 1, 50, 4096))
    assert s.share_env(sgpu) == {"METAX_SGPU_COMPUTE": "50", "METAX_SGPU_MEMORY_MIB": "4096"}
    assert s.share_mounts(sgpu, []) == []


def test_node_fragmentation_is_fgds_measure_with_cpu() -> None:
    mix = s.ShareMix({(1, 50, 0, 0): 1.0, (1, 100, 4000, 8192): 1.0})
    # the 30 % left on GPU 1 is too little for the 50 % class and, being partly taken,
    # useless to the whole-GPU class: 30 stranded for each, half the weight each
    assert s.node_fragmentation([100, 30], s.NO_ROOM, mix) == pytest.approx(30.0)
    # 2 cores free: the whole-GPU class (4 cores) can use nothing here
    assert s.node_fragmentation([100, 30], s.Room(2000), mix) == pytest.approx(0.5 * 30 + 0.5 * 130)
    # ... and so it can with 4 GiB of memory free (it asks for 8)
    assert s.node_fragmentation([100, 30], s.Room(None, 4096), mix) == pytest.approx(
        0.5 * 30 + 0.5 * 130
    )
    assert s.node_fragmentation([100, 30], s.Room(8000, 8192), mix) == pytest.approx(30.0)
    # no GPU wholly free: the whole-GPU class strands everything
    assert s.node_fragmentation([60, 30], s.NO_ROOM, mix) == pytest.approx(0.5 * 30 + 0.5 * 90)
    assert s.node_fragmentation([0, 0], s.NO_ROOM, mix) == 0.0
    two = s.ShareMix({(2, 100, 0, 0): 1.0})
    assert s.node_fragmentation([100, 100, 100], s.NO_ROOM, two) == 0.0
    assert s.node_fragmentation([100, 40, 40], s.NO_ROOM, two) == pytest.approx(180.0)


def test_fill_stranded_is_what_a_node_filled_with_one_class_leaves_unused() -> None:
    """Each class fills the node alone: as many pods as its GPU slots, the free CPU and
    the free memory allow; what it cannot use of the free GPU capacity counts, weighted."""
    one = (1, 100, 4000, 0)
    eight = (8, 100, 100_000, 0)
    mix = s.ShareMix({one: 3.0, eight: 1.0})
    empty = [100] * 8
    # 128 cores: eight 1-GPU pods (32 cores) and one 8-GPU pod (100 cores) fit
    assert s.fill_stranded(empty, s.Room(128_000), mix) == pytest.approx(0.0)
    # 98 cores: the 8-GPU class can use nothing; fragmentation asks only whether one
    # pod of each class fits and sees the same loss -- but at 24 cores, where six
    # 1-GPU pods fit (two GPUs idle), fragmentation sees nothing of the 1-GPU loss
    assert s.fill_stranded(empty, s.Room(98_000), mix) == pytest.approx(0.25 * 800)
    assert s.fill_stranded(empty, s.Room(24_000), mix) == pytest.approx(0.75 * 200 + 0.25 * 800)
    assert s.node_fragmentation(empty, s.Room(24_000), mix) == pytest.approx(0.25 * 800)
    # fractional classes: slots per GPU; memory limits as CPU does; None limits nothing
    half = s.ShareMix({(1, 50, 0, 2048): 1.0})
    assert s.fill_stranded([100, 70, 40], s.NO_ROOM, half) == pytest.approx(60.0)
    assert s.fill_stranded([100, 70, 40], s.Room(None, 4096), half) == pytest.approx(110.0)
    assert s.fill_stranded([100, 100], s.Room(-1000, 0), half) == pytest.approx(200.0)
    assert s.fill_stranded([0, 0], s.Room(0, 0), mix) == 0.0


def test_fill_taken_is_the_difference_of_two_fill_stranded() -> None:
    """What the extender computes per pod without GPUs (from the classes whose pods the
    room left can no longer all feed) equals the plain difference, on random nodes."""
    rng = random.Random(7)
    for _ in range(500):
        mix = s.ShareMix({
            (rng.choice((1, 1, 2, 4, 8)) if pct >= 100 else 1, pct,
             rng.choice((0, 1000, 4000, 16_000, 90_000)),
             rng.choice((0, 2048, 65_536))): float(rng.randint(1, 9))
            for pct in (rng.choice((10, 25, 50, 100, 100)) for _ in range(rng.randint(1, 12)))
        })
        free = [rng.choice((0, 20, 50, 75, 100, 100)) for _ in range(rng.choice((1, 2, 4, 8)))]
        cpu = rng.choice((None, 0, 3000, 20_000, 100_000, 130_000))
        memory = rng.choice((None, 1024, 100_000, 600_000))
        room = s.Room(cpu, memory, rng.choice((0, 500, 4000, 40_000)), rng.choice((0, 4096)))
        before = s.filled(free, room, mix)
        assert before.lost == s.fill_stranded(free, room, mix)
        want = s.fill_stranded(free, room.after(), mix) - before.lost
        assert s.fill_taken(before, room.after(), mix) == pytest.approx(want, abs=1e-9)


def _scarcity(nodes: list[tuple[list[int], s.Room]], mix: s.ShareMix) -> dict[s.ShareClass, float]:
    """``whole_scarcity`` over ``nodes`` (free percents and room each)."""
    homes = [s.whole_homes(free, room, mix) for free, room in nodes]
    totals = [sum(column) for column in zip(*homes, strict=True)] if homes else []
    return s.whole_scarcity(totals, sum(sum(free) for free, _ in nodes), mix)


def _quarter(x: float) -> float:
    """``x`` rounded to quarter steps of a doubling, as ``whole_scarcity`` rounds."""
    return 2.0 ** (round(4 * math.log2(x)) / 4)


def test_poisson_tail_against_the_sum_of_its_terms() -> None:
    for mean in (0.3, 1.0, 3.5, 12.0, 40.0, 95.0):
        for k in (0, 1, 2, 5, 12, 30, 60, 120):
            pmf = [math.exp(-mean + n * math.log(mean) - math.lgamma(n + 1)) for n in range(k)]
            assert s.poisson_tail(mean, k) == pytest.approx(max(0.0, 1 - sum(pmf)), abs=1e-12)
    assert s.poisson_tail(0.0, 3) == 0.0 and s.poisson_tail(5.0, 0) == 1.0
    # far out either way: no overflow, no negative
    assert s.poisson_tail(5000.0, 10) == 1.0
    assert s.poisson_tail(10.0, 5000) == 0.0
    assert 0.49 < s.poisson_tail(5000.0, 5000) < 0.51


def test_whole_scarcity_is_the_chance_that_the_pods_to_come_need_every_home() -> None:
    """Half the pods ask 1 GPU, half 8: the free capacity is filled by about
    free / 4.5 pods, how many of them 8-GPU ones is Poisson with half that mean, and
    each needs a node with 8 GPUs free."""
    one, eight = (1, 100, 0, 0), (8, 100, 0, 0)
    mix = s.ShareMix({one: 1.0, eight: 1.0})
    empty = ([100] * 8, s.NO_ROOM)
    broken = ([100] * 7 + [0], s.NO_ROOM)
    # 4 empty nodes: 32 GPUs, 3.6 8-GPU pods to come for 4 homes: breaking one costs
    # a pod with a chance under the class's share (a half): no factor
    assert s.poisson_tail(32 / 4.5 / 2, 4) < 0.5
    assert _scarcity([empty] * 4, mix) == {}
    # 3 of them broken by a 1-GPU pod each: 3.2 8-GPU pods to come, 1 home left
    factors = _scarcity([empty] + [broken] * 3, mix)
    assert one not in factors
    chance = 1 - math.exp(-29 / 4.5 / 2)
    assert factors[eight] == pytest.approx(_quarter(chance / 0.5))
    # no home left at all: nothing to break, no factor
    assert eight not in _scarcity([broken] * 4, mix)
    # a mix without whole-GPU classes has no factors
    assert _scarcity([empty], s.ShareMix({(1, 50, 0, 0): 1.0})) == {}


def test_whole_scarcity_of_a_rare_class_is_up_to_one_over_its_share() -> None:
    """8-GPU pods are 1 in 20: FGD weighs breaking their home by 1/20 of the 7 GPUs it
    strands. While the homes are many that is about right; when they are just enough,
    breaking one costs a pod with a chance of about a half, ten times as much; when they
    are too few, nearly twenty times."""
    one, eight = (1, 100, 0, 0), (8, 100, 0, 0)
    mix = s.ShareMix({one: 19.0, eight: 1.0})
    empty = ([100] * 8, s.NO_ROOM)
    per_pod = (19 + 8) / 20

    def factor(nodes: list[tuple[list[int], s.Room]]) -> float:
        return _scarcity(nodes, mix).get(eight, 1.0)

    # 100 empty nodes: 800 GPUs, 29.6 8-GPU pods to come for 100 homes
    assert factor([empty] * 100) == 1.0
    # 30 homes, and 570 GPUs free on one-GPU nodes (no home): 30.0 8-GPU pods to come
    singles = [([100], s.NO_ROOM)] * 570
    to_come = 810 / per_pod / 20
    assert 0.4 < s.poisson_tail(to_come, 30) < 0.6
    assert factor([empty] * 30 + singles) == pytest.approx(
        _quarter(s.poisson_tail(to_come, 30) / 0.05)
    )
    assert 8 < factor([empty] * 30 + singles) < 12
    # 10 homes for 24.1 pods to come: nearly 1 / 0.05
    assert factor([empty] * 10 + singles) == pytest.approx(
        _quarter(20 * s.poisson_tail(650 / per_pod / 20, 10))
    )
    assert factor([empty] * 10 + singles) > 16
    # more homes never weigh more
    got = [factor([empty] * n + singles) for n in (10, 20, 30, 40, 60)]
    assert got == sorted(got, reverse=True)


def test_whole_scarcity_counts_the_cpu_and_memory_that_feed_a_home() -> None:
    """8-GPU pods asking 120 cores fit only on 128-core nodes; those asking 60 fit on
    96-core nodes too: they count together with the 120-core ones, whose homes are
    theirs too, and a shortage of that pair weighs on both classes."""
    big, small, one = (8, 100, 120_000, 0), (8, 100, 60_000, 0), (1, 100, 0, 0)
    mix = s.ShareMix({big: 1.0, small: 1.0, one: 2.0})
    rich = ([100] * 8, s.Room(128_000, None))
    poor = ([100] * 8, s.Room(96_000, None))
    assert len(mix.wholes) == 3
    wholes = {mix.classes[at][0]: n for n, at in enumerate(mix.wholes)}
    assert s.whole_homes(*rich, mix)[wholes[big]] == 1
    assert s.whole_homes(*poor, mix)[wholes[big]] == 0
    assert s.whole_homes(*poor, mix)[wholes[small]] == 1
    starved = s.whole_homes([100] * 8, s.Room(50_000, None), mix)
    assert starved[wholes[big]] == starved[wholes[small]] == 0
    hungry = s.ShareMix({(8, 100, 0, 4096): 1.0})
    assert s.whole_homes([100] * 8, s.Room(128_000, 1024), hungry) == (0,)
    # 32 GPUs free: 32 / 4.5 pods to come, a quarter of them (Poisson mean) 120-core
    # 8-GPU pods with 2 homes, a half 8-GPU pods of either kind with 4 homes
    to_come = 32 / 4.5
    big_alone = _quarter(s.poisson_tail(to_come / 4, 2) / 0.25)
    assert s.poisson_tail(to_come / 2, 4) < 0.5  # both together: no factor
    assert _scarcity([rich, rich, poor, poor], mix) == {big: big_alone}
    # another pod took CPU from a 128-core node: 1 home left for the 120-core pods
    taken = ([100] * 8, s.Room(100_000, None))
    got = _scarcity([rich, taken, poor, poor], mix)
    assert got == {big: _quarter(s.poisson_tail(to_come / 4, 1) / 0.25)}
    assert got[big] > big_alone
    # and from a 96-core one: 3 homes for the pods of both classes together; the
    # 120-core class is in that nest too and takes the larger factor of the two
    both = _quarter(s.poisson_tail(to_come / 2, 3) / 0.5)
    assert both > 1
    got = _scarcity([rich, rich, poor, ([100] * 8, s.Room(50_000, None))], mix)
    assert got == {small: both, big: max(both, big_alone)}


def test_scaled_mix_weighs_breaking_a_scarce_home_more() -> None:
    one, eight = (1, 100, 0, 0), (8, 100, 0, 0)
    mix = s.ShareMix({one: 9.0, eight: 1.0})
    assert mix.scaled({one: 1.0, eight: 1.0}) is mix
    scaled = mix.scaled({eight: 3.0})
    empty, broken = [100] * 8, [100] * 7 + [0]
    # taking one GPU of an empty 8-GPU node strands the other 7 for the 8-GPU class
    rise = s.node_fragmentation(broken, s.NO_ROOM, mix) - s.node_fragmentation(
        empty, s.NO_ROOM, mix
    )
    assert rise == pytest.approx(0.1 * 700)
    rise = s.node_fragmentation(broken, s.NO_ROOM, scaled) - s.node_fragmentation(
        empty, s.NO_ROOM, scaled
    )
    assert rise == pytest.approx(3 * 0.1 * 700)
    # the original is untouched, the rest shared
    assert s.node_fragmentation(broken, s.NO_ROOM, mix) == pytest.approx(70.0)
    assert scaled.classes == mix.classes and scaled.prices is mix.prices


def test_scaled_mix_weighs_starving_a_scarce_home_more() -> None:
    """Taking the CPU an 8-GPU pod of 120 cores needs leaves the node's 8 GPUs to the
    other classes: with the class's weight tripled, that costs three times as much."""
    big, one = (8, 100, 120_000, 0), (1, 100, 4_000, 0)
    mix = s.ShareMix({big: 1.0, one: 9.0})
    scaled = mix.scaled({big: 3.0})
    free = [100] * 8
    for m, weight in ((mix, 0.1), (scaled, 0.3)):
        fed = s.node_fragmentation(free, s.Room(128_000, None), m)
        starved = s.node_fragmentation(free, s.Room(100_000, None), m)
        assert starved - fed == pytest.approx(weight * 800)


def test_cpu_balance_is_the_cpu_a_node_keeps_off_its_gpus_needs() -> None:
    # 150 % of GPU free, 16 cores per GPU asked: 24 cores would be in step
    assert s.cpu_balance(150, s.Room(24_000), 16_000) == pytest.approx(0.0)
    # too little: 12 cores short, each counting BALANCE_SHORT cores
    assert s.BALANCE_SHORT > 1
    assert s.cpu_balance(150, s.Room(12_000), 16_000) == pytest.approx(12.0 * s.BALANCE_SHORT)
    assert s.cpu_balance(150, s.Room(56_000), 16_000) == pytest.approx(32.0)  # too much
    # the same distance either way: short costs more than over
    assert s.cpu_balance(150, s.Room(20_000), 16_000) > s.cpu_balance(150, s.Room(28_000), 16_000)
    # nothing known, or (almost) no GPU capacity left: no balance to keep
    assert s.cpu_balance(150, s.NO_ROOM, 16_000) == 0.0
    assert s.cpu_balance(150, s.Room(24_000), None) == 0.0
    assert s.cpu_balance(s.BALANCE_MIN_FREE, s.Room(90_000), 16_000) == 0.0
    assert s.ShareMix({(1, 50, 0, 0): 1.0}).cpu_per_gpu is None
    assert s.ShareMix({(1, 50, 0, 0): 1.0}, cpu_per_gpu=8000.0).cpu_per_gpu == 8000.0


def test_choose_shared_keeps_room_the_mix_can_use() -> None:
    """Best fit would squeeze the 30 % pod next to a 50 % one (20 % left, too little
    for the 50 % pods that arrive); FGD leaves that GPU for a 50 % pod."""
    caps = [s.GpuCapacity(0, 65536), s.GpuCapacity(1, 65536)]
    usage = {0: s.GpuUsage(), 1: s.GpuUsage()}
    usage[0].add(s.ShareRequest(s.MODE_SGPU, 1, 50, 0))
    usage[1].add(s.ShareRequest(s.MODE_SGPU, 1, 20, 0))
    small = s.ShareRequest(s.MODE_SGPU, 1, 30, 0)
    assert s.choose_shared(caps, usage, small)[0] == [0]  # best fit
    mix = s.ShareMix({(1, 50, 0, 0): 1.0})
    chosen, _, rise, waste = s.choose_shared(caps, usage, small, mix=mix)
    assert chosen == [1] and rise == pytest.approx(0.0) and waste == pytest.approx(0.0)
    # the pod's own CPU counts: a node left with too little CPU strands its GPUs
    cpu_mix = s.ShareMix({(1, 50, 3000, 0): 1.0})
    rise = s.choose_shared(caps, usage, small, mix=cpu_mix, room=s.Room(4000, None, 2000)).rise
    assert rise == pytest.approx(50 + 50)  # both GPUs' 50 % left, useless without CPU


def test_choose_shared_follows_the_mix_packing_before_fragmentation() -> None:
    """A 50 % share, with one GPU holding 20 % and another 32 %, for a mix of 32 %
    shares (three to a GPU), 20 % (five) and 50 % (two). FGD alone takes the 32 % GPU:
    18 % left that no class uses, against 30 % left on the other, which the 32 % and
    50 % classes cannot use (24 % expected). The LP packing of the mix prices the 32 %
    share at a third of a GPU, the 20 % at a fifth, the 50 % at a half: beside the 32 %
    one the share loses a sixth of a GPU for good, beside the 20 % one a tenth (a 20 %
    share still fits), so that GPU is chosen."""
    caps = [s.GpuCapacity(0, 65536), s.GpuCapacity(1, 65536)]
    usage = {0: s.GpuUsage(), 1: s.GpuUsage()}
    usage[0].add(s.ShareRequest(s.MODE_SGPU, 1, 20, 0))
    usage[1].add(s.ShareRequest(s.MODE_SGPU, 1, 32, 0))
    mix = s.ShareMix({(1, 32, 0, 0): 3.0, (1, 20, 0, 0): 1.0, (1, 50, 0, 0): 1.0})
    assert mix.prices.price == pytest.approx({20: 0.2, 32: 1 / 3, 50: 0.5})
    half = s.ShareRequest(s.MODE_SGPU, 1, 50, 0)
    chosen = s.choose_shared(caps, usage, half, mix=mix)
    assert chosen.gpus == [0]
    assert chosen.waste == pytest.approx(0.1)
    assert chosen.rise == pytest.approx(24.0)  # 30 % the 32 % and 50 % shares cannot use
    # FGD's own measure prefers the other GPU: what the waste overrules
    after_1 = s.node_fragmentation([80, 18], s.NO_ROOM, mix)
    after_0 = s.node_fragmentation([30, 68], s.NO_ROOM, mix)
    assert after_1 == pytest.approx(18.0) and after_0 == pytest.approx(24.0)
    assert s.ShareMix({(1, 100, 0, 0): 1.0}).prices.price == {}  # whole GPUs: no prices


def test_share_mix_prices_only_the_heaviest_sizes() -> None:
    """The LP's time grows steeply with the number of share sizes: a mix of 64 sizes
    (a cluster where every pod asks its own percent) prices the ``PRICED_SIZES``
    heaviest, and the lighter ones are worth nothing in it."""
    weights = {(1, pct, 0, 0): float(pct) for pct in range(30, 94)}  # 64 sizes
    mix = s.ShareMix(weights)
    assert len(mix.classes) == 64
    assert sorted(mix.prices.price) == list(range(94 - s.PRICED_SIZES, 94))
    assert mix.prices.waste(100, 30) == pytest.approx(mix.prices.reach[100] - mix.prices.reach[70])
