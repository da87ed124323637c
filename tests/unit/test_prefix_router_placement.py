"""The prefix router's placement, pure: keys from request bodies, new keys spread over the replicas, a key
kept on its replica, one request spilled off an overloaded one, a replica that leaves giving up its keys."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hosttune.deploy.prefix_table import NoWorker, PrefixTable, Why, prefix_key, prompt_text, spill_bound

WORKERS = ("http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003")


def table(workers=WORKERS, **kw) -> PrefixTable:
    t = PrefixTable(**kw)
    for w in workers:
        t.add(w)
    return t


def body(**doc) -> bytes:
    return json.dumps(doc).encode()


def test_completions_and_chat_are_keyed_on_their_prompts_first_characters():
    system = "You are a helpful assistant. " * 20  # 580 characters
    a = prefix_key(body(prompt=system + "What is 2+2?"))
    assert a == prefix_key(body(prompt=system + "Name a colour.")) != prefix_key(body(prompt="x" + system))
    assert prefix_key(body(prompt=system[:100] + "a"), 100) == prefix_key(body(prompt=system[:100] + "b"), 100)
    chat = [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]
    assert prompt_text({"messages": chat}) == system + "\nhi"
    parts = [{"role": "user", "content": [{"type": "text", "text": "look "}, {"type": "image_url"}, {"text": "here"}]}]
    assert prompt_text({"messages": parts}) == "look here"
    assert prompt_text({"prompt": ["first", "second"]}) == "first"
    assert prompt_text({"prompt": [1, 2, 3]}) == "[1, 2, 3]" == prompt_text({"prompt": [[1, 2, 3], [4]]})
    for unkeyed in (b"", b"not json", body(model="m"), b"[1, 2]", body(prompt=""), b"\xff\xfe"):
        assert prefix_key(unkeyed) is None


def test_seven_prompts_spread_three_two_two_and_each_stays_on_its_replica():
    t = table()
    keys = [f"k{i}" for i in range(7)]
    first = {k: t.choose(k) for k in keys}
    assert {d.why for d in first.values()} == {Why.NEW}
    assert sorted(Counter(d.worker for d in first.values()).values()) == [2, 2, 3]
    assert sorted(t.keys_per_worker().values()) == [2, 2, 3]
    for _ in range(3):
        for k in keys:
            assert t.choose(k) == type(first[k])(first[k].worker, Why.KEPT)


def test_ties_rotate_instead_of_always_taking_the_first():
    t = table()
    chosen = [t.choose(None).worker for _ in range(6)]  # nothing in flight: all tie every time
    assert Counter(chosen) == {w: 2 for w in WORKERS}
    t2 = table()
    assert len({t2.choose(f"k{i}").worker for i in range(3)}) == 3


def test_a_new_key_avoids_the_busiest_replica_among_those_with_the_fewest_keys():
    t = table()
    for w in WORKERS[:2]:
        for _ in range(3):
            t.start(w)
    assert t.choose("fresh").worker == WORKERS[2]


def test_an_overloaded_replica_spills_one_request_and_keeps_its_key():
    t = table()
    owner = t.choose("hot").worker
    for _ in range(5):
        t.start(owner)  # 5 in flight there, none elsewhere: mean 5/3, bound max(3.3, 5.7)
    assert t.choose("hot") == type(t.choose("hot"))(owner, Why.KEPT)
    t.start(owner)  # 6 > 6.0? no: mean 2, bound 6
    assert t.choose("hot").why is Why.KEPT
    t.start(owner)  # 7 > max(4.7, 6.3)
    spill = t.choose("hot")
    assert spill.why is Why.SPILL and spill.worker != owner
    assert t.keys["hot"] == owner
    for _ in range(7):
        t.finish(owner)
    assert t.choose("hot").worker == owner
    assert spill_bound(0) == 4 and spill_bound(10) == 20


def test_a_removed_replica_gives_up_its_keys_to_the_others():
    t = table()
    placed = {k: t.choose(k).worker for k in ("a", "b", "c", "d", "e", "f")}
    gone = placed["a"]
    assert t.remove(gone) and not t.remove(gone)
    moved = {k: t.choose(k) for k, w in placed.items() if w == gone}
    assert all(d.why is Why.NEW and d.worker != gone for d in moved.values())
    assert sorted(t.keys_per_worker().values()) == [3, 3]
    assert t.add(gone) and t.keys_per_worker()[gone] == 0
    assert t.choose("g").worker == gone  # the returning replica has the fewest keys


def test_a_replica_failing_its_health_check_keeps_its_keys_but_gets_no_request():
    t = table()
    owner = t.choose("k").worker
    t.set_up(owner, False)
    assert t.choose("k").worker != owner and owner in t.workers
    t.set_up(owner, True)
    assert t.choose("other").worker == owner  # fewest keys again once "k" moved off it


def test_excluded_and_absent_replicas_and_the_key_bound():
    t = table(max_keys=2)
    owner = t.choose("k").worker
    assert t.choose("k", frozenset({owner})).worker != owner
    t.choose("x")
    t.choose("y")
    assert list(t.keys) == ["x", "y"] and sum(t.keys_per_worker().values()) == 2
    with pytest.raises(NoWorker):
        table(()).choose("k")
    with pytest.raises(NoWorker):
        t.choose("k", frozenset(WORKERS))


def test_least_in_flight_policy_ignores_prefixes():
    t = table(by_prefix=False)
    t.start(WORKERS[0])
    picks = [t.choose("same") for _ in range(4)]
    assert all(d.why is Why.NO_KEY and d.worker != WORKERS[0] for d in picks) and not t.keys
