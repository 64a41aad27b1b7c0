"""Sources and sinks: event files and MQTT in, matches out, the durable journal between."""
from dqcep.io.readers import FORMATS, EventInputError, read_events
from dqcep.io.match_text import match_line
from dqcep.io.sinks import open_match_sink

__all__ = ["EventInputError", "read_events", "FORMATS", "match_line", "open_match_sink"]
