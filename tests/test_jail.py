"""sandbox/jail.py: what a jailed process can see and do, and that nothing it starts outlives it or its caller.

Each test runs a small `python -c` program jailed in every mode that works here (bwrap, unshare); a mode that
does not work is skipped. Work directories are made under /tmp by hand: pytest's tmp_path lies under a 0700
directory that uid 65534 cannot enter in unshare mode.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sandbox import jail

REPO = Path(__file__).resolve().parent.parent
ENV = {"PATH": "/usr/bin:/bin"}
# Beats every 0.1 s into ./hb (atomically, so a reader never sees a half-written beat).
HEARTBEAT = textwrap.dedent("""
    import os, time
    def beat():
        n = 0
        while True:
            n += 1
            with open("hb.tmp", "w") as f:
                f.write(str(n))
            os.replace("hb.tmp", "hb")
            time.sleep(0.1)
""")


def _usable(mode: str) -> tuple[jail.Isolation, str] | str:
    """The isolation of `mode` and a Python that starts in it, or why there is none."""
    tool = (os.environ.get("KLOOP_BWRAP") or shutil.which("bwrap")) if mode == "bwrap" else shutil.which(mode)
    if not tool:
        return f"no {mode} here"
    isolation = jail.Isolation(mode, tool, "")
    # In unshare mode uid 65534 may not reach this interpreter (a pyenv under /root); the system one will do.
    for python in [sys.executable, *(["/usr/bin/python3"] if mode == "unshare" else [])]:
        workdir = Path(tempfile.mkdtemp(prefix="kloop-jail-test-"))
        try:
            argv = jail.command([python, "-c", "pass"], workdir=workdir, readable=[], gpu=False,
                                limits=jail.Limits(), isolation=isolation)
            if subprocess.run(argv, env=ENV, cwd=workdir, capture_output=True, timeout=60).returncode == 0:
                return isolation, python
        finally:
            shutil.rmtree(workdir)
    return f"{mode} does not start a Python here"


USABLE = {mode: _usable(mode) for mode in ("bwrap", "unshare")}


@pytest.fixture(params=["bwrap", "unshare"])
def setup(request) -> tuple[jail.Isolation, str]:
    found = USABLE[request.param]
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="kloop-jail-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_jailed(setup, code: str, workdir: Path, *, readable=(), gpu=False, limits=jail.Limits(), env=ENV,
               pass_fds=(), timeout=60) -> dict:
    """Runs `code` jailed and returns the JSON object it prints last."""
    isolation, python = setup
    argv = jail.command([python, "-c", textwrap.dedent(code)], workdir=workdir,
                        readable=list(readable), gpu=gpu, limits=limits, isolation=isolation)
    proc = jail.spawn(argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, pass_fds=pass_fds, text=True)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def beating(hb: Path) -> bool:
    """Whether the writer of heartbeat file `hb` (one beat per 0.1 s) still beats."""
    before = hb.read_text()
    time.sleep(0.4)
    return hb.read_text() != before


def stops_beating(hb: Path, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not beating(hb):
            return True
    return False


def test_detect_modes(monkeypatch):
    monkeypatch.setenv("KLOOP_ISOLATION", "none")
    none = jail.detect()
    assert (none.mode, none.tool) == ("none", None) and none.note.endswith("only rlimits apply")
    monkeypatch.setenv("KLOOP_ISOLATION", "chroot")
    with pytest.raises(ValueError, match="KLOOP_ISOLATION='chroot' is not one of bwrap, unshare, none"):
        jail.detect()
    monkeypatch.setenv("KLOOP_ISOLATION", "bwrap")
    monkeypatch.setenv("KLOOP_BWRAP", "/nonexistent/bwrap")
    with pytest.raises(RuntimeError, match="KLOOP_BWRAP=/nonexistent/bwrap is not an executable"):
        jail.detect()
    monkeypatch.delenv("KLOOP_ISOLATION")
    fallback = jail.detect()  # the next mode, or none, says why bwrap is not used
    assert fallback.mode != "bwrap" and fallback.note.startswith("bwrap unusable: KLOOP_BWRAP=/nonexistent/bwrap")
    assert "\n" not in fallback.note
    monkeypatch.undo()  # back to how the test run was started (KLOOP_BWRAP may name a carried bwrap)
    found = jail.detect()
    if not os.environ.get("KLOOP_ISOLATION") and not isinstance(USABLE["bwrap"], str):
        assert (found.mode, found.tool) == ("bwrap", USABLE["bwrap"][0].tool)  # the strongest that works wins
    assert found.mode in jail.MODES and found.note and "\n" not in found.note


def test_sees_only_itself(setup, workdir, monkeypatch):
    monkeypatch.setenv("KLOOP_TEST_SECRET", "hunter2")  # the caller's, not given in env
    env = {**ENV, "LANG": "C.UTF-8", "GIVEN": "1"}  # a UTF-8 locale: Python adds LC_CTYPE to a C locale
    read_fd, write_fd = os.pipe()
    seen = run_jailed(setup, f"""
        import json, os, resource
        def try_read(path):
            try:
                open(path, "rb").read()
                return "read"
            except OSError as e:
                return type(e).__name__
        os.write({write_fd}, b"through the passed fd")
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        print(json.dumps(dict(
            pids=sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), me=os.getpid(),
            caller_environ=try_read("/proc/{os.getpid()}/environ"),
            caller_cmdline=try_read("/proc/{os.getpid()}/cmdline"), env=dict(os.environ),
            uid=os.getuid(), gid=os.getgid(), groups=os.getgroups(), caps=status["CapEff"].strip(),
            no_new_privs=status["NoNewPrivs"].strip(), sid=os.getsid(0), cwd=os.getcwd())))
    """, workdir, env=env, pass_fds=(write_fd,))
    os.close(write_fd)
    assert os.read(read_fd, 100) == b"through the passed fd"
    os.close(read_fd)
    assert seen["me"] in seen["pids"] and len(seen["pids"]) <= 2 and max(seen["pids"]) <= 2, seen["pids"]
    assert seen["caller_environ"] in ("FileNotFoundError", "PermissionError")
    assert seen["caller_cmdline"] in ("FileNotFoundError", "PermissionError")
    # Nothing of the caller's; bwrap adds only PWD, the directory it starts in.
    assert seen["env"] == {**env, **({"PWD": str(workdir)} if setup[0].mode == "bwrap" else {})}
    assert (seen["uid"], seen["gid"], seen["groups"]) == (65534, 65534, [])
    assert (seen["caps"], seen["no_new_privs"]) == ("0000000000000000", "1")
    assert seen["cwd"] == str(workdir)
    if setup[0].mode == "bwrap":
        assert seen["sid"] in (1, 2)  # --new-session: a session made inside, with no terminal to inject into


def test_file_system(setup, workdir):
    runs = Path(tempfile.mkdtemp(prefix="kloop-runs-", dir=REPO.parent))  # stands in for runs/: not `readable`
    code = Path(tempfile.mkdtemp(prefix="kloop-code-"))
    outside_tmp = Path(tempfile.mkdtemp(prefix="kloop-tmp-"))
    try:
        (runs / "run.db").write_text("the run's secret seed")
        code.chmod(0o755)
        (code / "tools.py").write_text("x = 1")
        (code / "tools.py").chmod(0o644)
        (outside_tmp / "f").write_text("host /tmp")
        seen = run_jailed(setup, f"""
            import errno, json, os
            def read(path):
                try:
                    return open(path).read()
                except OSError as e:
                    return errno.errorcode[e.errno]
            def write(path):
                try:
                    with open(path, "w") as f:
                        f.write("x")
                    return "written"
                except OSError as e:
                    return errno.errorcode[e.errno]
            def ls(path):
                try:
                    return sorted(os.listdir(path))
                except OSError as e:
                    return errno.errorcode[e.errno]
            print(json.dumps(dict(
                run_db=read("{runs}/run.db"), code=read("{code}/tools.py"), code_write=write("{code}/new.py"),
                code_overwrite=write("{code}/tools.py"), workdir_write=write("{workdir}/out.txt"),
                usr_write=write("/usr/kloop-test"), passwd_write=write("/etc/passwd"),
                shadow=read("/etc/shadow"), repo=ls("{REPO}"), home=ls("/home"),
                host_tmp=read("{outside_tmp}/f"),
                tmp_write=write("/tmp/kloop-test") if {setup[0].mode == "bwrap"} else None,  # not the host's /tmp
                pyproject=read("{REPO}/pyproject.toml"))))
        """, workdir, readable=[code])
    finally:
        for path in (runs, code, outside_tmp):
            shutil.rmtree(path)
    denied = "EROFS" if setup[0].mode == "bwrap" else "EACCES"  # a read-only bind, or the host's permissions
    assert seen["code"] == "x = 1" and seen["code_write"] == seen["code_overwrite"] == denied
    assert seen["usr_write"] == seen["passwd_write"] == denied
    assert seen["workdir_write"] == "written" and (workdir / "out.txt").read_text() == "x"
    if setup[0].mode == "bwrap":  # a private view: only the binds exist
        assert seen["run_db"] == seen["pyproject"] == seen["host_tmp"] == seen["shadow"] == seen["home"] == "ENOENT"
        assert not {"runs", "pyproject.toml", "agent", "sandbox"} & set(seen["repo"])
        assert seen["tmp_write"] == "written"  # its own /tmp
    else:  # the host's files, with uid 65534's rights
        assert seen["run_db"] == seen["shadow"] == "EACCES" and seen["pyproject"] != "EACCES"


def test_cannot_reach_the_gpu_pause_registry(setup, workdir):
    """A jailed candidate that held the registry's lock would hang every trusted timing on its GPU, and one that
    wrote a pause marker or a listing could stop or continue other candidates: it sees none of it."""
    from sandbox import pool

    directory = pool._directory("GPU-jail-test")
    with pool._transition(directory):  # the lock file exists, as on a node that has timed something
        pass
    try:
        seen = run_jailed(setup, f"""
            import errno, fcntl, json, os
            def attempt(action):
                try:
                    action()
                    return "done"
                except OSError as e:
                    return errno.errorcode[e.errno]
            lock = lambda: fcntl.flock(open({str(directory / "lock")!r}), fcntl.LOCK_EX | fcntl.LOCK_NB)  # read-only
            marker = lambda: open({str(directory / "paused-1-1")!r}, "w").write("0")
            print(json.dumps({{"lock": attempt(lock), "marker": attempt(marker),
                               "list": attempt(lambda: os.listdir({str(directory.parent)!r}))}}))
            """, workdir)
        # bwrap: not there (a tmpfs /dev/shm); unshare (the host's /dev/shm): not the sandbox user's to enter
        assert set(seen.values()) <= {"ENOENT", "EACCES"}, seen
        assert sorted(p.name for p in directory.iterdir()) == ["lock"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_no_network(setup, workdir):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        seen = run_jailed(setup, f"""
            import json, socket
            def connect(host, port):
                try:
                    socket.create_connection((host, port), timeout=3).close()
                    return "connected"
                except OSError as e:
                    return type(e).__name__
            print(json.dumps(dict(caller=connect("127.0.0.1", {port}), outside=connect("1.1.1.1", 53),
                                  interfaces=[name for _, name in socket.if_nameindex()])))
        """, workdir)
    # Its own loopback, where nothing listens (bwrap brings lo up: refused; unshare leaves it down: unreachable).
    assert seen["caller"] == ("ConnectionRefusedError" if setup[0].mode == "bwrap" else "OSError")
    assert seen["outside"] == "OSError" and seen["interfaces"] == ["lo"]  # ENETUNREACH at once


def test_setsid_grandchild_dies_with_the_jail(setup, workdir):
    run_jailed(setup, HEARTBEAT + textwrap.dedent("""
        import json, os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # leaves the caller's stdout pipe to the jail
                beat()
            os._exit(0)
        while not os.path.exists("hb"):
            time.sleep(0.01)
        print(json.dumps({}))
    """), workdir)
    assert stops_beating(workdir / "hb", within=2.0)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_jail_dies_with_its_caller(setup, workdir, sig):
    isolation, python = setup
    caller = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, sys, time
        from pathlib import Path
        from sandbox import jail
        argv = jail.command([{python!r}, "-c", {HEARTBEAT + "beat()"!r}], workdir=Path({str(workdir)!r}),
                            readable=[], gpu=False, limits=jail.Limits(),
                            isolation=jail.Isolation({isolation.mode!r}, {isolation.tool!r}, ""))
        jail.spawn(argv, env={ENV!r}, cwd={str(workdir)!r}, stdin=subprocess.DEVNULL)
        time.sleep(60)
    """)], cwd=REPO, env={**ENV, "PYTHONPATH": str(REPO)})
    try:
        wait_for(workdir / "hb")
        assert beating(workdir / "hb")
        caller.send_signal(sig)
        assert stops_beating(workdir / "hb", within=2.0)
    finally:
        caller.kill()
        caller.wait()


def test_limits(setup, workdir):
    limits = jail.Limits(memory_bytes=1 << 30, file_bytes=1 << 20, processes=16, open_files=256)
    code = """
        import errno, json, os, resource, threading, time
        def write_big():
            try:
                with open("big", "wb") as f:
                    f.write(b"x" * (2 << 20))
                return "written"
            except OSError as e:
                return errno.errorcode[e.errno]
        def allocate():
            try:
                return len(bytearray(2 << 30))
            except MemoryError:
                return "MemoryError"
        def raise_limit():
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1 << 16))
                return "raised"
            except (ValueError, OSError) as e:
                return type(e).__name__
        def start_threads(n=40):
            started = 0
            try:
                for _ in range(n):
                    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
                    started += 1
            except RuntimeError:
                pass
            return started
        print(json.dumps(dict(
            big=write_big(), big_size=os.path.getsize("big"), memory=allocate(), raise_limit=raise_limit(),
            threads=start_threads(), limits={name: resource.getrlimit(getattr(resource, "RLIMIT_" + name))
                                             for name in ("AS", "DATA", "FSIZE", "NPROC", "NOFILE", "CORE")})))
    """
    cpu = run_jailed(setup, code, workdir, limits=limits)
    assert cpu["big"] == "EFBIG" and cpu["big_size"] == 1 << 20  # Python ignores SIGXFSZ: the write fails
    assert cpu["memory"] == "MemoryError" and cpu["raise_limit"] == "ValueError"
    assert cpu["threads"] < 16
    assert cpu["limits"]["AS"] == [1 << 30] * 2 and cpu["limits"]["FSIZE"] == [1 << 20] * 2
    assert cpu["limits"]["NPROC"] == [16] * 2 and cpu["limits"]["NOFILE"] == [256] * 2
    assert cpu["limits"]["CORE"] == [0, 0]
    gpu = run_jailed(setup, code, workdir, limits=limits, gpu=True)  # no GPU here: only the limits differ
    assert gpu["memory"] == "MemoryError" and gpu["limits"]["DATA"] == [1 << 30] * 2
    assert gpu["limits"]["AS"] == [resource.RLIM_INFINITY] * 2


def test_spawn_outlives_the_thread_that_asked(setup, workdir):
    isolation, python = setup
    argv = jail.command([python, "-c", HEARTBEAT + "beat()"], workdir=workdir, readable=[], gpu=False,
                        limits=jail.Limits(), isolation=isolation)
    control_dir = Path(tempfile.mkdtemp(prefix="kloop-jail-test-"))
    control_argv = jail.command([python, "-c", HEARTBEAT + "beat()"], workdir=control_dir, readable=[],
                                gpu=False, limits=jail.Limits(), isolation=isolation)
    procs = []

    def start():  # from a short-lived thread: one through spawn, one forked by the thread itself
        procs.append(jail.spawn(argv, env=ENV, cwd=workdir, stdin=subprocess.DEVNULL))
        procs.append(subprocess.Popen(control_argv, env=ENV, cwd=control_dir, stdin=subprocess.DEVNULL))
        time.sleep(0.5)  # lets the control's tool set PR_SET_PDEATHSIG, milliseconds after its exec

    try:
        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
        wait_for(workdir / "hb")
        time.sleep(0.3)
        assert beating(workdir / "hb") and beating(workdir / "hb")
        # The control shows the hazard spawn avoids: PR_SET_PDEATHSIG fired when its forking thread ended.
        assert procs[1].wait(timeout=5) == -signal.SIGKILL
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        shutil.rmtree(control_dir, ignore_errors=True)


def test_torch_and_a_c_build_in_the_jail(workdir):
    """The read-only binds are enough for torch, numpy, triton and the C compiler triton builds launchers with;
    without a GPU under the address-space limit, and CUDA-less under the data limit that a GPU worker gets."""
    if isinstance(USABLE["bwrap"], str):
        pytest.skip(USABLE["bwrap"])
    isolation, _ = USABLE["bwrap"]
    code = textwrap.dedent("""
        import importlib.util, json, os, sys
        import numpy, torch, triton
        from triton.runtime.build import _build
        with open("jailext.c", "w") as f:
            f.write("#include <Python.h>\\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \\"jailext\\"};\\n"
                    "PyMODINIT_FUNC PyInit_jailext(void) { return PyModule_Create(&m); }\\n")
        so = _build("jailext", "jailext.c", os.getcwd(), [], [], [], [])
        spec = importlib.util.spec_from_file_location("jailext", so)
        ext = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ext)
        x = torch.arange(16.0).reshape(4, 4)
        print(json.dumps(dict(sum=float((x @ x).sum()), np=int(numpy.arange(5).sum()), ext=ext.__name__)))
    """)
    procs = []
    for gpu in (False, True):
        wd = workdir / ("gpu" if gpu else "cpu")
        wd.mkdir()
        env = {**ENV, "HOME": str(wd), "TMPDIR": str(wd), "TRITON_CACHE_DIR": str(wd / "triton-cache"),
               "PYTHONDONTWRITEBYTECODE": "1", **({} if gpu else {"TRITON_INTERPRET": "1"})}
        argv = jail.command([sys.executable, "-c", code], workdir=wd, readable=[REPO / "tools"], gpu=gpu,
                            limits=jail.Limits(), isolation=isolation)
        procs.append(jail.spawn(argv, env=env, cwd=wd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:  # both at once: a torch import takes seconds here
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert json.loads(out.splitlines()[-1]) == {"sum": 3920.0, "np": 10, "ext": "jailext"}


@pytest.mark.gpu
def test_cuda_in_the_jail(workdir):
    """On a GPU machine: CUDA, NVML, pinned memory and a Triton kernel work in a bwrap jail with the default
    limits (RLIMIT_DATA, not RLIMIT_AS), as uid 65534."""
    isolation = jail.detect()
    assert isolation.mode == "bwrap", isolation.note
    # A file, not -c: triton.jit reads the kernel's source.
    (workdir / "check.py").write_text(textwrap.dedent("""
        import ctypes, glob, json, os, torch, triton, triton.language as tl

        @triton.jit
        def add_one(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

        def kernel():
            x = torch.zeros(1000, device="cuda")
            add_one[(4,)](x, 1000, BLOCK=256)
            return float(x.sum())

        def nvml():
            lib, count = ctypes.CDLL("libnvidia-ml.so.1"), ctypes.c_uint()
            return (lib.nvmlInit_v2(), lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value)

        checks = dict(kernel=kernel, nvml=nvml, devices=torch.cuda.device_count,
                      device_4gib=lambda: torch.empty(1 << 30, device="cuda").numel(),
                      pinned_1gib=lambda: torch.empty(1 << 28, pin_memory=True).numel(),
                      driver=lambda: os.path.isdir("/proc/driver/nvidia"),
                      nodes=lambda: sorted(glob.glob("/dev/nvidia*")))
        results = {}
        for name, check in checks.items():
            try:
                results[name] = check()
            except Exception as e:
                results[name] = f"{type(e).__name__}: {e}"
        print(json.dumps(results))
    """))
    env = {k: os.environ[k] for k in ("PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
                                      "TRITON_PTXAS_PATH") if k in os.environ}
    env.update(HOME=str(workdir), TMPDIR=str(workdir), TRITON_CACHE_DIR=str(workdir / "triton-cache"))
    argv = jail.command([sys.executable, "check.py"], workdir=workdir, readable=[REPO / "tools"], gpu=True,
                        limits=jail.Limits(), isolation=isolation)
    proc = jail.spawn(argv, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    seen = json.loads(out.splitlines()[-1])
    assert seen["kernel"] == 1000.0 and seen["devices"] >= 1 and seen["driver"] is True, seen
    assert seen["nvml"][:2] == [0, 0] and seen["nvml"][2] >= 1, seen
    assert seen["device_4gib"] == 1 << 30 and seen["pinned_1gib"] == 1 << 28, seen
    assert "/dev/nvidiactl" in seen["nodes"] and "/dev/nvidia-uvm" in seen["nodes"], seen


def test_scratch_goes_to_ram_only_when_dev_shm_can_hold_a_large_target(monkeypatch):
    """A container's 64 MB /dev/shm would refuse a weight's state files: the temp dir instead. Decided by the mount's
    size, never its free space, so every session of a node agrees on the root (the GPU users' registry lives there)."""
    import collections

    from sandbox import process

    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)):
        pytest.skip("no writable /dev/shm here")
    monkeypatch.delenv("KLOOP_SCRATCH", raising=False)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(64 << 20, 0, 64 << 20))
    assert process.scratch_root() == Path(tempfile.gettempdir())
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(64 << 30, 63 << 30, 1 << 30))   # nearly full
    assert process.scratch_root() == Path("/dev/shm")


def test_a_target_with_large_weights_gets_a_process_with_room_for_them():
    """The warm spares have the default memory limit; a planner for a target holding 4 GiB of weights is started
    with room for them twice (a candidate builds its model on the host first)."""
    from sandbox.pool import WarmPool
    from sandbox.process import descendants

    holding = jail.Limits.holding(4 << 30)
    assert holding.memory_bytes == (8 << 30) + (8 << 30) and holding.file_bytes == jail.Limits().file_bytes
    pool = WarmPool(spares=1)
    try:
        spare = pool.acquire("planner")
        roomy = pool.acquire("planner", limits=holding)
        assert roomy not in pool._idle and len(pool._idle) == 1

        def memory_limits(child):
            limits = set()
            for pid in [child.proc.pid, *descendants(child.proc.pid)]:
                text = Path(f"/proc/{pid}/limits").read_text()
                limits |= {int(line.split()[-3]) for line in text.splitlines()
                           if line.startswith(("Max address space", "Max data size")) and line.split()[-3].isdigit()}
            return limits

        assert holding.memory_bytes in memory_limits(roomy) and holding.memory_bytes not in memory_limits(spare)
        assert jail.Limits().memory_bytes in memory_limits(spare)
        spare.close(), roomy.close()
    finally:
        pool.close()


@pytest.mark.parametrize("reply, believed", [
    ({"status": "ok", "inputs": ["inputs-0.bin"], "outputs": ["outputs-0.bin"], "ms": 0.01, "wall_ms": 2}, True),
    ({"status": "ok", "wall_ms": "x"}, False),
    ({"status": "ok", "ms": float("nan")}, False),
    ({"status": "ok", "ms": True}, False),
    ({"status": "ok", "inputs": [3]}, False),
    ({"status": "ok", "resources": [{"registers": 4}]}, False),   # a row names its kernel
    ({"status": "ok", "verdict": "correct"}, False),       # a field the protocol does not have
    ({"status": "runtime_error", "message": "boom", "traceback": "...", "fatal": False}, True),
])
def test_a_jailed_childs_reply_carries_only_the_protocols_fields_and_types(reply, believed):
    """A jailed process ran candidate code: any field of its reply the evaluator reads must be typed as the protocol
    says, or the process is killed and the call fails (an unjailed, trusted child's reply is not held to it)."""
    from sandbox.process import Child, ChildDied

    def child(jailed: bool) -> Child:
        c = Child.__new__(Child)
        c.statuses, c.isolation = {"ok", "runtime_error", "ready"}, (jail.detect() if jailed else None)
        c._buffer, c.killed = json.dumps(reply).encode() + b"\n", False
        c.kill = lambda: setattr(c, "killed", True)
        return c

    jailed = child(True)
    if believed:
        assert jailed._read_reply(1) == reply and not jailed.killed
    else:
        with pytest.raises(ChildDied, match="broke the protocol"):
            jailed._read_reply(1)
        assert jailed.killed
    trusted = child(False)
    assert trusted._read_reply(1)["status"] == reply["status"] and not trusted.killed
