"""docs/ledger.md documents every event kind and every field (outside tools rely on it)."""

from __future__ import annotations

import re
from pathlib import Path

from freshroll.ledger.events import EVENT_KINDS, EVENT_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "ledger.md"


def test_every_event_kind_has_a_heading():
    headings = set(re.findall(r"^### `([a-z_]+)`", DOC.read_text(), flags=re.M))
    assert headings == set(EVENT_KINDS)


def test_every_field_is_named_in_its_section():
    text = DOC.read_text()
    for t in EVENT_TYPES:
        kind = t.__struct_config__.tag
        section = text.split(f"### `{kind}`", 1)[1].split("\n### ", 1)[0]
        for name in set(t.__struct_fields__) - {"ts"}:  # ts: documented once for all
            assert f"`{name}`" in section, f"{kind}.{name} undocumented"
