"""The 10 example queries over the iot generator's sensors, and the map of one reading
a message (``sensors/<type>/<device>``, the docs' map shape): what bench_front_door.py
drains and what the compiled map's end-to-end test matches against a file run."""
from __future__ import annotations

from pathlib import Path

from tests.support.paths import ROOT

TOPIC = "sensors/{type}/{device}"
MAP = """[[topic]]
filter = "sensors/+/#"
levels = "_/type"
"""
IOT_TYPES = {"Temperature", "Smoke", "Door", "Motion", "Humidity", "Light", "Rain",
             "Window", "Alarm"}


def example_queries(path: Path) -> int:
    """The 10 example queries over the iot sensors in one file: every query of
    dqcep/data/iot.cep and examples/*.cep whose event types the iot profile sends, the
    first of each name. Returns how many."""
    from dqcep.lang import ast, parse_file, to_source

    def types(item) -> set[str]:
        if isinstance(item, (ast.EventPattern, ast.Kleene)):
            return {item.type}
        if isinstance(item, ast.Negation):
            return types(item.pattern)
        return set().union(*(types(i) for i in item.items))

    seen, texts = set(), []
    # the building recipes are over a device map's events (examples/devices.toml), not
    # the iot profile's, though they name some of its types (Door, Temperature)
    over_devices = {"building.cep", "door-untied.cep"}
    for f in [ROOT / "dqcep/data/iot.cep", *sorted(f for f in (ROOT / "examples").glob("*.cep")
                                                   if f.name not in over_devices)]:
        for q in parse_file(str(f)).queries:
            if q.name not in seen and types(q.pattern) <= IOT_TYPES:
                seen.add(q.name)
                texts.append(to_source(q))
    path.write_text(";\n\n".join(texts) + "\n")
    return len(texts)
