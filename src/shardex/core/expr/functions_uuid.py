"""UUID(): a random (version 4) UUID as text, a fresh one per call (never folded as a
constant, so ``INSERT ... VALUES (UUID(), ...)`` gives every row its own key)."""

from __future__ import annotations

import uuid

from .functions import FunctionSpec, register_function

register_function(FunctionSpec("UUID", 0, 0, lambda: str(uuid.uuid4()), deterministic=False))
