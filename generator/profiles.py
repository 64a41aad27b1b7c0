"""Event profiles: what the background stream looks like.

A profile has a ``schema`` and produces blocks: ``block(rng, n, t0)`` returns n
events in true-time order (ts, type codes, source codes, attribute columns)
starting after time ``t0`` (float ms). Everything is vectorized numpy except the
per-source random walks (``dqcep.generator._walk``). State that must survive a
block boundary (walk positions) lives on the profile, so a stream is the same
whatever the output chunk size.

``sample(rng, type_code, n)`` draws attribute values for events of one type
without advancing the stream (used to plant pattern occurrences).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dqcep.generator._walk import reflected_walk
from dqcep.core.batch import Schema, missing_column

DAY_MS = 86_400_000


@dataclass
class Block:
    ts: np.ndarray          # float64 true time, ms
    type: np.ndarray        # int32
    source: np.ndarray      # int32 (device / symbol / type): clock skew is per source
    columns: dict[str, np.ndarray]


def _gaps(rng, n: int, rate_per_s: float) -> np.ndarray:
    return rng.exponential(1000.0 / rate_per_s, n)


def _categorical(rng, cdf: np.ndarray, n: int) -> np.ndarray:
    """n draws from the distribution with cumulative probabilities ``cdf`` (int32)."""
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"),
                      len(cdf) - 1).astype(np.int32)


def _zipf_probabilities(k: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, k + 1) ** s
    return w / w.sum()


# ----------------------------------------------------------------- uniform


@dataclass
class UniformConfig:
    types: int = 5              # k event types T0..T{k-1}
    zipf: float = 0.0           # 0: uniform type frequencies; s > 0: Zipf(s)
    attributes: int = 2         # integer attributes a0..a{m-1}
    domain: int = 100           # a_i uniform in [0, domain): equality selectivity 1/domain
    keys: int = 10              # attribute `key` uniform in [0, keys): partitions
    event_rate: float = 1000.0  # events per second of event time


class UniformProfile:
    """k types with uniform or Zipf frequencies; the paper-style experiment knobs.

    Attributes: ``a0..a{m-1}`` integers in [0, domain), ``x`` a float uniform in
    [0, 1) (so ``e.x < s`` has selectivity s), ``key`` an integer in [0, keys).
    """

    name = "uniform"

    def __init__(self, cfg: UniformConfig):
        if cfg.types < 1 or cfg.domain < 1 or cfg.keys < 1 or cfg.attributes < 0:
            raise ValueError("uniform: types, domain and keys must be >= 1, attributes >= 0")
        self.cfg = cfg
        attrs = [(f"a{i}", "int") for i in range(cfg.attributes)] + [("x", "float"),
                                                                       ("key", "int")]
        self.schema = Schema(tuple(f"T{i}" for i in range(cfg.types)), tuple(attrs))
        self.cdf = np.cumsum(_zipf_probabilities(cfg.types, cfg.zipf))
        self.n_sources = cfg.types

    def _attrs(self, rng, n):
        cols = {f"a{i}": rng.integers(0, self.cfg.domain, n) for i in range(self.cfg.attributes)}
        cols["x"] = rng.random(n)
        cols["key"] = rng.integers(0, self.cfg.keys, n)
        return cols

    def block(self, rng, n: int, t0: float) -> Block:
        ts = t0 + np.cumsum(_gaps(rng, n, self.cfg.event_rate))
        types = _categorical(rng, self.cdf, n)
        return Block(ts, types, types.copy(), self._attrs(rng, n))

    def sample(self, rng, type_code: int, n: int) -> dict[str, np.ndarray]:
        return self._attrs(rng, n)


# --------------------------------------------------------------------- iot

SENSORS = {
    # type: (attribute, kind, lo, hi, base, diurnal amplitude, walk step, spike p, spike size, rate/s)
    "Temperature": ("value", "float", -10.0, 60.0, 21.0, 3.0, 0.15, 0.002, 25.0, 1.0),
    "Humidity": ("value", "float", 0.0, 100.0, 45.0, 10.0, 0.5, 0.0, 0.0, 0.2),
    "Smoke": ("density", "float", 0.0, 10.0, 0.3, 0.0, 0.05, 0.003, 6.0, 0.5),
    "Light": ("lux", "float", 0.0, 2000.0, 300.0, 400.0, 5.0, 0.0, 0.0, 0.1),
    "Motion": ("active", "bool", 0.0, 1.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.5),
    "Door": ("open", "bool", 0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.05),
}


@dataclass
class IotConfig:
    sites: int = 2
    rooms: int = 5                      # rooms per site
    devices: dict[str, int] = field(default_factory=lambda: {s: 1 for s in SENSORS})
    rates: dict[str, float] = field(default_factory=dict)  # per-device events/s, by type


class IotProfile:
    """Sites x rooms x devices, each device one sensor type with its own rate.

    Numeric sensors follow a random walk with reflecting bounds per device, plus
    a diurnal cycle (a sine over the day of event time) and rare spikes; boolean
    sensors (Motion.active, Door.open) are Bernoulli. Every event carries
    ``device``, ``room`` and ``site``.
    """

    name = "iot"

    def __init__(self, cfg: IotConfig):
        unknown = set(cfg.devices) - set(SENSORS) | set(cfg.rates) - set(SENSORS)
        if unknown:
            raise ValueError(f"iot: unknown sensor type(s) {sorted(unknown)}; "
                             f"known: {', '.join(SENSORS)}")
        if cfg.sites < 1 or cfg.rooms < 1:
            raise ValueError("iot: sites and rooms must be >= 1")
        self.cfg = cfg
        types = tuple(SENSORS)
        devices, rooms, sites, dev_type, dev_room, dev_site, rate = [], [], [], [], [], [], []
        for s in range(1, cfg.sites + 1):
            sites.append(f"site{s}")
            for r in range(1, cfg.rooms + 1):
                room = f"site{s}/room{r}"
                rooms.append(room)
                for t, sensor in enumerate(types):
                    for d in range(1, cfg.devices.get(sensor, 0) + 1):
                        devices.append(f"{room}/{sensor.lower()}-{d}")
                        dev_type.append(t)
                        dev_room.append(len(rooms) - 1)
                        dev_site.append(len(sites) - 1)
                        rate.append(cfg.rates.get(sensor, SENSORS[sensor][9]))
        if not devices:
            raise ValueError("iot: no devices configured")
        self.dev_type = np.array(dev_type, np.int32)
        self.dev_room = np.array(dev_room, np.int32)
        self.dev_site = np.array(dev_site, np.int32)
        rate = np.array(rate, float)
        self.total_rate = rate.sum()
        self.cdf = np.cumsum(rate / self.total_rate)
        self.n_sources = len(devices)
        attrs = [("device", "str"), ("room", "str"), ("site", "str")]
        for name, kind, *_ in SENSORS.values():
            if (name, kind) not in attrs:
                attrs.append((name, kind))
        self.schema = Schema(types, tuple(attrs), (("device", tuple(devices)),
                                                   ("room", tuple(rooms)),
                                                   ("site", tuple(sites))))
        spec = [SENSORS[types[t]] for t in dev_type]
        self.lo = np.array([s[2] for s in spec])
        self.hi = np.array([s[3] for s in spec])
        self.state = np.array([s[4] for s in spec], float)  # walk position per device

    def block(self, rng, n: int, t0: float) -> Block:
        ts = t0 + np.cumsum(_gaps(rng, n, self.total_rate))
        dev = _categorical(rng, self.cdf, n)
        types = self.dev_type[dev]
        cols = {"device": dev.copy(), "room": self.dev_room[dev], "site": self.dev_site[dev]}
        step_sd = np.array([SENSORS[self.schema.types[t]][6] for t in range(len(SENSORS))])
        steps = rng.normal(0.0, 1.0, n) * step_sd[types]
        walk = reflected_walk(dev, steps, self.state, self.lo, self.hi)
        spikes = rng.random(n)
        flips = rng.random(n)
        self._fill_values(cols, types, ts, walk, spikes, flips)
        return Block(ts, types.astype(np.int32), dev, cols)

    def _fill_values(self, cols, types, ts, walk, spikes, flips):
        n = len(types)
        phase = np.sin(2 * math.pi * (np.mod(ts, DAY_MS) / DAY_MS - 0.25))
        for t, sensor in enumerate(self.schema.types):
            name, kind, lo, hi, base, amp, _, spike_p, spike, _ = SENSORS[sensor]
            mine = types == t
            if name not in cols:
                cols[name] = missing_column(kind, n)
            if kind == "bool":
                cols[name][mine] = (flips[mine] < base).astype(np.int8)
                continue
            v = walk[mine] + amp * phase[mine] + np.where(spikes[mine] < spike_p, spike, 0.0)
            # two decimals: readable, and immune to last-bit differences of sin()
            cols[name][mine] = np.round(np.clip(v, lo, hi), 2)

    def sample(self, rng, type_code: int, n: int) -> dict[str, np.ndarray]:
        devs = np.flatnonzero(self.dev_type == type_code)
        dev = rng.choice(devs, n).astype(np.int32)
        cols = {"device": dev.copy(), "room": self.dev_room[dev], "site": self.dev_site[dev]}
        walk = rng.uniform(self.lo[dev], self.hi[dev])
        types = np.full(n, type_code, np.int32)
        self._fill_values(cols, types, np.zeros(n), walk, rng.random(n), rng.random(n))
        return cols


# -------------------------------------------------------------------- stock


@dataclass
class StockConfig:
    symbols: int = 20
    zipf: float = 1.0           # popularity of symbols
    event_rate: float = 1000.0  # ticks per second of event time
    volatility: float = 0.002   # sd of the log-price step per tick
    names: tuple = ()           # the symbols' names (default S000, S001, ...)
    price_step: float = 0.01    # prices are multiples of it (1: integer prices)
    min_price: float = 1.0
    max_price: float = 10_000.0
    random_walk: bool = True    # false: every tick's price uniform in [min, max]


class StockProfile:
    """SASE-style stock ticks: the event type is the symbol; price and volume.

    Prices follow a reflected random walk of the log price per symbol (between
    ``min_price`` and ``max_price``), or with ``random_walk`` false are drawn
    uniformly from that range for every tick (as the SASE engine's stock
    streams draw them); they are rounded to multiples of ``price_step`` (an
    integer step gives an integer ``price`` column, as the SASE engine's stock
    streams have); volumes are log-normal, in lots of 100.
    """

    name = "stock"

    def __init__(self, cfg: StockConfig):
        if cfg.symbols < 1:
            raise ValueError("stock: symbols must be >= 1")
        if cfg.names and len(cfg.names) != cfg.symbols:
            raise ValueError(f"stock: {len(cfg.names)} names for {cfg.symbols} symbols")
        if cfg.names and (len(set(cfg.names)) != len(cfg.names)
                          or not all(isinstance(n, str) and n for n in cfg.names)):
            raise ValueError("stock: names must be distinct, non-empty strings")
        if not 0 < cfg.min_price < cfg.max_price:
            raise ValueError("stock: prices need 0 < min_price < max_price")
        if cfg.price_step <= 0:
            raise ValueError("stock: price_step must be > 0")
        self.cfg = cfg
        symbols = tuple(cfg.names) or tuple(f"S{i:03d}" for i in range(cfg.symbols))
        self.integer_prices = cfg.price_step >= 1 and float(cfg.price_step).is_integer()
        self.schema = Schema(symbols, (("symbol", "str"),
                                       ("price", "int" if self.integer_prices else "float"),
                                       ("volume", "int")), (("symbol", symbols),))
        self.cdf = np.cumsum(_zipf_probabilities(cfg.symbols, cfg.zipf))
        self.n_sources = cfg.symbols
        self.lo = np.full(cfg.symbols, math.log(cfg.min_price))
        self.hi = np.full(cfg.symbols, math.log(cfg.max_price))
        # start between 10 and 500 where the range holds them, else anywhere in it
        first, last = max(cfg.min_price, 10.0), min(cfg.max_price, 500.0)
        if first >= last:
            first, last = cfg.min_price, cfg.max_price
        self.state = np.random.default_rng(0).uniform(math.log(first), math.log(last),
                                                      cfg.symbols)  # log price per symbol

    def block(self, rng, n: int, t0: float) -> Block:
        ts = t0 + np.cumsum(_gaps(rng, n, self.cfg.event_rate))
        sym = _categorical(rng, self.cdf, n)
        if self.cfg.random_walk:
            logp = reflected_walk(sym, rng.normal(0, self.cfg.volatility, n), self.state,
                                  self.lo, self.hi)
        else:
            logp = np.log(rng.uniform(self.cfg.min_price, self.cfg.max_price, n))
        return Block(ts, sym, sym.copy(), self._cols(rng, sym, logp))

    def _cols(self, rng, sym, logp):
        volume = (np.ceil(rng.lognormal(1.0, 1.0, len(sym))) * 100).astype(np.int64)
        step = self.cfg.price_step
        price = np.clip(np.round(np.exp(logp) / step) * step, self.cfg.min_price,
                        self.cfg.max_price)
        if self.integer_prices:
            price = price.astype(np.int64)
        elif step == 0.01:
            price = np.round(price, 2)  # cents print as cents
        return {"symbol": sym.copy(), "price": price, "volume": volume}

    def sample(self, rng, type_code: int, n: int) -> dict[str, np.ndarray]:
        sym = np.full(n, type_code, np.int32)
        if self.cfg.random_walk:
            logp = self.state[type_code] + rng.normal(0, self.cfg.volatility * 10, n)
        else:
            logp = np.log(rng.uniform(self.cfg.min_price, self.cfg.max_price, n))
        return self._cols(rng, sym, logp)


PROFILES = {"uniform": (UniformProfile, UniformConfig), "iot": (IotProfile, IotConfig),
            "stock": (StockProfile, StockConfig)}
