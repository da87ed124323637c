"""Who may call the server: `Authorization: Bearer <key>` checked against the configured keys.

Every key is compared in constant time (hmac.compare_digest), and every one of them is
compared, so the time a check takes says nothing about which key came close. A key never
reaches a log line: a refusal logs the path only. /health and /metrics stay open for load
balancers and Prometheus unless the server is told to protect them too.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from hosttune_engine.errors import ConfigError
from hosttune_engine.server.api_errors import ApiError
from hosttune_engine.server.options import KEY_ENV

PROBE_PATHS = frozenset({"/health", "/metrics"})
OPEN_PATHS = frozenset({"/version"})
REFUSAL = "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'"


@dataclass(frozen=True)
class KeyRing:
    """The keys a request may present; empty means the server answers anyone."""

    keys: tuple[bytes, ...] = field(default=(), repr=False)

    @property
    def is_enabled(self) -> bool:
        return bool(self.keys)

    def accepts(self, authorization: str | None) -> bool:
        offered = _bearer(authorization)
        matched = False
        for key in self.keys:
            matched |= hmac.compare_digest(offered, key)
        return matched and bool(offered)


def _bearer(authorization: str | None) -> bytes:
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return b""
    return token.strip().encode("utf-8", "surrogateescape")


def load_keys(flags: list[str], files: list[str], environ: dict[str, str] = os.environ) -> tuple[str, ...]:
    """Keys from --api-key, --api-key-file (one a line, # comments) and $HOSTTUNE_ENGINE_API_KEY."""
    found = [(k, "--api-key") for k in flags]
    for name in files:
        found += [(k, f"the API key file {name} line {n}") for n, k in _keys_in_file(Path(name))]
    from_env = environ.get(KEY_ENV, "")
    if from_env and not from_env.replace(",", "").strip():  # set, yet no key: never serve open by mistake
        raise ConfigError(f"${KEY_ENV} holds no key, only commas or spaces; give a key or leave it unset")
    found += [(k, f"${KEY_ENV}") for k in from_env.split(",")]
    found = [(k.strip(), source) for k, source in found if k and k.strip()]
    short = [source for k, source in found if len(k) < 8]
    if short:
        raise ConfigError(f"an API key from {short[0]} is shorter than 8 characters; give a longer one")
    return tuple(dict.fromkeys(k for k, _ in found))


def _keys_in_file(path: Path) -> list[tuple[int, str]]:
    """(line number, key) of each key line."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the API key file {path}: {e.strerror}") from None
    lines = [(n, _text_line(path, n, raw).strip()) for n, raw in enumerate(data.splitlines(), 1)]
    keys = [(n, line) for n, line in lines if line and not line.startswith("#")]
    if not keys:
        raise ConfigError(f"the API key file {path} holds no key")
    return keys


def _text_line(path: Path, n: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # the line itself is never shown: it may be a key
        raise ConfigError(f"the API key file {path} line {n} is not UTF-8 text; write each key as text, one a "
                          "line") from None


def is_protected(path: str, protect_probes: bool) -> bool:
    if path in OPEN_PATHS:
        return False
    if path in PROBE_PATHS:
        return protect_probes
    return True  # /v1/*, /tokenize, /detokenize, and any route added later


def auth_middleware(ring: KeyRing, protect_probes: bool):
    """An aiohttp middleware that answers 401 (an OpenAI error body) to a request without a valid key."""

    @web.middleware
    async def require_key(request: web.Request, handler):
        if is_protected(request.path, protect_probes) and not ring.accepts(request.headers.get("Authorization")):
            raise ApiError(401, REFUSAL, "AuthenticationError")
        return await handler(request)

    return require_key
