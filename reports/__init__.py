"""Rendering (the procedure's text format of docs/domain.md#the-procedure, the JSON report) and
report sinks."""
