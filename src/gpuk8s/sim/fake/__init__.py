"""Fake vendor tools installed into simulated roots (each file is a standalone script)."""
