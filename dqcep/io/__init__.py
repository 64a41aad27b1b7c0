"""Sources and sinks: event files in and matches out (MQTT comes with the streaming service)."""
from dqcep.io.readers import EventInputError, read_events, FORMATS
from dqcep.io.writers import write_matches

__all__ = ["EventInputError", "read_events", "write_matches", "FORMATS"]
