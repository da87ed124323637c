"""Tensor parallelism: one engine over several GPUs of a host, one process per GPU (torch.distributed)."""
