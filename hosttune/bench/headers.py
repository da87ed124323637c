"""Extra request headers (--header KEY=VALUE, --api-key as `Authorization: Bearer`), and the command
line with their values redacted, as it is printed and saved in reports."""

from __future__ import annotations

import re

from hosttune.errors import BenchError

Headers = tuple[tuple[str, str], ...]
REDACTED = "REDACTED"  # shell-safe: the saved command line stays unquoted there
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
_SECRET_OPTIONS = ("--api-key",)
_HEADER_OPTIONS = ("--header",)


def request_headers(items: list[str] | tuple[str, ...], api_key: str | None, *, is_key_typed: bool = False) -> Headers:
    """--header KEY=VALUE items, checked, then `Authorization: Bearer <api_key>` unless a header set it. A key typed
    as --api-key beside a --header Authorization is refused (one of the two would be dropped); a key from
    $OPENAI_API_KEY yields to the header the command line gives."""
    headers = [_one(item) for item in items]
    _once(headers)
    sets_authorization = any(name.lower() == "authorization" for name, _ in headers)
    if api_key and sets_authorization and is_key_typed:
        raise BenchError("--api-key and --header Authorization both set the Authorization header: give one "
                         "(--api-key KEY sends 'Authorization: Bearer KEY'; drop it to send the header's value)")
    if api_key and not sets_authorization:
        headers.append(("Authorization", f"Bearer {_value(api_key, '--api-key')}"))
    return tuple(headers)


def _one(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    name = name.strip()
    if not sep or not _TOKEN.match(name):
        raise BenchError(f"--header {name or item!r}: write NAME=VALUE with an HTTP header name, e.g. X-Tenant=a")
    if name.lower() in ("host", "content-length", "content-type", "transfer-encoding", "connection"):
        raise BenchError(f"--header {name}: bench sets this header itself")
    return name, _value(value.strip(), f"--header {name}")


def _once(headers: list[tuple[str, str]]) -> None:
    """A name given twice is refused: sent twice, a field that is no list means nothing certain, and a list's values
    belong in one field anyway (RFC 9110 5.3), where every request (and model discovery, and /metrics) sends them."""
    seen: dict[str, str] = {}
    for name, _ in headers:
        first = seen.get(name.lower())
        seen[name.lower()] = first or name
        if first is not None:
            also = f" (as {first} too)" if first != name else ""
            raise BenchError(f"--header {name}: given twice{also}: give each header once; for a list, join its values "
                             f"with commas in one --header ({name}=a,b)")


def _value(value: str, where: str) -> str:
    if any(c in value for c in "\r\n\0"):
        raise BenchError(f"{where}: the value must be one line")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise BenchError(f"{where}: the value must be ASCII or Latin-1 text") from None
    return value


def redact_argv(argv: list[str]) -> list[str]:
    """The arguments with every --api-key value and every --header value replaced by REDACTED."""
    out: list[str] = []
    pending: str | None = None  # the option whose value comes next
    for arg in argv:
        if pending is not None:
            out.append(_redacted(pending, arg))
            pending = None
            continue
        option, eq, value = arg.partition("=")
        if option in _SECRET_OPTIONS + _HEADER_OPTIONS:
            if eq:
                out.append(f"{option}={_redacted(option, value)}")
            else:
                out.append(arg)
                pending = option
            continue
        out.append(arg)
    return out


def _redacted(option: str, value: str) -> str:
    if option in _HEADER_OPTIONS:
        name, sep, _ = value.partition("=")
        return f"{name}={REDACTED}" if sep else REDACTED
    return REDACTED
