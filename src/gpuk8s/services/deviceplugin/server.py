"""Plugin lifecycle: serve on ``<plugin dir>/<socket>``, register, watch, start over.

Order (REFERENCE §B): serve gRPC first, check that the socket answers, then call
``Register`` on ``<plugin dir>/kubelet.sock``. A new kubelet deletes every socket in
the plugin directory and creates a new ``kubelet.sock``; the watch loop notices
either (our socket gone or replaced, ``kubelet.sock`` recreated) within
``watch_interval`` and serves and registers again. Failed attempts back off
exponentially (``retry_initial`` doubling up to ``retry_max``), so a kubelet that is
down or rejects us does not cause a restart storm; a ``kubelet.sock`` that appears (or
is recreated) during the back-off ends it at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc

from ...core.errors import GpuK8sError
from ..node.grpcapi import FileId, file_id, unix_target
from .grpcapi import (
    API_VERSION,
    DevicePluginServicer,
    DevicePluginStub,
    RegistrationStub,
    device_plugin_handler,
    dp,
)
from .metrics import PluginMetrics

log = logging.getLogger("gpuk8s.deviceplugin.server")

KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"

class RegistrationError(GpuK8sError):
    """Serving or registering failed (temporary: retried with back-off)."""


@dataclass(frozen=True)
class ServerOptions:
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    socket_name: str = "metax-tech.com-gpu.sock"
    resource_name: str = "metax-tech.com/gpu"
    watch_interval: float = 0.5
    register_timeout: float = 5.0
    retry_initial: float = 0.5
    retry_max: float = 30.0
    workers: int = 8

    @property
    def socket_path(self) -> str:
        return os.path.join(self.plugin_dir, self.socket_name)

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.plugin_dir, KUBELET_SOCKET)


ServicerFactory = Callable[[threading.Event], DevicePluginServicer]


class PluginServer:
    """Runs one device plugin endpoint until ``stop()``."""

    def __init__(
        self,
        make_servicer: ServicerFactory,
        options: ServerOptions,
        metrics: PluginMetrics,
        wake_watchers: Callable[[], None] | None = None,
    ) -> None:
        self.make_servicer = make_servicer
        self.wake_watchers = wake_watchers  # ends open ListAndWatch streams promptly
        self.options = options
        self.metrics = metrics
        self.registrations = 0
        self.registered = threading.Event()  # set while registered with a kubelet
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._restart = threading.Event()
        self._server: grpc.Server | None = None
        self._serving_stop: threading.Event | None = None
        self._socket_id: FileId | None = None
        self._kubelet_id: FileId | None = None

    # -- one round ------------------------------------------------------------
    def serve(self) -> None:
        path = self.options.socket_path
        os.makedirs(self.options.plugin_dir, exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)  # stale socket of an earlier run
        serving_stop = threading.Event()
        servicer = self.make_servicer(serving_stop)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.options.workers, thread_name_prefix="dp")
        )
        server.add_generic_rpc_handlers((device_plugin_handler(servicer),))
        try:
            server.add_insecure_port(unix_target(path))
        except RuntimeError as err:
            raise RegistrationError(f"cannot listen on {path}: {err}") from err
        server.start()
        self._server, self._serving_stop = server, serving_stop
        self._socket_id = file_id(path)
        try:
            with grpc.insecure_channel(unix_target(path)) as channel:
                DevicePluginStub(channel).GetDevicePluginOptions(
                    dp.Empty(), timeout=self.options.register_timeout, wait_for_ready=True
                )
        except grpc.RpcError as err:
            raise RegistrationError(f"own socket {path} does not answer: {err}") from err
        log.info("serving", extra={"socket": path})

    def register(self) -> None:
        kubelet = self.options.kubelet_socket
        self._kubelet_id = file_id(kubelet)
        if self._kubelet_id is None:
            raise RegistrationError(f"{kubelet} does not exist (kubelet not running?)")
        request = dp.RegisterRequest(
            version=API_VERSION,
            endpoint=self.options.socket_name,
            resource_name=self.options.resource_name,
            options=dp.DevicePluginOptions(
                pre_start_required=False, get_preferred_allocation_available=True
            ),
        )
        try:
            with grpc.insecure_channel(unix_target(kubelet)) as channel:
                RegistrationStub(channel).Register(request, timeout=self.options.register_timeout)
        except grpc.RpcError as err:
            raise RegistrationError(f"Register with {kubelet} failed: {_rpc_text(err)}") from err
        self.registrations += 1
        self.metrics.registrations.inc()
        self.registered.set()
        log.info(
            "registered with the kubelet",
            extra={
                "resource": self.options.resource_name,
                "endpoint": self.options.socket_name,
                "registrations": self.registrations,
            },
        )

    def shutdown(self, grace: float = 0.2) -> None:
        """Stop serving; remove our socket if it is still ours."""
        self.registered.clear()
        if self._serving_stop is not None:
            self._serving_stop.set()
            if self.wake_watchers is not None:
                self.wake_watchers()
        if self._server is not None:
            self._server.stop(grace).wait(5.0)
            self._server = None
        path = self.options.socket_path
        if self._socket_id is not None and file_id(path) == self._socket_id:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._socket_id = None

    def needs_restart(self) -> str | None:
        """Why the current registration is void, or None while it holds."""
        if self._restart.is_set():
            self._restart.clear()
            return "restart requested"
        current = file_id(self.options.socket_path)
        if current is None:
            return "our socket was removed"
        if current != self._socket_id:
            return "our socket was replaced"
        kubelet = file_id(self.options.kubelet_socket)
        if kubelet is None:
            return "kubelet.sock was removed"
        if kubelet != self._kubelet_id:
            return "kubelet.sock was recreated"
        return None

    # -- the loop -------------------------------------------------------------
    def run(self) -> None:
        """Serve, register and watch until ``stop()``; never raises for kubelet trouble."""
        delay = self.options.retry_initial
        try:
            while not self._stop.is_set():
                try:
                    self.serve()
                    self.register()
                except (RegistrationError, OSError) as err:
                    self.metrics.registration_failures.inc()
                    log.warning(
                        "serve/register failed, retrying",
                        extra={"error": str(err), "retry_in_s": round(delay, 3)},
                    )
                    self.shutdown()
                    self._back_off(delay)
                    delay = min(delay * 2, self.options.retry_max)
                    continue
                delay = self.options.retry_initial
                while not self._stop.is_set():
                    self._sleep(self.options.watch_interval)
                    why = None if self._stop.is_set() else self.needs_restart()
                    if why is not None:
                        log.info(
                            "kubelet restart detected: serving and registering again",
                            extra={"reason": why},
                        )
                        break
                self.shutdown()
        finally:
            self.shutdown()
            log.info("plugin server stopped", extra={"socket": self.options.socket_path})

    def _back_off(self, seconds: float) -> None:
        """Wait ``seconds``, but retry at once when a (new) kubelet.sock shows up:
        a long back-off must not delay registering with a kubelet that just started."""
        kubelet = self.options.kubelet_socket
        before = file_id(kubelet)
        deadline = time.monotonic() + seconds
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._sleep(min(self.options.watch_interval, remaining))
            now = file_id(kubelet)
            if now is not None and now != before:
                return

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def request_restart(self) -> None:
        """Serve and register again (SIGHUP)."""
        self._restart.set()
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()


def _rpc_text(err: grpc.RpcError) -> str:
    code = getattr(err, "code", None)
    details = getattr(err, "details", None)
    if callable(code) and callable(details):
        return f"{code()}: {details()}"
    return str(err)


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (helper for callers and tests)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()
