"""Capture, evidence, gates, verdict, backends and the Celery pipeline of rl-job-health."""
