"""operator-controller: driver-config, per-node status and the uninstall cleanup."""
