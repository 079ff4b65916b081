"""The inside half of the sandbox (see `sandbox.py`): builds the jail and execs the code.

Two modes, chosen by the spec's "mode":

* **run** (`unshare --mount --pid --ipc --uts --fork --kill-child [--net] [--user --map-root-user] --
  python -I -S sandbox_init.py SPEC`, optionally inside a holder's mount and network namespaces via
  `nsenter`): already in fresh namespaces and PID 1 of the new PID namespace, it
  1. joins the sandbox's cgroups (when the host made any);
  2. mounts a small tmpfs as the new root and bind-mounts, read-only (nosuid, nodev), only what the
     interpreters need (`/usr`, the Python prefix, the /bin, /lib... symlinks), plus
     /dev/{null,zero,random,urandom} (and /dev/shm, a link to /tmp), a private /proc, a size- and
     inode-limited tmpfs /tmp, and the writable area at /sandbox (the holder's tmpfs, or a fresh
     size- and inode-limited tmpfs filled from the host's staging folder); then remounts the root
     read-only;
  3. `pivot_root`s into it and detaches the old root: no path leads back to the host's files, so
     the chroot/chdir('..') climb has nowhere to go;
  4. forks the code's process, which makes itself the OOM killer's first choice, sets the resource
     limits, drops to the sandbox's uid (as root), empties every capability set (bounding and
     ambient included), sets `no_new_privs`, loads the seccomp filter (BPF built on the host by
     libseccomp) and execs the interpreter;
  5. drops its own privileges the same way and stays PID 1: reaps orphans until the code's process
     ends, writes its status (`{"exit_code": n}`, negative = killed by signal n) to the status pipe
     and exits, which makes the kernel kill every process left in the namespace.
* **hold** (`unshare --mount --net [--user --map-root-user] -- python -I -S sandbox_init.py SPEC`):
  mounts the writable area (a size- and inode-limited tmpfs) over the host's area folder in its own
  mount namespace, fills it from the staging folder, prints `ready`, drops its privileges and waits
  for its standard input to close (the host's lifeline). Runs enter its namespaces, so the area (and
  what the code wrote there) lives as long as the holder, in memory bounded by the tmpfs, and goes
  with it.

Stdlib only and no package imports: it runs with `-I -S` before anything else is available.
A failure while building the jail exits with status 125 and a line starting with `INIT_ERROR`.
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys

INIT_ERROR = "openclaw-sandbox-init:"

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP = 1, 24
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 22, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# pivot_root has no glibc wrapper; its number per architecture
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

_libc = ctypes.CDLL(None, use_errno=True)


def _b(value):
    return None if value is None else value.encode()


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source, target, fstype, flags, data=None):
    _check(_libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
           f"mount({source!r}, {target!r}, {fstype!r})")


def bind(source, target, *, readonly, extra=0):
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:  # a file, a device or a socket: bound onto an empty file
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "w").close()
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | (MS_RDONLY if readonly else 0) | MS_NOSUID | extra)


def mount_area(target, area, uid, mode):
    """A tmpfs bounded in bytes and in inodes (files, folders and links together) at `target`."""
    owner = f",uid={uid},gid={uid}" if uid is not None else ""
    os.makedirs(target, exist_ok=True)
    mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={int(area['bytes'])},nr_inodes={int(area['files'])},mode={mode}{owner}")


def populate(staging, target, uid):
    """Copy the host's staging folder into the area: folders, regular files and symbolic links as
    they are (owned by `uid`); a unix socket (the GUI's X server) is bound in, not copied."""
    for dirpath, dirnames, filenames in os.walk(staging):
        rel = os.path.relpath(dirpath, staging)
        dest_dir = target if rel == "." else os.path.join(target, rel)
        for name in dirnames + filenames:
            src, dest = os.path.join(dirpath, name), os.path.join(dest_dir, name)
            st = os.lstat(src)
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(dest, 0o755)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dest)
            elif stat.S_ISREG(st.st_mode):
                with open(src, "rb") as fin, open(dest, "wb") as fout:
                    while True:
                        chunk = fin.read(1 << 20)
                        if not chunk:
                            break
                        fout.write(chunk)
                os.chmod(dest, stat.S_IMODE(st.st_mode) & 0o755 | 0o600)
            elif stat.S_ISSOCK(st.st_mode):
                bind(src, dest, readonly=True, extra=MS_NODEV | MS_NOEXEC)
                continue
            else:
                continue  # fifos and devices are not carried in
            if uid is not None:
                os.lchown(dest, uid, uid)


def join_cgroups(procs_files):
    for path in procs_files:  # "0" moves the writer; its children are born inside
        with open(path, "w") as f:
            f.write("0")


def build(spec):
    """The new root (see the module's docstring, step 2), not yet entered."""
    root, uid = spec["root"], spec.get("uid")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates back to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=256,mode=755")
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
    os.symlink("/tmp", root + "/dev/shm")  # POSIX shared memory and semaphores, within /tmp's bounds
    area = spec["area"]
    if "holder_path" in area:  # the holder's tmpfs: what earlier runs left there stays
        bind(area["holder_path"], root + "/sandbox", readonly=False, extra=MS_NODEV)
    else:
        mount_area(root + "/sandbox", area, uid, "0755")
        populate(area["staging"], root + "/sandbox", uid)
    mount_area(root + "/tmp", spec["tmp"], None, "1777")
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=256,mode=755")


def enter(root):
    """pivot_root into `root` and detach the old root: it is no longer reachable from any path."""
    nr = SYS_PIVOT_ROOT.get(os.uname().machine)
    if nr is None:
        raise OSError(f"no pivot_root syscall number known for {os.uname().machine}")
    os.chdir(root)
    _check(_libc.syscall(nr, b".", b"."), "pivot_root")   # the old root now sits under the new one
    _check(_libc.umount2(b".", MNT_DETACH), "umount2(old root)")
    os.chdir("/")


def limit(spec):
    lim = spec["limits"]
    for res, value in ((resource.RLIMIT_CPU, lim["cpu_s"]), (resource.RLIMIT_AS, lim["memory_bytes"]),
                       (resource.RLIMIT_FSIZE, lim["file_size_bytes"]), (resource.RLIMIT_NPROC, lim["max_processes"]),
                       (resource.RLIMIT_NOFILE, lim["max_open_files"]), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (int(value), int(value)))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def drop_privileges(spec):
    """No way back to any privilege: the sandbox's uid (as root), every capability set empty, the
    bounding set included (so even an exec as uid 0 gains nothing), `no_new_privs`, then seccomp."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:  # until EINVAL past the last capability
        cap += 1
    if ctypes.get_errno() != 22 or cap == 0:
        raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(ctypes.get_errno())}")
    uid = spec.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(int(uid), int(uid), int(uid))
        os.setresuid(int(uid), int(uid), int(uid))
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT_CLEAR_ALL)")
    header, data = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset(0)")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    bpf = bytes.fromhex(spec["seccomp_bpf"])
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.addressof(buf))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "prctl(PR_SET_SECCOMP)")
    # credential changes clear the parent-death signal; re-arm it
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def _fail(err):
    sys.stderr.write(f"{INIT_ERROR} {type(err).__name__}: {err}\n")
    sys.stderr.flush()
    os._exit(125)


def child(spec):
    try:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):  # Python's own choices, not the code's
            signal.signal(sig, signal.SIG_DFL)
        with open("/proc/self/oom_score_adj", "w") as f:  # the first to go when memory runs out, not its init
            f.write("1000")                               # nor a host process; it cannot lower this again
        limit(spec)
        drop_privileges(spec)
        argv = spec["argv"]
        os.execve(argv[0], argv, spec["env"])
    except Exception as err:  # noqa: BLE001 - report any set-up failure to the caller, then stop
        _fail(err)


def run_main(spec):
    try:
        status_fd = int(spec["status_fd"])
        os.set_inheritable(status_fd, False)
        join_cgroups(spec.get("cgroup_procs", []))
        build(spec)
        enter(spec["root"])
        os.chdir("/sandbox")
    except Exception as err:  # noqa: BLE001
        _fail(err)
    pid = os.fork()
    if pid == 0:
        child(spec)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the code may signal its PID 1; nothing stops it
        drop_privileges(spec)  # PID 1 keeps nothing the code lacks
    except Exception as err:  # noqa: BLE001
        os.kill(pid, signal.SIGKILL)
        _fail(err)
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


def hold_main(spec):
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        area = spec["area"]
        mount_area(area["holder_path"], area, spec.get("uid"), "0755")
        populate(area["staging"], area["holder_path"], spec.get("uid"))
        drop_privileges(spec)
    except Exception as err:  # noqa: BLE001
        _fail(err)
    os.write(1, b"ready\n")
    try:
        while os.read(0, 4096):  # the host's lifeline: its end (close, or the host's death) ends us
            pass
    finally:
        os._exit(0)


def main():
    try:
        spec = json.loads(sys.argv[1])
    except Exception as err:  # noqa: BLE001
        _fail(err)
    if spec.get("mode") == "hold":
        hold_main(spec)
    run_main(spec)


if __name__ == "__main__":
    main()
