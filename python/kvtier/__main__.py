"""``python -m kvtier``: can this process reach the node daemon, and what
does it say?

``status`` connects to the socket; given the block shape (``--layers``,
``--layer-bytes``, ``--block-size``) it also says hello in the namespace
given, and prints the session, the arena and the daemon's counters (hits,
misses, stores). Exit status 0 when everything asked worked, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import socket as sockets
import sys
from collections.abc import Sequence

import kvtier


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kvtier",
        description="Diagnostics of a kvtier node daemon (kvtier serve).",
    )
    p.add_argument("--socket", default="kvtier-data/node.sock", help="the daemon's Unix socket")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("status", help="reach the daemon; with a block shape, say hello and show its counters")
    s.add_argument("--model", default="kvtier-diagnostics")
    s.add_argument("--dtype", default="bf16")
    s.add_argument("--layers", type=int, help="layers per block (the node's)")
    s.add_argument("--layer-bytes", type=int, help="bytes per layer of a block (the node's)")
    s.add_argument("--block-size", type=int, help="tokens per block (the node's)")
    s.add_argument("--tp-rank", type=int, default=0)
    s.add_argument("--tp-size", type=int, default=1)
    s.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    p.add_argument("--version", action="version", version=f"kvtier protocol {kvtier.PROTOCOL_VERSION}")
    return p


def _reachable(path: str) -> str | None:
    """Why the socket cannot be reached, or None."""
    s = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    try:
        s.settimeout(5.0)
        s.connect(path)
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    finally:
        s.close()
    return None


def _status(args: argparse.Namespace) -> tuple[int, dict[str, object]]:
    report: dict[str, object] = {"socket": args.socket, "protocol": kvtier.PROTOCOL_VERSION}
    why = _reachable(args.socket)
    report["reachable"] = why is None
    if why is not None:
        report["error"] = why
        return 1, report
    shape = (args.layers, args.layer_bytes, args.block_size)
    if any(v is None for v in shape):
        report["hello"] = "skipped (give --layers, --layer-bytes and --block-size to say hello)"
        return 0, report
    try:
        client = kvtier.Client(
            args.socket,
            model=args.model,
            dtype=args.dtype,
            layers=args.layers,
            layer_bytes=args.layer_bytes,
            block_size_tokens=args.block_size,
            tp_rank=args.tp_rank,
            tp_size=args.tp_size,
        )
        report.update(
            hello="ok",
            session=client.session_id,
            shm=client.shm_name,
            block_bytes=client.block_bytes,
            tiers=dict(client.tiers),
            counters=client.stats(),
        )
    except kvtier.KvtierError as e:
        report.update(hello="refused", error=str(e))
        return 1, report
    return 0, report


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    code, report = _status(args)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return code
    for key, value in report.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k in sorted(value):
                print(f"  {k} = {value[k]}")
        else:
            print(f"{key}: {value}")
    return code


if __name__ == "__main__":
    sys.exit(main())
