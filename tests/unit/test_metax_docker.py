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

import pytest

from gpuk8s import sim
from gpuk8s.core.model import NodeInventory
from gpuk8s.discovery import discover
from gpuk8s.metax_docker import dockerargs as da
from gpuk8s.metax_docker import main as md
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


def test_select_forms(inventory: NodeInventory) -> None:
    gpus = inventory.gpus
    assert [g.index for g in select(inventory, parse_request("all"))] == list(range(8))
    assert [g.index for g in select(inventory, parse_request("2"))] == [0, 1]
    assert [g.index for g in select(inventory, parse_request("[5,1]"))] == [1, 5]
    assert gpus[6].serial and gpus[2].uuid
    by_sn = select(inventory, parse_request(f"[{gpus[6].serial},{gpus[2].uuid},4]"))
    assert [g.index for g in by_sn] == [2, 4, 6]


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
    assert [g.index for g in select(inv, parse_request("all"))] == [0, 1, 3, 4, 5, 6, 7]
    assert [g.index for g in select(inv, parse_request("3"))] == [0, 1, 3]
    with pytest.raises(da.UsageError, match=r"GPU 2 .* has no device nodes"):
        select(inv, parse_request("[2]"))
    with pytest.raises(da.UsageError, match=r"7 usable MetaX GPUs \(1 without device nodes\)"):
        select(inv, parse_request("8"))


def test_select_on_a_host_without_metax_gpus() -> None:
    with pytest.raises(da.UsageError, match="no MetaX GPU on this host"):
        select(NodeInventory(backend="none"), parse_request("all"))


# -- the edits: the device plugin's ----------------------------------------------------------
def test_edits_are_what_the_device_plugin_allocates(host: str, inventory: NodeInventory) -> None:
    gpus = select(inventory, parse_request("[3,1]"))
    where = md.Host(host, host)
    sdk = md.sdk_source(where, None)
    args = md.container_edits(inventory, gpus, where, sdk, image_has_sdk=False)
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
    where = md.Host(host, host)
    sdk = md.sdk_source(where, None)
    gpus = select(inventory, parse_request("1"))
    edits = md.container_edits(inventory, gpus, where, sdk, image_has_sdk=True)
    assert [m.container_path for m in edits.mounts] == ["/opt/mxdriver"]
    assert "MACA_PATH" not in edits.env_map()
    assert edits.env_map()["MACA_VISIBLE_DEVICES"] == "0"


def test_sdk_source(host: str, tmp_path: Path) -> None:
    where = md.Host(host, "/prefix")
    sdk = md.sdk_source(where, None)
    assert sdk.paths == ("/opt/maca", "/opt/mxdriver")
    assert sdk.host_paths == ("/prefix/opt/maca", "/prefix/opt/mxdriver")
    (tmp_path / "sdk").mkdir()
    assert md.sdk_source(where, str(tmp_path / "sdk")).host_paths == (
        str(tmp_path / "sdk"), "/prefix/opt/mxdriver")
    with pytest.raises(da.UsageError, match="--maca /nonexistent: no such directory"):
        md.sdk_source(where, "/nonexistent")
    with pytest.raises(da.UsageError, match="no MXMACA SDK at /opt/maca"):
        md.sdk_source(md.Host(str(tmp_path)), None)


def test_host_from_env() -> None:
    assert md.Host.from_env({}) == md.Host("/", "")
    assert md.Host.from_env({md.ENV_ROOT: "/sim/"}) == md.Host("/sim/", "/sim")
    assert md.Host.from_env({md.ENV_ROOT: "/sim", md.ENV_PREFIX: ""}) == md.Host("/sim", "")
    with pytest.raises(da.UsageError, match=md.ENV_ROOT):
        md.Host.from_env({md.ENV_ROOT: "sim"})


# -- the wrapper as a process, docker recorded -------------------------------------------------
class Wrapper:
    def __init__(self, tmp: Path, root: str) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        shutil.copy(REPO / "tests/unit/fake_docker.py", self.bin / "docker")
        (self.bin / "docker").chmod(0o755 | stat.S_IEXEC)
        self.log = tmp / "docker.log"
        self.root = root

    def __call__(self, *args: str, python: str = sys.executable, stdin: str = "",
                 **env: str) -> subprocess.CompletedProcess[str]:
        self.log.write_text("")
        full = {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "FAKE_DOCKER_LOG": str(self.log),
            md.ENV_ROOT: self.root,
            "PYTHONPATH": str(REPO / "src"),
            **env,
        }
        return subprocess.run([python, "-m", "gpuk8s.metax_docker", *args], input=stdin,
                              capture_output=True, text=True, env=full, timeout=120, check=False)

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


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


def test_run_with_gpus(wrapper: Wrapper, host: str) -> None:
    proc = wrapper("-H", "unix:///d.sock", "run", "-i", "--rm", "--gpus", "[2,0]", "img", "cat",
                   stdin="data\n", FAKE_DOCKER_RC="5")
    assert proc.returncode == 5, proc.stderr
    assert proc.stdout == "data\n"
    calls = wrapper.calls()
    assert calls[0] == ["-H", "unix:///d.sock", "version", "--format", "{{.Server.Version}}"]
    assert calls[1][:3] == ["-H", "unix:///d.sock", "create"] and calls[1][-1] == "img"
    assert calls[2] == ["-H", "unix:///d.sock", "cp", "-L", "f00dcafe" * 8 + ":/opt/maca", "-"]
    assert calls[3] == ["-H", "unix:///d.sock", "rm", "-f", "-v", "f00dcafe" * 8]
    final = calls[4]
    assert final[:3] == ["-H", "unix:///d.sock", "run"]
    assert final[-4:] == ["-i", "--rm", "img", "cat"]
    pairs = list(zip(final[3:-4:2], final[4:-4:2], strict=True))
    assert ("--device", f"{host}/dev/mxcd:/dev/mxcd:rw") in pairs
    assert ("--device", f"{host}/dev/dri/card1:/dev/dri/card1:rw") in pairs  # GPU 0
    assert ("--device", f"{host}/dev/dri/renderD130:/dev/dri/renderD130:rw") in pairs  # GPU 2
    assert len([p for p in pairs if p[0] == "--device"]) == 5
    assert ("--env", "MACA_VISIBLE_DEVICES=0,1") in pairs
    assert ("--mount", f"type=bind,source={host}/opt/maca,target=/opt/maca,readonly") in pairs


def test_image_with_sdk_keeps_it_unless_forced(wrapper: Wrapper) -> None:
    assert wrapper("create", "--gpus=all", "img", FAKE_DOCKER_IMAGE_SDK="dir").returncode == 0
    final = wrapper.calls()[-1]
    assert not any("target=/opt/maca," in a for a in final)
    assert any("target=/opt/mxdriver," in a for a in final)
    # an empty /opt/maca in the image (a mount point) is no SDK
    assert wrapper("create", "--gpus=all", "img", FAKE_DOCKER_IMAGE_SDK="empty").returncode == 0
    assert any("target=/opt/maca," in a for a in wrapper.calls()[-1])
    # --maca-force: no look into the image at all
    proc = wrapper("create", "--gpus=all", "--maca-force", "img", FAKE_DOCKER_IMAGE_SDK="dir")
    assert proc.returncode == 0
    calls = wrapper.calls()
    assert [c[0] for c in calls] == ["version", "create"]
    assert any("target=/opt/maca," in a for a in calls[-1])


def test_maca_alone_mounts_the_sdk_without_devices(wrapper: Wrapper, tmp_path: Path) -> None:
    sdk = tmp_path / "sdk,2"
    sdk.mkdir()
    assert wrapper("run", f"--maca={sdk}", "img").returncode == 0
    final = wrapper.calls()[-1]
    assert "--device" not in final
    assert f'"source={sdk}"' in final[final.index("--mount") + 1]
    assert not any(a.startswith("MACA_VISIBLE_DEVICES=") for a in final)


def test_unknown_flag_is_looked_up_in_docker_help(wrapper: Wrapper) -> None:
    proc = wrapper("run", "--frobnicate", "x", "--gpus", "1", "img",
                   FAKE_DOCKER_HELP="      --frobnicate string   New flag")
    assert proc.returncode == 0, proc.stderr
    final = wrapper.calls()[-1]
    assert final[-3:] == ["--frobnicate", "x", "img"]
    proc = wrapper("run", "--frobnicate", "x", "--gpus", "1", "img")
    assert proc.returncode == 2
    assert "unknown docker flag --frobnicate" in proc.stderr
    assert [c[-1] for c in wrapper.calls()] == ["--help"]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "--gpus", "9", "img"], "--gpus 9: this host"),
        (["run", "--gpus", "[C500NOPE]", "img"], "no GPU 'C500NOPE'"),
        (["run", "--gpus", "[]", "img"], "--gpus []: the list is empty"),
        (["run", "--gpus", "device=0", "img"], "NVIDIA syntax"),
        (["run", "--gpus", "1", "--maca", "/nonexistent", "img"], "--maca /nonexistent"),
        (["create", "--gpus", "1", "--gpus", "2", "img"], "given twice"),
    ],
)
def test_bad_input_exits_2_without_docker(wrapper: Wrapper, args: list[str], needle: str) -> None:
    proc = wrapper(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("metax-docker: ") and needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert wrapper.calls() == []


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
    assert [c[0] for c in wrapper.calls()] == ["version"]  # no create, no run


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
    assert ("--device" in wrapper.calls()[-1]
            and f"{host}/dev/dri/card2:/dev/dri/card2:rw" in wrapper.calls()[-1])
    proc = wrapper("run", "--gpus", "[]", "img", python=PY38)
    assert proc.returncode == 2 and "the list is empty" in proc.stderr
