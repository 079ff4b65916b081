"""How a per-person run switches a person's served adapter (runs/person_adapters.py): `adapters/<person>` is a
link replaced in one rename, so it always names a whole adapter; the version before stays until the next
switch; nothing else is kept."""

from __future__ import annotations

import os

from openclaw_jax.runs.person_adapters import VERSIONS_DIR, AdapterPublisher


def _version(directory, name, people):
    version = directory / VERSIONS_DIR / name
    for person in people:
        (version / person).mkdir(parents=True)
        (version / person / "adapter_config.json").write_text(f'{{"v": "{name}"}}')
    return version


def test_switching_keeps_the_served_and_the_previous_version_only(tmp_path):
    directory = tmp_path / "adapters"
    _version(directory, "left-by-an-earlier-run", ["alice"])
    publisher = AdapterPublisher(None, tmp_path, base_model="m", policy_urls=(), api_key=None, request_timeout_s=1,
                                 on_served=None)
    names = ["v1", "v2", "v3"]
    for name in names:
        publisher._switch(_version(directory, name, ["alice", "bob"] if name == "v1" else ["alice"]),
                          ["alice", "bob"] if name == "v1" else ["alice"])
        assert (directory / "alice" / "adapter_config.json").read_text() == f'{{"v": "{name}"}}'
        assert os.readlink(directory / "alice") == os.path.join(VERSIONS_DIR, name, "alice")
    assert (directory / "bob" / "adapter_config.json").read_text() == '{"v": "v1"}'   # untouched by alice's
    # alice's v1 went at the switch to v3; v1 stays for bob; v2 is alice's previous one; the earlier run's is gone
    assert sorted(p.name for p in (directory / VERSIONS_DIR).iterdir()) == ["v1", "v2", "v3"]
    assert sorted(p.name for p in (directory / VERSIONS_DIR / "v1").iterdir()) == ["bob"]
    assert sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) == ["alice", "bob"]
