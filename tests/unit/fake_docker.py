#!/usr/bin/env python3
"""A stand-in ``docker`` for metax-docker's unit tests: records every call, answers the few
the wrapper makes itself. (The integration tests use the real dockerd.)

Environment: ``FAKE_DOCKER_LOG`` (JSON lines: argv), ``FAKE_DOCKER_VERSION`` (server
version, default 20.10.24), ``FAKE_DOCKER_IMAGE_SDK`` (``dir`` / ``empty``: what
``/opt/maca`` is in the image; unset: absent), ``FAKE_DOCKER_HELP`` (set: ``--help``
prints a help text with these extra lines), ``FAKE_DOCKER_RC`` (exit status of any
other command, which echoes stdin), ``FAKE_DOCKER_IMAGE_ID`` (the image's id, default
``sha256:`` + 64 × ``a``), ``FAKE_DOCKER_IMAGE_ENV`` (its environment as a JSON list, default
``null``: none), ``FAKE_DOCKER_NO_LOCAL_IMAGE`` (set: ``image inspect`` finds no such image, as
for an image that ``run`` would pull).
"""

import io
import json
import os
import sys
import tarfile

argv = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps(argv) + "\n")

# global options the tests use: -H X / --host=X
while argv and argv[0].startswith("-"):
    argv = argv[2:] if argv[0] == "-H" else argv[1:]

IMAGE_ID = os.environ.get("FAKE_DOCKER_IMAGE_ID", "sha256:" + "a" * 64)
FACTS = f'"{IMAGE_ID}" {os.environ.get("FAKE_DOCKER_IMAGE_ENV", "null")}'

if argv[:2] == ["image", "inspect"]:
    if "FAKE_DOCKER_NO_LOCAL_IMAGE" in os.environ:
        print(f"Error: No such image: {argv[-1]}", file=sys.stderr)
        sys.exit(1)
    print(FACTS)
elif argv[:2] == ["container", "inspect"]:
    print(FACTS)
elif argv[:1] == ["version"]:
    print(os.environ.get("FAKE_DOCKER_VERSION", "20.10.24"))
elif argv[:1] == ["create"] and argv[-1] != "--help":
    print("f00dcafe" * 8)
elif argv[:1] == ["cp"]:
    kind = os.environ.get("FAKE_DOCKER_IMAGE_SDK", "")
    if not kind:
        print(f"Error: No such container:path: {argv[-2]}", file=sys.stderr)
        sys.exit(1)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        top = tarfile.TarInfo("maca")
        top.type = tarfile.DIRTYPE
        tar.addfile(top)
        if kind == "dir":
            data = b"Version:3.0.0.1\n"
            info = tarfile.TarInfo("maca/Version.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    sys.stdout.buffer.write(buf.getvalue())
elif argv[:1] == ["rm"]:
    pass
elif argv[-1:] == ["--help"] and "FAKE_DOCKER_HELP" in os.environ:
    print("Options:\n  -e, --env list      Set environment variables\n      --rm    Remove")
    print(os.environ.get("FAKE_DOCKER_HELP", ""))
else:
    sys.stdout.write(sys.stdin.read() if not sys.stdin.isatty() else "")
    sys.exit(int(os.environ.get("FAKE_DOCKER_RC", "0")))
