"""Client-side tools for the hardening tests: raw sockets, slow connections, latency under a big
request, RSS of a server process, and the seeded fuzz runner."""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlparse

import requests

from tests.helpers.fuzz_bodies import FuzzRequest


def host_port(url: str) -> tuple[str, int]:
    u = urlparse(url)
    return u.hostname, u.port


def raw_request(url: str, head: bytes, body: bytes = b"", timeout: float = 30.0) -> tuple[int, dict, bytes]:
    """Send exactly these bytes (request line + headers, then body); (status, headers, body) of the reply."""
    with socket.create_connection(host_port(url), timeout=timeout) as s:
        s.sendall(head + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            head_end = data.find(b"\r\n\r\n")
            if head_end >= 0:
                lines = data[:head_end].decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                length = int(headers.get("content-length", -1))
                if 0 <= length <= len(data) - head_end - 4:
                    return int(lines[0].split()[1]), headers, data[head_end + 4:head_end + 4 + length]
    raise AssertionError(f"no complete HTTP response: {data[:200]!r}")


def post_raw(url: str, path: str, body: bytes, headers: dict[str, bytes | str] | None = None):
    host, port = host_port(url)
    headers = dict(headers or {})
    lines = [f"POST {path} HTTP/1.1".encode(), f"Host: {host}:{port}".encode(),
             f"Content-Length: {headers.pop('Content-Length', len(body))}".encode(), b"Connection: close"]
    for k, v in headers.items():
        lines.append(k.encode() + b": " + (v if isinstance(v, bytes) else v.encode("latin-1")))
    return raw_request(url, b"\r\n".join(lines) + b"\r\n\r\n", body)


def small_latency_during(send_big, send_small) -> tuple[object, list[float]]:
    """Run ``send_big()`` in a thread; time ``send_small()`` back to back until it returns."""
    result: dict = {}
    done = threading.Event()

    def big():
        try:
            result["value"] = send_big()
        except Exception as err:  # noqa: BLE001 - reported to the test
            result["value"] = err
        finally:
            done.set()

    thread = threading.Thread(target=big)
    thread.start()
    latencies = []
    while not done.is_set() or not latencies:
        t0 = time.perf_counter()
        send_small()
        latencies.append(time.perf_counter() - t0)
    thread.join()
    return result["value"], latencies


def served_during(send_big, send_small) -> tuple[object, float, list[float]]:
    """``small_latency_during``, also timing ``send_big()`` itself: (big's result, its seconds, small latencies)."""
    t0 = time.perf_counter()
    result, latencies = small_latency_during(send_big, send_small)
    return result, time.perf_counter() - t0, latencies


def assert_no_stall(rounds: list[tuple[float, float]], body: bytes) -> None:
    """Each (big request's seconds, slowest small request's seconds) shows no stall: a server that did the
    big request's work on its event loop would make a small request sent meanwhile wait about as long as
    the big one. Both bounds scale with the machine: half the big request's time, or, for big requests
    that are refused quickly, a few times what decoding `body` as JSON takes in this process right now
    (a decode holds Python's GIL even on a worker thread, so a server may pause for about that long)."""
    decode_s = min(_timed(json.loads, body) for _ in range(2))
    floor = 3 * decode_s + 1.0
    stalled = [(round(big, 3), round(small, 3)) for big, small in rounds if small >= max(0.5 * big, floor)]
    assert not stalled, (f"small requests waited for the big one (big s, small s): {stalled} of {rounds}; "
                         f"bound max(big / 2, {floor:.3f} s)")


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class SlowClients:
    """``n`` connections that send a request line and then one header byte at a time, slowly."""

    def __init__(self, url: str, n: int, interval_s: float = 0.2) -> None:
        self.addr = host_port(url)
        self.n = n
        self.interval_s = interval_s
        self.socks: list[socket.socket] = []
        self.replies: dict[int, bytes] = {}

    def open(self) -> "SlowClients":
        for _ in range(self.n):
            s = socket.create_connection(self.addr, timeout=10)
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
            self.socks.append(s)
        return self

    def dribble_until_closed(self, seconds: float) -> None:
        """Keep sending header bytes; record what each connection got back when the server closed it."""
        deadline = time.monotonic() + seconds
        live = dict(enumerate(self.socks))
        while live and time.monotonic() < deadline:
            for i, s in list(live.items()):
                try:
                    s.sendall(b"X")
                    s.setblocking(False)
                    try:
                        data = s.recv(65536)
                    except BlockingIOError:
                        data = None
                    finally:
                        s.setblocking(True)
                except OSError:
                    data = b""
                if data is not None:
                    self.replies[i] = self.replies.get(i, b"") + data
                    live.pop(i)
            time.sleep(self.interval_s)

    def statuses(self) -> list[int | None]:
        out = []
        for i in range(self.n):
            data = self.replies.get(i)
            out.append(int(data.split()[1]) if data and data.startswith(b"HTTP/1.1 ") else None)
        return out

    def close(self) -> None:
        for s in self.socks:
            s.close()


def run_fuzz(url: str, reqs: list[FuzzRequest], check_body) -> dict[str, int]:
    """Send every request; fail on any 5xx; ``check_body(req, status, text)`` checks each reply."""
    counts = {"sent": 0, "2xx": 0, "4xx": 0, "5xx": 0}
    session = requests.Session()
    failures = []
    for req in reqs:
        r = session.post(url + req.path, data=req.body, headers=req.headers, timeout=120)
        counts["sent"] += 1
        bucket = f"{r.status_code // 100}xx"
        counts[bucket] = counts.get(bucket, 0) + 1
        if r.status_code >= 500:
            failures.append((req.what, req.path, req.body[:200], r.status_code, r.text[:300]))
            continue
        check_body(req, r.status_code, r.text)
    session.close()
    assert not failures, f"{len(failures)} 5xx answers, e.g. {failures[:3]}"
    return counts


def error_json(text: str) -> dict:
    body = json.loads(text)
    assert isinstance(body, dict), text
    return body


# ----------------------------------------------------------------------------- real processes for the probes

class GatewayProcess:
    """`python -m openclaw_jax.gateway` on 127.0.0.1 (an ephemeral port) with the given flags; its stderr
    (the gateway's log) goes to ``log_path``. ``env`` adds environment variables."""

    def __init__(self, args: list[str], log_path, env: dict[str, str] | None = None) -> None:
        import subprocess
        import sys

        from tests.helpers.server_utils import REPO, server_env

        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "openclaw_jax.gateway", "--port", "0", "--log-level",
                                      "INFO", *args], stdout=subprocess.PIPE, stderr=self._log,
                                     env={**server_env(None), **(env or {})}, cwd=str(REPO))
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"the gateway did not start: {line!r}; log:\n{self.log()[-3000:]}")
        self.url = line.rsplit(" ", 1)[-1].strip()

    def log(self) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a stuck gateway is killed
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()


def health_latencies_during(send_big, health_url: str, rounds: int = 3, headers: dict | None = None):
    """``send_big()`` ``rounds`` times (in a thread), each while ``GET health_url`` is timed back to back;
    returns (the replies, the slowest health answer of each round). A failed health check fails the test."""
    session = requests.Session()

    def probe() -> None:
        session.get(health_url, timeout=30, headers=headers).raise_for_status()

    replies, worst = [], []
    for _ in range(rounds):
        reply, latencies = small_latency_during(send_big, probe)
        replies.append(reply)
        worst.append(max(latencies))
    session.close()
    return replies, worst


def assert_responsive(worst: list[float], what: str) -> None:
    """The slowest health answers of the rounds of `health_latencies_during`: under 1 s. A stall would hit
    every round; one round slowed by a busy shared machine (still under 5 s) is tolerated."""
    print(f"\n{what}: slowest health answer per round {[round(x, 3) for x in worst]} s")
    assert sum(x >= 1.0 for x in worst) <= 1 and max(worst) < 5.0, (what, worst)


def bomb_png(side: int) -> bytes:
    """A valid 1-bit grey PNG of ``side`` x ``side`` pixels, all black: a few kilobytes that decode to
    side^2 / 8 bytes, and to 3 * side^2 as RGB (13,000: 21 MB, 507 MB)."""
    import struct
    import zlib

    row = b"\x00" + bytes((side + 7) // 8)
    comp = zlib.compressobj(9)
    data = b"".join(comp.compress(row) for _ in range(side)) + comp.flush()

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def data_url(data: bytes, mime: str = "image/png") -> str:
    import base64

    return f"data:{mime};base64," + base64.b64encode(data).decode()


def peak_rss_growth_mib(pid: int, action):
    """(``action()``'s result, how far the resident memory of process ``pid`` rose above where it was
    when ``action`` started, in MiB): its peak (VmHWM) is reset first through /proc/<pid>/clear_refs."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")   # VmHWM := VmRSS
    before = rss_mib(pid)
    result = action()
    with open(f"/proc/{pid}/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    return result, peak - before


def scripted_pool():
    """A scripted policy pool (tests/helpers/scripted_pool.py) serving on 127.0.0.1 from its own loop thread, with
    ``.url``; a context manager."""
    import contextlib

    from openclaw_jax.models.tokenizer import tiny_test_tokenizer
    from tests.helpers.scripted_pool import LoopThread, ScriptedPool, serve_app

    @contextlib.contextmanager
    def serving():
        loop = LoopThread()
        pool = ScriptedPool(tiny_test_tokenizer())
        runner, pool.url = loop.run(serve_app(pool.app()))
        try:
            yield pool
        finally:
            loop.run(runner.cleanup())
            loop.stop()

    return serving()
