"""gpuk8s: GPUs on Kubernetes, driven by Ansible (MetaX first, NVIDIA second)."""

__version__ = "0.1.0"
