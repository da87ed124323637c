"""How long a closed-loop user waits after the server refused a request (429 or 503) before it
sends that request again: the server's Retry-After when it gives one, else an exponential wait
that doubles with each refusal in a row, up to a cap. A user that hammered a restarting server
would measure its own retry loop and slow the server's recovery; one that waits measures the
server. A request whose connection failed (refused, reset, closed: the server is down) is a failure,
not sent again, but its user waits as for a refusal before the next: a server gone mid-run met users
that sent thousands of failing requests a second, the client's loop lagging behind them.
"""

from __future__ import annotations

import email.utils
import math
import time

from hosttune.bench.record import FAILED, RequestRecord

REFUSALS = (429, 503)  # the server shed the request on purpose and may say when to come back
FIRST_WAIT_S = 0.5
MAX_WAIT_S = 8.0
MAX_RETRY_AFTER_S = 60.0  # a Retry-After beyond this is capped: the run stays bounded


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: a number of seconds, or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():  # str.isdigit takes '²' too, which float() refuses
        seconds = float(text)
        return seconds if math.isfinite(seconds) else None  # results.json holds it: no Infinity
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def is_lost(record: RequestRecord) -> bool:
    """The request failed on its connection (no HTTP status came, and no timeout ended it)."""
    return record.outcome == FAILED and record.status == 0 and record.error.startswith("transport:")


def wait_after(status: int, retry_after: float | None, refusals_in_a_row: int,
               is_connection_lost: bool = False) -> float:
    """Seconds to wait before the next request; 0 unless the server refused this one or its connection failed."""
    if status not in REFUSALS and not is_connection_lost:
        return 0.0
    if retry_after is not None and status in REFUSALS:
        return min(retry_after, MAX_RETRY_AFTER_S)
    return min(MAX_WAIT_S, FIRST_WAIT_S * 2 ** max(0, refusals_in_a_row - 1))
