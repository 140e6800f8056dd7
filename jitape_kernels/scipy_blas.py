"""scipy's Cython BLAS and LAPACK modules, loaded without the rest of scipy.linalg.

numba's first compile or cache load in a process imports numba.np.arraymath, which checks for BLAS by
importing `scipy.linalg.cython_blas` (and the LAPACK twin). That import first runs `scipy/linalg/__init__.py`:
all of scipy.linalg and scipy's array-API layer, ~110 ms of a new user's ~0.5 s first gradient, although
the kernels need only the two extension modules (numba takes BLAS's function pointers from their
`__pyx_capi__`). `load()` loads those two alone and enters them in `sys.modules`, so numba's import of them
is a lookup; it does nothing once scipy.linalg is imported, or when the installed scipy lays its files out
otherwise (numba then imports them the usual way).

A submodule entered before its package is not bound as the package's attribute when the package is
imported later; a finder therefore waits for the first `import scipy.linalg` and binds the two
(`scipy.linalg.cython_blas` is then what it is without jitape).
"""
import importlib.abc
import importlib.machinery
import importlib.util
import sys

PACKAGE = "scipy.linalg"
MODULES = ("cython_blas", "cython_lapack")


class _BindOnPackageImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: at the package's first import it asks the other finders for its spec and binds
    the preloaded modules once the package has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != PACKAGE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_package = spec.loader.exec_module

        def run_and_bind(module):
            run_package(module)
            for name in MODULES:
                setattr(module, name, sys.modules[f"{PACKAGE}.{name}"])

        spec.loader.exec_module = run_and_bind
        return spec


def load() -> None:
    if PACKAGE in sys.modules or any(f"{PACKAGE}.{name}" in sys.modules for name in MODULES):
        return
    scipy = importlib.util.find_spec("scipy")
    if scipy is None or not scipy.submodule_search_locations:
        return
    search = [f"{location}/linalg" for location in scipy.submodule_search_locations]
    specs = [importlib.machinery.PathFinder.find_spec(f"{PACKAGE}.{name}", search) for name in MODULES]
    if any(spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader) for spec in specs):
        return
    import scipy  # noqa: F401  (the extension modules' own imports expect the top package)
    try:
        for spec in specs:
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
    except ImportError:
        for spec in specs:  # numba's own import then reports what is wrong with this scipy
            sys.modules.pop(spec.name, None)
        return
    sys.meta_path.insert(0, _BindOnPackageImport())
