"""The native stat-line pass (worker/evidence/logs/_fastscan.c); everything else is in
pyproject.toml. The parser falls back to its polars path when the extension is not built."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "worker.evidence.logs._fastscan",
            sources=["worker/evidence/logs/_fastscan.c"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-Werror"],
        )
    ]
)
