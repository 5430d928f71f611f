"""The base of every table of the experiment file: unknown keys are errors, values are frozen;
and the one exception, a spec read back from a results store (`stored` context), which keeps
only the keys this release knows so that a store written by an older release still opens."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

# the validation context of a spec read back from a store (design/parse.py from_store)
STORED: dict[str, Any] = {"stored": True}


def is_stored(info: ValidationInfo) -> bool:
    """Whether this validation reads a stored spec back: checks of the file that depend on this
    release (known engines, metrics, bounds added since) were passed when it was stored."""
    return bool(info.context and info.context.get("stored"))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys_when_stored(cls, data: Any, info: ValidationInfo) -> Any:
        """A stored spec may hold a key an older release had: it is left out, not an error."""
        if is_stored(info) and isinstance(data, dict):
            return {k: v for k, v in data.items() if k in cls.model_fields}
        return data
