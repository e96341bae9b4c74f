"""operator-controller's --node-selector: the release's nodeSelector as the label selector
of every node list it makes (two schemes side by side, inventories/fleet)."""

from __future__ import annotations

import pytest

from gpuk8s.core.errors import ConfigError
from gpuk8s.services.operator.main import GPU_NODES, check_node_selector, main, selected


def test_the_gpu_node_list_is_anded_with_the_releases_selector() -> None:
    assert selected(GPU_NODES, "") == GPU_NODES
    assert selected(GPU_NODES, "gpuk8s.io/scheme=operator") == (
        "metax-tech.com/gpu.installed=true,gpuk8s.io/scheme=operator")
    assert selected("", "a=b") == "a=b" and selected("", "") == ""


@pytest.mark.parametrize("good", ["", "gpuk8s.io/scheme=operator", "a=b,example.com/x=",
                                  "kubernetes.io/hostname=gpu-op"])
def test_key_value_selectors_are_accepted(good: str) -> None:
    check_node_selector(good)


@pytest.mark.parametrize("bad", ["scheme", "a=b,", "a in (b)", "a!=b", "a=b c", "=b", "a==b"])
def test_anything_else_is_refused_naming_the_flag_and_the_term(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--node-selector: .* must be key=value"):
        check_node_selector(bad)


def test_a_bad_selector_is_a_configuration_error_before_any_api_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--namespace", "ns", "--node-selector", "a in (b)", "--uninstall"]) == 2
    assert "--node-selector: 'a in (b)' must be key=value" in capsys.readouterr().err
