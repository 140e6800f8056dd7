"""Views that hold no reference: the arrays a sweep reads and writes, re-typed once at its entry so that the
views its instructions slice from them cost no reference counting.

numba counts references to an array's memory atomically (a locked add and a locked subtract per view), and a
row's kernels take a dozen views of the arena and the adjoint: ~100 ns a row, more than the arithmetic of a
row of a few entries (W6a's step: 2.8 us for 21 rows of three entries). A view of an array whose meminfo is
NULL has a NULL meminfo too, and numba skips the counting of those. at_address makes such a view of memory
outside the sweep's arrays: a large recorded value that the sweeps read where the tape keeps it.
"""
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array


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


@intrinsic
def at_address(typingctx, address, size, like):
    """A 1-D C-contiguous array of `like`'s type over `size` entries at `address` (an integer), without a
    reference: a recorded value read where it lives (a Program's homes). Valid only while the array at
    `address` is alive and holds at least `size` entries of like's dtype, as the caller guarantees."""
    if not (isinstance(address, types.Integer) and isinstance(size, types.Integer)
            and isinstance(like, types.Array) and like.ndim == 1 and like.layout == "C"):
        return None

    def codegen(context, builder, signature, args):
        address, size, _ = args
        view = context.make_array(signature.return_type)(context, builder)
        itemsize = context.get_abi_sizeof(context.get_data_type(like.dtype))
        intp = context.get_value_type(types.intp)
        populate_array(view, data=builder.inttoptr(address, view.data.type),
                       shape=[context.cast(builder, size, signature.args[1], types.intp)],
                       strides=[intp(itemsize)], itemsize=intp(itemsize), meminfo=None)
        return view._getvalue()
    return like(address, size, like), codegen
