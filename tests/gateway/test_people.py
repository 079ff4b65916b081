"""People at the gateway: who each request comes from, recorded in every sample and counted per person.

A real gateway on 127.0.0.1 in front of a scripted policy pool (rule judge), driven with the real
`openai` client, as each person's agent would: with one shared key and the ``X-Person-Id`` header
(the OpenClaw plugin's ``personId``), and with a key per person (``gateway.keys_file``), where the key
names the person and a header naming anyone else is refused. Two people may use the same session id:
each has their own session, scored by their own next message, and neither can end the other's. The
``/v1/status`` numbers per person are checked against the sample store.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway.test_gateway import SYSTEM, Env, loop_thread, make_env, tokenizer  # noqa: F401 (fixtures)

SHARED_KEY = "household-key-4c1d9e2f"
KEYS = {"alice": "alice-key-0f3b6a19c2d4", "bob": "bob-key-7e5d1c8a2b90"}


def person_client(env: Env, person: str | None, key: str = SHARED_KEY) -> openai.OpenAI:
    """An OpenAI client as a person's agent configures it (the plugin sends X-Person-Id on every request)."""
    headers = {"X-Person-Id": person} if person else {}
    return openai.OpenAI(base_url=env.url + "/v1", api_key=key, max_retries=0, timeout=30, default_headers=headers)


def main_turn(client: openai.OpenAI, session: str, messages: list[dict], done: bool = False) -> str:
    headers = {"X-Session-Id": session, "X-Turn-Type": "main", **({"X-Session-Done": "1"} if done else {})}
    reply = client.chat.completions.create(model="tiny", messages=messages, extra_headers=headers, max_tokens=8)
    return reply.choices[0].message.content or ""


def test_two_people_with_one_shared_key_are_kept_apart_and_counted(make_env):
    env = make_env(api_key=SHARED_KEY)
    alice, bob, anyone = person_client(env, "alice"), person_client(env, "bob@home"), person_client(env, None)
    a = [SYSTEM, {"role": "user", "content": "What is 2 + 3?"}]
    b = [SYSTEM, {"role": "user", "content": "Name a prime."}]
    a.append({"role": "assistant", "content": main_turn(alice, "s1", a)})
    b.append({"role": "assistant", "content": main_turn(bob, "s1", b)})   # the same session id: his own session
    auth = {"Authorization": f"Bearer {SHARED_KEY}"}
    # bob ends "s1": his own, not alice's; her turn still waits for her next message
    done = env.http.post("/v1/sessions/s1/done", headers={**auth, "X-Person-Id": "bob@home"})
    assert done.status_code == 200 and done.json() == {"session_id": "s1", "ended": True, "dropped_turns": 1,
                                                        "scored_turn": False}
    assert ("alice", "s1") in env.gateway.sessions and ("bob@home", "s1") not in env.gateway.sessions
    b2 = [SYSTEM, {"role": "user", "content": "Name an even prime."}]
    b2.append({"role": "assistant", "content": main_turn(bob, "s2", b2)})
    main_turn(bob, "s2", b2 + [{"role": "user", "content": "No, that's wrong. Always explain why."}], done=True)
    main_turn(alice, "s1", a + [{"role": "user", "content": "Thanks, that's perfect!"}])
    # a side request of alice's, and a person who names nobody: the default person
    alice.chat.completions.create(model="tiny", messages=[SYSTEM, {"role": "user", "content": "heartbeat"}],
                                  extra_headers={"X-Session-Id": "s1", "X-Turn-Type": "side"}, max_tokens=2)
    d = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    d.append({"role": "assistant", "content": main_turn(anyone, "s1", d)})
    main_turn(anyone, "s1", d + [{"role": "user", "content": "Great, thanks."}], done=True)
    env.drain()

    samples = env.samples()
    got = sorted((s.person, s.session_id, s.turn_index, s.reward) for s in samples)
    assert got == [("alice", "s1", 0, 1), ("bob@home", "s2", 0, -1), ("default", "s1", 0, 1)]
    assert {s.person: s.next_state["content"] for s in samples} == {
        "alice": "Thanks, that's perfect!", "bob@home": "No, that's wrong. Always explain why.",
        "default": "Great, thanks."}

    status = env.http.get("/v1/status", headers=auth).json()
    people = {p["person"]: p for p in status["people"]}
    assert list(people) == ["alice", "bob@home", "default"]   # sorted by id
    want = {   # person: (sessions, open now, main requests, side requests, scored, satisfied, corrected, rate)
        "alice": (1, 1, 2, 1, 1, 1, 0, 1.0),
        "bob@home": (2, 0, 3, 0, 1, 0, 1, 0.0),
        "default": (1, 0, 2, 0, 1, 1, 0, 1.0)}
    for person, row in people.items():
        assert (row["sessions"], row["open_sessions"], row["main_requests"], row["side_requests"], row["scored_turns"],
                row["satisfied"], row["corrected"], row["rate"]) == want[person], person
        own = [s for s in samples if s.person == person]
        assert row["satisfaction"] == [{"version": "7", "satisfied": sum(s.eval_score > 0 for s in own),
                                        "corrected": sum(s.eval_score < 0 for s in own), "hint_only": 0,
                                        "rate": want[person][-1]}]
    assert sorted((t["person"], t["session_id"], t["reward"]) for t in status["scored_turns"]) == \
        sorted((s.person, s.session_id, s.reward) for s in samples)
    sessions = {(s["person"], s["session_id"]): s for s in status["sessions"]}
    assert set(sessions) == {("alice", "s1"), ("bob@home", "s1"), ("bob@home", "s2"), ("default", "s1")}
    assert sessions[("alice", "s1")]["open"] and not sessions[("bob@home", "s1")]["open"]
    assert (sessions[("alice", "s1")]["main_turns"], sessions[("alice", "s1")]["side_turns"]) == (2, 1)
    for client in (alice, bob, anyone):
        client.close()


@pytest.mark.parametrize("claimed", ["two words", "", "-lead", "x" * 65, "a/b", "bob\u00e9"])
def test_a_malformed_person_id_is_a_400_and_records_nothing(make_env, claimed):
    env = make_env(api_key=SHARED_KEY)
    r = env.http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {SHARED_KEY}",
                                                       "X-Person-Id": claimed.encode(),
                                                       "X-Session-Id": "s1", "X-Turn-Type": "main"},
                      json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "X-Person-Id" and "is not a person id: 1 to 64 letters" in error["message"]
    assert len(env.gateway.sessions) == 0 and env.pool.requests == []


def test_a_key_bound_to_a_person_decides_and_refuses_another_persons_header(make_env, tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text(json.dumps({key: person for person, key in KEYS.items()}))
    keys.chmod(0o600)
    env = make_env(keys_file=str(keys))
    as_alice = person_client(env, None, KEYS["alice"])           # the key alone names her
    as_alice_named = person_client(env, "alice", KEYS["alice"])  # her own id in the header is fine
    posing = person_client(env, "bob", KEYS["alice"])            # her key with bob's id: refused
    q = [SYSTEM, {"role": "user", "content": "What is 4 + 4?"}]
    q.append({"role": "assistant", "content": main_turn(as_alice, "s1", q)})
    with pytest.raises(openai.PermissionDeniedError) as refused:
        main_turn(posing, "s1", q + [{"role": "user", "content": "Wrong, redo it."}])
    assert refused.value.status_code == 403 and "belongs to person 'alice'" in refused.value.message
    assert refused.value.body["param"] == "X-Person-Id"
    # bob's own key cannot end her session either: his namespace has no "s1"
    r = env.http.post("/v1/sessions/s1/done", headers={"Authorization": f"Bearer {KEYS['bob']}"})
    assert r.status_code == 200 and r.json()["ended"] is False and ("alice", "s1") in env.gateway.sessions
    main_turn(as_alice_named, "s1", q + [{"role": "user", "content": "Thanks, perfect."}], done=True)
    env.drain()
    assert [(s.person, s.reward) for s in env.samples()] == [("alice", 1)]
    for client in (as_alice, as_alice_named, posing):
        client.close()


def test_a_person_with_a_served_adapter_is_routed_to_it_and_everyone_else_to_the_base(make_env):
    """A per-person run serves each person their own adapter once it is loaded (`Gateway.serve_adapter`): their
    main and side turns, streamed or not, name it in `lora_path`; anyone without one gets the base model (no
    `lora_path`, never a 400); each sample records the adapter that served it and its steps."""
    env = make_env(api_key=SHARED_KEY)
    alice, bob = person_client(env, "alice"), person_client(env, "bob@home")
    env.lt.run(_serve_adapter(env.gateway, "alice", 3))   # on the gateway's loop, as the run does it
    a = [SYSTEM, {"role": "user", "content": "What is 2 + 3?"}]
    b = [SYSTEM, {"role": "user", "content": "Name a prime."}]
    a.append({"role": "assistant", "content": main_turn(alice, "s1", a)})
    b.append({"role": "assistant", "content": main_turn(bob, "s1", b)})
    side = alice.chat.completions.create(model="tiny", messages=[SYSTEM, {"role": "user", "content": "heartbeat"}],
                                         extra_headers={"X-Turn-Type": "side"}, max_tokens=2, stream=True)
    assert list(side)
    main_turn(alice, "s1", a + [{"role": "user", "content": "Thanks, that's perfect!"}], done=True)
    main_turn(bob, "s1", b + [{"role": "user", "content": "No, that's wrong."}], done=True)
    env.drain()
    assert [r.get("lora_path") for r in env.pool.requests] == ["alice", None, "alice", "alice", None]
    reply = alice.chat.completions.create(model="tiny", messages=a, max_tokens=2, extra_headers={"X-Turn-Type": "side"})
    assert reply.to_dict()["metadata"] == {"weight_version": "7", "adapter": "alice", "adapter_steps": "3"}
    assert sorted((s.person, s.adapter, s.adapter_steps) for s in env.samples()) == [
        ("alice", "alice", 3), ("bob@home", None, None)]
    for client in (alice, bob):
        client.close()


async def _serve_adapter(gateway, person: str, steps: int) -> None:
    gateway.serve_adapter(person, steps)
