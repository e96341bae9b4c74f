"""Project exceptions. Domain code raises these; only the edges (CLI, Ansible
``main()``, gRPC/HTTP handlers) turn them into exit codes, ``fail_json`` or
protocol errors."""

from __future__ import annotations


class GpuK8sError(Exception):
    """Base class: a message a person can act on."""


class InventoryError(GpuK8sError):
    """The GPU inventory is inconsistent."""


class AllocationError(GpuK8sError):
    """A request cannot be satisfied (unknown devices, too few available, ...)."""


class ConfigError(GpuK8sError):
    """Bad user input: names the field and the allowed values."""


class ManifestError(GpuK8sError):
    """A Kubernetes manifest or scheduler configuration cannot be edited safely."""
