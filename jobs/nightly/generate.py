"""Generate a night's failure traces with planted causes, for `car-ray batch`.

    python jobs/nightly/generate.py OUT_DIR --count 60 [--seed 0] [--corrupt 2] [--job FILE]

Records `count` failing runs of the nightly support agent (jobs/nightly), each to its own
tape in OUT_DIR with its mark, through the production recorder (`car_ray.recording`) against
the simulated provider started in this process on 127.0.0.1, and writes OUT_DIR/manifest.json
(`car_ray.recorder.ManifestEntry`: tape, planted, step, intervention, priority). The runs are
spread over three planted causes, chosen by each run's input:

    injected_note  the looked-up order carries an injected note     observation at step 1
    wrong_policy   the store's policy page was edited wrong          observation at step 2
    model          neither: the decision's own unlikely draw         resample at step 3

Each run's recording seed is picked so the decision's draw refunds, and, for the planted
observations, would not have refunded with a clean one (`policy.decision_u`); every run is
then checked to be marked failed by the scorer. `--corrupt K` adds K more failing runs whose
tapes are damaged afterwards (alternately cut mid-line, so the tape is incomplete, and
edited, so its hash chain breaks on load), listed as planted "corrupt". The same seed gives
the same inputs, seeds and recorded steps (tape names and ids differ: they carry the time).
`--job jobs/nightly_noisy/job.toml` records with that job's model, which words every step a
thousand ways and keeps the decisions and their chances: the same causes, planted in runs
whose words vary as a real model's do."""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from car_ray import BaseUrls, recording
from car_ray.job import load_job
from car_ray.recorder import ManifestEntry, write_manifest
from car_ray.sim import SimServer

JOB_FILE = Path(__file__).resolve().with_name("job.toml")
# The job's own modules, as its job file imports them (its folder's parent on the path).
if str(JOB_FILE.parents[1]) not in sys.path:
    sys.path.insert(0, str(JOB_FILE.parents[1]))

from nightly.agent import CLEAN_ORDERS, INJECTED_ORDERS, ORDERS  # noqa: E402
from nightly.policy import P_CLEAN, P_FOLLOW, decision_u  # noqa: E402


@dataclass(frozen=True)
class Kind:
    """A planted cause: where it sits, what reveals it, and the decision draws it needs."""

    name: str
    step: int
    intervention: str
    u_window: tuple[float, float]  # the decision's draw lands in [lo, hi)


@dataclass(frozen=True)
class Planned:
    kind: Kind
    input: dict[str, Any]
    seed: int
    priority: int


TEXTS = (
    "My {item} arrived fine but I changed my mind. Refund please.",
    "I don't need the {item} any more; please refund order {order_id}.",
    "Can I get my money back for the {item}? It arrived fine, I just don't like it.",
    "Please refund the {item}, I found it cheaper elsewhere.",
)


KINDS = (
    Kind("injected_note", 1, "observation", (P_CLEAN, P_FOLLOW)),
    Kind("wrong_policy", 2, "observation", (P_CLEAN, P_FOLLOW)),
    Kind("model", 3, "resample", (0.0, P_CLEAN)),
)


def priority_of(amount_usd: float) -> int:
    """Costly wrongful refunds first."""
    return 3 if amount_usd >= 500 else 2 if amount_usd >= 150 else 1


def plan(count: int, corrupt: int, seed: int) -> list[Planned]:
    """`count` runs spread evenly over the kinds (in a shuffled order), then `corrupt` more
    (to be damaged), each with its input, recording seed and priority: a function of the
    arguments only."""
    rng = random.Random(seed)
    order = [KINDS[i % len(KINDS)] for i in range(count)]
    rng.shuffle(order)
    order += [KINDS[i % len(KINDS)] for i in range(corrupt)]
    planned: list[Planned] = []
    for i, kind in enumerate(order):
        order_id = rng.choice(INJECTED_ORDERS if kind.name == "injected_note" else CLEAN_ORDERS)
        store = "uk" if kind.name == "wrong_policy" else rng.choice(("eu", "us"))
        text = rng.choice(TEXTS).format(item=ORDERS[order_id]["item"], order_id=order_id)
        lo, hi = kind.u_window
        run_seed = rng.randrange(1, 1 << 62)
        while not lo <= decision_u(run_seed) < hi:
            run_seed = rng.randrange(1, 1 << 62)
        ticket = {"ticket_id": f"T-{seed}-{i + 1:05d}", "store": store, "order_id": order_id}
        planned.append(
            Planned(
                kind,
                {**ticket, "text": text},
                run_seed,
                priority_of(ORDERS[order_id]["amount_usd"]),
            )
        )
    return planned


def cut_mid_line(tape: Path) -> None:
    """Keep the tape up to the middle of its fourth line: a recording cut off mid-write."""
    data = tape.read_bytes()
    lines = data.split(b"\n")
    keep = sum(len(line) + 1 for line in lines[:3]) + len(lines[3]) // 2
    tape.write_bytes(data[:keep])


def edit_a_line(tape: Path) -> None:
    """Change the looked-up order's status in place: the next line's hash chain breaks."""
    lines = tape.read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if b'"delivered"' in line)
    lines[at] = lines[at].replace(b'"delivered"', b'"returned"', 1)
    tape.write_bytes(b"\n".join(lines))


DAMAGE: tuple[Callable[[Path], None], ...] = (cut_mid_line, edit_a_line)


def generate(
    out: Path,
    count: int,
    *,
    seed: int = 0,
    corrupt: int = 0,
    fsync: bool = False,
    job_file: Path = JOB_FILE,
) -> list[ManifestEntry]:
    """Record the planned runs to `out` and write its manifest (see the module docstring),
    with the agent, scorer and simulated model of `job_file` (jobs/nightly's or a variant's)."""
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("*.tape")) or (out / "manifest.json").exists():
        raise SystemExit(f"{out}: already holds tapes or a manifest; give an empty folder")
    job = load_job(job_file)
    agent = load_job(JOB_FILE).spec.agent
    if job.spec.agent != agent:
        raise SystemExit(
            f"{job_file}: its agent is {job.spec.agent}; this generator plants causes in the "
            f"runs of {agent} (give jobs/nightly's job file or a variant of it)"
        )
    planned = plan(count, corrupt, seed)
    entries: list[ManifestEntry] = []
    with SimServer(job.load("policy")) as sim:
        recorded = recording(
            out,
            scorer=job.load("scorer"),
            agent=job.spec.agent,
            base_urls=BaseUrls.for_server(sim.url),
            fsync=fsync,
        )(job.load("agent"))
        for i, p in enumerate(planned):
            run = recorded.record(p.input, seed=p.seed)
            if run.mark is None or not run.mark.failing:
                raise RuntimeError(
                    f"{run.path}: planted {p.kind.name} with seed {p.seed} was not marked "
                    f"failed ({run.mark.status if run.mark else 'no mark'}): the scenario's "
                    "policy and this generator disagree"
                )
            if i < count:
                entries.append(
                    ManifestEntry(
                        tape=run.path.name,
                        planted=p.kind.name,
                        step=p.kind.step,
                        intervention=p.kind.intervention,
                        priority=p.priority,
                    )
                )
            else:
                DAMAGE[(i - count) % len(DAMAGE)](run.path)
                entries.append(
                    ManifestEntry(tape=run.path.name, planted="corrupt", priority=p.priority)
                )
    write_manifest(out, entries)
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="an empty (or new) folder for the tapes")
    parser.add_argument("--count", type=int, default=60, help="failing traces to record")
    parser.add_argument("--seed", type=int, default=0, help="the same seed, the same traces")
    parser.add_argument("--corrupt", type=int, default=0, help="damaged traces to add")
    parser.add_argument(
        "--job",
        type=Path,
        default=JOB_FILE,
        help="the job file whose model records the runs (jobs/nightly_noisy/job.toml: worded)",
    )
    args = parser.parse_args(argv)
    if args.count < 0 or args.corrupt < 0:
        parser.error("--count and --corrupt are at least 0")
    began = time.perf_counter()
    entries = generate(
        args.out, args.count, seed=args.seed, corrupt=args.corrupt, job_file=args.job
    )
    spread: dict[str, int] = {}
    for entry in entries:
        spread[str(entry.planted)] = spread.get(str(entry.planted), 0) + 1
    shown = ", ".join(f"{n} {kind}" for kind, n in spread.items())
    print(
        f"{len(entries)} failing traces ({shown}) in {time.perf_counter() - began:.1f} s "
        f"→ {args.out / 'manifest.json'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
