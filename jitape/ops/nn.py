"""Neural-network ops composed from primitives: softmax, log_softmax, the cross-entropy losses, l2_loss and
the activations gelu, leaky_relu, selu, silu (swish), log_sigmoid and relu6.

The activations sigmoid, relu, elu, softplus and tanh are primitives of elementwise.py.
"""
import math

import numpy as np

from . import elementwise as _ew
from . import reduction as _red
from . import shape as _shape
from .core import composite, constant_value, float_tensor, promote


@composite
def log_softmax(logits, axis=-1, name=None):
    """logits - logsumexp(logits) along `axis`."""
    x = float_tensor(logits, "log_softmax")
    return x - _red.reduce_logsumexp(x, axis, keepdims=True)


@composite
def softmax(logits, axis=-1, name=None):
    """exp(log_softmax(logits)) along `axis`."""
    return _ew.exp(log_softmax(logits, axis))


@composite
def sigmoid_cross_entropy_with_logits(labels=None, logits=None, name=None):
    """max(x, 0) - x * z + log(1 + exp(-|x|)), TensorFlow's overflow-free form (exact gradient at 0)."""
    z, x = promote(labels, logits)
    if z.shape != x.shape:
        raise ValueError(f"sigmoid_cross_entropy_with_logits: labels shape {z.shape} and logits shape "
                         f"{x.shape} must be equal")
    nonnegative = _ew.greater_equal(x, 0.0)      # recorded: a replay recomputes the branch
    relu_logits = _ew.where(nonnegative, x, 0.0)
    neg_abs_logits = _ew.where(nonnegative, _ew.negative(x), x)
    return relu_logits - x * z + _ew.log1p(_ew.exp(neg_abs_logits))


@composite
def softmax_cross_entropy_with_logits(labels, logits, axis=-1, name=None):
    """-sum(labels * log_softmax(logits)) along `axis`."""
    z, x = promote(labels, logits)
    if z.shape != x.shape:
        raise ValueError(f"softmax_cross_entropy_with_logits: labels shape {z.shape} and logits shape "
                         f"{x.shape} must be equal")
    return _ew.negative(_red.reduce_sum(z * log_softmax(x, axis), axis))


@composite
def gelu(features, approximate=False, name=None):
    """Gaussian error linear unit: x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), or with approximate=True the
    tanh form 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as tf.nn.gelu."""
    x = float_tensor(features, "gelu")
    if approximate:
        inner = _ew.scale(x + _ew.scale(x * _ew.square(x), 0.044715), math.sqrt(2 / math.pi))
        return _ew.scale(x * (1.0 + _ew.tanh(inner)), 0.5)
    return _ew.scale(x * (1.0 + _ew.erf(_ew.scale(x, 1 / math.sqrt(2)))), 0.5)


@composite
def sparse_softmax_cross_entropy_with_logits(labels=None, logits=None, name=None):
    """-log_softmax(logits)[label] for integer class labels of shape logits.shape[:-1].

    >>> import jitape as jt
    >>> loss = jt.nn.sparse_softmax_cross_entropy_with_logits([0], jt.constant([[0.0, 0.0]]))
    >>> round(float(loss[0]), 4)
    0.6931
    """
    x = float_tensor(logits, "sparse_softmax_cross_entropy_with_logits")
    z = constant_value(labels, "sparse labels")
    if z.dtype.kind not in "iu":
        raise TypeError(f"sparse_softmax_cross_entropy_with_logits: labels must be integers, got dtype {z.dtype}")
    if x.ndim < 1 or z.shape != x.shape[:-1]:
        raise ValueError(f"sparse_softmax_cross_entropy_with_logits: labels shape {z.shape} must equal logits "
                         f"shape {x.shape} without its last (class) axis")
    classes = x.shape[-1]
    bad = (z < 0) | (z >= classes)
    if bad.any():
        raise ValueError(f"sparse_softmax_cross_entropy_with_logits: label {z[bad].reshape(-1)[0]} is outside "
                         f"the valid range of classes [0, {classes})")
    flat = np.arange(z.size) * classes + z.reshape(-1).astype(np.int64)
    picked = _shape.gather(_shape.reshape(log_softmax(x), (-1,)), flat)
    return _shape.reshape(_ew.negative(picked), z.shape)


@composite
def l2_loss(t, name=None):
    """sum(t ** 2) / 2.

    >>> import jitape as jt
    >>> float(jt.nn.l2_loss(jt.constant([1.0, 2.0])))
    2.5
    """
    t = float_tensor(t, "l2_loss")
    return _red.reduce_sum(_ew.square(t)) * 0.5


# -- activations ----------------------------------------------------------------------------
@composite
def leaky_relu(features, alpha=0.2, name=None):
    """x where x > 0, else alpha * x.

    >>> import jitape as jt
    >>> jt.nn.leaky_relu(jt.constant([-1.0, 2.0])).numpy()
    array([-0.2,  2. ], dtype=float32)
    """
    x = float_tensor(features, "leaky_relu")
    return _ew.where(_ew.greater(x, 0.0), x, x * float(alpha))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@composite
def selu(features, name=None):
    """Scaled exponential linear unit: scale * elu(x, alpha) with TensorFlow's constants."""
    return _ew.elu(float_tensor(features, "selu"), _SELU_ALPHA) * _SELU_SCALE


@composite
def silu(features, beta=1.0):
    """x * sigmoid(beta * x) (also jt.nn.swish).

    >>> import jitape as jt
    >>> round(float(jt.nn.silu(jt.constant(1.0))), 4)
    0.7311
    """
    x = float_tensor(features, "silu")
    return x * _ew.sigmoid(x * float(beta) if beta != 1.0 else x)


swish = silu


@composite
def log_sigmoid(x, name=None):
    """log(sigmoid(x)) computed as -softplus(-x), which neither overflows nor loses precision."""
    return _ew.negative(_ew.softplus(_ew.negative(float_tensor(x, "log_sigmoid"))))


@composite
def relu6(features, name=None):
    """min(max(x, 0), 6); the gradient is 1 strictly inside (0, 6) and 0 elsewhere, as in TensorFlow."""
    x = float_tensor(features, "relu6")
    # recorded comparisons: a replay recomputes the branches
    return _ew.where(_ew.greater(x, 0.0), _ew.where(_ew.less(x, 6.0), x, 6.0), 0.0)


sigmoid = _ew.sigmoid
relu = _ew.relu
elu = _ew.elu
tanh = _ew.tanh
softplus = _ew.softplus
