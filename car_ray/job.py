"""Job files (TOML): which agent, scorer and scenario policy, the input and the tape."""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from ._canon import sha256_hex
from ._files import UnreadableFile, read_regular_file
from ._imports import ImportRefError, import_ref
from .providers import Draws
from .replay import Decisions, Intervention, quiet_telemetry

_INTERVENTION: TypeAdapter[Intervention] = TypeAdapter(Intervention)


class JobFileError(ValueError):
    """A job file that cannot be used: names the file, the key and what to do."""


class ProviderSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(
        default=None, description="one server for both protocols; default: the simulated one"
    )
    openai_base_url: str | None = None
    anthropic_base_url: str | None = None
    pricing: str | None = Field(default=None, description="a pricing TOML; default configs/")
    concurrency: int = Field(default=64, ge=1, le=4096, description="forks in flight in all")
    workers: int = Field(default=2, ge=1, le=256, description="ForkWorker actors")
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)
    sim_latency_ms: float = Field(
        default=0.0, ge=0, description="added latency of the simulated provider (no base_url)"
    )
    sim_rate_429: float = Field(
        default=0.0, ge=0, le=1, description="share of simulated answers that are 429"
    )
    sim_rate_5xx: float = Field(
        default=0.0, ge=0, le=1, description="share of simulated answers that are 5xx"
    )
    sim_draws: Draws = Field(
        default="coupled",
        description="what the simulated provider does with a seed: coupled (common random "
        "numbers), seeded (an identical request reproduces, as OpenAI), unseeded (never, as "
        "Anthropic)",
    )
    max_attempts: int = Field(
        default=6,
        ge=1,
        le=20,
        description="tries of a call answered 429 / 408 / 409 / 5xx or timing out, the first "
        "included; after the last, the fork ends as provider_error and is run again",
    )


def couples_draws(provider: Mapping[str, Any]) -> bool:
    """Whether a job's provider (its `[provider]`, as a mapping) couples draws: the simulated
    one drawing `coupled` answers a held step whose request changed with the recorded draw's
    randomness. A `base_url` (a live provider), or `sim_draws` otherwise, replays no draw
    for a changed request."""
    return provider.get("base_url") is None and provider.get("sim_draws", "coupled") == "coupled"


class BudgetSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_forks: int | None = Field(default=None, ge=1)
    max_usd: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_wall_s: float | None = Field(default=None, gt=0)


InterventionKind = Literal["resample", "action", "observation", "context", "policy"]


class InterventionEntry(BaseModel):
    """One `[[interventions]]` table: a kind, the step(s) it applies to and its value
    fields (`text` / `tool_calls` / `body`, `result` / `error`, `edits`, `model` /
    `base_url`). Resample without steps means every step."""

    model_config = ConfigDict(extra="allow")

    kind: InterventionKind
    steps: list[int] | None = None

    @model_validator(mode="after")
    def _buildable(self) -> InterventionEntry:
        if self.kind != "resample" and not self.steps:
            raise ValueError(f"a {self.kind!r} intervention needs 'steps'")
        if any(k < 0 for k in self.steps or []):
            raise ValueError("steps start at 0")
        self.intervention()  # raises with the field that is wrong
        return self

    def intervention(self) -> Intervention:
        value: Intervention = _INTERVENTION.validate_python(
            {"kind": self.kind, **(self.model_extra or {})}
        )
        return value


class JobSpec(BaseModel):
    """What a job file says (`AttributionRequest`): which agent, scorer and tape, which
    interventions, the method, the budget, the provider and where results go. Refs are
    `module:attr`, imported with the job's folder and its parent on the path."""

    model_config = ConfigDict(extra="forbid")

    agent: str
    scorer: str
    policy: str | None = None
    tape: str | None = None
    tapes: list[str] = Field(default_factory=list)
    seed: int = Field(default=0, description="the simulated provider's seed when recording")
    attribution_seed: int = Field(
        default=0,
        ge=0,
        lt=1 << 30,
        description="every fork seed derives from it: two attributions with different seeds "
        "are independent trials (part of the job id)",
    )
    input: Any = None
    method: Literal["auto", "uniform"] = "auto"
    forks_per_step: int = Field(
        default=4, ge=1, le=10_000, description="method 'uniform': forks for every arm"
    )
    uniform_tail: Literal["live", "pinned", "held"] = Field(
        default="pinned", description="method 'uniform': the tail of its forks"
    )
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    target_half_width: float = Field(default=0.1, gt=0.0, le=0.5)
    out: str = "out"
    # What a model step's decision is (`replay.Decisions`): "actions" compares whole actions;
    # "decisions" reads tool calls, and a text answer through `decision_text` (regexes whose
    # groups, or whole match, are the decision; no match: the whole text). A job file that
    # does not say gets it by its provider (`_hold_by_provider`).
    hold: Literal["actions", "decisions"] = "actions"
    decision_text: list[str] = Field(default_factory=list)
    # Where the provider cannot replay a draw for a changed request (any but the coupled
    # simulated one): "estimated" keeps a choosing step's decision as a maximal coupling of
    # its recorded and its changed distribution would, estimated from a few draws
    # (`replay.Run._coupled`); "off" draws it live.
    coupling: Literal["estimated", "off"] = "estimated"
    interventions: list[InterventionEntry] = Field(
        default_factory=lambda: [InterventionEntry(kind="resample")]
    )
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    provider: ProviderSettings = Field(default_factory=ProviderSettings)

    @model_validator(mode="before")
    @classmethod
    def _hold_by_provider(cls, data: Any) -> Any:
        """`hold` where the job file does not set it: "decisions" against a provider that
        cannot replay a draw for a changed request (a base URL, or the simulated provider
        drawing otherwise than `coupled`), whose model words its answers anew at every
        draw, so that a step that only reworded its decision is not taken for a choice;
        "actions" on the coupled simulated provider (whose job ids and forks it keeps)."""
        if not isinstance(data, dict) or "hold" in data:
            return data
        provider = data.get("provider") or {}
        if isinstance(provider, BaseModel):
            provider = provider.model_dump()
        if not isinstance(provider, dict):
            return data  # the provider's own validation names what is wrong
        return {**data, "hold": "actions" if couples_draws(provider) else "decisions"}

    @field_validator("decision_text")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        Decisions.of("decisions", value)  # a pattern that does not compile is named here
        return value

    @field_validator("method", mode="before")
    @classmethod
    def _removed_method(cls, value: Any) -> Any:
        if value in ("flip", "shapley"):
            raise ValueError(
                f"method {value!r} was removed (docs/design.md, 'The comparison schemes'): "
                'use method = "auto" to attribute, or method = "uniform" with '
                f'uniform_tail = "{"live" if value == "flip" else "pinned"}" to compare'
            )
        return value


AttributionRequest = JobSpec

# Job-file keys added after job ids existed, with their defaults (`request_identity`).
LATER_KEYS: dict[str, Any] = {"hold": "actions", "decision_text": [], "coupling": "estimated"}


def request_identity(request: dict[str, Any]) -> dict[str, Any]:
    """A request (a job file's model as JSON, as job.json keeps it) as a job's identity sees
    it: without `NOT_IDENTITY`'s keys, and without keys added after job ids existed that
    hold their defaults (`LATER_KEYS`: earlier jobs keep their ids). What the provider does
    with a draw is part of it, as it changes which game the forks compute: the simulated
    provider's `sim_draws` when not "coupled", and for any provider that does not couple
    (that, or a `base_url`), what a held step does once its request changed (`coupling`, as
    `held_after_change`: a job begun before car-ray coupled decisions computed another game
    and does not resume into this one)."""
    identity = {
        k: v
        for k, v in request.items()
        if k not in NOT_IDENTITY and not (k in LATER_KEYS and v == LATER_KEYS[k])
    }
    provider = request.get("provider") or {}
    draws = provider.get("sim_draws", "coupled")
    if draws != "coupled":
        identity["sim_draws"] = draws
    if not couples_draws(provider):
        identity["held_after_change"] = request.get("coupling", LATER_KEYS["coupling"])
    return identity


# Job-file keys that are not part of a job's identity: the same request under other caps,
# another output or another provider is the same job (it resumes).
NOT_IDENTITY = frozenset({"budget", "out", "provider"})


@dataclass(frozen=True)
class Job:
    path: Path
    spec: JobSpec

    @property
    def folder(self) -> Path:
        # Absolute: Ray's workers import the job's code from other working directories.
        return self.path.absolute().parent

    @property
    def search_path(self) -> tuple[Path, ...]:
        return (self.folder.parent, self.folder)

    @property
    def tape_path(self) -> Path | None:
        return self.folder / self.spec.tape if self.spec.tape else None

    @property
    def tape_paths(self) -> list[Path]:
        """Every tape the job attributes, relative to the job file."""
        names = ([self.spec.tape] if self.spec.tape else []) + self.spec.tapes
        return [self.folder / name for name in names]

    def code_path(self) -> tuple[Path, ...]:
        """The job's search path and the folders its agent, scorer and policy were imported
        from (wherever this process found them, e.g. through PYTHONPATH): what a process
        that runs the job's code needs on sys.path. Workers of a Ray cluster the driver
        joins do not share the driver's environment; on other machines these folders must
        exist at the same paths."""
        roots = list(self.search_path)
        for key in ("agent", "scorer", "policy"):
            ref = getattr(self.spec, key)
            if not ref:
                continue
            self.load(key)
            top = sys.modules.get(ref.partition(":")[0].split(".")[0])
            file = getattr(top, "__file__", None)
            if file is None:  # a namespace package, or built in: nothing to point at
                continue
            where = Path(file).resolve()
            root = where.parent.parent if where.name == "__init__.py" else where.parent
            if root not in roots:
                roots.append(root)
        return tuple(roots)

    @property
    def name(self) -> str:
        """A readable name for the job's output folder: the job file's stem, or its folder's
        name for a `job.toml` (the scenario layout), reduced to letters, digits, `._-`."""
        stem = self.path.stem if self.path.stem != "job" else self.folder.name
        return re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:40] or "job"

    @property
    def decisions(self) -> Decisions:
        """How the job reads a model step's decision (`hold`, `decision_text`)."""
        return Decisions.of(self.spec.hold, self.spec.decision_text)

    def request_identity(self) -> dict[str, Any]:
        """The request as a job's identity sees it: everything but how much it may spend,
        where it writes and which provider answers (`NOT_IDENTITY`)."""
        return request_identity(self.spec.model_dump(mode="json"))

    def _sources(self) -> dict[str, tuple[str, str | None]]:
        """For each of the agent, scorer and policy that is set: its ref and the file its
        module comes from (None for code without a file)."""
        out: dict[str, tuple[str, str | None]] = {}
        for key in ("agent", "scorer", "policy"):
            ref = getattr(self.spec, key)
            if ref:
                self.load(key)
                file = getattr(sys.modules.get(ref.partition(":")[0]), "__file__", None)
                out[key] = (ref, None if file is None else str(file))
        return out

    def source_digests(self) -> dict[str, str]:
        """The sha256 of the source file each of the agent, scorer and policy comes from
        (`key` -> digest): a fix in the scorer is a new job, not a resume of the old one's
        rows. Code without a file (built in) is "builtin"."""
        out: dict[str, str] = {}
        for key, (_, file) in self._sources().items():
            try:
                out[key] = sha256_hex(Path(file).read_bytes()) if file else "builtin"
            except OSError:
                out[key] = "unreadable"
        return out

    def source_files(self) -> dict[str, str]:
        """The file each of the agent, scorer and policy comes from (`key` -> path; the ref
        for code without a file)."""
        return {key: file or ref for key, (ref, file) in self._sources().items()}

    def load(self, key: str) -> Any:
        ref = getattr(self.spec, key)
        if ref is None:
            raise JobFileError(f"{self.path}: key {key!r} is not set")
        if key == "agent":
            # A process that loads an agent records, replays or forks it: the tracing its
            # framework sends to a vendor is off before its module sets any up.
            quiet_telemetry()
        try:
            return import_ref(ref, f"{self.path}: {key}", self.search_path)
        except ImportRefError as exc:
            raise JobFileError(str(exc)) from None


def _inside_hint(path: Path) -> str:
    """A job folder given for its job file: name the file."""
    try:
        inside = path / "job.toml"
        return f"; did you mean {inside}?" if path.is_dir() and inside.is_file() else ""
    except OSError:
        return ""


def load_job(path: Path | str) -> Job:
    path = Path(path)
    try:
        data = tomllib.loads(read_regular_file(path).decode())
    except UnreadableFile as exc:
        raise JobFileError(f"{path}: {exc}{_inside_hint(path)}") from None
    except UnicodeDecodeError as exc:
        raise JobFileError(f"{path}: not valid TOML (not UTF-8: {exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobFileError(f"{path}: not valid TOML ({exc})") from None
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key {key!r}")
            else:
                problems.append(f"key {key!r}: {err['msg']}")
        raise JobFileError(f"{path}: " + "; ".join(problems)) from None
    return Job(path, spec)
