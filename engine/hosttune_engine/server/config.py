"""Server configuration: one dataclass with defaults, validated when built (the engine's own is `EngineConfig`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from hosttune_engine.config import EngineConfig
from hosttune_engine.errors import ConfigError


WARMUP_MIN_LEN = 4  # a prefix-cache hit's prompt (2 tokens) and its 2 generated tokens


@dataclass(frozen=True)
class ServerConfig:
    """How the HTTP server runs one engine.

    The engine's batch size (`engine.max_num_seqs`) is the `--max-batch-size`;
    `max_queue` more sequences may wait, and past that requests get 429.
    `served_model_names` default to the model path, as in vLLM; a request may name any of them, and answers
    and metrics name the first.
    With `api_keys`, every route but /health, /metrics and /version needs one of them
    (those too with `protect_probes`). A connection gets `header_timeout_s` to send a
    request's headers and may sit idle `idle_timeout_s` between requests; past
    `max_connections` open ones, a new connection gets a 503 and is closed.
    """

    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ()
    max_queue: int = 64
    shutdown_timeout_s: float = 30.0
    retry_after_s: int = 1
    max_body_bytes: int = 8 * 2**20
    log_prompts: bool = False
    warmup: bool = True
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    protect_probes: bool = False
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    max_connections: int = 4096
    allowed_origins: tuple[str, ...] = ()  # web pages' origins that may call the API (CORS); "*": any
    generation_config: str = "auto"  # sampling defaults: "auto" the model folder's, "vllm" none, or a folder

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if not self.host.strip():
            raise ConfigError("host is empty; give an address to listen on (127.0.0.1, or 0.0.0.0 for every "
                              "interface)")
        if any(not name.strip() for name in self.served_model_names):
            raise ConfigError("served_model_name is empty; give the name clients send as 'model', or leave it out "
                              "to use the model path")
        if self.max_queue < 0:
            raise ConfigError(f"max_queue must be >= 0, got {self.max_queue}")
        if not 0 <= self.shutdown_timeout_s < math.inf:  # NaN compares False
            raise ConfigError(f"shutdown_timeout must be >= 0 seconds, got {self.shutdown_timeout_s}")
        if self.retry_after_s < 1:
            raise ConfigError(f"retry_after must be >= 1 second, got {self.retry_after_s}")
        if self.generation_config not in ("auto", "vllm") and not Path(self.generation_config).is_dir():
            raise ConfigError(f"generation_config {self.generation_config!r} is no folder: give auto (the model "
                              "folder's generation_config.json), vllm (none) or a folder holding one")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if not (0 < self.header_timeout_s < math.inf and 0 < self.idle_timeout_s < math.inf):
            raise ConfigError(f"header_timeout and idle_timeout must be > 0 seconds, got {self.header_timeout_s} "
                              f"and {self.idle_timeout_s}")
        if self.max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {self.max_connections}")
        if self.warmup and (self.engine.max_model_len or WARMUP_MIN_LEN) < WARMUP_MIN_LEN:
            raise ConfigError(f"max_model_len {self.engine.max_model_len} leaves warmup's prompts no room; give "
                              f"{WARMUP_MIN_LEN} or more (or skip warmup)")
        if self.protect_probes and not self.api_keys:
            raise ConfigError("protecting /health and /metrics needs an API key (--api-key, --api-key-file or "
                              "$HOSTTUNE_ENGINE_API_KEY)")

    @property
    def sampling_defaults_folder(self) -> str | None:
        """The folder whose generation_config.json gives requests their sampling defaults (None: no file's)."""
        return {"auto": self.engine.model, "vllm": None}.get(self.generation_config, self.generation_config)

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.served_model_names or (self.engine.model,)

    @property
    def max_batch_size(self) -> int:
        return self.engine.max_num_seqs
