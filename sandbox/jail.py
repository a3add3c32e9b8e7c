"""OS isolation for every process that runs candidate code, with a well-kept tool: bubblewrap, else util-linux.

`detect()` picks a mode once per process by running `python -c pass` jailed (a tool can be installed and still
fail: no namespaces, no permission, a path the sandbox cannot reach); `KLOOP_ISOLATION=bwrap|unshare|none`
forces one (an error if it does not work), `KLOOP_BWRAP` names the bwrap binary (else `bwrap` on PATH).
`command()` wraps an argv for that mode and `spawn()` starts it. The modes, strongest first:

bwrap     New PID (own /proc: no other process, nothing of the caller's /proc), network (loopback only), IPC,
          UTS and cgroup namespaces, a new session (no terminal to inject keystrokes into). The file system is
          empty but for read-only binds of /usr (which holds /usr/local: CUDA, the driver), /opt, the /lib /lib64
          /bin /sbin links, a few /etc files (the rest of /etc often holds world-readable credentials, e.g.
          /etc/environment), the Python prefixes and site-packages, and the caller's `readable` paths (code
          packages only, never the repo root: the run databases and the rest of /work, /root and /home stay
          invisible); a private /dev (null, zero, random, tty, pts), tmpfs /tmp and /dev/shm; the work directory
          is the only host path it can write. With `gpu`, the /dev/nvidia* nodes (with /dev/nvidia-caps) and a
          read-only /sys are added; the fresh /proc already shows /proc/driver/nvidia (not per namespace).
unshare   util-linux `unshare --pid --fork --kill-child --mount-proc --net --ipc --uts`: the same namespaces,
          but the host file system stays visible: world-readable files are readable, /tmp and /dev/shm are the
          host's, and jails can reach each other's work directories. The Python and the code must be reachable
          by uid 65534 (a pyenv under /root is not: the mode then fails its probe).
none      Nothing but the rlimits: the code runs as the caller, sees its files, processes and network; only the
          direct child gets SIGKILL when the caller dies. `Isolation.note` says so in one line.

In both jails the tool runs as root and `setpriv` then drops the program to the real uid/gid 65534 (nobody)
with no capabilities, an empty bounding set and no_new_privs; the work directory is chowned to 65534. Not a
user namespace (`bwrap --unshare-user --uid 65534`, `unshare --map-root-user`): started by root, it maps the
sandbox uid to kernel uid 0, so the kernel checks file access as root's (owner rights on every root-owned file
in view; in unshare mode, write access to them) and exempts the jail from RLIMIT_NPROC (root's user is never
limited). The price: the jail may create user namespaces of its own, like any unprivileged user.

Limits are set by util-linux `prlimit` as the program right before `argv`, soft = hard, so they bind the
sandboxed process and everything it starts, and a process without CAP_SYS_RESOURCE cannot raise them.
`memory_bytes` is RLIMIT_AS without a GPU; with one it is RLIMIT_DATA, because CUDA reserves huge address ranges
(PROT_NONE or shared device mappings, which RLIMIT_DATA does not count; a CUDA-less torch import works under it).
RLIMIT_NPROC counts threads too, of all processes of uid 65534: every jail on the host together. Core dumps are
always off.

Lifetime. Everything a jail starts dies with it: when the jailed program exits, bwrap's init (pid 1) is killed,
and in unshare mode the program is pid 1 itself; either way the kernel then kills every process of the PID
namespace, setsid double forks included. Nothing survives the caller: bwrap's --die-with-parent and `setpriv
--pdeathsig KILL` (unshare, none) use PR_SET_PDEATHSIG, which fires when the *thread* that forked the child
exits, not only the process, and is set a few milliseconds after the fork (a caller killed within them leaves
that jail running until it exits). So callers must start jails from a long-lived thread: `spawn()` forks every
one from one dedicated thread of this module, which ends only when the interpreter shuts down.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import os
import shutil
import site
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MODES = ("bwrap", "unshare", "none")
SANDBOX_ID = 65534  # nobody / nogroup
SYSTEM_LINKS = ("/lib", "/lib64", "/bin", "/sbin")  # links into /usr on merged-/usr systems, else directories
# What the dynamic loader, ldconfig -p (triton finds libcuda with it), getpwuid, gcc's `cc` and time zones read.
# No TLS certificates or resolver files: there is no network.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "hosts",
             "localtime", "alternatives")
PROBE_TIMEOUT_S = 60


@dataclass(frozen=True)
class Isolation:
    mode: str          # "bwrap", "unshare" or "none"
    tool: str | None   # the bwrap or unshare binary; None in mode none
    note: str          # one line: what isolates, or what is missing and what is weaker


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None = 8 << 30  # RLIMIT_AS; RLIMIT_DATA when gpu (see the module docstring)
    file_bytes: int | None = 2 << 30    # RLIMIT_FSIZE: a runaway output cannot fill the disk
    cpu_seconds: int | None = None      # RLIMIT_CPU sums all threads; callers' wall-clock deadlines come first
    processes: int | None = 4096        # RLIMIT_NPROC: threads of all jails together (torch starts one per core)
    open_files: int | None = 4096       # RLIMIT_NOFILE

    @classmethod
    def holding(cls, state_bytes: int, io_bytes: int = 0) -> "Limits":
        """The defaults, with memory for a target's weights twice over: a candidate builds its model on the host
        before moving it to the GPU (KernelBench's convention; an 8 GiB MLP exists), and may keep a second layout.
        io_bytes: inputs and outputs kept in host memory (a planner without a device), room for them three times
        over (forward's own buffers beside them)."""
        base = cls()
        return dataclasses.replace(base, memory_bytes=base.memory_bytes + 2 * state_bytes + 3 * io_bytes)


def detect() -> Isolation:
    """The strongest mode that works here (or the one KLOOP_ISOLATION forces); probed once per process."""
    forced = os.environ.get("KLOOP_ISOLATION", "").strip()
    if forced not in ("", *MODES):
        raise ValueError(f"KLOOP_ISOLATION={forced!r} is not one of {', '.join(MODES)}")
    return _detect(forced, os.environ.get("KLOOP_BWRAP", ""))


_NOTES = {
    "bwrap": "bubblewrap ({tool}): uid 65534 without capabilities in its own PID, network, IPC and UTS "
             "namespaces; read-only system and Python trees, only its work directory writable",
    "unshare": "util-linux unshare ({tool}): uid 65534 without capabilities in its own PID, network, IPC and UTS "
               "namespaces, but the host file system stays visible (world-readable files readable, /tmp and "
               "/dev/shm shared)",
}


@functools.lru_cache(maxsize=None)
def _detect(forced: str, bwrap_env: str) -> Isolation:
    if forced == "none":
        return Isolation("none", None, "KLOOP_ISOLATION=none: candidate code runs as this user with its files, "
                                       "processes and network; only rlimits apply")
    failures = []
    for mode in [forced] if forced else ["bwrap", "unshare"]:
        tool, problem = _find_tool(mode, bwrap_env)
        problem = problem or _probe(Isolation(mode, tool, ""))
        if problem is None:
            return Isolation(mode, tool, "; ".join([*failures, _NOTES[mode].format(tool=tool)]))
        if forced:
            raise RuntimeError(f"KLOOP_ISOLATION={forced} does not work here: {problem}")
        failures.append(f"{mode} unusable: {problem}")
    return Isolation("none", None, "; ".join([*failures, "no OS isolation: candidate code runs as this user with "
                                              "its files, processes and network; only rlimits apply"]))


def _find_tool(mode: str, bwrap_env: str) -> tuple[str | None, str | None]:
    tool = shutil.which(mode)
    if mode == "bwrap" and bwrap_env:
        tool = bwrap_env if os.access(bwrap_env, os.X_OK) else None
        if tool is None:
            return None, f"KLOOP_BWRAP={bwrap_env} is not an executable"
    if tool is None:
        return None, f"no {mode} on PATH" + (" (install bubblewrap or set KLOOP_BWRAP)" if mode == "bwrap" else "")
    if os.geteuid() != 0:
        return None, "kloop is not root, and the jail starts as root to drop to uid 65534"
    return tool, None


def _probe(isolation: Isolation) -> str | None:
    """None if `python -c pass` runs jailed, else the last line of what went wrong."""
    with tempfile.TemporaryDirectory(prefix="kloop-jail-probe-") as workdir:
        argv = command([sys.executable, "-c", "pass"], workdir=Path(workdir), readable=[], gpu=False,
                       limits=Limits(), isolation=isolation)
        try:
            done = subprocess.run(argv, cwd=workdir, env={"PATH": os.defpath}, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"a jailed `python -c pass` took over {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"a jailed `python -c pass` exited with {done.returncode}"


def command(argv: list[str], *, workdir: Path, readable: list[Path], gpu: bool, limits: Limits,
            isolation: Isolation) -> list[str]:
    """The argv that runs `argv` jailed in `isolation.mode`, with `workdir` its only writable host directory
    (chowned to uid 65534 in the bwrap and unshare modes).

    `argv` should run this interpreter (its prefixes are what bwrap binds). Descriptors the caller hands to `spawn`
    (pass_fds) need no naming here: every mode keeps inherited descriptors. The environment is the caller's `env=`
    plus, in bwrap mode, PWD (the work directory).
    """
    jailed = _prlimit(limits, gpu) + list(argv)
    if isolation.mode == "none":
        return [_util("setpriv"), "--pdeathsig", "KILL", "--", *jailed]
    os.chown(workdir, SANDBOX_ID, SANDBOX_ID)
    # A change of uid clears PR_SET_PDEATHSIG: "keep" holds on to what the tool set (unshare's --kill-child).
    unprivileged = [_util("setpriv"), f"--reuid={SANDBOX_ID}", f"--regid={SANDBOX_ID}", "--clear-groups",
                    "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--pdeathsig", "keep", "--"]
    if isolation.mode == "bwrap":
        return [isolation.tool, *_bwrap_options(Path(workdir), readable, gpu), "--", *unprivileged, *jailed]
    if isolation.mode == "unshare":
        return [_util("setpriv"), "--pdeathsig", "KILL", "--", isolation.tool, "--pid", "--fork", "--kill-child",
                "--mount-proc", "--net", "--ipc", "--uts", "--", *unprivileged, *jailed]
    raise ValueError(f"unknown isolation mode {isolation.mode!r}")


def _bwrap_options(workdir: Path, readable: list[Path], gpu: bool) -> list[str]:
    opts = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "kloop", "--die-with-parent", "--new-session",
            # Only what bwrap needs to enter the 0700 work directory of uid 65534, and setpriv to become that uid
            # (which drops them all).
            "--cap-drop", "ALL", "--cap-add", "CAP_DAC_OVERRIDE", "--cap-add", "CAP_SETUID", "--cap-add",
            "CAP_SETGID", "--cap-add", "CAP_SETPCAP",
            "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777",
            "--tmpfs", "/dev/shm"]
    host_trees = ["/proc", "/dev"]  # mounted with their content
    made = {"/", "/tmp", "/dev/shm"}

    def add(op: str, source: str, dest: str) -> None:
        for parent in map(str, reversed(Path(dest).parents)):  # bwrap would make them 0700: closed to uid 65534
            if parent not in made and not _inside(parent, host_trees):
                opts.extend(["--perms", "0755", "--dir", parent])
                made.add(parent)
        opts.extend([op, source, dest])
        host_trees.append(dest)

    # Later mounts go on top of earlier ones: the work directory last, so it stays writable wherever it lies.
    system = ["/usr", *SYSTEM_LINKS, *(f"/etc/{name}" for name in ETC_FILES), "/opt"]
    for path in system:
        if os.path.islink(path):
            add("--symlink", os.readlink(path), path)  # its target is bound (or absent) on its own
        elif os.path.exists(path):
            add("--ro-bind", path, path)
    for path in _outermost(_python_paths(), covered=system):
        add("--ro-bind", path, path)
    if gpu:
        for node in sorted(glob.glob("/dev/nvidia*")):
            add("--dev-bind", node, node)
        add("--ro-bind", "/sys", "/sys")
    for path in map(str, readable):
        add("--ro-bind", path, path)
    add("--bind", str(workdir), str(workdir))
    return opts + ["--chdir", str(workdir)]


def _inside(path: str, trees: list[str]) -> bool:
    return any(path == tree or path.startswith(tree.rstrip("/") + "/") for tree in trees)


def _python_paths() -> list[str]:
    """Where this interpreter, its standard library and its packages live (a venv and the Python it points to)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(),
             os.path.dirname(os.path.realpath(sys.executable))}
    return [p for p in {*paths, *map(os.path.realpath, paths)} if os.path.isdir(p)]


def _outermost(paths: list[str], covered: list[str]) -> list[str]:
    """`paths` less those inside another one or inside `covered`, sorted."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not _inside(path, [*covered, *kept]):
            kept.append(path)
    return sorted(kept)


def _prlimit(limits: Limits, gpu: bool) -> list[str]:
    args = [_util("prlimit"), "--core=0"]
    if limits.memory_bytes is not None:
        args.append(f"--{'data' if gpu else 'as'}={limits.memory_bytes}")
    for flag, value in (("fsize", limits.file_bytes), ("cpu", limits.cpu_seconds),
                        ("nproc", limits.processes), ("nofile", limits.open_files)):
        if value is not None:
            args.append(f"--{flag}={value}")
    return args + ["--"]


def _util(name: str) -> str:
    """A util-linux program; in bwrap mode it must lie under /usr, which the jail sees."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} (util-linux) is not on PATH; kloop needs it to start jailed processes")
    return path


_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def spawn(argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """subprocess.Popen(argv, **popen_kwargs), forked from this module's one long-lived thread (see the module
    docstring: a jail forked from a short-lived thread would be killed when that thread ends). The child gets a
    session of its own unless `start_new_session=False` is given."""
    global _spawner
    popen_kwargs.setdefault("start_new_session", True)
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kloop-jail-spawner")
    return _spawner.submit(subprocess.Popen, argv, **popen_kwargs).result()
