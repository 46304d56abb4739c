"""Token prices (configs/pricing.toml): what a live call costs."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ._types import Usage

DEFAULT_PRICING = Path(__file__).resolve().parents[2] / "configs" / "pricing.toml"


@dataclass(frozen=True)
class Price:
    input_usd_per_mtok: float
    output_usd_per_mtok: float


@dataclass(frozen=True)
class PriceTable:
    default: Price = Price(1.0, 4.0)
    models: dict[str, Price] = field(default_factory=dict)

    def cost_usd(self, model: str, usage: Usage) -> float:
        price = self.models.get(model, self.default)
        return (
            usage.input_tokens * price.input_usd_per_mtok
            + usage.output_tokens * price.output_usd_per_mtok
        ) / 1e6

    @classmethod
    def load(cls, path: Path | None = None) -> PriceTable:
        """Read a pricing file; a missing default file gives the built-in default price."""
        path = path or DEFAULT_PRICING
        if not path.exists():
            if path == DEFAULT_PRICING:
                return cls()
            raise FileNotFoundError(f"pricing file {path} does not exist")
        with path.open("rb") as f:
            data = tomllib.load(f)

        def price(where: str, raw: object) -> Price:
            if not isinstance(raw, dict):
                raise ValueError(f"{path}: [{where}] must be a table")
            unknown = set(raw) - {"input_usd_per_mtok", "output_usd_per_mtok"}
            if unknown:
                raise ValueError(f"{path}: [{where}] has unknown key(s) {sorted(unknown)}")
            try:
                p = Price(float(raw["input_usd_per_mtok"]), float(raw["output_usd_per_mtok"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(
                    f"{path}: [{where}] needs numeric input_usd_per_mtok and "
                    f"output_usd_per_mtok ({exc})"
                ) from None
            if p.input_usd_per_mtok < 0 or p.output_usd_per_mtok < 0:
                raise ValueError(f"{path}: [{where}] prices must not be negative")
            return p

        unknown = set(data) - {"default", "models"}
        if unknown:
            raise ValueError(f"{path}: unknown section(s) {sorted(unknown)}")
        models = data.get("models", {})
        return cls(
            default=price("default", data["default"]) if "default" in data else Price(1.0, 4.0),
            models={name: price(f'models."{name}"', raw) for name, raw in models.items()},
        )
