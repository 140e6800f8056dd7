"""The TensorFlow-style sub-namespaces jt.math, jt.linalg and jt.nn."""
import types

from . import ops

_MATH = ("add subtract multiply divide pow negative square sqrt exp log log1p sin cos tan tanh abs sign "
         "maximum minimum round reduce_sum reduce_mean reduce_max reduce_min reduce_prod reduce_logsumexp "
         "reduce_variance sigmoid softplus equal not_equal less less_equal greater greater_equal "
         "sinh cosh asinh acosh atanh asin acos atan atan2 expm1 erf erfc lgamma digamma polygamma log10 log2 "
         "cumsum cumprod roll repeat reduce_std reduce_any reduce_all argmax argmin top_k sort argsort one_hot "
         "log_sigmoid").split()

math = types.SimpleNamespace(**{name: getattr(ops, name) for name in _MATH})
linalg = types.SimpleNamespace(solve=ops.solve, inv=ops.inv, matmul=ops.matmul, norm=ops.norm,
                               einsum=ops.einsum, tensordot=ops.tensordot,
                               matvec=ops.matvec, cross=ops.cross, det=ops.det, slogdet=ops.slogdet,
                               cholesky=ops.cholesky, triangular_solve=ops.triangular_solve, trace=ops.trace,
                               diag_part=ops.diag_part, band_part=ops.band_part)
nn = types.SimpleNamespace(sigmoid=ops.sigmoid, relu=ops.relu, elu=ops.elu, tanh=ops.tanh,
                           softplus=ops.softplus, softmax=ops.softmax, log_softmax=ops.log_softmax, gelu=ops.gelu,
                           sigmoid_cross_entropy_with_logits=ops.sigmoid_cross_entropy_with_logits,
                           softmax_cross_entropy_with_logits=ops.softmax_cross_entropy_with_logits,
                           sparse_softmax_cross_entropy_with_logits=ops.sparse_softmax_cross_entropy_with_logits,
                           leaky_relu=ops.leaky_relu, selu=ops.selu, silu=ops.silu, swish=ops.swish,
                           log_sigmoid=ops.log_sigmoid, relu6=ops.relu6, l2_loss=ops.l2_loss, top_k=ops.top_k)
