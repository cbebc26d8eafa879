"""Evaluation: per-client metrics on whole populations and their summaries."""

from jaxfl.evaluation.per_client import ClientMetrics, per_client_metrics
from jaxfl.evaluation.summaries import PERCENTILES, SUMMARY_KEYS, summarize, summarize_each

__all__ = [
    "ClientMetrics",
    "PERCENTILES",
    "SUMMARY_KEYS",
    "per_client_metrics",
    "summarize",
    "summarize_each",
]
