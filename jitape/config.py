"""Tunables: jt.config.jacobian_memory_bytes bounds the adjoint buffer of one Jacobian sweep;
jt.config.retrace_warning is how many traces a jt.function makes before a warning names the cause;
jt.config.backend names the backend that runs Programs (jitape.backend);
jt.config.check_unread_values fills the arena values a first-order sweep does not read with NaN instead of
leaving them unwritten (a debugging aid: the tests run with it, so a kernel that reads a value its opcode
does not declare in opcodes.FIRST_ORDER_READS gives NaN)."""

jacobian_memory_bytes = 1 << 30

retrace_warning = 5

backend = "cpu"

check_unread_values = False
