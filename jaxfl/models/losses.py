"""Per-example losses and errors of a classifier's logits."""

import jax
import jax.numpy as jnp
import optax


def multinomial_logistic_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Multinomial logistic (cross-entropy) loss -log softmax(logits)[label].

    The loss of 004 Appendix C.1, `L(p, y) = -log p_y`.

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
