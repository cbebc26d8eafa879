"""A run setting as declared: its default, its allowed values and its help.

`jaxfl.experiment.config.RunConfig`'s sections are built from these
declarations: the run-level ones in the section classes of
`jaxfl.experiment.config`, the algorithms' own in their registry entries
(`jaxfl.algorithms.registry.AlgorithmSpec.settings`), which make its
`options` and `privacy` sections. From each one
come a config-file key, a command-line flag (the name with dashes), the
value check and the `--help` line, so that none of them can disagree.

This module imports nothing of jaxfl and no JAX: reading a configuration
compiles nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Items:
    """The elements of a list-valued setting (a comma-separated string of numbers).

    Each is checked as setting `twin` is (or against `low`/`high`); none
    twice; at most `max_count` (every sampled client tries each one in every
    round, so the round's cost grows with their number); '' (none) is allowed
    only where `empty` says what it means.
    """

    twin: str | None = None
    low: float | None = None
    high: float | None = None
    max_count: int = 32
    empty: str | None = None


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting.

    Attributes:
      default: its value when not given (a dict default is copied per config).
      help: what it means, for `--help` (an algorithm's setting is prefixed
        with the names of the algorithms that read it).
      type: its type as annotated ('float', 'int | None', ...); by default
        the default's type, with '| None' when `optional`.
      low, high, low_open, high_open: the allowed interval, when numeric.
      choices: the allowed values, when enumerated.
      optional: whether None (unset) is allowed.
      unset_word: for an optional setting, a word that unsets it where a
        value is expected (a flag, or a config file, which has no null):
        `--eval-clients all` undoes a preset's sample.
      flag: whether it has a command-line flag (else config files only).
      items: for a list-valued setting, how its elements are checked.
      default_text: what `--help` says the default is, where the value is
        not it (a dataset's own default, say).
      section: for an algorithm's setting, the `--help` group it joins:
        'algorithm' or 'privacy'.
    """

    default: Any
    help: str
    type: str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple | None = None
    optional: bool = False
    unset_word: str | None = None
    flag: bool = True
    items: Items | None = None
    default_text: str | None = None
    section: str = "algorithm"

    @property
    def annotation(self) -> str:
        """The field's type annotation (`type`, or inferred from `default`)."""
        if self.type is not None:
            return self.type
        if self.default is None:
            raise ValueError(f"a setting whose default is None needs its type ({self.help!r})")
        name = type(self.default).__name__
        return f"{name} | None" if self.optional else name

    def field(self, help: str | None = None) -> dataclasses.Field:
        """A dataclass field holding this default, with the rest as metadata (`help` replacing its own)."""
        if isinstance(self.default, dict):
            default = dict(self.default)
            default_kwargs: dict[str, Any] = dict(default_factory=lambda: dict(default))
        else:
            default_kwargs = dict(default=self.default)
        metadata = {
            name: getattr(self, name)
            for name in (
                "help", "low", "high", "low_open", "high_open", "choices", "optional", "unset_word", "flag",
                "items", "default_text",
            )
        }
        if help is not None:
            metadata["help"] = help
        return dataclasses.field(**default_kwargs, metadata=metadata)
