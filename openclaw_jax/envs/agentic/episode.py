"""Episodes: a task's opening messages and tools, assistant turns from the policy pool, tool
observations from the environment, until a final answer or a limit (docs/design.md §13).

Token-exact: the opening prompt is rendered with the chat template once; afterwards every
assistant turn appends exactly the `response_ids` the pool returned (trained, loss mask 1, with
their rollout log-probs) and every observation appends the tokens the chat template renders for
the new tool messages (untrained context, loss mask 0). Nothing sampled is ever re-tokenised.

Images (a vision-language policy, `EpisodeRunner(images=...)`, and an environment whose
`observation_image` gives screenshots): the opening user message and each turn's last tool message
carry the environment's current screenshot as an image placeholder, widened to the image's token
count as the chat template's image form (`expand_image_placeholders`); `Episode.images` keeps the
PNG bytes in prompt order, the policy receives them with every turn's prompt, and the sample names
them (the store keeps their bytes).

A tool call the agent gets wrong -- unparsable `<tool_call>` JSON, an unknown tool, bad
arguments, a tool that fails, an oversized output -- becomes an error observation the agent sees;
the episode goes on. Limits: assistant turns, new tokens per turn, response tokens per episode
(assistant + observations), wall time.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from openclaw_jax.models.image_processing import ImageProcessorConfig, image_grid, image_token_count
from openclaw_jax.models.tokenizer.chat_template import expand_image_placeholders
from openclaw_jax.envs.agentic.catalog import ENVIRONMENTS
from openclaw_jax.envs.agentic.config import AgenticConfig
from openclaw_jax.envs.sandbox import SandboxLimits
from openclaw_jax.wire.images import IMAGE_PLACEHOLDER, ImageInput, image_data_url
from openclaw_jax.wire.tool_calls import has_tool_call, parse_tool_calls

log = logging.getLogger(__name__)

TOOL_FORMAT = ('Call a tool with exactly:\n<tool_call>\n{"name": "<tool>", "arguments": {...}}\n</tool_call>\n'
               'Its output comes back in the next message. When you are done, answer without a tool call.')


class NoDemonstration(ValueError):
    """`Environment.demonstration` has no scripted solution for this task (the warm-up skips it)."""


class ToolError(Exception):
    """A tool call the environment refuses or that failed; its message becomes the observation."""


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str                                  # the user's opening message
    answer: Any = None                           # what the checker compares with (environment-specific)
    data: dict[str, Any] = field(default_factory=dict)
    family: str = ""


class Environment(abc.ABC):
    """One kind of agentic task: its tools, task sets, tool execution and checker."""

    name: str = ""
    system_prompt: str = "You are a helpful assistant."
    tools: list[dict[str, Any]] = []

    @abc.abstractmethod
    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """`n` tasks of `split` ("train" or "heldout"); the two splits never share a task."""

    async def start(self, task: Task) -> Any:
        """Per-episode state (e.g. a prepared sandbox directory)."""
        return None

    @abc.abstractmethod
    async def call(self, state: Any, task: Task, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call; raise ToolError for a call the agent got wrong."""

    @abc.abstractmethod
    async def score(self, state: Any, task: Task, final_text: str) -> float:
        """The outcome reward in [0, 1] (1 = solved)."""

    async def close(self, state: Any) -> None:
        return None

    def opening_observation(self, state: Any) -> str:
        """Text about the episode's starting state added to the task's message (e.g. a GUI's
        accessibility tree); empty for most environments."""
        return ""

    def observation_image(self, state: Any) -> bytes | None:
        """The screen as it is now (PNG bytes) for an image-aware runner, or None (text observations)."""
        return None

    @abc.abstractmethod
    def demonstration(self, task: Task) -> list[str]:
        """Assistant turns that solve `task` (tool calls as text); used for the SFT warm-up. Raise
        `NoDemonstration` for a task without one (the warm-up skips it)."""

    @classmethod
    def from_config(cls, families: tuple[str, ...], sandbox: Any, **options: Any) -> "Environment":
        """The environment for the `agentic:` config's task families (empty: its defaults), sandbox
        limits (a `SandboxLimits`) and `env_options`; `make_env` calls it."""
        if options:
            raise TypeError(f"unexpected options {sorted(options)}")
        return cls()

    @staticmethod
    def check_split(split: str) -> None:
        if split not in ("train", "heldout"):
            raise ValueError(f"unknown split {split!r}; use train or heldout")

    def check_families(self, families: Sequence[str], known: Sequence[str]) -> tuple[str, ...]:
        """`families` as a tuple, refused unless it is a non-empty subset of `known`."""
        if not families or any(f not in known for f in families):
            raise ValueError(f"{self.name} families {list(families)} must be a non-empty subset of {tuple(known)}")
        return tuple(families)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


# ----------------------------------------------------------------------------- policies


@dataclass(frozen=True)
class Generation:
    response_ids: list[int]
    rollout_logprobs: list[float]
    stopped: bool                    # ended on an end-of-turn token (not cut by the token limit)
    weight_version: str | None = None


class Policy(Protocol):
    async def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float,
                       images: Sequence[bytes] = ()) -> Generation: ...


class PoolPolicy:
    """Assistant turns from a policy pool (`rollout.client.PoolClient`), with exact ids and log-probs."""

    def __init__(self, client: Any, *, top_p: float = 1.0, seed: int | None = None):
        self.client = client
        self.top_p = top_p
        self.seed = seed

    async def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float,
                       images: Sequence[bytes] = ()) -> Generation:
        params = {"max_new_tokens": int(max_new_tokens), "temperature": float(temperature), "top_p": self.top_p,
                  "top_k": -1}
        image_data = [image_data_url(ImageInput.of(png, "image/png")) for png in images] or None
        result = await self.client.generate(list(input_ids), sampling_params=params, return_logprob=True,
                                            image_data=image_data)
        stopped = result.finish_reason is not None and result.finish_reason.type == "stop"
        return Generation(list(result.response_ids), [float(x) for x in result.rollout_logprobs], stopped,
                          result.weight_version)


class ScriptedPolicy:
    """Replays fixed assistant turns (demonstrations): each is encoded and closed with the end-of-turn token."""

    def __init__(self, tokenizer: Any, turns: Sequence[str]):
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.eos = int(tokenizer.eos_token_ids[0])

    async def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float,
                       images: Sequence[bytes] = ()) -> Generation:
        text = self.turns.pop(0) if self.turns else "I am done."
        ids = list(self.tokenizer.encode(text)) + [self.eos]
        stopped = len(ids) <= max_new_tokens  # like a real policy, cut at the token budget
        ids = ids[:max_new_tokens]
        return Generation(ids, [0.0] * len(ids), stopped, None)


# ----------------------------------------------------------------------------- the episode


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 4                  # assistant turns
    max_new_tokens: int = 128           # per assistant turn
    max_response_tokens: int = 768      # assistant + observation tokens after the prompt
    max_observation_chars: int = 1024   # longer tool output is cut (and the agent is told)
    max_calls_per_turn: int = 4
    timeout_s: float = 300.0            # wall time of the whole episode

    def __post_init__(self):
        for name in ("max_turns", "max_new_tokens", "max_response_tokens", "max_observation_chars",
                     "max_calls_per_turn"):
            if getattr(self, name) <= 0:
                raise ValueError(f"episode limit {name}={getattr(self, name)} must be > 0")
        if not self.timeout_s > 0:
            raise ValueError(f"episode limit timeout_s={self.timeout_s} must be > 0")


@dataclass
class Episode:
    task: Task
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)   # [start, end) of each assistant turn
    images: list[bytes] = field(default_factory=list)             # PNGs the prompt + response show, in order
    turn_images: list[int] = field(default_factory=list)          # how many of them precede each turn
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation as text
    observations: list[str] = field(default_factory=list)         # per assistant turn ("" for the last)
    final_text: str = ""
    reward: float = 0.0
    end_reason: str = ""      # answer | max_turns | max_tokens | length | timeout | image_token
    tool_calls: int = 0
    tool_errors: int = 0
    sandbox_timeouts: int = 0
    weight_versions: list[str | None] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def success(self) -> bool:
        return self.reward >= 1.0

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def _append(self, ids: Sequence[int], trained: bool, logprobs: Sequence[float] | None = None) -> None:
        self.response_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([1 if trained else 0] * len(ids))
        self.rollout_logprobs.extend(float(x) for x in (logprobs if logprobs is not None else [0.0] * len(ids)))


def uses_native_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders `tools` itself (Qwen) or we describe them in the system prompt."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in template


def _compact_tool(fn: dict[str, Any]) -> str:
    """`name(arg: type, ...): description` -- a short description for small models' context."""
    props = fn.get("parameters", {}).get("properties", {})
    args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
    return f"{fn['name']}({args}): {fn.get('description', '')}"


def opening_messages(env: Environment, task: Task, native_tools: bool, *, image: bool = False,
                     observation: str = "") -> list[dict[str, Any]]:
    """System (with the tools when the template has no tool support) and the task; `image`: the user
    message ends with an image placeholder (the screen the task starts on)."""
    system = env.system_prompt
    if not native_tools and env.tools:
        system += ("\n\nTools:\n" + "\n".join(_compact_tool(t["function"]) for t in env.tools) + "\n" + TOOL_FORMAT)
    user = task.prompt + ("\n" + observation if observation else "") + ("\n" + IMAGE_PLACEHOLDER if image else "")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class _Attempt:
    name: str | None
    arguments: dict[str, Any] | None
    error: str | None


def parse_assistant_turn(text: str, tool_names: Sequence[str], max_calls: int) -> tuple[str, list[_Attempt]]:
    """(content, tool-call attempts); no `<tool_call>` at all = a final answer (no attempts)."""
    if not has_tool_call(text):
        return text, []
    content, calls = parse_tool_calls(text, None)
    if not calls:
        return content, [_Attempt(None, None, "malformed tool call: write <tool_call> followed by one JSON object "
                                              '{"name": ..., "arguments": {...}} and </tool_call>')]
    attempts = []
    for call in calls[:max_calls]:
        if call.name not in tool_names:
            attempts.append(_Attempt(call.name, None, f"unknown tool {call.name!r}; the tools are "
                                                       f"{', '.join(tool_names)}"))
            continue
        try:
            args = json.loads(call.arguments)
        except ValueError:
            args = None
        if not isinstance(args, dict):
            attempts.append(_Attempt(call.name, None, f"the arguments of {call.name} must be a JSON object"))
            continue
        attempts.append(_Attempt(call.name, args, None))
    if len(calls) > max_calls:
        attempts.append(_Attempt(None, None, f"too many tool calls in one turn; at most {max_calls} run"))
    return content, attempts


class EpisodeRunner:
    """Runs episodes of one environment against a policy; renders with the tokenizer's chat template."""

    def __init__(self, env: Environment, tokenizer: Any, limits: EpisodeLimits = EpisodeLimits(), *,
                 native_tools: bool | None = None, images: ImageProcessorConfig | None = None):
        """`images`: the policy reads images (a vision-language model with this image processor); the
        environment's screenshots (`Environment.observation_image`) then go into the episode."""
        self.env = env
        self.images = images
        # the image markers' ids: a sampled one would misplace the images of every later prompt
        self.image_marker_ids = set(int(i) for i in tokenizer.encode(IMAGE_PLACEHOLDER)) if images else set()
        self.tokenizer = tokenizer
        self.limits = limits
        self.native_tools = uses_native_tools(tokenizer) if native_tools is None else native_tools
        self.tool_names = [t["function"]["name"] for t in env.tools]
        self.eos_ids = {int(i) for i in tokenizer.eos_token_ids}
        self._eos_texts = sorted({tokenizer.decode([i], skip_special_tokens=False) for i in self.eos_ids} - {""})

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool,
                images: Sequence[bytes] = ()) -> str:
        """The chat template's text; each image placeholder widened to its image's token count."""
        tools = self.env.tools if self.native_tools and self.env.tools else None
        text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                                  tokenize=False)
        if self.images is None:
            return text
        return expand_image_placeholders(text, [image_token_count(image_grid(png, self.images), self.images.merge_size)
                                                for png in images])

    def _screen(self, state: Any) -> bytes | None:
        return self.env.observation_image(state) if self.images is not None else None

    def prompt_ids(self, task: Task, image: bytes | None = None, observation: str = "") -> list[int]:
        messages = opening_messages(self.env, task, self.native_tools, image=image is not None,
                                    observation=observation)
        return list(self.tokenizer.encode(self._render(messages, True, [image] if image is not None else [])))

    def observation_ids(self, history: list[dict[str, Any]], new: list[dict[str, Any]], last_token: int,
                        images: Sequence[bytes] = (), new_images: Sequence[bytes] = ()) -> list[int]:
        """Tokens that follow the last assistant turn (which ended on `last_token`) once `new` is appended
        (`images`: those `history` shows; `new_images`: those `new` adds)."""
        after = self._render(history + new, True, list(images) + list(new_images))
        if last_token in self.eos_ids:
            # The turn's tokens end on an end-of-sequence token; the observation is what `after` holds past
            # the end of that turn as the template writes it. Located from the prompt the policy answered
            # (`history` without its last turn) rather than from `history` rendered alone: some templates
            # (Qwen3) render a final assistant message differently (an empty think block) from one that
            # tool messages follow. The template closes the turn with its own end marker, which need not
            # be the token the policy stopped on (a tokenizer with both <|im_end|> and <|endoftext|>), so
            # the turn ends at the first end-of-sequence text of any kind.
            prompt = self._render(history[:-1], True, images)
            ends = [(at, len(text)) for text in self._eos_texts
                    if after.startswith(prompt) and (at := after.find(text, len(prompt))) >= 0]
            if not ends:
                raise RuntimeError("the chat template re-renders earlier messages when tool messages are appended; "
                                   "token-exact episodes need a prefix-stable template")
            at, width = min(ends)
            return list(self.tokenizer.encode(after[at + width:]))
        before = self._render(history, False, images)
        if not after.startswith(before):
            raise RuntimeError("the chat template re-renders earlier messages when tool messages are appended; "
                               "token-exact episodes need a prefix-stable template")
        return list(self.tokenizer.encode(after[len(before):]))

    def _text(self, ids: Sequence[int]) -> str:
        body = list(ids[:-1]) if ids and int(ids[-1]) in self.eos_ids else list(ids)
        return self.tokenizer.decode(body, skip_special_tokens=False)

    async def _observe(self, state: Any, task: Task, attempt: _Attempt, episode: Episode) -> str:
        if attempt.error is not None:
            episode.tool_errors += 1
            return "Error: " + attempt.error
        episode.tool_calls += 1
        try:
            out = await self.env.call(state, task, attempt.name, attempt.arguments or {})
        except ToolError as err:
            episode.tool_errors += 1
            if "timed out" in str(err):
                episode.sandbox_timeouts += 1
            return f"Error: {err}"
        except Exception as err:  # noqa: BLE001 - a broken tool is the environment's bug, not a crashed rollout
            log.exception("tool %s failed", attempt.name)
            episode.tool_errors += 1
            return f"Error: the tool failed ({type(err).__name__})"
        limit = self.limits.max_observation_chars
        if len(out) > limit:
            episode.tool_errors += 1
            out = out[:limit] + f"\n[output truncated: {len(out) - limit} more characters]"
        return out

    async def run(self, task: Task, policy: Policy, *, temperature: float) -> Episode:
        t0 = time.monotonic()
        deadline = t0 + self.limits.timeout_s
        state = await self.env.start(task)
        try:
            screen = self._screen(state)
            seen = self.env.opening_observation(state)
            history = opening_messages(self.env, task, self.native_tools, image=screen is not None, observation=seen)
            episode = Episode(task=task, prompt_ids=self.prompt_ids(task, screen, seen), messages=list(history),
                              images=[screen] if screen is not None else [])
            try:
                await asyncio.wait_for(self._turns(task, policy, temperature, state, history, episode),
                                       timeout=max(deadline - time.monotonic(), 1e-3))
            except asyncio.TimeoutError:
                episode.end_reason = "timeout"
            episode.reward = float(await self.env.score(state, task, episode.final_text))
        finally:
            await self.env.close(state)
        episode.wall_s = time.monotonic() - t0
        return episode

    async def _turns(self, task, policy, temperature, state, history, episode: Episode) -> None:
        lim = self.limits
        for turn in range(lim.max_turns):
            budget = min(lim.max_new_tokens, lim.max_response_tokens - len(episode.response_ids))
            if budget <= 0:
                episode.end_reason = "max_tokens"
                return
            episode.turn_images.append(len(episode.images))
            gen = await policy.generate(episode.prompt_ids + episode.response_ids, max_new_tokens=budget,
                                        temperature=temperature, images=list(episode.images))
            if not gen.response_ids:
                episode.end_reason = "length"
                return
            if self.image_marker_ids.intersection(int(i) for i in gen.response_ids):
                episode.end_reason = "image_token"   # not appended: the episode ends, unsolved, without a sample
                return
            start = len(episode.response_ids)
            episode._append(gen.response_ids, True, gen.rollout_logprobs)
            episode.turns.append((start, len(episode.response_ids)))
            episode.weight_versions.append(gen.weight_version)
            text = self._text(gen.response_ids)
            history.append({"role": "assistant", "content": text})
            episode.messages.append(history[-1])
            content, attempts = parse_assistant_turn(text, self.tool_names, lim.max_calls_per_turn)
            if not gen.stopped:  # cut by the token limit: no well-formed turn to act on
                episode.final_text = text
                episode.end_reason = "length"
                episode.observations.append("")
                return
            if not attempts:
                episode.final_text = content
                episode.end_reason = "answer"
                episode.observations.append("")
                return
            new = []
            for attempt in attempts:
                obs = await self._observe(state, task, attempt, episode)
                msg = {"role": "tool", "content": obs}
                if attempt.name:
                    msg["name"] = attempt.name
                new.append(msg)
            episode.observations.append("\n".join(m["content"] for m in new))
            if turn == lim.max_turns - 1:
                episode.end_reason = "max_turns"
                return
            screen = self._screen(state)
            if screen is not None:   # the screen after the turn's actions, with its last tool message
                new[-1] = {**new[-1], "content": new[-1]["content"] + "\n" + IMAGE_PLACEHOLDER}
            shown = [screen] if screen is not None else []
            obs_ids = self.observation_ids(history, new, int(gen.response_ids[-1]), episode.images, shown)
            if len(episode.response_ids) + len(obs_ids) >= lim.max_response_tokens:
                episode.end_reason = "max_tokens"
                return
            episode._append(obs_ids, False)
            episode.images.extend(shown)
            history.extend(new)
            episode.messages.extend(new)
        episode.end_reason = "max_turns"


def oldest_version(versions: Sequence[str | None]) -> str | None:
    """The oldest weight version an episode was generated with (staleness uses it)."""
    parsed = []
    for v in versions:
        try:
            parsed.append((int(str(v).split("-")[-1]), v))
        except (TypeError, ValueError):
            continue
    return min(parsed)[1] if parsed else None


def make_env(cfg: AgenticConfig) -> Environment:
    """The environment `cfg.env` names (a ValueError lists the registered ones)."""
    limits = SandboxLimits(timeout_s=cfg.sandbox_timeout_s, memory_mb=cfg.sandbox_memory_mb)
    options = dict(cfg.env_options)
    try:
        return ENVIRONMENTS.get(cfg.env).from_config(tuple(cfg.families), limits, **options)
    except TypeError as err:
        if not options:
            raise
        raise ValueError(f"agentic.env_options={options} are not options of the {cfg.env!r} environment "
                         f"({err})") from None


def episode_runner(cfg: AgenticConfig, env: Environment, tokenizer, images: Any = None) -> EpisodeRunner:
    """The runner of `env`'s episodes with the `agentic:` config's limits and tool prompt (`images`: a
    vision-language policy's `ImageProcessorConfig`)."""
    limits = EpisodeLimits(max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                           max_response_tokens=cfg.max_response_tokens, max_observation_chars=cfg.max_observation_chars,
                           timeout_s=cfg.episode_timeout_s)
    native = None if cfg.tool_prompt == "auto" else cfg.tool_prompt == "native"
    return EpisodeRunner(env, tokenizer, limits, native_tools=native, images=images)
