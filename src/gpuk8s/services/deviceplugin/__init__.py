"""gpu-device: the Kubernetes device plugin (``gpuk8s serve device-plugin``).

Modules: ``devices`` (what the node offers: ids, health, allocation specs),
``health`` (health loop), ``grpcapi`` (gRPC glue over ``protos``), ``server``
(serve/register/watch lifecycle), ``nodestate`` (PodResources in, node annotations
out), ``metrics`` and ``main`` (flags, wiring, signals). See docs/deviceplugin.md.
"""
