"""Generator configuration: defaults, scenario files (JSON or TOML), validation.

A scenario file holds any of these sections; command-line options override it::

    profile = "iot"              # iot | stock | uniform
    events = 100000
    seed = 7
    start_ts = 1700000000000     # event time of the stream's start, ms

    [iot]                        # or [stock] / [uniform]: the profile's knobs
    sites = 2
    rooms = 5
    devices = { Temperature = 2, Smoke = 1 }
    rates = { Temperature = 2.0 }

    [imperfections]
    out_of_order = 0.1           # share of events delayed by up to `slack` ms
    slack = 500
    late = 0.01                  # share delayed beyond the slack, up to late_max ms
    late_max = 5000
    duplicates = 0.01
    missing_attributes = 0.02
    malformed = 0.001
    clock_skew = 200             # per-source offset, uniform in [-skew, +skew] ms

    [plant]
    queries = "examples/fire.cep"   # relative to the scenario file
    query = "fire"                  # which query (default: every query of the file)
    every = 5000                    # one occurrence per `every` ms of event time
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dqcep.core.errors import UserError
from dqcep.generator.profiles import PROFILES


@dataclass
class Imperfections:
    out_of_order: float = 0.0
    slack: int = 1000
    late: float = 0.0
    late_max: int = 10_000
    duplicates: float = 0.0
    missing_attributes: float = 0.0
    malformed: float = 0.0
    clock_skew: int = 0

    def validate(self) -> None:
        for name in ("out_of_order", "late", "duplicates", "missing_attributes", "malformed"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise UserError(f"imperfections.{name} must be a fraction in [0, 1], got {v}")
        if self.out_of_order + self.late > 1.0:
            raise UserError("imperfections: out_of_order + late must not exceed 1")
        if self.slack < 0 or self.clock_skew < 0 or self.late_max < self.slack:
            raise UserError("imperfections: slack and clock_skew must be >= 0 and "
                            "late_max >= slack")


@dataclass
class Planting:
    queries: str | None = None  # query file
    query: str | None = None    # one query of it (default: all)
    every: int | None = None    # ms of event time between occurrences (None: default_every)


@dataclass
class GeneratorConfig:
    profile: str = "iot"
    events: int = 10_000
    seed: int = 0
    start_ts: int = 1_700_000_000_000
    profile_config: Any = None
    imperfections: Imperfections = field(default_factory=Imperfections)
    plant: Planting = field(default_factory=Planting)

    def __post_init__(self):
        if self.profile not in PROFILES:
            raise UserError(f"unknown profile {self.profile!r}; expected one of "
                            f"{', '.join(PROFILES)}")
        if self.profile_config is None:
            self.profile_config = PROFILES[self.profile][1]()
        if self.events < 0:
            raise UserError(f"events must be >= 0, got {self.events}")
        self.imperfections.validate()


def _build(cls, data: dict, where: str):
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a table/object")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(names)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                        f"expected {', '.join(names)}")
    out = {}
    for key, value in data.items():
        default = names[key].default
        if default is not dataclasses.MISSING and default is not None:
            want = type(default)
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if want is tuple and isinstance(value, list):  # TOML / JSON arrays
                value = tuple(value)
            if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
                kind = "a list" if want is tuple else want.__name__
                raise UserError(f"{where}.{key} must be {kind}, got {value!r}")
        out[key] = value
    try:
        return cls(**out)
    except ValueError as err:
        raise UserError(f"{where}: {err}") from None


def load_scenario(path: str | None, overrides: dict[str, Any]) -> GeneratorConfig:
    """Defaults, then the scenario file, then the command-line overrides."""
    data: dict = {}
    base = Path(".")
    if path:
        p = Path(path)
        base = p.parent
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as err:
            raise UserError(f"cannot read scenario {path}: {err.strerror}") from None
        try:
            data = tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise UserError(f"{path}: invalid TOML: {err}") from None
        except json.JSONDecodeError as err:
            raise UserError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: a scenario must be an object/table")
    if path and isinstance(data.get("plant"), dict) and data["plant"].get("queries"):
        queries = Path(data["plant"]["queries"])  # relative to the scenario file
        data["plant"]["queries"] = str(queries if queries.is_absolute() else base / queries)
    for key, value in overrides.items():  # "events", or dotted: "plant.every"
        if value is None:
            continue
        section, _, name = key.rpartition(".")
        target = data.setdefault(section, {}) if section else data
        if not isinstance(target, dict):
            raise UserError(f"scenario: {section} must be a table/object")
        target[name] = value
    profile = data.pop("profile", "iot")
    if profile not in PROFILES:
        raise UserError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    sections = {name: data.pop(name, {}) for name in PROFILES}
    imperfections = _build(Imperfections, data.pop("imperfections", {}), "imperfections")
    plant = _build(Planting, data.pop("plant", {}), "plant")
    top = {k: data.pop(k) for k in ("events", "seed", "start_ts") if k in data}
    if data:
        raise UserError(f"scenario: unknown key(s) {', '.join(sorted(data))}")
    for k, v in top.items():
        if not isinstance(v, int) or isinstance(v, bool):
            raise UserError(f"{k} must be an integer, got {v!r}")
    cfg_cls = PROFILES[profile][1]
    return GeneratorConfig(profile=profile, profile_config=_build(cfg_cls, sections[profile],
                                                                  profile),
                           imperfections=imperfections, plant=plant, **top)
