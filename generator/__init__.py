"""Synthetic event streams for experiments, tests, benchmarks and demos.

    >>> from generator import GeneratorConfig, generate
    >>> batches = list(generate(GeneratorConfig(profile="uniform", events=1000, seed=1), 400))
    >>> [len(b) for b in batches]
    [400, 400, 200]

``generate`` yields ``dqcep.batch.EventBatch`` chunks (columnar numpy arrays);
the command line (``dqcep generate`` / ``python -m generator``) writes them as
JSON Lines, msgpack, CSV or Parquet, or publishes them over MQTT.
"""
from generator.config import GeneratorConfig, Imperfections, Planting, load_scenario
from generator.core import BLOCK, StreamGenerator, Summary, generate
from generator.profiles import IotConfig, StockConfig, UniformConfig

__all__ = ["generate", "StreamGenerator", "GeneratorConfig", "Imperfections", "Planting",
           "load_scenario", "Summary", "BLOCK", "IotConfig", "StockConfig", "UniformConfig"]
