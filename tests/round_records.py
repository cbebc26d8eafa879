"""Recorded results of fixed runs: what a refactoring of the round must leave unchanged.

A record holds, for each algorithm of a finished run, what the run wrote
(`metrics.jsonl`, `summary.json`, `clients.csv`) and its final parameters
(the global model's values, and each saved personal model's norm), plus a
SHA-256 of the parameters' bytes. `assert_matches_record` compares a new run
with the record: numbers within `RTOL`/`ATOL` (so that another CPU's
summation order passes), everything else exactly. With `JAXFL_RECORDS=exact`
numbers must be equal bit for bit and the parameter hashes too (the check
made on one machine before and after a change to the round); with
`JAXFL_RECORDS=write` the records are rewritten, which a commit does only when
it means to change results, saying why.

The records are not accuracy claims: they pin down the whole round (cohort,
keys, local steps, aggregation, server step, evaluation) so that moving its
code around cannot change a bit unnoticed.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from pathlib import Path

import jax
import numpy as np

RECORDS = Path(__file__).parent / "records"
RTOL = 1e-5
ATOL = 1e-6
# Wider tolerances where an algorithm amplifies another CPU's rounding: Per-FedAvg (HF)'s Hessian-vector
# product by central differences, (g(w + d v) - g(w - d v)) / (2 d) with d = 1e-3, multiplies the gradients'
# last-bit differences by about 1 / (2 d) = 500 (an AMD EPYC's parameters differ from an Intel Xeon's record
# by 5e-5 relative at 19ac587, before any change to the round).
TOLERANCES = {"perfedavg": (1e-3, 1e-5)}
# Run outputs that are not results (times, where files are).
_NOT_RESULTS = {"timing", "results_dir", "out"}


def fingerprint(run_dir: Path, algorithm: str) -> dict:
    """What the run wrote for `algorithm` (see the module docstring)."""
    from jaxfl.experiment.saved_model import load_model

    folder = run_dir / algorithm if (run_dir / algorithm).is_dir() else run_dir
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "summary.json").read_text())
    with (folder / "clients.csv").open() as f:
        clients = list(csv.DictReader(f))
    saved = load_model(run_dir, algorithm)
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(saved.params)]
    digest = hashlib.sha256(b"".join(leaf.tobytes() for leaf in leaves)).hexdigest()
    record = {
        "metrics": metrics,
        "summary": {k: v for k, v in summary.items() if k not in _NOT_RESULTS},
        "clients": clients,
        "params": [leaf.ravel().tolist() for leaf in leaves],
        "params_sha256": digest,
    }
    if saved.personal is not None:
        personal = [np.asarray(leaf) for leaf in jax.tree.leaves(saved.personal)]
        rows = personal[0].shape[0]
        squares = sum(np.sum(leaf.reshape(rows, -1).astype(np.float64) ** 2, axis=1) for leaf in personal)
        record["personal_norms"] = np.sqrt(squares).tolist()
        record["personal_sha256"] = hashlib.sha256(b"".join(p.tobytes() for p in personal)).hexdigest()
    return record


def assert_matches_record(name: str, run_dir: Path, algorithms) -> None:
    """Compares the run's results for `algorithms` with record `name` (see the module docstring)."""
    found = {algorithm: fingerprint(Path(run_dir), algorithm) for algorithm in algorithms}
    path = RECORDS / f"{name}.json"
    mode = os.environ.get("JAXFL_RECORDS", "")
    if mode == "write":
        RECORDS.mkdir(exist_ok=True)
        path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        return
    recorded = json.loads(path.read_text())
    assert sorted(found) == sorted(recorded), f"{name}: algorithms {sorted(found)} != {sorted(recorded)}"
    exact = mode == "exact"
    for algorithm in found:
        new, old = found[algorithm], recorded[algorithm]
        if exact:
            assert new["params_sha256"] == old["params_sha256"], f"{name}/{algorithm}: parameters differ"
            same = new.get("personal_sha256") == old.get("personal_sha256")
            assert same, f"{name}/{algorithm}: personal models"
        tolerance = TOLERANCES.get(algorithm, (RTOL, ATOL))
        for key in old:
            if key.endswith("sha256"):
                continue
            _assert_close(new.get(key), old[key], f"{name}/{algorithm}/{key}", exact, tolerance)


def _assert_close(new, old, where: str, exact: bool, tolerance=(RTOL, ATOL)) -> None:
    if isinstance(old, dict):
        keys = f"{where}: keys {sorted(new)!r:.200} != {sorted(old)!r:.200}" if isinstance(new, dict) else ""
        assert isinstance(new, dict) and sorted(new) == sorted(old), keys
        for key in old:
            _assert_close(new[key], old[key], f"{where}/{key}", exact, tolerance)
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), f"{where}: lengths differ"
        for i, (a, b) in enumerate(zip(new, old)):
            _assert_close(a, b, f"{where}[{i}]", exact, tolerance)
    elif isinstance(old, str) and _is_number(old) and _is_number(new):
        _assert_close(float(new), float(old), where, exact, tolerance)
    elif isinstance(old, float) or (isinstance(old, int) and isinstance(new, float)):
        if math.isnan(old):
            assert math.isnan(new), f"{where}: {new} is not NaN"
        elif exact:
            assert new == old, f"{where}: {new!r} != {old!r}"
        else:
            close = math.isclose(new, old, rel_tol=tolerance[0], abs_tol=tolerance[1])
            assert close, f"{where}: {new!r} != {old!r}"
    else:
        assert new == old, f"{where}: {new!r} != {old!r}"


def _is_number(text) -> bool:
    if not isinstance(text, str):
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True
