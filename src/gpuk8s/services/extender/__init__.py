"""gpu-aware: the kube-scheduler extender (``gpuk8s serve gpu-aware``).

One request runs one straight path: ``wire`` parses the body once (``parse_args``), with
the pod's ``demand`` computed once (GPUs, CPU, memory, share, CUDA runtime, over the
typed ``views``); ``logic`` takes the candidates (the request's Nodes or the ``nodes``
cache), runs the checks as passes over one verdict set (duplicates, capacity and
promised GPUs, ``share`` for shared GPUs, ``cuda``) and encodes the answer with one
encoder, which echoes kept Node objects byte for byte; prioritize ranks with
``packing`` (whole GPUs) or ``share``. ``filtered`` remembers what filter kept for
``bind``; ``share`` books shared GPUs and binds. Around them: ``server`` and ``tls``
(HTTP/HTTPS), ``watch`` (node and pod watches feeding ``nodes``, ``packing``, ``share``
and ``cuda``), ``requeue`` and ``notify`` (nudging pods turned away), ``leader``
(one replica books shared GPUs), ``weights`` (the ConfigMap), ``debug`` and ``main``
(flags, wiring). See docs/extender.md.
"""
