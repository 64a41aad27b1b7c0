"""Workloads of the experiments: a generator profile and a query file each.

Every query is inside the SASE subset (SEQ with NOT of single events), so both
engines run all of them; together they cover 2-4 variables, with and without
[attr] equivalence, predicates and negation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

UNIFORM_QUERIES = """\
-- 2 variables, equivalence
QUERY u2_key PATTERN SEQ(T0 a, T1 b) WHERE [key] WITHIN 1 s;
-- 3 variables, equivalence and a predicate between variables
QUERY u3_key_pred PATTERN SEQ(T0 a, T1 b, T2 c) WHERE [key] AND a.a0 < b.a0 WITHIN 1 s;
-- 3 variables, no equivalence: equality predicates only
QUERY u3_eq PATTERN SEQ(T0 a, T1 b, T2 c) WHERE a.a0 = b.a0 AND b.a0 = c.a0 WITHIN 1 s;
-- 4 variables, a negation in a gap, equivalence, a single-variable predicate
QUERY u4_neg PATTERN SEQ(T0 a, NOT T3 n, T1 b, T2 c, T4 d) WHERE [key] AND d.x < 0.5 WITHIN 1 s
"""

IOT_QUERIES = """\
-- 2 variables, negation in the gap, equivalence, predicates
QUERY overheating PATTERN SEQ(Temperature t, NOT Door d, Smoke s)
WHERE [room] AND t.value > 35 AND s.density > 2 AND d.open = true WITHIN 1 min;
-- 2 variables, equivalence, predicates
QUERY intrusion PATTERN SEQ(Door d, Motion m) WHERE [room] AND d.open = true
AND m.active = true WITHIN 10 s;
-- 4 variables, equivalence, a predicate between variables
QUERY rising PATTERN SEQ(Humidity h, Temperature t1, Temperature t2, Smoke s)
WHERE [room] AND h.value > 40 AND t2.value > t1.value AND s.density > 3 WITHIN 10 s;
-- 3 variables, no equivalence (the same site through equalities), a trailing negation
QUERY site_walk PATTERN SEQ(Door d, Motion m, Light l, NOT Door x)
WHERE d.site = m.site AND m.site = l.site AND m.active = true AND x.site = d.site
WITHIN 10 s
"""


def sharing_queries(k: int) -> str:
    """k queries with a common SEQ(T0, T1) prefix (one vertex when shared) and one of
    six third types, each with its own threshold."""
    return ";\n".join(f"QUERY s{i} PATTERN SEQ(T0 a, T1 b, T{2 + i % 6} c) "
                      f"WHERE [key] AND c.a0 < {100 + 9 * i} WITHIN 1 s" for i in range(k))


@dataclass(frozen=True)
class Workload:
    name: str
    profile: str
    queries: str
    profile_config: Callable[[], object]
    description: str

    def stream(self, events: int, seed: int, chunk: int) -> Iterator:
        """The generated stream as columnar batches of ``chunk`` events (lazily)."""
        from dqcep.generator import GeneratorConfig, generate
        cfg = GeneratorConfig(profile=self.profile, events=events, seed=seed,
                              profile_config=self.profile_config())
        return generate(cfg, chunk)


def _uniform():
    from dqcep.generator import UniformConfig
    return UniformConfig(types=8, keys=100, attributes=1, domain=1000, event_rate=1000)


def _iot():
    from dqcep.generator import IotConfig
    return IotConfig(sites=4, rooms=5)


WORKLOADS = {
    "uniform": Workload("uniform", "uniform", UNIFORM_QUERIES, _uniform,
                        "uniform profile: 8 types, 100 keys, a0 in [0, 1000), "
                        "1000 events/s; 4 queries"),
    "iot": Workload("iot", "iot", IOT_QUERIES, _iot,
                    "iot profile: 4 sites x 5 rooms, one sensor of each type per room; "
                    "4 queries"),
}
SHARING = Workload("sharing", "uniform", "", _uniform,
                   "uniform profile; k queries SEQ(T0 a, T1 b, T{2 + i mod 6} c) "
                   "WHERE [key] AND c.a0 < 100 + 9i WITHIN 1 s")
