"""Whether an endpoint speaks the scheme its URL names, checked before a run.

A URL of the wrong scheme fails every request of a run: an https:// URL to a plain http port waits out asyncio's
60 s handshake a request, an http:// URL to a TLS port has each request closed unanswered, and with --model (which
skips /v1/models) the run goes on for its warm-up and duration before saying so. One handshake, and where it fails
one plain request, say in seconds what the port speaks. A port that answers neither is left to the run, which says
what its requests got.
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlparse

from hosttune.bench.connection import tls_context
from hosttune.errors import BenchError

PROBE_TIMEOUT = 3.0  # a handshake or an answer's first bytes take milliseconds; a port silent this long never will
NGINX_PLAIN_TO_TLS = b"plain HTTP request was sent to HTTPS port"  # nginx's 400 to plain HTTP on a TLS port
READ_BYTES = 4096


async def check_scheme(url: str, tls: ssl.SSLContext | None = None, timeout: float = PROBE_TIMEOUT) -> None:
    """Raise a BenchError naming what the server at `url` answered when it speaks the other scheme, or (https) it
    presents a certificate `tls` (default: the system's CAs) does not trust."""
    parsed = urlparse(url)
    is_tls = parsed.scheme == "https"
    host, port = parsed.hostname or "127.0.0.1", parsed.port or (443 if is_tls else 80)
    if is_tls:
        await _check_tls(url, host, port, tls or tls_context(), timeout)
    else:
        await _check_plain(url, host, port, timeout)


async def _check_tls(url: str, host: str, port: int, context: ssl.SSLContext, timeout: float) -> None:
    try:
        await _handshake(host, port, context, timeout)
    except ssl.SSLCertVerificationError as exc:
        raise BenchError(f"the server at {url} presented a certificate this machine does not trust "
                         f"(certificate verify failed: {exc.verify_message}); give its CA with --cacert, or --insecure "
                         "for a test endpoint") from None
    except (OSError, asyncio.TimeoutError):  # ssl.SSLError is an OSError
        try:
            answer = await _plain_answer(host, port, url, timeout)
        except (OSError, asyncio.TimeoutError):
            return  # nothing listens there, or the host is unreachable: the run says so
        if _is_http(answer):
            raise BenchError(f"the server at {url} answered plain HTTP to a TLS handshake; use "
                             f"http://{url.partition('://')[2]}") from None


async def _check_plain(url: str, host: str, port: int, timeout: float) -> None:
    try:
        answer = await _plain_answer(host, port, url, timeout)
    except (OSError, asyncio.TimeoutError):
        return  # nothing listens there, or the host is unreachable: the run says so
    if _is_http(answer):
        return
    try:
        await _handshake(host, port, _unchecked(), timeout)
    except (OSError, asyncio.TimeoutError):
        return  # no TLS either: the run says what its requests got
    raise BenchError(f"the server at {url} {_seen(answer)} and took a TLS handshake; use "
                     f"https://{url.partition('://')[2]}")


def _is_http(answer: bytes | None) -> bool:
    """A plain HTTP answer, and not nginx's to plain HTTP on its TLS port."""
    return answer is not None and answer.startswith(b"HTTP/") and NGINX_PLAIN_TO_TLS not in answer


def _seen(answer: bytes | None) -> str:
    """What a TLS port did with a plain HTTP request."""
    if answer is None:
        return "did not answer a plain HTTP request"
    if not answer:
        return "closed a plain HTTP request unanswered"
    if answer.startswith(b"HTTP/"):
        return f"answered a plain HTTP request '{NGINX_PLAIN_TO_TLS.decode()}'"
    return "answered a plain HTTP request with TLS bytes"


async def _handshake(host: str, port: int, context: ssl.SSLContext, timeout: float) -> None:
    _, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=context, server_hostname=host, ssl_handshake_timeout=timeout), timeout)
    writer.close()


async def _plain_answer(host: str, port: int, url: str, timeout: float) -> bytes | None:
    """The first bytes of the answer to one plain GET of /v1/models (as discovering the model sends): empty where the
    server closed the connection unanswered, None where nothing came within `timeout`. Raises where no connection
    opens."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(f"GET /v1/models HTTP/1.1\r\nHost: {urlparse(url).netloc}\r\nConnection: close\r\n\r\n"
                     .encode("latin-1"))
        return await asyncio.wait_for(reader.read(READ_BYTES), timeout)
    except asyncio.TimeoutError:
        return None
    except OSError:  # reset
        return b""
    finally:
        writer.close()


def _unchecked() -> ssl.SSLContext:
    """Whether the port speaks TLS at all, whoever signed its certificate."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context
