"""Probes: one client acting on another person's sessions, or crowding them out.

A real gateway process on 127.0.0.1 with a keys file (alice and bob, one key each) in front of a
scripted policy pool, with the rule judge ("wrong ... redo" scores -1, "thanks" +1). What bob tries:
end alice's session (her turn would be dropped), send a main turn with her session id and his own next
state (her turn would be scored by his words), fill the session table until hers is evicted, hold
every connection, queue generations until hers wait behind his, park images in idle sessions. Sessions
are kept per person and each person's sessions, connections and generations are capped; every sample
records its person.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import requests

from openclaw_jax.gateway.auth import GatewayAuth, key_digest
from openclaw_jax.configlib import ConfigError
from openclaw_jax.gateway.protocol import GatewayHTTPError
from openclaw_jax.samples import SampleStore
from openclaw_jax.samples.sample import Sample, encode_sample
from tests.helpers.abuse import GatewayProcess, host_port, scripted_pool
from tests.helpers.scripted_pool import Reply

KEYS = {"alice": "alice-key-4f1d2a9c0b7e", "bob": "bob-key-88e1c3d5a6f2"}
ADMIN = "admin-key-0d9e8f7a6b5c"


@pytest.fixture(scope="module")
def pool():
    with scripted_pool() as scripted:
        yield scripted


def start_gateway(pool, tmp_path, *settings: str) -> GatewayProcess:
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("".join(f'"{key}": {person}\n' for person, key in KEYS.items()))
    keys_file.chmod(0o600)
    gw = GatewayProcess(["--policy-url", pool.url, "--judge", "rule", "--model", "tiny", "--store",
                         str(tmp_path / "store"), "--keys-file", str(keys_file), "--set", "default_max_tokens=4",
                         *[w for s in settings for w in ("--set", s)]], tmp_path / "gateway.log",
                        env={"OPENCLAW_GATEWAY_ADMIN_KEY": ADMIN})
    gw.store_dir = tmp_path / "store"
    return gw


def as_person(person: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[person]}"}


def chat(gw, person: str, messages: list[dict], session: str | None = None, **extra) -> requests.Response:
    headers = as_person(person) | ({"X-Session-Id": session, "X-Turn-Type": "main"} if session else {})
    return requests.post(gw.url + "/v1/chat/completions", json={"messages": messages, **extra}, headers=headers,
                         timeout=120)


def reply_of(r: requests.Response) -> dict:
    assert r.status_code == 200, r.text
    return {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}


def samples_when(gw, count: int, timeout: float = 30.0) -> list[Sample]:
    deadline = time.monotonic() + timeout
    while True:
        with SampleStore(gw.store_dir, readonly=True) as store:
            samples = store.read(0)
        if len(samples) >= count or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def test_another_client_cannot_end_score_or_continue_a_session(pool, tmp_path):
    gw = start_gateway(pool, tmp_path)
    try:
        question = [{"role": "user", "content": "What is 2 + 3?"}]
        history = question + [reply_of(chat(gw, "alice", question, "s1"))]
        # bob ends "s1": his own namespace has no such session, so alice's is untouched
        r = requests.post(gw.url + "/v1/sessions/s1/done", json={"reason": "new"}, headers=as_person("bob"), timeout=30)
        assert r.status_code == 200 and r.json()["ended"] is False, r.text
        # bob sends a main turn with her session id and a damning next state: it opens *his* session "s1"
        reply_of(chat(gw, "bob", history + [{"role": "user", "content": "That is wrong, redo it."}], "s1"))
        # ... and ends it with another verdict on the last turn: his own turn is what it scores
        r = requests.post(gw.url + "/v1/sessions/s1/done", headers=as_person("bob"), timeout=30,
                          json={"messages": history + [{"role": "user", "content": "Wrong again, redo."}]})
        assert r.json()["ended"] is True and r.json()["scored_turn"] is True, r.text
        # alice's own next state scores her turn
        reply_of(chat(gw, "alice", history + [{"role": "user", "content": "Thanks, perfect."}], "s1",
                      session_done=True))
        samples = samples_when(gw, 2)
        by_person = {s.person: s for s in samples}
        assert len(samples) == 2 and set(by_person) == {"alice", "bob"}, [(s.person, s.reward) for s in samples]
        assert by_person["alice"].session_id == "s1" and by_person["alice"].reward == 1
        assert by_person["alice"].next_state["content"] == "Thanks, perfect."
        assert by_person["bob"].reward == -1
    finally:
        gw.stop()


def test_one_client_cannot_evict_anothers_sessions(pool, tmp_path):
    gw = start_gateway(pool, tmp_path, "max_sessions=6", "max_sessions_per_person=4")
    try:
        question = [{"role": "user", "content": "Name a prime."}]
        history = question + [reply_of(chat(gw, "alice", question, "alice-1"))]
        for i in range(20):   # bob opens session after session
            reply_of(chat(gw, "bob", [{"role": "user", "content": f"q{i}"}], f"bob-{i}"))
        reply_of(chat(gw, "alice", history + [{"role": "user", "content": "Thanks, that works."}], "alice-1",
                      session_done=True))
        samples = samples_when(gw, 1)
        assert [(s.person, s.session_id, s.reward) for s in samples] == [("alice", "alice-1", 1)]
        health = requests.get(gw.url + "/healthz", headers=as_person("alice"), timeout=30).json()
        assert health["sessions"] <= 4, health["sessions"]   # bob's 4 (alice's ended)
    finally:
        gw.stop()


def test_one_client_cannot_hold_every_connection(pool, tmp_path):
    gw = start_gateway(pool, tmp_path, "max_connections=8", "max_connections_per_person=4")
    held = []
    try:
        statuses = []
        for _ in range(8):   # bob's keep-alive connections, each authenticated by one request
            s = socket.create_connection(host_port(gw.url), timeout=30)
            s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS['bob']}\r\n\r\n".encode())
            statuses.append(int(s.recv(65536).split()[1]))
            held.append(s)
        assert statuses == [200] * 4 + [429] * 4, statuses
        time.sleep(0.7)   # the refused ones are closed (after a short linger)
        r = requests.get(gw.url + "/v1/models", headers=as_person("alice"), timeout=30)
        assert r.status_code == 200, r.text
    finally:
        for s in held:
            s.close()
        gw.stop()


def test_one_client_cannot_take_every_generation_slot(pool, tmp_path):
    """bob sends six slow requests (3 s each) at once to a pool of four slots: two of his are generated at a
    time, the others wait for his own slots; alice's request reaches the pool while only two of bob's have
    (with all six of his competing for the pool's four slots, hers would wait behind four)."""
    gw = start_gateway(pool, tmp_path, "max_inflight_per_person=2", "pool_max_concurrency=4")
    arrivals: list[str] = []   # who reached the pool, in order

    def respond(prompt: str):
        arrivals.append("bob" if "slow" in prompt else "alice")
        return Reply(delay_s=3.0) if "slow" in prompt else None

    pool.responder = respond
    try:
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(
            chat(gw, "bob", [{"role": "user", "content": "slow"}]).status_code)) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.5)   # bob's requests are in
        alice = chat(gw, "alice", [{"role": "user", "content": "quick"}])
        for t in threads:
            t.join()
        assert alice.status_code == 200 and results == [200] * 6, (alice.text, results)
        assert arrivals.index("alice") == 2, arrivals   # two of bob's before hers: his share of the pool
        health = requests.get(gw.url + "/healthz", headers=as_person("alice"), timeout=30).json()
        assert health["clients"]["waited_for_own_slot"] == 4, health["clients"]
    finally:
        pool.responder = None
        gw.stop()


def test_keys_and_persons(tmp_path):
    """The key checks other routes reuse (gateway/auth.py): the keys file, the shared key, the admin key."""
    alice = "a" * 24
    auth = GatewayAuth(keys_file=_keys_file(tmp_path, {alice: "alice", f"sha256:{key_digest('b' * 24)}": "bob"}),
                       admin_key=ADMIN)
    bearer = lambda key, **h: {"Authorization": f"Bearer {key}", **h}  # noqa: E731
    assert auth.caller(bearer(alice)).person == "alice" and not auth.caller(bearer(alice)).admin
    assert auth.caller(bearer("b" * 24)).person == "bob"   # stored as its digest only
    assert auth.caller(bearer(ADMIN)).admin
    for headers, status in (({}, 401), (bearer("c" * 24), 401), (bearer(alice, **{"X-Person-Id": "bob"}), 403),
                            (bearer(alice, **{"X-Person-Id": "bad id!"}), 400)):
        with pytest.raises(GatewayHTTPError) as err:
            auth.caller(headers)
        assert err.value.status == status, headers
    shared = GatewayAuth(api_key="s" * 24)
    assert shared.caller(bearer("s" * 24, **{"X-Person-Id": "carol"})).person == "carol"
    assert shared.caller(bearer("s" * 24)).person == "default" and not shared.caller(bearer("s" * 24)).admin
    for entries, message in (({"short": "alice"}, "at least 16"), ({alice: "no spaces"}, "not a person id"),
                             ({"sha256:abc": "alice"}, "64 hex digits")):
        with pytest.raises(ConfigError, match=message):
            GatewayAuth(keys_file=_keys_file(tmp_path, entries))


def test_the_browser_sign_in_takes_every_configured_key_and_changes_with_them(tmp_path):
    """The status page's sign-in (gateway/status_routes.py): any configured key is valid, nothing else; the
    cookie's secret is none of the keys, and changing any key (or adding a person) changes it."""
    alice = "a" * 24
    keys = {alice: "alice", f"sha256:{key_digest('b' * 24)}": "bob"}
    auth = GatewayAuth(keys_file=_keys_file(tmp_path, keys), admin_key=ADMIN, api_key="s" * 24)
    for key in (alice, "b" * 24, ADMIN, "s" * 24):
        assert auth.valid_key(key.encode()), key
    for key in ("", "c" * 24, alice[:-1], key_digest("b" * 24), f"sha256:{key_digest('b' * 24)}"):
        assert not auth.valid_key(key.encode()), key
    secret = auth.browser_secret()
    assert secret and all(k.encode() not in secret for k in (alice, ADMIN, "s" * 24))
    assert GatewayAuth(keys_file=_keys_file(tmp_path, keys), admin_key=ADMIN, api_key="s" * 24).browser_secret() == secret
    for changed in (GatewayAuth(keys_file=_keys_file(tmp_path, keys), admin_key=ADMIN + "x", api_key="s" * 24),
                    GatewayAuth(keys_file=_keys_file(tmp_path, keys), admin_key=ADMIN, api_key="t" * 24),
                    GatewayAuth(keys_file=_keys_file(tmp_path, {**keys, "d" * 24: "dan"}), admin_key=ADMIN,
                                api_key="s" * 24)):
        assert changed.browser_secret() != secret
    assert GatewayAuth().browser_secret() is None and GatewayAuth().valid_key(b"anything") is False
    # an admin key alone guards the admin routes only: the client routes (and the page) stay open, on loopback
    admin_only = GatewayAuth(admin_key=ADMIN)
    assert admin_only.browser_secret() is None and admin_only.caller({}).person == "default"
    assert not admin_only.caller({"Authorization": "Bearer x" * 20}).admin and admin_only.caller(
        {"Authorization": f"Bearer {ADMIN}"}).admin


def _keys_file(tmp_path, entries: dict[str, str]) -> str:
    path = tmp_path / f"keys{len(list(tmp_path.iterdir()))}.json"   # JSON is YAML too
    path.write_text(json.dumps(entries))
    path.chmod(0o600)
    return str(path)


def test_samples_record_their_person_and_old_records_still_read(tmp_path):
    old = Sample(session_id="s", turn_index=0, kind="rl", reward=1, prompt_ids=[1], response_ids=[2],
                 rollout_logprobs=[-0.5]).to_dict()
    del old["person"]   # a record written before persons were recorded
    with SampleStore(tmp_path / "store") as store:
        store.append_payload(json.dumps(old).encode())
        store.append_payload(encode_sample(Sample(session_id="s", turn_index=1, kind="rl", reward=-1, prompt_ids=[1],
                                                  response_ids=[2], rollout_logprobs=[-0.5], person="alice")))
        assert [s.person for s in store.read(0)] == ["default", "alice"]


def noise_png(seed: int, width: int = 1000, height: int = 700) -> bytes:
    """A PNG of random pixels: it does not compress, so it is about 3 * width * height bytes (2.1 MB)."""
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def test_idle_sessions_hold_no_image_bytes_and_the_spool_is_bounded_per_person(pool, tmp_path):
    """Twenty idle sessions of bob's, each with a 2.1 MB image, cost the gateway no memory (their images wait
    on disk, up to his spool share; the rest are answered but not kept); alice's image turn still trains."""
    from tests.helpers.abuse import data_url, rss_mib
    from tests.e2e.test_image_e2e import make_checkpoint
    from tests.e2e.test_image_pipeline import tokenizer

    vl = tmp_path / "vl"
    make_checkpoint(vl)
    tokenizer().save_pretrained(vl)
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text("".join(f'"{key}": {person}\n' for person, key in KEYS.items()))
    gw = GatewayProcess(["--policy-url", pool.url, "--judge", "rule", "--model", str(vl), "--store",
                         str(tmp_path / "store"), "--keys-file", str(keys_file), "--set", "default_max_tokens=4",
                         "--set", "image_spool_bytes_per_person=16777216"], tmp_path / "gateway.log")
    gw.store_dir = tmp_path / "store"

    def image_turn(person: str, session: str, seed: int) -> list[dict]:
        msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                             {"type": "image_url", "image_url": {"url": data_url(noise_png(seed))}}]}]
        return msgs + [reply_of(chat(gw, person, msgs, session))]

    try:
        image_turn("bob", "warm-up", 99)   # the first request's one-off allocations
        before = rss_mib(gw.proc.pid)
        for i in range(20):
            image_turn("bob", f"bob-{i}", i)
        grown = rss_mib(gw.proc.pid) - before
        print(f"\n20 idle image sessions (2.1 MB each): gateway RSS +{grown:.1f} MiB")
        assert grown < 20, grown
        spool = requests.get(gw.url + "/healthz", headers=as_person("bob"), timeout=30).json()["image_spool"]
        assert 14 << 20 <= spool["bytes"] <= 16 << 20 and spool["turns_refused"] >= 13, spool
        history = image_turn("alice", "alice-1", 123)
        reply_of(chat(gw, "alice", history + [{"role": "user", "content": "Thanks, perfect."}], "alice-1",
                      session_done=True))
        (sample,) = [s for s in samples_when(gw, 1) if s.person == "alice"]
        with SampleStore(gw.store_dir, readonly=True) as store:
            assert store.image(sample.image_sha256[0]) == noise_png(123)
    finally:
        gw.stop()
