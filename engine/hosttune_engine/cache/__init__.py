"""Paged KV cache: the torch-free block manager and the GPU/CPU KV pool."""
