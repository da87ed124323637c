"""hosttune: get bare-metal GPU hosts ready to serve LLMs, and keep them that way."""

__version__ = "0.1.0"
