"""Document expiry (TTL): what a write's ``expiry`` means, checked alike by the client and
the data node.

On the wire a write's ``expiry`` is an int with Couchbase's convention: 0 means none; up to
``RELATIVE_MAX`` (30 days) it is seconds from the write; above it, absolute Unix epoch
seconds. The data node resolves it against its own clock into what it stores with the
document: absolute epoch seconds, 0 for never (``resolve_expiry``), capped by the keyspace's
``max_ttl`` (a write asking for no expiry gets ``max_ttl``, one asking for more is cut to it,
as Couchbase's bucket max TTL does). A document whose expiry is at or before the node's
clock is expired: never returned, and deleted (``data/expiry.py``).

The client turns a ``timedelta`` or a float number of seconds into this form, and a
``datetime`` into epoch seconds (``wire_expiry``): a relative duration past 30 days is sent
as an absolute time from the client's clock, as Couchbase's SDKs do.
"""

from __future__ import annotations

import datetime
import math

from shardex.api.errors import BadRequest

RELATIVE_MAX = 30 * 24 * 3600  # expiry values up to this are relative seconds
MAX_EXPIRY = 2**32 - 1  # an absolute time in epoch seconds fits 32 bits unsigned, as Couchbase's
MAX_TTL_LIMIT = 2**31 - 1  # a keyspace's max_ttl in seconds (Couchbase's bucket limit)
# ``Change.flags`` / ``DocRecord.flags`` bit of a deletion made by expiry (an "expiration"):
# streams tell it from a user's delete; the index pipeline treats both as a delete.
FLAG_EXPIRED = 1


def check_wire_expiry(value: object) -> int:
    """A wire ``expiry``: an int in 0..MAX_EXPIRY (BAD_REQUEST naming the value otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EXPIRY:
        raise BadRequest(
            f"expiry must be an int of seconds in 0..{MAX_EXPIRY}, got {value!r}",
            details={
                "expiry": repr(value)[:60],
                "hint": f"seconds from now (up to {RELATIVE_MAX}, 30 days), absolute epoch "
                "seconds above that, or 0 for none",
            },
        )
    return value


def check_max_ttl(value: object) -> int:
    """A keyspace's ``max_ttl``: seconds in 0..MAX_TTL_LIMIT, 0 for none."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TTL_LIMIT:
        raise BadRequest(
            f"max_ttl must be an int of seconds in 0..{MAX_TTL_LIMIT}, got {value!r}",
            details={"max_ttl": repr(value)[:60], "hint": "seconds, or 0 for no limit"},
        )
    return value


def wire_expiry(expiry: object, now: float) -> int:
    """The wire form of a client's ``expiry=``: None or 0 (none), seconds (int or float,
    rounded up; over 30 days an int is absolute epoch seconds, the Couchbase convention), a
    ``timedelta`` (always relative) or a ``datetime`` (absolute; naive means UTC). ``now``:
    the client's clock, for a relative duration past 30 days."""
    if expiry is None:
        return 0
    if isinstance(expiry, datetime.datetime):
        when = expiry if expiry.tzinfo is not None else expiry.replace(tzinfo=datetime.UTC)
        seconds = math.ceil(when.timestamp())
        if seconds <= RELATIVE_MAX:
            raise BadRequest(
                f"expiry {expiry.isoformat()} is before {RELATIVE_MAX} s after the epoch",
                details={"expiry": expiry.isoformat(), "hint": "give a date after 1970-01-31"},
            )
        return check_wire_expiry(seconds)
    if isinstance(expiry, datetime.timedelta):
        relative = expiry.total_seconds()
        if relative <= 0:
            raise BadRequest(
                f"expiry {expiry} is not a positive duration",
                details={"expiry": str(expiry), "hint": "give a duration > 0, or None"},
            )
        seconds = math.ceil(relative)
        return seconds if seconds <= RELATIVE_MAX else check_wire_expiry(math.ceil(now + relative))
    if isinstance(expiry, float) and not isinstance(expiry, bool):
        if not math.isfinite(expiry) or expiry < 0:
            check_wire_expiry(expiry)  # raises, naming the value
        return check_wire_expiry(math.ceil(expiry))
    return check_wire_expiry(expiry)


def resolve_expiry(value: int, now_s: float, max_ttl: int) -> int:
    """What a write stores: the absolute expiry in epoch seconds (0: never) of wire value
    ``value`` written at ``now_s`` (the node's clock) in a keyspace with ``max_ttl``."""
    if value == 0:
        expiry = 0
    elif value <= RELATIVE_MAX:
        expiry = math.ceil(now_s + value)
    else:
        expiry = value
    if max_ttl:
        cap = math.ceil(now_s + max_ttl)
        if expiry == 0 or expiry > cap:
            expiry = cap
    return expiry


def is_expired(expiry: int, now_s: float) -> bool:
    """Whether a stored absolute ``expiry`` has passed at ``now_s`` (0 never does)."""
    return expiry != 0 and expiry <= now_s
