"""What the node agents that serve GPUs to the kubelet share: gpu-device
(``services.deviceplugin``), gpu-dra (``services.dra``) and gpu-exporter build on it and
never import one another.

Modules: ``devices`` (the node's allocatable units, their health and container edits),
``health`` (the health loop), ``protos`` (kubelet gRPC APIs generated from ``proto/``),
``grpcapi`` (gRPC helpers and the PodResources wire), ``podresources`` (the PodResources
client) and ``nodeclient`` (the plugin's access to its own Node).
"""
