"""Time the Pallas kernels of `jaxfl.kernels` against their pure-jnp references.

Run on the machine whose numbers you want (the kernels run natively on GPU;
on CPU only the Pallas interpreter exists, so CPU kernel timings measure the
interpreter, not a kernel, and are reported as such):

  python benchmarks/primitives_kernels.py            # default sizes
  python benchmarks/primitives_kernels.py --quick    # small sizes

For each op and size it reports the compile time of the first call and the
median of `--repeats` timed calls (after `block_until_ready`), for the kernel
and the reference, and checks that both agree. `jaxfl.primitives` dispatches
to a kernel only where such a measurement on an accelerator shows it faster
(none recorded yet: see docs/primitives.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jaxfl.kernels.noisy_histogram import (
    noisy_histogram_sum,
    noisy_histogram_sum_reference,
)
from jaxfl.kernels.tail_selection import tail_selection, tail_selection_reference

from jaxfl.primitives.histogram import bin_index


def _time(fn, repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return out, first, statistics.median(times)


def bench_tail_selection(batch, n, repeats, interpret):
    """Kernel and reference timings of the tail selection on [batch, n]."""
    rng = np.random.default_rng(0)
    losses = jnp.asarray(rng.normal(size=(batch, n)).astype(np.float32))
    weights = jnp.asarray(rng.uniform(size=(batch, n)).astype(np.float32))
    theta = jnp.full((batch,), 0.1, jnp.float32)
    kernel = _time(
        lambda: tail_selection(losses, weights, theta, interpret=interpret), repeats
    )
    reference = _time(lambda: tail_selection_reference(losses, weights, theta), repeats)
    agree = bool(
        np.array_equal(kernel[0][0], reference[0][0])
        and np.allclose(kernel[0][1], reference[0][1], atol=1e-6)
    )
    return kernel, reference, agree


def bench_noisy_histogram(n, num_bins, repeats, interpret):
    """Kernel and reference timings of the noisy histogram secure sum."""
    rng = np.random.default_rng(1)
    bins = bin_index(
        jnp.asarray(rng.uniform(0, 10, n).astype(np.float32)), num_bins, 10.0
    )
    noise = jnp.asarray(
        rng.integers(-100, 100, size=(n, 2 * num_bins - 2)).astype(np.int32)
    )
    modulus = 2**20 + 7  # not a power of two: the modular tree sum
    kwargs = dict(num_bins=num_bins, modulus=modulus)
    kernel = _time(
        lambda: noisy_histogram_sum(bins, noise, 3, interpret=interpret, **kwargs),
        repeats,
    )
    reference = _time(
        lambda: noisy_histogram_sum_reference(bins, noise, 3, **kwargs), repeats
    )
    return kernel, reference, bool(np.array_equal(kernel[0], reference[0]))


def main(argv=None):
    """Parses the flags and prints one table row per op and size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    backend = jax.default_backend()
    interpret = backend == "cpu"
    print(
        f"backend={backend} device={jax.devices()[0].device_kind} interpret={interpret}"
    )
    if args.quick:
        tail_sizes, hist_sizes = [(8, 128)], [(256, 64)]
    else:
        tail_sizes = [(8, 128), (64, 1024), (512, 1024), (64, 16384)]
        hist_sizes = [(256, 64), (4096, 256), (16384, 1024)]
    columns = ("op", "size", "kernel ms", "ref ms", "kernel compile s", "ref compile s")
    widths = (16, 16, 10, 10, 17, 14)
    print(" ".join(f"{c:>{w}s}" for c, w in zip(columns, widths, strict=True)), "agree")

    def row(op, size, kernel, reference, agree):
        (_, kernel_first, kernel_s), (_, ref_first, ref_s) = kernel, reference
        cells = (
            f"{op:>16s}",
            f"{size:>16s}",
            f"{1e3 * kernel_s:10.3f}",
            f"{1e3 * ref_s:10.3f}",
            f"{kernel_first:17.2f}",
            f"{ref_first:14.2f}",
        )
        print(" ".join(cells), agree)

    for batch, n in tail_sizes:
        kernel, reference, agree = bench_tail_selection(
            batch, n, args.repeats, interpret
        )
        row("tail_selection", f"{batch}x{n}", kernel, reference, agree)
    for n, num_bins in hist_sizes:
        kernel, reference, agree = bench_noisy_histogram(
            n, num_bins, args.repeats, interpret
        )
        row("noisy_histogram", f"n={n},b={num_bins}", kernel, reference, agree)
    if interpret:
        print(
            "CPU: the kernels ran through the Pallas interpreter (lowered to "
            "XLA:CPU ops), not as compiled kernels."
        )


if __name__ == "__main__":
    main()
