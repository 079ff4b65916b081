"""The status page in a real headless Chromium (selenium, Debian's chromium + chromium-driver).

A real gateway in front of the embedded inference server (tiny random Qwen3, rule judge) takes real
conversations: main turns whose next message thanks or corrects the assistant (one with HTML in it),
and side turns. A `PromotionGate` over the versions directory promotes version 1 (the served weights
again: score 0, no drift) and refuses version 2 (weights far from the served ones: the drift bound),
each after a real check on the held-out turns. The page must then show, read from the DOM of the
page Chromium rendered: the numbers of ``GET /v1/status`` (served version, counts, the satisfaction
bars, the scored turns, the versions log, the sessions), which must equal what the sample store and
the event log hold; the person's words as text (escaped, never markup); no script at all. Two people
(alice and bob, one shared key, each naming themselves in ``X-Person-Id`` as the OpenClaw plugin does)
hold the conversations: the page's people table shows each one's sessions, requests, scored turns,
satisfied, corrected and satisfaction rate, as the store holds them. Signing in takes the gateway's key
once; the cookie it sets is HttpOnly and is not the key.
"""

from __future__ import annotations

import collections

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from openclaw_jax.samples import SampleStore
from openclaw_jax.samples.holdout import is_held_out
from openclaw_jax.serving.config import GateConfig
from openclaw_jax.serving.versions import VersionLog
from tests.helpers.served_stack import API_KEY, Served, perturbed

INJECTED = "<script>document.title='owned'</script> That is not right, you should list colours & shapes."
CONVERSATIONS = [   # (question, the person's reaction to the answer)
    ("Name a colour.", "Thanks, that's perfect."),
    ("Name a shape.", "No, that's wrong. Please answer with one word."),
    ("Name a fruit.", INJECTED),
    ("Name an animal.", "Great, thank you!"),
    ("Name a tree.", "Wrong again. Always give the Latin name too."),
    ("Name a river.", "Perfect, thanks."),
]


PEOPLE = ("alice", "bob")   # conversation i is PEOPLE[i % 2]'s


def _converse(http: httpx.Client, session: str, question: str, reaction: str, person: str) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Session-Id": session, "X-Turn-Type": "main",
               "X-Person-Id": person}
    first = http.post("/v1/chat/completions", headers=headers, json={
        "model": "tiny", "messages": [{"role": "user", "content": question}], "max_tokens": 8})
    assert first.status_code == 200, first.text
    answer = first.json()["choices"][0]["message"]["content"] or ""
    side = http.post("/v1/chat/completions", headers={**headers, "X-Turn-Type": "side"}, json={
        "model": "tiny", "messages": [{"role": "user", "content": "heartbeat"}], "max_tokens": 2})
    assert side.status_code == 200, side.text
    closing = http.post(f"/v1/sessions/{session}/done", headers={"Authorization": f"Bearer {API_KEY}",
                                                                 "X-Person-Id": person}, json={
        "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer},
                     {"role": "user", "content": reaction}]})
    assert closing.status_code == 200 and closing.json()["scored_turn"], closing.text


@pytest.fixture(scope="module")
def live(tiny_qwen3_dir, tmp_path_factory):
    stack = Served(tiny_qwen3_dir, tmp_path_factory.mktemp("status"),
                   gate=GateConfig(enabled=True, holdout_every=2, replay_size=16, min_replay=0, min_score=-1e9,
                                   max_kl=0.5))   # the drift bound alone decides here
    http = httpx.Client(base_url=stack.url, timeout=120)
    for i, (question, reaction) in enumerate(CONVERSATIONS):
        _converse(http, f"person-{i}", question, reaction, PEOPLE[i % 2])
    stack.lt.run(stack.gateway.drain(60))
    stack.lt.run(stack.gate(stack.graphdef, stack.state0, "1"))                       # the same weights: promoted
    for i, (question, reaction) in enumerate(CONVERSATIONS[:3]):
        _converse(http, f"person-v1-{i}", question, reaction, PEOPLE[i % 2])
    stack.lt.run(stack.gateway.drain(60))
    stack.lt.run(stack.gate(stack.graphdef, perturbed(stack.state0, 2, scale=1.0), "2"))   # far away: refused
    stack.http_client = http
    yield stack
    http.close()
    stack.close()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(120)
    yield driver
    driver.quit()


def _text(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def _sign_in(driver, url: str, key: str) -> None:
    driver.get(url + "/")
    field = driver.find_element(By.ID, "key")
    field.clear()
    field.send_keys(key)
    driver.find_element(By.ID, "sign-in").click()
    # the click only starts the form's POST: wait until the browser has left the sign-in page it was on
    WebDriverWait(driver, 120).until(lambda _: _gone(field))


def _gone(element) -> bool:
    """Whether `element` no longer belongs to the page shown. Chrome answers a probe of an element of a page it
    is leaving either as stale or, mid-navigation, with "Node with given id does not belong to the document"."""
    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


def test_the_page_shows_the_runs_numbers(live, browser):
    events = VersionLog(live.versions).events()
    assert [e["event"] for e in events] == ["start", "promoted", "refused"], events
    assert events[2]["rule"] == "max_kl"

    # the JSON, behind the key
    assert httpx.get(live.url + "/v1/status").status_code == 401
    status = live.http_client.get("/v1/status", headers={"Authorization": f"Bearer {API_KEY}"}).json()

    # sign in: a wrong key is refused on the page, the right one opens it with an HttpOnly cookie
    _sign_in(browser, live.url, "not-the-key")
    assert "not one of the gateway's keys" in _text(browser, "login-error")
    _sign_in(browser, live.url, API_KEY)
    cookie = browser.get_cookie("openclaw_jax_status")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and API_KEY not in cookie["value"]
    assert browser.find_elements(By.TAG_NAME, "script") == [] and browser.title != "owned"

    # the summary: the JSON's numbers, which are the log's and the store's
    with SampleStore(live.store_dir, readonly=True) as store:
        samples = store.read(0)
    assert _text(browser, "served-version") == status["served_version"] == "1"
    assert _text(browser, "store-samples") == str(status["store"]["samples"]) == str(len(samples))
    held = sum(is_held_out(s.sample_id, 2) for s in samples)
    assert _text(browser, "store-held-out") == str(status["store"]["held_out"]) == str(held)
    assert _text(browser, "promoted") == "1" and _text(browser, "refused") == "1"
    assert _text(browser, "requests-side") == str(status["requests"]["side"]) == str(len(CONVERSATIONS) + 3)   # one side request per conversation

    # the satisfaction plot: one bar per served version, satisfied / (satisfied + corrected) from the store
    tally = collections.defaultdict(lambda: [0, 0])
    for s in samples:
        if s.eval_score:
            tally[s.weight_version][0 if s.eval_score > 0 else 1] += 1
    bars = browser.find_elements(By.CSS_SELECTOR, "svg#satisfaction g.bar")
    shown = {b.get_attribute("data-version"): (int(b.get_attribute("data-satisfied")),
                                               int(b.get_attribute("data-corrected")),
                                               float(b.get_attribute("data-rate"))) for b in bars}
    assert set(shown) == {"0", "1"} == {row["version"] for row in status["satisfaction"]}
    for row in status["satisfaction"]:
        sat, cor = tally[row["version"]]
        assert shown[row["version"]] == (row["satisfied"], row["corrected"], row["rate"]) == (sat, cor, sat / (sat + cor))

    # the scored turns, newest first: reward, the person's words as text, held-out marks
    rows = browser.find_elements(By.CSS_SELECTOR, "#scored-turns tbody tr")
    assert [int(r.get_attribute("data-offset")) for r in rows] == [t["offset"] for t in status["scored_turns"]] \
        == list(range(len(samples)))[::-1]
    for row, sample in zip(rows, reversed(samples)):
        cell = lambda name: row.find_element(By.CSS_SELECTOR, f"td[data-field='{name}']").text   # noqa: E731
        assert float(cell("reward")) == sample.reward
        assert cell("version") == sample.weight_version
        assert cell("reaction") == sample.next_state["content"]
        assert cell("held_out") == ("yes" if is_held_out(sample.sample_id, 2) else "")
        assert cell("hint") == (sample.hints[0] if sample.hints else "")
        assert cell("person") == sample.person and sample.person in PEOPLE
    assert any(r.find_element(By.CSS_SELECTOR, "td[data-field='reaction']").text == INJECTED for r in rows)

    # the versions log, newest first, with the refusal's reason and numbers
    logged = browser.find_elements(By.CSS_SELECTOR, "#versions tbody tr")
    assert [r.find_element(By.CSS_SELECTOR, "td[data-field='event']").text for r in logged] == \
        [e["event"] for e in reversed(events)]
    refused = logged[0].find_element(By.CSS_SELECTOR, "td[data-field='reason']").text
    assert refused == events[2]["reason"] and "gate.max_kl=0.5" in refused
    assert float(logged[0].find_element(By.CSS_SELECTOR, "td[data-field='drift']").text) == \
        pytest.approx(events[2]["check"]["drift"], rel=1e-3)

    # sessions: main and side requests per session, with its person
    sessions = {r.find_element(By.CSS_SELECTOR, "td[data-field='session']").text:
                (r.find_element(By.CSS_SELECTOR, "td[data-field='person']").text,
                 r.find_element(By.CSS_SELECTOR, "td[data-field='main']").text,
                 r.find_element(By.CSS_SELECTOR, "td[data-field='side']").text)
                for r in browser.find_elements(By.CSS_SELECTOR, "#sessions tbody tr")}
    assert sessions["person-0"] == ("alice", "1", "1") and sessions["person-v1-1"] == ("bob", "1", "1")
    assert len(sessions) == len(CONVERSATIONS) + 3

    # people: each one's sessions and requests (one main and one side request per conversation) and, from
    # the store, their scored turns, satisfied (+1), corrected (-1) and rate, overall and per version
    _check_people(browser, status, samples)


def _check_people(browser, status: dict, samples: list) -> None:
    rows = browser.find_elements(By.CSS_SELECTOR, "#people tbody tr")
    assert [r.get_attribute("data-person") for r in rows] == [p["person"] for p in status["people"]] == list(PEOPLE)
    conversations = {p: sum(1 for i in [*range(len(CONVERSATIONS)), *range(3)] if PEOPLE[i % 2] == p) for p in PEOPLE}
    assert conversations == {"alice": 5, "bob": 4}
    for row in rows:
        person = row.get_attribute("data-person")
        cell = lambda name: row.find_element(By.CSS_SELECTOR, f"td[data-field='{name}']").text   # noqa: E731
        own = [s for s in samples if s.person == person]
        satisfied, corrected = sum(s.eval_score > 0 for s in own), sum(s.eval_score < 0 for s in own)
        assert satisfied and corrected, (person, satisfied, corrected)   # both people have both kinds of turn
        assert (cell("person"), cell("sessions"), cell("open"), cell("main"), cell("side")) == \
            (person, str(conversations[person]), "0", str(conversations[person]), str(conversations[person]))
        assert (cell("scored"), cell("satisfied"), cell("corrected")) == (str(len(own)), str(satisfied), str(corrected))
        assert float(row.get_attribute("data-rate")) == satisfied / (satisfied + corrected)
        assert cell("rate") == f"{100 * satisfied / (satisfied + corrected):.0f}%"
        by_version = collections.defaultdict(lambda: [0, 0])
        for s in own:
            if s.eval_score:
                by_version[s.weight_version][0 if s.eval_score > 0 else 1] += 1
        assert cell("by_version") == ", ".join(f"v{v}: {100 * a / (a + c):.0f}% ({a}/{a + c})"
                                               for v, (a, c) in sorted(by_version.items()))


def test_the_page_is_closed_without_the_key(live):
    page = httpx.get(live.url + "/")
    assert page.status_code == 401 and 'name="key"' in page.text and "person-0" not in page.text
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")
    forged = httpx.get(live.url + "/", cookies={"openclaw_jax_status": API_KEY})
    assert forged.status_code == 401
    # a program passes the bearer key and gets the page directly
    direct = httpx.get(live.url + "/", headers={"Authorization": f"Bearer {API_KEY}"})
    assert direct.status_code == 200 and "person-0" in direct.text and "<script>document" not in direct.text
