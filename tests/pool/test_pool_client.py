"""The asyncio pool client against real server processes (and a scripted stub worker for failures).

Two `python -m openclaw_jax.inference` processes serve a tiny checkpoint on 127.0.0.1;
one is killed and restarted to check that the pool takes it out and puts it back.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
import requests
from aiohttp import web

from openclaw_jax.pool.client import (
    MalformedResponseError,
    NoHealthyWorkerError,
    PoolClient,
    RequestRejectedError,
    WorkerUnavailableError,
)
from tests.helpers.server_utils import ServerProcess, ServerThread


@pytest.fixture(scope="module")
def workers(tiny_qwen3_dir, tiny_qwen3_dir_b, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool")
    cache = tmp / "jax_cache"
    weights = ["--weight-dir", str(tiny_qwen3_dir.parent), "--weight-dir", str(tiny_qwen3_dir_b.parent)]
    a = ServerProcess(tiny_qwen3_dir, cache_dir=cache, log_path=tmp / "a.log", extra_args=weights).start()
    # Warm A so that B (and a restarted B) load the compiled steps from the shared cache.
    for body in ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
                 {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True,
                  "top_logprobs_num": 2, "logprob_start_len": 0}):
        assert requests.post(a.url + "/generate", json=body, timeout=300).status_code == 200
    b = ServerProcess(tiny_qwen3_dir, cache_dir=cache, log_path=tmp / "b.log", extra_args=weights).start()
    yield a, b, tmp
    for w in (a, b):
        w.kill()


def run(coro):
    return asyncio.run(coro)


def test_client_drives_every_call(workers, tiny_qwen3_dir, tiny_qwen3_dir_b):
    a, b, _ = workers

    async def main():
        async with PoolClient([a.url, b.url], health_interval_s=0.5, request_timeout_s=120) as pool:
            assert await pool.check_health() == {a.url: True, b.url: True}
            assert sorted(pool.healthy_urls()) == sorted([a.url, b.url])
            info = await pool.model_info()
            assert info["is_generation"] is True and info["weight_version"] == "default"

            greedy = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
            res = await pool.generate([5, 6, 7], sampling_params=greedy, return_logprob=True, top_logprobs_num=3,
                                      logprob_start_len=0)
            raw = res.raw["meta_info"]
            assert res.response_ids == res.raw["output_ids"] and len(res.response_ids) == 6
            assert res.rollout_logprobs == [e[0] for e in raw["output_token_logprobs"]]
            assert [[t for _, t in pos] for pos in res.output_top_logprobs] == \
                [[e[1] for e in pos] for pos in raw["output_top_logprobs"]]
            assert all(res.rollout_logprobs[i] == res.output_top_logprobs[i][0][0] for i in range(6))  # greedy
            assert res.input_logprobs[0] is None and len(res.input_logprobs) == 3
            assert res.finish_reason.type == "length" and res.finish_reason.length == 6
            assert (res.prompt_tokens, res.completion_tokens, res.weight_version) == (3, 6, "default")
            assert res.worker_url in (a.url, b.url)

            text_res = await pool.generate(text="Hello", sampling_params={"max_new_tokens": 3})
            assert text_res.completion_tokens == len(text_res.response_ids) <= 3

            chunks = [c async for c in pool.generate_stream([5, 6, 7], sampling_params=greedy)]
            assert chunks[-1].finished and not any(c.finished for c in chunks[:-1])
            assert [c.response_ids for c in chunks] == [res.response_ids[:k + 1] for k in range(6)]

            many = await pool.generate_many([[1, 2], [3, 4, 5]], sampling_params={"max_new_tokens": 3, "n": 2})
            assert len(many) == 4 and [m.prompt_tokens for m in many] == [2, 2, 3, 3]
            with pytest.raises(ValueError, match="generate_many"):
                await pool.generate([1], sampling_params={"n": 2})

            # least-outstanding choice spreads concurrent work over both workers
            spread = await asyncio.gather(*(pool.generate([i + 1, 2], sampling_params={"max_new_tokens": 8})
                                            for i in range(16)))
            assert {r.worker_url for r in spread} == {a.url, b.url}

            with pytest.raises(RequestRejectedError) as err:
                await pool.generate([7] * 600)
            assert err.value.status == 400 and "context length" in err.value.message

            for fan in (await pool.flush_cache(), await pool.pause_generation("in_place"),
                        await pool.continue_generation()):
                assert set(fan) == {a.url, b.url} and all(v["status"] == 200 for v in fan.values())

            # weight updates go to every worker; each reports its own result
            results = await pool.update_weights_from_disk(str(tiny_qwen3_dir_b), weight_version="v2")
            assert [r.url for r in results] == [a.url, b.url]
            assert all(r.success and "v2" in r.message and r.num_paused_requests == 0 for r in results)
            after = await asyncio.gather(*(pool.generate([5, 6, 7], sampling_params=greedy) for _ in range(4)))
            assert {r.weight_version for r in after} == {"v2"} and {r.worker_url for r in after} == {a.url, b.url}
            assert all(r.response_ids != res.response_ids for r in after)
            bad = await pool.update_weights_from_disk(str(tiny_qwen3_dir.parent / "no-such-checkpoint"),
                                                      weight_version="v3")
            assert [r.success for r in bad] == [False, False]
            assert all("no-such-checkpoint" in r.message for r in bad)
            back = await pool.update_weights_from_disk(str(tiny_qwen3_dir), weight_version="default")
            assert all(r.success for r in back)
            again = await pool.generate([5, 6, 7], sampling_params=greedy)
            assert again.response_ids == res.response_ids and again.weight_version == "default"

    run(main())


def test_killed_worker_is_taken_out_and_put_back(workers):
    a, b, tmp = workers

    async def main():
        async with PoolClient([a.url, b.url], health_interval_s=0.5, request_timeout_s=120, backoff_s=0.05) as pool:
            long = {"max_new_tokens": 100, "ignore_eos": True}
            in_flight = [asyncio.create_task(pool.generate([i + 1, 3], sampling_params=long)) for i in range(12)]
            while pool.outstanding()[b.url] == 0:
                await asyncio.sleep(0.005)
            b.kill()  # SIGKILL while requests are in flight
            results = await asyncio.gather(*in_flight)
            assert all(len(r.response_ids) == 100 for r in results)
            more = await asyncio.gather(*(pool.generate([7, i + 1], sampling_params={"max_new_tokens": 4})
                                          for i in range(8)))
            assert {r.worker_url for r in more} == {a.url}
            await asyncio.sleep(1.2)
            assert pool.healthy_urls() == [a.url]

            restarted = ServerProcess(b.model_dir, port=b.port, cache_dir=b.cache_dir,
                                      log_path=tmp / "b2.log").start()
            b.proc = restarted.proc  # the fixture's teardown kills the new process
            deadline = time.monotonic() + 30
            while b.url not in pool.healthy_urls():
                assert time.monotonic() < deadline, "the restarted worker was never put back"
                await asyncio.sleep(0.2)
            back = await asyncio.gather(*(pool.generate([9, i + 1], sampling_params={"max_new_tokens": 4})
                                          for i in range(8)))
            assert b.url in {r.worker_url for r in back}

    run(main())


def test_sigterm_finishes_in_flight_requests(workers, tiny_qwen3_dir):
    _, _, tmp = workers
    proc = ServerProcess(tiny_qwen3_dir, cache_dir=workers[0].cache_dir, log_path=tmp / "c.log").start()
    try:
        with requests.post(proc.url + "/generate", stream=True, timeout=300,
                           json={"input_ids": [1, 2], "stream": True,
                                 "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}}) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line)
            assert json.loads(first[6:])["meta_info"]["finish_reason"] is None
            proc.proc.send_signal(signal.SIGTERM)
            events = [line[6:] for line in lines if line]
        assert events[-1] == b"[DONE]"
        final = json.loads(events[-2])
        assert final["meta_info"]["finish_reason"] == {"type": "length", "length": 120}
        assert proc.proc.wait(timeout=60) == 0
        with pytest.raises(requests.ConnectionError):
            requests.get(proc.url + "/health", timeout=2)
    finally:
        proc.kill()


# ------------------------------------------------------------------------------------ stub worker
class StubWorker:
    """A scripted SGLang-shaped worker: each /generate answer is popped from `script`."""

    def __init__(self):
        self.script: list = []
        self.calls = 0
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/get_model_info", lambda r: web.json_response({"model_path": "stub"}))
        self.healthy = True
        self.thread = ServerThread(app).start()
        self.url = self.thread.url

    async def health(self, request):
        return web.Response(status=200 if self.healthy else 503)

    async def generate(self, request):
        self.calls += 1
        await request.read()
        action = self.script.pop(0) if self.script else ("ok",)
        kind = action[0]
        if kind == "status":
            return web.json_response({"error": {"message": action[2]}}, status=action[1])
        if kind == "sleep":
            await asyncio.sleep(action[1])
        if kind == "raw":
            return web.Response(text=action[1], status=200, content_type="application/json")
        finish = {"type": "abort", "message": "paused"} if kind == "abort" else {"type": "length", "length": 2}
        return web.json_response({"text": "ab", "output_ids": [3, 4], "meta_info": {
            "id": "x", "finish_reason": finish, "prompt_tokens": 1, "completion_tokens": 2, "cached_tokens": 0,
            "weight_version": "w1", "e2e_latency": 0.01}})

    def stop(self):
        self.thread.stop()


@pytest.fixture
def stub():
    s = StubWorker()
    yield s
    s.stop()


def test_retries_backoff_and_errors(stub):
    async def main():
        async with PoolClient([stub.url], health_interval_s=0, max_retries=3, backoff_s=0.01,
                              request_timeout_s=1.0) as pool:
            stub.script = [("status", 503, "busy"), ("status", 429, "slow down"), ("ok",)]
            res = await pool.generate([1])
            assert res.response_ids == [3, 4] and res.weight_version == "w1" and stub.calls == 3

            stub.calls, stub.script = 0, [("status", 400, "top_p must be in (0, 1], got 2.0.")]
            with pytest.raises(RequestRejectedError) as err:
                await pool.generate([1], sampling_params={"top_p": 2.0})
            assert err.value.status == 400 and "top_p" in err.value.message and stub.calls == 1  # not retried

            stub.calls, stub.script = 0, [("status", 500, "boom")] * 4
            with pytest.raises(WorkerUnavailableError) as err:
                await pool.generate([1])
            assert stub.calls == 4 and "boom" in str(err.value) and len(err.value.attempts) == 4

            stub.calls, stub.script = 0, [("sleep", 3.0), ("ok",)]
            res = await pool.generate([1])  # first attempt times out, the retry succeeds
            assert res.response_ids == [3, 4] and stub.calls == 2

            stub.calls, stub.script = 0, [("abort",), ("ok",)]
            res = await pool.generate([1])  # an aborted generation is retried
            assert res.finish_reason.type == "length" and stub.calls == 2

            stub.script = [("raw", '{"text": "x"}')]
            with pytest.raises(MalformedResponseError):
                await pool.generate([1])
            stub.script = [("raw", "not json")]
            with pytest.raises(MalformedResponseError):
                await pool.generate([1])

            stub.healthy = False
            assert await pool.check_health() == {stub.url: False}
            with pytest.raises(NoHealthyWorkerError):
                await pool.generate([1])
            stub.healthy = True
            assert (await pool.generate([1])).response_ids == [3, 4]  # probed again and put back

    run(main())


def test_unreachable_worker_at_start(stub):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed

    async def main():
        async with PoolClient([dead, stub.url], health_interval_s=0, backoff_s=0.01) as pool:
            assert pool.healthy_urls() == [stub.url]
            results = await asyncio.gather(*(pool.generate([1]) for _ in range(5)))
            assert {r.worker_url for r in results} == {stub.url}
            upd = await pool.update_weights_from_disk("/x")
            assert upd[0].url == dead and not upd[0].success and "request failed" in upd[0].message

    run(main())
    with pytest.raises(ValueError):
        PoolClient([])
