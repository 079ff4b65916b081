"""Serving each person's own adapter in a per-person live run (`trainer.personalize=per_person`,
docs/household.md, "What is served").

The JAX engine (`policy.mode: embedded` or `process`) starts with `policy.lora_slots` adapter slots at
`model.lora`'s rank and targets, reading adapters from one stable directory, `<run_dir>/adapters/<person>/`
(`engine_settings`, `server_flags`). After every per-person step, `AdapterPublisher.publish` writes the
stepped people's adapters (each into a new directory of its own under `adapters/.versions/`, then
`adapters/<person>` is switched to it, a symbolic link replaced in one rename: the engine always finds a
whole adapter, the old one or the new; the version before stays until the next switch, for a reader that
resolved it just before), asks the engine to read each one again (`POST /load_lora_adapter`, the server's thread pool:
nothing runs on the event loop) and then tells the gateway to route that person's turns to it
(`Gateway.serve_adapter`): a person whose adapter is not loaded yet is served the base model. A resumed run
publishes every restored adapter before the first turn.

SGLang workers (`policy.mode: external`, started with `--enable-lora`, docs/household.md "With SGLang
workers") load adapters by path, under names that must be new: each publish loads the person's new version
directory on every worker as `<person>#<version>` (`#` is in no person id), then routes their turns to that
name, then unloads the name it replaces. A turn is always sent to a name every worker holds. The run
directory must be visible to the workers at the same path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import jax

from openclaw_jax.pool.client import PoolClient

if TYPE_CHECKING:   # the types only: the config tree imports every section's package
    from openclaw_jax.config import ExperimentConfig
    from openclaw_jax.trainer.people import PerPersonTrainer

log = logging.getLogger(__name__)

SERVED_ADAPTERS_DIR = "adapters"   # <run_dir>/adapters/<person>/: what the engine serves
VERSIONS_DIR = ".versions"         # adapters/.versions/<publish>/<person>/: what the links point to (not a person id)


def served_adapters_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / SERVED_ADAPTERS_DIR


def adapter_slots(cfg: ExperimentConfig) -> dict[str, Any]:
    """The `EngineConfig` adapter slots of a run: none in a shared run (no adapter code runs), else
    `policy.lora_slots` slots at the people's adapters' rank and targets."""
    if cfg.trainer.personalize != "per_person":
        return {}
    return {"lora_slots": cfg.policy.lora_slots, "lora_max_rank": cfg.model.lora.rank,
            "lora_targets": tuple(cfg.model.lora.targets)}


def engine_settings(cfg: ExperimentConfig, run_dir: str | Path) -> dict[str, Any]:
    """The `EngineConfig` adapter fields of a run: `adapter_slots`, read from the run's adapter directory
    (created here)."""
    slots = adapter_slots(cfg)
    if not slots:
        return {}
    directory = served_adapters_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return {**slots, "lora_dir": str(directory)}


def server_flags(settings: dict[str, Any]) -> list[str]:
    """`engine_settings` as `python -m openclaw_jax.inference` flags (`policy.mode=process`)."""
    if not settings:
        return []
    return ["--lora-slots", str(settings["lora_slots"]), "--lora-max-rank", str(settings["lora_max_rank"]),
            "--lora-targets", ",".join(settings["lora_targets"]), "--lora-dir", settings["lora_dir"]]


class AdapterPublisher:
    """Writes the people's adapters where the engine reads them, has it load them, and routes their turns to
    them (module doc). Every process calls `publish` (the adapters are gathered); process 0 writes and loads."""

    def __init__(self, trainer: PerPersonTrainer, run_dir: str | Path, *, base_model: str,
                 policy_urls: Sequence[str], api_key: str | None, request_timeout_s: float,
                 on_served: Callable[[str, int, str], None] | None, by_path: bool = False):
        self.trainer = trainer
        self.directory = served_adapters_dir(run_dir).resolve()
        self.base_model = base_model
        self.on_served = on_served
        self.by_path = by_path   # SGLang workers: load each version by path under a new name (module doc)
        self.client = PoolClient(list(policy_urls), request_timeout_s=request_timeout_s, api_key=api_key) \
            if policy_urls and jax.process_index() == 0 else None
        self.failures = 0
        self._previous: dict[str, Path] = {}   # person -> the version their link pointed to before the last switch
        self.served_names: dict[str, str] = {}   # person -> the name the workers serve their adapter under

    def _switch(self, version: Path, people: Sequence[str]) -> None:
        """Point each person's `adapters/<person>` at their directory in `version` (one rename each), then remove
        the version their link left two switches ago (and `version` once no person's link names it)."""
        for person in people:
            link = self.directory / person
            old = Path(os.readlink(link)) if link.is_symlink() else None
            tmp = self.directory / f".{person}.link-{uuid.uuid4().hex[:8]}"
            os.symlink(Path(VERSIONS_DIR) / version.name / person, tmp)
            os.replace(tmp, link)
            stale, self._previous[person] = self._previous.get(person), old
            if stale is not None:
                shutil.rmtree(self.directory / stale, ignore_errors=True)
        self._remove_unreferenced()

    def _remove_unreferenced(self) -> None:
        """Remove the version directories no link names now or names as a person's previous version (what
        earlier runs or stale switches left)."""
        kept = {Path(os.readlink(p)).parent.name for p in self.directory.iterdir() if p.is_symlink()}
        kept |= {p.parent.name for p in self._previous.values() if p is not None}
        versions = self.directory / VERSIONS_DIR
        for version in versions.iterdir() if versions.is_dir() else ():
            if version.name not in kept:
                shutil.rmtree(version, ignore_errors=True)

    async def start(self) -> "AdapterPublisher":
        if self.client is not None:
            await self.client.start()
        return self

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def publish(self, people: Sequence[str]) -> None:
        """Serve `people`'s adapters as they are now (their files, then the engine, then the gateway)."""
        people = sorted(set(people))
        if not people:
            return
        steps = {p: self.trainer.adapters[p].steps for p in people}
        version = self.directory / VERSIONS_DIR / f"{time.time_ns()}-{uuid.uuid4().hex[:6]}"
        await asyncio.to_thread(self.trainer.export_adapters, version, base_model=self.base_model, people=people)
        if self.client is None:   # another process of the run: process 0 wrote them
            return
        await asyncio.to_thread(self._switch, version, people)
        for person in people:
            name, path = person, None
            if self.by_path:
                name, path = f"{person}#{version.name}", str(version / person)
            failed = _failures(await self.client.load_lora_adapter(name, path))
            if failed:
                self.failures += 1
                log.warning("person %r: the policy did not load their adapter (%s); their turns are served as before",
                            person, failed)
                continue
            if self.on_served is not None:
                self.on_served(person, steps[person], name)
            log.info("person %r: serving their adapter at %d steps (%s)", person, steps[person],
                     self.directory / person)
            old, self.served_names[person] = self.served_names.get(person), name
            if self.by_path and old is not None:
                failed = _failures(await self.client.unload_lora_adapter(old))
                if failed:
                    log.warning("person %r: the workers did not unload their previous adapter %r (%s); it stays "
                                "loaded until the workers evict it", person, old, failed)


def _failures(replies: dict[str, Any]) -> str:
    """The workers' replies that are not a success, as one line; "" when all succeeded."""
    return "; ".join(f"{url}: {r['error'] or r['body']}" for url, r in replies.items()
                     if r["status"] != 200 or r["error"] or (isinstance(r["body"], dict)
                                                             and r["body"].get("success") is False))
