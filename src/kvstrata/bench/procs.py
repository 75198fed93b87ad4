"""Process helpers shared by the benchmarks.

* start and stop server processes on free loopback ports, waiting for readiness by polling ``PING``
  with a deadline;
* read a process's CPU time (``utime + stime``, in microseconds) and page faults from ``/proc/PID/stat``,
  for one process or for a process and all its live descendants;
* describe the machine a benchmark ran on (CPU model, cores, RAM, kernel, Python).

Linux only: everything here reads ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"

CLK_TCK: int = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second: the unit of ``utime``/``stime`` in ``/proc/PID/stat``."""


# --------------------------------------------------------------------------------------------------
# /proc/PID/stat


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` the benchmarks use (see proc(5))."""

    pid: int
    comm: str
    state: str
    ppid: int
    minflt: int
    majflt: int
    utime_ticks: int
    stime_ticks: int
    num_threads: int

    @property
    def cpu_ticks(self) -> int:
        """User plus system time, in clock ticks."""
        return self.utime_ticks + self.stime_ticks

    @property
    def cpu_us(self) -> int:
        """User plus system time, in microseconds."""
        return ticks_to_us(self.cpu_ticks)


def ticks_to_us(ticks: int, clk_tck: int = CLK_TCK) -> int:
    """Clock ticks to microseconds."""
    return ticks * 1_000_000 // clk_tck


def parse_proc_stat(text: str) -> ProcStat:
    """Parse the one line of ``/proc/PID/stat``.

    The second field, ``comm``, is in parentheses and may itself hold spaces and parentheses, so the
    line is split at the *last* ``)``; the numbered fields below are proc(5)'s, counted from 1.
    """
    text = text.strip()
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}")
    pid = int(text[:open_paren].strip())
    comm = text[open_paren + 1 : close_paren]
    rest = text[close_paren + 1 :].split()
    if len(rest) < 18:
        raise ValueError(f"/proc/PID/stat line too short ({len(rest) + 2} fields)")

    def field(number: int) -> str:
        # rest[0] is field 3 (state).
        return rest[number - 3]

    return ProcStat(
        pid=pid,
        comm=comm,
        state=field(3),
        ppid=int(field(4)),
        minflt=int(field(10)),
        majflt=int(field(12)),
        utime_ticks=int(field(14)),
        stime_ticks=int(field(15)),
        num_threads=int(field(20)),
    )


def read_proc_stat(pid: int) -> ProcStat:
    """``/proc/PID/stat`` of a live process (raises ``FileNotFoundError`` / ``ProcessLookupError`` if gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError as exc:
        raise ProcessLookupError(f"no process {pid}") from exc
    return parse_proc_stat(text)


def cpu_time_us(pid: int) -> int:
    """CPU time (``utime + stime``, all threads) of one process, in microseconds."""
    return read_proc_stat(pid).cpu_us


def descendant_pids(pid: int) -> list[int]:
    """The live descendants of ``pid`` (children, grandchildren, ...), found by scanning ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = parse_proc_stat(Path(entry.path, "stat").read_text())
        except (OSError, ValueError):
            continue  # exited while we looked, or not readable
        children.setdefault(stat.ppid, []).append(stat.pid)
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return sorted(found)


@dataclass(frozen=True)
class Usage:
    """Resource counters of a process (tree) at one instant; subtract two to get a delta."""

    cpu_us: int
    minflt: int
    majflt: int

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.cpu_us - other.cpu_us, self.minflt - other.minflt, self.majflt - other.majflt)


def process_usage(pid: int) -> Usage:
    """CPU time and page faults of one process."""
    stat = read_proc_stat(pid)
    return Usage(stat.cpu_us, stat.minflt, stat.majflt)


def tree_usage(pid: int) -> Usage:
    """CPU time and page faults of a process plus its live descendants (e.g. a server's worker processes).

    Descendants that exit between two readings take their counters with them; servers that keep their
    workers for the whole benchmark are measured exactly.
    """
    total = process_usage(pid)
    for child in descendant_pids(pid):
        try:
            stat = read_proc_stat(child)
        except (ProcessLookupError, ValueError):
            continue
        total = Usage(total.cpu_us + stat.cpu_us, total.minflt + stat.minflt, total.majflt + stat.majflt)
    return total


# --------------------------------------------------------------------------------------------------
# Machine description


def parse_cpuinfo(text: str) -> dict[str, object]:
    """CPU model, logical and physical core counts and the hypervisor flag from ``/proc/cpuinfo`` text."""
    model = ""
    logical = 0
    cores: set[tuple[str, str]] = set()
    hypervisor = False
    physical_id = core_id = ""
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip().lower()] = value.strip()
        if "processor" not in fields:
            continue
        logical += 1
        model = model or fields.get("model name") or fields.get("hardware") or fields.get("cpu model", "")
        physical_id = fields.get("physical id", "")
        core_id = fields.get("core id", "")
        if core_id:
            cores.add((physical_id, core_id))
        if "hypervisor" in fields.get("flags", "").split():
            hypervisor = True
    return {
        "cpu_model": model,
        "cores_logical": logical,
        "cores_physical": len(cores) or None,
        "hypervisor": hypervisor,
    }


def parse_meminfo_total(text: str) -> int:
    """``MemTotal`` from ``/proc/meminfo`` text, in bytes."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            scale = 1024 if len(parts) > 2 and parts[2].lower() == "kb" else 1
            return int(parts[1]) * scale
    raise ValueError("no MemTotal in /proc/meminfo")


def describe_machine() -> dict[str, object]:
    """What a benchmark result needs to be read against: CPU, cores, RAM, kernel, Python."""
    try:
        cpu = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpu = {
            "cpu_model": "",
            "cores_logical": os.cpu_count() or 0,
            "cores_physical": None,
            "hypervisor": False,
        }
    if not cpu["cpu_model"]:
        cpu["cpu_model"] = platform.processor() or platform.machine()
    try:
        ram_bytes = parse_meminfo_total(Path("/proc/meminfo").read_text())
    except (OSError, ValueError):
        ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "cpu_model": cpu["cpu_model"],
        "cores": os.cpu_count() or cpu["cores_logical"],
        "cores_usable": usable,
        "cores_physical": cpu["cores_physical"],
        "hypervisor": cpu["hypervisor"],
        "ram_bytes": ram_bytes,
        "ram_gib": round(ram_bytes / 1024**3, 1),
        "os": platform.system(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
    }


def machine_summary(machine: Mapping[str, object]) -> str:
    """One line for humans: ``AMD EPYC, 2 cores, 23.5 GiB RAM, Linux 6.8.0, Python 3.11.7``."""
    cores = machine.get("cores")
    usable = machine.get("cores_usable")
    core_text = f"{cores} cores" if usable in (None, cores) else f"{cores} cores ({usable} usable)"
    vm = ", VM" if machine.get("hypervisor") else ""
    return (
        f"{machine.get('cpu_model')}, {core_text}{vm}, {machine.get('ram_gib')} GiB RAM, "
        f"{machine.get('os')} {machine.get('kernel')} {machine.get('arch')}, "
        f"{machine.get('python_implementation', 'Python')} {machine.get('python')}"
    )


# --------------------------------------------------------------------------------------------------
# Servers on loopback ports


class ServerStartError(RuntimeError):
    """A server process exited or did not answer PING before its deadline."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago (the kernel's pick); start_server retries if it is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_PING = b"*1\r\n$4\r\nPING\r\n"


def ping(host: str, port: int, timeout: float = 1.0) -> bool:
    """True if a RESP server at host:port answers ``PING`` with ``+PONG``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_PING)
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(64)
                if not chunk:
                    return False
                reply += chunk
            return reply == b"+PONG\r\n"
    except OSError:
        return False


def wait_ready(
    host: str,
    port: int,
    deadline_s: float,
    proc: subprocess.Popen[bytes] | None = None,
    interval_s: float = 0.05,
) -> float:
    """Poll ``PING`` until it answers; return the seconds waited.

    Raises ``ServerStartError`` when ``deadline_s`` passes or ``proc`` (if given) exits first.
    """
    start = time.monotonic()
    deadline = start + deadline_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise ServerStartError(f"server exited with status {proc.returncode} before answering PING")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ServerStartError(f"no PONG from {host}:{port} within {deadline_s:g}s")
        if ping(host, port, timeout=min(1.0, remaining)):
            return time.monotonic() - start
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))


def redis_port_args(host: str, port: int) -> list[str]:
    """The listening arguments Redis and kvstrata both take: ``--port N --bind HOST``."""
    return ["--port", str(port), "--bind", host]


@dataclass
class ServerProcess:
    """A server started by ``start_server``; ``stop()`` it (or use it as a context manager)."""

    name: str
    argv: list[str]
    host: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_s: float

    @property
    def pid(self) -> int:
        return self.proc.pid

    def usage(self) -> Usage:
        """CPU time and page faults of the server and its live descendants."""
        return tree_usage(self.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, max_bytes: int = 4000) -> str:
        return _tail(self.log_path, max_bytes)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM the server's process group, SIGKILL it after ``timeout_s``; return the exit status."""
        if self.proc.poll() is None:
            _signal_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc, signal.SIGKILL)
                self.proc.wait(timeout_s)
        # Reap workers left in the group, if any.
        _signal_group(self.proc, signal.SIGKILL)
        return int(self.proc.returncode)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The server runs in its own session (start_new_session), so its pgid is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _tail(path: Path, max_bytes: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def start_server(
    name: str,
    argv: Sequence[str],
    *,
    host: str = LOOPBACK,
    port: int | None = None,
    port_args: Callable[[str, int], list[str]] = redis_port_args,
    ready_timeout_s: float = 30.0,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    log_dir: str | Path | None = None,
    attempts: int = 3,
) -> ServerProcess:
    """Start ``argv + port_args(host, port)`` and wait until it answers ``PING``.

    With ``port=None`` a free port is picked, and a new one tried (up to ``attempts`` times) if the server
    dies before answering, since another process may have taken the port in between. The server runs in
    its own session so that ``stop()`` reaches its worker processes too, and writes stdout and stderr to a
    log file in ``log_dir`` (the system temporary directory by default).
    """
    last_error: ServerStartError | None = None
    for _ in range(max(1, attempts if port is None else 1)):
        chosen = port if port is not None else free_port(host)
        full_argv = [*argv, *port_args(host, chosen)]
        fd, log_name = tempfile.mkstemp(prefix=f"{name}-{chosen}-", suffix=".log", dir=log_dir)
        log_path = Path(log_name)
        with os.fdopen(fd, "wb") as log:
            try:
                proc = subprocess.Popen(
                    full_argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=None if env is None else dict(env),
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerStartError(f"cannot run {name}: {shlex.join(full_argv)}: {exc}") from exc
        server = ServerProcess(name, full_argv, host, chosen, proc, log_path, ready_s=0.0)
        try:
            server.ready_s = wait_ready(host, chosen, ready_timeout_s, proc)
            return server
        except ServerStartError as exc:
            exited_by_itself = proc.poll() is not None
            server.stop(timeout_s=2.0)
            last_error = ServerStartError(
                f"{name} ({shlex.join(full_argv)}): {exc}\n--- log tail ({log_path}) ---\n{server.log_tail()}"
            )
            if not exited_by_itself:
                break  # it ran but never answered: another port will not help
    assert last_error is not None
    raise last_error
