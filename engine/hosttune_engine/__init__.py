"""hosttune's bundled inference engine."""

__version__ = "0.1.0"
