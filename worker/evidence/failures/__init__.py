"""Failures in logs: the catalogue of known failure lines and signatures for unknown ones."""

from worker.evidence.failures.catalogue import (
    Catalogue,
    CatalogueError,
    Component,
    Entry,
    FailureClass,
    catalogue,
    load_catalogue,
)
from worker.evidence.failures.signature import (
    is_specific,
    normalise,
    normalise_expr,
    signature,
    signature_expr,
    specific_expr,
)

__all__ = [
    "Catalogue",
    "CatalogueError",
    "Component",
    "Entry",
    "FailureClass",
    "catalogue",
    "is_specific",
    "load_catalogue",
    "normalise",
    "normalise_expr",
    "signature",
    "signature_expr",
    "specific_expr",
]
