"""Starter kernels for the built-in targets (the offline policy's seeds) and PTX-level edits of compiled kernels."""
