"""`python -m openclaw_jax.eval.learning`: the run commands (memory beside the losses, same seeds and
budget) and the table from finished runs written by hand, so every cell has a hand-derived value."""

from __future__ import annotations

import json

import pytest

from openclaw_jax.eval import learning as L

CONFIG = "configs/openclaw_cpu.yaml"
# method -> seed -> (sessions as 0/1, [(step, preference, accuracy)])
RUNS = {
    "memory": {0: ("0001110", [(0, 0.25, 0.5), (4, 0.5, 0.5)]), 1: ("0101", [(0, 0.25, 0.25), (4, 0.25, 0.5)])},
    "combine": {0: ("111", [(0, 0.25, 0.5), (4, 0.75, 0.75)]), 1: ("0111", [(0, 0.25, 0.25), (4, 0.5, 0.25)])},
}


def _write(out):
    for method, by_seed in RUNS.items():
        for seed, (flags, evals) in by_seed.items():
            run = L.run_dir_for(out, "arith", L.Method.parse(method), seed)
            run.mkdir(parents=True)
            (run / "sessions.jsonl").write_text("".join(json.dumps({"session": i + 1, "satisfied": c == "1"}) + "\n"
                                                        for i, c in enumerate(flags)))
            (run / "eval.jsonl").write_text("".join(json.dumps({"step": s, "preference_score": p, "accuracy": a}) + "\n"
                                                    for s, p, a in evals))
            (run / "summary.json").write_text(json.dumps({"interrupted": False, "preference": [{}], "wall_time_s": 60.0}))


# the held-out answers of combine's seed 0 (preference 0.25 -> 0.75 of 4): one satisfied answer at each step
# only restates "What is 2 - 1?", so without it the preference is 0 -> 0.5 (a gain of +0.5, as with it)
HELDOUT = {
    0: [("What is 2 - 1?", "1", "The answer is 2 - 1.", True), ("What is 3 + 4?", "7", "3 + 5 = 8", False),
        ("What is 6 - 2?", "4", "6 - 2", False), ("What is 5 + 5?", "10", "Ten.", False)],
    4: [("What is 2 - 1?", "1", "2 - 1", True), ("What is 3 + 4?", "7", "3 + 4 = 7", True),
        ("What is 6 - 2?", "4", "The answer is 4.", True), ("What is 5 + 5?", "10", "Ten.", False)],
}


def _write_heldout(run):
    for step, rows in HELDOUT.items():
        (run / "heldout").mkdir(exist_ok=True)
        (run / "heldout" / f"step_{step}.jsonl").write_text("".join(
            json.dumps({"question": q, "reference": ref, "answer": a, "satisfied": sat}) + "\n" for q, ref, a, sat in rows))


def test_dry_run_memory_and_losses_share_seeds_and_budget(capsys, tmp_path):
    argv = ["--persona", f"arith={CONFIG}", "--methods", "memory,rl,rl@trainer.reward_baseline=none", "--seeds", "2",
            "--out", str(tmp_path), "--dry-run", "trainer.max_steps=6"]
    assert L.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6
    for line in lines:
        assert line.endswith("progress=false trainer.max_steps=6") and f"--config {CONFIG}" in line
    memory, rl, rl_none = lines[:3]
    assert f"run_dir={tmp_path}/arith/memory/seed0 seed=0 env.seed=0 trainer.enabled=false env.memory=user_md" in memory
    assert "loss.name" not in memory   # remembering trains nothing; the config's judge hints stay on
    assert "loss.name=rl loss.w_opd=null" in rl and "reward_baseline" not in rl
    assert "loss.name=rl loss.w_opd=null trainer.reward_baseline=none" in rl_none
    assert all("seed=1 env.seed=1" in line for line in lines[3:])


@pytest.mark.parametrize("argv", [["--methods", "memory,bogus"], ["--methods", "rl@seed=3"], ["--seeds", "0"],
                                  ["run_dir=x"], ["--persona", "noequals"], ["--persona", "a=configs/missing.yaml"]])
def test_bad_arguments_exit_2(argv, tmp_path):
    base = ["--persona", f"arith={CONFIG}", "--out", str(tmp_path), "--dry-run"]
    assert L.main(base + argv) == 2


def test_table_from_finished_runs(tmp_path):
    _write(tmp_path)
    _write_heldout(L.run_dir_for(tmp_path, "arith", L.Method.parse("combine"), 0))
    # seed 1 (preference 0.25 -> 0.5): one right answer at step 0; at step 4 one right answer and one ("0 + 7")
    # right only by restating, so 0.25 -> 0.25 without restatements
    run1 = L.run_dir_for(tmp_path, "arith", L.Method.parse("combine"), 1)
    _write_heldout(run1)
    step4 = (run1 / "heldout" / "step_4.jsonl").read_text().splitlines()
    step4[0] = json.dumps({"question": "What is 2 - 1?", "reference": "1", "answer": "2 - 1 = 1", "satisfied": True})
    step4[2] = json.dumps({"question": "What is 6 - 2?", "reference": "4", "answer": "6 - 2", "satisfied": False})
    step4[1] = json.dumps({"question": "What is 0 + 7?", "reference": "7", "answer": "0 + 7", "satisfied": True})
    (run1 / "heldout" / "step_4.jsonl").write_text("\n".join(step4) + "\n")
    step0 = [json.loads(line) for line in step4]   # the same questions, only the first one satisfied
    step0 = [{**r, "answer": "1" if i == 0 else "3", "satisfied": i == 0} for i, r in enumerate(step0)]
    (run1 / "heldout" / "step_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in step0))
    assert L.main(["--persona", f"arith={CONFIG}", "--methods", "memory,combine", "--seeds", "2",
                   "--out", str(tmp_path), "--table-only"]) == 0
    rows = {r["method"]: r for r in json.loads((tmp_path / "learning.json").read_text())["rows"]}
    memory, combine = rows["memory"]["aggregate"], rows["combine"]["aggregate"]
    # memory: seed 0 has its first three in a row at session 4; seed 1 never does within 4 sessions
    assert memory["sessions_to_stable"] == [4, None] and memory["sessions"] == [7, 4]
    assert memory["sessions_to_stable_mean"] is None and memory["reached"] == 1
    assert memory["preference_gain"] == pytest.approx((0.25 + 0.0) / 2)
    assert memory["every_seed_above_base"] is False   # seed 1 stayed at 0.25
    # combine: 1 and 2, mean 1.5; preference 0.25 -> 0.625 on average, both seeds up
    assert combine["sessions_to_stable"] == [1, 2] and combine["sessions_to_stable_mean"] == pytest.approx(1.5)
    assert combine["preference_gain"] == pytest.approx(0.375) and combine["every_seed_above_base"] is True
    assert combine["accuracy_change"] == pytest.approx(0.125)
    # without restatements: seed 0 goes 0 -> 0.5, seed 1 0.25 -> 0.25 ("0 + 7" is right only by restating)
    seed0, seed1 = rows["combine"]["runs"]
    assert (seed0["base_preference_unrestated"], seed0["final_preference_unrestated"]) == (0.0, 0.5)
    assert (seed1["base_preference_unrestated"], seed1["final_preference_unrestated"]) == (0.25, 0.25)
    assert combine["preference_gain_unrestated"] == pytest.approx(0.25)
    # the gain's standard error, paired by question: seed 0's changes (0, +1, +1, 0) have sample variance 1/3,
    # s.e. sqrt(1/3 / 4); seed 1's (0, +1, 0, 0) variance 1/4, s.e. 1/4; their mean's sqrt(1/12 + 1/16) / 2
    assert seed0["preference_gain_se"] == pytest.approx((1 / 12) ** 0.5)
    assert seed1["preference_gain_se"] == pytest.approx(0.25)
    assert combine["preference_gain_se"] == pytest.approx((1 / 12 + 1 / 16) ** 0.5 / 2)
    assert memory["preference_gain_se"] is None
    assert memory["preference_gain_unrestated"] is None   # the memory runs here kept no held-out answers (NaN)
    table = (tmp_path / "learning.md").read_text()
    assert ("| arith | memory | 4, not within 4 | 7, 4 | 0.250 -> 0.375 | +0.125 | n/a | no | n/a | 0.375 -> 0.500 | n/a "
            "| 1, 1 |") in table
    assert "| arith | combine | 1.5 (1, 2) | 3, 4 | 0.250 -> 0.625 | +0.375 | 0.191 | yes | +0.250 | 0.375 -> 0.500 |" \
        in table


# a household run: person -> (sessions as 0/1, [(preference, accuracy) at steps 0 and 4])
HOUSEHOLD = {"alice": ("01110", [(0.25, 0.5), (0.75, 0.5)]), "bob": ("0000", [(0.5, 0.5), (0.25, 0.75)])}


def test_household_runs_give_a_row_per_person(tmp_path):
    method = L.Method.parse("combine@trainer.personalize=per_person")
    run = L.run_dir_for(tmp_path, "home", method, 0)
    for person, (flags, _) in HOUSEHOLD.items():
        (run / "people" / person).mkdir(parents=True)
        (run / "people" / person / "sessions.jsonl").write_text(
            "".join(json.dumps({"session": i + 1, "satisfied": c == "1"}) + "\n" for i, c in enumerate(flags)))
    evals = [{"step": step, "preference_score": 0.0, "accuracy": 0.0,   # the means are not any person's numbers
              "people": {p: {"preference_score": e[i][0], "accuracy": e[i][1]} for p, (_, e) in HOUSEHOLD.items()}}
             for i, step in enumerate((0, 4))]
    (run / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (run / "summary.json").write_text(json.dumps({"interrupted": False, "preference": [{}], "wall_time_s": 120.0}))
    assert L.main(["--persona", f"home={CONFIG}", "--methods", method.spec, "--seeds", "1",
                   "--out", str(tmp_path), "--table-only"]) == 0
    rows = {r["persona"]: r for r in json.loads((tmp_path / "learning.json").read_text())["rows"]}
    assert set(rows) == {"home: alice", "home: bob"}
    alice, bob = rows["home: alice"]["aggregate"], rows["home: bob"]["aggregate"]
    assert alice["sessions_to_stable"] == [2] and alice["preference_gain"] == pytest.approx(0.5)
    assert bob["sessions_to_stable"] == [None] and bob["preference_gain"] == pytest.approx(-0.25)
    assert bob["accuracy_change"] == pytest.approx(0.25) and bob["every_seed_above_base"] is False
    assert rows["home: bob"]["runs"][0]["final_step"] == 4
    table = (tmp_path / "learning.md").read_text()
    assert "| home: alice | combine@trainer.personalize=per_person | 2.0 (2) | 5 | 0.250 -> 0.750 | +0.500 | n/a | yes |" \
        in table


def test_step_rewards_read_each_trained_window_from_the_store(tmp_path):
    from openclaw_jax.samples import Sample, SampleStore

    rewards = [1, -1, -1, -1, 0, 1, -1, 1, -1]   # 0: a hint-only sample, neither satisfied nor corrected
    with SampleStore(tmp_path / "samples") as store:
        for i, r in enumerate(rewards):
            hinted = {"hints": ["Be brief."], "hint_prompt_ids": [[1, 2, 4]]} if r == 0 else {}
            store.append(Sample(session_id=f"s{i}", turn_index=0, kind="opd" if r == 0 else "rl", reward=float(r),
                                prompt_ids=[1, 2], response_ids=[3], rollout_logprobs=[-0.5], **hinted))
    # steps.jsonl: the first record of a step is its trained window; a later one with the same number was dropped
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps({"step": s, "start_offset": a, "end_offset": b}) + "\n"
                                                  for s, a, b in [(1, 0, 3), (2, 3, 5), (2, 5, 8)]))
    assert L.step_rewards(tmp_path) == ["+--", "-0"]
    assert L.step_rewards(tmp_path / "missing") == []


def test_gain_standard_error_pairs_the_same_questions_only(tmp_path):
    def write(name, rows):
        (tmp_path / name).write_text("".join(json.dumps({"question": q, "satisfied": sat}) + "\n" for q, sat in rows))
    write("a.jsonl", [("q1", False), ("q2", False), ("q3", True)])
    write("b.jsonl", [("q1", True), ("q2", False), ("q3", False)])   # changes +1, 0, -1: mean 0, variance 1
    assert L.gain_standard_error(tmp_path / "a.jsonl", tmp_path / "b.jsonl") == pytest.approx((1 / 3) ** 0.5)
    write("c.jsonl", [("q1", True), ("q3", False), ("q2", False)])   # another order: not paired
    assert L.gain_standard_error(tmp_path / "a.jsonl", tmp_path / "c.jsonl") is None
    assert L.gain_standard_error(tmp_path / "a.jsonl", tmp_path / "missing.jsonl") is None
