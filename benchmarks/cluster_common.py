"""What the cluster benchmarks (``cluster_lookup.py``, ``cluster_fetch.py``)
share: a member daemon started with the settings users run, per-process
CPU time, percentiles."""

from __future__ import annotations

import sys
from pathlib import Path

from kvtier.testing import Cluster, Daemon, start_daemon

#: The test settings kvtier.testing gives a cluster member that are not
#: the defaults users run with: dropped, so the benches run the defaults.
NOT_DEFAULTS = ("KVTIER_PEER__LOOKUP_TIMEOUT_MS", "KVTIER_PEER__LOAD_TIMEOUT_MS")


def cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid``'s threads so far, in nanoseconds'
    resolution (``/proc/<pid>/task/*/schedstat``; ``/proc/<pid>/stat``
    counts clock ticks, 10 ms, too coarse for one phase)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def member(cluster: Cluster, data: Path, node: str, settings: dict[str, str]) -> Daemon:
    """Node ``node`` of ``cluster`` in ``data``: the cluster's member
    settings with the test-only ones dropped, disk I/O back to the
    defaults, and ``settings`` on top."""
    env = cluster.member_env(node)
    for k in NOT_DEFAULTS:
        env.pop(k)
    env.update(
        # kvtier.testing's test settings, back to the defaults.
        KVTIER_DISK__IO_ENGINE="auto",
        KVTIER_DISK__SYNC="true",
    )
    env.update(settings)
    # Not Cluster.start_member, which lays member_env over these again.
    daemon = start_daemon(data, env)
    cluster.members.append(daemon)
    return daemon


def print_logs(cluster: Cluster, lines: int = 40) -> None:
    """The last ``lines`` log lines of each member, to stderr: what a
    failed bench run shows besides its traceback."""
    for daemon in cluster.members:
        print(f"--- the last log lines of the daemon in {daemon.data}:", file=sys.stderr)
        for line in daemon.log[-lines:]:
            print(line, file=sys.stderr)


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]
