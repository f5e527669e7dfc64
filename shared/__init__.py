"""The contract shared by watcher, worker and supervisor: models, settings, streams, helpers."""
