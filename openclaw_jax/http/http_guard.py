"""Hardening shared by the two aiohttp servers (the inference server and the gateway).

* :class:`GuardConfig` — body size cap, body read timeout, JSON depth, header read timeout,
  idle keep-alive timeout and connection cap, validated with the offending key named.
* :func:`read_json` — reads a body under the cap and the timeout (413 before reading when
  Content-Length is too large, 415 for a content coding we do not decode, 400 for a body that
  does not decode, e.g. ``Content-Encoding: gzip`` on bytes that are not gzip), then decodes it
  with :mod:`openclaw_jax.wire.json_safe` (a large body on a worker thread).
* :func:`error_boundary` — the outermost middleware: :class:`RequestRejected`, aiohttp's own
  4xx and undecodable payloads become a 4xx JSON body in the server's own shape; anything else
  is our bug: logged with its traceback and a trace id, answered 500 JSON with that trace id.
* :func:`bearer_matches` — constant-time bearer-key check that copes with non-UTF-8 headers;
  :func:`is_loopback_host` — whether a bind address is reachable from this machine only.
* :class:`GuardedSite` — a listening site whose connections are capped (beyond the cap a
  connection gets a 503 and is closed) and must deliver complete request headers within
  ``header_timeout_s`` of connecting or of sending the first byte of a later request (else a
  408 and close); both are logged (rate-limited) and counted in :class:`GuardStats`.

Only aiohttp and the standard library are imported: both servers import this module, it
imports neither of them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hmac
import json
import logging
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from openclaw_jax.counters import counters
from openclaw_jax.wire import json_safe
from openclaw_jax.http.offload import run_heavy

logger = logging.getLogger(__name__)

# Content codings aiohttp decodes for us; anything else is answered 415.
DECODED_CODINGS = frozenset({"identity", "gzip", "x-gzip", "deflate"})
# Bodies larger than this are JSON-decoded, and then parsed, on a worker thread.
OFFLOAD_BYTES = 256 << 10
# Where read_json leaves the body size on the request (aiohttp requests are mappings for this).
BODY_BYTES_KEY: Any = (web.RequestKey("openclaw.body_bytes", int) if hasattr(web, "RequestKey")
                       else "openclaw.body_bytes")


@dataclass(frozen=True)
class GuardConfig:
    """Limits on what one client may make a server do. ``prefix`` names the keys in errors."""

    max_body_bytes: int = 16 << 20        # larger bodies: 413 (before reading when Content-Length says so)
    body_timeout_s: float = 60.0          # the whole body must arrive within this (else 408)
    max_json_depth: int = 64              # deeper JSON nesting: 400
    header_timeout_s: float = 10.0        # complete request headers within this of connect / first byte
    keepalive_timeout_s: float = 75.0     # idle keep-alive connections are closed after this
    max_connections: int = 1024           # open connections beyond this get 503 and are closed
    # How errors name the keys: "gateway" -> "gateway.max_body_bytes"; "--" -> "--max-body-bytes" (CLI flags).
    prefix: str = "server"

    def key(self, name: str) -> str:
        if self.prefix == "--":
            return "--" + name.removesuffix("_s").replace("_", "-")
        return f"{self.prefix}.{name}"

    def __post_init__(self) -> None:
        checks = (("max_body_bytes", self.max_body_bytes >= 1024, ">= 1024"),
                  ("body_timeout_s", self.body_timeout_s > 0, "> 0"),
                  ("max_json_depth", self.max_json_depth >= 4, ">= 4 (requests nest objects in lists)"),
                  ("header_timeout_s", self.header_timeout_s > 0, "> 0"),
                  ("keepalive_timeout_s", self.keepalive_timeout_s > 0, "> 0"),
                  ("max_connections", self.max_connections >= 1, ">= 1"))
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{self.key(name)}={getattr(self, name)!r} must be {rule}")

    def runner_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``web.AppRunner`` (passed on to aiohttp's request handlers)."""
        return {"keepalive_timeout": self.keepalive_timeout_s}

    def replace(self, **changes: Any) -> "GuardConfig":
        return dataclasses.replace(self, **changes)


def add_cli_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The GuardConfig fields as command-line flags (``--max-body-bytes``, ``--header-timeout``, ...)."""
    d = GuardConfig()
    group = parser.add_argument_group("request limits (larger or slower requests get a 4xx JSON error)")
    group.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body (413)")
    group.add_argument("--max-json-depth", type=int, default=d.max_json_depth, help="deepest JSON nesting (400)")
    group.add_argument("--body-timeout", type=float, default=d.body_timeout_s,
                       help="seconds for the whole body to arrive (408)")
    group.add_argument("--header-timeout", type=float, default=d.header_timeout_s,
                       help="seconds for complete request headers after connecting or a request's first byte "
                            "(408, then the connection is closed)")
    group.add_argument("--keepalive-timeout", type=float, default=d.keepalive_timeout_s,
                       help="idle keep-alive connections are closed after this many seconds")
    group.add_argument("--max-connections", type=int, default=d.max_connections,
                       help="open connections beyond this are answered 503 and closed")
    return group


def config_from_cli(args: argparse.Namespace) -> GuardConfig:
    """GuardConfig from the flags of :func:`add_cli_arguments` (errors name the flags)."""
    return GuardConfig(max_body_bytes=args.max_body_bytes, body_timeout_s=args.body_timeout,
                       max_json_depth=args.max_json_depth, header_timeout_s=args.header_timeout,
                       keepalive_timeout_s=args.keepalive_timeout, max_connections=args.max_connections, prefix="--")


class RequestRejected(Exception):
    """A request answered with a 4xx JSON error; ``close`` also ends the connection."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 headers: Mapping[str, str] | None = None, close: bool = False, undecodable: bool = False) -> None:
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.param = param
        self.headers = dict(headers or {})
        self.close = close
        self.undecodable = undecodable


# ----------------------------------------------------------------------------- bodies
async def read_body(request: web.BaseRequest, cfg: GuardConfig) -> bytearray:
    """The request body (decoded from gzip/deflate by aiohttp) under the size cap and timeout."""
    limit = cfg.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        raise RequestRejected(413, f"the request body ({length} bytes) exceeds the limit of {limit} bytes "
                                   f"({cfg.key('max_body_bytes')})", close=True)
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding and coding not in DECODED_CODINGS:
        raise RequestRejected(415, f"Content-Encoding {coding[:40]!r} is not supported; send the body as is or "
                                   f"with one of {sorted(DECODED_CODINGS)}", close=True)
    body = bytearray()
    try:
        async with asyncio.timeout(cfg.body_timeout_s):
            async for chunk in request.content.iter_any():
                if len(body) + len(chunk) > limit:
                    raise RequestRejected(413, f"the request body exceeds the limit of {limit} bytes "
                                               f"({cfg.key('max_body_bytes')})", close=True)
                body += chunk
    except TimeoutError:
        raise RequestRejected(408, f"the request body did not arrive within {cfg.body_timeout_s:g} s "
                                   f"({cfg.key('body_timeout_s')})", close=True) from None
    except (RequestPayloadError, HttpProcessingError) as err:
        raise _undecodable(request, err) from None
    return body


def _undecodable(request: web.BaseRequest, err: BaseException) -> RequestRejected:
    reason = getattr(err, "message", None) or str(err)
    coding = request.headers.get("Content-Encoding")
    where = f" (Content-Encoding: {coding[:40]})" if coding else ""
    return RequestRejected(400, f"the request body could not be read{where}: {' '.join(str(reason).split())}",
                           close=True, undecodable=True)


async def read_json(request: web.BaseRequest, cfg: GuardConfig, *, allow_nonfinite: bool = False,
                    empty_message: str | None = None) -> Any:
    """Read and strictly decode a JSON body (see the module docstring); 4xx as RequestRejected."""
    raw = await read_body(request, cfg)
    request[BODY_BYTES_KEY] = len(raw)
    return await decode_json(raw, cfg, allow_nonfinite=allow_nonfinite, empty_message=empty_message)


async def parse_off_loop(request: web.Request, parse: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``parse(*args, **kwargs)`` (pure validation of a decoded body), on a worker thread when the
    body was large: validating millions of elements takes seconds, and the loop must keep serving."""
    if request.get(BODY_BYTES_KEY, 0) < OFFLOAD_BYTES:
        return parse(*args, **kwargs)
    return await run_heavy(parse, *args, **kwargs)


async def decode_json(raw: bytes | bytearray, cfg: GuardConfig, *, allow_nonfinite: bool = False,
                      empty_message: str | None = None) -> Any:
    if not raw.strip():
        raise RequestRejected(400, empty_message or "the request body is empty; send a JSON object")
    decode = lambda: json_safe.loads(raw, max_depth=cfg.max_json_depth,  # noqa: E731
                                     allow_nonfinite=allow_nonfinite)
    try:
        return decode() if len(raw) < OFFLOAD_BYTES else await run_heavy(decode)
    except json_safe.JSONRejected as err:
        raise RequestRejected(400, str(err)) from None


# ----------------------------------------------------------------------------- auth
def bearer_token(headers: Mapping[str, str]) -> bytes:
    """The token of ``Authorization: Bearer <token>`` as the bytes the client sent (b"" if none)."""
    header = headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    try:
        # aiohttp keeps non-UTF-8 header bytes as surrogate escapes: compare the original bytes.
        return token.strip().encode("utf-8", "surrogateescape") if scheme.lower() == "bearer" else b""
    except UnicodeEncodeError:
        return b""


def bearer_matches(headers: Mapping[str, str], key: bytes) -> bool:
    """``Authorization: Bearer <key>``, compared in constant time; any undecodable header is a mismatch."""
    # compare_digest on every path: the time taken does not depend on where the key differs.
    return hmac.compare_digest(bearer_token(headers), key)


def is_loopback_host(host: str) -> bool:
    """Whether a bind address reaches this machine only (127.0.0.0/8, ::1, ``localhost``). Anything else,
    the wildcard addresses and host names included, is reachable from elsewhere."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


# ----------------------------------------------------------------------------- error boundary
ErrorRenderer = Callable[[web.BaseRequest, int, str], web.StreamResponse]


def new_trace_id() -> str:
    return uuid.uuid4().hex[:16]


def error_boundary(render: ErrorRenderer, *, name: str = "server") -> Callable:
    """The outermost middleware: every failure becomes a JSON response (see the module docstring).

    ``render(request, status, message)`` builds the server's own error body; 404/405 from the
    router and aiohttp's 413 reach it as well (``message`` is aiohttp's reason then).
    """

    @web.middleware
    async def boundary(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        try:
            return await handler(request)
        except RequestRejected as err:
            resp = render(request, err.status, err.message)
            resp.headers.update(err.headers)
            if err.close:
                resp.force_close()
            if err.undecodable:
                _drop_body(request)
            return resp
        except (RequestPayloadError, HttpProcessingError) as err:
            resp = render(request, 400, _undecodable(request, err).message)
            resp.force_close()
            _drop_body(request)
            return resp
        except web.HTTPException as err:
            if err.status < 400:
                raise
            resp = render(request, err.status, err.reason)
            for key in ("Allow", "Retry-After", "WWW-Authenticate"):
                if key in err.headers:
                    resp.headers[key] = err.headers[key]
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # noqa: BLE001 - our bug: log it with a trace id, answer JSON 500, keep serving
            trace = new_trace_id()
            logger.exception("%s: internal error (trace id %s) on %s %s", name, trace, request.method, request.path)
            return render(request, 500, f"internal server error ({type(exc).__name__}; trace id {trace}: see the "
                                        f"{name} log)")

    return boundary


def _drop_body(request: web.BaseRequest) -> None:
    """The body cannot be decoded: answer without draining the rest (draining would re-raise)."""
    content = request.content
    if not content.is_eof():
        # Mark the body finished so aiohttp does not try to drain (and re-decode) it after we answer.
        content.feed_eof()


# ----------------------------------------------------------------------------- connections
GuardStats = counters("GuardStats",
                      "connections_open connections_peak connections_total connections_refused header_timeouts",
                      "A server's connection counters (``connections`` in its ``/healthz``); ``connections_peak`` "
                      "is the most connections it held open at once.")


class _RateLimitedLog:
    """At most one line per ``interval_s``; the next line says how many were suppressed."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self._last = -1e18
        self._suppressed = 0

    def warning(self, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._suppressed += 1
            return
        extra = f" ({self._suppressed} similar event(s) not logged since the last line)" if self._suppressed else ""
        self._last, self._suppressed = now, 0
        logger.warning(msg + extra, *args)


ErrorBody = Callable[[int, str], dict]


def default_error_body(status: int, message: str) -> dict:
    return {"error": {"message": message, "code": status}}


def _raw_json_response(status: int, reason: str, message: str, error_body: ErrorBody) -> bytes:
    body = json.dumps(error_body(status, message)).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def _answer_and_close(transport: Any, response: bytes, linger_s: float = 0.5) -> None:
    """Send ``response``, half-close, and close a little later: closing at once with unread input
    would make the kernel reset the connection, and the client could lose the response."""
    transport.write(response)
    try:
        transport.write_eof()
    except (OSError, RuntimeError, NotImplementedError):
        pass
    transport.pause_reading()
    asyncio.get_running_loop().call_later(linger_s, transport.abort)


class _JSONErrorRequestHandler(RequestHandler):
    """aiohttp's request handler, but a request that is not even valid HTTP (bad framing, a content
    coding the parser refuses, an oversize header line) is answered with a JSON body too."""

    __slots__ = ()
    error_body: ErrorBody = staticmethod(default_error_body)

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the response has started; no error response can follow")
        if status >= 500:
            trace = new_trace_id()
            logger.error("internal error (trace id %s) while reading a request from %s", trace, request.remote,
                         exc_info=exc)
            text = f"internal server error (trace id {trace})"
        else:
            logger.info("malformed HTTP request from %s: %s", request.remote, message or exc)
            text = "malformed HTTP request: " + " ".join(str(message or exc or "").split())[:300]
        resp = web.Response(status=status, text=json.dumps(self.error_body(status, text)),
                            content_type="application/json")
        resp.force_close()
        return resp


class ConnectionGuard:
    """Counts connections of one server and wraps each in a :class:`_GuardedProtocol`.

    ``error_body(status, message)`` shapes the JSON of the answers given below the application
    (connection refused, header timeout, malformed HTTP), as the server's own errors are shaped.
    """

    def __init__(self, cfg: GuardConfig, name: str = "server", error_body: ErrorBody = default_error_body) -> None:
        self.cfg = cfg
        self.name = name
        self.error_body = error_body
        self._handler_class = type("GuardedRequestHandler", (_JSONErrorRequestHandler,),
                                   {"__slots__": (), "error_body": staticmethod(error_body)})
        self.stats = GuardStats()
        self._by_handler: dict[int, _GuardedProtocol] = {}
        self.by_owner: dict[str, int] = {}   # open connections per owner (see `claim`)
        self._refused_log = _RateLimitedLog()
        self._timeout_log = _RateLimitedLog()

    def factory(self, server: web.Server) -> Callable[[], asyncio.Protocol]:
        """Protocol factory for ``loop.create_server``: aiohttp's handlers of ``server``, guarded."""
        cls = self._handler_class

        def make_handler() -> RequestHandler:
            return cls(server, loop=server._loop, **server._kwargs)

        return lambda: _GuardedProtocol(self, make_handler)

    def claim(self, request: web.BaseRequest, owner: str) -> int:
        """Mark the connection that carries ``request`` as ``owner``'s (an authenticated client); returns how
        many open connections ``owner`` holds now, this one included (0 when the connection is not one of
        this guard's, e.g. a test client). A connection counts for its last owner until it closes."""
        conn = self._by_handler.get(id(request.protocol))
        if conn is None:
            return 0
        if conn.owner != owner:
            if conn.owner is not None:
                self._disown(conn.owner)
            conn.owner = owner
            self.by_owner[owner] = self.by_owner.get(owner, 0) + 1
        return self.by_owner[owner]

    def _disown(self, owner: str) -> None:
        left = self.by_owner.get(owner, 0) - 1
        if left > 0:
            self.by_owner[owner] = left
        else:
            self.by_owner.pop(owner, None)

    def middleware(self) -> Callable:
        """Tells the connection that its request headers are complete (and when the request is done)."""

        @web.middleware
        async def track(request: web.Request, handler):
            conn = self._by_handler.get(id(request.protocol))
            if conn is not None:
                conn.request_started()
            try:
                return await handler(request)
            finally:
                if conn is not None:
                    conn.request_done()

        return track


class _GuardedProtocol(asyncio.Protocol):
    """Forwards everything to aiohttp's request handler; adds the cap and the header timer."""

    def __init__(self, guard: ConnectionGuard, make_handler: Callable[[], asyncio.BaseProtocol]) -> None:
        self._guard = guard
        self._make_handler = make_handler
        self._inner: Any = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False
        self._counted = False
        self.owner: str | None = None   # the client whose requests it carried last (`ConnectionGuard.claim`)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard, cfg = self._guard, self._guard.cfg
        self._transport = transport  # type: ignore[assignment]
        if guard.stats.connections_open >= cfg.max_connections:
            guard.stats.connections_refused += 1
            guard._refused_log.warning(
                "%s: connection limit reached (%d open, %s=%d): refusing the connection from %s "
                "with 503 (%d refused so far)", guard.name, guard.stats.connections_open, cfg.key("max_connections"),
                cfg.max_connections, transport.get_extra_info("peername"), guard.stats.connections_refused)
            _answer_and_close(transport, _raw_json_response(
                503, "Service Unavailable", f"too many open connections (limit {cfg.max_connections}); retry later",
                guard.error_body))
            return
        guard.stats.connections_open += 1
        guard.stats.connections_peak = max(guard.stats.connections_peak, guard.stats.connections_open)
        guard.stats.connections_total += 1
        self._counted = True
        self._inner = self._make_handler()
        guard._by_handler[id(self._inner)] = self
        self._inner.connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._guard.cfg.header_timeout_s, self._header_timeout)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def request_started(self) -> None:
        self._busy = True
        self._disarm()

    def request_done(self) -> None:
        self._busy = False

    def _header_timeout(self) -> None:
        self._timer = None
        if self._busy or self._transport is None or self._transport.is_closing():
            return
        guard, cfg = self._guard, self._guard.cfg
        guard.stats.header_timeouts += 1
        self._release()  # closing: its slot is free for a new connection now
        guard._timeout_log.warning(
            "%s: closing the connection from %s: no complete request headers within %g s (%s; "
            "%d such connection(s) closed so far)", guard.name, self._transport.get_extra_info("peername"),
            cfg.header_timeout_s, cfg.key("header_timeout_s"), guard.stats.header_timeouts)
        _answer_and_close(self._transport, _raw_json_response(
            408, "Request Timeout", f"no complete request headers within {cfg.header_timeout_s:g} s", guard.error_body))

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        if data and not self._busy:
            self._arm()  # no-op while armed: the timer counts from the first byte of a request
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self._guard.stats.connections_open -= 1
        if self.owner is not None:
            self._guard._disown(self.owner)
            self.owner = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        self._release()
        if self._inner is None:
            return
        guard = self._guard
        guard._by_handler.pop(id(self._inner), None)
        inner, self._inner = self._inner, None
        inner.connection_lost(exc)


class GuardedSite(web.SockSite):
    """``web.SockSite`` whose connections go through a :class:`ConnectionGuard`."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(runner, sock, **kwargs)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None, "call runner.setup() before starting a site"
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.factory(server), sock=self._sock, ssl=self._ssl_context, backlog=self._backlog)


def bind_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening, non-blocking TCP socket (port 0 = ephemeral)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
