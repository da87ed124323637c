"""Errors a user can act on. Each message says what to fix."""


class HosttuneError(Exception):
    """Base of every error caused by user input or host state, not by a bug."""


class InventoryError(HosttuneError):
    """The inventory file is malformed; the message names file, line and field."""


class ProfileError(HosttuneError):
    """A playbook (profile) is malformed or unknown."""


class TransportError(HosttuneError):
    """A host could not be reached or a command could not be sent."""


class CommandTimeout(TransportError):
    """A command sent to a host did not finish within its time."""


class HostKeyError(TransportError):
    """A host's SSH key is unknown or has changed."""


class ReadOnlyError(HosttuneError):
    """A connection opened read-only (check, plan, verify) was asked to change its host."""


class ProbeError(HosttuneError):
    """A probe's output could not be understood."""


class BenchError(HosttuneError):
    """A load test was misconfigured, or its target could not be used."""
