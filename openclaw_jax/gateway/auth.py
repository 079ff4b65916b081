"""Who sent a gateway request: the person a client key stands for, and whether it is the operator.

The gateway knows three kinds of key (docs/security.md):

* **client keys** from ``gateway.keys_file``: a YAML (or JSON) mapping ``key -> person id``; a key
  may be written as ``sha256:<hex digest of the key>`` so that the file holds no secret. Each key
  stands for its person: the sessions it opens are that person's, and every sample of them records
  the person. Several keys may map to one person.
* **the shared key** ``gateway.api_key``: one key for every client. The person is what the client
  says in the ``X-Person-Id`` header (the OpenClaw plugin's ``personId``), else ``default``; every
  holder of the shared key can claim any person id, so ownership holds between honest clients only.
* **the admin key** ``gateway.admin_key``: the operator's. It is the only key that opens admin
  routes (rollback, ...); used on a client route it acts as the person ``admin``.

With no client key (neither a keys file nor a shared key; the default on 127.0.0.1) every client
request is accepted, as the ``X-Person-Id`` person or ``default``; an admin key then guards the admin
routes alone.

Handlers call :func:`request_person` (the person, or 401/403), :func:`is_admin` and
:func:`require_admin`; the gateway's :class:`GatewayAuth` is found on the application. Keys are
compared as SHA-256 digests (a dictionary lookup of the presented key's digest: its timing tells
nothing about any stored key) and the admin and shared keys with ``hmac.compare_digest``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Mapping

from aiohttp import web

from openclaw_jax.configlib import ConfigError, load_yaml
from openclaw_jax.gateway.protocol import GatewayHTTPError
from openclaw_jax.http.http_guard import bearer_token
from openclaw_jax.samples.person import DEFAULT_PERSON, check_person_id

logger = logging.getLogger(__name__)

PERSON_HEADER = "X-Person-Id"
ADMIN_PERSON = "admin"
HASHED_PREFIX = "sha256:"
MIN_KEY_CHARS = 16
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

# Where the gateway puts its GatewayAuth on the aiohttp application, and where a request's caller is kept.
AUTH_KEY = web.AppKey("openclaw.gateway_auth", object)
CALLER_KEY = web.RequestKey("openclaw.caller", object)


@dataclass(frozen=True)
class Caller:
    """Who sent a request: ``person`` (the session owner and the samples' person) and whether it is the
    operator (``admin``); ``authenticated``: a configured key was checked (False on an open gateway)."""

    person: str
    admin: bool = False
    authenticated: bool = False


def key_digest(key: bytes | str) -> str:
    """The hex SHA-256 of a key (what a keys file may hold instead of the key: ``sha256:<digest>``)."""
    return hashlib.sha256(key.encode("utf-8") if isinstance(key, str) else key).hexdigest()


def load_keys_file(path: str) -> dict[str, str]:
    """``{sha256 hex of the key: person id}`` from a keys file (see the module docstring)."""
    if not os.path.isfile(path):
        raise ConfigError(f"gateway.keys_file={path!r} does not exist; write a YAML mapping 'key: person id' there")
    data = load_yaml(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"gateway.keys_file={path!r} must be a non-empty mapping 'key: person id' (a key may be "
                          "written 'sha256:<hex digest>')")
    digests: dict[str, str] = {}
    plain = 0
    for i, (key, person) in enumerate(data.items()):
        where = f"gateway.keys_file={path!r}, entry {i + 1}"
        try:
            check_person_id(person, f"{where}: the person")
        except ValueError as err:
            raise ConfigError(str(err)) from None
        key = str(key)
        if key.startswith(HASHED_PREFIX):
            digest = key[len(HASHED_PREFIX):].lower()
            if not _SHA256_HEX.fullmatch(digest):
                raise ConfigError(f"{where}: {HASHED_PREFIX}... must be followed by 64 hex digits (the SHA-256 of "
                                  "the key, e.g. from `printf %s KEY | sha256sum`)")
        else:
            if len(key) < MIN_KEY_CHARS:
                raise ConfigError(f"{where}: the key of person {person!r} has {len(key)} characters; use at least "
                                  f"{MIN_KEY_CHARS} random ones (e.g. `python -c 'import secrets; "
                                  "print(secrets.token_urlsafe(32))'`)")
            digest, plain = key_digest(key), plain + 1
        if digests.get(digest, person) != person:
            raise ConfigError(f"{where}: the same key is given to {digests[digest]!r} and {person!r}")
        digests[digest] = person
    if plain and os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("gateway.keys_file %s holds %d key(s) in plain text and is readable by other users; "
                       "chmod 600 it or write the keys as sha256:<digest>", path, plain)
    return digests


def _unauthorized() -> GatewayHTTPError:
    return GatewayHTTPError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>'",
                            code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class GatewayAuth:
    """The gateway's keys (see the module docstring); ``caller(headers)`` says who sent a request."""

    def __init__(self, *, api_key: str | None = None, keys_file: str = "", admin_key: str | None = None) -> None:
        self._shared = api_key.encode("utf-8") if api_key else None
        self._admin = admin_key.encode("utf-8") if admin_key else None
        self._people = load_keys_file(keys_file) if keys_file else {}
        if self._admin is not None and key_digest(self._admin) in self._people:
            raise ConfigError("gateway.admin_key is also a client key in gateway.keys_file; give the operator a key "
                              "of its own")

    @classmethod
    def from_config(cls, cfg: Any) -> "GatewayAuth":
        return cls(api_key=cfg.api_key, keys_file=cfg.keys_file, admin_key=cfg.admin_key)

    @property
    def open(self) -> bool:
        """No key is configured: every request is accepted (and none is an admin's)."""
        return self._shared is None and self._admin is None and not self._people

    @property
    def clients_open(self) -> bool:
        """No client key (shared or a person's) is configured: the client routes accept every request, as
        its ``X-Person-Id`` person or ``default``; an admin key alone guards the admin routes only."""
        return self._shared is None and not self._people

    @property
    def people(self) -> frozenset[str]:
        return frozenset(self._people.values())

    def valid_key(self, key: bytes) -> bool:
        """Whether ``key`` is one of the configured keys (the admin's, a person's or the shared one)."""
        if self._admin is not None and hmac.compare_digest(key, self._admin):
            return True
        if key and key_digest(key) in self._people:
            return True
        return self._shared is not None and hmac.compare_digest(key, self._shared)

    def browser_secret(self) -> bytes | None:
        """What a browser's sign-in cookie is signed with (None while the client routes are open: no sign-in
        then): derived from every configured key, so that changing any of them signs every browser out."""
        if self.clients_open:
            return None
        h = hashlib.sha256(b"openclaw_jax browser sign-in v1")
        for part in (self._admin or b"", self._shared or b"", *(d.encode() for d in sorted(self._people))):
            h.update(hashlib.sha256(part).digest())
        return h.digest()

    def _claimed_person(self, headers: Mapping[str, str], fallback: str | None) -> str | None:
        claimed = headers.get(PERSON_HEADER)
        if claimed is None:
            return fallback
        try:
            return check_person_id(claimed.strip(), f"header {PERSON_HEADER}")
        except ValueError as err:
            raise GatewayHTTPError(400, str(err), param=PERSON_HEADER) from None

    def caller(self, headers: Mapping[str, str]) -> Caller:
        """Who sent a request with these headers; GatewayHTTPError 401 (no valid key), 403 (a client key
        with an ``X-Person-Id`` of another person) or 400 (a malformed person id)."""
        token = bearer_token(headers)
        if self._admin is not None and hmac.compare_digest(token, self._admin):
            return Caller(self._claimed_person(headers, ADMIN_PERSON), admin=True, authenticated=True)
        if token and self._people:
            person = self._people.get(key_digest(token))
            if person is not None:
                claimed = self._claimed_person(headers, person)
                if claimed != person:
                    raise GatewayHTTPError(403, f"this key belongs to person {person!r}, but header {PERSON_HEADER} "
                                                f"names {claimed!r}; remove the header (or send the person's own id)",
                                           param=PERSON_HEADER)
                return Caller(person, authenticated=True)
        if self._shared is not None and hmac.compare_digest(token, self._shared):
            return Caller(self._claimed_person(headers, DEFAULT_PERSON), authenticated=True)
        if self.clients_open:
            return Caller(self._claimed_person(headers, DEFAULT_PERSON))
        raise _unauthorized()


def _auth_of(request: web.Request) -> GatewayAuth:
    auth = request.config_dict.get(AUTH_KEY)
    if not isinstance(auth, GatewayAuth):
        raise RuntimeError("the application has no GatewayAuth (app[openclaw_jax.gateway.auth.AUTH_KEY])")
    return auth


def request_caller(request: web.Request) -> Caller:
    """The request's :class:`Caller` (checked once per request); raises GatewayHTTPError 401/403/400."""
    caller = request.get(CALLER_KEY)
    if caller is None:
        caller = _auth_of(request).caller(request.headers)
        request[CALLER_KEY] = caller
    return caller


def request_person(request: web.Request) -> str:
    """The person who sent ``request`` (raises 401 when a key is required and missing or wrong)."""
    return request_caller(request).person


def is_admin(request: web.Request) -> bool:
    """Whether ``request`` carries the admin key (False, not an error, for any other valid request)."""
    return request_caller(request).admin


def require_admin(request: web.Request) -> Caller:
    """The caller, if it holds the admin key; else GatewayHTTPError 401 (no valid key) or 403."""
    caller = request_caller(request)
    if not caller.admin:
        if _auth_of(request)._admin is None:
            raise GatewayHTTPError(403, "this route needs the admin key, and the gateway has none: set "
                                        "gateway.admin_key (or OPENCLAW_GATEWAY_ADMIN_KEY) and restart it",
                                   code="admin_key_required")
        raise GatewayHTTPError(403, "this route needs the admin key (gateway.admin_key), not a client key",
                               code="admin_key_required")
    return caller
