"""The Qwen2.5-7B shape (config.json fields) that GPU checks and benchmarks build dummy models from."""

QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 152064,
    "tie_word_embeddings": False, "use_sliding_window": False, "torch_dtype": "bfloat16", "eos_token_id": 151645,
}
