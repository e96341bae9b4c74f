"""gpu-exporter: GPU metrics per GPU and per container, for Prometheus."""
