"""The backend interface: jt.config.backend selects the object the executor and replays run Programs on."""
import pytest

import jitape as jt
from jitape import backend


def test_the_cpu_backend_implements_the_whole_interface():
    cpu = backend.current()
    assert isinstance(cpu, backend.Backend) and cpu.name == "cpu"
    assert not backend.CPU.__abstractmethods__


def test_an_unknown_backend_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(jt.config, "backend", "tpu")
    x = jt.constant([1.0, 2.0])
    with jt.GradientTape() as tape:
        tape.watch(x)
        y = jt.reduce_sum(x * x)
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        tape.gradient(y, x)


def test_every_primitive_names_kernels_that_exist():
    import importlib
    from jitape.ops import PRIMITIVES
    for prim in PRIMITIVES.values():
        kernels = prim.kernels
        assert kernels["forward"] is not None, prim
        for name in filter(None, kernels.values()):
            module, function = name.split(".")
            assert hasattr(importlib.import_module(f"jitape_kernels.cpu.{module}"), function), (prim, name)


def test_a_function_names_its_backend():
    f = jt.function(lambda x: x * 2.0, backend="cpu")
    assert float(f(jt.constant(1.0))) == 2.0 and float(f(jt.constant(2.0))) == 4.0
    with pytest.raises(ValueError, match="unknown backend 'abacus'; available: \\['cpu'\\]"):
        jt.function(lambda x: x * 2.0, backend="abacus")
