"""Errors a caller can act on. Each message says what to fix.

The engine never imports the control plane, so it has its own base class.
"""


class EngineError(Exception):
    """Base of every engine error caused by input, files or the machine, not by a bug."""


class ConfigError(EngineError, ValueError):
    """An engine or sampling option is out of range or inconsistent."""


class ModelLoadError(EngineError):
    """A model folder is missing files, or its weights do not fit its config."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture or one of its features is not implemented."""


class QuantizationError(UnsupportedModelError):
    """A quantized checkpoint's method, layout or tensors are not ones the engine reads."""


class RequestError(EngineError, ValueError):
    """A request cannot be served as asked (too long, duplicate id, ...)."""


class KernelInputError(EngineError, ValueError):
    """A kernel wrapper was given tensors of the wrong shape, dtype, device or strides."""
