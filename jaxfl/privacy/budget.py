"""From a run's privacy settings to calibrated noise, and back to epsilon spent.

A DP algorithm's registry entry (`jaxfl.algorithms.registry.AlgorithmSpec.
privacy`) holds a `DpBudget`. Before training, the runner calls
`DpBudget.calibrate` with the run's settings; it checks them (raising
`ValueError` with a one-line message, which the CLI prints before anything
is trained or written) and returns the noise hyperparameters that go into
`ServerState.hparams`:

* 'dp_noise_multiplier' z: the update's noise std over its sensitivity 2C
  (`jaxfl.privacy.accounting`), the smallest z whose run of `rounds` rounds
  spends at most `epsilon` at `delta` (default delta = 1/n);
* 'dp_quantile_sigma' sigma_q (DP Delta-FL): the discrete Gaussian parameter
  per client of Pillutla et al. 2023, Algorithm 2, whose Theorem 6(a)
  epsilon is eps_q = sqrt(r) / z, i.e. the quantile's per-round zCDP is r
  times the update's (`accounting.quantile_epsilon_for`), obtained with the
  primitive's inverse `dp_quantile_sigma(eps_q, b, m, c)` at the scale c.

A noise setting given explicitly is used as is. With `dp_noise_multiplier`
given, epsilon is not a target any more (the report shows what that noise
spent; `target_epsilon` is null) and sigma_q still follows from z and r.
With only `dp_quantile_sigma` given, the quantile's per-round epsilon is
fixed by it (r is not used) and z is calibrated so that the whole run meets
epsilon.

After training the runner calls `DpBudget.report` with the state's
hyperparameters: the epsilon spent comes from the accountant at the noise
actually used (float32, rounded up so that the target is never exceeded).

Refused settings (each a one-line `ValueError`):

* epsilon <= 0, delta outside (0, 1), clip_norm <= 0 or not finite,
  r <= 0, sigma_q < 1/2 (Theorem 6 needs sigma >= 1/2);
* DP Delta-FL with b < 4 bins (the Theorem 6 sensitivity c log2(b) bounds
  the replace-one sensitivity c sqrt(2 log2 b) only for b >= 4);
* a ring 2^bits smaller than the modulus Theorem 6 requires at this delta
  (`dp_quantile_modulus(b, m, sigma_q, c, delta)`);
* a quantile budget that needs sigma_q < 1/2 at the scale c (raise c), or
  sigma_q above the 1e6 whose proposals the discrete Gaussian sampler keeps exact;
* absurd noise: z > m / 2 (`max_noise_multiplier`). Then the noise std on
  each coordinate of the sum, z 2C, exceeds m C, the largest norm the whole
  cohort's clipped sum can have: every coordinate of every round is
  dominated by noise, and the run would train to nothing.

References:
  [Pillutla et al. 2023] Federated Learning with Superquantile Aggregation for Heterogeneous Data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxfl.primitives.discrete_gaussian import MAX_SIGMA
from jaxfl.primitives.dp_quantile import (
    MAX_MODULUS,
    dp_quantile_epsilon,
    dp_quantile_modulus,
    dp_quantile_sigma,
)
from jaxfl.privacy.accounting import (
    ACCOUNTANT_NAME,
    Sampling,
    check_sampling,
    epsilon_spent,
    gaussian_rho,
    noise_multiplier_for,
    quantile_epsilon_for,
    sum_sensitivity,
)
from jaxfl.privacy.example_accounting import (
    ACCOUNTANT_NAME as EXAMPLE_ACCOUNTANT_NAME,
)
from jaxfl.privacy.example_accounting import (
    example_level_epsilon,
    example_level_noise_multiplier,
)

NOISE_MULTIPLIER = "dp_noise_multiplier"
EXAMPLE_CLIP_NORM = "example_clip_norm"
QUANTILE_SIGMA = "dp_quantile_sigma"
# Theorem 6 of Pillutla et al. 2023 holds for sigma >= 1/2.
MIN_QUANTILE_SIGMA = 0.5
# Smallest b whose Theorem 6 sensitivity covers replacement (module docstring).
MIN_QUANTILE_BINS = 4


def max_noise_multiplier(clients_per_round: int) -> float:
    """The largest noise multiplier accepted, m / 2 (see the module docstring).

    Above it the noise std z 2C on each coordinate exceeds m C, the largest
    norm of the cohort's clipped sum.
    """
    return clients_per_round / 2.0


def default_delta(num_clients: int) -> float:
    """The default delta, 1 / n (Pillutla et al. 2023, Section 7.7: (epsilon, 1/n)-DP)."""
    return 1.0 / num_clients


def _float32_at_least(value: float) -> float:
    """The smallest float32 >= value: what the state holds, never less noise."""
    rounded = np.float32(value)
    if float(rounded) < value:
        rounded = np.nextafter(rounded, np.float32(np.inf))
    return float(rounded)


def _positive(value, name: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value:g}")
    return value


@dataclasses.dataclass(frozen=True)
class DpBudget:
    """The privacy side of a DP algorithm (see the module docstring).

    Attributes:
      with_quantile: whether rounds also release the DP quantile (DP
        Delta-FL) besides the noisy update sum (both algorithms).
    """

    with_quantile: bool = False

    def _delta(self, settings: Any, sampling: Sampling) -> float:
        delta = settings.delta
        if delta is None:
            return default_delta(sampling.num_clients)
        delta = float(delta)
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta:g}")
        return delta

    def _quantile_statics(self, settings: Any) -> tuple[int, int, int]:
        bins, bits, scale = settings.dp_bins, settings.dp_bits, settings.dp_scale
        bins, bits = int(bins), int(bits)
        if bins < MIN_QUANTILE_BINS:
            raise ValueError(
                f"dp_bins must be >= {MIN_QUANTILE_BINS} for DP accounting of the "
                f"quantile (the sensitivity in Theorem 6 of Pillutla et al. 2023 covers "
                f"replacing a client only from b = 4), got {bins}"
            )
        return bins, bits, int(scale)

    def calibrate(
        self,
        settings: Any,
        *,
        num_clients: int,
        clients_per_round: int,
        hparams: Mapping[str, float],
        num_examples: int | None = None,
    ) -> dict[str, float]:
        """The noise hyperparameters of a run (module docstring).

        Args:
          settings: the run's settings by flat name as attributes (`RunConfig.flat()`): epsilon,
            delta (None: 1/n), rounds, and for DP Delta-FL
            dp_quantile_ratio, dp_bins, dp_bits, dp_scale.
          num_clients: n, the training clients.
          clients_per_round: m.
          hparams: the algorithm's hyperparameters from the settings so far;
            'clip_norm' is checked, and a 'dp_noise_multiplier' or
            'dp_quantile_sigma' present here is kept as given.
          num_examples: the training examples (`ExampleDpBudget` reads them;
            client-level DP does not).

        Returns:
          {'dp_noise_multiplier': z} and, with the quantile,
          {'dp_quantile_sigma': sigma_q}, as float32-representable floats.

        Raises:
          ValueError: a refused setting (module docstring), one line.
        """
        del num_examples  # Client-level: the unit is the client.
        sampling = check_sampling(Sampling(num_clients, clients_per_round))
        delta = self._delta(settings, sampling)
        _positive(hparams["clip_norm"], "clip_norm")
        rounds = int(settings.rounds)
        given_z = hparams.get(NOISE_MULTIPLIER)
        given_sigma = hparams.get(QUANTILE_SIGMA) if self.with_quantile else None
        if given_z is not None:
            _positive(given_z, NOISE_MULTIPLIER)
        if given_sigma is not None and not given_sigma >= MIN_QUANTILE_SIGMA:
            raise ValueError(
                f"{QUANTILE_SIGMA} must be >= {MIN_QUANTILE_SIGMA} "
                f"(Pillutla et al. 2023, Theorem 6), "
                f"got {given_sigma:g}"
            )
        out: dict[str, float] = {}
        limit = max_noise_multiplier(sampling.clients_per_round)
        if given_z is None and not self.with_quantile:
            # A budget that even the largest accepted noise overspends is refused at once (calibrating
            # first would search far above the limit, and an accountant evaluation is costly).
            at_limit = epsilon_spent(rounds, sampling, limit, delta, amplified=_amplified(settings))
            if at_limit > _positive(settings.epsilon, "epsilon"):
                raise ValueError(_absurd_noise(f"z > {limit:g}"))
        if not self.with_quantile:
            z = given_z
            if z is None:
                z = noise_multiplier_for(
                    _positive(settings.epsilon, "epsilon"), delta, rounds, sampling,
                    amplified=_amplified(settings),
                )
            out[NOISE_MULTIPLIER] = _float32_at_least(z)
        else:
            bins, bits, scale = self._quantile_statics(settings)
            ratio = _positive(settings.dp_quantile_ratio, "dp_quantile_ratio")
            m = sampling.clients_per_round
            z = given_z
            if z is None:
                if given_sigma is None:
                    z = noise_multiplier_for(
                        _positive(settings.epsilon, "epsilon"),
                        delta,
                        rounds,
                        sampling,
                        amplified=_amplified(settings),
                        quantile_ratio=ratio,
                    )
                else:
                    z = noise_multiplier_for(
                        _positive(settings.epsilon, "epsilon"),
                        delta,
                        rounds,
                        sampling,
                        amplified=_amplified(settings),
                        quantile_epsilon=dp_quantile_epsilon(
                            bins, m, given_sigma, scale
                        ),
                    )
            z = _float32_at_least(z)
            sigma = given_sigma
            if sigma is None:
                target = quantile_epsilon_for(z, ratio)
                try:
                    sigma = dp_quantile_sigma(target, bins, m, scale)
                except ValueError:
                    at_half = dp_quantile_epsilon(bins, m, MIN_QUANTILE_SIGMA, scale)
                    raise ValueError(
                        f"the quantile's budget eps_q={target:.4g} per round needs "
                        f"sigma < 1/2 at dp_scale={scale} (Theorem 6 of Pillutla et al. "
                        f"2023 needs sigma >= 1/2, where eps_q={at_half:.4g}): raise dp_scale"
                    ) from None
            sigma = _float32_at_least(sigma)
            if sigma > MAX_SIGMA:
                raise ValueError(
                    f"the quantile needs discrete Gaussian sigma={sigma:.4g}, above the {MAX_SIGMA:g} "
                    "whose proposals the sampler keeps exact: raise dp_quantile_ratio or epsilon, or lower "
                    "dp_scale"
                )
            needed = dp_quantile_modulus(bins, m, sigma, scale, delta)
            if needed > min(2**bits, MAX_MODULUS):
                raise ValueError(
                    f"dp_bits={bits} gives a ring of 2^{bits}, smaller than the "
                    f"modulus {needed} that Theorem 6 of Pillutla et al. 2023 needs for b={bins}, "
                    f"m={m}, sigma={sigma:.4g}, c={scale} at delta={delta:.3g}: "
                    f"use dp_bits >= {math.ceil(math.log2(needed))}"
                )
            out[NOISE_MULTIPLIER] = z
            out[QUANTILE_SIGMA] = sigma
        if out[NOISE_MULTIPLIER] > limit:
            raise ValueError(_absurd_noise(f"{out[NOISE_MULTIPLIER]:.4g} > {limit:g}"))
        return out

    def report(
        self,
        settings: Any,
        *,
        num_clients: int,
        clients_per_round: int,
        hparams: Mapping[str, float],
        rounds_done: int,
        num_examples: int | None = None,
    ) -> dict[str, Any]:
        """The `privacy` object of summary.json: what the run spent.

        Args:
          settings: as for `calibrate`.
          num_clients: n.
          clients_per_round: m.
          hparams: the state's hyperparameters (the noise actually used).
          rounds_done: rounds trained.
          num_examples: as for `calibrate`.

        Returns:
          A JSON-ready dict: 'epsilon' (spent, from the accountant), 'delta',
          'noise_multiplier', 'sampling_rate', 'rounds', 'accountant', ...
          and for DP Delta-FL the quantile's settings and share.
        """
        del num_examples  # Client-level: the unit is the client.
        sampling = check_sampling(Sampling(num_clients, clients_per_round))
        delta = self._delta(settings, sampling)
        z = float(hparams[NOISE_MULTIPLIER])
        clip_norm = float(hparams["clip_norm"])
        quantile_epsilon = None
        report: dict[str, Any] = {}
        if self.with_quantile:
            bins, bits, scale = self._quantile_statics(settings)
            sigma = float(hparams[QUANTILE_SIGMA])
            m = sampling.clients_per_round
            quantile_epsilon = dp_quantile_epsilon(bins, m, sigma, scale)
            rho_q = quantile_epsilon**2 / 2
            rho_w = gaussian_rho(z)
            report["quantile"] = {
                "epsilon_zcdp_per_round": quantile_epsilon,
                "rho_per_round": rho_q,
                "ratio_to_update": rho_q / rho_w,
                "share": rho_q / (rho_q + rho_w),
                "sigma": sigma,
                "scale": scale,
                "bins": bins,
                "modulus_bits": bits,
                "min_modulus": dp_quantile_modulus(bins, m, sigma, scale, delta),
                # Total discrete Gaussian noise per histogram node, in counts.
                "noise_stddev_per_node": math.sqrt(m) * sigma / scale,
                "accounting": (
                    "Pillutla et al. 2023, Theorem 6(a), with n = m: (eps^2 / 2)-zCDP per round, composed "
                    "with the update's Gaussian and amplified by Wang-Balle-Kasiviswanathan 2019 Thm. 9 "
                    "(any mechanism of bounded RDP)"
                ),
                **_count_report(settings),
            }
        # Both trust models, always (docs/privacy.md, "Whom epsilon protects against").
        by_trust = {
            trust: epsilon_spent(
                rounds_done, sampling, z, delta, quantile_epsilon=quantile_epsilon,
                amplified=trust == OBSERVER,
            )
            for trust in TRUST_MODELS
        }
        trust_model = _trust_model(settings)
        return {
            "epsilon": by_trust[trust_model],
            "trust_model": trust_model,
            "epsilon_against_observer": by_trust[OBSERVER],
            "epsilon_against_server": by_trust[SERVER],
            # The name earlier versions wrote; the same figure as against the server.
            "epsilon_without_amplification": by_trust[SERVER],
            "trust_models": dict(TRUST_MODELS),
            "delta": delta,
            "target_epsilon": _target_epsilon(settings),
            "noise_multiplier": z,
            "noise_stddev": z * sum_sensitivity(clip_norm),
            "clip_norm": clip_norm,
            "sensitivity": sum_sensitivity(clip_norm),
            "sampling_rate": sampling.rate,
            "clients_per_round": sampling.clients_per_round,
            "num_clients": sampling.num_clients,
            "rounds": int(rounds_done),
            "accountant": ACCOUNTANT_NAME,
            "adjacency": "replace one client's data (client-level DP; n public)",
            "not_private": not_private_outputs(settings),
            "released_update": (
                "sum of clipped updates + N(0, noise_stddev^2 I), divided by "
                + (
                    _count_report(settings)["divisor"]
                    if self.with_quantile
                    else "the cohort size m"
                )
            ),
            **report,
            **_second_phase(hparams, z),
        }


def _absurd_noise(needed: str) -> str:
    """The refusal of a noise multiplier above `max_noise_multiplier` (module docstring)."""
    return (
        f"this privacy budget needs noise multiplier {needed} (= clients per round / 2): the noise on every "
        "coordinate would exceed the whole cohort's clipped update and training would learn nothing; raise "
        "epsilon, clients per round or lower rounds"
    )


def _second_phase(hparams: Mapping[str, Any], noise_multiplier: float) -> dict[str, Any]:
    """DP^2-FL's RMSProp-phase rounds clip to their own C2, so their noise is z 2 C2 (epsilon is z's)."""
    if "dp2_clip_norm" not in hparams:
        return {}
    clip_norm = float(hparams["dp2_clip_norm"])
    return {"rmsprop_phase": {
        "clip_norm": clip_norm,
        "sensitivity": sum_sensitivity(clip_norm),
        "noise_stddev": noise_multiplier * sum_sensitivity(clip_norm),
    }}


def not_private_outputs(settings: Any) -> list[str]:
    """What a DP run writes that is computed from private data and is not a DP release.

    Diagnostics of the simulation, outside the accounting: reading them is
    seeing the clients' data. The released quantities are the models (the
    noisy updates), DP Delta-FL's thresholds, and m_t under `--dp-count exact`.
    """
    count = [] if getattr(settings, "dp_count", "fixed") == "exact" else [
        "metrics.jsonl round_metrics.clients_with_weight (m_t, the clients that passed the threshold)",
        "summary.json rounds_without_weight (the rounds with m_t = 0)",
        "metrics.jsonl round_metrics.clients_uploading, and client_uploads, bytes_up and bytes_down in "
        "metrics.jsonl and summary.json (the clients that sent an update: m_t where a threshold picks them)",
    ]
    # Written only where the training clients are evaluated (--eval-train).
    train = [
        "the train_* summaries and the training clients' rows of clients.csv (evaluated on their data)"
    ] if getattr(settings, "eval_train", False) else []
    return [
        "metrics.jsonl round_metrics other than threshold and update_norm (the released update's): "
        "train_loss, cohort_loss, clipped_fraction, mean_update_norm, local_steps",
        *count,
        *train,
        "personal models (--finetune-epochs) and their evaluation: each trained on one client's data "
        "without noise",
        "timing.json and the divergence flags the run stops on (released only as the models' finiteness)",
    ]


def _count_report(settings: Any) -> dict[str, Any]:
    """What DP Delta-FL divides its noisy sum by, and what that assumes (`dp_deltafl` `count`)."""
    if getattr(settings, "dp_count", "fixed") == "exact":
        return {
            "selected_count_public": True,
            "divisor": "the exact count m_t of clients that passed the threshold",
            "assumption": (
                "Pillutla et al. 2023, Appendix D: m_t is publicly known. It is released by the update and "
                "NOT accounted: "
                "replacing one client's data changes it by one, and m_t = 0 shows as a round without update"
            ),
        }
    return {
        "selected_count_public": False,
        "divisor": "theta * m, public and fixed before the round (m_t is never released)",
        "assumption": "none beyond the accounted releases",
    }


OBSERVER = "observer"
SERVER = "server"
TRUST_MODELS = {
    OBSERVER: (
        "an adversary who sees the released models but not which clients were sampled: amplification by "
        "sampling (the cohort is drawn secretly each round)"
    ),
    SERVER: (
        "the server, who samples the cohort and sees the securely aggregated noisy sum of each round: no "
        "amplification, every round composed in full"
    ),
}


def _trust_model(settings: Any) -> str:
    return getattr(settings, "dp_trust_model", OBSERVER) or OBSERVER


def _amplified(settings: Any) -> bool:
    """Whether --epsilon's target is the observer's epsilon (amplified) or the server's."""
    return _trust_model(settings) == OBSERVER


def _target_epsilon(settings: Any) -> float | None:
    """The epsilon the update noise was calibrated to; None if z was given."""
    if getattr(settings, NOISE_MULTIPLIER, None) is not None:
        return None
    return float(settings.epsilon)


EXAMPLE_TRUST_MODELS = {
    OBSERVER: (
        "an adversary who sees the released models but not which clients were sampled: the example's client "
        "is in a round's cohort with probability m / n, secretly (amplification by joint convexity)"
    ),
    SERVER: (
        "the server, who samples the cohort and sees each client's update: no amplification, the example's "
        "client counted in every round"
    ),
}


@dataclasses.dataclass(frozen=True)
class ExampleDpBudget:
    """The privacy side of example-level DP: clients that train by DP-SGD (`jaxfl.algorithms.dp_sgd_fedavg`).

    The accounting is `jaxfl.privacy.example_accounting`'s. Reads the settings
    epsilon, delta (None: 1 / the number of training examples, as Li 2023,
    Section 6.12, sets it for DP-SGD), rounds, dp_trust_model, local_epochs (E,
    the steps of a round that read one example: one per epoch) and batch_size
    (B), and the hyperparameters 'example_clip_norm' C and
    'dp_noise_multiplier' z (a step's noise std over its sensitivity 2C).
    Refused besides `DpBudget`'s refusals of epsilon and delta: C <= 0, and
    z > B / 2, where the noise std z 2C on each coordinate exceeds B C, the
    largest norm of a batch's clipped sum (every step would be noise).
    """

    def _statics(self, settings: Any, num_clients: int, clients_per_round: int, num_examples: int | None):
        sampling = check_sampling(Sampling(num_clients, clients_per_round))
        if num_examples is None or int(num_examples) < 1:
            raise ValueError(f"example-level DP needs the number of training examples, got {num_examples}")
        delta = settings.delta
        delta = 1.0 / int(num_examples) if delta is None else float(delta)
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta:g}")
        return sampling, delta, int(settings.local_epochs)

    def calibrate(
        self,
        settings: Any,
        *,
        num_clients: int,
        clients_per_round: int,
        hparams: Mapping[str, float],
        num_examples: int | None = None,
    ) -> dict[str, float]:
        """{'dp_noise_multiplier': z}, calibrated to epsilon unless given (as `DpBudget.calibrate`)."""
        sampling, delta, epochs = self._statics(settings, num_clients, clients_per_round, num_examples)
        _positive(hparams[EXAMPLE_CLIP_NORM], EXAMPLE_CLIP_NORM)
        z = hparams.get(NOISE_MULTIPLIER)
        if z is not None:
            _positive(z, NOISE_MULTIPLIER)
        else:
            z = example_level_noise_multiplier(
                _positive(settings.epsilon, "epsilon"), delta, int(settings.rounds), sampling, epochs,
                amplified=_amplified(settings),
            )
        z = _float32_at_least(z)
        limit = int(settings.batch_size) / 2.0
        if z > limit:
            raise ValueError(
                f"this privacy budget needs noise multiplier {z:.4g} > {limit:g} (= batch size / 2): the "
                "noise on every coordinate of a step would exceed the whole batch's clipped gradient sum "
                "and training would learn nothing; raise epsilon or the batch size, or lower rounds or "
                "local epochs"
            )
        return {NOISE_MULTIPLIER: z}

    def report(
        self,
        settings: Any,
        *,
        num_clients: int,
        clients_per_round: int,
        hparams: Mapping[str, float],
        rounds_done: int,
        num_examples: int | None = None,
    ) -> dict[str, Any]:
        """The `privacy` object of summary.json (as `DpBudget.report`, per example)."""
        sampling, delta, epochs = self._statics(settings, num_clients, clients_per_round, num_examples)
        z = float(hparams[NOISE_MULTIPLIER])
        clip_norm = float(hparams[EXAMPLE_CLIP_NORM])
        by_trust = {
            trust: example_level_epsilon(
                int(rounds_done), sampling, z, epochs, delta, amplified=trust == OBSERVER
            )
            for trust in EXAMPLE_TRUST_MODELS
        }
        trust_model = _trust_model(settings)
        return {
            "epsilon": by_trust[trust_model],
            "unit": "example",
            "trust_model": trust_model,
            "epsilon_against_observer": by_trust[OBSERVER],
            "epsilon_against_server": by_trust[SERVER],
            "trust_models": dict(EXAMPLE_TRUST_MODELS),
            "delta": delta,
            "target_epsilon": _target_epsilon(settings),
            "noise_multiplier": z,
            "noise_stddev": z * sum_sensitivity(clip_norm),
            "clip_norm": clip_norm,
            "sensitivity": sum_sensitivity(clip_norm),
            "batch_size": int(settings.batch_size),
            "steps_per_example_per_round": epochs,
            "sampling_rate": sampling.rate,
            "clients_per_round": sampling.clients_per_round,
            "num_clients": sampling.num_clients,
            "num_examples": int(num_examples),
            "rounds": int(rounds_done),
            "accountant": EXAMPLE_ACCOUNTANT_NAME,
            "adjacency": (
                "replace one example of one client (example-level DP; each client's example count public)"
            ),
            "not_private": not_private_outputs(settings),
            "released_update": (
                "each sampled client's update, computed from its local steps' noisy gradients (sum of the "
                "batch's per-example gradients clipped to clip_norm + N(0, noise_stddev^2 I)) / batch_size"
            ),
        }


DP_FEDAVG_BUDGET = DpBudget(with_quantile=False)
DP_DELTAFL_BUDGET = DpBudget(with_quantile=True)
EXAMPLE_DP_BUDGET = ExampleDpBudget()
