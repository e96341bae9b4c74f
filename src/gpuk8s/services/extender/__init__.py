"""gpu-aware: the topology-aware kube-scheduler extender (filter / prioritize)."""
