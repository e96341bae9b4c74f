"""The installer's helper: the zipapp with bytecode compiled by the Python that will run it.

A zipapp of sources is compiled again at every start (zipimport caches nothing), which
costs more than the rest of a ``metax-docker run``'s own work. The installer
(``metax-docker_<V>.<ARCH>.run install``) runs this with the interpreter it installs for::

    PYTHONHASHSEED=0 PYTHON -S -c 'import sys; sys.path.insert(0, sys.argv[1]); \
        from gpuk8s.metax_docker.bytecode import main; sys.exit(main(sys.argv[1:]))' \
        ZIPAPP TARGET

and writes what it prints (the zip archive with ``name.pyc`` beside each ``name.py``, where
zipimport looks for it) after the ``#!PYTHON`` line. The bytecode files are unchecked
hash-based (PEP 552): valid for this archive whatever the files' dates, and byte for byte
the same on every install with the same interpreter (with ``PYTHONHASHSEED=0``), so
reinstalling an identical file changes nothing. Another Python finds a magic number it
does not know and falls back to the sources.
"""

from __future__ import annotations

import importlib.util
import io
import marshal
import sys
import zipfile
from collections.abc import Sequence

UNCHECKED_HASH = (1).to_bytes(4, "little")  # PEP 552 flags: hash-based, not checked


def pyc(source: bytes, filename: str) -> bytes:
    code = compile(source, filename, "exec", dont_inherit=True)
    return (importlib.util.MAGIC_NUMBER + UNCHECKED_HASH + importlib.util.source_hash(source)
            + marshal.dumps(code))


def with_bytecode(archive: bytes, target: str) -> bytes:
    """``archive`` (a zip) with a ``.pyc`` beside each module; tracebacks name the files
    as ``TARGET/gpuk8s/...``, where zipimport puts them."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as source, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as result:
        for info in source.infolist():
            data = source.read(info)
            result.writestr(info, data)
            if info.filename.endswith(".py") and info.filename != "__main__.py":
                compiled = zipfile.ZipInfo(info.filename + "c", info.date_time)
                compiled.external_attr = info.external_attr
                compiled.compress_type = zipfile.ZIP_DEFLATED
                result.writestr(compiled, pyc(data, f"{target}/{info.filename}"))
    return out.getvalue()


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: bytecode ZIPAPP TARGET (the zip archive, the path it is installed at)",
              file=sys.stderr)
        return 2
    with open(argv[0], "rb") as handle:
        archive = handle.read()
    sys.stdout.buffer.write(with_bytecode(archive, argv[1]))
    sys.stdout.buffer.flush()
    return 0
