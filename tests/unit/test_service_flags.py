"""The flags every service shares (--kubeconfig, --health-port, log options) are
declared once, in services/flags.py, and every service's parser takes them from there."""

from __future__ import annotations

import argparse
import importlib
import re

import pytest

from gpuk8s.cli import SERVICES
from gpuk8s.services.flags import KUBECONFIG_FALLBACK, port_number

# the extender's --health-port is the shared one with ``unset``: unset means "the main port
# serves the probes" and 0 a free port; the others default to 0, off
OWN_HEALTH_PORT = {"extender"}
# exporter: the probes are on its --port, beside /metrics; node-cleanup: a helm hook that
# exits when done
NO_HEALTH_PORT = {"exporter", "node-cleanup"}


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


def _parser(service: str) -> argparse.ArgumentParser:
    parser = importlib.import_module(SERVICES[service]).build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_service_declares_kubeconfig_and_logging_alike(
    service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # $KUBECONFIG is no default of the flag: kube.api_client prefers the pod's account
    monkeypatch.setenv("KUBECONFIG", "/nowhere/config")
    parser = _parser(service)
    kubeconfig = _action(parser, "--kubeconfig")
    assert kubeconfig is not None and kubeconfig.default is None
    assert kubeconfig.metavar == "PATH"
    assert kubeconfig.help is not None
    assert kubeconfig.help.endswith(f"(default: {KUBECONFIG_FALLBACK})")
    for flag in ("--log-dir", "--log-level", "--log-format", "--log-rotation-time",
                 "--log-max-age"):
        assert _action(parser, flag) is not None, flag


@pytest.mark.parametrize("service", sorted(set(SERVICES) - OWN_HEALTH_PORT - NO_HEALTH_PORT))
def test_every_health_port_is_the_shared_one(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTH_PORT", "8081")  # no environment default either
    parser = _parser(service)
    health = _action(parser, "--health-port")
    assert health is not None and health.type is port_number and health.default == 0
    assert health.help is not None and health.help.endswith("(default 0: off)")


@pytest.mark.parametrize("service", sorted(set(SERVICES) - OWN_HEALTH_PORT - NO_HEALTH_PORT))
def test_a_port_out_of_range_is_a_usage_error(
    service: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser(service).parse_args(["--health-port", "70000"])
    assert exited.value.code == 2
    assert "--health-port: 70000 is not in 0..65535 (0: off)" in capsys.readouterr().err


def test_the_extenders_health_port_is_the_shared_one_unset_by_default() -> None:
    health = _action(_parser("extender"), "--health-port")
    assert health is not None and health.type is port_number and health.default is None
    assert health.help is not None
    assert "the main port serves them too; 0: a free port" in health.help
    assert _parser("extender").parse_args(["--health-port", "0"]).health_port == 0


def test_port_number() -> None:
    assert [port_number(text) for text in ("0", "8081", "65535")] == [0, 8081, 65535]
    for text, message in (("-1", "-1 is not in 0..65535"), ("65536", "65536 is not in"),
                          ("http", "'http' is not a port number (0..65535)")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
            port_number(text)


def test_top_shares_the_kubeconfig_flag() -> None:
    from gpuk8s.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    kubeconfig = _action(sub.choices["top"], "--kubeconfig")
    assert kubeconfig is not None and kubeconfig.default is None
    assert kubeconfig.help is not None and KUBECONFIG_FALLBACK in kubeconfig.help
