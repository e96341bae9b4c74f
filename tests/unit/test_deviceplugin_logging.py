"""services.logging_setup: the chart's log options (dir, level, format, rotation, age)."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuk8s.core.errors import ConfigError
from gpuk8s.services.logging_setup import (
    AgeRotatingFileHandler,
    LogOptions,
    add_log_arguments,
    configure_logging,
    parse_duration,
)


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger("gpuk8s.test.logging")
    log.propagate = False
    yield log
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1w", 604800), ("26w", 26 * 604800), ("3d", 259200), ("12h", 43200), ("1w2d", 777600),
     ("1D", 86400)],
)  # fmt: skip
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text, "log.maxAge") == seconds


@pytest.mark.parametrize("text", ["", "5", "5m", "0h", "w", "1w 2d", "-1d", "1.5h"])
def test_bad_durations_name_the_field(text: str) -> None:
    with pytest.raises(ConfigError, match=r"log\.rotationTime: .* w \(weeks\), d \(days\)"):
        parse_duration(text, "log.rotationTime")


def test_options_validate_level_and_format() -> None:
    with pytest.raises(
        ConfigError,
        match=r"log\.level: 'trace' is not one of debug, info, "
        r"warning, error, fatal",
    ):
        LogOptions.create(level="trace")
    with pytest.raises(ConfigError, match=r"log\.format: 'xml' is not one of json, text"):
        LogOptions.create(format="xml")
    with pytest.raises(ConfigError, match=r"log\.maxAge"):
        LogOptions.create(max_age="1y")
    opts = LogOptions.create(level="WARNING", format="Text")
    assert (opts.level, opts.format, opts.level_number) == ("warning", "text", logging.WARNING)
    assert LogOptions.create(level="fatal").level_number == logging.CRITICAL


def test_flags_and_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOG_LEVEL", "debug")
    monkeypatch.setenv("LOG_MAX_AGE", "4w")
    parser = argparse.ArgumentParser()
    add_log_arguments(parser)
    opts = LogOptions.from_args(parser.parse_args(["--log-format", "text"]))
    assert opts == LogOptions(
        dir="", level="debug", format="text", rotation_time="1w", max_age="4w"
    )
    opts = LogOptions.from_args(parser.parse_args(["--log-level", "error", "--log-dir", "/x"]))
    assert (opts.level, opts.dir) == ("error", "/x")


def test_json_lines_carry_extra_fields(logger: logging.Logger) -> None:
    stream = io.StringIO()
    configure_logging(LogOptions.create(level="info"), stream=stream, logger=logger)
    logger.debug("hidden")
    logger.info("registered", extra={"resource": "metax-tech.com/gpu", "count": 2})
    logger.critical("dying")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [r["msg"] for r in lines] == ["registered", "dying"]
    first = lines[0]
    assert (first["level"], first["logger"], first["resource"], first["count"]) == (
        "info", "gpuk8s.test.logging", "metax-tech.com/gpu", 2,
    )  # fmt: skip
    assert first["ts"].endswith("+00:00")
    assert lines[1]["level"] == "fatal"


def test_text_format(logger: logging.Logger) -> None:
    stream = io.StringIO()
    configure_logging(
        LogOptions.create(format="text", level="warning"), stream=stream, logger=logger
    )
    logger.info("hidden")
    logger.warning("device unhealthy", extra={"device": "0000:03:00.0"})
    [line] = stream.getvalue().splitlines()
    assert line.endswith(" WARNING gpuk8s.test.logging: device unhealthy device=0000:03:00.0")


def test_reconfigure_replaces_handlers(logger: logging.Logger) -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging(LogOptions.create(), stream=first, logger=logger)
    configure_logging(LogOptions.create(), stream=second, logger=logger)
    logger.info("once")
    assert first.getvalue() == "" and second.getvalue().count("once") == 1


def test_log_dir_file_and_age_pruning(tmp_path: Path, logger: logging.Logger) -> None:
    log_dir = tmp_path / "metax"
    old = log_dir / "gpu-device.log.2020-01-01_00-00-00"
    log_dir.mkdir()
    old.write_text("old\n")
    recent = log_dir / "gpu-device.log.2099-01-01_00-00-00"
    recent.write_text("recent\n")
    unrelated = log_dir / "other.log.2020-01-01"
    unrelated.write_text("x\n")
    for path in (old, unrelated):
        os.utime(path, (time.time() - 30 * 86400, time.time() - 30 * 86400))
    handlers = configure_logging(
        LogOptions.create(dir=str(log_dir), rotation_time="1d", max_age="2w"),
        component="gpu-device",
        stream=io.StringIO(),
        logger=logger,
    )
    logger.info("to file")
    file_handler = handlers[1]
    assert isinstance(file_handler, AgeRotatingFileHandler)
    assert file_handler.interval == 86400
    assert not old.exists(), "rotated files older than maxAge are deleted"
    assert recent.exists() and unrelated.exists()
    file_handler.flush()
    assert json.loads((log_dir / "gpu-device.log").read_text())["msg"] == "to file"
    file_handler.doRollover()
    rotated = [p for p in os.listdir(log_dir) if p.startswith("gpu-device.log.")]
    assert len(rotated) == 2  # the recent one and the one just rotated


def test_unwritable_log_dir_is_a_config_error(tmp_path: Path, logger: logging.Logger) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"log\.dir"):
        configure_logging(LogOptions.create(dir=str(blocker / "sub")), logger=logger)
