"""Response-time targets for the service (``--target``, ``dqcep capacity``,
``dqcep calibrate``): ``model``, the M/G/1 capacity model, its calibration and the
placement of queries on workers; ``calibrate``, the measurement that writes a
calibration file (see docs/capacity.md)."""
