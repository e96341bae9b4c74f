"""Structured logging for the long-running services, honouring the chart's log options.

The chart's ``log`` block (SPEC §5) maps one to one onto ``LogOptions``:

=============  ======================  ===========================================
chart key      flag                    meaning
=============  ======================  ===========================================
dir            ``--log-dir``           directory of ``<component>.log``; ``""``
                                       (the flag's default) logs to stderr only
level          ``--log-level``         debug | info | warning | error | fatal
format         ``--log-format``        json (one object per line) | text
rotationTime   ``--log-rotation-time`` start a new file this often (w/d/h units)
maxAge         ``--log-max-age``       delete rotated files older than this
=============  ======================  ===========================================

Records always go to stderr too (``kubectl logs``). Structured fields are passed with
``extra``: ``log.info("registered", extra={"resource": name})`` gives
``{"ts": ..., "level": "info", "logger": ..., "msg": "registered", "resource": ...}``
in json format and ``... registered resource=metax-tech.com/gpu`` in text format.

Usage in a service's ``main``::

    parser = argparse.ArgumentParser()
    add_log_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging(LogOptions.from_args(args), component="device-plugin")
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import logging.handlers
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from ..core.errors import ConfigError

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}
FORMATS: tuple[str, ...] = ("json", "text")
UNIT_SECONDS: dict[str, int] = {"w": 7 * 86400, "d": 86400, "h": 3600}
_DURATION_RE = re.compile(r"(\d+)([wdh])")

DEFAULT_DIR = "/var/log/metax"  # the chart's default; the flags default to stderr only
DEFAULT_ROTATION = "1w"
DEFAULT_MAX_AGE = "26w"

# LogRecord attributes that are not user fields
_RESERVED = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}


def parse_duration(value: str, field: str) -> int:
    """Seconds in ``value`` written with w/d/h units (``1w``, ``36h``, ``1w2d``).

    Raises ``ConfigError`` naming ``field`` for anything else (including zero).
    """
    text = str(value).strip().lower()
    pos = 0
    total = 0
    for match in _DURATION_RE.finditer(text):
        if match.start() != pos:
            break
        total += int(match.group(1)) * UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text) or total <= 0:
        raise ConfigError(
            f"{field}: {value!r} is not a positive duration; write a number with a unit "
            "w (weeks), d (days) or h (hours), e.g. 1w, 3d, 12h or 1w2d"
        )
    return total


@dataclass(frozen=True)
class LogOptions:
    """Validated log options. Build with ``LogOptions.create`` or ``from_args``."""

    dir: str = ""
    level: str = "info"
    format: str = "json"
    rotation_time: str = DEFAULT_ROTATION
    max_age: str = DEFAULT_MAX_AGE

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ConfigError(f"log.level: {self.level!r} is not one of {', '.join(LEVELS)}")
        if self.format not in FORMATS:
            raise ConfigError(f"log.format: {self.format!r} is not one of {', '.join(FORMATS)}")
        parse_duration(self.rotation_time, "log.rotationTime")
        parse_duration(self.max_age, "log.maxAge")

    @classmethod
    def create(
        cls,
        dir: str = "",
        level: str = "info",
        format: str = "json",
        rotation_time: str = DEFAULT_ROTATION,
        max_age: str = DEFAULT_MAX_AGE,
    ) -> LogOptions:
        """Normalising constructor (case-insensitive level/format, trimmed strings)."""
        return cls(
            dir=str(dir).strip(),
            level=str(level).strip().lower(),
            format=str(format).strip().lower(),
            rotation_time=str(rotation_time).strip().lower(),
            max_age=str(max_age).strip().lower(),
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LogOptions:
        """From the flags added by ``add_log_arguments``."""
        return cls.create(
            dir=args.log_dir,
            level=args.log_level,
            format=args.log_format,
            rotation_time=args.log_rotation_time,
            max_age=args.log_max_age,
        )

    @property
    def level_number(self) -> int:
        return LEVELS[self.level]

    @property
    def rotation_seconds(self) -> int:
        return parse_duration(self.rotation_time, "log.rotationTime")

    @property
    def max_age_seconds(self) -> int:
        return parse_duration(self.max_age, "log.maxAge")


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--log-dir --log-level --log-format --log-rotation-time --log-max-age``.

    Defaults may also come from the environment (``LOG_DIR``, ``LOG_LEVEL``,
    ``LOG_FORMAT``, ``LOG_ROTATION_TIME``, ``LOG_MAX_AGE``) so a chart can set them
    either way. Values are validated by ``LogOptions.from_args``.
    """
    env = os.environ
    group = parser.add_argument_group("logging (the chart's log options)")
    group.add_argument(
        "--log-dir",
        default=env.get("LOG_DIR", ""),
        help=f"directory for <component>.log (chart default {DEFAULT_DIR}); "
        "empty: stderr only (default)",
    )
    group.add_argument(
        "--log-level",
        default=env.get("LOG_LEVEL", "info"),
        help=f"one of {', '.join(LEVELS)} (default info)",
    )
    group.add_argument(
        "--log-format",
        default=env.get("LOG_FORMAT", "json"),
        help="json (default) or text",
    )
    group.add_argument(
        "--log-rotation-time",
        default=env.get("LOG_ROTATION_TIME", DEFAULT_ROTATION),
        help=f"rotate the log file this often, units w/d/h (default {DEFAULT_ROTATION})",
    )
    group.add_argument(
        "--log-max-age",
        default=env.get("LOG_MAX_AGE", DEFAULT_MAX_AGE),
        help=f"delete rotated files older than this, units w/d/h (default {DEFAULT_MAX_AGE})",
    )


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        level = "fatal" if record.levelno >= logging.CRITICAL else record.levelname.lower()
        out: dict[str, Any] = {
            "ts": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": level,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<iso time> <LEVEL> <logger>: <msg> key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        level = "FATAL" if record.levelno >= logging.CRITICAL else record.levelname
        ts = _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(timespec="milliseconds")
        line = f"{ts} {level} {record.name}: {record.getMessage()}"
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        if extras:
            line = f"{line} {extras}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class AgeRotatingFileHandler(logging.handlers.TimedRotatingFileHandler):
    """Rotates every ``rotation_s`` seconds; deletes rotated files older than ``max_age_s``.

    The standard handler only prunes by count; the chart speaks of age, so rotated
    siblings are removed by modification time after every rollover (and at start).
    """

    def __init__(self, filename: str, rotation_s: int, max_age_s: int) -> None:
        super().__init__(
            filename,
            when="S",
            interval=rotation_s,
            backupCount=0,
            utc=True,
            encoding="utf-8",
            delay=False,
        )
        self.max_age_s = max_age_s
        self.prune()

    def doRollover(self) -> None:
        super().doRollover()
        self.prune()

    def prune(self, now: float | None = None) -> list[str]:
        """Delete rotated files older than max age; returns what was deleted."""
        now = time.time() if now is None else now
        directory, base = os.path.split(self.baseFilename)
        removed: list[str] = []
        try:
            names = os.listdir(directory)
        except OSError:
            return removed
        for name in names:
            if not name.startswith(base + ".") or name == base:
                continue
            path = os.path.join(directory, name)
            try:
                if now - os.path.getmtime(path) > self.max_age_s:
                    os.unlink(path)
                    removed.append(path)
            except OSError:
                continue
        return removed


def configure_logging(
    options: LogOptions,
    component: str = "gpuk8s",
    *,
    stream: TextIO | None = None,
    logger: logging.Logger | None = None,
) -> list[logging.Handler]:
    """Install handlers on ``logger`` (default: the root logger), replacing old ones.

    Always logs to ``stream`` (default stderr); also to ``<dir>/<component>.log`` when
    ``options.dir`` is set (created if missing; ``ConfigError`` if that fails).
    Returns the installed handlers.
    """
    target = logging.getLogger() if logger is None else logger
    formatter: logging.Formatter = JsonFormatter() if options.format == "json" else TextFormatter()
    handlers: list[logging.Handler] = []
    console = logging.StreamHandler(sys.stderr if stream is None else stream)
    handlers.append(console)
    if options.dir:
        try:
            os.makedirs(options.dir, exist_ok=True)
            path = os.path.join(options.dir, f"{component}.log")
            handlers.append(
                AgeRotatingFileHandler(path, options.rotation_seconds, options.max_age_seconds)
            )
        except OSError as err:
            raise ConfigError(f"log.dir: cannot write logs under {options.dir!r}: {err}") from err
    for old in list(target.handlers):
        target.removeHandler(old)
        old.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        target.addHandler(handler)
    target.setLevel(options.level_number)
    return handlers
