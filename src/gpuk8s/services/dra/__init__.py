"""gpu-dra: the DRA driver ``gpu.metax-tech.com`` (``gpuk8s serve dra-plugin``).

Modules: ``grpcapi`` (the kubelet's DRA, DRA health and registration APIs over
``node.protos``), ``server`` (sockets: serve, offer registration, keep them), ``driver``
(NodePrepareResources/Unprepare: claims to CDI devices), ``state`` (the checkpoint of
prepared claims), ``publisher`` (this node's ResourceSlices, from ``core.dra``),
``metrics`` and ``main`` (flags, wiring, probes). Devices and health come from
``services.node``, shared with gpu-device. See docs/dra.md.
"""
