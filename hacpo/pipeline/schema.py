"""What every part of the workflow config's schema shares: its identifiers and its strictness."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

ID = r"^[a-z][a-z0-9_]*$"  # keys that become wildcard values and path parts
Id = Annotated[str, Field(pattern=ID)]


class Strict(BaseModel):
    """A config mapping that refuses unknown keys (pydantic's ``extra="forbid"``)."""

    model_config = ConfigDict(extra="forbid")
