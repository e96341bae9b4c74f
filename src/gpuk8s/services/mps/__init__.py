"""gpu-mps: NVIDIA MPS control daemons per GPU on nodes in sharing mode mps."""
