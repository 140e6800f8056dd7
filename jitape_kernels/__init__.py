"""Compiled kernels of jitape: opcode table and the compiled CPU interpreters (cpu/).

Imports numpy, scipy and numba only, never `jitape`. The kernels defined in this
package are cached on disk in a per-user directory stamped with a hash of the
kernel sources, so an installed read-only package still caches and an edit to any
kernel file can never be served stale machine code (numba keys its cache on the
defining file alone, not on the modules it calls into). That directory is given
to numba through a cache locator that answers for this package's files only:
numba.config.CACHE_DIR, every other numba user's setting, is left as it was.
"""
import hashlib
import os
from pathlib import Path

import numba
from numba.core import caching

_HERE = Path(__file__).resolve().parent


def _source_stamp() -> str:
    digest = hashlib.sha256(numba.__version__.encode())
    for path in sorted(_HERE.rglob("*.py")):
        digest.update(path.relative_to(_HERE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _default_cache_base() -> Path:
    explicit = os.environ.get("JITAPE_CACHE_DIR") or os.environ.get("NUMBA_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "jitape"


def _writable_dir(candidate: Path) -> Path:
    try:
        candidate.mkdir(parents=True, exist_ok=True)
        probe = candidate / ".write-probe"
        probe.touch()
        probe.unlink()
        return candidate
    except OSError:
        import tempfile
        fallback = Path(tempfile.gettempdir()) / f"jitape-{os.getuid()}" / candidate.name
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


_CACHE_DIR = _writable_dir(_default_cache_base() / f"numba-{_source_stamp()}")


class _KernelCacheLocator(caching.UserProvidedCacheLocator):
    """numba's locator for a user-given cache directory, pointed at jitape's and consulted for the files of
    this package only (numba tries its locators in order; other functions fall through to the next)."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(_CACHE_DIR, self.get_suitable_cache_subpath(py_file))

    @classmethod
    def from_function(cls, py_func, py_file):
        if not Path(py_file).resolve().is_relative_to(_HERE):
            return None
        return super(caching.UserProvidedCacheLocator, cls).from_function(py_func, py_file)


if _KernelCacheLocator not in caching.CacheImpl._locator_classes:
    caching.CacheImpl._locator_classes.insert(0, _KernelCacheLocator)


def cache_dir() -> str:
    """The directory numba caches jitape's compiled kernels in."""
    return str(_CACHE_DIR)
