"""Shared fixtures: a hypothesis profile that tolerates numba's first-call
compile, and floatx / jacobian-budget / generated-kernel fixtures that restore global settings."""
import os

import pytest
from hypothesis import HealthCheck, settings

import jitape as jt

# The first example of a test may trigger a numba compile (seconds); a
# deadline would turn that into a flaky failure.
settings.register_profile(
    "jitape", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# CI (.ci/run sets HYPOTHESIS_PROFILE=ci): the same examples every run, so a red run can be reproduced.
settings.register_profile("ci", parent=settings.get_profile("jitape"), derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "jitape"))

# Values a first-order sweep does not read are NaN rather than stale workspace contents, so a kernel reading a
# value its opcode does not declare (opcodes.FIRST_ORDER_READS) fails every test that reaches it.
jt.config.check_unread_values = True


@pytest.fixture
def floatx64():
    """Run the test with jt.floatx() == "float64", restoring the old default."""
    old = jt.floatx()
    jt.set_floatx("float64")
    try:
        yield
    finally:
        jt.set_floatx(old)


def _restored(name):
    """Yields a setter for jt.config.<name>; restores its value after."""
    old = getattr(jt.config, name)
    try:
        yield lambda value: setattr(jt.config, name, value)
    finally:
        setattr(jt.config, name, old)


@pytest.fixture
def jacobian_budget():
    """Yields a setter for jt.config.jacobian_memory_bytes; restores it after."""
    yield from _restored("jacobian_memory_bytes")


@pytest.fixture
def kernels_at():
    """Yields a setter for jt.config.fused_kernel_runs; restores it after."""
    yield from _restored("fused_kernel_runs")
