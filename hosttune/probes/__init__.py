"""Probes: read-only fact gathering. One batched script per host, pure parsers."""
