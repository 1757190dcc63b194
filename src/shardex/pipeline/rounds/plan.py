"""What a batch's round stabilises where: derived from the same views the router used, so a
round names exactly the slices its rows went to (``maintain.py``;
``docs/decisions/0040-index-moves.md``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardex.pipeline.registry import IndexView

__all__ = ["plan_nodes", "round_slices", "stabilise_plan", "views_key"]


def views_key(views: Sequence[IndexView]) -> tuple[Any, ...]:
    """Everything a round routes and stabilises by: definitions, topologies (version and
    every copy: primaries and replicas) and the moving slices of index moves. Two rounds
    with equal keys route every row to the same slices and nodes."""
    return tuple(
        (
            v.id,
            v.definition,
            v.topology.seq_num,
            tuple(v.copies()),
            tuple(sorted(v.moving.items())),
        )
        for v in views
    )


def plan_nodes(key: tuple[Any, ...]) -> set[str]:
    """The nodes a round with views key ``key`` sends to and stabilises on: every owner of
    a topology (replica copies included) and every move target (``stabilise_plan``'s
    nodes)."""
    out: set[str] = set()
    for _id, _definition, _seq, copies, moving in key:
        out.update(node for _p, node in copies)
        out.update(node for _p, node in moving)
    return out


def stabilise_plan(
    views: Sequence[IndexView],
) -> tuple[dict[str, list[str]], dict[str, dict[str, list[int]]]]:
    """(node -> the index ids it hosts, node -> index id -> partitions it receives as an
    index move's target) for a batch's round: the nodes the router sends rows to, by the
    same views (the timekeeper's ``plan_stabilise``, from the driver's side)."""
    nodes: dict[str, set[str]] = {}
    moving: dict[str, dict[str, list[int]]] = {}
    for v in views:
        for _p, node in v.copies():
            nodes.setdefault(node, set()).add(v.id)
        for p, target in sorted(v.moving.items()):
            nodes.setdefault(target, set()).add(v.id)
            moving.setdefault(target, {}).setdefault(v.id, []).append(p)
    return {n: sorted(ids) for n, ids in sorted(nodes.items())}, moving


def round_slices(views: Sequence[IndexView]) -> dict[str, dict[str, list[int]]]:
    """node -> index id -> the partitions a batch's round stabilises there: exactly the
    slices the router sends the batch's rows to, by the same views (topology and routed
    moves). A slice left out keeps its applied TS: after an index move's switch the source
    still holds the partition, but must not snapshot a TS whose changes went to the target
    only (``docs/decisions/0040-index-moves.md``)."""
    out: dict[str, dict[str, set[int]]] = {}
    for v in views:
        for p, node in v.copies():  # every copy gets the partition's rows (the router)
            out.setdefault(node, {}).setdefault(v.id, set()).add(p)
        for p, target in v.moving.items():
            out.setdefault(target, {}).setdefault(v.id, set()).add(p)
    return {n: {i: sorted(ps) for i, ps in sorted(by.items())} for n, by in sorted(out.items())}
