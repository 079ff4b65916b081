"""The inside half of the sandbox (see `sandbox.py`): builds the jail and execs the code.

Run by `sandbox.py` as `unshare --mount --net --pid --ipc --uts --fork --kill-child -- python -I -S
sandbox_init.py SPEC_JSON`, i.e. already in fresh mount, network, PID, IPC and UTS namespaces and as
PID 1 of the new PID namespace. It then

1. mounts a small tmpfs as the new root and bind-mounts, read-only (nosuid, nodev), only what the
   interpreters need (`/usr`, the Python prefix, and the /bin, /lib... symlinks), plus
   /dev/{null,zero,random,urandom}, a private /proc, a size-limited tmpfs /tmp and the sandbox
   directory at /sandbox (read-write, nosuid, nodev); then remounts the root read-only;
2. chroots into it and changes to /sandbox;
3. sets the resource limits (CPU seconds, address space, file size, processes, open files, no core);
4. forks the code's process, which sets the resource limits (CPU seconds, address space, file size,
   processes, open files, no core), drops to an unprivileged uid/gid chosen by the caller when
   started as real root (no supplementary groups), re-arms the parent-death signal (credential
   changes clear it) and execs the interpreter;
5. stays PID 1: reaps orphans until the code's process ends, writes its status (`{"exit_code": n}`,
   negative = killed by signal n) to the status pipe and exits, which makes the kernel kill every
   process left in the namespace.

Stdlib only and no package imports: it runs with `-I -S` before anything else is available.
A failure while building the jail exits with status 125 and a line starting with `INIT_ERROR`.
"""

import ctypes
import json
import os
import resource
import signal
import sys

INIT_ERROR = "openclaw-sandbox-init:"

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def _b(value):
    return None if value is None else value.encode()


def mount(source, target, fstype, flags, data=None):
    if _libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount({source!r}, {target!r}, {fstype!r}): {os.strerror(err)}")


def bind(source, target, *, readonly, extra=0):
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "w").close()
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | (MS_RDONLY if readonly else 0) | MS_NOSUID | extra)


def build(spec):
    root = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates back to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path in spec["ro_paths"]:
        target = root + path
        if os.path.islink(path):  # /bin -> usr/bin on merged-/usr systems
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.lexists(target):
                os.symlink(os.readlink(path), target)
        elif os.path.exists(path) and not os.path.lexists(target):
            bind(path, target, readonly=True, extra=MS_NODEV)
    for dev in ("null", "zero", "random", "urandom"):
        bind("/dev/" + dev, root + "/dev/" + dev, readonly=False, extra=MS_NOEXEC)
    bind(spec["workdir"], root + "/sandbox", readonly=False, extra=MS_NODEV)
    os.makedirs(root + "/tmp", exist_ok=True)
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(spec['tmp_mb'])}m,mode=1777")
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    os.chroot(root)
    os.chdir("/sandbox")


def limit(spec):
    lim = spec["limits"]
    for res, value in ((resource.RLIMIT_CPU, lim["cpu_s"]), (resource.RLIMIT_AS, lim["memory_bytes"]),
                       (resource.RLIMIT_FSIZE, lim["file_size_bytes"]), (resource.RLIMIT_NPROC, lim["max_processes"]),
                       (resource.RLIMIT_NOFILE, lim["max_open_files"]), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (int(value), int(value)))


def drop_privileges(spec):
    uid = spec.get("uid")
    if uid is None:
        return
    os.setgroups([])
    os.setgid(int(uid))
    os.setuid(int(uid))


def _fail(err):
    sys.stderr.write(f"{INIT_ERROR} {type(err).__name__}: {err}\n")
    sys.stderr.flush()
    os._exit(125)


def child(spec):
    try:
        limit(spec)
        drop_privileges(spec)
        if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        argv = spec["argv"]
        os.execve(argv[0], argv, spec["env"])
    except Exception as err:  # noqa: BLE001 - report any set-up failure to the caller, then stop
        _fail(err)


def main():
    try:
        spec = json.loads(sys.argv[1])
        status_fd = int(spec["status_fd"])
        os.set_inheritable(status_fd, False)
        build(spec)
    except Exception as err:  # noqa: BLE001
        _fail(err)
    pid = os.fork()
    if pid == 0:
        child(spec)
    while True:  # PID 1 reaps every orphan; the run ends with the code's own process
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(125)
        if done == pid:
            break
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    os.write(status_fd, json.dumps({"exit_code": code}).encode())
    os._exit(0)


if __name__ == "__main__":
    main()
