"""Build errors a user can act on."""

from hosttune.errors import HosttuneError


class BuildError(HosttuneError):
    """A build could not be planned, failed, or produced a wheel that would not run on the fleet."""


class ArchCheckError(BuildError):
    """A built native library lacks machine code for a requested CUDA architecture."""
