"""Escape probes against the sandbox, each run in both of its modes: started by root, and started by an
ordinary user (uid 65534, dropped to with `setpriv` from the test itself when the suite runs as root).

Each probe is a small driver program run as that user: it imports the sandbox from a copy of its
modules that the user can read, runs the attack inside a jail and prints what the attack achieved as
JSON. The tests assert on what was achieved (a host file's content, bytes written, processes made,
a mount that exists), not only on exit codes; where it makes sense the driver first shows that the
same target is reachable outside the jail, so a probe cannot pass because it was broken."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox uses Linux namespaces")

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
MODES = ("root", "user")
SECRET = "host-secret-7f3a9c"


def _setpriv() -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


@pytest.fixture(scope="module")
def world():
    """A copy of the sandbox's modules (and the seccomp binding) readable by everyone, and a host
    secret file that the probe's user can read outside the jail."""
    base = Path(tempfile.mkdtemp(prefix="openclaw-sandbox-probe-"))
    pkg = base / "openclaw_jax" / "envs"
    pkg.mkdir(parents=True)
    (base / "openclaw_jax" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for name in ("sandbox.py", "sandbox_init.py", "sandbox_seccomp.py", "sandbox_cgroup.py"):
        shutil.copy(ROOT / "openclaw_jax" / "envs" / name, pkg / name)
    spec = importlib.util.find_spec("pyseccomp")
    assert spec is not None and spec.origin, "pyseccomp (a project dependency) is not installed"
    shutil.copy(spec.origin, base / "pyseccomp.py")
    (base / "secret.txt").write_text(SECRET)
    for dirpath, dirnames, filenames in os.walk(base):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    yield base
    shutil.rmtree(base, ignore_errors=True)


# Inside-the-jail helpers: the failing call's errno, never an exception; how far a loop got.
ERRNO_OF = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def err(f, *a):
    try:
        r = f(*a)
    except OSError as e:
        return e.errno
    return ctypes.get_errno() if r == -1 else 0
def until_refused(step, most):
    done = 0
    try:
        for i in range(most):
            step(i)
            done += 1
    except OSError as e:
        return done, e.errno
    return done, 0
"""


def _world_usable(path: str) -> bool:
    """Every folder on the way searchable by others and the file executable by them (what a process
    of another uid, or in a user namespace, needs to run it)."""
    real = os.path.realpath(path)
    parts = Path(real).parents
    return os.path.exists(real) and bool(os.stat(real).st_mode & 0o001) and \
        all(os.stat(p).st_mode & 0o001 for p in parts)


def _python_for_user() -> str:
    """An interpreter the probe's user can run (this one's may live under /root, mode 0700)."""
    candidates = [os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable), "/usr/bin/python3"]
    for exe in candidates:
        if _world_usable(exe):
            return exe
    pytest.fail(f"no Python interpreter among {candidates} can be run by uid {NOBODY}; install python3 "
                "(Debian: apt-get install python3) so the sandbox can be probed as an ordinary user")


def drive(world: Path, mode: str, scenario: str, jail: str = "", timeout: float = 120) -> dict:
    """Run `scenario` (Python that fills the dict `out`; `JAIL` holds `jail`, a program for inside the
    jail) as the mode's user; its `out`."""
    is_root = os.geteuid() == 0
    if mode == "root" and not is_root:
        pytest.skip("the root mode needs the suite to run as root (CI does)")
    prefix = _setpriv() if mode == "user" and is_root else []
    prelude = textwrap.dedent(f"""
        import json, os, sys, threading, time
        sys.path.insert(0, {str(world)!r})
        from openclaw_jax.envs.sandbox import Sandbox, SandboxLimits, run_code
        SECRET_PATH = {str(world / "secret.txt")!r}
        JAIL = {textwrap.dedent(jail)!r}
        def res(r):
            return {{"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code, "timed_out": r.timed_out}}
        def inside(code, lang="python", **limits):
            r = run_code(code, lang, SandboxLimits(**limits))
            assert r.exit_code == 0 and not r.timed_out, res(r)
            return json.loads(r.stdout.strip().splitlines()[-1])
        out = {{"uid": os.getuid()}}
    """)
    script = prelude + textwrap.dedent(scenario) + "\nprint('PROBE ' + json.dumps(out))\n"
    proc = subprocess.run(prefix + [_python_for_user(), "-I", "-c", script], capture_output=True, text=True,
                          timeout=timeout, cwd=world,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, \
        f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = json.loads(lines[-1][6:])
    assert out["uid"] == (0 if mode == "root" else NOBODY if is_root else os.getuid())
    return out


CLIMB = ERRNO_OF + """
r = {}
os.mkdir("x")
r["chroot"] = err(os.chroot, "x")
for _ in range(64):
    os.chdir("..")
r["chroot_dot"] = err(os.chroot, ".")
r["here"] = sorted(os.listdir("."))
r["root"] = sorted(os.listdir("/"))
r["secret"] = err(lambda: open(SECRET_PATH).read())
r["via_proc"] = err(lambda: open("/proc/1/root" + SECRET_PATH).read())
print(json.dumps(r))
"""


@pytest.mark.parametrize("mode", MODES)
def test_chroot_climb_does_not_reach_the_host_root(world, mode):
    out = drive(world, mode, """
        out["host_read"] = open(SECRET_PATH).read()   # the target is readable by this user outside the jail
        out["jail"] = inside(f"SECRET_PATH = {SECRET_PATH!r}\\n" + JAIL)
    """, CLIMB)
    jail = out["jail"]
    assert out["host_read"] == SECRET
    assert jail["chroot"] == jail["chroot_dot"] == errno.EPERM, jail
    assert jail["here"] == jail["root"] and "sandbox" in jail["here"], jail   # climbing stops at the jail's /
    assert not {"home", "var", "work", "boot"} & set(jail["here"]), jail
    assert jail["secret"] == errno.ENOENT and jail["via_proc"] in (errno.ENOENT, errno.EACCES), jail


FILL = ERRNO_OF + """
r = {}
os.mkdir("/sandbox/m")
r["mount"] = err(libc.mount, b"none", b"/sandbox/m", b"tmpfs", 0, b"size=4g")
r["mounted"] = any(" /sandbox/m " in ln for ln in open("/proc/self/mountinfo"))
def write_mib(folder, i):
    with open(f"{folder}/f{i}", "wb") as f:
        f.write(b"x" * (1 << 20))
r["area_mib"], r["area_errno"] = until_refused(lambda i: write_mib("/sandbox/m", i), 10_000)
r["tmp_mib"], r["tmp_errno"] = until_refused(lambda i: write_mib("/tmp", i), 10_000)
print(json.dumps(r))
"""


@pytest.mark.parametrize("mode", MODES)
def test_no_mount_can_escape_the_memory_or_disk_bounds(world, mode):
    """A tmpfs of any size was the old way around RLIMIT_AS; the writable places are bounded tmpfs."""
    out = drive(world, mode, """
        out["jail"] = inside(JAIL, memory_mb=64, work_mb=8, tmp_mb=8, timeout_s=60)
    """, FILL)
    jail = out["jail"]
    assert jail["mount"] == errno.EPERM and not jail["mounted"], jail
    assert jail["area_mib"] <= 8 and jail["area_errno"] == errno.ENOSPC, jail
    assert jail["tmp_mib"] <= 8 and jail["tmp_errno"] == errno.ENOSPC, jail


REMOUNT = ERRNO_OF + """
MS_REMOUNT, MS_BIND = 32, 4096
r = {"remount": err(libc.mount, None, b"/usr", None, MS_REMOUNT | MS_BIND, None),
     "remount_root": err(libc.mount, None, b"/", None, MS_REMOUNT, None)}
r["usr_options"] = [ln.split()[5] for ln in open("/proc/self/mountinfo") if ln.split()[4] == "/usr"]
r["write"] = err(lambda: open("/usr/openclaw-probe", "w"))
print(json.dumps(r))
"""


@pytest.mark.parametrize("mode", MODES)
def test_the_read_only_usr_cannot_be_remounted_read_write(world, mode):
    out = drive(world, mode, """
        out["jail"] = inside(JAIL)
        out["host_has_probe"] = os.path.exists("/usr/openclaw-probe")
    """, REMOUNT)
    jail = out["jail"]
    assert jail["remount"] == jail["remount_root"] == errno.EPERM, jail
    assert jail["usr_options"] and all(opts.split(",")[0] == "ro" for opts in jail["usr_options"]), jail
    assert jail["write"] == errno.EROFS and not out["host_has_probe"], jail


MANY_FILES = ERRNO_OF + """
r = {}
r["area"], r["area_errno"] = until_refused(lambda i: open(f"/sandbox/s{i}", "w").close(), 100_000)
r["tmp"], r["tmp_errno"] = until_refused(lambda i: open(f"/tmp/s{i}", "w").close(), 100_000)
print(json.dumps(r))
"""


@pytest.mark.parametrize("mode", MODES)
def test_many_small_files_cannot_fill_the_disk(world, mode):
    out = drive(world, mode, """
        with Sandbox(SandboxLimits(max_files=300, timeout_s=60)) as sb:
            out["jail"] = json.loads(sb.run(JAIL).stdout)
            out["host_staging"] = os.listdir(sb.directory)       # nothing lands on the host's disk
            out["second_run"] = sb.run("import os; print(len(os.listdir('/sandbox')))").stdout.strip()
    """, MANY_FILES)
    jail = out["jail"]
    assert 0 < jail["area"] < 300 and jail["area_errno"] == errno.ENOSPC, jail
    assert 0 < jail["tmp"] < 300 and jail["tmp_errno"] == errno.ENOSPC, jail
    assert out["host_staging"] == []
    assert out["second_run"] == str(jail["area"])   # the area is the sandbox's own, kept between runs


FORK_MANY = """
import json, os, time
made, error = 0, 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        made += 1
except OSError as e:
    error = e.errno
print(json.dumps({"made": made, "errno": error}))
"""


@pytest.mark.parametrize("mode", MODES)
def test_process_count_is_bounded(world, mode):
    out = drive(world, mode, """
        out["jail"] = inside(JAIL, max_processes=8, timeout_s=30)
    """, FORK_MANY)
    jail = out["jail"]
    assert jail["errno"] == errno.EAGAIN and jail["made"] < 8, jail


PTRACE_CHILD = ERRNO_OF + """
import time
pid = os.fork()
if pid == 0:
    time.sleep(5)
    os._exit(0)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
r = {"attach": err(libc.ptrace, PTRACE_ATTACH, pid, None, None),
     "seize": err(libc.ptrace, PTRACE_SEIZE, pid, None, None),
     "vm_read": err(libc.process_vm_readv, pid, None, 0, None, 0, 0)}
r["tracer"] = [ln.split()[1] for ln in open(f"/proc/{pid}/status") if ln.startswith("TracerPid")][0]
os.kill(pid, 9)
print(json.dumps(r))
"""


@pytest.mark.parametrize("mode", MODES)
def test_no_ptrace_not_even_of_its_own_child(world, mode):
    out = drive(world, mode, 'out["jail"] = inside(JAIL)', PTRACE_CHILD)
    jail = out["jail"]
    assert jail["attach"] == jail["seize"] == jail["vm_read"] == errno.EPERM, jail
    assert jail["tracer"] == "0", jail


LOOK_AND_KILL = """
import json, os
seen = []
for p in os.listdir("/proc"):
    if p.isdigit():
        seen.append(open(f"/proc/{p}/cmdline").read())
markers = ("987" + ".5", "4" + ".25")   # spelled apart: this program's own command line holds its text
print(json.dumps({"marker": any(m in c for m in markers for c in seen), "pids": len(seen)}), flush=True)
os.kill(-1, 9)
"""


@pytest.mark.parametrize("mode", MODES)
def test_one_sandbox_cannot_see_or_kill_another_or_the_host(world, mode):
    out = drive(world, mode, """
        import subprocess
        host = subprocess.Popen(["sleep", "987.5"])
        box_a = {}
        def victim():
            box_a["r"] = res(run_code("sleep 4.25; echo survived", "bash", SandboxLimits(timeout_s=30)))
        t = threading.Thread(target=victim)
        t.start()
        def victim_sleeping():
            for p in os.listdir("/proc"):
                try:
                    if p.isdigit() and open(f"/proc/{p}/cmdline").read() == "sleep\\x004.25\\x00":
                        return True
                except OSError:
                    pass
            return False
        deadline = time.monotonic() + 30
        while not victim_sleeping() and time.monotonic() < deadline:   # attack while the victim runs
            time.sleep(0.05)
        out["victim_seen_from_host"] = victim_sleeping()
        attack = run_code(JAIL, "python", SandboxLimits(timeout_s=30))
        t.join()
        out["attack"] = json.loads(attack.stdout.splitlines()[0])
        out["victim"] = box_a["r"]
        out["host_alive"] = host.poll() is None
        host.kill()
    """, LOOK_AND_KILL)
    assert out["victim_seen_from_host"], out
    assert not out["attack"]["marker"] and out["attack"]["pids"] <= 2, out
    assert out["victim"]["stdout"] == "survived\n" and out["victim"]["exit_code"] == 0, out
    assert out["host_alive"]


NAMESPACES = ERRNO_OF + """
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000
before = os.readlink("/proc/self/ns/user"), os.readlink("/proc/self/ns/mnt")
r = {"user": err(libc.unshare, CLONE_NEWUSER), "mnt": err(libc.unshare, CLONE_NEWNS),
     "net": err(libc.unshare, CLONE_NEWNET)}
fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
r["setns"] = err(libc.setns, fd, 0)
r["same"] = before == (os.readlink("/proc/self/ns/user"), os.readlink("/proc/self/ns/mnt"))
import subprocess
p = subprocess.run(["unshare", "-Ur", "id", "-u"], capture_output=True, text=True)
r["cli"] = [p.returncode, p.stdout]
print(json.dumps(r))
"""


@pytest.mark.parametrize("mode", MODES)
def test_no_new_namespaces_and_no_joining_others(world, mode):
    out = drive(world, mode, 'out["jail"] = inside(JAIL)', NAMESPACES)
    jail = out["jail"]
    assert jail["user"] == jail["mnt"] == jail["net"] == jail["setns"] == errno.EPERM, jail
    assert jail["same"] and jail["cli"][0] != 0 and jail["cli"][1] == "", jail


KERNEL_INTERFACES = ERRNO_OF + """
NR = {"x86_64": {"add_key": 248, "keyctl": 250, "bpf": 321, "perf_event_open": 298},
      "aarch64": {"add_key": 217, "keyctl": 219, "bpf": 280, "perf_event_open": 241}}[os.uname().machine]
KEY_SPEC_SESSION_KEYRING, KEYCTL_GET_KEYRING_ID, BPF_MAP_CREATE = -3, 0, 0
attr = ctypes.create_string_buffer(128)
r = {"add_key": err(libc.syscall, NR["add_key"], b"user", b"probe", b"x", 1, KEY_SPEC_SESSION_KEYRING),
     "keyctl": err(libc.syscall, NR["keyctl"], KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 1),
     "bpf": err(libc.syscall, NR["bpf"], BPF_MAP_CREATE, attr, 72),
     "perf": err(libc.syscall, NR["perf_event_open"], attr, 0, -1, -1, 0),
     "memfd": err(libc.memfd_create, b"hidden", 0)}
print(json.dumps(r))
"""


@pytest.mark.parametrize("mode", MODES)
def test_keyrings_ebpf_and_perf_events_are_closed(world, mode):
    out = drive(world, mode, 'out["jail"] = inside(JAIL)', KERNEL_INTERFACES)
    assert set(out["jail"].values()) == {errno.EPERM}, out["jail"]


HOST_FILES = ERRNO_OF + """
r = {}
r["read"] = [err(lambda t=t: open(t).read()) for t in TARGETS]
r["write"] = [err(lambda t=t: open(t, "w").write("x")) for t in
              ["/probe", "/etc/probe", "/usr/bin/probe", "/dev/probe", "/proc/probe", STAGING + "/x",
               "/proc/sys/kernel/hostname"]]
r["sandbox"] = err(lambda: open("/sandbox/ok", "w").write("x"))
print(json.dumps(r))
"""


@pytest.mark.parametrize("mode", MODES)
def test_host_files_are_neither_readable_nor_writable(world, mode):
    out = drive(world, mode, f"""
        targets = [SECRET_PATH, "/etc/passwd", "/etc/hostname", {str(ROOT / 'pyproject.toml')!r}, "/home", "/root"]
        out["host"] = [os.path.exists(t) for t in targets[:3]]
        staging = Sandbox(SandboxLimits(), persistent=False)
        out["jail"] = inside(f"TARGETS = {{targets!r}}\\nSTAGING = {{str(staging.directory)!r}}\\n" + JAIL)
        out["staging_after"] = os.listdir(staging.directory)
        staging.close()
    """, HOST_FILES)
    jail = out["jail"]
    assert out["host"] == [True, True, True]
    assert all(e in (errno.ENOENT, errno.EACCES) for e in jail["read"]), jail
    assert all(e in (errno.ENOENT, errno.EROFS, errno.EACCES, errno.EPERM) for e in jail["write"]), jail
    assert jail["sandbox"] == 0 and out["staging_after"] == [], out


PRIVILEGES = """
import json, os
status = dict(ln.split(":", 1) for ln in open("/proc/self/status") if ":" in ln)
keys = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
print(json.dumps({**{k: status[k].strip() for k in keys}, "uid": os.getuid()}))
"""


@pytest.mark.parametrize("mode", MODES)
def test_the_code_holds_no_privilege(world, mode):
    out = drive(world, mode, 'out["jail"] = inside(JAIL)', PRIVILEGES)
    jail = out["jail"]
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(jail[key], 16) == 0, jail
    assert jail["NoNewPrivs"] == "1" and jail["Seccomp"] == "2", jail   # 2 = filter mode
    assert (jail["uid"] != 0) if mode == "root" else (jail["uid"] == 0), jail   # root: a uid of its own


HOLD_MEMORY = """
import os, time
children = []
for _ in range(6):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            b = bytearray(40 << 20)
            for i in range(0, len(b), 4096):
                b[i] = 1
        except MemoryError:
            os._exit(1)
        time.sleep(3)   # all of them hold their 40 MiB at once
        os._exit(0)
    children.append(pid)
print(sum(os.waitpid(pid, 0)[1] == 0 for pid in children))
"""


@pytest.mark.parametrize("mode", MODES)
def test_memory_of_the_whole_sandbox_is_bounded(world, mode):
    """With a cgroup (root here) the whole sandbox stays under memory_mb; without one (an ordinary
    user here) the stated bound is max_processes x memory_mb, and the attack cannot pass that either."""
    out = drive(world, mode, """
        with Sandbox(SandboxLimits(memory_mb=64, max_processes=16, timeout_s=60)) as sb:
            out["cgroup"] = sb.cgroup is not None
            r = sb.run(JAIL)
            out["held"] = int(r.stdout.strip() or 0)
    """, HOLD_MEMORY)
    bound_mb = 64 if out["cgroup"] else 16 * 64
    assert 40 * out["held"] <= bound_mb, out
    if mode == "root":   # as root the sandbox takes the cgroup wherever this host offers one
        assert out["cgroup"] == _cgroups_writable_as_root(), out


def _cgroups_writable_as_root() -> bool:
    if os.geteuid() != 0:
        return False
    from openclaw_jax.envs.sandbox_cgroup import plan
    return plan() is not None


OTHER_ABI_C = r"""
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    long ret;
    if (argc > 1 && strcmp(argv[1], "x32") == 0)   /* getpid through the x32 numbers */
        __asm__ volatile ("syscall" : "=a"(ret) : "a"(0x40000000L | 39) : "rcx", "r11", "memory");
    else                                           /* getpid through the i386 entry */
        __asm__ volatile ("int $0x80" : "=a"(ret) : "a"(20) : "memory");
    printf("survived %ld\n", ret);
    return 0;
}
"""


@pytest.fixture(scope="module")
def other_abi_binary(world):
    """A program making a system call through the i386 entry (int 0x80) or with x32 numbers: a filter
    written for the native numbers alone would let such a call past its rules."""
    if os.uname().machine != "x86_64" or shutil.which("gcc") is None:
        pytest.skip("needs an x86_64 host with gcc (the other ABIs are x86-specific)")
    exe = world / "other_abi"
    (world / "other_abi.c").write_text(OTHER_ABI_C)
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(world / "other_abi.c")], check=True, timeout=120)
    os.chmod(exe, 0o755)
    host = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    if not host.stdout.startswith("survived"):
        pytest.skip(f"this kernel has no i386 entry to probe ({host.returncode}, {host.stdout!r})")
    return exe


@pytest.mark.parametrize("mode", MODES)
def test_system_calls_through_another_abi_kill_the_caller(world, mode, other_abi_binary):
    out = drive(world, mode, f"""
        binary = open({str(other_abi_binary)!r}, "rb").read()
        with Sandbox(SandboxLimits()) as sb:
            sb.write_files({{"abi": binary}})
            out["i386"] = res(sb.run("chmod +x abi && exec ./abi", "bash"))
            out["x32"] = res(sb.run("exec ./abi x32", "bash"))
    """)
    for abi in ("i386", "x32"):
        assert "survived" not in out[abi]["stdout"] and out[abi]["exit_code"] == -31, out   # SIGSYS
