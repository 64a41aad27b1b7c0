"""The DQCEP paper's experiments, reproducible with one command:
``dqcep experiment fig3|fig4|sharing|latency|all --out DIR`` (docs/experiments.md)."""
