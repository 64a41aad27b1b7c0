"""The streaming service (``dqcep run ... --input mqtt://...``) and what runs it:

- ``streaming``: one service: MQTT -> journal -> pipeline -> sinks, checkpoints,
  recovery (``StreamingService``, ``ServiceConfig``, ``serve``)
- ``workers``: the service as worker processes, a journal consumer per query,
  placed and re-planned by the capacity model (``serve_workers``)
- ``response``: the response times it measures
"""
from dqcep.service.streaming import ServiceConfig, ServiceError, StreamingService, serve

__all__ = ["ServiceConfig", "ServiceError", "StreamingService", "serve"]
