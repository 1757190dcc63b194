"""Local, streaming operators: the building blocks of every SQL plan fragment (leaf
fragments on indexer nodes, the root fragment on the initiator) and of ``LocalEngine``."""

from .aggregate import AggSpec, aggregate, final_aggregate, partial_aggregate
from .basic import (
    ProjectTerm,
    distinct,
    filter_rows,
    offset_limit,
    project,
    project_row,
    scan,
    strip_keys,
    value_identity,
)
from .sort import SortSpec, encode_sort_key, merge_sorted, sort_pairs
from .unnest import UnnestSpec, unnest

__all__ = [
    "AggSpec",
    "ProjectTerm",
    "SortSpec",
    "UnnestSpec",
    "aggregate",
    "distinct",
    "encode_sort_key",
    "filter_rows",
    "final_aggregate",
    "merge_sorted",
    "offset_limit",
    "partial_aggregate",
    "project",
    "project_row",
    "scan",
    "sort_pairs",
    "strip_keys",
    "unnest",
    "value_identity",
]
