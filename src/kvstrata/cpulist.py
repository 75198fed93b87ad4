"""CPU lists (Redis's ``server_cpulist`` syntax) and pinning a whole process to one.

``0-3,8`` is CPUs 0, 1, 2, 3 and 8; ``0-7:2`` is 0, 2, 4, 6. The server pins itself with ``server-cpulist``
(all its threads: the event loop, loaders, the SSD and pool writers), and ``kvstrata bench restore --pin`` keeps
a server and its clients on separate CPUs. Why it matters on a small machine: Linux wakes a task that waits on
a socket on the CPU of the task that woke it (a "sync" wake-up), so a client that sat idle is moved onto the
server's CPU by the server's first reply, and a large reply then runs client and server on one core until the
load balancer separates them (measured in BENCHMARKS.md: TCP restore at half speed after an idle moment).
"""

from __future__ import annotations

import itertools
import os

MAX_CPU = 4095  # a bound on what a list may name, so "0-999999999" is an error, not a huge set


def parse_cpulist(text: str) -> tuple[int, ...]:
    """The CPUs ``text`` names, sorted; () for an empty list. ValueError names the part that is wrong."""
    cpus: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        span, _, step_text = part.partition(":")
        low_text, dash, high_text = span.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if dash else low
            step = int(step_text) if step_text else 1
        except ValueError:
            raise ValueError(f"bad CPU list item {part!r} (expected N, A-B or A-B:STEP)") from None
        if not 0 <= low <= high <= MAX_CPU or step < 1 or (step_text and not dash):
            raise ValueError(f"bad CPU list item {part!r} (CPUs 0-{MAX_CPU}, A <= B, STEP >= 1)")
        cpus.update(range(low, high + 1, step))
    return tuple(sorted(cpus))


def normalize_cpulist(text: str) -> str:
    """``text`` checked and written back as it was given (the configuration keeps the user's spelling)."""
    parse_cpulist(text)
    return str(text).strip()


def pin_process(cpus: tuple[int, ...], pid: int | None = None) -> None:
    """Run every thread of this process (or of process ``pid``), and every thread it starts later, on ``cpus``.

    Raises OSError when none of them can be used (offline, or outside the process's cgroup). A process may be
    given CPUs outside the mask it inherited, so only the kernel can tell."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except OSError as exc:
            raise OSError(f"cannot run on CPUs {format_cpus(cpus)} ({exc.strerror}; this machine has "
                          f"{os.cpu_count()} CPUs)") from None


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _threads(pid: int | None) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid or 'self'}/task")]
    except OSError:
        return [pid or 0]  # no /proc: the main thread (threads started after it inherit)


def split_cpus(cpus: set[int] | tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``cpus`` in two halves for a server and its clients: (server's, clients'); the server gets the upper half
    (the clients the rest), as CPU 0 takes most of the machine's interrupts. ValueError below two CPUs."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        raise ValueError(f"pinning a server and its clients apart needs two CPUs, this process may use {len(ordered)}")
    half = len(ordered) // 2
    return tuple(ordered[half:]), tuple(ordered[:half])


def format_cpus(cpus: tuple[int, ...] | set[int]) -> str:
    """``cpus`` as a compact list: (0, 1, 2, 5) -> "0-2,5"."""
    out: list[str] = []
    # Consecutive CPUs share c - position: each group is one run.
    for _, group in itertools.groupby(enumerate(sorted(cpus)), lambda p: p[1] - p[0]):
        run = [c for _, c in group]
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
