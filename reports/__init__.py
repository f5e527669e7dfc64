"""Rendering (the seed's text format, the JSON report) and report sinks."""
