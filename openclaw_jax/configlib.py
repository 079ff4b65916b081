"""Typed configuration machinery: frozen dataclasses from YAML, gin and dotted overrides.

Every config in the project is a tree of frozen dataclasses with defaults. This module turns
plain data (YAML mappings, gin bindings, `key=value` strings) into such a tree, checking each
value against the field's annotation. Unknown keys and bad values fail at start-up with a
message that names the dotted key, the value and what is allowed; a key a config class lists in
its `RENAMED_KEYS` class attribute (old name -> where it went) fails naming the new key.

Front ends, applied in this order (later wins):
  1. YAML file(s)            `trainer: {max_steps: 10}`
  2. gin files / bindings    `TrainerConfig.max_steps = 10` or `trainer.max_steps = 10`
  3. dotted overrides        `trainer.max_steps=10`
"""

from __future__ import annotations

import dataclasses
import enum
import os
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration key or value is invalid. The message names key, value and what is allowed."""


def require(cond: bool, message: str) -> None:
    """Raise `ConfigError(message)` unless `cond`: the config sections' `__post_init__` checks."""
    if not cond:
        raise ConfigError(message)


# ----------------------------------------------------------------------------- type checking


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return f"a mapping for {tp.__name__}"
    if origin in (tuple, list):
        args = typing.get_args(tp)
        inner = _type_name(args[0]) if args else "any"
        return f"a list of {inner}"
    if origin in (dict, Mapping):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against annotation `tp`, converting where the meaning is unambiguous."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        if value in args and not (isinstance(value, bool) and not any(isinstance(a, bool) for a in args)):
            return value
        raise ConfigError(f"{key}={value!r} is not allowed; allowed: {', '.join(repr(a) for a in args)}")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        if len(errors) == 1:   # `X | None`: what was wrong with the X (e.g. a field of a section)
            raise ConfigError(errors[0])
        raise ConfigError(f"{key}={value!r} is not valid; expected {_type_name(tp)}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r} must be a mapping of {tp.__name__} fields")
        return from_dict(tp, value, prefix=key)
    if origin in (tuple, list):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ConfigError(f"{key}={value!r} must be a list ({_type_name(tp)})")
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if origin is tuple and args:
            if len(value) != len(args):
                raise ConfigError(f"{key}={value!r} must have exactly {len(args)} items")
            return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r} must be a mapping")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r} must be true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}={value!r} must be an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:  # YAML 1.1 reads `1e-5` as a string.
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}={value!r} must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}={value!r} must be a string")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r} is not allowed; allowed: {[m.value for m in tp]}") from None
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise ConfigError(f"{key}={value!r} must be {_type_name(tp)}")
    return value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type[T], data: Mapping[str, Any] | None, *, prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and checking every value."""
    data = dict(data or {})
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    where = f"{prefix}." if prefix else ""
    renamed = getattr(cls, "RENAMED_KEYS", {})
    for name in unknown:
        if name in renamed:
            raise ConfigError(f"config key {where}{name} (value {data[name]!r}) is gone: {renamed[name]}")
    if unknown:
        raise ConfigError(
            f"unknown config key {where}{unknown[0]} (value {data[unknown[0]]!r}); "
            f"allowed keys{' under ' + prefix if prefix else ''}: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        where = f" in {prefix}" if prefix else ""
        raise ConfigError(f"invalid {cls.__name__}{where}: {err}") from err


def to_dict(config: Any) -> Any:
    """Plain-data (YAML-safe) view of a config tree."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, (list, tuple)):
        return [to_dict(v) for v in config]
    if isinstance(config, Mapping):
        return {k: to_dict(v) for k, v in config.items()}
    if isinstance(config, enum.Enum):
        return config.value
    return config


# ----------------------------------------------------------------------------- merging plain data


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"override key {dotted!r} is malformed; write it as section.key=value")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _deep_merge(base: dict, update: Mapping) -> dict:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", value); the value is read as YAML (numbers, bools, lists, null)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_yaml(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level, got {type(data).__name__}")
    includes = data.pop("base", None)
    if includes:
        merged: dict = {}
        for inc in [includes] if isinstance(includes, str) else includes:
            merged = _deep_merge(merged, load_yaml(path.parent / inc))
        data = _deep_merge(merged, data)
    return data


# ----------------------------------------------------------------------------- gin front end


def _class_paths(cls: type, prefix: str = "") -> dict[str, list[str]]:
    """Map each dataclass name in the tree (and each dotted path) to the dotted paths it occupies."""
    out: dict[str, list[str]] = {}
    out.setdefault(cls.__name__, []).append(prefix)
    for name, tp in _hints(cls).items():
        candidates = [tp] + [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        for sub in candidates:
            if dataclasses.is_dataclass(sub):
                path = f"{prefix}.{name}" if prefix else name
                for k, v in _class_paths(sub, path).items():
                    out.setdefault(k, []).extend(v)
    return out


def parse_gin(cls: type, text: str, *, source: str = "<gin>") -> dict:
    """Read gin bindings onto the dataclass tree of `cls`.

    `ClassName.field = value` binds the field of that dataclass wherever it sits in the tree;
    `section.sub.field = value` binds by dotted path. Values are Python literals as gin reads them.
    """
    from gin import config_parser

    class _Delegate(config_parser.ParserDelegate):
        def configurable_reference(self, scoped_configurable_name, evaluate):
            raise ConfigError(f"{source}: gin references (@{scoped_configurable_name}) are not supported; bind literals")

        def macro(self, macro_name):
            raise ConfigError(f"{source}: gin macros (%{macro_name}) are not supported; bind literals")

    paths = _class_paths(cls)
    tree: dict = {}
    try:
        statements = list(config_parser.ConfigParser(text, _Delegate()))
    except SyntaxError as err:
        raise ConfigError(f"{source}: gin syntax error: {err}") from err
    for stmt in statements:
        if not isinstance(stmt, config_parser.BindingStatement):
            raise ConfigError(f"{source}: only bindings `Selector.param = value` are supported, got {stmt!r}")
        if stmt.scope:
            raise ConfigError(f"{source}: gin scopes ({stmt.scope}/...) are not supported")
        selector = stmt.selector
        if selector in paths:
            targets = paths[selector]
        elif selector == cls.__name__:
            targets = [""]
        else:
            targets = [selector]
        for target in targets:
            dotted = f"{target}.{stmt.arg_name}" if target else stmt.arg_name
            _set_dotted(tree, dotted, stmt.value)
    return tree


# ----------------------------------------------------------------------------- entry point


def load_config(
    cls: type[T],
    *,
    yaml_files: Iterable[str | os.PathLike] = (),
    gin_files: Iterable[str | os.PathLike] = (),
    gin_bindings: Iterable[str] = (),
    overrides: Iterable[str] = (),
    base: Mapping[str, Any] | None = None,
) -> T:
    """Build `cls` from YAML, then gin, then dotted overrides (later wins)."""
    data: dict = dict(base or {})
    for path in yaml_files:
        data = _deep_merge(data, load_yaml(path))
    for path in gin_files:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"gin file {str(p)!r} does not exist")
        data = _deep_merge(data, parse_gin(cls, p.read_text(), source=str(p)))
    if gin_bindings:
        data = _deep_merge(data, parse_gin(cls, "\n".join(gin_bindings), source="--gin"))
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(data, key, value)
    return from_dict(cls, data)


def dump_yaml(config: Any) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)
