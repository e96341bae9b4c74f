# Copyright: gpuk8s contributors
# Apache License 2.0 (see LICENSE)
"""Module nvidia_container_runtime runs through the host-Python check of gpuk8s_host_python.py."""

from __future__ import annotations

from ansible.plugins.loader import action_loader

ActionModule = action_loader.get("gpuk8s_host_python", class_only=True)
