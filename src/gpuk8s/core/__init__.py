"""Pure core: stdlib only, relative imports, no I/O (shipped to hosts by Ansible)."""
