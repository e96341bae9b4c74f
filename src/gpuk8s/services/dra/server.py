"""gpu-dra's sockets: serve the DRA services, then offer registration, and keep both.

Order (the kubelet's plugin watcher, pkg/kubelet/pluginmanager): the DRA socket
``<plugin dir>/dra.sock`` (DRAPlugin v1 + v1beta1, DRAResourceHealth v1 + v1alpha1) is served and
answers first; then the registration socket ``<registry dir>/gpu.metax-tech.com-reg.sock``
appears. The watcher notices it, calls ``GetInfo`` (type ``DRAPlugin``, the driver name,
the DRA socket's path, the services we offer) and reports the outcome through
``NotifyRegistrationStatus``. A restarted kubelet finds the registration socket again
when it walks the directory at start; the plugin keeps serving through it.

If either socket file disappears or is replaced (someone cleaned the directory), both
servers are stopped and started again, which makes the watcher register the plugin anew.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from ...core.dra import DRIVER
from ...core.errors import GpuK8sError
from ..node.grpcapi import FileId, file_id, unix_target
from .grpcapi import (
    PLUGIN_TYPE,
    SUPPORTED_SERVICES,
    DraServicer,
    HealthStream,
    RegistrationStub,
    dra_handlers,
    health_handlers,
    reg,
    registration_handler,
)

log = logging.getLogger("gpuk8s.dra.server")

DEFAULT_PLUGIN_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"

class ServeError(GpuK8sError):
    """A socket cannot be served (temporary: retried)."""


@dataclass(frozen=True)
class ServerOptions:
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    registry_dir: str = DEFAULT_REGISTRY_DIR
    socket_name: str = "dra.sock"
    registration_name: str = f"{DRIVER}-reg.sock"
    watch_interval: float = 0.5
    retry_max: float = 30.0
    workers: int = 8

    @property
    def socket_path(self) -> str:
        return os.path.join(self.plugin_dir, self.socket_name)

    @property
    def registration_path(self) -> str:
        return os.path.join(self.registry_dir, self.registration_name)


class DraServer:
    def __init__(self, servicer: DraServicer, health_stream: HealthStream,
                 options: ServerOptions) -> None:
        self.servicer = servicer
        self.health_stream = health_stream
        self.options = options
        self.registered = threading.Event()  # the kubelet said plugin_registered=true
        self.registrations = 0
        self.last_status: str | None = None
        self._servers: list[grpc.Server] = []
        self._ids: dict[str, FileId | None] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()

    # -- registration service -------------------------------------------------------------
    def _get_info(self, request: Any, context: grpc.ServicerContext) -> Any:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=self.options.socket_path,
                              supported_versions=list(SUPPORTED_SERVICES))

    def _notify(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.plugin_registered:
            self.registrations += 1
            self.registered.set()
            self.last_status = None
            log.info("registered with the kubelet", extra={"registrations": self.registrations})
        else:
            self.registered.clear()
            self.last_status = request.error
            log.error("the kubelet refused the registration", extra={"error": request.error})
        return reg.RegistrationStatusResponse()

    # -- one round ---------------------------------------------------------------------
    def _listen(self, path: str, handlers: list[grpc.GenericRpcHandler], name: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)  # stale socket of an earlier run
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.options.workers,
                                                        thread_name_prefix=name))
        server.add_generic_rpc_handlers(tuple(handlers))
        try:
            server.add_insecure_port(unix_target(path))
        except RuntimeError as err:
            raise ServeError(f"cannot listen on {path}: {err}") from err
        server.start()
        self._servers.append(server)
        self._ids[path] = file_id(path)

    def serve(self) -> None:
        opts = self.options
        self._listen(opts.socket_path,
                     [*dra_handlers(self.servicer), *health_handlers(self.health_stream)], "dra")
        self._listen(opts.registration_path,
                     [registration_handler(self._get_info, self._notify)], "dra-reg")
        try:
            with grpc.insecure_channel(unix_target(opts.registration_path)) as channel:
                RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=5.0,
                                                  wait_for_ready=True)
        except grpc.RpcError as err:
            raise ServeError(f"own socket {opts.registration_path} does not answer: {err}") \
                from err
        log.info("serving", extra={"socket": opts.socket_path,
                                   "registration": opts.registration_path})

    def shutdown(self) -> None:
        self.registered.clear()
        for server in self._servers:
            server.stop(0.2).wait(5.0)
        self._servers = []
        for path, known in self._ids.items():
            if known is not None and file_id(path) == known:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        self._ids = {}

    def needs_restart(self) -> str | None:
        for path, known in self._ids.items():
            now = file_id(path)
            if now is None:
                return f"{path} was removed"
            if now != known:
                return f"{path} was replaced"
        return None

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        delay = 0.5
        try:
            while not self._stop.is_set():
                try:
                    self.serve()
                except (ServeError, OSError) as err:
                    log.warning("serving failed, retrying",
                                extra={"error": str(err), "retry_in_s": delay})
                    self.shutdown()
                    self._sleep(delay)
                    delay = min(delay * 2, self.options.retry_max)
                    continue
                delay = 0.5
                while not self._stop.is_set():
                    self._sleep(self.options.watch_interval)
                    why = None if self._stop.is_set() else self.needs_restart()
                    if why is not None:
                        log.info("socket gone: serving again", extra={"reason": why})
                        break
                self.shutdown()
        finally:
            self.shutdown()

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    @property
    def serving(self) -> bool:
        return bool(self._servers)

