"""container-runtime's daemon.json edits for docker nodes (a real dockerd judges them in
tests/integration/test_runtime_docker.py)."""

from __future__ import annotations

import json

import pytest

from gpuk8s.services.runtime import docker
from gpuk8s.services.runtime.containerd import RuntimeConfigError

WRAPPER = "/usr/local/gpuk8s/bin/gpuk8s-oci-runtime"
ADMIN = """{
  "log-level": "warn",
  "runtimes": {
    "custom": {
      "path": "/usr/bin/crun"
    }
  },
  "live-restore": true
}
"""


@pytest.mark.parametrize("text", ["", "{}\n", ADMIN])
def test_the_wrapper_becomes_a_docker_runtime_and_goes_again(text: str) -> None:
    done = docker.configure(text, "metax", WRAPPER, set_default=True)
    doc = json.loads(done.text)
    assert doc["runtimes"]["metax"] == {"path": WRAPPER}
    assert doc["default-runtime"] == "metax"
    if text == ADMIN:
        assert list(doc) == ["log-level", "runtimes", "live-restore", "default-runtime"]
        assert doc["runtimes"]["custom"] == {"path": "/usr/bin/crun"}
        assert done.text.startswith('{\n  "log-level"')  # its indent
    back, changed = docker.unconfigure(done.text, "metax", done.previous_default)
    assert changed and json.loads(back) == json.loads(text or "{}")
    assert docker.configure(done.text, "metax", WRAPPER, True).changed is False  # idempotent


def test_a_custom_default_runtime_is_what_the_wrapper_runs() -> None:
    text = '{"default-runtime": "custom", "runtimes": {"custom": {"path": "/usr/bin/crun"}}}'
    done = docker.configure(text, "metax", WRAPPER, set_default=True)
    assert (done.previous_default, done.base_binary) == ("custom", "/usr/bin/crun")
    back, _ = docker.unconfigure(done.text, "metax", "custom")
    assert json.loads(back)["default-runtime"] == "custom"


@pytest.mark.parametrize(("text", "reason"), [
    ("{", "not JSON"),
    ("[]", "not a JSON object"),
    ('{"runtimes": []}', '"runtimes" is not an object'),
    ('{"runtimes": {"metax": {"path": "/usr/bin/other"}}}', "not the wrapper"),
    ('{"default-runtime": "c", "runtimes": {"c": {"path": "crun", "runtimeArgs": ["--x"]}}}',
     "runtimeArgs"),
])
def test_a_daemon_json_that_cannot_be_edited_safely_is_refused(text: str, reason: str) -> None:
    with pytest.raises(RuntimeConfigError, match="nothing was changed") as err:
        docker.configure(text, "metax", WRAPPER, set_default=True)
    assert reason in str(err.value)


def test_what_dockerd_serves_is_read_from_its_info() -> None:
    info = {"Runtimes": {"runc": {"path": "runc"}, "metax": {"path": WRAPPER}},
            "DefaultRuntime": "metax"}
    assert docker.not_served(info, "metax", WRAPPER, True) is None
    assert docker.not_served(info, "metax", None, True) == "dockerd still serves runtime 'metax'"
    assert "default runtime is 'runc'" in str(docker.not_served(
        {**info, "DefaultRuntime": "runc"}, "metax", WRAPPER, True))
    assert docker.not_served({"Runtimes": {}}, "metax", WRAPPER, False) == \
        "dockerd does not serve runtime 'metax'"
