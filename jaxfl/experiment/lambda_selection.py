"""Ditto's lambda chosen per client from its validation data (Li 2023, Section 5.3).

"For each device, we select lambda locally based on its local validation
data" (Li 2023, Section 5.3; the procedure: Appendix 5.7.2). A sweep over
`lam` trains every candidate's personal models in one compiled function;
afterwards client k takes the candidate whose personal model v_k has the
lowest loss on k's own validation examples, and is scored on its own test
examples with that model. A client with fewer than
`MIN_VALIDATION_EXAMPLES` validation examples takes the candidate closest
to 1 (the thesis's fallback for small devices, Appendix 5.7.2: lambda = 1,
or 0.1 under strong attacks). This is the per-client selection at the
end of training, not the authors' per-step greedy "dynamic lambda".

Needs a dataset whose validation and test client k are training client k
(`FederatedDataset.personal_splits` with a validation population, e.g.
`fashion-mnist` with `partition=ditto`).

References:
  [Li 2023] Scalable and Trustworthy Learning in Heterogeneous Networks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxfl.evaluation.summaries import summarize, within_range

# Fewer validation examples than this: the fallback candidate (Li 2023, Appendix 5.7.2: "less than 4").
MIN_VALIDATION_EXAMPLES = 4


def select_lambda_per_client(candidates: Sequence[tuple[float, dict[str, Any]]]) -> dict[str, Any] | None:
    """Per-client lambda from validation, and the test errors it gives.

    Args:
      candidates: (lambda, per-client metrics) per sweep point, the metrics as
        a run's `clients` (population -> {'num_examples', 'personal_loss',
        'personal_error', 'attacked'?, ...}).

    Returns:
      None when the points lack personal validation or test metrics, else
      {'lam': [N] chosen, 'validation_loss': [N], 'test_error': [N],
      'attacked': [N] bool or None, 'summary': the summaries of the benign
      clients' test errors (as `summary.json`'s)}.
    """
    if len(candidates) < 2 or any(
        "personal_loss" not in clients.get("validation", {})
        or "personal_error" not in clients.get("test", {})
        for _, clients in candidates
    ):
        return None
    lams = np.array([lam for lam, _ in candidates], np.float64)
    validation = np.stack([np.asarray(c["validation"]["personal_loss"], np.float64) for _, c in candidates])
    test = np.stack([np.asarray(c["test"]["personal_error"], np.float64) for _, c in candidates])
    # NaN losses (a diverged candidate) never win.
    choice = np.argmin(np.where(np.isfinite(validation), validation, np.inf), axis=0)
    few = np.asarray(candidates[0][1]["validation"]["num_examples"]) < MIN_VALIDATION_EXAMPLES
    choice = np.where(few, int(np.argmin(np.abs(np.log(np.maximum(lams, 1e-12))))), choice)
    clients = np.arange(test.shape[1])
    attacked = candidates[0][1]["test"].get("attacked")
    benign = None if attacked is None else (~np.asarray(attacked, bool)).astype(np.float32)
    errors = test[choice, clients]
    stats = jax.device_get(within_range(summarize(errors.astype(np.float32), benign), 0.0, 1.0))
    return {
        "lam": lams[choice],
        "validation_loss": validation[choice, clients],
        "test_error": errors,
        "attacked": None if attacked is None else np.asarray(attacked, bool),
        "summary": {key: float(value) for key, value in stats.items()},
    }
