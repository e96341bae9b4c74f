"""container-runtime: SDK and device injection at container start (CDI spec + wrapper)."""
