"""The documentation holds together: README.md stays a short front page; every link in README.md and
docs/ points at a file and heading that exist; every repository path they name exists; the commands
they print name real modules, scripts, subcommands and flags, and the training and planning commands'
configs and overrides load; every shipped config loads; and no tracked file speaks of work history
(tracker numbers, who worked on what and when). Each checker is also run on planted mistakes, so each
can fail."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from openclaw_jax.config import load_experiment_config
from openclaw_jax.configlib import ConfigError

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200

# Pages, files and script subcommands that other parts of the product add. Each entry must go once it
# exists (test_pending_entries_are_still_missing says which), so the list cannot hide a broken link.
PENDING: frozenset[str] = frozenset()
# Flags a script passes on to another program, checked by hand against that program's --help.
FOREIGN_FLAGS = frozenset({("scripts/sglang_cpu.sh", "--weight-version")})   # SGLang's launch_server
BUILTIN_FLAGS = frozenset({"--help"})

# Folders a path in the docs may start with: from the repository root, or (the package's subpackages,
# as the docs write them) from openclaw_jax/.
ROOT_DIRS = ("configs", "scripts", "bench", "tests", "launch", "openclaw_jax", "integrations", "notebooks", "docs")
PACKAGE_DIRS = ("models", "envs", "trainer", "inference", "gateway", "losses", "ops", "wire", "samples", "pool",
                "http", "parallel", "eval", "notebook")

# Work history, not product: tracker numbers and the working sessions that made the code. ("session"
# alone is a product word: OpenClaw sessions, X-Session-Id, a person's session.)
HISTORY_PATTERNS = (
    re.compile(r"\bissues? ?#\d+", re.I),
    re.compile(r"\bissue \d+", re.I),
    re.compile(r"\b(?:last|earlier|previous) session\b", re.I),
    re.compile(r"\bthis session's (?:machine|work|runs?|suite|measurements?|changes)\b", re.I),
    re.compile(r"\b(?:before|new|measured|made|ran|tried) (?:in |during )?this session\b", re.I),
    re.compile(r"\bsessions? of work\b", re.I),
)
# Recorded output of the real OpenClaw (its own prompt speaks of "this session"), not our text.
HISTORY_EXEMPT = ("tests/fixtures/openclaw/",)

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`]+)`", re.S)
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
PATH_TOKEN = re.compile(r"(?<![\w./<-])((?:%s)/[\w./-]*)" % "|".join(ROOT_DIRS + PACKAGE_DIRS))


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _pending(rel: str) -> bool:
    return rel in PENDING


def _has_subcommand(source: str, name: str) -> bool:
    """A `case` arm of the script: `name)` or one of `a|name|b)`."""
    return re.search(rf"(^|[\s|(]){re.escape(name)}(\|[\w-]+)*\)", source, re.M) is not None


def _exists(entry: str) -> bool:
    """A PENDING entry: a path, or `script subcommand`."""
    path, _, sub = entry.partition(" ")
    if not (ROOT / path).exists():
        return False
    return not sub or _has_subcommand((ROOT / path).read_text(), sub)


# ----------------------------------------------------------------------------- markdown structure


def split_code(text: str) -> tuple[str, list[str]]:
    """(prose with fenced blocks blanked, the fenced blocks' bodies)."""
    blocks = [m.group(1) for m in FENCE.finditer(text)]
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return prose, blocks


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r"`|\*\*?|__?", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    return _anchors_of(path.read_text())


def _anchors_of(text: str) -> frozenset[str]:
    prose, _ = split_code(text)
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(prose):
        slug = github_slug(match.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def link_problems(path: Path, text: str) -> list[str]:
    prose, _ = split_code(text)
    prose = INLINE_CODE.sub("", prose)
    problems = []
    for _, target in LINK.findall(prose):
        if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        if not file_part:                          # a heading of this page
            if anchor not in _anchors_of(text):
                problems.append(f"{_rel(path)}: link {target!r}: no such heading on this page")
            continue
        dest = (path.parent / file_part).resolve()
        try:
            rel = _rel(dest)
        except ValueError:
            problems.append(f"{_rel(path)}: link {target!r} leaves the repository")
            continue
        if not dest.exists():
            if not _pending(rel):
                problems.append(f"{_rel(path)}: link {target!r}: {rel} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{_rel(path)}: link {target!r}: no heading '#{anchor}' in {rel} "
                            f"(headings: {sorted(anchors(dest))})")
    return problems


# ----------------------------------------------------------------------------- paths and commands


def code_texts(text: str) -> list[str]:
    """Every fenced block (continuation lines joined) and inline code span (line breaks as spaces)."""
    prose, blocks = split_code(text)
    out = [b.replace("\\\n", " ") for b in blocks]
    out += [span.replace("\n", " ") for span in INLINE_CODE.findall(prose)]
    return out


def _path_exists(token: str) -> bool:
    token = token.rstrip(".,:;)")
    candidates = [ROOT / token]
    if token.split("/", 1)[0] in PACKAGE_DIRS:
        candidates.append(ROOT / "openclaw_jax" / token)
    for base in candidates:
        if base.exists():
            return True
        head, _, name = str(base).rpartition("/")       # `models/random_vl.write_vl_on_text_model`
        if "." in name and Path(f"{head}/{name.split('.', 1)[0]}.py").exists():
            return True
    return False


def path_problems(path: Path, text: str) -> list[str]:
    problems = []
    for code in code_texts(text):
        for token in PATH_TOKEN.findall(code):
            clean = token.rstrip(".,:;)")
            if any(c in token for c in "<*{$") or clean.endswith("...") or _pending(clean):
                continue
            if clean.split("/", 1)[0] in PACKAGE_DIRS and ".py" not in clean and not clean.endswith("/"):
                continue    # `eval/accuracy`, `samples/dropped_temperature`: TensorBoard tags, not files
            if not _path_exists(clean):
                problems.append(f"{_rel(path)}: `{clean}` does not exist")
    return problems


def commands(text: str) -> list[str]:
    """The command lines in code: one per line of a block, `&&`/`;` splitting them, comments dropped."""
    out = []
    for code in code_texts(text):
        for line in code.split("\n"):
            line = re.sub(r"(^|\s)#.*$", "", line)
            for part in re.split(r"&&|;|\|", line):
                if part.strip():
                    out.append(part.strip())
    return out


def _module_file(module: str) -> Path | None:
    base = ROOT / Path(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__main__.py"):
        if cand.is_file():
            return cand
    return None


@functools.lru_cache(maxsize=None)
def _package_source() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "openclaw_jax").rglob("*.py")))


def _flags(args: list[str]) -> list[str]:
    return [f for f in (a.split("=", 1)[0] for a in args if re.match(r"--[a-z][\w-]*", a)) if f not in BUILTIN_FLAGS]


def _defines_flag(source: str, flag: str) -> bool:
    return f'"{flag}"' in source or f"'{flag}'" in source or re.search(rf"(^|[\s|(]){re.escape(flag)}[\s)|=]", source,
                                                                       re.M) is not None


PLACEHOLDER = "PLACEHOLDER"


def _tokens(cmd: str) -> list[str]:
    """Shell words, with the docs' placeholders filled: <S> a seed, <L> a length, any other <...> the
    word PLACEHOLDER; `[optional]` brackets dropped (list values such as `key=[a]` kept)."""
    cmd = cmd.replace("<S>", "0").replace("<L>", "2048")
    cmd = re.sub(r"<[^>]*>", PLACEHOLDER, cmd)
    cmd = re.sub(r"(?<![=\w])\[([^\]]*)\]", r"\1", cmd)
    try:
        return shlex.split(cmd)
    except ValueError:
        return cmd.split()


def command_problems(path: Path, text: str) -> list[str]:
    problems = []
    where = _rel(path)
    for cmd in commands(text):
        toks = _tokens(cmd)
        if "-m" in toks and toks.index("-m") + 1 < len(toks) and toks[toks.index("-m") + 1].startswith("openclaw_jax"):
            i = toks.index("-m")
            module, args = toks[i + 1], toks[i + 2:]
            if _module_file(module) is None:
                problems.append(f"{where}: `python -m {module}`: no such module")
                continue
            for flag in _flags(args):
                if not _defines_flag(_package_source(), flag):
                    problems.append(f"{where}: `python -m {module}` has no flag {flag}")
            continue
        for i, tok in enumerate(toks):
            script = tok if tok.startswith(("scripts/", "bench/", "launch/")) else None
            if script is None or not re.search(r"\.(py|sh)$", script):
                continue
            file = ROOT / script
            if _pending(script):
                break
            if not file.is_file():
                problems.append(f"{where}: `{script}` does not exist")
                break
            source = file.read_text()
            if script.startswith("launch/"):
                source += (ROOT / "launch" / "common.sh").read_text()
            if script.startswith("bench/"):       # the flags every benchmark shares (--no-sglang, --dtype, ...)
                source += (ROOT / "bench" / "references.py").read_text()
            if script.endswith(".py") or "-m openclaw_jax." in source:   # a script that hands its flags to our CLIs
                source += _package_source()
            rest = toks[i + 1:]
            if script.endswith(".sh") and rest and re.fullmatch(r"[a-z][\w-]*", rest[0]) and script != "scripts/test.sh":
                if not _has_subcommand(source, rest[0]):
                    if _pending(f"{script} {rest[0]}"):
                        break
                    problems.append(f"{where}: `{script}` has no subcommand {rest[0]!r}")
            if script != "scripts/test.sh":      # its arguments go to pytest
                for flag in _flags(rest):
                    if (script, flag) not in FOREIGN_FLAGS and not _defines_flag(source, flag):
                        problems.append(f"{where}: `{script}` has no flag {flag}")
            break
    return problems


def config_problems(path: Path, text: str) -> list[str]:
    """`python -m openclaw_jax.train|plan --config ... key=value`: the configs exist and the overrides load."""
    problems = []
    for cmd in commands(text):
        if not re.search(r"-m openclaw_jax\.(train|plan)\b", cmd) or "--config" not in cmd:
            continue
        toks = _tokens(cmd)
        start = toks.index("-m") + 2
        files, overrides = [], []
        i = start
        while i < len(toks):
            tok = toks[i]
            if tok == "--config" and i + 1 < len(toks):
                files.append(toks[i + 1])
                i += 2
                continue
            if re.fullmatch(r"[a-z_][\w.]*=.*", tok) and tok.split("=", 1)[1] != PLACEHOLDER:
                overrides.append(tok)               # (`loss.name=<M>`: any value, nothing to check)
            i += 1
        if any(_pending(f) or PLACEHOLDER in f for f in files):
            continue
        try:
            load_experiment_config([str(ROOT / f) for f in files], overrides)
        except (ConfigError, ValueError) as err:
            problems.append(f"{_rel(path)}: `{cmd}`: {err}")
    return problems


def history_problems(rel: str, text: str) -> list[str]:
    if rel.startswith(HISTORY_EXEMPT):
        return []
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        for pattern in HISTORY_PATTERNS:
            m = pattern.search(line)
            if m:
                problems.append(f"{rel}:{n}: {m.group(0)!r} (speak of the product, not of the work on it)")
    return problems


# ----------------------------------------------------------------------------- the repository's docs


def test_readme_is_a_short_front_page():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it <= {README_MAX_LINES} and move detail to docs/"
    text = (ROOT / "README.md").read_text()
    for must in ("docs/design.md", "bash scripts/test.sh", "configs/cpu_demo.yaml", "docs/results/"):
        assert must in text, f"README.md no longer mentions {must}"


@pytest.mark.parametrize("check", [link_problems, path_problems, command_problems, config_problems],
                         ids=lambda f: f.__name__)
def test_docs_hold(check):
    problems = [p for path in doc_files() for p in check(path, path.read_text())]
    assert not problems, "\n".join(problems)


def test_every_shipped_config_loads():
    problems = []
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        try:
            load_experiment_config([str(path)])
        except (ConfigError, ValueError) as err:
            problems.append(f"{_rel(path)}: {err}")
    assert not problems, "\n".join(problems)


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return [f for f in out.stdout.decode().split("\0") if f]


def test_no_tracked_file_speaks_of_work_history():
    problems = []
    for rel in _tracked_files():
        path = ROOT / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        problems += history_problems(rel, text)
    assert not problems, "\n".join(problems)


def test_pending_entries_are_still_missing():
    present = sorted(p for p in PENDING if _exists(p))
    assert not present, f"{present} exist now: remove them from PENDING in tests/repo/test_docs.py"


# ----------------------------------------------------------------------------- the checkers can fail


def test_the_checkers_find_planted_mistakes(tmp_path):
    page = ROOT / "docs" / "planted.md"    # never written: the checkers take the text
    text = "\n".join([
        "# Planted",
        "[a missing page](nowhere.md), [a missing heading](design.md#no-such-heading), "
        "[a good one](design.md#1-the-product), [here](#planted)",
        "`configs/no_such.yaml` and `trainer/no_such.py`, but `configs/cpu_demo.yaml` exists",
        "```bash",
        "python -m openclaw_jax.no_such_module --x",
        "python -m openclaw_jax.train --config configs/tiny_cpu.yaml --no-such-flag trainer.no_such_key=1",
        "python -m openclaw_jax.plan --config configs/tiny_cpu.yaml --devices 2 trainer.max_steps=-5",
        "bash scripts/openclaw.sh no-such-subcommand",
        "python bench/decode.py --no-such-bench-flag",
        "```",
    ])
    links = link_problems(page, text)
    assert any("nowhere.md" in p for p in links) and any("no-such-heading" in p for p in links), links
    assert len(links) == 2, links
    paths = path_problems(page, text)
    assert any("configs/no_such.yaml" in p for p in paths) and any("trainer/no_such.py" in p for p in paths), paths
    assert len(paths) == 2, paths
    cmds = "\n".join(command_problems(page, text))
    for bad in ("no_such_module", "--no-such-flag", "no-such-subcommand", "--no-such-bench-flag"):
        assert bad in cmds, cmds
    configs = "\n".join(config_problems(page, text))
    assert "no_such_key" in configs and "max_steps" in configs, configs
    history = history_problems("docs/x.md", "Fixed in iss" "ue 12.\nOn the last sess" "ion's machine.\nOpenClaw "
                               "ends the session; X-Session-Id names it.")
    assert len(history) == 2, history


def test_github_slugs():
    assert github_slug("3. Layout") == "3-layout"
    assert github_slug("Why: the model cannot find a bug in code it has not seen") == \
        "why-the-model-cannot-find-a-bug-in-code-it-has-not-seen"
    assert github_slug("The CPU demo's wall time") == "the-cpu-demos-wall-time"
    assert github_slug("Step layout: packing, buckets, shared prefixes") == "step-layout-packing-buckets-shared-prefixes"
