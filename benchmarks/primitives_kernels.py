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

from jaxfl.kernels.noisy_histogram import noisy_histogram_sum, noisy_histogram_sum_reference
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
    rng = np.random.default_rng(0)
    losses = jnp.asarray(rng.normal(size=(batch, n)).astype(np.float32))
    weights = jnp.asarray(rng.uniform(size=(batch, n)).astype(np.float32))
    theta = jnp.full((batch,), 0.1, jnp.float32)
    kernel = _time(lambda: tail_selection(losses, weights, theta, interpret=interpret), repeats)
    reference = _time(lambda: tail_selection_reference(losses, weights, theta), repeats)
    agree = bool(
        np.array_equal(kernel[0][0], reference[0][0])
        and np.allclose(kernel[0][1], reference[0][1], atol=1e-6)
    )
    return kernel, reference, agree


def bench_noisy_histogram(n, num_bins, repeats, interpret):
    rng = np.random.default_rng(1)
    bins = bin_index(jnp.asarray(rng.uniform(0, 10, n).astype(np.float32)), num_bins, 10.0)
    noise = jnp.asarray(rng.integers(-100, 100, size=(n, 2 * num_bins - 2)).astype(np.int32))
    modulus = 2**20 + 7  # not a power of two: the modular tree sum
    kwargs = dict(num_bins=num_bins, modulus=modulus)
    kernel = _time(
        lambda: noisy_histogram_sum(bins, noise, 3, interpret=interpret, **kwargs), repeats
    )
    reference = _time(lambda: noisy_histogram_sum_reference(bins, noise, 3, **kwargs), repeats)
    return kernel, reference, bool(np.array_equal(kernel[0], reference[0]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    backend = jax.default_backend()
    interpret = backend == "cpu"
    print(f"backend={backend} device={jax.devices()[0].device_kind} interpret={interpret}")
    if args.quick:
        tail_sizes, hist_sizes = [(8, 128)], [(256, 64)]
    else:
        tail_sizes = [(8, 128), (64, 1024), (512, 1024), (64, 16384)]
        hist_sizes = [(256, 64), (4096, 256), (16384, 1024)]
    header = f"{'op':16s} {'size':>14s} {'kernel ms':>10s} {'ref ms':>10s} {'kernel compile s':>17s} {'ref compile s':>14s} agree"
    print(header)
    for batch, n in tail_sizes:
        (_, k_first, k_ms), (_, r_first, r_ms), agree = bench_tail_selection(batch, n, args.repeats, interpret)
        print(f"{'tail_selection':16s} {f'{batch}x{n}':>14s} {1e3 * k_ms:10.3f} {1e3 * r_ms:10.3f} {k_first:17.2f} {r_first:14.2f} {agree}")
    for n, num_bins in hist_sizes:
        (_, k_first, k_ms), (_, r_first, r_ms), agree = bench_noisy_histogram(n, num_bins, args.repeats, interpret)
        print(f"{'noisy_histogram':16s} {f'n={n},b={num_bins}':>14s} {1e3 * k_ms:10.3f} {1e3 * r_ms:10.3f} {k_first:17.2f} {r_first:14.2f} {agree}")
    if interpret:
        print("CPU: kernel times are the Pallas *interpreter*; only accelerator numbers decide dispatch.")


if __name__ == "__main__":
    main()
