"""Bytes a run's clients and server send: per message, and in total from the count of uploads.

A composed round (`jaxfl.algorithms.stages.compose_round`) sends every sampled
client the model (M per round, or the clock's M' selected clients), and every client that trains and reports
(`clients_uploading`, a round metric: the plan's active clients) sends its
update, compressed or not; an algorithm whose clients also exchange other
model-sized vectors declares them (`ClientUpdateStage.side_messages`:
SCAFFOLD's control variates, FedDane's gradients), each counted uncompressed
both ways for every uploading client. Scalars (a client's loss, its example
count) are not counted: 4 bytes beside a model's.

Counts are exact Python integers: a run carries the number of uploads so far
(`jaxfl.experiment.health.RunHealth.client_uploads`) and the bytes follow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxfl.models.networks import count_parameters
from jaxfl.types import Params


def model_bytes(params: Params) -> int:
    """Bytes of the model as stored (each leaf at its own dtype)."""
    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(params))


def update_bytes(params: Params, compression: Any = None) -> int:
    """Bytes of one client's update to a model like `params`: its code (`UpdateCompression`), or the model."""
    if compression is None:
        return model_bytes(params)
    return -(-compression.encoded_bits(count_parameters(params)) // 8)


@dataclasses.dataclass(frozen=True)
class Traffic:
    """What one round's messages cost.

    Attributes:
      model_bytes: the model as the server sends it.
      update_bytes: one client's update as it sends it.
      side_messages: model-sized vectors each uploading client receives and sends besides.
      clients_per_round: the clients sent the model each round: M, or the
        clock's over-selected M'.
      compression: the update code's description, or None: uncompressed.
    """

    model_bytes: int
    update_bytes: int
    side_messages: int
    clients_per_round: int
    compression: dict[str, Any] | None = None

    def bytes_up(self, uploads: int) -> int:
        """Bytes clients sent after `uploads` uploads."""
        return int(uploads) * (self.update_bytes + self.side_messages * self.model_bytes)

    def bytes_down(self, rounds: int, uploads: int) -> int:
        """Bytes the server sent after `rounds` rounds holding `uploads` uploads."""
        return (
            int(rounds) * self.clients_per_round * self.model_bytes
            + int(uploads) * self.side_messages * self.model_bytes
        )

    def record(self, rounds: int, uploads: int) -> dict[str, int]:
        """`{'bytes_up', 'bytes_down', 'client_uploads'}` after `rounds` rounds."""
        return {
            "bytes_up": self.bytes_up(uploads),
            "bytes_down": self.bytes_down(rounds, uploads),
            "client_uploads": int(uploads),
        }


def round_traffic(algorithm: Any, params: Params) -> Traffic | None:
    """The `Traffic` of an algorithm's round on a model like `params`.

    A composed round's from its stages; a round written by hand's from its
    `model_sends` (uncompressed), or None where it does not declare them.
    """
    composition = getattr(algorithm, "composition", None)
    size = model_bytes(params)
    if composition is None:
        sends = getattr(algorithm, "model_sends", None)
        return None if sends is None else Traffic(size, size, 0, sends)
    compression = composition.options.get("compression")
    clock = composition.options.get("clock")  # Over-selection sends the model to more clients.
    update, described = update_bytes(params, compression), None
    if compression is not None:
        dimension = count_parameters(params)
        described = {
            "compressor": compression.name,
            **(
                {"bits": compression.bits, "bucket_size": compression.bucket_size}
                if compression.name == "qsgd"
                else {"kept": compression.kept(dimension)}
            ),
            "rotation": compression.rotation,
            "error_feedback": compression.error_feedback,
            "unbiased": compression.unbiased,
            "update_bytes": update,
            "uncompressed_update_bytes": size,
        }
    return Traffic(
        model_bytes=size,
        update_bytes=update,
        side_messages=composition.client_update.side_messages,
        clients_per_round=(
            composition.clients_per_round if clock is None else clock.selected(composition.clients_per_round)
        ),
        compression=described,
    )
