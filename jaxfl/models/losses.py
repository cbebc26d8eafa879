"""Per-example losses and errors of a classifier's logits.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

import jax
import jax.numpy as jnp
import optax


def multinomial_logistic_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Multinomial logistic (cross-entropy) loss -log softmax(logits)[label].

    The loss of Pillutla et al. 2023, Appendix C.1, `L(p, y) = -log p_y`.

    Args:
      logits: `[B, C]` scores.
      labels: `[B]` integer labels in [0, C).

    Returns:
      `[B]` losses.
    """
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def misclassification(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """`[B]` 0/1 errors: 1 where the arg-max class differs from the label."""
    return (jnp.argmax(logits, axis=-1) != labels).astype(logits.dtype)


def symmetrized_kl(logits: jax.Array, reference_logits: jax.Array) -> jax.Array:
    """KL(p || q) + KL(q || p) of the softmax distributions p, q of two logit arrays.

    p = softmax(logits), q = softmax(reference_logits) over the last axis;
    the sum of the two divergences is sum_c (p_c - q_c)(log p_c - log q_c)
    (the SKL regularizer of Li 2023, Section 5.3.4 and Appendix 5.6.2). A
    last axis of size 1 holds a binary logit z, the distribution
    (sigmoid(z), 1 - sigmoid(z)) = softmax((z, 0)).

    Args:
      logits: `[..., C]` scores.
      reference_logits: scores of the same shape.

    Returns:
      `[...]` divergences, >= 0, zero where the distributions are equal.
    """
    if logits.shape != reference_logits.shape:
        raise ValueError(
            f"logits {logits.shape} and reference logits {reference_logits.shape} differ in shape"
        )
    if logits.shape[-1] == 1:
        logits = jnp.concatenate([logits, jnp.zeros_like(logits)], axis=-1)
        reference_logits = jnp.concatenate([reference_logits, jnp.zeros_like(reference_logits)], axis=-1)
    log_p = jax.nn.log_softmax(logits, axis=-1)
    log_q = jax.nn.log_softmax(reference_logits, axis=-1)
    return jnp.sum((jnp.exp(log_p) - jnp.exp(log_q)) * (log_p - log_q), axis=-1)
