"""The sandbox's seccomp filter: the system calls untrusted code never needs and a jail must refuse.

Built with libseccomp (through `pyseccomp`, a ctypes binding) on the host and exported as a raw BPF
program, which the jail's init (stdlib only) loads with `prctl(PR_SET_SECCOMP)` after
`no_new_privs`. libseccomp resolves the names for this architecture and emits the architecture
check: a system call made through another ABI (i386 `int 0x80`, x32 numbers on x86_64) kills the
process instead of slipping past a rule written for the native numbers.

Everything not named here is allowed (the jail's other walls hold the rest): the filter closes the
kernel interfaces that turn a contained process back into a privileged one or reach past the jail.
"""

from __future__ import annotations

import errno
import functools
import logging
import tempfile

log = logging.getLogger(__name__)

# Refused with EPERM.
DENIED = (
    # mounts and roots: the jail's file view is final
    "mount", "umount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr",
    # namespaces: no new ones (clone's flags are checked below), no joining others
    "unshare", "setns",
    # other processes' memory and state
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    # kernel keyrings, eBPF, performance counters, io_uring (each a large kernel attack surface)
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # memory outside any address space (not counted by RLIMIT_AS when no cgroup bounds the sandbox)
    "memfd_create", "memfd_secret", "shmget",
    # the machine itself
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "uselib", "vhangup",
    "nfsservctl",
)
# clone(2) flags that make a namespace; clone with any of them is refused. clone3 passes its flags in
# memory a filter cannot read, so it answers ENOSYS and the C library falls back to clone.
NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                   "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080}


class SeccompUnavailable(RuntimeError):
    """libseccomp (the system library) or its binding is missing."""


@functools.lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The filter as a BPF program (struct sock_filter[]), built once per process."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as err:  # the binding loads libseccomp.so.2 at import
        raise SeccompUnavailable(f"the sandbox's seccomp filter needs libseccomp ({err}); install it with "
                                 "`apt-get install libseccomp2` and `pip install pyseccomp`") from err
    flt = sc.SyscallFilter(sc.ALLOW)
    skipped = []
    for name in DENIED:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) < 0:
            skipped.append(name)  # not a system call on this architecture (or unknown to this libseccomp)
            continue
        flt.add_rule(sc.ERRNO(errno.EPERM), name)
    for flag in NAMESPACE_FLAGS.values():
        flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    if sc.resolve_syscall(sc.Arch.NATIVE, "clone3") >= 0:
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    if skipped:
        log.debug("seccomp: not system calls here: %s", ", ".join(skipped))
    with tempfile.TemporaryFile() as out:
        flt.export_bpf(out)
        out.seek(0)
        program = out.read()
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported a malformed filter of {len(program)} bytes")
    return program


__all__ = ["DENIED", "NAMESPACE_FLAGS", "SeccompUnavailable", "filter_bpf"]
