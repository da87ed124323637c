"""Model building blocks that dispatch to a Triton kernel or its torch reference."""
