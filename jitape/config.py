"""Tunables: jt.config.jacobian_memory_bytes bounds the adjoint buffer of one Jacobian sweep;
jt.config.retrace_warning is how many traces a jt.function makes before a warning names the cause;
jt.config.backend names the backend that runs Programs (jitape.backend)."""

jacobian_memory_bytes = 1 << 30

retrace_warning = 5

backend = "cpu"
