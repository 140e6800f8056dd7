"""Calls through an address: a numba-compiled function called by its native entry point's address (numba's own
calling convention: the same arguments, the callee's exceptions propagated), so that the caller's compile
neither links nor compiles the callee (see row_kernels, which fills the addresses).

The caller passes the key of the signature the address was compiled for (signature_key: a hash of the argument
types); call_at compares it with the key of the arguments it passes, so an address compiled for other types,
or none (0), raises RuntimeError instead of running machine code on arguments it was not compiled for.
"""
import zlib

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def plain(argument_types):
    """Argument types with every literal type (in tuples too) as its plain type: what call_at passes."""
    return tuple(types.Tuple(plain(t.types)) if isinstance(t, types.BaseTuple) else types.unliteral(t)
                 for t in argument_types)


def signature_key(argument_types):
    """The key of a function's argument types (literal types as their plain types), an int64 other than 0."""
    return zlib.crc32(repr(plain(argument_types)).encode()) + 1


@intrinsic
def call_at(typingctx, address, key, arguments):
    """Call the row kernel compiled at `address` (numba's calling convention) with the tuple `arguments`, if
    `key` is their signature_key; else raise RuntimeError (a table filled for other types or missing this
    kernel: address 0)."""
    if not (isinstance(address, types.Integer) and isinstance(key, types.Integer)
            and isinstance(arguments, types.BaseTuple)):
        return None
    argument_types = plain(arguments)
    expected = signature_key(argument_types)

    def codegen(context, builder, signature, llargs):
        address, key, packed = llargs
        values = [context.cast(builder, v, t, p) for v, t, p in
                  zip(cgutils.unpack_tuple(builder, packed, len(argument_types)), signature.args[2], argument_types)]
        int64 = context.get_value_type(types.int64)
        valid = builder.and_(builder.icmp_signed("==", key, int64(expected)),
                             builder.icmp_signed("!=", address, int64(0)))
        with builder.if_then(builder.not_(valid), likely=False):
            context.call_conv.return_user_exc(builder, RuntimeError, (
                "jitape: a row kernel's table was not prepared for this sweep's arguments (reverse_table)",))
        function_type = context.call_conv.get_function_type(types.none, argument_types)
        target = builder.inttoptr(address, function_type.as_pointer())
        status, _ = context.call_conv.call_function(builder, target, types.none, argument_types, values)
        with builder.if_then(status.is_error, likely=False):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()
    return types.none(address, key, arguments), codegen
