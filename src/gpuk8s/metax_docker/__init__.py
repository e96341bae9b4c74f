"""``metax-docker``: ``docker`` with MetaX GPUs and the host SDK (SPEC §10).

Every docker command and flag passes through unchanged (the wrapper ``exec``s docker, so
exit codes, stdin/tty and signals are docker's own). On ``run`` / ``create`` (also
``container run|create``) it consumes ``--gpus all|N|[ID,...]|[SN,...]``, ``--maca PATH``
and ``--maca-force`` and adds, in their place, the device nodes of exactly those GPUs,
``MACA_VISIBLE_DEVICES`` as the device plugin sets it and a read-only bind of the host SDK
at ``/opt/maca`` (unless the image has its own ``/opt/maca`` and neither ``--maca`` nor
``--maca-force`` asks for the host's), with ``LD_LIBRARY_PATH`` and ``PATH`` extending the
image's own. The edits are ``gpuk8s.core.cdi``'s (the ones container-runtime writes into
CDI specs); GPU ids, serial numbers and health come from ``gpuk8s.discovery`` (the device
plugin's ``check_health``: a GPU mx-smi reports unavailable is never handed out).

Stdlib only, Python 3.8+: it runs on hosts without gpuk8s installed, as a zipapp built
by ``package/metax_docker.py``. It may import ``gpuk8s.core`` and ``gpuk8s.discovery``
only (an import-linter contract).
"""
