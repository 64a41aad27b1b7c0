"""The streaming service (``dqcep run ... --input mqtt://...``) and what runs it:

- ``streaming``: one service: MQTT -> journal -> pipeline -> sinks, checkpoints,
  recovery (``StreamingService``, ``ServiceConfig``, ``serve``)
- ``coordinator``: the service as worker processes (``--workers``), a journal
  consumer per query, placed and re-planned by the capacity model (``serve_workers``);
  ``worker``: a worker process and the messages it and the coordinator exchange
- ``changes``: the query set and its live changes; ``stats``: the figures both the
  service and the coordinator show; ``recovery``: what a start checks of a checkpoint,
  and the files cut back to it
- ``response``: the response times it measures
- ``http``, ``metrics``, ``page.html``: the HTTP side (``--http``): the live page,
  ``/status``, Prometheus's ``/metrics``; ``client``: what ``dqcep status`` uses

The names below are imported on first use, so that ``dqcep.service.client`` stays
light (no numpy, no engine) for the commands that only talk to a service.
"""
__all__ = ["ServiceConfig", "StreamingService", "serve"]


def __getattr__(name: str):
    if name in __all__:
        from dqcep.service import streaming
        return getattr(streaming, name)
    raise AttributeError(f"module 'dqcep.service' has no attribute {name!r}")
