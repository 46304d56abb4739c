"""Job files (TOML): which agent, scorer and scenario policy, the input and the tape."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._imports import ImportRefError, import_ref


class JobFileError(ValueError):
    """A job file that cannot be used: names the file, the key and what to do."""


class ProviderSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(
        default=None, description="one server for both protocols; default: the simulated one"
    )
    openai_base_url: str | None = None
    anthropic_base_url: str | None = None


class JobSpec(BaseModel):
    """What a job file says. Refs are `module:attr`, imported with the job's folder and its
    parent on the path."""

    model_config = ConfigDict(extra="forbid")

    agent: str
    scorer: str
    policy: str | None = None
    tape: str | None = None
    seed: int = 0
    input: Any = None
    provider: ProviderSettings = Field(default_factory=ProviderSettings)


@dataclass(frozen=True)
class Job:
    path: Path
    spec: JobSpec

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def search_path(self) -> tuple[Path, ...]:
        return (self.folder.parent, self.folder)

    @property
    def tape_path(self) -> Path | None:
        return self.folder / self.spec.tape if self.spec.tape else None

    def load(self, key: str) -> Any:
        ref = getattr(self.spec, key)
        if ref is None:
            raise JobFileError(f"{self.path}: key {key!r} is not set")
        try:
            return import_ref(ref, f"{self.path}: {key}", self.search_path)
        except ImportRefError as exc:
            raise JobFileError(str(exc)) from None


def load_job(path: Path | str) -> Job:
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise JobFileError(f"{path}: no such job file") from None
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
