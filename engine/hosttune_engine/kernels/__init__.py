"""Triton kernels, each beside its torch reference and a launch wrapper that checks inputs.

Every module holds one operation: `<op>` launches the Triton kernel, `<op>_ref`
is the torch reference with the same semantics (the engine runs it on CPU).
"""
