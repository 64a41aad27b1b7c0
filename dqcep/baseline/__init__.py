"""The engines the native runtime is checked and measured against:

- ``reference``: the readable oracle every engine is tested against, match for match
  (``dqcep run --engine reference``);
- ``sase``: the SASE-style baseline of the experiments (``dqcep run --engine sase``).

The names below are imported on first use: the reference needs no kernel.
"""
__all__ = ["SaseEngine", "compile_sase"]


def __getattr__(name: str):
    if name in __all__:
        from dqcep.baseline import sase
        return getattr(sase, name)
    raise AttributeError(f"module 'dqcep.baseline' has no attribute {name!r}")
