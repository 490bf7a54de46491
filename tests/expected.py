"""Expected-output blocks whose lines may differ by JAX version.

A line that ends with ``[jax X.Y]`` is expected only when the running JAX's version starts with
``X.Y`` (the tag itself is not printed); untagged lines hold on every supported version. Used
where a printed figure depends on XLA's choices (e.g. per-device memory of a compiled kernel).
"""

import re

import jax

_TAG = re.compile(r"\s*\[jax (\d+\.\d+)\]\s*$")


def for_this_jax(lines, version=jax.__version__):
    """Keeps untagged lines and the lines tagged with this JAX's minor version, tags removed."""
    minor = ".".join(version.split(".")[:2])
    out = []
    for line in lines:
        m = _TAG.search(line)
        if m is None:
            out.append(line)
        elif m.group(1) == minor:
            out.append(line[: m.start()])
    return out
