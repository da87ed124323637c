import pytest

from hosttune.bench.connection import HttpError, ResponseParser


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
TOKEN = b'data: {"choices":[{"text":" a"}]}\n\n'


def feed_all(parser, data, split):
    for i in range(0, len(data), split):
        parser.feed(data[i:i + split], float(i))
    return parser.response


@pytest.mark.parametrize("split", [1, 2, 3, 7, 64, 10_000])
def test_chunked_event_stream_survives_any_split(split):
    body = chunked(TOKEN, TOKEN + TOKEN, b"data: [DONE]\n\n")
    response = feed_all(ResponseParser(), HEAD + body, split)
    assert response.is_complete and response.status == 200 and response.is_keep_alive
    events = response.events.result(end=-1.0)
    assert len(events.chunks) == 3 and events.error == ""
    # The first token is timed by the read that brought the newline ending its line.
    newline = len(HEAD) + len(b"23\r\n") + TOKEN.index(b"\n")
    assert events.chunks[0] == float(newline // split * split)
    assert list(events.chunks) == sorted(events.chunks)


def test_pieces_keep_their_arrival_times():
    parser = ResponseParser()
    parser.feed(HEAD + b"%x\r\n%s\r\n" % (len(TOKEN), TOKEN), 1.0)
    parser.feed(b"%x\r\n%s\r\n" % (2 * len(TOKEN), 2 * TOKEN), 2.0)
    parser.feed(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n", 3.0)
    events = parser.response.events.result(end=-1.0)
    assert list(events.chunks) == [1.0, 2.0, 2.0] and events.end == 3.0
    assert parser.response.is_complete


def test_content_length_body_of_an_error():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nfu", 1.0)
    assert not parser.response.is_complete
    parser.feed(b"ll", 2.0)
    response = parser.response
    assert response.is_complete and response.status == 429 and bytes(response.body) == b"full"
    assert response.headers["retry-after"] == "1" and response.events is None


def test_close_delimited_body_ends_at_eof():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.0 200 OK\r\n\r\n" + TOKEN, 1.0)
    assert not parser.response.is_complete and not parser.response.is_keep_alive
    parser.feed_eof()
    assert parser.response.is_complete
    assert parser.response.events.result(end=2.0).error.startswith("stream-cut")


def test_eof_in_the_middle_is_an_error():
    parser = ResponseParser()
    parser.feed(HEAD + b"5\r\nhel", 1.0)
    with pytest.raises(HttpError, match="closed before"):
        parser.feed_eof()


def test_connection_close_header_disables_keep_alive():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 1.0)
    assert parser.response.is_complete and not parser.response.is_keep_alive


@pytest.mark.parametrize("data, message", [
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP"),
    (HEAD + b"zz\r\n", "bad chunk size"),
])
def test_garbage_is_an_error(data, message):
    with pytest.raises(HttpError, match=message):
        ResponseParser().feed(data, 1.0)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_request_on_a_connection_closed_under_it_fails_that_request(loop):
    """The server may close a kept-alive connection between the pool handing it out and the write: the request
    fails with the transport error its caller retries on (uvloop's write raises there; asyncio's drops the bytes
    and nothing would ever answer), not with an exception that ends the run."""
    import asyncio

    from hosttune.bench.connection import Connection

    async def main():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, connection = await asyncio.get_running_loop().create_connection(Connection, "127.0.0.1", port)
        connection.transport.close()
        await asyncio.sleep(0)
        with pytest.raises(HttpError, match="closed before the request was sent"):
            await asyncio.wait_for(connection.send(b"GET / HTTP/1.1\r\n\r\n"), 5)
        server.close()

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(main())
    else:
        asyncio.run(main())
