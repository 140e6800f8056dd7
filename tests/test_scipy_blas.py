"""jitape_kernels/scipy_blas.py: numba finds scipy's BLAS and LAPACK without scipy.linalg being imported, and
scipy.linalg imported later is what it is without jitape. Each case runs in a new process (the import order
is the subject)."""
import subprocess
import sys
from pathlib import Path

import jitape_kernels


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def test_a_first_gradient_through_blas_and_lapack_imports_no_scipy_linalg_and_a_later_import_binds_both():
    code = """
import sys
import numpy as np, jitape as jt
a = jt.Variable(np.arange(1.0, 13.0).reshape(3, 4))
b = np.arange(8.0).reshape(4, 2)
with jt.GradientTape() as tape:
    loss = jt.reduce_sum(jt.matmul(a, b) ** 2) + jt.reduce_sum(jt.linalg.solve(np.eye(3) * 4.0 + 1.0, a))
grad = tape.gradient(loss, a).numpy()
print("scipy.linalg" in sys.modules)
ones = np.ones((3, 3))
expected = 2 * (a.numpy() @ b) @ b.T + np.linalg.solve((np.eye(3) * 4.0 + 1.0).T, ones)[:, :1] @ np.ones((1, 4))
print(np.allclose(grad, expected, rtol=1e-12))
import scipy.linalg
print(scipy.linalg.cython_blas is sys.modules["scipy.linalg.cython_blas"],
      scipy.linalg.cython_lapack is sys.modules["scipy.linalg.cython_lapack"])
from scipy.linalg import cython_blas
print(float(scipy.linalg.solve([[2.0]], [1.0])[0]), "dgemm" in cython_blas.__pyx_capi__)
print(sum(type(f).__name__ == "_BindOnPackageImport" for f in sys.meta_path))
"""
    assert _run(code) == ["False", "True", "True", "True", "0.5", "True", "0"]


def test_scipy_linalg_imported_first_is_left_as_it_is():
    code = """
import sys, scipy.linalg, jitape
print(sum(type(f).__name__ == "_BindOnPackageImport" for f in sys.meta_path),
      scipy.linalg.cython_blas is sys.modules["scipy.linalg.cython_blas"])
"""
    assert _run(code) == ["0", "True"]


def test_a_scipy_without_the_two_files_is_left_to_numbas_own_import():
    module = Path(jitape_kernels.__file__).with_name("scipy_blas.py")
    code = f"""
import importlib.machinery, importlib.util, sys
spec = importlib.util.spec_from_file_location("scipy_blas_alone", {str(module)!r})
scipy_blas = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scipy_blas)
finders = len(sys.meta_path)
importlib.machinery.PathFinder.find_spec = classmethod(lambda cls, name, path=None, target=None: None)
scipy_blas.load()
print(any(name.startswith("scipy.linalg") for name in sys.modules), len(sys.meta_path) == finders)
"""
    assert _run(code) == ["False", "True"]
