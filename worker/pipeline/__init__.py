"""The adapters around the pure core: everything that talks to Redis, Celery, S3 or a cluster.

app       the Celery application (broker and result backend settings)
tasks     thin Celery tasks and the workflow that joins them (capture → gates → verdict → publish)
steps     the pipeline steps the tasks call, each safe to run twice
ingest    the alert consumer: validation, dead letter, coalescing
coalesce  one diagnosis in flight per job (Lua scripts on Redis)
store     the S3 adapter (write-once) and its in-memory fake
failures  every failure classified in one place: retry, reject, report
capture   the capture policy: bundle first, live probes only when the rules call for them

Nothing in `worker.evidence`, `worker.gates`, `worker.verdict` or the `reports` renderers imports
from here.
"""
