"""Tunables: jt.config.jacobian_memory_bytes bounds the adjoint buffer of one Jacobian sweep;
jt.config.retrace_warning is how many traces a jt.function makes before a warning names the cause;
jt.config.backend names the backend that runs Programs (jitape.backend);
jt.config.check_unread_values fills the arena values no sweep of a Program reads with NaN instead of
leaving them unwritten (a debugging aid: the tests run with it, so a kernel that reads a value its opcode
does not declare in opcodes.FIRST_ORDER_READS / DERIVATIVE_READS gives NaN);
jt.config.workspace_reuse_bytes: sweep buffers (arena, adjoint, tangent) up to this size are kept per thread
and reused by later sweeps, as a caching allocator keeps blocks: a fresh buffer costs a page fault per 4 KiB
on first touch, about a third of filling it; larger buffers are allocated per sweep;
jt.config.fused_kernel_runs: a traced variant's fused groups (runs of elementwise ops and broadcasts over
16,384 entries or more) run as kernels generated for each group, compiled (or loaded from the kernel cache)
at this replay of the variant (its trace is not one); before it, and with None, they run block by block. A compile takes ~0.3 s per new
group; one loop per group runs such a group 3-5x faster."""

jacobian_memory_bytes = 1 << 30

retrace_warning = 5

backend = "cpu"

check_unread_values = False

workspace_reuse_bytes = 128 << 20

fused_kernel_runs = 3
