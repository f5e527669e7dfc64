"""One job's evidence as a whole, as of `now`: what one diagnosis judges, with its facts.

The pieces live in `worker.evidence.model`; the facts derived from them in `worker.evidence.facts`.
This module sits above both so that neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from worker.evidence.facts import Facts, derive
from worker.evidence.model import BundleInfo, LogTables, ModeDecision, ProbeEvidence, TrialTables

if TYPE_CHECKING:
    # an annotation only (of a dataclass): the settings (pydantic-settings, ~0.1 s to import) are
    # not loaded by a parse that never reads them
    from shared.settings import Thresholds

__all__ = ["Evidence"]


@dataclass(frozen=True)
class Evidence:
    """Everything one diagnosis judges, as of `now`."""

    job_dir: str  # as given (a path, or an s3:// URI in the pipeline)
    now: datetime
    thresholds: Thresholds
    mode: ModeDecision
    bundle: BundleInfo
    logs: LogTables | None = None  # None: no log file at all
    trials: TrialTables | None = None  # None: no trials directory
    probes: ProbeEvidence | None = None  # None: no live probe available
    discrepancies: tuple[str, ...] = ()
    # what each file given was taken to be, what was skipped and why, where dates came from
    # (`worker.evidence.layout`, `worker.evidence.logdate`); empty for a plain watcher directory
    inputs: tuple[str, ...] = ()

    @cached_property
    def facts(self) -> Facts:
        """The facts derived from this evidence (`worker.evidence.facts`), computed once."""
        return derive(self)

    @property
    def job_id(self) -> str:
        if self.bundle.job_id:
            return self.bundle.job_id
        if self.probes and self.probes.job_id:
            return self.probes.job_id
        return Path(self.job_dir).name
