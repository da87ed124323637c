"""hosttune's bundled inference engine.

`SamplingParams` and `EngineConfig` import without torch; `LLM`, `Engine` and
`EngineLoop` load torch when first used.
"""

from hosttune_engine.config import EngineConfig
from hosttune_engine.sampling import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "Engine", "EngineLoop", "EngineConfig", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from hosttune_engine.llm import LLM

        return LLM
    if name == "Engine":
        from hosttune_engine.core.engine import Engine

        return Engine
    if name == "EngineLoop":
        from hosttune_engine.core.engine_loop import EngineLoop

        return EngineLoop
    raise AttributeError(f"module 'hosttune_engine' has no attribute {name!r}")
