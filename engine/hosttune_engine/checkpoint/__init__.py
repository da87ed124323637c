"""Quantized checkpoints written from plain ones, with activation-aware scales found by running the engine."""
