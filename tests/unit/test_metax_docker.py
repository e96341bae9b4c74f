"""metax-docker without a docker daemon: docker's flag grammar, ``--gpus`` selection on a
simulated host, the edits (compared with the device plugin's), and the wrapper as a process
in front of a recording stand-in ``docker`` (tests/unit/fake_docker.py) found on PATH —
which shows what reaches docker, and that bad input reaches nothing. The real dockerd is in
tests/integration/test_metax_docker.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import sim
from gpuk8s.core.cdi import SdkSource, sdk_edits
from gpuk8s.core.model import NodeInventory
from gpuk8s.discovery import check_health, discover
from gpuk8s.metax_docker import dockerargs as da
from gpuk8s.metax_docker import plan as mp
from gpuk8s.metax_docker.selection import GpuRequest, parse_request, select, units_of
from gpuk8s.services.node.devices import AllocateOptions, DeviceSet

REPO = Path(__file__).resolve().parents[2]
PY38 = "/root/.pyenv/versions/3.8.18/bin/python"
pytestmark = pytest.mark.usefixtures("fast_python3")


# -- docker's grammar ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,options,image,command",
    [
        (["-it", "--rm", "--gpus=all", "img", "sh", "-c", "x --gpus 3"],
         ["-it", "--rm"], "img", ["sh", "-c", "x --gpus 3"]),
        (["--gpus", "all", "-e", "A=1", "-v", "/a:/b", "--name", "x", "img"],
         ["-e", "A=1", "-v", "/a:/b", "--name", "x"], "img", []),
        # a value flag at the end of a short group takes the next argument ...
        (["-itp", "8080:80", "--gpus", "2", "img"], ["-itp", "8080:80"], "img", []),
        # ... or the rest of its group
        (["-itp8080:80", "--gpus", "2", "img", "-p"], ["-itp8080:80"], "img", ["-p"]),
        (["-e=X=1", "--rm=false", "-i=true", "--gpus=1", "img"],
         ["-e=X=1", "--rm=false", "-i=true"], "img", []),
        (["--entrypoint=sh", "--gpus", "[0]", "--", "img", "-c", "x"],
         ["--entrypoint=sh"], "img", ["-c", "x"]),
        # -h is --hostname here: it takes a value that looks like an image
        (["-h", "node1", "--gpus", "1", "-w", "/w", "img"], ["-h", "node1", "-w", "/w"], "img", []),
        # --net and --dns-opt: hidden aliases that take values
        (["--net", "none", "--dns-opt", "ndots:1", "--maca-force", "img"],
         ["--net", "none", "--dns-opt", "ndots:1"], "img", []),
    ],
)
def test_parse_run_finds_the_image(
    args: list[str], options: list[str], image: str, command: list[str]
) -> None:
    run = da.parse_run(args)
    assert list(run.options) == options
    assert run.image == image
    assert list(run.command) == command
    assert run.wrapper.given


def test_wrapper_flags_after_the_image_belong_to_the_container() -> None:
    run = da.parse_run(["--rm", "img", "--gpus", "all", "--maca-force"])
    assert not run.wrapper.given
    assert run.command == ("--gpus", "all", "--maca-force")


def test_wrapper_options_and_rebuild() -> None:
    run = da.parse_run(["-d", "--gpus", "[1,3]", "--maca=/sdk", "--maca-force", "--", "img", "x"])
    assert run.wrapper == da.WrapperOptions("[1,3]", "/sdk", True)
    # ours first: a user's own -e given later wins in docker
    assert run.rebuild(["--env", "A=1"]) == ["--env", "A=1", "-d", "--", "img", "x"]


def test_option_value_reads_docker_values() -> None:
    run = da.parse_run(["-it", "--platform", "linux/arm64", "--pull=never", "img"])
    assert run.option_value("--platform") == "linux/arm64"
    assert run.option_value("--pull") == "never"
    assert run.option_value("--name") is None


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gpus", "1", "--gpus", "2", "img"], "--gpus is given twice"),
        (["--maca-force=true", "img"], "--maca-force takes no value"),
        (["--rm", "--gpus"], "--gpus needs a value"),
        (["--maca"], "--maca needs a value"),
    ],
)
def test_wrapper_flag_misuse(args: list[str], needle: str) -> None:
    with pytest.raises(da.UsageError, match=needle):
        da.parse_run(args)


def test_unknown_flags_are_looked_up() -> None:
    with pytest.raises(da.UnknownFlagError, match="--frobnicate"):
        da.parse_run(["--frobnicate", "x", "--gpus", "1", "img"])
    with pytest.raises(da.UnknownFlagError, match="-Z"):
        da.parse_run(["-iZ", "--gpus", "1", "img"])
    newer = da.help_flags(
        "Options:\n      --frobnicate string   New in docker 99\n"
        "  -Z, --zap                 A boolean\n      --rm      Remove\n"
    )
    run = da.parse_run(["--frobnicate", "x", "-iZ", "--gpus", "1", "img"],
                       da.chain(da.RUN_FLAGS, newer))
    assert run.options == ("--frobnicate", "x", "-iZ")
    assert run.image == "img"


@pytest.mark.parametrize(
    "argv,global_args,command,rest",
    [
        (["run", "--rm", "img"], [], ["run"], ["--rm", "img"]),
        (["-H", "unix:///x.sock", "--context=c", "-D", "container", "create", "img"],
         ["-H", "unix:///x.sock", "--context=c", "-D"], ["container", "create"], ["img"]),
        (["-DH", "unix:///x.sock", "run", "img"], ["-DH", "unix:///x.sock"], ["run"], ["img"]),
        (["--config", "/c", "ps", "-a"], ["--config", "/c"], ["ps"], ["-a"]),
        (["container", "ls"], [], ["container", "ls"], []),
        (["--bogus", "run", "img"], [], [], ["--bogus", "run", "img"]),
    ],
)
def test_split_invocation(
    argv: list[str], global_args: list[str], command: list[str], rest: list[str]
) -> None:
    inv = da.split_invocation(argv)
    assert (list(inv.global_args), list(inv.command), list(inv.args)) == (
        global_args, command, rest)


def test_creates_container() -> None:
    assert da.split_invocation(["container", "run", "x"]).creates_container
    assert da.split_invocation(["create", "x"]).creates_container
    assert not da.split_invocation(["exec", "x"]).creates_container


# -- --gpus ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("md") / "node")
    sim.create(root, "c500-8")
    return root


@pytest.fixture(scope="module")
def inventory(host: str) -> NodeInventory:
    return discover(host)


@pytest.mark.parametrize(
    "value,want",
    [
        ("all", GpuRequest(every=True)),
        ("3", GpuRequest(count=3)),
        ("[0,2]", GpuRequest(names=("0", "2"))),
        ("[ 0, C5001]", GpuRequest(names=("0", "C5001"))),
    ],
)
def test_parse_request(value: str, want: GpuRequest) -> None:
    assert parse_request(value) == want


@pytest.mark.parametrize(
    "value,needle",
    [
        ("", "empty"),
        ("[]", "the list is empty"),
        ("[0,]", "empty entry"),
        ("0", "at least one GPU"),
        ("device=0,1", "docker's NVIDIA syntax"),
        ('"device=0,1"', "docker's NVIDIA syntax"),
        ("count=2", "docker's NVIDIA syntax"),
        ("0,1", "--gpus '[0,1]'"),
        ("some", "use all, a count N"),
    ],
)
def test_parse_request_refuses(value: str, needle: str) -> None:
    with pytest.raises(da.UsageError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_request(value)


def chosen(inventory: NodeInventory, value: str, **kw: Any) -> list[int]:
    return [g.index for g in select(inventory, parse_request(value), **kw).gpus]


def test_select_forms(inventory: NodeInventory) -> None:
    gpus = inventory.gpus
    assert chosen(inventory, "all") == list(range(8))
    assert chosen(inventory, "2") == [0, 1]
    assert chosen(inventory, "[5,1]") == [1, 5]
    assert gpus[6].serial and gpus[2].uuid
    assert chosen(inventory, f"[{gpus[6].serial},{gpus[2].uuid},4]") == [2, 4, 6]


@pytest.mark.parametrize(
    "value,needle",
    [
        ("9", "--gpus 9: this host has 8 usable MetaX GPUs"),
        ("[9]", "no GPU '9' on this host (ids 0-7; serial numbers C500"),
        ("[C500NOPE]", "no GPU 'C500NOPE'"),
        ("[1,1]", "GPU 1 is named twice"),
    ],
)
def test_select_refuses(inventory: NodeInventory, value: str, needle: str) -> None:
    with pytest.raises(da.UsageError) as err:
        select(inventory, parse_request(value))
    assert needle in str(err.value)


def test_select_skips_or_refuses_gpus_without_device_nodes(tmp_path: Path) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    sim.fail(root, 2, "unbind")
    inv = discover(root)
    assert chosen(inv, "all") == [0, 1, 3, 4, 5, 6, 7]
    assert chosen(inv, "3") == [0, 1, 3]
    with pytest.raises(da.UsageError, match=r"GPU 2 .* has no device nodes"):
        select(inv, parse_request("[2]"))
    with pytest.raises(da.UsageError, match=r"7 usable MetaX GPUs \(left out: 1 without device "
                       r"nodes: GPU 2 \(is the metax driver bound\?\)\)"):
        select(inv, parse_request("8"))


def test_select_never_hands_out_an_unhealthy_gpu(tmp_path: Path) -> None:
    """mx-smi reports GPU 3 unavailable: the health check the device plugin uses says so,
    all / N skip it with a warning, naming it is refused."""
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    sim.fail(root, 3, "fault", reason="GPU hang detected")
    inv = discover(root)
    health = check_health(root, inv)
    assert health[3] == "GPU hang detected"
    every = select(inv, parse_request("all"), health=health)
    assert [g.index for g in every.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert every.warnings == (
        f"GPU 3 ({inv.gpu(3).pci_address}) is unhealthy, skipped: GPU hang detected",)
    four = select(inv, parse_request("4"), health=health)
    assert [g.index for g in four.gpus] == [0, 1, 2, 4] and len(four.warnings) == 1
    two = select(inv, parse_request("2"), health=health)  # GPU 3 would not have been used
    assert [g.index for g in two.gpus] == [0, 1] and two.warnings == ()
    with pytest.raises(da.UsageError, match=r"GPU 3 \(.*\) is unhealthy: GPU hang detected; "
                       r"name another GPU \(healthy: 0, 1, 2, 4, 5, 6, 7\)"):
        select(inv, parse_request("[1,3]"), health=health)
    with pytest.raises(da.UsageError, match=r"--gpus 8: this host has 7 usable MetaX GPUs "
                       r"\(left out: 1 unhealthy: GPU 3\)"):
        select(inv, parse_request("8"), health=health)
    assert chosen(inv, "[2,4]", health=health) == [2, 4]


def test_select_on_a_host_without_metax_gpus() -> None:
    with pytest.raises(da.UsageError, match="no MetaX GPU on this host"):
        select(NodeInventory(backend="none"), parse_request("all"))


# -- the edits: the device plugin's ----------------------------------------------------------
def test_edits_are_what_the_device_plugin_allocates(host: str, inventory: NodeInventory) -> None:
    gpus = select(inventory, parse_request("[3,1]")).gpus
    where = mp.Host(host, host)
    sdk = mp.sdk_source(where, None).source
    args = mp.container_edits(inventory, gpus, where, sdk, image_has_sdk=False)
    plugin = DeviceSet(
        inventory, "metax-tech.com/gpu", AllocateOptions(device_path_prefix=host, mount_sdk=True)
    ).container_spec([u.id for u in units_of(gpus)])
    assert sorted((n.path, n.host_path, n.permissions) for n in args.device_nodes) == sorted(
        plugin.devices)
    assert sorted((m.container_path, m.host_path, m.read_only) for m in args.mounts) == sorted(
        plugin.mounts)
    env = args.env_map()
    assert env["MACA_VISIBLE_DEVICES"] == plugin.envs["MACA_VISIBLE_DEVICES"] == "0,1"
    assert {k: v for k, v in plugin.envs.items() if k != "GPUK8S_DEVICE_IDS"} == env
    assert f"{host}/dev/dri/card4" in [n.host_path for n in args.device_nodes]


def test_image_sdk_wins_unless_forced(host: str, inventory: NodeInventory) -> None:
    where = mp.Host(host, host)
    sdk = mp.sdk_source(where, None).source
    gpus = select(inventory, parse_request("1")).gpus
    edits = mp.container_edits(inventory, gpus, where, sdk, image_has_sdk=True)
    assert [m.container_path for m in edits.mounts] == ["/opt/mxdriver"]
    assert "MACA_PATH" not in edits.env_map()
    assert edits.env_map()["MACA_VISIBLE_DEVICES"] == "0"


def test_sdk_source(host: str, tmp_path: Path) -> None:
    where = mp.Host(host, "/prefix")
    sdk = mp.sdk_source(where, None)
    assert sdk.source.paths == ("/opt/maca", "/opt/mxdriver")
    assert sdk.source.host_paths == ("/prefix/opt/maca", "/prefix/opt/mxdriver")
    assert sdk.local == (f"{host}/opt/maca", f"{host}/opt/mxdriver")
    # the simulator's mx-smi is in /opt/mxdriver/bin; its /opt/maca has no bin/
    assert sdk.bin_dirs(["/opt/maca", "/opt/mxdriver"]) == ["/opt/mxdriver/bin"]
    assert sdk.bin_dirs(["/opt/maca"]) == []
    (tmp_path / "sdk/bin").mkdir(parents=True)
    other = mp.sdk_source(where, str(tmp_path / "sdk"))
    assert other.source.host_paths == (str(tmp_path / "sdk"), "/prefix/opt/mxdriver")
    assert other.bin_dirs(["/opt/maca"]) == ["/opt/maca/bin"]
    missing = str(tmp_path / "no-such-sdk")  # not /nonexistent: a shared machine may have it
    with pytest.raises(da.UsageError, match=f"--maca {missing}: no such directory"):
        mp.sdk_source(where, missing)
    with pytest.raises(da.UsageError, match="no MXMACA SDK at /opt/maca"):
        mp.sdk_source(mp.Host(str(tmp_path)), None)


def test_host_from_env() -> None:
    assert mp.Host.from_env({}) == mp.Host("/", "")
    assert mp.Host.from_env({mp.ENV_ROOT: "/sim/"}) == mp.Host("/sim/", "/sim")
    assert mp.Host.from_env({mp.ENV_ROOT: "/sim", mp.ENV_PREFIX: ""}) == mp.Host("/sim", "")
    with pytest.raises(da.UsageError, match=mp.ENV_ROOT):
        mp.Host.from_env({mp.ENV_ROOT: "sim"})


def test_image_search_paths_are_extended_not_replaced() -> None:
    edits = sdk_edits(SdkSource(), "")
    image = ["PATH=/app/bin:/usr/bin", "LD_LIBRARY_PATH=/app/lib:/opt/maca/lib", "A=1"]
    env = mp.with_image_env(edits, image, ["/opt/maca/bin", "/opt/mxdriver/bin"]).env_map()
    assert env["LD_LIBRARY_PATH"] == "/opt/maca/lib:/opt/mxdriver/lib:/app/lib"
    assert env["PATH"] == "/app/bin:/usr/bin:/opt/maca/bin:/opt/mxdriver/bin"
    assert "A" not in env  # the rest of the image's environment is docker's to keep
    # an image without PATH: docker's default, then the SDK's
    env = mp.with_image_env(edits, [], ["/opt/mxdriver/bin"]).env_map()
    assert env["PATH"] == mp.DOCKER_DEFAULT_PATH + ":/opt/mxdriver/bin"
    assert env["LD_LIBRARY_PATH"] == "/opt/maca/lib:/opt/mxdriver/lib"
    # the image's SDK wins: its LD_LIBRARY_PATH is left alone, PATH still finds mx-smi
    own = edits.without_paths(["/opt/maca"])
    env = mp.with_image_env(own, image, ["/opt/mxdriver/bin"]).env_map()
    assert "LD_LIBRARY_PATH" not in env
    assert env["PATH"] == "/app/bin:/usr/bin:/opt/mxdriver/bin"


# -- the wrapper as a process, docker recorded -------------------------------------------------
READ_ONLY = ("version", "image", "container", "--help")  # docker calls that change nothing


class Wrapper:
    def __init__(self, tmp: Path, root: str) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        shutil.copy(REPO / "tests/unit/fake_docker.py", self.bin / "docker")
        (self.bin / "docker").chmod(0o755 | stat.S_IEXEC)
        self.log = tmp / "docker.log"
        self.cache = tmp / "cache"
        self.root = root

    def __call__(self, *args: str, python: str = sys.executable, stdin: str = "",
                 **env: str) -> subprocess.CompletedProcess[str]:
        self.log.write_text("")
        full = {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "FAKE_DOCKER_LOG": str(self.log),
            mp.ENV_ROOT: self.root,
            mp.ENV_CACHE: str(self.cache),
            "PYTHONPATH": str(REPO / "src"),
            **env,
        }
        return subprocess.run([python, "-m", "gpuk8s.metax_docker", *args], input=stdin,
                              capture_output=True, text=True, env=full, timeout=120, check=False)

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def commands(self) -> list[str]:
        """The docker commands called, without global options, in a stable order for the
        read-only ones (they run side by side): 'version', 'image inspect', 'create' ..."""
        names = []
        for call in self.calls():
            while call and call[0].startswith("-"):
                call = call[2:] if call[0] == "-H" else call[1:]
            names.append(" ".join(call[:2]) if call[0] in ("image", "container") else call[0])
        early = sorted(n for n in names if n in ("version", "image inspect"))
        return early + [n for n in names if n not in ("version", "image inspect")]

    def final(self) -> list[str]:
        return self.calls()[-1]


@pytest.fixture
def wrapper(tmp_path: Path, host: str) -> Wrapper:
    return Wrapper(tmp_path, host)


@pytest.mark.parametrize(
    "args",
    [["ps", "-a"], ["images"], ["exec", "-i", "c1", "sh"], ["run", "--rm", "img", "--gpus", "9"],
     ["-H", "unix:///other.sock", "container", "ls"], ["run", "--help"], ["--version"]],
)
def test_pass_through_is_unchanged(wrapper: Wrapper, args: list[str]) -> None:
    proc = wrapper(*args, stdin="hello\n", FAKE_DOCKER_RC="3")
    assert proc.returncode == 3, proc.stderr
    assert wrapper.calls() == [args]
    assert proc.stdout == "hello\n"  # stdin is docker's


def test_pass_through_imports_no_discovery(wrapper: Wrapper) -> None:
    """A command that only passes through loads the grammar, not discovery, the edits or
    dataclasses."""
    code = ("import sys; from gpuk8s.metax_docker import main; "
            "main.plan(['ps', '-a'], {}, 'docker'); "
            "print(sorted(m for m in sys.modules if m.startswith('gpuk8s')), "
            "'dataclasses' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, check=True)
    loaded = proc.stdout
    assert "gpuk8s.metax_docker.dockerargs" in loaded
    assert "gpuk8s.discovery" not in loaded and "gpuk8s.core.cdi" not in loaded
    assert loaded.split()[-1] == "False"  # nor dataclasses (inspect, ast ...): 25 % of its CPU


def test_run_with_gpus(wrapper: Wrapper, host: str) -> None:
    proc = wrapper("-H", "unix:///d.sock", "run", "-i", "--rm", "--gpus", "[2,0]", "img", "cat",
                   stdin="data\n", FAKE_DOCKER_RC="5")
    assert proc.returncode == 5, proc.stderr
    assert proc.stdout == "data\n"
    calls = wrapper.calls()
    assert all(c[:2] == ["-H", "unix:///d.sock"] for c in calls)
    assert ["-H", "unix:///d.sock", "version", "--format", "{{.Server.Version}}"] in calls
    assert ["-H", "unix:///d.sock", "image", "inspect", "--format",
            "{{json .Id}} {{json .Config.Env}}", "img"] in calls
    # first sight of this image: a probe container of the image's id, looked into, removed
    image_id = "sha256:" + "a" * 64
    assert calls[2][2] == "create" and calls[2][-1] == image_id
    assert calls[3] == ["-H", "unix:///d.sock", "cp", "-L", "f00dcafe" * 8 + ":/opt/maca", "-"]
    assert calls[4] == ["-H", "unix:///d.sock", "rm", "-f", "-v", "f00dcafe" * 8]
    final = calls[5]
    assert final[:3] == ["-H", "unix:///d.sock", "run"]
    assert final[-4:] == ["-i", "--rm", "img", "cat"]
    pairs = list(zip(final[3:-4:2], final[4:-4:2], strict=True))
    assert ("--device", f"{host}/dev/mxcd:/dev/mxcd:rw") in pairs
    assert ("--device", f"{host}/dev/dri/card1:/dev/dri/card1:rw") in pairs  # GPU 0
    assert ("--device", f"{host}/dev/dri/renderD130:/dev/dri/renderD130:rw") in pairs  # GPU 2
    assert len([p for p in pairs if p[0] == "--device"]) == 5
    assert ("--env", "MACA_VISIBLE_DEVICES=0,1") in pairs
    assert ("--mount", f"type=bind,source={host}/opt/maca,target=/opt/maca,readonly") in pairs
    # the image sets no PATH: docker's default, then the SDK trees' bin (mx-smi)
    assert ("--env", f"PATH={mp.DOCKER_DEFAULT_PATH}:/opt/mxdriver/bin") in pairs
    assert ("--env", "LD_LIBRARY_PATH=/opt/maca/lib:/opt/mxdriver/lib") in pairs


def test_image_search_paths_reach_docker(wrapper: Wrapper) -> None:
    image_env = json.dumps(["PATH=/app/bin:/usr/bin", "LD_LIBRARY_PATH=/app/lib", "HOME=/x"])
    assert wrapper("run", "--gpus", "2", "img", "mx-smi",
                   FAKE_DOCKER_IMAGE_ENV=image_env).returncode == 0
    final = wrapper.final()
    assert final[-2:] == ["img", "mx-smi"]
    envs = [final[i + 1] for i, a in enumerate(final) if a == "--env"]
    assert "LD_LIBRARY_PATH=/opt/maca/lib:/opt/mxdriver/lib:/app/lib" in envs
    assert "PATH=/app/bin:/usr/bin:/opt/mxdriver/bin" in envs
    assert not any(e.startswith("HOME=") for e in envs)


def test_image_with_sdk_keeps_it_unless_asked(wrapper: Wrapper, tmp_path: Path) -> None:
    assert wrapper("create", "--gpus=all", "img", FAKE_DOCKER_IMAGE_SDK="dir").returncode == 0
    final = wrapper.final()
    assert not any("target=/opt/maca," in a for a in final)
    assert any("target=/opt/mxdriver," in a for a in final)
    # an empty /opt/maca in the image (a mount point) is no SDK (another image id)
    assert wrapper("create", "--gpus=all", "img", FAKE_DOCKER_IMAGE_SDK="empty",
                   FAKE_DOCKER_IMAGE_ID="sha256:" + "e" * 64).returncode == 0
    assert any("target=/opt/maca," in a for a in wrapper.final())
    # --maca-force: no look into the image
    proc = wrapper("create", "--gpus=all", "--maca-force", "img", FAKE_DOCKER_IMAGE_SDK="dir",
                   FAKE_DOCKER_IMAGE_ID="sha256:" + "f" * 64)
    assert proc.returncode == 0
    assert wrapper.commands() == ["image inspect", "version", "create"]
    assert any("target=/opt/maca," in a for a in wrapper.final())
    # an explicit --maca is a request too: it wins over the image's SDK, no look either
    sdk = tmp_path / "sdk-3.0"
    sdk.mkdir()
    proc = wrapper("run", "--gpus", "1", "--maca", str(sdk), "img", FAKE_DOCKER_IMAGE_SDK="dir",
                   FAKE_DOCKER_IMAGE_ID="sha256:" + "f" * 64)
    assert proc.returncode == 0, proc.stderr
    assert wrapper.commands() == ["image inspect", "version", "run"]
    assert f"type=bind,source={sdk},target=/opt/maca,readonly" in wrapper.final()
    assert "MACA_PATH=/opt/maca" in wrapper.final()


def test_the_image_probe_is_cached_per_image_id(wrapper: Wrapper) -> None:
    probe = ["image inspect", "version", "create", "cp", "rm", "run"]
    assert wrapper("run", "--gpus", "1", "img", FAKE_DOCKER_IMAGE_SDK="dir").returncode == 0
    assert wrapper.commands() == probe
    assert not any("target=/opt/maca," in a for a in wrapper.final())
    # same image id: the answer is kept (an id names one file system)
    assert wrapper("run", "--gpus", "1", "img", FAKE_DOCKER_IMAGE_SDK="").returncode == 0
    assert wrapper.commands() == ["image inspect", "version", "run"]
    assert not any("target=/opt/maca," in a for a in wrapper.final())
    # another id: looked at again
    assert wrapper("run", "--gpus", "1", "img", FAKE_DOCKER_IMAGE_SDK="",
                   FAKE_DOCKER_IMAGE_ID="sha256:" + "b" * 64).returncode == 0
    assert wrapper.commands() == probe
    assert any("target=/opt/maca," in a for a in wrapper.final())
    # no cache (empty METAX_DOCKER_CACHE_DIR): every run looks
    for _ in range(2):
        assert wrapper("run", "--gpus", "1", "img", **{mp.ENV_CACHE: ""}).returncode == 0
        assert wrapper.commands() == probe


def test_an_image_to_pull_is_probed_by_name(wrapper: Wrapper) -> None:
    env = json.dumps(["PATH=/p"])
    proc = wrapper("run", "--pull=missing", "--gpus", "1", "reg.example/img:1",
                   FAKE_DOCKER_NO_LOCAL_IMAGE="1", FAKE_DOCKER_IMAGE_ENV=env)
    assert proc.returncode == 0, proc.stderr
    calls = wrapper.calls()
    create = next(c for c in calls if c[0] == "create")
    assert create[-2:] == ["--pull=missing", "reg.example/img:1"]
    assert "PATH=/p:/opt/mxdriver/bin" in wrapper.final()
    # --pull always / --platform: the local image may not be the one run uses
    proc = wrapper("run", "--platform", "linux/arm64", "--gpus", "1", "img",
                   FAKE_DOCKER_IMAGE_ID="sha256:" + "c" * 64)
    assert proc.returncode == 0, proc.stderr
    assert wrapper.commands() == ["version", "create", "container inspect", "cp", "rm", "run"]
    assert next(c for c in wrapper.calls() if c[0] == "create")[-2:] == [
        "--platform=linux/arm64", "img"]


def test_maca_alone_mounts_the_sdk_without_devices(wrapper: Wrapper, tmp_path: Path) -> None:
    sdk = tmp_path / "sdk,2"
    sdk.mkdir()
    assert wrapper("run", f"--maca={sdk}", "img").returncode == 0
    final = wrapper.final()
    assert "--device" not in final
    assert f'"source={sdk}"' in final[final.index("--mount") + 1]
    assert not any(a.startswith("MACA_VISIBLE_DEVICES=") for a in final)


def test_unknown_flag_is_looked_up_in_docker_help(wrapper: Wrapper) -> None:
    proc = wrapper("run", "--frobnicate", "x", "--gpus", "1", "img",
                   FAKE_DOCKER_HELP="      --frobnicate string   New flag")
    assert proc.returncode == 0, proc.stderr
    final = wrapper.final()
    assert final[-3:] == ["--frobnicate", "x", "img"]
    proc = wrapper("run", "--frobnicate", "x", "--gpus", "1", "img")
    assert proc.returncode == 2
    assert "unknown docker flag --frobnicate" in proc.stderr
    assert [c[-1] for c in wrapper.calls()] == ["--help"]


@pytest.mark.parametrize(
    "args,needle,asks_docker",
    [
        (["run", "--gpus", "9", "img"], "--gpus 9: this host", True),
        (["run", "--gpus", "[C500NOPE]", "img"], "no GPU 'C500NOPE'", True),
        (["run", "--gpus", "[]", "img"], "--gpus []: the list is empty", False),
        (["run", "--gpus", "device=0", "img"], "NVIDIA syntax", False),
        (["run", "--gpus", "1", "--maca", "{missing}", "img"], "--maca {missing}", False),
        (["create", "--gpus", "1", "--gpus", "2", "img"], "given twice", False),
    ],
)
def test_bad_input_exits_2_and_creates_nothing(
    wrapper: Wrapper, args: list[str], needle: str, asks_docker: bool, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-sdk")
    args = [a.replace("{missing}", missing) for a in args]
    needle = needle.replace("{missing}", missing)
    proc = wrapper(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("metax-docker: ") and needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # what needs the GPUs is judged while docker's version and the image are read (read-only)
    commands = wrapper.commands()
    assert all(c in ("version", "image inspect") for c in commands), commands
    assert bool(commands) == asks_docker


def test_unhealthy_gpus_are_never_handed_out(tmp_path: Path) -> None:
    root = tmp_path / "node"
    sim.create(str(root), "c500-8")
    sim.fail(str(root), 3, "fault", reason="GPU hang detected")
    wrapper = Wrapper(tmp_path, str(root))
    bdf = sim.state(str(root))["gpus"][3]["bdf"]
    for value, devices, visible in (("all", 7, "0,1,2,3,4,5,6"), ("4", 4, "0,1,2,3")):
        proc = wrapper("run", "--gpus", value, "img")
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == (
            f"metax-docker: warning: GPU 3 ({bdf}) is unhealthy, skipped: GPU hang detected\n")
        final = wrapper.final()
        cards = [a for a in final if a.startswith(f"{root}/dev/dri/card")]
        assert len(cards) == devices and f"{root}/dev/dri/card4:/dev/dri/card4:rw" not in cards
        assert f"MACA_VISIBLE_DEVICES={visible}" in final
    proc = wrapper("run", "--gpus", "2", "img")  # GPUs 0 and 1: nothing skipped, no warning
    assert proc.returncode == 0 and proc.stderr == ""
    proc = wrapper("run", "--gpus", "[3]", "img")
    assert proc.returncode == 2
    assert "GPU 3 (" in proc.stderr and "is unhealthy: GPU hang detected" in proc.stderr
    assert "run" not in wrapper.commands() and "create" not in wrapper.commands()


def mx_smi_log(root: Path) -> Path:
    """Wrap the simulator's mx-smi so that each run is logged (its arguments, one line)."""
    tool = root / "opt/mxdriver/bin/mx-smi"
    tool.rename(tool.with_name("mx-smi.real"))
    log = root / "mx-smi.log"
    tool.write_text(f'#!/bin/sh\necho "$*" >>{log}\nexec "$0.real" "$@"\n')
    tool.chmod(0o755)
    return log


def test_run_asks_mx_smi_only_what_it_needs(tmp_path: Path) -> None:
    """Discovery is lean: the health check (one mx-smi run), plus --show-hwinfo only when
    GPUs are named by serial number; no memory, no topology."""
    root = tmp_path / "node"
    sim.create(str(root), "c500-8")
    log = mx_smi_log(root)
    wrapper = Wrapper(tmp_path, str(root))
    for value in ("all", "2", "[1,3]"):
        log.write_text("")
        assert wrapper("run", "--gpus", value, "img").returncode == 0
        assert log.read_text().splitlines() == ["--show-unavailable-reason"], value
    serial = sim.state(str(root))["gpus"][5]["serial"]
    log.write_text("")
    assert wrapper("run", "--gpus", f"[{serial}]", "img").returncode == 0
    assert sorted(log.read_text().splitlines()) == ["--show-hwinfo", "--show-unavailable-reason"]
    assert f"{root}/dev/dri/card6:/dev/dri/card6:rw" in wrapper.final()


def test_no_sdk_on_the_host(tmp_path: Path) -> None:
    root = tmp_path / "node"
    sim.create(str(root), "c500-8")
    shutil.rmtree(root / "opt/maca")
    wrapper = Wrapper(tmp_path, str(root))
    proc = wrapper("run", "--gpus", "all", "img")
    assert proc.returncode == 2
    assert "no MXMACA SDK at /opt/maca" in proc.stderr
    assert wrapper.calls() == []


def test_docker_too_old(wrapper: Wrapper) -> None:
    proc = wrapper("run", "--gpus", "all", "img", FAKE_DOCKER_VERSION="18.09.3")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "metax-docker: docker 18.09.3 is too old: metax-docker needs Docker >= 19.03")
    assert wrapper.commands() == ["image inspect", "version"]  # no create, no run


def test_gpuk8s_subcommand(wrapper: Wrapper) -> None:
    env = {**os.environ, "PATH": f"{wrapper.bin}:{os.environ['PATH']}",
           "FAKE_DOCKER_LOG": str(wrapper.log)}
    proc = subprocess.run([sys.executable, "-m", "gpuk8s.cli", "metax-docker", "ps"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert wrapper.calls() == [["ps"]]


@pytest.mark.skipif(not os.access(PY38, os.X_OK), reason="no Python 3.8 at " + PY38)
def test_runs_under_python_3_8(wrapper: Wrapper, host: str) -> None:
    proc = wrapper("run", "--gpus", "[1]", "img", python=PY38)
    assert proc.returncode == 0, proc.stderr
    assert ("--device" in wrapper.final()
            and f"{host}/dev/dri/card2:/dev/dri/card2:rw" in wrapper.final())
    proc = wrapper("run", "--gpus", "[]", "img", python=PY38)
    assert proc.returncode == 2 and "the list is empty" in proc.stderr


# -- the installer's bytecode step -------------------------------------------------------------
def _zip_with(files: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()


def test_bytecode_is_what_zipimport_runs(tmp_path: Path) -> None:
    import io
    import zipfile

    from gpuk8s.metax_docker.bytecode import with_bytecode

    main_py = b"import pkg.mod; print(pkg.mod.X)\n"
    files = {"pkg/__init__.py": b"", "pkg/mod.py": b"X = 1\n", "__main__.py": main_py}
    app = with_bytecode(_zip_with(files), "/usr/local/bin/metax-docker")
    assert with_bytecode(_zip_with(files), "/usr/local/bin/metax-docker") == app  # reproducible
    with zipfile.ZipFile(io.BytesIO(app)) as archive:
        names = sorted(archive.namelist())
        compiled = archive.read("pkg/mod.pyc")
    assert names == ["__main__.py", "pkg/__init__.py", "pkg/__init__.pyc", "pkg/mod.py",
                     "pkg/mod.pyc"]
    # the source changed under the bytecode: this interpreter runs the bytecode (unchecked
    # hash-based), another one (another magic number) the source
    edited = {**files, "pkg/mod.py": b"X = 2\n", "pkg/mod.pyc": compiled}
    (tmp_path / "app.zip").write_bytes(_zip_with(edited))
    ran = subprocess.run([sys.executable, "-S", str(tmp_path / "app.zip")], capture_output=True,
                         text=True, check=True)
    assert ran.stdout == "1\n"
    if os.access(PY38, os.X_OK) and not sys.version.startswith("3.8."):
        ran = subprocess.run([PY38, "-S", str(tmp_path / "app.zip")], capture_output=True,
                             text=True, check=True)
        assert ran.stdout == "2\n"


# -- the daemon's socket for the read-only questions ------------------------------------------
def _fake_client(tmp_path: Path) -> str:
    """An executable that looks like a docker client binary (ELF magic)."""
    client = tmp_path / "docker"
    client.write_bytes(b"\x7fELF" + b"\0" * 60)
    client.chmod(0o755)
    return str(client)


def test_daemon_socket_only_where_the_cli_would_plainly_use_it(tmp_path: Path) -> None:
    from gpuk8s.metax_docker.docker import daemon_socket

    sock = tmp_path / "d.sock"
    sock.touch()
    client = _fake_client(tmp_path)
    env = {"DOCKER_HOST": f"unix://{sock}", "HOME": str(tmp_path)}
    assert daemon_socket(client, [], env) == str(sock)
    assert daemon_socket(client, ["-H", "unix:///x"], env) is None
    assert daemon_socket(client, [], {**env, "DOCKER_CONTEXT": "remote"}) is None
    assert daemon_socket(client, [], {**env, "DOCKER_TLS_VERIFY": "1"}) is None
    assert daemon_socket(client, [], {**env, "DOCKER_HOST": "tcp://10.0.0.1:2375"}) is None
    assert daemon_socket(client, [], {**env, "DOCKER_HOST": f"unix://{tmp_path}/no.sock"}
                         ) is None
    script = REPO / "tests/unit/fake_docker.py"  # a script in front of docker: the CLI
    assert daemon_socket(str(script), [], env) is None
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker/config.json").write_text('{"currentContext": "default"}')
    assert daemon_socket(client, [], env) == str(sock)
    (tmp_path / ".docker/config.json").write_text('{"currentContext": "remote"}')
    assert daemon_socket(client, [], env) is None


def _serve(path: Path, answers: dict[str, bytes]) -> None:
    """A one-thread unix socket server answering 'GET <path>' with raw bytes."""
    import socket
    import threading

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                request = conn.recv(65536).decode()
                resource = request.split()[1]
                conn.sendall(answers.get(resource, b"HTTP/1.0 404 Not Found\r\n\r\n{}"))

    threading.Thread(target=loop, daemon=True).start()


def test_version_and_image_from_the_daemons_socket(tmp_path: Path) -> None:
    from gpuk8s.metax_docker.docker import Docker, Image

    sock = tmp_path / "d.sock"
    body = json.dumps({"Id": "sha256:" + "d" * 64, "Config": {"Env": ["PATH=/a"]}}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    _serve(sock, {
        "/version": b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n'
                    b'{"Version": "20.10.24"}',
        "/images/reg.example/app:1/json": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                          + chunked,
    })
    # the program is never run: every answer comes from the socket
    docker = Docker(_fake_client(tmp_path), [], {"DOCKER_HOST": f"unix://{sock}",
                                                "HOME": str(tmp_path)})
    assert docker.server_version() == "20.10.24"
    docker.check_version()
    assert docker.local_image("reg.example/app:1") == Image("sha256:" + "d" * 64, ("PATH=/a",))
    assert docker.local_image("other:1") is None  # 404: not here, run would pull it


def test_a_socket_that_is_no_daemon_falls_back_to_the_cli(wrapper: Wrapper, tmp_path: Path
                                                          ) -> None:
    from gpuk8s.metax_docker.docker import Docker

    sock = tmp_path / "odd.sock"
    _serve(sock, {"/version": b"SSH-2.0-OpenSSH\r\n"})
    docker = Docker(str(wrapper.bin / "docker"), [])
    docker.socket = str(sock)
    env = {**os.environ, "FAKE_DOCKER_LOG": str(wrapper.log)}
    with pytest.MonkeyPatch.context() as mp_:
        for key, value in env.items():
            mp_.setenv(key, value)
        wrapper.log.write_text("")
        assert docker.server_version() == "20.10.24"  # the fake docker's answer
    assert docker.socket is None
    assert wrapper.calls() == [["version", "--format", "{{.Server.Version}}"]]


# -- the health check started first (early) --------------------------------------------------
def _counting_mxsmi(root: str, log: Path) -> None:
    """The simulator's mx-smi behind a script that logs each run's arguments."""
    tool = Path(root) / "opt/mxdriver/bin/mx-smi"
    tool.rename(tool.with_name("mx-smi.real"))
    tool.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec "$0.real" "$@"\n')
    tool.chmod(0o755)


def test_run_with_gpus_runs_the_health_check_once(tmp_path: Path) -> None:
    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    sim.fail(root, 3, "fault", reason="GPU hang detected")
    log = tmp_path / "mx-smi.log"
    _counting_mxsmi(root, log)
    wrapper = Wrapper(tmp_path, root)
    proc = wrapper("run", "--rm", "--gpus", "all", "img", "true")
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().splitlines() == ["--show-unavailable-reason"]
    assert "GPU 3 (" in proc.stderr and "GPU hang detected" in proc.stderr  # its answer used
    final = wrapper.final()
    assert final[0] == "run" and final[-3:] == ["--rm", "img", "true"]
    pairs = list(zip(final[1:-3:2], final[2:-3:2], strict=True))
    assert ("--env", "MACA_VISIBLE_DEVICES=0,1,2,3,4,5,6") in pairs
    # named by serial number: --show-hwinfo beside it, the health check still once
    log.write_text("")
    serial = sim.state(root)["gpus"][5]["serial"]
    proc = wrapper("run", "--rm", "--gpus", f"[{serial}]", "img", "true")
    assert proc.returncode == 0, proc.stderr
    assert sorted(log.read_text().splitlines()) == ["--show-hwinfo",
                                                    "--show-unavailable-reason"]


def test_early_health_answers_its_argv_once_and_runs_the_rest(tmp_path: Path) -> None:
    from gpuk8s.metax_docker.early import EarlyHealth

    root = str(tmp_path / "node")
    sim.create(root, "c500-8")
    log = tmp_path / "mx-smi.log"
    _counting_mxsmi(root, log)
    early = EarlyHealth(root)
    assert early.argv == [f"{root}/opt/mxdriver/bin/mx-smi", "--show-unavailable-reason"]
    rc, out, _ = early.runner(early.argv)
    assert rc == 0 and "Unavailable Reason" in out
    assert log.read_text().splitlines() == ["--show-unavailable-reason"]
    early.runner(early.argv)  # a second health check asks mx-smi again
    rc, out, _ = early.runner([early.argv[0], "--show-hwinfo"])
    assert rc == 0 and log.read_text().splitlines() == [
        "--show-unavailable-reason", "--show-unavailable-reason", "--show-hwinfo"]
    assert EarlyHealth(str(tmp_path / "bare")).argv is None  # no mx-smi: nothing started


def test_health_check_starts_before_the_edits_are_imported(wrapper: Wrapper) -> None:
    """mx-smi starts before plan (the edits, the selection) is imported: the two overlap."""
    code = (
        "import os, sys\n"
        "from gpuk8s.metax_docker import early, main\n"
        "seen = []\n"
        "start = early.start_health\n"
        "def spy(env):\n"
        "    seen.append('gpuk8s.metax_docker.plan' in sys.modules)\n"
        "    return start(env)\n"
        "early.start_health = spy\n"
        "main.plan(['run', '--gpus', '2', 'img', 'true'], os.environ, 'docker')\n"
        "main.plan(['run', '--maca-force', 'img', 'true'], os.environ, 'docker')\n"
        "print(seen)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PATH":
           f"{wrapper.bin}:{os.environ['PATH']}", "FAKE_DOCKER_LOG": str(wrapper.log),
           mp.ENV_ROOT: wrapper.root, mp.ENV_CACHE: str(wrapper.cache)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[False]"]  # once, for --gpus, before plan
