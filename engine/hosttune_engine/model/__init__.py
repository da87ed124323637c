"""Llama and Qwen2 as plain nn.Modules, their config, weight loading and tokenizer."""
