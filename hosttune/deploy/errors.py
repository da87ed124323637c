"""Deploy errors a user can act on."""

from hosttune.errors import HosttuneError


class DeployError(HosttuneError):
    """A deploy cannot go ahead (bad settings, a host that cannot run the service, no wheels)."""


class PlacementError(DeployError):
    """The host's GPUs cannot hold the shape asked: replicas × tensor parallel, a shard's memory, the heads."""
