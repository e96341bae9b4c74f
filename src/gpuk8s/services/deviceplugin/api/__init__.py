"""Generated from ../proto/*.proto; do not edit, do not commit."""
