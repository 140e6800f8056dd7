"""Names for numba's machine code in Linux `perf` profiles: writes /tmp/perf-<pid>.map (perf's JIT symbol file)
with every function numba has loaded in this process, kernels and generated group kernels alike, so `perf report`
shows where a replay's time goes kernel by kernel instead of anonymous [JIT] addresses (cProfile sees one call).

Use: after the calls that load the kernels to profile, `import jit_symbols; jit_symbols.write()`, then loop over the
calls; run the script under `perf record -F 2000 -o /tmp/perf.data python script.py` and read
`perf report -i /tmp/perf.data --no-children --sort sym`. Each symbol's size is the distance to the next one's
address (numba keeps no sizes), which perf only uses to attribute samples.
"""
import gc
import os
import sys


def write():
    from numba.core.ccallback import CFunc
    from numba.core.registry import CPUDispatcher

    engines = {}
    for obj in gc.get_objects():
        if isinstance(obj, CPUDispatcher):
            libraries = [cres.library for cres in obj.overloads.values()]
        elif isinstance(obj, CFunc):
            libraries = [obj._library]
        else:
            continue
        for library in libraries:
            engine = library.codegen._engine
            engines[id(engine)] = engine
    addresses = {}
    for engine in engines.values():
        for name in list(engine._defined_symbols):
            address = engine._ee.get_function_address(name)
            if address:
                addresses[address] = name
    ordered = sorted(addresses.items())
    path = f"/tmp/perf-{os.getpid()}.map"
    with open(path, "w") as file:
        for (address, name), (following, _) in zip(ordered, ordered[1:] + [(ordered[-1][0] + 4096, None)]):
            file.write(f"{address:x} {min(following - address, 1 << 20):x} {name}\n")
    print(f"{path}: {len(ordered)} symbols", file=sys.stderr)
