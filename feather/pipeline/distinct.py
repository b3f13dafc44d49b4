"""Lists that must not name an entry twice (a hardware name listed twice would run and be
drawn twice): the check config.yaml and the experiment files share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Lists whose entries may repeat on purpose: `gpus` names one entry per GPU of a node.
REPEATABLE_LISTS = frozenset({"gpus"})


def duplicate_entry(value: Any, file: str, *, strings_only: bool = False) -> str | None:
    """The first list, anywhere in `value`, that holds an entry twice, as a one-line message
    naming the file and key (a hardware name listed twice would run and draw it twice), or
    None. `strings_only`: only names count (experiment files, whose lists of numbers may
    repeat values on purpose)."""
    for key, items in _lists(value, ()):
        seen: set[tuple[type, Any]] = set()
        for item in items:
            if isinstance(item, dict | list) or item is None:
                continue
            if strings_only and not isinstance(item, str):
                continue
            if (type(item), item) in seen:
                where = ".".join(key)
                named = f"{file}: {where}" if where else file
                return f"{named} lists {item!r} twice; each entry must be distinct"
            seen.add((type(item), item))
    return None


def _lists(value: Any, key: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], list]]:
    """Every list inside `value` with its key path (list positions as [i])."""
    if isinstance(value, dict):
        for name, item in value.items():
            if name not in REPEATABLE_LISTS:
                yield from _lists(item, (*key, str(name)))
    elif isinstance(value, list):
        yield key, value
        for index, item in enumerate(value):
            yield from _lists(item, (*key[:-1], f"{key[-1] if key else ''}[{index}]"))
