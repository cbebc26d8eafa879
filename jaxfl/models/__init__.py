"""Models (flax NNX, used as pure init/apply pairs) and their losses."""

from jaxfl.models.losses import misclassification, multinomial_logistic_loss
from jaxfl.models.networks import (
    MLP,
    ConvNet,
    EmbeddingBag,
    LinearClassifier,
    Model,
    count_parameters,
    make_model,
    model_names,
)

__all__ = [
    "ConvNet",
    "EmbeddingBag",
    "LinearClassifier",
    "MLP",
    "Model",
    "count_parameters",
    "make_model",
    "misclassification",
    "model_names",
    "multinomial_logistic_loss",
]
