"""Compiled fused optimizer updates (jitape.optimizers): one pass over each variable.

Each line performs Keras's operations in Keras's order in the arrays' dtype (no
fastmath), so float32 results match Keras bit for bit. error_model="numpy"
drops Python's zero-division check, which would stop LLVM vectorising.
"""
import numpy as np

from .. import njit


@njit(cache=True, error_model="numpy")
def sgd_momentum_step(value, grad, m, lr, momentum, nesterov, out):
    for i in range(value.size):
        scaled = grad[i] * lr
        m[i] = m[i] * momentum - scaled
        if nesterov:
            out[i] = value[i] + (m[i] * momentum - scaled)
        else:
            out[i] = value[i] + m[i]


@njit(cache=True, error_model="numpy")
def adam_step(value, grad, m, v, v_hat, one_minus_beta_1, one_minus_beta_2, alpha,
               epsilon, out):
    amsgrad = v_hat.size > 0
    for i in range(value.size):
        g = grad[i]
        m[i] += (g - m[i]) * one_minus_beta_1
        second = v[i] + (g * g - v[i]) * one_minus_beta_2
        v[i] = second
        if amsgrad:
            # np.maximum's rule: NaN wins, so a NaN gradient stays visible.
            if second > v_hat[i] or second != second:
                v_hat[i] = second
            second = v_hat[i]
        out[i] = value[i] - m[i] * alpha / (np.sqrt(second) + epsilon)
