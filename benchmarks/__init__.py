"""Benchmarks of hosttune and its engine; importable from the repository root (`benchmarks.engine.common`)."""
