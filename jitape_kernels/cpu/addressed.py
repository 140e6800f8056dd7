"""Calls through an address: a numba-compiled function called by its native entry point's address (numba's own
calling convention: the same arguments and result, the callee's exceptions propagated), so that the caller's
compile neither links nor compiles the callee (see row_kernels, which fills the addresses).

The caller passes the key of the signature the address was compiled for (signature_key: a hash of the argument
and return types); call_at compares it with the key of the arguments it passes, so an address compiled for
other types, or none (0), raises RuntimeError instead of running machine code on arguments it was not compiled
for.
"""
import zlib

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def plain(argument_types):
    """Argument types with every literal type (in tuples too) as its plain type: what call_at passes."""
    return tuple(_plain(t) for t in argument_types)


def _plain(t):
    if isinstance(t, types.BaseTuple):
        inner = plain(t.types)
        # a tuple of no literal is itself (numba interns types): made again, a sweep's operand tuples of twenty
        # types were most of a process's first kernel table
        if type(t) in (types.Tuple, types.UniTuple) and all(a is b for a, b in zip(inner, t.types)):
            return t
        return types.Tuple(inner)
    return types.unliteral(t)


def signature_key(argument_types, return_type=types.none):
    """The key of a function's argument types (literal types as their plain types) and return type, an int64
    other than 0."""
    returns = "" if return_type == types.none else f" -> {return_type}"
    return zlib.crc32((repr(plain(argument_types)) + returns).encode()) + 1


def _call(address, key, arguments, return_type):
    """The typing of a call through `address` with the tuple `arguments`, returning `return_type`."""
    if not (isinstance(address, types.Integer) and isinstance(key, types.Integer)
            and isinstance(arguments, types.BaseTuple)):
        return None
    argument_types = plain(arguments)
    expected = signature_key(argument_types, return_type)

    def codegen(context, builder, signature, llargs):
        address, key, packed = llargs[:3]
        values = [context.cast(builder, v, t, p) for v, t, p in
                  zip(cgutils.unpack_tuple(builder, packed, len(argument_types)), signature.args[2], argument_types)]
        int64 = context.get_value_type(types.int64)
        valid = builder.and_(builder.icmp_signed("==", key, int64(expected)),
                             builder.icmp_signed("!=", address, int64(0)))
        with builder.if_then(builder.not_(valid), likely=False):
            context.call_conv.return_user_exc(builder, RuntimeError, (
                "jitape: a table of addressed kernels was not prepared for this sweep's arguments (kernel_table)",))
        function_type = context.call_conv.get_function_type(return_type, argument_types)
        target = builder.inttoptr(address, function_type.as_pointer())
        status, result = context.call_conv.call_function(builder, target, return_type, argument_types, values)
        with builder.if_then(status.is_error, likely=False):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value() if return_type == types.none else result
    return codegen


@intrinsic
def call_at(typingctx, address, key, arguments):
    """Call the function compiled at `address` (numba's calling convention, returning None) with the tuple
    `arguments`, if `key` is their signature_key; else raise RuntimeError (a table filled for other types or
    missing this kernel: address 0)."""
    codegen = _call(address, key, arguments, types.none)
    return None if codegen is None else (types.none(address, key, arguments), codegen)


@intrinsic
def call_returning(typingctx, address, key, arguments, like):
    """call_at for a function returning a value of `like`'s type (plain: an int64 for 0); the key is that of the
    arguments and that return type."""
    return_type = types.unliteral(like)
    codegen = _call(address, key, arguments, return_type)
    return None if codegen is None else (return_type(address, key, arguments, like), codegen)
