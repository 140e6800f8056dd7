"""Views that hold no reference: the arrays a sweep reads and writes, re-typed once at its entry so that the
views its instructions slice from them cost no reference counting.

numba counts references to an array's memory atomically (a locked add and a locked subtract per view), and a
row's kernels take a dozen views of the arena and the adjoint: ~100 ns a row, more than the arithmetic of a
row of a few entries (W6a's step: 2.8 us for 21 rows of three entries). A view of an array whose meminfo is
NULL has a NULL meminfo too, and numba skips the counting of those.
"""
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def unowned(typingctx, array):
    """`array` without its reference (meminfo and parent NULL): the same data, shape and strides. Valid only
    while `array` itself is alive, as the arguments of the call that makes it are; never returned or kept."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        view = context.make_array(signature.args[0])(context, builder, value=args[0])
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()
    return array(array), codegen
