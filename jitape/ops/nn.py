"""Neural-network ops composed from primitives: softmax, log_softmax, gelu and the cross-entropy losses.

The activations sigmoid, relu, elu, softplus and tanh are primitives of elementwise.py.
"""
import math

from . import elementwise as _ew
from . import reduction as _red
from .core import composite, float_tensor, promote


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
    nonnegative = x._value >= 0
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


sigmoid = _ew.sigmoid
relu = _ew.relu
elu = _ew.elu
tanh = _ew.tanh
softplus = _ew.softplus
