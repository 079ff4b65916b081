"""`python -m openclaw_jax.eval`: reports, TensorBoard, plot and reproducibility.

Part 1 drives the CLI against real scripted OpenAI-compatible servers on 127.0.0.1 (a model
whose style is a known function of the question, and a judge whose votes are a known function
of the vote seed), so every number in the report has an independent expected value.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.scripted_openai import ScriptedOpenAIServer
from tests.helpers.tb_events import read_event_tags

from openclaw_jax.envs.questions import heldout_questions
from openclaw_jax.eval.__main__ import expand_checkpoints, main

ARITH = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def styled_model(body, headers):
    """'Sure, ...' when the first operand is even, plain otherwise."""
    a, op, b = ARITH.search(body["messages"][-1]["content"]).groups()
    value = eval(f"{a}{op}{b}")
    return f"Sure, it is {value}." if int(a) % 2 == 0 else f"It is {value}."


JUDGE_OUTPUTS = ["Fine. \\boxed{1}", "Half. \\boxed{0.5}", "Odd grade \\boxed{0.3}", "I cannot grade this."]


def judge(body, headers):
    return JUDGE_OUTPUTS[body["seed"] % 4]


def _reports(out: Path):
    return sorted(out.glob("report_*.json"))


def test_help_runs_as_module():
    res = subprocess.run([sys.executable, "-m", "openclaw_jax.eval", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0
    for flag in ("--persona", "--questions", "--seed", "--server-url", "--model", "--checkpoint", "--evaluator",
                 "--judge-url", "--votes", "--out", "--tb"):
        assert flag in res.stdout


def test_rule_evaluator_against_live_server(tmp_path):
    out = tmp_path / "eval"
    with ScriptedOpenAIServer(styled_model) as server:
        main(["--persona", "starts_with:prefix=Sure", "--questions", "12", "--seed", "4", "--source", "arithmetic",
              "--server-url", server.url, "--evaluator", "rule", "--out", str(out), "--step", "30", "--max-tokens", "9"])
    questions = heldout_questions("arithmetic", 12, seed=4)
    expected = sum(int(ARITH.search(q.text).group(1)) % 2 == 0 for q in questions) / 12
    [path] = _reports(out)
    report = json.loads(path.read_text())
    assert report["step"] == 30 and report["seed"] == 4 and report["persona"]["name"] == "starts_with"
    assert report["target"] == {"kind": "server", "server_url": server.url}
    assert report["results"]["satisfied_fraction"] == pytest.approx(expected)
    assert report["results"]["mean_score"] == pytest.approx(expected)  # one rule: grade is 0 or 1
    assert [i["question"] for i in report["items"]] == [q.text for q in questions]
    for item in report["items"]:
        assert item["score"] == (1.0 if item["answer"].startswith("Sure") else 0.0)
    # greedy side turns, one per question
    assert len(server.requests) == 12
    for headers, body in server.requests:
        assert body["temperature"] == 0.0 and body["max_tokens"] == 9 and headers["X-Turn-Type"] == "side"
    summary = json.loads((out / "report.json").read_text())
    assert summary["evaluations"] == [report] and summary["files"] == [path.name]
    tags = read_event_tags(out / "tb")
    [(step, value)] = tags["eval/preference_score"]
    assert step == 30 and value.simple_value == pytest.approx(expected)
    assert (out / "score_vs_step.png").stat().st_size > 1000


def half_right_model(body, headers):
    """The right result when the second operand is even, one too many otherwise; always short."""
    a, op, b = ARITH.search(body["messages"][-1]["content"]).groups()
    value = eval(f"{a}{op}{b}")
    return f"The answer: {value if int(b) % 2 == 0 else value + 1}."


def test_accuracy_beside_preference_in_report_summary_and_tensorboard(tmp_path):
    out = tmp_path / "eval"
    with ScriptedOpenAIServer(half_right_model) as server:
        main(["--persona", "concise:max_chars=60", "--questions", "16", "--seed", "2", "--source", "arithmetic",
              "--server-url", server.url, "--out", str(out), "--step", "4", "--max-tokens", "9"])
    questions = heldout_questions("arithmetic", 16, seed=2)
    right = [int(ARITH.search(q.text).group(3)) % 2 == 0 for q in questions]
    [path] = _reports(out)
    report = json.loads(path.read_text())
    # every answer is short and finished, so the brevity persona is always satisfied ...
    assert report["results"]["satisfied_fraction"] == 1.0
    # ... while accuracy counts only the answers with the right final number
    assert report["results"]["accuracy"] == pytest.approx(sum(right) / 16)
    assert report["results"]["accuracy_graded"] == 16
    assert [i["correct"] for i in report["items"]] == right
    [(step, value)] = read_event_tags(out / "tb")["eval/accuracy"]
    assert step == 4 and value.simple_value == pytest.approx(sum(right) / 16)


def test_judge_evaluator_votes_averaged_and_reproducible(tmp_path):
    def run(out):
        with ScriptedOpenAIServer(styled_model) as model, ScriptedOpenAIServer(judge, model="judge") as j:
            main(["--persona", "student_prose", "--questions", "6", "--seed", "1", "--source", "arithmetic",
                  "--server-url", model.url, "--evaluator", "judge", "--judge-url", j.url, "--votes", "3",
                  "--out", str(out), "--tb", str(out / "tb2")])
            return j.requests

    judge_requests = run(tmp_path / "a")
    assert len(judge_requests) == 6 * 3
    report = json.loads(_reports(tmp_path / "a")[0].read_text())
    assert report["evaluator"]["kind"] == "judge" and report["evaluator"]["votes"] == 3
    for item in report["items"]:
        seeds = [b["seed"] for _, b in judge_requests if item["answer"] in b["messages"][-1]["content"]
                 and item["question"] in b["messages"][-1]["content"]]
        assert len(seeds) == 3
        valid = [{0: 1.0, 1: 0.5}[s % 4] for s in seeds if s % 4 in (0, 1)]
        # the votes run concurrently, so the judge may receive them in any order: compare as multisets
        assert Counter(item["votes"]) == Counter({0: 1.0, 1: 0.5}.get(s % 4) for s in seeds)
        assert item["score"] == (pytest.approx(sum(valid) / len(valid)) if valid else None)
    # the rubric names the persona's preference
    assert "no markdown" in judge_requests[0][1]["messages"][-1]["content"]
    # same seed -> identical report file, byte for byte (ports are not recorded for judge runs)
    judge_requests_b = run(tmp_path / "b")
    a = _reports(tmp_path / "a")[0].read_text()
    b = _reports(tmp_path / "b")[0].read_text()
    ra, rb = json.loads(a), json.loads(b)
    ra.pop("target"), rb.pop("target")  # the scripted server's port differs between runs
    assert ra == rb
    assert sorted(b["seed"] for _, b in judge_requests) == sorted(b["seed"] for _, b in judge_requests_b)


def test_plot_collects_every_report_in_out_dir(tmp_path):
    out = tmp_path / "eval"
    with ScriptedOpenAIServer(styled_model) as server:
        for step in (0, 10, 20):
            main(["--persona", "starts_with:prefix=Sure", "--questions", "4", "--source", "arithmetic",
                  "--server-url", server.url, "--out", str(out), "--step", str(step)])
    assert len(_reports(out)) == 3
    tags = read_event_tags(out / "tb")
    assert sorted(s for s, _ in tags["eval/preference_score"]) == [0, 10, 20]
    from openclaw_jax.eval.scoring import load_reports, score_series

    [(label, pts)] = score_series(load_reports(out)).items()
    assert [p[0] for p in pts] == [0, 10, 20]


def test_cli_argument_errors(tmp_path):
    with pytest.raises(SystemExit, match="exactly one of --server-url"):
        main(["--out", str(tmp_path), "--source", "arithmetic"])
    with pytest.raises(SystemExit, match="--judge-url"):
        main(["--out", str(tmp_path), "--server-url", "http://127.0.0.1:9", "--evaluator", "judge"])
    with pytest.raises(ValueError, match="unknown persona"):
        main(["--out", str(tmp_path), "--server-url", "http://127.0.0.1:9", "--persona", "pirate"])
    with pytest.raises(FileNotFoundError, match="no export/step_"):
        expand_checkpoints([str(tmp_path)])


def test_expand_checkpoints_run_dir(tmp_path):
    for step in (100, 20, 3):
        d = tmp_path / "run" / "export" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
    (tmp_path / "run" / "export" / "step_999").mkdir()  # incomplete export: no config.json
    got = expand_checkpoints([str(tmp_path / "run")])
    assert [p.name for p in got] == ["step_3", "step_20", "step_100"]
    assert expand_checkpoints([str(tmp_path / "run" / "export" / "step_20")]) == [tmp_path / "run" / "export" / "step_20"]


# ---------------------------------------------------------------------------------------------
# Part 2: the real embedded inference server on a tiny random checkpoint and a "training run"
# ---------------------------------------------------------------------------------------------

# One prompt bucket, one cache bucket and one batch bucket: the tiny server compiles once.
SERVER_ARGS = ["--server-arg=--min-prompt-bucket=128", "--server-arg=--min-cache-bucket=256",
               "--server-arg=--max-running-requests=4", "--server-arg=--min-batch-bucket=4"]


def _hf_greedy_answers(model_dir, questions, max_new_tokens):
    """Independent reference: HF transformers greedy decoding of the chat-rendered questions."""
    import torch
    import transformers

    from openclaw_jax.models.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    answers = []
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=list(tok.eos_token_ids), pad_token_id=tok.pad_token_id)
        gen = out[0, len(ids):].tolist()
        if gen and gen[-1] in tok.eos_token_ids:
            gen = gen[:-1]  # the server's text omits the matched stop token
        answers.append(tok.decode(gen))
    return answers


@pytest.mark.slow
def test_cli_embedded_server_base_model_and_run_checkpoints_reproducible(tiny_run_dir, tmp_path):
    # a real tiny training run: its base model and its export/step_2 (the trained weights)
    run = tiny_run_dir
    base = run / "base_model"
    args = ["--persona", "starts_with:prefix=Sure", "--questions", "4", "--seed", "2", "--source", "arithmetic",
            "--max-tokens", "8", "--model", str(base), "--checkpoint", str(run), "--include-base",
            "--evaluator", "rule", *SERVER_ARGS]

    def run_cli(out):
        res = subprocess.run([sys.executable, "-m", "openclaw_jax.eval", *args, "--out", str(out)],
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        return [json.loads(p.read_text()) for p in _reports(out)], [p.read_bytes() for p in _reports(out)]

    reports, raw_a = run_cli(tmp_path / "a")
    assert [r["step"] for r in reports] == [0, 2]
    assert reports[0]["target"] == {"kind": "model", "model": str(base)}
    assert reports[1]["target"]["checkpoint"] == str(run / "export" / "step_2")
    questions = [q.text for q in heldout_questions("arithmetic", 4, seed=2)]
    # each evaluation saw the right weights (the step-10 one after a live weight swap)
    assert [i["answer"] for i in reports[0]["items"]] == _hf_greedy_answers(base, questions, 8)
    assert [i["answer"] for i in reports[1]["items"]] == _hf_greedy_answers(run / "export" / "step_2", questions, 8)
    for r in reports:
        expected = sum(i["answer"].startswith("Sure") for i in r["items"]) / 4
        assert r["results"]["satisfied_fraction"] == expected
    out = tmp_path / "a"
    assert (out / "score_vs_step.png").stat().st_size > 1000
    assert sorted(s for s, _ in read_event_tags(out / "tb")["eval/preference_score"]) == [0, 2]
    assert len(json.loads((out / "report.json").read_text())["evaluations"]) == 2
    # same seed, fresh processes: byte-identical reports
    _, raw_b = run_cli(tmp_path / "b")
    assert raw_a == raw_b
