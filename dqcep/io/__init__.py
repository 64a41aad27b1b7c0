"""Sources and sinks: event files and MQTT in, matches out, the durable journal between."""
from dqcep.io.readers import FORMATS, EventInputError, read_events
from dqcep.io.sinks import match_line, open_match_sink

__all__ = ["EventInputError", "read_events", "FORMATS", "match_line", "open_match_sink"]
