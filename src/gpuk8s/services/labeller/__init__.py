"""gpu-label: writes the node labels of SPEC §4 onto the node it runs on."""
