"""Operations on a GPU host: driver install / load / verify, SR-IOV VFs, SDK copy,
readiness markers, the OCI runtime wrapper.

One implementation of each, called by the Ansible modules (``library/``, shipped to hosts
as module_utils), the operator's node agents (``gpuk8s serve driver-manager`` /
``container-runtime``) and the CLI alike. Stdlib only, Python 3.8+, relative imports of
``core`` and ``discovery`` only. Every path is taken under a host root (``/`` on a host,
``/host`` in a container, a simulator root in tests). Commands run through an injected
*runner* (``argv -> (rc, stdout, stderr)``): Ansible passes ``module.run_command``, the
services a subprocess runner (``discovery.tools.default_runner``).
"""

from __future__ import annotations

from ..discovery.tools import Runner, default_runner, host_path

__all__ = ["Runner", "default_runner", "host_path"]
