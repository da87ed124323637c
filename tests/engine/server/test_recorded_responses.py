"""The server answers the recorded requests exactly as recorded: same status, content type and body."""

import json

from .recorded import FIXTURE, cases, send


def test_answers_match_the_recording(server):
    recorded = json.loads(FIXTURE.read_text())
    assert sorted(recorded) == sorted(name for name, *_ in cases()), "re-record: the request set changed"
    differ = {}
    for name, method, path, ctype, body in cases():
        got = send(server.url, method, path, ctype, body)
        if got != recorded[name]:
            differ[name] = {"recorded": recorded[name], "now": got}
    assert not differ, json.dumps(dict(list(differ.items())[:3]))[:3000]
    assert "Traceback" not in server.log()
