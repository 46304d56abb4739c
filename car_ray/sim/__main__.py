"""`python -m car_ray.sim --policy module:attr`: serve a scenario policy in the foreground."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._run import LOOPBACK, serve
from ._server import DRAWS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m car_ray.sim", description="Serve a scenario policy as a model provider."
    )
    parser.add_argument("--policy", required=True, help="the policy, as module:attr")
    parser.add_argument("--host", default=LOOPBACK)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--rate-429", type=float, default=0.0)
    parser.add_argument("--rate-5xx", type=float, default=0.0)
    parser.add_argument("--retry-after-ms", type=float, default=50.0)
    parser.add_argument("--fault-seed", type=int, default=0)
    parser.add_argument("--draws", choices=DRAWS, default="coupled")
    parser.add_argument(
        "--path", type=Path, action="append", default=[], help="a folder to import from first"
    )
    args = parser.parse_args(argv)
    try:
        serve(
            args.policy,
            args.host,
            args.port,
            args.latency_ms,
            args.rate_429,
            args.rate_5xx,
            args.fault_seed,
            retry_after_ms=args.retry_after_ms,
            search_path=tuple(args.path),
            draws=args.draws,
        )
    except (ValueError, OSError) as exc:
        # A bad policy reference, bad rates or a taken port: say so without a traceback.
        sys.exit(f"car-ray sim: {exc}")


if __name__ == "__main__":
    main()
