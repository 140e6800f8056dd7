"""Runs the selected perf/ workloads in one process and prints their tables
(markdown, ready for perf/README.md).

Usage: python perf/run.py [W1 W2 W3 W4 W5 W6a W6b W7 W8 W9 W10 startup enclosing replay records] [--profile]
(no names: all of them; --profile adds cProfile listings of the jitape rows)
"""
import harness  # first: single-thread setup before numpy and the peers load
import sys

import enclosing_tape
import records
import replay
import startup
import w1_scalar_chain
import w2_mlp
import w3_jacobians
import w4_hessians
import w5_batch_jacobians
import w6a_linreg
import w6b_mlp_adam
import w7_logsumexp
import w8_gmm
import w9_lstm
import w10_kmeans

WORKLOADS = {
    "W1": w1_scalar_chain.tables,
    "W2": w2_mlp.tables,
    "W3": w3_jacobians.tables,
    "W4": w4_hessians.tables,
    "W5": w5_batch_jacobians.tables,
    "W6a": w6a_linreg.tables,
    "W6b": w6b_mlp_adam.tables,
    "W7": w7_logsumexp.tables,
    "W8": w8_gmm.tables,
    "W9": w9_lstm.tables,
    "W10": w10_kmeans.tables,
    "startup": startup.tables,
    "enclosing": enclosing_tape.tables,
    "replay": replay.tables,
    "records": records.tables,
}


def main(argv):
    names = [a for a in argv if not a.startswith("--")] or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        sys.exit(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    harness.main(lambda: (t for n in names for t in WORKLOADS[n]()), argv)


if __name__ == "__main__":
    main(sys.argv[1:])
