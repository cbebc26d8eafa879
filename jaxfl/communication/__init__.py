"""What clients and server send each other: compressed updates and the bytes of a run's messages."""

from jaxfl.communication.compression import COMPRESSORS, UpdateCompression, compress_updates
from jaxfl.communication.traffic import Traffic, round_traffic

__all__ = ["COMPRESSORS", "Traffic", "UpdateCompression", "compress_updates", "round_traffic"]
