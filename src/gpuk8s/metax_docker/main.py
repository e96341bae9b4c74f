"""The wrapper's glue: read the command line, plan docker's, ``exec`` docker.

Environment:

``METAX_DOCKER_DOCKER``              the docker program (default ``docker`` on PATH)
``METAX_DOCKER_HOST_ROOT``           where the host's ``/`` is (default ``/``; the simulator
                                     root in tests and the lab), read by discovery
``METAX_DOCKER_DEVICE_PATH_PREFIX``  put before ``/dev/...`` and ``/opt/...`` in what docker
                                     is told (default: the host root, or empty when it is
                                     ``/``), as the device plugin's ``--device-path-prefix``
``METAX_DOCKER_CACHE_DIR``           where the per-image answer "has its own /opt/maca" is
                                     kept (default ``$XDG_CACHE_HOME/metax-docker``, else
                                     ``~/.cache/metax-docker``; empty: no cache)

Exit status: docker's own (the wrapper becomes docker); 2 for a bad ``--gpus`` / ``--maca``,
a host without usable GPUs or SDK, or a docker older than 19.03 (then docker runs no
container).

Only what every command needs is imported here: a command that passes through (``ps``,
``run`` without the wrapper's flags ...) costs the interpreter's start and this module;
``plan`` (discovery, the CDI edits) is imported for ``run`` / ``create`` with them, and
with ``--gpus`` only after mx-smi's health check has started (``early``), so the two
overlap.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from ..core.errors import GpuK8sError
from .dockerargs import (
    RUN_FLAGS,
    UnknownFlagError,
    chain,
    help_flags,
    mentions_wrapper_flags,
    parse_run,
    split_invocation,
)

PROG = "metax-docker"
ENV_DOCKER = "METAX_DOCKER_DOCKER"
EXIT_USAGE = 2


def plan(argv: Sequence[str], env: Mapping[str, str], program: str) -> list[str]:
    """docker's arguments for the wrapper's ``argv`` (unchanged unless ``run`` / ``create``
    uses the wrapper's flags). Raises ``UsageError`` (exit 2) or ``DockerError``."""
    invocation = split_invocation(argv)
    if not invocation.creates_container or not mentions_wrapper_flags(invocation.args):
        return list(argv)
    from .docker import Docker

    docker = Docker(program, invocation.global_args, env)
    try:
        run = parse_run(invocation.args)
    except UnknownFlagError:
        # a flag newer than the tables: docker's own help says whether it takes a value
        newer = help_flags(docker.run_flags_help(invocation.command))
        run = parse_run(invocation.args, chain(RUN_FLAGS, newer))
    prefix = [*invocation.global_args, *invocation.command]
    if not run.wrapper.given:  # the flags belong to the container's command
        return list(argv)
    if run.image is None:  # docker says what is missing
        return [*prefix, *run.rebuild([])]
    runner = None
    if run.wrapper.gpus is not None:  # mx-smi's health check runs while plan is imported
        from .early import start_health

        runner = start_health(env)
    from .plan import wrapper_args

    return [*prefix, *run.rebuild(wrapper_args(run, env, docker, invocation.command,
                                               runner))]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ
    program = env.get(ENV_DOCKER) or "docker"
    try:
        final = plan(args, env, program)
    except GpuK8sError as err:
        rc = getattr(err, "rc", EXIT_USAGE)  # DockerError: the status of docker's command
        if str(err):
            print(f"{PROG}: {err}", file=sys.stderr)
        return int(rc)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(program, [program, *final])
    except OSError as err:
        print(f"{PROG}: cannot run {program}: {err}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return
