"""driver-manager's two jobs on its node, one pass at a time (the procedures are
``gpuk8s.host``; this is the glue that feeds them and reports).

``DriverAgent`` (container ``driver``): the deploy policy for the kernel driver from the
payload image, then the node's VF count (``metax-tech.com/vfnum.desired``, which
operator-controller sets from ConfigMap ``driver-config`` after validating it).
Day 2: a change to a *loaded* driver (upgrade, reload) and a VF change wait until
operator-controller has drained the node and set its ``metax-tech.com/driver.upgrade-state``
to ``upgrading`` (the rolling upgrade, ``services/operator/upgrade.py``); the result is the
report the controller validates. A first install on a node without a driver needs no
drain and goes ahead at once.

``MacaAgent`` (container ``maca``): picks the SDK image for the node's product and OS,
asks the matching payload container for its ``/opt/maca`` (file ``maca.want`` in the
shared payload volume), installs it as ``/opt/maca`` atomically and marks ``maca.ready``.

Payload volume (an emptyDir shared with the payload containers, which run the payload
images and copy their content there; see the chart):

    driver/            the driver image's /driver (a host-layout tree or one .deb/.rpm/.run)
    driver.complete    the image reference, written after driver/ is complete
    maca.want          the SDK image the maca agent wants (written by the agent)
    maca/              that image's /opt/maca
    maca.complete      its reference, written after maca/ is complete
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ConfigError, GpuK8sError
from ...core.labels import UPGRADE_STATE_LABEL as STATE_LABEL
from ...core.labels import UPGRADE_UPGRADING as UPGRADING
from ...core.labels import compute_labels
from ...core.payloads import select_sdk_image
from ...discovery import discover
from ...discovery.tools import Runner
from ...host import driver as drv
from ...host import sdk, vf
from ...host.files import atomic_write
from ...host.readiness import write_readiness
from ..nodeagent import VFNUM_DESIRED, Report, Reporter

log = logging.getLogger("gpuk8s.driver-manager")

PACKAGE_SUFFIXES = (".deb", ".rpm", ".run")


def read_marker(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def driver_payload_path(directory: str) -> str:
    """The payload inside the driver image's copy: its single package file, else the tree."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as err:
        raise drv.PayloadError(f"payload directory {directory} unreadable: {err}") from err
    packages = [n for n in names if n.endswith(PACKAGE_SUFFIXES)]
    if len(packages) > 1:
        raise drv.PayloadError(f"driver payload holds several packages ({', '.join(packages)}): "
                               "an image must carry one")
    return os.path.join(directory, packages[0]) if packages else directory


@dataclass
class PayloadSource:
    """Where a payload container copies its image, and how to tell why it has not."""

    directory: str  # the payload volume
    image: str  # reference, for messages
    container: str  # name of the payload container in this pod
    pod_status: Any = None  # callable () -> pod status dict, or None

    def complete(self, name: str) -> bool:
        return read_marker(os.path.join(self.directory, f"{name}.complete")) == self.image

    def why_missing(self) -> str:
        """The payload container's state, when the pod's status says more (pull errors)."""
        if self.pod_status is None:
            return "the payload container has not copied it yet"
        try:
            status = self.pod_status()
        except GpuK8sError as err:
            return f"pod status unavailable: {err}"
        for entry in status.get("containerStatuses") or []:
            if entry.get("name") != self.container:
                continue
            waiting = (entry.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                return f"{waiting['reason']}: {waiting.get('message') or ''}".strip()
            terminated = (entry.get("state") or {}).get("terminated") or {}
            if terminated:
                return (f"payload container exited with {terminated.get('exitCode')}: "
                        f"{terminated.get('message') or terminated.get('reason') or ''}")
        return "the payload container has not copied it yet"


def _pull_failed(reason: str) -> bool:
    return any(word in reason for word in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                            "ErrImageNeverPull", "exited with"))


@dataclass
class DriverAgent:
    root: str
    request: drv.InstallRequest  # policy, version, commands; payload filled per pass
    reporter: Reporter
    runner: Runner
    payload: PayloadSource | None = None  # None with deployPolicy Never
    node: Any = None  # callable () -> Node dict (desired vfnum), None: no VF management
    vf_command: Sequence[str] | None = None
    # callable () -> Node dict: changes to a loaded driver / VFs wait for the node's
    # upgrade-state "upgrading" (operator-controller's drain); None: no gate (no API)
    gate: Any = None
    payload_grace: float = 120.0  # seconds to wait for the payload before reporting failure
    started: float = field(default_factory=time.monotonic)
    _recovered: bool = False

    def one_pass(self) -> Report:
        if not self._recovered:
            done = drv.recover(self.root, self.request, self.runner)
            self._recovered = True
            if done:
                log.warning(done)
        report = self._driver()
        if report.state == "ready":
            report = self._vfnum(report)
        self.reporter.publish(report)
        return report

    def _driver(self) -> Report:
        state = drv.read_state(self.root, self.runner)
        try:
            decision = drv.decide(self.request.policy, self.request.version, state)
        except ConfigError as err:
            return Report("failed", str(err))
        details: dict[str, Any] = {"policy": self.request.policy,
                                   "version": state.loaded_version, "mode": state.mode,
                                   "wanted": self.request.version}
        if not decision.changes:
            if not state.loaded:
                return Report("disabled" if self.request.policy == "Never" else "pending",
                              f"no driver loaded: {decision.reason}", details)
            return Report("ready", decision.reason, details)
        if state.loaded:
            held = self._held()
            if held:
                return Report("pending", f"{decision.reason}; {held}", details)
        request = self.request
        if decision.install:
            if self.payload is None:
                return Report("failed", "no payload image configured", details)
            if not self.payload.complete("driver"):
                why = self.payload.why_missing()
                waited = time.monotonic() - self.started
                if _pull_failed(why) or waited > self.payload_grace:
                    return Report("failed", f"driver payload image {self.payload.image} "
                                            f"unavailable ({why}); nothing was installed",
                                  details)
                return Report("pending", f"waiting for payload {self.payload.image}: {why}",
                              details)
            try:
                path = driver_payload_path(os.path.join(self.payload.directory, "driver"))
            except drv.PayloadError as err:
                return Report("failed", str(err), details)
            request = _with_payload(request, path)
        try:
            outcome = drv.converge(self.root, request, self.runner)
        except drv.GpuBusyError as err:
            return Report("pending", f"{decision.reason}; waiting: {err}", details)
        except GpuK8sError as err:
            return Report("failed", f"{decision.reason}: {err}", details)
        details.update(version=outcome.after.loaded_version, mode=outcome.after.mode,
                       actions=outcome.actions)
        return Report("ready", f"driver {outcome.after.loaded_version} "
                               f"({', '.join(outcome.actions)}): {decision.reason}", details)

    def _vfnum(self, report: Report) -> Report:
        if self.node is None:
            return report
        try:
            node: Mapping[str, Any] = self.node()
        except GpuK8sError as err:
            log.warning("cannot read the node for its vfnum", extra={"error": str(err)})
            return report
        wanted = ((node.get("metadata") or {}).get("annotations") or {}).get(VFNUM_DESIRED)
        inventory = discover(self.root, runner=self.runner)
        current = max((g.sriov.num_vfs for g in inventory.gpus), default=0)
        report.details["vfnum"] = current
        if wanted is None:
            return report
        try:
            plan = vf.plan(inventory, int(wanted))
        except (ConfigError, ValueError) as err:
            return Report("failed", f"vfnum {wanted}: {err}", report.details)
        if not plan.changed:
            return report
        held = self._held(node)
        if held:
            return Report("pending", f"vfnum {current} -> {wanted}: {held}", report.details)
        busy = drv.gpu_processes(self.root)
        if busy:
            return Report("pending", f"vfnum {current} -> {wanted} waits: "
                                     f"{drv.busy_message(busy)}", report.details)
        try:
            done = vf.apply(self.root, plan, self.runner, self.vf_command)
        except GpuK8sError as err:
            return Report("failed", f"vfnum {current} -> {wanted}: {err}", report.details)
        report.details.update(vfnum=plan.vfnum, vfnumApplied=time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        for warning in done.warnings:
            log.warning(warning)
        return Report("ready", f"{report.message}; vfnum {current} -> {plan.vfnum}",
                      report.details)


    def _held(self, node: Mapping[str, Any] | None = None) -> str | None:
        """Why a change must wait for operator-controller (None: go ahead)."""
        if self.gate is None:
            return None
        try:
            current: Mapping[str, Any] = node if node is not None else self.gate()
        except GpuK8sError as err:
            return f"waiting: cannot read the node's upgrade state ({err})"
        state = ((current.get("metadata") or {}).get("labels") or {}).get(STATE_LABEL)
        if state == UPGRADING:
            return None
        return (f"waits for operator-controller to drain the node ({STATE_LABEL}="
                f"{state or 'none'}; goes ahead at {UPGRADING})")


def _with_payload(request: drv.InstallRequest, path: str) -> drv.InstallRequest:
    from dataclasses import replace

    return replace(request, payload=path)


@dataclass
class MacaAgent:
    root: str
    images: Sequence[str]
    reporter: Reporter
    payload: PayloadSource  # image: filled with the selected image each pass
    status_dir: str
    payload_grace: float = 300.0
    started: float = field(default_factory=time.monotonic)

    def one_pass(self) -> Report:
        report = self._pass()
        # waiting for a new SDK's payload (a helm upgrade of maca.payload.images): the SDK
        # installed before stays in use and ready, so gpu-device (which needs maca.ready)
        # does not leave the node meanwhile
        ready = report.state == "ready"
        if report.state == "pending":
            installed = sdk.read_sdk(self.root)
            ready = installed.managed and bool(installed.version)
        write_readiness(self.root, "maca.ready", ready, self.status_dir)
        self.reporter.publish(report)
        return report

    def _pass(self) -> Report:
        inventory = discover(self.root)
        if not inventory.has_gpus:
            return Report("disabled", "no vendor GPU on this node")
        product = compute_labels(inventory).get("metax-tech.com/gpu.product", "")
        current = sdk.read_sdk(self.root)
        if current.native:
            return Report("ready", f"/opt/maca installed by the administrator (SDK "
                                   f"{current.version or 'unknown'}): left alone",
                          {"version": current.version, "managed": False})
        try:
            image = select_sdk_image(self.images, sdk.node_platform(self.root, product))
        except ConfigError as err:
            return Report("failed", str(err))
        self.payload.image = image.ref
        want = os.path.join(self.payload.directory, "maca.want")
        if read_marker(want) != image.ref:
            atomic_write(want, image.ref + "\n")
        details: dict[str, Any] = {"image": image.ref, "managed": True}
        if current.managed and current.version and image.version and \
                drv.same_version(current.version, image.version):
            return Report("ready", f"SDK {current.version} from {image.ref}",
                          {**details, "version": current.version})
        if not self.payload.complete("maca"):
            why = self.payload.why_missing()
            if _pull_failed(why) or time.monotonic() - self.started > self.payload_grace:
                return Report("failed", f"SDK payload {image.ref} unavailable ({why})", details)
            return Report("pending", f"waiting for SDK payload {image.ref}: {why}", details)
        try:
            # the tag says which SDK the image holds (2.33.0.4-ubuntu22.04-amd64): a tree
            # holding another one is refused before /opt/maca changes
            changed, version = sdk.install_sdk(
                self.root, os.path.join(self.payload.directory, "maca"), image.version,
                f"what its image tag {image.tag} says")
        except GpuK8sError as err:
            return Report("failed", f"SDK from {image.ref}: {err}", details)
        verb = "installed" if changed else "in place:"
        return Report("ready", f"SDK {version} {verb} from {image.ref}",
                      {**details, "version": version})
