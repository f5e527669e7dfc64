"""What the tests and the benchmark share: generated logs and job bundles, the hostile-input
corpus, the real services (redis-server, moto's S3 server, the pipeline's processes), a marin-iris
LocalCluster with its toy jobs, and the tests' verdict keys.

`tests/` and `bench/` import from here; this package imports from neither. It is not part of the
wheel (pyproject.toml's `packages.find`).
"""
