"""gpu-device: the Kubernetes device plugin (``gpuk8s serve device-plugin``).

Modules: ``grpcapi`` (gRPC glue over ``node.protos``), ``server`` (serve/register/watch
lifecycle), ``nodestate`` (PodResources in, node annotations out), ``sharing``,
``metrics`` and ``main`` (flags, wiring, signals). What the node offers (``node.devices``)
and its health loop (``node.health``) are shared with gpu-dra. See docs/deviceplugin.md.
"""
