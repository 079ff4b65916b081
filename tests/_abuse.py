"""Client-side tools for the hardening tests: raw sockets, slow connections, latency under a big
request, RSS of a server process, and the seeded fuzz runner."""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlparse

import requests

from _fuzz_bodies import FuzzRequest


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
