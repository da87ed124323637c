import pytest

from hosttune.bench.connection import HttpError, ResponseParser


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def feed_all(parser, data, split):
    for i in range(0, len(data), split):
        parser.feed(data[i:i + split], float(i))
    return parser.response


@pytest.mark.parametrize("split", [1, 2, 3, 7, 64, 10_000])
def test_chunked_body_survives_any_split(split):
    body = chunked(b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n")
    response = feed_all(ResponseParser(), HEAD + body, split)
    assert response.is_complete and response.status == 200 and response.is_keep_alive
    assert response.body() == b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"


def test_pieces_keep_their_arrival_times():
    parser = ResponseParser()
    parser.feed(HEAD + b"5\r\nhello\r\n", 1.0)
    parser.feed(b"5\r\nworld\r\n5\r\n!!!!!\r\n", 2.0)
    parser.feed(b"0\r\n\r\n", 3.0)
    assert parser.response.segments == [(1.0, b"hello"), (2.0, b"world!!!!!")]
    assert parser.response.is_complete


def test_content_length_body():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nfu", 1.0)
    assert not parser.response.is_complete
    parser.feed(b"ll", 2.0)
    response = parser.response
    assert response.is_complete and response.status == 429 and response.body() == b"full"
    assert response.headers["retry-after"] == "1"


def test_close_delimited_body_ends_at_eof():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.0 200 OK\r\n\r\ndata: x\n\n", 1.0)
    assert not parser.response.is_complete and not parser.response.is_keep_alive
    parser.feed_eof(2.0)
    assert parser.response.is_complete and parser.response.body() == b"data: x\n\n"


def test_eof_in_the_middle_is_an_error():
    parser = ResponseParser()
    parser.feed(HEAD + b"5\r\nhel", 1.0)
    with pytest.raises(HttpError, match="closed before"):
        parser.feed_eof(2.0)


def test_connection_close_header_disables_keep_alive():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 1.0)
    assert parser.response.is_complete and not parser.response.is_keep_alive


def test_not_http_is_an_error():
    with pytest.raises(HttpError, match="not an HTTP"):
        ResponseParser().feed(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", 1.0)
