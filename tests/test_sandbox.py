"""The bubblewrap sandbox and the `python` tool, tried with hostile code: host files, writes outside
/tmp, the network, fork bombs, memory hogs (one process or many together), endless loops and output
floods all stay contained. Limits on the whole call are tried with each bound: a cgroup (what
`make test` exercises as root) and the memory watchdog."""

import dataclasses
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import hubgym.tools.python as python_tool
from hubgym.errors import SandboxUnavailableError
from hubgym.schemas import tool_call
from hubgym.tools import Toolbox, get_tool
from hubgym.tools.limits import cgroup_layout
from hubgym.tools.sandbox import SandboxConfig, run_sandboxed

REPO = Path(__file__).resolve().parents[1]
# Code that ends by itself: its wall-clock limit is far above what it needs, because a loaded machine can take
# seconds to start Python in a new sandbox (tests of the limits themselves set theirs).
FAST = SandboxConfig(timeout_s=60, cpu_s=5, memory_mb=512, max_procs=16, max_output_bytes=20_000)
BOUNDS = ["cgroup", "watchdog"]  # what bounds a whole call; "auto" picks the first that works


def _run(code: str, **limits) -> dict:
    """Run code that prints one JSON object as its last line; return that object."""
    result = run_sandboxed(code, SandboxConfig(**{**vars(FAST), **limits}))
    assert result.exit_code == 0 and result.sandboxed, result
    return json.loads(result.stdout.splitlines()[-1])


def _host_processes_with(marker: str) -> list[str]:
    """Host pids whose command line contains `marker` (the host sees into every pid namespace)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:  # the process ended while we looked
            continue
    return found


def _call_cgroups() -> list[Path]:
    """The call cgroups of this test process that exist now (their names carry our pid)."""
    layout, _ = cgroup_layout()
    parents = {p for p in (layout or ())[1:] if p}
    return [path for parent in parents for path in Path(parent).glob(f"hubgym-{os.getpid()}-*")]


def _assert_nothing_left(marker: str) -> None:
    assert _host_processes_with(marker) == [] and _call_cgroups() == []


def test_runs_code_and_keeps_streams_apart():
    result = run_sandboxed("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)", FAST)
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert result.sandboxed and not result.timed_out and not result.truncated and result.signal_name is None


def test_host_files_are_not_there(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    seen = _run(f"""
import json, os
paths = {[str(secret), str(REPO / "pyproject.toml"), str(REPO / "hubgym"), "/etc/shadow", "/etc/passwd",
          "/etc/hostname", "/root/.bash_history", "/home"]!r}
print(json.dumps({{"exists": [p for p in paths if os.path.exists(p)], "root": os.listdir("/"),
                  "etc": os.listdir("/etc"), "tmp": os.listdir("/tmp"), "uid": os.getuid(),
                  "status": open("/proc/self/status").read(),
                  "pids": [p for p in os.listdir("/proc") if p.isdigit()]}}))
""")
    assert seen["exists"] == []
    assert set(seen["root"]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr",
                                 *[Path(p).parts[1] for p in (sys.base_prefix, sys.prefix)]}
    # the private /tmp holds the program, plus the read-only interpreter binds when Python lives under /tmp
    under_tmp = {Path(p).parts[2] for p in (sys.prefix, sys.base_prefix) if Path(p).parts[1:2] == ("tmp",)}
    assert set(seen["etc"]) <= {"ld.so.cache", "localtime"} and set(seen["tmp"]) == {"main.py"} | under_tmp
    assert seen["uid"] != 0  # never root inside, so rlimits bite
    status = dict(line.split(":\t") for line in seen["status"].splitlines())
    assert [status[k] for k in ("CapPrm", "CapEff", "CapAmb", "NoNewPrivs")] == ["0" * 16] * 3 + ["1"]
    assert len(seen["pids"]) <= 3 and str(os.getpid()) not in seen["pids"]  # its own pid namespace


def test_writes_outside_tmp_fail():
    seen = _run(f"""
import json, sys
failed = {{}}
for path in ["/evil", "/usr/evil", "/etc/evil", sys.prefix + "/evil", {str(REPO / "evil")!r}, "/dev/shm/evil",
             "/proc/sys/kernel/hostname"]:
    try:
        with open(path, "w") as f:
            f.write("x")
        failed[path] = None
    except OSError as exc:
        failed[path] = type(exc).__name__
print(json.dumps(failed))
""")
    assert seen and all(seen.values()), seen
    assert not (REPO / "evil").exists() and not Path(sys.prefix, "evil").exists()


def test_tmp_is_writable_private_and_fresh_each_run():
    name = f"note-{uuid.uuid4().hex}"
    seen = _run(f"""
import json, os
with open("/tmp/{name}", "w") as f:
    f.write("kept")
print(json.dumps({{"cwd": os.getcwd(), "read": open("{name}").read()}}))
""")
    assert seen == {"cwd": "/tmp", "read": "kept"}
    assert not Path("/tmp", name).exists()  # not the host's /tmp
    assert _run(f"import json, os\nprint(json.dumps(os.path.exists('/tmp/{name}')))") is False


def test_no_network_not_even_the_hosts_loopback():
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        port = server.getsockname()[1]
        seen = _run(f"""
import json, socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    outcome = "connected"
except OSError as exc:
    outcome = type(exc).__name__
try:
    socket.getaddrinfo("huggingface.co", 443)
    dns = "resolved"
except OSError as exc:
    dns = type(exc).__name__
print(json.dumps({{"connect": outcome, "dns": dns, "interfaces": [n for _, n in socket.if_nameindex()]}}))
""")
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the host's listener
    assert seen == {"connect": "ConnectionRefusedError", "dns": "gaierror", "interfaces": ["lo"]}


@pytest.mark.parametrize("bound", BOUNDS)
def test_process_limit_holds_and_children_die_with_the_run(bound):
    marker = f"31.{uuid.uuid4().int % 10**9}"
    result = run_sandboxed(f"""
import os
started = 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.execv("/bin/sleep", ["sleep", "{marker}"])
    started += 1
print(started)
""", SandboxConfig(**{**vars(FAST), "call_bound": bound}))
    assert result.exit_code == 0 and result.call_bound.startswith(bound)
    assert 1 <= int(result.stdout) < FAST.max_procs
    _assert_nothing_left(marker)  # the sleepers went with the sandbox


@pytest.mark.slow
@pytest.mark.parametrize("bound", BOUNDS)
def test_fork_bomb_is_contained(bound):
    marker = f"bomb-{uuid.uuid4().hex}"
    result = run_sandboxed(f"""
import os, sys
if sys.argv[-1] != "{marker}":
    os.execv(sys.executable, [sys.executable, "main.py", "{marker}"])  # mark every bomb process
while True:
    try:
        os.fork()
    except OSError:
        pass
""", SandboxConfig(timeout_s=1.5, cpu_s=5, max_procs=16, call_bound=bound))
    assert result.timed_out and result.exit_code == -signal.SIGKILL and not result.memory_exceeded
    _assert_nothing_left(marker)
    assert subprocess.run([sys.executable, "-c", "print('fine')"], capture_output=True).stdout == b"fine\n"


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("code", [
    "x = bytearray(2 * 1024 ** 3)",
    "hog = []\nwhile True:\n    hog.append(b'x' * 10 ** 7)",
])
def test_memory_hog_gets_memory_error(code, bound):
    """One process past the limit fails at once (RLIMIT_AS): the program sees MemoryError, not a kill."""
    result = run_sandboxed(code, SandboxConfig(memory_mb=256, call_bound=bound))
    assert result.exit_code == 1 and result.stderr.rstrip().endswith("MemoryError"), result
    assert not result.memory_exceeded and result.call_bound.startswith(bound)


# Holders each write (so make resident) `mb` MB, then hold it until the main program, which has seen
# all of them holding at once and waited a second, exits. Detached ones are fresh interpreters in
# grandchildren: re-parented to the sandbox's pid 1, in a session of their own, their output closed.
# Every process carries `marker` on its command line. Unbounded, the program prints "held" and exits 0.
HOLDERS = """
import os, sys, time
if sys.argv[-1] != "{marker}":
    os.execv(sys.executable, [sys.executable, "main.py", "{marker}"])
ready_r, ready_w = os.pipe()
release_r, release_w = os.pipe()
for _ in range({n}):
    if os.fork() == 0:
        os.close(release_w)
        if {detach}:
            if os.fork():
                os._exit(0)
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.set_inheritable(ready_w, True)
            os.set_inheritable(release_r, True)
            os.execv(sys.executable, [sys.executable, "-c", "import os, sys; hold = b'x' * ({mb} << 20); "
                     "os.write({{ready_w}}, b'1'); os.read({{release_r}}, 1)".format(**locals()), "{marker}"])
        hold = b"x" * ({mb} << 20)
        os.write(ready_w, b"1")
        os.read(release_r, 1)  # returns once the main program closes release_w (or dies)
        os._exit(0)
seen = 0  # release_w stays open: every holder keeps its memory until this program exits
while seen < {n}:
    seen += len(os.read(ready_r, {n}))
time.sleep(1)  # all of them holding at once, for longer than a watchdog's poll
print("held", {n} * {mb}, "MB")
"""


def _holders(n: int, mb: int, detach: bool, marker: str) -> str:
    return HOLDERS.format(n=n, mb=mb, detach=detach, marker=marker)


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("detach", [False, True], ids=["children", "detached"])
def test_processes_together_past_the_call_limit_are_stopped(bound, detach):
    """Each holder is far under the per-process limit; together they pass the call's, so the call stops."""
    marker = f"holder-{uuid.uuid4().hex}"
    config = SandboxConfig(timeout_s=20, memory_mb=256, max_procs=16, call_bound=bound)
    result = run_sandboxed(_holders(4, 100, detach, marker), config)
    assert result.memory_exceeded and not result.timed_out, result
    assert "held" not in result.stdout and result.exit_code == -signal.SIGKILL
    assert result.call_bound.startswith(bound)  # "cgroup v1" / "cgroup v2": the real mechanism ran
    _assert_nothing_left(marker)


@pytest.mark.slow
@pytest.mark.parametrize("bound", BOUNDS)
def test_processes_together_under_the_call_limit_run_normally(bound):
    """Eight forked interpreters of 16 MB each: shared pages count once (PSS), not once per process."""
    marker = f"holder-{uuid.uuid4().hex}"
    result = run_sandboxed(_holders(8, 16, False, marker), SandboxConfig(memory_mb=256, max_procs=16,
                                                                         call_bound=bound))
    assert (result.stdout, result.exit_code, result.memory_exceeded) == ("held 128 MB\n", 0, False), result
    assert result.call_bound.startswith(bound)
    _assert_nothing_left(marker)


@pytest.mark.slow
@pytest.mark.parametrize("bound", BOUNDS)
def test_a_process_spawner_is_bounded_in_memory_and_time(bound):
    """A loop that keeps forking holders is stopped for memory; one that forks sleepers, at the clock."""
    marker = f"spawner-{uuid.uuid4().hex}"
    spawner = """
import os, sys, time
if sys.argv[-1] != "{marker}":
    os.execv(sys.executable, [sys.executable, "main.py", "{marker}"])  # mark every process
while True:
    try:
        if os.fork() == 0:
            hold = b"x" * ({mb} << 20)
            time.sleep(1000)
    except OSError:
        time.sleep(0.01)
"""
    config = SandboxConfig(timeout_s=60, memory_mb=256, max_procs=16, call_bound=bound)  # far from either outcome:
    grows = run_sandboxed(spawner.format(mb=32, marker=f"1{marker}"), config)  # a loaded machine starts Python late
    assert grows.memory_exceeded and not grows.timed_out, grows
    keeps = run_sandboxed(spawner.format(mb=0, marker=f"2{marker}"), dataclasses.replace(config, timeout_s=3))
    assert keeps.timed_out and not keeps.memory_exceeded, keeps
    _assert_nothing_left(marker)


@pytest.mark.parametrize("bound", BOUNDS)
def test_detached_children_do_not_outlive_the_call(bound):
    """Grandchildren that leave the session and close their output die when the main program ends."""
    marker = f"{uuid.uuid4().int % 10**9}"
    result = run_sandboxed(f"""
import os
for _ in range(3):
    if os.fork() == 0:
        if os.fork() == 0:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execv("/bin/sleep", ["sleep", "{marker}"])
        os._exit(0)
    os.wait()
print("main done")
""", SandboxConfig(**{**vars(FAST), "call_bound": bound}))
    assert (result.stdout, result.exit_code, result.timed_out) == ("main done\n", 0, False), result
    _assert_nothing_left(marker)


@pytest.mark.slow
def test_without_cgroups_auto_falls_back_to_the_watchdog():
    """With a read-only cgroupfs "auto" bounds calls with the watchdog, and "cgroup" says why it cannot."""
    script = f"""
import json
from hubgym.errors import SandboxUnavailableError
from hubgym.tools.sandbox import SandboxConfig, run_sandboxed
result = run_sandboxed({_holders(4, 100, False, "unprivileged")!r}, SandboxConfig(timeout_s=20, memory_mb=256))
try:
    run_sandboxed("print(1)", SandboxConfig(call_bound="cgroup"))
    refusal = None
except SandboxUnavailableError as exc:
    refusal = str(exc)
print(json.dumps([result.call_bound, result.memory_exceeded, result.stdout, refusal]))
"""
    argv = [sys.executable, "-c", script]
    if os.geteuid() == 0:  # in a mount namespace of its own, every cgroup mount made read-only
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                  if " - cgroup" in line]
        remount = 'for m; do [ "$m" = -- ] && break; mount -o remount,bind,ro "$m" || exit 99; shift; done; shift'
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{remount}; exec "$@"', "sh",
                *mounts, "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    bound, exceeded, stdout, refusal = json.loads(done.stdout.splitlines()[-1])
    assert (bound, exceeded, stdout) == ("watchdog", True, "")
    assert refusal.startswith("SandboxConfig(call_bound='cgroup') needs a cgroup with the memory controller")
    assert refusal.endswith("Fix: run as root with the cgroup filesystem mounted read-write, or use "
                            "call_bound='auto', which falls back to a memory watchdog")
    assert "cannot bound calls with a cgroup" in done.stderr  # said once, as a warning


@pytest.mark.slow
def test_endless_loop_times_out():
    """The clock stops a program that never ends (one that waits: the CPU limit stops a spinner, next test). The
    limit leaves a loaded machine time to start Python and print first."""
    result = run_sandboxed("import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.05)",
                           SandboxConfig(timeout_s=5))
    assert result.timed_out and not result.truncated and result.stdout == "started\n"
    assert result.signal_name == "SIGKILL"


@pytest.mark.slow
def test_cpu_limit_kills_a_spinner_before_the_wall_clock():
    result = run_sandboxed("while True:\n    pass", SandboxConfig(timeout_s=20, cpu_s=1))
    assert not result.timed_out and result.signal_name == "SIGXCPU"


@pytest.mark.parametrize("stream", ["sys.stdout", "sys.stderr"])
def test_output_flood_is_cut_and_stopped(stream):
    result = run_sandboxed(f"import sys\nwhile True:\n    print('flood' * 100, file={stream})",
                           SandboxConfig(max_output_bytes=5000))
    assert result.truncated and not result.timed_out
    assert len(result.stdout) + len(result.stderr) == 5000
    assert (result.stdout or result.stderr).startswith("floodflood")


def test_missing_bwrap_says_how_to_install_or_opt_out(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    monkeypatch.delenv("HUBGYM_ALLOW_UNSANDBOXED", raising=False)
    with pytest.raises(SandboxUnavailableError) as info:
        run_sandboxed("print(1)", FAST)
    message = str(info.value)
    assert "`apt-get install bubblewrap`" in message
    assert "SandboxConfig(allow_unsandboxed=True)" in message and "HUBGYM_ALLOW_UNSANDBOXED=1" in message
    assert str(pickle.loads(pickle.dumps(info.value))) == message
    outcome = Toolbox([python_tool.python]).call(tool_call("c", "python", '{"code": "print(1)"}'))
    assert outcome.error["type"] == "SandboxUnavailableError"
    assert outcome.message["content"].startswith("Error: SandboxUnavailableError: running model code needs bubblewrap")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["config", "env"])
def test_explicit_opt_out_runs_unsandboxed_with_limits(monkeypatch, tmp_path, how):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("HUBGYM_ALLOW_UNSANDBOXED", "1" if how == "env" else "0")
    config = SandboxConfig(timeout_s=60, memory_mb=256, allow_unsandboxed=how == "config")
    result = run_sandboxed("import os\nopen('made.txt', 'w').write('x')\nprint(os.listdir('.'))", config)
    assert not result.sandboxed and result.exit_code == 0 and result.stdout == "['main.py', 'made.txt']\n"
    assert not Path("made.txt").exists()  # it ran in a temporary directory, since removed
    assert run_sandboxed("while True:\n    pass", dataclasses.replace(config, timeout_s=1)).timed_out
    hog = run_sandboxed("x = bytearray(2 * 1024 ** 3)", config)  # 60 s: a loaded machine can take 1 s to start Python
    assert hog.exit_code == 1 and "MemoryError" in hog.stderr


def test_config_is_validated():
    with pytest.raises(ValueError, match=r"^SandboxConfig.memory_mb=8 is too small: it must be >= 64 "):
        SandboxConfig(memory_mb=8)
    with pytest.raises(ValueError, match=r"^SandboxConfig.timeout_s=0 is too small: it must be >= 0.01. Fix: "):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match=r"^SandboxConfig.call_bound='rlimit' is not one of auto, cgroup, watchdog\. "
                                         r"Fix: use 'auto' "):
        SandboxConfig(call_bound="rlimit")


# --- the python tool -------------------------------------------------------------------------------


def _python(code: str):
    return Toolbox([get_tool("python")]).call(tool_call("c", "python", json.dumps({"code": code})))


def test_python_tool_returns_output_and_exit_status():
    assert _python("print(sum(range(10)))").message["content"] == "45\n"
    assert _python("x = 1").message["content"] == "(no output)"
    failed = _python("print('before')\n1 / 0")
    assert failed.error is None  # the program failed, not the call: the traceback is the answer
    assert failed.message["content"].startswith("before\nTraceback (most recent call last):\n")
    assert failed.message["content"].endswith("ZeroDivisionError: division by zero\n[exit status 1]")


def test_python_tool_keeps_the_tail_of_long_output():
    content = _python("print('a' * 10000)\nraise SystemExit('bad input')").message["content"]
    assert "\n[... " in content and " characters cut ...]\n" in content
    assert content.startswith("aaaa") and content.endswith("bad input\n[exit status 1]")
    assert len(content) < 4000


@pytest.mark.slow
@pytest.mark.parametrize("code, timeout_s, kind, start", [  # each limit far from the others' outcomes: a loaded
    ("import time\nprint('working', flush=True)\nwhile True:\n    time.sleep(0.05)", 5, "TimeoutError",  # machine
     "the program ran past the 5s time limit and was stopped; its last output was:\nworking\n"),  # starts Python late
    ("while True:\n    print('y' * 1000)", 60, "RuntimeError",
     "the program printed more than 3000 bytes and was stopped; "),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)", 60, "RuntimeError",
     "the program was killed by SIGXCPU: it used up its CPU time"),
])
def test_python_tool_stopped_programs_are_failed_calls(monkeypatch, code, timeout_s, kind, start):
    monkeypatch.setattr(python_tool, "PYTHON_SANDBOX", SandboxConfig(timeout_s=timeout_s, max_output_bytes=3000))
    outcome = _python(code)
    assert outcome.error["type"] == kind and outcome.error["message"].startswith(start)
    assert outcome.message["content"] == f"Error: {kind}: {outcome.error['message']}"


def test_python_tool_reports_a_call_stopped_for_memory(monkeypatch):
    monkeypatch.setattr(python_tool, "PYTHON_SANDBOX", SandboxConfig(timeout_s=20, memory_mb=256, max_procs=16))
    outcome = _python(_holders(4, 100, False, f"tool-{uuid.uuid4().hex}"))
    assert outcome.error["type"] == "MemoryError", outcome.message
    assert outcome.error["message"] == ("the program used more than the 256 MB memory limit (all of its processes "
                                        "together) and was stopped")
    assert outcome.message["content"] == f"Error: MemoryError: {outcome.error['message']}"
