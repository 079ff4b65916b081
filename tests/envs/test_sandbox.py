"""The sandbox: no network, no host files, time / CPU / memory / file-size / process limits, nothing
outlives a run, and the pinned CLI. Every isolation test first shows that the same action works
outside the sandbox (so a test cannot pass because the action was broken to begin with)."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from openclaw_jax.envs.sandbox import Sandbox, SandboxError, SandboxLimits, run_code

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox uses Linux namespaces")


def _marker_processes(marker: str) -> list[int]:
    """Host PIDs whose command line contains `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "pytest" not in cmdline:
            pids.append(int(entry))
    return pids


def test_cli_prints_the_pinned_json_object():
    out = subprocess.run([sys.executable, "-m", "openclaw_jax.envs.sandbox", "--lang", "python", "--timeout", "10",
                          "--", "import sys; print(6 * 7); print('oops', file=sys.stderr); sys.exit(3)"],
                         capture_output=True, text=True, timeout=60, env={**os.environ})
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout)
    assert obj == {"stdout": "42\n", "stderr": "oops\n", "exit_code": 3, "timed_out": False}
    bash = subprocess.run([sys.executable, "-m", "openclaw_jax.envs.sandbox", "--lang", "bash", "--", "echo $((2+3))"],
                          capture_output=True, text=True, timeout=60)
    assert json.loads(bash.stdout)["stdout"] == "5\n"
    helptext = subprocess.run([sys.executable, "-m", "openclaw_jax.envs.sandbox", "--help"], capture_output=True,
                              text=True, timeout=60)
    assert "--memory-mb" in helptext.stdout


def test_no_network_host_listener_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        server.settimeout(10)
        try:
            while True:
                conn, _ = server.accept()
                accepted.append(1)
                conn.sendall(b"hello")
                conn.close()
        except OSError:
            pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    code = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "print(s.recv(5).decode())")
    try:
        host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        assert host.stdout.strip() == "hello"  # reachable from the host
        n_host = len(accepted)
        result = run_code(code, "python", SandboxLimits(timeout_s=10))
        assert result.exit_code != 0 and not result.timed_out
        assert "hello" not in result.stdout
        assert "Network is unreachable" in result.stderr or "Connection refused" in result.stderr, result.stderr
        assert len(accepted) == n_host  # the listener never saw the sandbox
        bash = run_code(f"echo hi > /dev/tcp/127.0.0.1/{port} && echo connected", "bash")
        assert "connected" not in bash.stdout and bash.exit_code != 0
    finally:
        server.close()


def test_no_host_file_read_or_write_outside_the_directory(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    target = tmp_path / "written_by_sandbox.txt"
    read = f"print(open({str(secret)!r}).read())"
    write = f"open({str(target)!r}, 'w').write('x')"
    assert subprocess.run([sys.executable, "-c", read], capture_output=True, text=True).stdout.strip() == "top secret"
    r = run_code(read)
    assert "top secret" not in r.stdout and r.exit_code != 0 and "FileNotFoundError" in r.stderr
    w = run_code(write)
    assert w.exit_code != 0 and not target.exists()
    # the project's own files (the repository, this test) are not visible either
    r = run_code(f"print(open({__file__!r}).read()[:50])")
    assert r.exit_code != 0 and "FileNotFoundError" in r.stderr
    # the interpreter's files are visible but read-only; / itself is read-only
    r = run_code("open('/usr/openclaw_probe', 'w')")
    assert r.exit_code != 0 and "Read-only file system" in r.stderr
    assert not Path("/usr/openclaw_probe").exists()
    r = run_code("touch /probe || echo denied; ls /root/ /home 2>&1 | head -5", "bash")
    assert "denied" in r.stdout
    # inside its own directory it may read and write
    with Sandbox(files={"data/in.txt": "abc"}) as sb:
        r = sb.run("cat data/in.txt > out.txt && wc -c < out.txt", "bash")
        assert r.stdout.strip() == "3" and sb.read_file("out.txt") == b"abc"
        r = sb.run("ln -s /etc/hostname link; echo ok", "bash")
        with pytest.raises((OSError, ValueError)):
            sb.read_file("link")  # the host never follows the sandbox's links out of it


def test_wall_timeout_kills_the_run():
    t = time.monotonic()
    r = run_code("import time\nwhile True: time.sleep(0.1)", limits=SandboxLimits(timeout_s=1.5))
    elapsed = time.monotonic() - t
    assert r.timed_out and r.exit_code < 0
    assert elapsed < 8, elapsed


def test_cpu_time_limit():
    t = time.monotonic()
    r = run_code("while True: pass", limits=SandboxLimits(timeout_s=60, cpu_s=1))
    assert not r.timed_out and r.exit_code in (-24, -9), r  # SIGXCPU (or SIGKILL at the hard limit)
    assert time.monotonic() - t < 30


def test_memory_limit():
    big = "x = bytearray(300 << 20); print('allocated')"
    ok = run_code("x = bytearray(8 << 20); print('allocated')", limits=SandboxLimits(memory_mb=256))
    assert ok.stdout.strip() == "allocated"
    r = run_code(big, limits=SandboxLimits(memory_mb=128))
    assert "allocated" not in r.stdout and "MemoryError" in r.stderr
    assert run_code(big, limits=SandboxLimits(memory_mb=1024)).stdout.strip() == "allocated"


def test_file_size_limit():
    code = "with open('big', 'wb') as f: f.write(b'0' * (3 << 20))\nprint('wrote')"
    assert run_code(code, limits=SandboxLimits(file_size_mb=8)).stdout.strip() == "wrote"
    r = run_code(code, limits=SandboxLimits(file_size_mb=1))
    assert "wrote" not in r.stdout and r.exit_code != 0


def test_process_limit_stops_a_fork_bomb():
    code = ("import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
            "            time.sleep(3); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('limited', e.errno)\n"
            "print(n)")
    r = run_code(code, limits=SandboxLimits(max_processes=16, timeout_s=20))
    lines = r.stdout.split()
    assert lines[0] == "limited", r
    assert int(lines[-1]) < 16


def test_multiprocessing_works_and_its_shared_memory_stays_in_tmp():
    code = ("import multiprocessing as mp\nwith mp.Pool(2) as pool:\n    print(sum(pool.map(abs, [-1, -2, -3])))\n"
            "try:\n    open('/dev/shm/big', 'wb').write(b'x' * (16 << 20))\nexcept OSError as e:\n    print(e.errno)")
    r = run_code(code, limits=SandboxLimits(tmp_mb=8, timeout_s=30))
    assert r.stdout.split() == ["6", str(errno.ENOSPC)], r


def test_no_process_outlives_its_run():
    marker = "987654.25"
    # the scan finds such a process when it runs on the host
    host = subprocess.Popen(["sleep", marker])
    try:
        deadline = time.monotonic() + 10  # until the child has exec'ed sleep (before, it is a copy of pytest)
        while host.pid not in _marker_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.pid in _marker_processes(marker)
    finally:
        host.kill()
        host.wait()
    code = f"(setsid sleep {marker} &) ; nohup sleep {marker} >/dev/null 2>&1 & disown; sleep {marker} & echo started"
    r = run_code(code, "bash")
    assert r.stdout.strip() == "started" and not r.timed_out
    assert _gone(marker), _marker_processes(marker)
    # the same when the run is killed by its timeout
    r = run_code(f"sleep {marker} & setsid sleep {marker} & sleep {marker}", "bash", SandboxLimits(timeout_s=1))
    assert r.timed_out
    assert _gone(marker), _marker_processes(marker)


def _gone(marker: str, within_s: float = 10.0) -> bool:
    """The killed processes are reaped within seconds even on a loaded machine; a process that
    outlived its run would still be sleeping for 11 days."""
    deadline = time.monotonic() + within_s
    while _marker_processes(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_output_is_capped_and_bad_input_is_an_error_result():
    r = run_code("import sys\nsys.stdout.write('y' * (1 << 20))", limits=SandboxLimits(max_output_bytes=1000))
    assert len(r.stdout) == 1000 and r.truncated and r.exit_code == 0
    assert run_code("x = (", "python").exit_code == 1  # a syntax error is the code's failure, not ours
    r = run_code("a" * 200_000)
    assert r.exit_code != 0 and "exceeds" in r.stderr
    with pytest.raises(ValueError):
        run_code("print(1)", "ruby")  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_area_lives_across_runs_and_goes_with_close():
    with Sandbox(files={"in/a.txt": "abc"}) as sb:
        holder = sb._holder.pid
        r = sb.run("cat in/a.txt > out.txt; mkdir -p deep/er; echo 1 > deep/er/n; ls", "bash")
        assert r.exit_code == 0 and r.stdout.split() == ["deep", "in", "out.txt"], r
        assert sb.read_file("out.txt") == b"abc" and sb.read_file("deep/er/n") == b"1\n"
        sb.write_files({"deep/er/n": "2\n", "new/f.txt": "x"})
        assert sb.run("cat deep/er/n new/f.txt", "bash").stdout == "2\nx"
        assert os.listdir(sb.directory) == []   # the host's disk holds none of it
        host_dir = sb._host
    assert not _alive(holder) and not host_dir.exists()
    with pytest.raises(SandboxError):
        sb.run("true", "bash")


def test_the_holder_dies_with_its_host():
    """A host killed without closing its sandboxes leaves no holder (and so no area) behind."""
    code = ("import os, sys, time\nfrom openclaw_jax.envs.sandbox import Sandbox\nsb = Sandbox()\n"
            "print(sb._holder.pid, flush=True)\ntime.sleep(60)")
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        holder = int(host.stdout.readline())
        assert _alive(holder)
    finally:
        host.kill()
        host.wait()
    deadline = time.monotonic() + 10
    while _alive(holder) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(holder)


def test_host_side_file_access_never_follows_the_codes_links(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    with Sandbox() as sb:
        r = sb.run(f"ln -s {outside} file; ln -s / dir; ln -s /sandbox self; mkfifo pipe; echo ok", "bash")
        assert r.stdout.strip() == "ok", r
        for name in ("file", f"dir{outside}", "self/file", "pipe"):
            with pytest.raises((OSError, ValueError)):
                sb.read_file(name)
        for name in ("file", f"dir{tmp_path}/x", "../x", "/etc/x", "self/y"):
            with pytest.raises((OSError, ValueError)):
                sb.write_files({name: "overwritten"})
        assert outside.read_text() == "host file" and not (tmp_path / "x").exists()
        assert sb.run("readlink file; ls", "bash").stdout.split() == [str(outside), "dir", "file", "pipe", "self"]
