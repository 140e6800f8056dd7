"""The TensorFlow-style sub-namespaces jt.math, jt.linalg and jt.nn."""
import types

from . import ops

_MATH = ("add subtract multiply divide pow negative square sqrt exp log log1p sin cos tan tanh abs sign "
         "maximum minimum round reduce_sum reduce_mean reduce_max reduce_min reduce_prod reduce_logsumexp "
         "reduce_variance sigmoid softplus equal not_equal less less_equal greater greater_equal "
         "sinh cosh asinh acosh atanh asin acos atan atan2 expm1 erf erfc lgamma digamma polygamma log10 log2 "
         "cumsum cumprod").split()

math = types.SimpleNamespace(**{name: getattr(ops, name) for name in _MATH})
linalg = types.SimpleNamespace(solve=ops.solve, inv=ops.inv, matmul=ops.matmul, norm=ops.norm,
                               einsum=ops.einsum, tensordot=ops.tensordot)
nn = types.SimpleNamespace(sigmoid=ops.sigmoid, relu=ops.relu, elu=ops.elu, tanh=ops.tanh,
                           softplus=ops.softplus, softmax=ops.softmax, log_softmax=ops.log_softmax, gelu=ops.gelu,
                           sigmoid_cross_entropy_with_logits=ops.sigmoid_cross_entropy_with_logits,
                           softmax_cross_entropy_with_logits=ops.softmax_cross_entropy_with_logits)
