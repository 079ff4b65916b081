"""Per-person adapters over HTTP: a real `python -m openclaw_jax.inference --lora-slots ...` process on
127.0.0.1, `/generate` with SGLang's `lora_path` per prompt, `/load_lora_adapter`, and 400s for adapters
it cannot serve. References: HF `transformers` float64 on the merged weights (tests/helpers/lora_refs.py)."""

from __future__ import annotations

import numpy as np
import pytest
import requests

from openclaw_jax.models.weights import load_hf_checkpoint
from tests.helpers.lora_refs import ATOL, merged_hf, random_adapter, ref_log_probs, write_peft_adapter
from tests.helpers.server_utils import ServerProcess

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = [[5, 17, 42, 99, 3], [200, 201, 7]]
MAX_NEW = 5


@pytest.fixture(scope="module")
def lora_srv(tiny_qwen3_dir, tmp_path_factory):
    model, _ = load_hf_checkpoint(tiny_qwen3_dir)
    adapters = {"alice": random_adapter(model.cfg, 1, rank=4, alpha=8.0, targets=("q", "v", "o", "down")),
                "bob": random_adapter(model.cfg, 2, rank=2, alpha=2.0, targets=("k", "gate", "up"))}
    lora_dir = tmp_path_factory.mktemp("adapters")
    for name, adapter in adapters.items():
        write_peft_adapter(lora_dir, name, adapter)
    log = tmp_path_factory.mktemp("lora_srv") / "server.log"
    srv = ServerProcess(tiny_qwen3_dir, log_path=log, extra_args=[
        "--api-key", KEY, "--lora-slots", "2", "--lora-max-rank", "4", "--lora-dir", str(lora_dir)]).start()
    yield srv, adapters, lora_dir
    srv.kill()


def generate(srv, prompts, loras):
    body = {"input_ids": prompts, "lora_path": loras, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}}
    return requests.post(srv.url + "/generate", json=body, headers=AUTH, timeout=120)


def check_answer(answer, prompt, hf):
    """Greedy tokens and every prompt / output log-prob of one /generate answer equal the reference's."""
    meta = answer["meta_info"]
    out_ids = [t for _, t, _ in meta["output_token_logprobs"]]
    ids = list(prompt) + out_ids
    lp = ref_log_probs(hf, ids)
    got_in = [v for v, _, _ in meta["input_token_logprobs"]][1:]
    np.testing.assert_allclose(got_in, [lp[t - 1, ids[t]] for t in range(1, len(prompt))], atol=ATOL)
    for step, (value, token, _) in enumerate(meta["output_token_logprobs"]):
        pos = len(prompt) - 1 + step
        assert token == int(np.argmax(lp[pos]))
        np.testing.assert_allclose(value, lp[pos, token], atol=ATOL)


def test_generate_serves_each_prompt_with_its_adapter(lora_srv, tiny_qwen3_dir):
    srv, adapters, _ = lora_srv
    resp = generate(srv, PROMPTS + [PROMPTS[0]], ["alice", "bob", None])
    assert resp.status_code == 200, resp.text
    answers = resp.json()
    for prompt, lora, answer in zip(PROMPTS + [PROMPTS[0]], ["alice", "bob", None], answers):
        check_answer(answer, prompt, merged_hf(tiny_qwen3_dir, adapters.get(lora)))


def test_unknown_adapters_get_a_400_and_nothing_runs(lora_srv):
    srv, _, _ = lora_srv
    for loras, words in ((["mallory", None], "no adapter of that name"), (["../x", None], "not a person id"),
                         ([7, None], "lora_path must be an adapter name")):
        resp = generate(srv, PROMPTS, loras)
        assert resp.status_code == 400, resp.text
        assert words in resp.json()["error"]["message"]
    assert requests.get(srv.url + "/health", timeout=10).status_code == 200


def test_openai_routes_take_lora_path_too(lora_srv, tiny_qwen3_dir):
    """`/v1/completions` with SGLang's `lora_path` extra field (the official `openai` client's extra_body):
    the adapter's greedy answer, the same tokens `/generate` gives; an unknown name is a 400."""
    import openai

    srv, adapters, _ = lora_srv
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY)
    prompt = PROMPTS[0]
    ids = [t for _, t, _ in generate(srv, [prompt], ["bob"]).json()[0]["meta_info"]["output_token_logprobs"]]
    done = client.completions.create(model="default", prompt=prompt, max_tokens=MAX_NEW, temperature=0,
                                     logprobs=1, extra_body={"lora_path": "bob", "ignore_eos": True})
    lp = ref_log_probs(merged_hf(tiny_qwen3_dir, adapters["bob"]), list(prompt) + ids)
    np.testing.assert_allclose(done.choices[0].logprobs.token_logprobs,
                               [lp[len(prompt) - 1 + s, t] for s, t in enumerate(ids)], atol=ATOL)
    with pytest.raises(openai.BadRequestError, match="no adapter of that name"):
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, extra_body={"lora_path": "mallory"})


def test_load_lora_adapter_serves_the_new_values(lora_srv, tiny_qwen3_dir):
    srv, _, lora_dir = lora_srv
    model, _ = load_hf_checkpoint(tiny_qwen3_dir)
    new_alice = random_adapter(model.cfg, 9, rank=4, alpha=4.0, targets=("q", "up"))
    write_peft_adapter(lora_dir, "alice", new_alice)
    resp = requests.post(srv.url + "/load_lora_adapter", json={"lora_name": "alice"}, headers=AUTH, timeout=60)
    assert resp.status_code == 200 and resp.json()["success"], resp.text
    answer = generate(srv, [PROMPTS[1]], ["alice"]).json()[0]
    check_answer(answer, PROMPTS[1], merged_hf(tiny_qwen3_dir, new_alice))
    # a control route: the key is required; a path outside the adapter directory is refused
    assert requests.post(srv.url + "/load_lora_adapter", json={"lora_name": "alice"}, timeout=10).status_code == 401
    bad = requests.post(srv.url + "/load_lora_adapter", json={"lora_name": "alice", "lora_path": "/etc"},
                        headers=AUTH, timeout=10)
    assert bad.status_code == 400 and "lora-dir" in bad.text
    missing = requests.post(srv.url + "/load_lora_adapter", json={"lora_name": "zed"}, headers=AUTH, timeout=10)
    assert missing.status_code == 400 and missing.json()["success"] is False
