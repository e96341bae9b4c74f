"""docker's command-line grammar, as far as the wrapper needs it: where the command is, where
the image of ``run`` / ``create`` is, and which flags before it are the wrapper's.

docker parses with spf13/pflag, flags not interspersed (parsing stops at the first
argument that is not a flag: for ``run`` the image; what follows it is the container's
command, whatever it looks like). pflag's rules, all handled here: ``--name value`` and
``--name=value``; booleans take no separate value (``--rm``, ``--rm=false``); short flags
combine (``-it``), a short flag that takes a value takes the rest of its group or the next
argument (``-p8080:80``, ``-itp 8080:80``), ``-e=X``; ``--`` ends the flags.

Which flags take a value comes from the tables below (docker CLI 28's ``run`` and
``create`` flags, their hidden aliases ``--net``, ``--net-alias``, ``--dns-opt``, and
everything older releases had); a flag not in them is looked up through a caller-given
function (the wrapper asks ``docker run --help``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Callable, NamedTuple, Optional

from ..core.errors import ConfigError

# -- docker's global options (before the command)
GLOBAL_VALUE = frozenset(
    ["--config", "--context", "--host", "--log-level", "--tlscacert", "--tlscert", "--tlskey",
     "-c", "-H", "-l"]
)
GLOBAL_BOOL = frozenset(
    ["--debug", "--tls", "--tlsverify", "--version", "--help", "-D", "-v", "-h"]
)


def _long(names: str) -> frozenset[str]:
    return frozenset("--" + name for name in names.split())


# -- `docker run` / `docker create` options
RUN_VALUE = _long(
    """
    add-host annotation attach blkio-weight blkio-weight-device cap-add cap-drop
    cgroup-parent cgroupns cidfile cpu-count cpu-percent cpu-period cpu-quota cpu-rt-period
    cpu-rt-runtime cpu-shares cpus cpuset-cpus cpuset-mems detach-keys device
    device-cgroup-rule device-read-bps device-read-iops device-write-bps device-write-iops
    dns dns-opt dns-option dns-search domainname entrypoint env env-file expose gpus
    group-add health-cmd health-interval health-retries health-start-interval
    health-start-period health-timeout hostname io-maxbandwidth io-maxiops ip ip6 ipc
    isolation kernel-memory label label-file link link-local-ip log-driver log-opt
    mac-address memory memory-reservation memory-swap memory-swappiness mount name net
    net-alias network network-alias oom-score-adj pid pids-limit platform publish pull
    restart runtime security-opt shm-size stop-signal stop-timeout storage-opt sysctl tmpfs
    ulimit user userns uts volume volume-driver volumes-from workdir
    """
) | frozenset("-" + c for c in "acehlmpuvw")
RUN_BOOL = _long(
    """
    detach disable-content-trust help init interactive no-healthcheck oom-kill-disable
    privileged publish-all quiet read-only rm sig-proxy tty use-api-socket
    """
) | frozenset("-" + c for c in "dPiqt")

CONTAINER_COMMANDS = (("run",), ("create",), ("container", "run"), ("container", "create"))

# the wrapper's own flags (run / create, before the image)
GPUS, MACA, MACA_FORCE = "--gpus", "--maca", "--maca-force"
WRAPPER_FLAGS = (GPUS, MACA, MACA_FORCE)

# `docker run --help` lines: "  -e, --env list   Set ..." / "      --rm    Automatically ..."
_HELP_LINE = re.compile(r"^\s+(?:-(\w), )?--([A-Za-z0-9][\w-]*)( [A-Za-z][\w-]*)?(?:\s{2,}|$)")

TakesValue = Callable[[str], Optional[bool]]  # flag as written ("-x", "--xy") -> None: unknown


class UsageError(ConfigError):
    """The wrapper's flags are used wrongly (exit 2, docker not run)."""


class UnknownFlagError(ConfigError):
    """A docker flag before the image that the grammar does not know."""

    def __init__(self, flag: str) -> None:
        super().__init__(
            f"unknown docker flag {flag}: cannot tell whether it takes a value "
            f"(write it as {flag}=VALUE, or check `docker run --help`)"
        )
        self.flag = flag


def _table_lookup(values: frozenset[str], bools: frozenset[str]) -> TakesValue:
    def lookup(flag: str) -> bool | None:
        if flag in values:
            return True
        if flag in bools:
            return False
        return None

    return lookup


class Invocation(NamedTuple):
    """A docker command line cut in three: global options, command words, the rest."""

    global_args: tuple[str, ...]
    command: tuple[str, ...]  # ("run",), ("container", "create"), ("ps",), () ...
    args: tuple[str, ...]

    @property
    def creates_container(self) -> bool:
        return self.command in CONTAINER_COMMANDS


class WrapperOptions(NamedTuple):
    gpus: str | None = None
    maca: str | None = None
    maca_force: bool = False

    @property
    def given(self) -> bool:
        return self.gpus is not None or self.maca is not None or self.maca_force


class RunArgs(NamedTuple):
    """``run`` / ``create`` arguments: docker's options (the wrapper's taken out, the rest
    token for token as given), the image and the container's command."""

    options: tuple[str, ...]
    image: str | None
    command: tuple[str, ...]
    wrapper: WrapperOptions
    separator: bool = False  # "--" stood before the image

    def rebuild(self, extra: Sequence[str]) -> list[str]:
        """The arguments for docker: ``extra`` first (so the user's own ``-e`` / ``--device``
        given later win), then the user's options, the image and its command."""
        out = [*extra, *self.options]
        if self.image is None:
            return out
        return [*out, *(["--"] if self.separator else []), self.image, *self.command]

    def option_value(self, long: str, short: str = "", lookup: TakesValue | None = None
                     ) -> str | None:
        """Last value of one of docker's value options among ``options`` (e.g. --platform)."""
        found: str | None = None
        for flag, value in _walk(self.options, lookup or RUN_FLAGS):
            if flag in (long, short) and value is not None:
                found = value
        return found


RUN_FLAGS: TakesValue = _table_lookup(RUN_VALUE, RUN_BOOL)


def chain(*lookups: TakesValue) -> TakesValue:
    """First answer that is not None."""

    def lookup(flag: str) -> bool | None:
        for one in lookups:
            answer = one(flag)
            if answer is not None:
                return answer
        return None

    return lookup


def help_table(text: str) -> dict[str, bool]:
    """Flag -> takes a value, read from the text of ``docker run --help`` (a type word after
    the flag means it takes one)."""
    table: dict[str, bool] = {}
    for line in text.splitlines():
        match = _HELP_LINE.match(line)
        if not match:
            continue
        short, long, kind = match.groups()
        table["--" + long] = kind is not None
        if short:
            table["-" + short] = kind is not None
    return table


def help_flags(text: str) -> TakesValue:
    """A lookup from ``docker run --help``, for flags newer than the tables."""
    return help_table(text).get


def split_invocation(argv: Sequence[str]) -> Invocation:
    """Global options, command words (``container run`` counts as two) and the rest.
    Unknown global options end the global part (docker will complain about them)."""
    args = list(argv)
    i = 0
    global_lookup = _table_lookup(GLOBAL_VALUE, GLOBAL_BOOL)
    while i < len(args):
        token = args[i]
        if token == "--" or not token.startswith("-") or token == "-":
            break
        width = _flag_width(args, i, global_lookup)
        if width is None:
            break
        i += width
    globals_end = i
    if i < len(args) and args[i] == "--":
        i += 1
    words: list[str] = []
    if i < len(args) and not args[i].startswith("-"):
        words.append(args[i])
        i += 1
        if words[0] == "container" and i < len(args) and not args[i].startswith("-"):
            words.append(args[i])
            i += 1
    return Invocation(tuple(args[:globals_end]), tuple(words), tuple(args[i:]))


def _flag_width(args: Sequence[str], i: int, lookup: TakesValue) -> int | None:
    """How many arguments the flag at ``args[i]`` occupies; None when unknown."""
    token = args[i]
    if token.startswith("--"):
        name, sep, _ = token.partition("=")
        kind = lookup(name)
        if kind is None:
            return None
        return 1 if sep or not kind else 2
    # a group of short flags
    for pos in range(1, len(token)):
        kind = lookup("-" + token[pos])
        if kind is None:
            return None
        rest = token[pos + 1:]
        if rest.startswith("="):
            return 1
        if kind:
            return 1 if rest else 2
    return 1


def _walk(options: Sequence[str], lookup: TakesValue) -> list[tuple[str, str | None]]:
    """(flag, value) pairs of already-validated options; short groups give one pair each."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(options):
        token = options[i]
        if token.startswith("--"):
            name, sep, value = token.partition("=")
            if sep:
                out.append((name, value))
            elif lookup(name) and i + 1 < len(options):
                out.append((name, options[i + 1]))
                i += 1
            else:
                out.append((name, None))
        else:
            for pos in range(1, len(token)):
                flag, rest = "-" + token[pos], token[pos + 1:]
                if rest.startswith("="):
                    out.append((flag, rest[1:]))
                    break
                if lookup(flag):
                    if rest:
                        out.append((flag, rest))
                    elif i + 1 < len(options):
                        out.append((flag, options[i + 1]))
                        i += 1
                    break
                out.append((flag, None))
        i += 1
    return out


def parse_run(args: Sequence[str], lookup: TakesValue = RUN_FLAGS) -> RunArgs:
    """Split ``run`` / ``create`` arguments. Raises ``UsageError`` for misuse of the
    wrapper's flags and ``UnknownFlagError`` for a docker flag ``lookup`` does not know."""
    args = list(args)
    options: list[str] = []
    found: dict[str, str | None] = {}
    i = 0
    image: str | None = None
    separator = False
    while i < len(args):
        token = args[i]
        if token == "--":
            separator = True
            i += 1
            if i < len(args):
                image = args[i]
                i += 1
            break
        if token == "-" or not token.startswith("-"):
            image = token
            i += 1
            break
        name, sep, value = token.partition("=")
        if name in WRAPPER_FLAGS:
            if name in found:
                raise UsageError(f"{name} is given twice")
            if name == MACA_FORCE:
                if sep:
                    raise UsageError(f"{MACA_FORCE} takes no value (got {token!r})")
                found[name] = None
                i += 1
                continue
            if not sep:
                if i + 1 >= len(args):
                    raise UsageError(f"{name} needs a value")
                value = args[i + 1]
                i += 1
            found[name] = value
            i += 1
            continue
        width = _flag_width(args, i, lookup)
        if width is None:
            raise UnknownFlagError(name if token.startswith("--") else _unknown_short(token,
                                                                                    lookup))
        options.extend(args[i:i + width])
        i += width
    wrapper = WrapperOptions(found.get(GPUS), found.get(MACA), MACA_FORCE in found)
    return RunArgs(tuple(options), image, tuple(args[i:]), wrapper, separator)


def _unknown_short(token: str, lookup: TakesValue) -> str:
    for pos in range(1, len(token)):
        if lookup("-" + token[pos]) is None:
            return "-" + token[pos]
    return token


def mentions_wrapper_flags(args: Sequence[str]) -> bool:
    """Whether any argument looks like one of the wrapper's flags (anywhere)."""
    return any(a.partition("=")[0] in WRAPPER_FLAGS for a in args)
