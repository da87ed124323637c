"""Deploy errors a user can act on."""

from hosttune.errors import HosttuneError


class DeployError(HosttuneError):
    """A deploy cannot go ahead (bad settings, a host that cannot run the service, no wheels)."""
