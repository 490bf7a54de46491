"""Small helpers every shardkit module may import: byte sizes and pytree key paths.

This module sits below everything else (it imports nothing from shardkit), so a helper here
never pulls a layer above into the one that uses it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["deprecated_aliases", "format_bytes", "html_page", "path_str"]


def format_bytes(n: float | None, *, digits: int = 1) -> str:
    """Bytes in binary units, shardkit's one convention (``1536 -> '1.5 KiB'``, ``80 * 2**30
    -> '80.0 GiB'``); ``None -> '?'`` (a size nobody measured).

    Example:
        >>> format_bytes(3 * 2**20), format_bytes(1536, digits=2), format_bytes(None)
        ('3.0 MiB', '1.50 KiB', '?')
    """
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    return f"{n:.{digits}f} TiB"


def _key_str(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def path_str(keypath: Sequence[Any]) -> str:
    """A JAX key path as the ``"a/b/0/kernel"`` string that partition rules match against.

    Example:
        >>> path_str((jax.tree_util.DictKey("layers"), jax.tree_util.SequenceKey(0)))
        'layers/0'
    """
    return "/".join(_key_str(k) for k in keypath)


def deprecated_aliases(module: str, aliases: Mapping[str, tuple[str, Any]]) -> Callable:
    """A module ``__getattr__`` that serves renamed names for one more release, with a
    DeprecationWarning naming the new one.

    Args:
        module: the module's name (``__name__``).
        aliases: old name -> (new name, the object).

    Example:
        >>> __getattr__ = deprecated_aliases(__name__, {"Finding": ("LintFinding", LintFinding)})
    """

    def __getattr__(name: str) -> Any:
        if name in aliases:
            new, obj = aliases[name]
            warnings.warn(
                f"{module}.{name} is now {module}.{new}; the old name goes in the next release.",
                DeprecationWarning,
                stacklevel=2,
            )
            return obj
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


PAGE_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3} code,pre{background:#f6f6f6;padding:2px 4px}
.ok{color:#1a7f37}.bad{color:#c62828}
"""


def html_page(title: str, body: str) -> str:
    """A complete, styled HTML document around `body` (shardkit's reports and views)."""
    import html

    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{PAGE_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )
