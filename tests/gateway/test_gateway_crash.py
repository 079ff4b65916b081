"""SIGKILL the gateway process while it writes samples, restart it: nothing acknowledged is lost.

The gateway runs as a real subprocess (`python -m openclaw_jax.gateway`) in front of a
scripted worker; concurrent conversations keep the judge producing samples. The gateway
logs "sample N: person P session S turn T ..." right after `SampleStore.append` returned (the
record is fsynced), which is what "acknowledged" means. After the kill we also leave a
torn record at the end of the store (what a crash inside `write` leaves) and check that
the restarted gateway keeps every acknowledged sample and that reading goes on past the
torn bytes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from openclaw_jax.samples import SampleStore, encode_sample
from openclaw_jax.samples.store import encode_record, list_segments, segment_name
from openclaw_jax.models.tokenizer import tiny_test_tokenizer
from tests.helpers.scripted_pool import LoopThread, ScriptedPool, serve_app

ACK = re.compile(r"sample (\d+): person \S+ session (\S+) turn (\d+) kind")
LISTEN = re.compile(r"listening on (http://\S+)")


class GatewayProcess:
    def __init__(self, pool_url: str, store_dir: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "openclaw_jax.gateway", "--policy-url", pool_url, "--judge", "rule",
             "--model", "tiny", "--store", store_dir, "--port", "0", "--log-level", "INFO",
             "--set", "default_max_tokens=8"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        self.acked: dict[int, tuple[str, int]] = {}
        self.log: list[str] = []
        self._lock = threading.Lock()
        self.url: str | None = None
        threading.Thread(target=self._read_stderr, daemon=True).start()
        line = self.proc.stdout.readline()
        match = LISTEN.search(line)
        assert match, f"gateway did not start: {line!r}\n" + "\n".join(self.log[-20:])
        self.url = match.group(1)

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.log.append(line)
            m = ACK.search(line)
            if m:
                with self._lock:
                    self.acked[int(m.group(1))] = (m.group(2), int(m.group(3)))

    def n_acked(self) -> int:
        with self._lock:
            return len(self.acked)

    def kill(self):
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        time.sleep(0.2)  # let the stderr reader take the last lines
        self.proc.stdout.close()


def converse(url: str, session: str, stop: threading.Event, errors: list):
    """A session that keeps going: every request is the next state of the previous turn."""
    history = [{"role": "user", "content": f"Hello from {session}"}]
    with httpx.Client(base_url=url, timeout=30) as http:
        i = 0
        while not stop.is_set():
            try:
                r = http.post("/v1/chat/completions", json={"messages": history},
                              headers={"X-Session-Id": session, "X-Turn-Type": "main"})
            except httpx.HTTPError:
                return  # the gateway was killed under us
            if r.status_code != 200:
                errors.append((r.status_code, r.text))
                return
            reply = r.json()["choices"][0]["message"]["content"]
            feedback = "Thanks, perfect!" if i % 2 else "No, that's wrong. You should use shorter words."
            history = history + [{"role": "assistant", "content": reply},
                                 {"role": "user", "content": f"{feedback} ({session} #{i})"}]
            i += 1


def run_traffic(url: str, n_sessions: int, prefix: str):
    stop = threading.Event()
    errors: list = []
    threads = [threading.Thread(target=converse, args=(url, f"{prefix}{k}", stop, errors), daemon=True)
               for k in range(n_sessions)]
    for t in threads:
        t.start()
    return stop, threads, errors


def check_acknowledged(store_dir: str, acked: dict[int, tuple[str, int]], pool: ScriptedPool):
    with SampleStore(store_dir, readonly=True) as store:
        assert len(store) >= len(acked)
        for offset, (session, turn) in acked.items():
            sample = store[offset]
            assert (sample.session_id, sample.turn_index) == (session, turn)
        samples = store.read(0)
    # Every stored sample is intact and holds exactly what the worker returned for its prompt.
    answers = {tuple(req["input_ids"]): ans for req, ans in pool.exchanges}
    for s in samples:
        answer = answers[tuple(s.prompt_ids)]
        assert s.response_ids == answer["output_ids"]
        assert s.rollout_logprobs == [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
    return samples


@pytest.mark.timeout(300)
def test_sigkill_while_writing_then_restart_keeps_every_acknowledged_sample(tmp_path):
    lt = LoopThread()
    pool = ScriptedPool(tiny_test_tokenizer())
    pool_runner, pool_url = lt.run(serve_app(pool.app()))
    store_dir = str(tmp_path / "store")
    try:
        # Round 1: traffic until samples are being written steadily, then SIGKILL mid-stream.
        gw = GatewayProcess(pool_url, store_dir)
        stop, threads, errors = run_traffic(gw.url, 6, "a")
        deadline = time.time() + 120
        while gw.n_acked() < 40 and time.time() < deadline:
            time.sleep(0.05)
        assert gw.n_acked() >= 40, "".join(gw.log[-30:])
        gw.kill()
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors[:3]
        acked_1 = dict(gw.acked)
        check_acknowledged(store_dir, acked_1, pool)

        # What a crash inside write() leaves: the first part of a record at the end of the store.
        last = list_segments(store_dir)[-1]
        with SampleStore(store_dir, readonly=True) as store:
            n_before = len(store)
            torn = encode_record(encode_sample(store[0]))
        with open(os.path.join(store_dir, segment_name(last)), "ab") as f:
            f.write(torn[: len(torn) // 2])

        # Round 2: restart on the same store; it must skip the torn bytes and keep appending.
        gw2 = GatewayProcess(pool_url, store_dir)
        stop, threads, errors = run_traffic(gw2.url, 4, "b")
        deadline = time.time() + 120
        while gw2.n_acked() < 20 and time.time() < deadline:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors[:3]
        gw2.proc.send_signal(signal.SIGTERM)  # graceful stop this time: queued judgements are stored
        assert gw2.proc.wait(60) == 0
        assert any("torn record" in line for line in gw2.log), "the restart did not report the torn tail"
        assert min(gw2.acked) == n_before  # offsets continue right after the last complete record
        samples = check_acknowledged(store_dir, {**acked_1, **gw2.acked}, pool)
        assert len(samples) >= n_before + 20
        assert {s.session_id[0] for s in samples[n_before:]} == {"b"}
        assert list_segments(store_dir) == list(range(last + 2))  # one new segment after the torn one
    finally:
        lt.run(pool_runner.cleanup())
        lt.stop()
