"""The `iris` CLI with its client revision date set to today (run as `python -m` this module).

The LocalCluster's controller refuses clients built more than 14 days ago
(docs/domain.md#iris-job-and-task-states); the installed wheel's build date is older, so tests run
the CLI through this shim.
"""

from __future__ import annotations

import datetime
import sys
import warnings

__all__ = ["main", "patch_revision_date"]


def patch_revision_date() -> None:
    """Make this process's iris client report today's date as its revision date."""
    import iris.version
    from iris.cluster.client import remote_client

    today = datetime.date.today().isoformat()
    iris.version._CACHED = today
    iris.version.client_revision_date = lambda: today
    remote_client.client_revision_date = lambda: today


def main() -> None:
    """Patch, then run the real CLI with this process's arguments."""
    warnings.simplefilter("ignore")
    patch_revision_date()
    from iris.cli import iris

    sys.argv[0] = "iris"
    sys.exit(iris())


if __name__ == "__main__":
    main()
