"""The native stat-line pass (worker/evidence/logs/_fastscan.c); everything else is in
pyproject.toml. The extension is optional: where it cannot be compiled the package still installs
and the parser takes its polars path for every line (identical tables, slower);
tests/unit/test_logs_native.py fails when it is missing from a venv that `make venv` built."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "worker.evidence.logs._fastscan",
            sources=["worker/evidence/logs/_fastscan.c"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
