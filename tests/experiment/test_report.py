"""`jaxfl report`: reading every folder layout, the plotted data against the files, the page.

One tiny single run, one two-algorithm run and one two-point sweep are made
with the CLI once per test session (shared by the xdist workers); running
(`.partial`) and damaged folders are edited copies of them.
"""

import csv
import dataclasses
import fcntl
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxfl.cli import main
from jaxfl.experiment import report
from jaxfl.experiment.report import (
    FIGURES,
    curve,
    data_differences,
    error_by_size,
    error_cdf,
    error_histogram,
    final_rows,
    read_folder,
    read_folders,
    seed_curve,
    seed_groups,
    write_report,
)

# The report reads real run folders (three runs made once): the end-to-end tier (`pytest -m slow`).
pytestmark = pytest.mark.slow

# Every figure but those drawn only where a run compressed its updates or ran on the simulated clock.
UNCOMPRESSED_FIGURES = tuple(
    name for name in FIGURES if name not in ("error_vs_bytes.png", "error_vs_time.png")
)

TINY = [
    "--dataset-option", "num_train_clients=40", "--dataset-option", "num_validation_clients=0",
    "--dataset-option", "num_test_clients=20", "--dataset-option", "pool_size=20000",
    "--rounds", "4", "--clients-per-round", "5", "--eval-every", "2", "--no-progress",
    "--strategy", "vmap",
]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


RUNS = {
    # The training loss is drawn where the training clients were evaluated (--eval-train): here only.
    "single": ["run", *TINY, "--algorithm", "fedavg", "--eval-train"],
    "multi": ["run", *TINY, "--algorithm", "fedavg,deltafl"],
    "sweep": ["sweep", *TINY, "--algorithm", "fedavg", "--grid", "lr=0.05,0.1"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three real output folders, each made once even when xdist workers share the tests.

    Under xdist they live in the session's base folder (shared by its workers,
    never by other sessions), each made under its own lock, the workers
    starting from different ones so that they make them side by side. Tests
    only read them: what they edit is a copy in their own tmp_path.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        root = tmp_path_factory.mktemp("report")
        for name, argv in RUNS.items():
            assert main([*argv, "--out", str(root / name)]) == 0
        return root
    root = tmp_path_factory.getbasetemp().parent / "report-runs"
    root.mkdir(exist_ok=True)
    names = list(RUNS)
    start = int(re.sub(r"\D", "", worker) or 0) % len(names)
    for name in names[start:] + names[:start]:
        with (root / f"{name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # Released on close, or when the worker dies.
            if not (root / f"{name}.done").exists():
                shutil.rmtree(root / name, ignore_errors=True)
                assert main([*RUNS[name], "--out", str(root / name)]) == 0
                (root / f"{name}.done").write_text("")
    return root


def _metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line]


def _clients(path, population="test"):
    with (path / "clients.csv").open(newline="") as f:
        return [row for row in csv.DictReader(f) if row["population"] == population]


def _unfinish(run: Path) -> None:
    """Makes a finished run's folder look like one killed mid-write of an evaluation."""
    for name in ("clients.csv", "summary.json", "timing.json"):
        (run / name).unlink(missing_ok=True)
    shutil.rmtree(run / "model", ignore_errors=True)
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text + text.splitlines()[-1][:57])  # A truncated last line.


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    shutil.rmtree(target / "report", ignore_errors=True)
    return target


# ---------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------


def test_reads_a_single_run(runs):
    folder = read_folder(runs / "single")
    assert folder.layout == "run" and folder.finished
    (run,) = folder.runs
    assert run.algorithm == run.label == "fedavg" and run.finished
    records = _metrics(runs / "single")
    rounds, values = curve(run, "test_error", "p90")
    np.testing.assert_array_equal(rounds, [2, 4])
    np.testing.assert_allclose(values, [r["test_error"]["p90"] for r in records])
    _, losses = curve(run, "train_loss", "mean")
    np.testing.assert_allclose(losses, [r["train_loss"]["mean"] for r in records])
    rows = _clients(runs / "single")
    np.testing.assert_allclose(run.clients["test"]["error"], [float(r["error"]) for r in rows])
    assert set(run.clients) == {"train", "test"}


def test_reads_several_algorithms_in_their_order(runs):
    folder = read_folder(runs / "multi")
    assert folder.layout == "algorithms" and folder.finished
    assert [r.label for r in folder.runs] == ["fedavg", "deltafl"]
    for run in folder.runs:
        assert run.path == runs / "multi" / run.algorithm and run.finished
        assert len(run.evaluations) == 2
        # Without --eval-train: no training loss, and no training clients' rows.
        assert curve(run, "train_loss", "mean")[0].size == 0 and set(run.clients) == {"test"}
    assert all(np.isnan(row["train_loss_mean"]) for row in final_rows([folder]))


def test_reads_a_sweep_labelled_by_its_grid(runs, tmp_path):
    folder = read_folder(runs / "sweep")
    assert folder.layout == "sweep"
    assert [r.label for r in folder.runs] == ["fedavg lr=0.05", "fedavg lr=0.1"]
    with (runs / "sweep" / "results.csv").open(newline="") as f:
        results = list(csv.DictReader(f))
    rows = final_rows([folder])
    for row, result in zip(rows, results, strict=True):
        assert row["test_error_p90"] == pytest.approx(100 * float(result["test_error_p90"]))
    # Without results.csv (a sweep still running), the points' configs say what differs.
    running = _copy(runs / "sweep", tmp_path / "sweep.partial")
    (running / "results.csv").unlink()
    (running / "config.json").unlink(missing_ok=True)
    _unfinish(running / "points" / "001")
    folder = read_folder(tmp_path / "sweep")
    assert [(r.label, r.finished) for r in folder.runs] == [
        ("fedavg lr=0.05", True), ("fedavg lr=0.1", False),
    ]


def test_reads_a_running_run_with_a_truncated_last_line(runs, tmp_path):
    # `report DIR` reads DIR.partial while DIR does not exist.
    live = _copy(runs / "single", tmp_path / "solo.partial")
    _unfinish(live)
    folder = read_folder(tmp_path / "solo")
    assert folder.path == live and not folder.finished
    (run,) = folder.runs
    assert not run.finished and run.clients == {} and run.summary is None
    assert [r["round"] for r in run.evaluations] == [2, 4]  # The half line is dropped.
    # A multi-algorithm run: fedavg done, deltafl in progress.
    live = _copy(runs / "multi", tmp_path / "both.partial")
    for name in ("comparison.csv", "comparison.md"):
        (live / name).unlink()
    _unfinish(live / "deltafl")
    folder = read_folder(tmp_path / "both")
    assert not folder.finished
    assert [(r.label, r.finished) for r in folder.runs] == [("fedavg", True), ("deltafl", False)]
    page = write_report([tmp_path / "both"])
    assert page == live / "report" / "index.html"
    text = page.read_text()
    assert "This report shows unfinished runs" in text
    assert "unfinished: round 4" in text and "finished, round 4" in text
    assert "leave out the runs without per-client results yet: deltafl" in text
    assert sorted(p.name for p in page.parent.glob("*.png")) == sorted(UNCOMPRESSED_FIGURES)
    # Before deltafl has started, its config names it: the page says it is still to come.
    shutil.rmtree(live / "deltafl")
    folder = read_folder(live)
    assert [r.label for r in folder.runs] == ["fedavg"] and folder.pending == ("deltafl",)
    assert "not started yet: deltafl" in write_report([live]).read_text()


def test_damage_before_the_last_line_is_an_error(runs, tmp_path):
    broken = _copy(runs / "single", tmp_path / "broken")
    lines = (broken / "metrics.jsonl").read_text().splitlines()
    (broken / "metrics.jsonl").write_text("\n".join([lines[0][:30], *lines[1:]]) + "\n")
    with pytest.raises(report.ReportError, match="line 1"):
        read_folder(broken)


def test_null_values_are_skipped(runs, tmp_path):
    nulls = _copy(runs / "single", tmp_path / "nulls")
    records = _metrics(nulls)
    records[0]["test_error"]["mean"] = None
    records[1]["train_loss"] = None
    records[1]["test_error"]["p90"] = None
    (nulls / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = json.loads((nulls / "summary.json").read_text())
    summary["test_error"]["std"] = None
    (nulls / "summary.json").write_text(json.dumps(summary))
    text = (nulls / "clients.csv").read_text().splitlines()
    first_test = next(i for i, line in enumerate(text) if line.startswith("test,"))
    cells = text[first_test].split(",")
    cells[4] = "nan"
    text[first_test] = ",".join(cells)
    (nulls / "clients.csv").write_text("\n".join(text) + "\n")

    (run,) = read_folder(nulls).runs
    rounds, values = curve(run, "test_error", "mean")
    assert rounds.tolist() == [4] and values[0] == records[1]["test_error"]["mean"]
    assert curve(run, "train_loss", "mean")[0].tolist() == [2]
    assert curve(run, "test_error", "p90")[0].tolist() == [2]
    assert error_cdf(run)[0].size == 19  # The NaN client is left out.
    (row,) = final_rows(read_folders([nulls]))
    assert np.isnan(row["test_error_std"]) and np.isfinite(row["test_error_mean"])
    page = write_report([nulls], tmp_path / "out")
    assert "&ndash;" in page.read_text()


def test_labels_of_folders_sharing_an_algorithm(runs, tmp_path):
    other = _copy(runs / "single", tmp_path / "seed1")
    folders = read_folders([runs / "single", other, runs / "multi"])
    assert [r.label for f in folders for r in f.runs] == ["single", "seed1", "multi/fedavg", "deltafl"]


# ---------------------------------------------------------------------------
# The plotted data.
# ---------------------------------------------------------------------------


def test_cdf_histogram_and_sizes_equal_clients_csv(runs):
    (run,) = read_folder(runs / "single").runs
    rows = _clients(runs / "single")
    errors = np.array([float(r["error"]) for r in rows])
    sizes = np.array([float(r["num_examples"]) for r in rows])

    x, fractions = error_cdf(run)
    np.testing.assert_allclose(x, np.sort(100 * errors))
    np.testing.assert_allclose(fractions, np.arange(1, len(rows) + 1) / len(rows))

    counts, edges = error_histogram(run)
    assert counts.sum() == len(rows)
    np.testing.assert_array_equal(edges, np.linspace(0, 100, 21))
    np.testing.assert_array_equal(counts, np.histogram(100 * errors, bins=edges)[0])

    got_sizes, got_errors = error_by_size(run)
    np.testing.assert_array_equal(got_sizes, sizes)
    np.testing.assert_allclose(got_errors, 100 * errors)

    # The table's p90 is the run's own summary, which the histogram's p90 line matches.
    summary = json.loads((runs / "single" / "summary.json").read_text())
    (row,) = final_rows([read_folder(runs / "single")])
    assert row["test_error_p90"] == pytest.approx(100 * summary["test_error"]["p90"])
    assert report.percentile(100 * errors, 90) == pytest.approx(100 * summary["test_error"]["p90"], abs=1e-4)


# ---------------------------------------------------------------------------
# Files and the command.
# ---------------------------------------------------------------------------


def _png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_SIGNATURE)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_report_command_writes_figures_and_a_self_contained_page(runs, tmp_path, capsys):
    out = tmp_path / "figures"
    status = main(["report", str(runs / "multi"), str(runs / "sweep"), "--out", str(out)])
    assert status == 0
    assert str(out / "index.html") in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted([*UNCOMPRESSED_FIGURES, "index.html"])
    for name in UNCOMPRESSED_FIGURES:
        width, height = _png_size((out / name).read_bytes())
        assert width > 300 and height > 200
    text = (out / "index.html").read_text()
    assert text.count('src="data:image/png;base64,') == len(UNCOMPRESSED_FIGURES)
    assert "<script" not in text and "http:" not in text and "https:" not in text
    assert re.findall(r'(?:src|href)="(?!data:)', text) == []
    for label in ("fedavg", "deltafl", "fedavg lr=0.05", "fedavg lr=0.1"):
        assert f"<td>{html.escape(label)}</td>" in text
    assert "This report shows unfinished runs" not in text
    assert "not on the same data" not in text
    # Rewriting an earlier report is allowed.
    assert main(["report", str(runs / "single"), "--out", str(out)]) == 0


def test_seeds_of_one_setting_are_one_curve_and_other_data_are_said(runs):
    # The sweep's two points made into two seeds of one setting, then into runs on two datasets.
    first, second = read_folder(runs / "sweep").runs
    as_seeds = [
        dataclasses.replace(run, config={**first.config, "seed": seed, "out": f"o{seed}"})
        for run, seed in ((first, 3), (second, 4))
    ]
    other = dataclasses.replace(first, config={**first.config, "lr": 0.5})
    groups = seed_groups([*as_seeds, other])
    assert [[id(run) for run in group] for group in groups] == [[id(r) for r in as_seeds], [id(other)]]
    rounds, mean, low, high = seed_curve(as_seeds, "test_error", "mean")
    (r1, v1), (_, v2) = curve(first, "test_error", "mean"), curve(second, "test_error", "mean")
    np.testing.assert_array_equal(rounds, r1)
    np.testing.assert_allclose(mean, (v1 + v2) / 2)
    np.testing.assert_allclose(low, np.minimum(v1, v2))
    np.testing.assert_allclose(high, np.maximum(v1, v2))
    assert data_differences([first, second]) == []
    options = {**first.config["dataset_options"], "num_test_clients": 30}
    moved = dataclasses.replace(second, config={**second.config, "dataset_options": options})
    (difference,) = data_differences([first, moved])
    assert difference.startswith("dataset_options: ")
    assert first.label in difference and moved.label in difference


def test_default_out_is_the_folders_report(runs, tmp_path):
    folder = _copy(runs / "single", tmp_path / "default")
    page = write_report([folder])
    assert page == folder / "report" / "index.html"
    assert read_folder(folder).layout == "run"  # The report does not disturb reading.


def _refuses(argv, words, capsys):
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("jaxfl: error: "), err
    for word in words:
        assert word in err, (word, err)


def test_refusals_exit_2_with_one_line(runs, tmp_path, capsys, monkeypatch):
    _refuses(["report", str(tmp_path / "nope")], ["no results folder", "nope"], capsys)
    (tmp_path / "file.txt").write_text("x")
    _refuses(["report", str(tmp_path / "file.txt")], ["is a file"], capsys)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    _refuses(["report", str(tmp_path / "empty")], ["no jaxfl results"], capsys)
    _refuses(["report"], ["DIR"], capsys)
    _refuses(["report", str(runs / "single"), "--out", str(tmp_path / "file.txt")], ["is a file"], capsys)
    # A results folder (or any other) is never written over.
    _refuses(["report", str(runs / "single"), "--out", str(runs / "multi")], ["not a folder of jaxfl report"],
             capsys)
    _refuses(["report", str(runs / "single"), str(runs / "multi")], ["--out"], capsys)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "never"
    _refuses(["report", str(runs / "single"), "--out", str(out)], ["jaxfl[plots]"], capsys)
    assert not out.exists()


# ---------------------------------------------------------------------------
# The page in a real browser.
# ---------------------------------------------------------------------------

# Injected first in <head>: records every error (a failed image or other
# resource, a script error, console.error) and, once the page has loaded,
# writes what each image shows into the DOM, which --dump-dom prints.
PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => __errors.push(
  String(e.message || (e.target && (e.target.src || e.target.href)))), true);
const __consoleError = console.error;
console.error = (...args) => { __errors.push(args.join(" ")); __consoleError(...args); };
window.addEventListener("load", () => {
  const images = [...document.images].map(i => ({
    complete: i.complete, natural: i.naturalWidth, shown: i.getBoundingClientRect().width}));
  const resources = performance.getEntriesByType("resource").map(r => r.name);
  document.body.setAttribute("data-probe", JSON.stringify(
    {images, errors: __errors, resources, scripts: document.scripts.length}));
});
</script>"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def _load_in_chromium(text: str, tmp_path: Path) -> dict:
    """Loads `text` (with the probe) in headless chromium; returns what the probe saw."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium (apt-get install chromium): the page is not checked in a browser")
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("<head>", "<head>\n" + PROBE, 1))
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2000", "--dump-dom",
         probed.as_uri()],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'data-probe="([^"]*)"', done.stdout)
    assert found, done.stdout[-2000:]
    return json.loads(html.unescape(found.group(1)))


def test_page_in_headless_chromium(runs, tmp_path):
    page = write_report([runs / "multi"], tmp_path / "report")
    start = time.monotonic()
    result = _load_in_chromium(page.read_text(), tmp_path)
    assert result["errors"] == []
    assert result["resources"] == []  # No request at all: images are data URIs.
    assert result["scripts"] == 1  # Only the probe: the page itself has no script.
    assert len(result["images"]) == len(UNCOMPRESSED_FIGURES)
    for image in result["images"]:
        assert image["complete"] and image["natural"] > 300 and image["shown"] > 100, image
    assert time.monotonic() - start < 30


def test_the_browser_probe_sees_broken_pages(tmp_path):
    # The control: what the test above would catch (a missing image, an external file, a script error).
    text = (
        '<!DOCTYPE html><html><head><link rel="stylesheet" href="missing.css"></head><body>'
        '<img src="missing.png"><script>undefined_function();</script></body></html>'
    )
    result = _load_in_chromium(text, tmp_path)
    assert result["images"][0]["natural"] == 0
    assert any("missing.png" in e for e in result["errors"])
    assert any("missing.css" in e for e in result["errors"])
    assert any("undefined_function" in e for e in result["errors"])
