"""Synthetic event streams for experiments, tests, benchmarks and demos.

    >>> from dqcep.generator import GeneratorConfig, generate
    >>> batches = list(generate(GeneratorConfig(profile="uniform", events=1000, seed=1), 400))
    >>> [len(b) for b in batches]
    [400, 400, 200]

``generate`` yields ``dqcep.core.batch.EventBatch`` chunks (columnar numpy arrays);
the command line (``dqcep generate``) writes them as
JSON Lines, msgpack, CSV or Parquet, or publishes them over MQTT.
"""
from dqcep.generator.config import GeneratorConfig, Imperfections, Planting, load_scenario
from dqcep.generator.core import BLOCK, StreamGenerator, Summary, generate
from dqcep.generator.profiles import IotConfig, StockConfig, UniformConfig

__all__ = ["generate", "StreamGenerator", "GeneratorConfig", "Imperfections", "Planting",
           "load_scenario", "Summary", "BLOCK", "IotConfig", "StockConfig", "UniformConfig"]
