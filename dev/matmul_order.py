"""How often another order of a product's float32 sum shows in its bf16 output: the evidence behind
the two stand-ins of llmc/matmul.cuh's matmul_tune. Sums K products of bf16 values in [-1, 1) per
output in float32, once in order and again with two neighbouring additions swapped or with the
middle terms reversed, for the hashed stand-in and for the cancelling one (its first term 2^16, its
last the negative). Prints the share of float32 sums and of bf16 outputs that differ.
Usage: /usr/bin/python3 dev/matmul_order.py [outputs] [K]"""
import sys

import numpy as np


def to_bf16(x):
    """Rounds float32 values to bf16 (to nearest, ties to even), kept as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def ordered_sum(terms, order):
    """Each row's terms added one by one in float32, in the given order of columns."""
    total = np.zeros(terms.shape[0], np.float32)
    for k in order:
        total = (total + terms[:, k]).astype(np.float32)
    return total


def main():
    outputs = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    K = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    rng = np.random.default_rng(1)
    a = to_bf16(rng.uniform(-1, 1, (outputs, K)))
    b = to_bf16(rng.uniform(-1, 1, (outputs, K)))
    base = list(range(K))
    swapped = base.copy()
    swapped[K // 2], swapped[K // 2 + 1] = swapped[K // 2 + 1], swapped[K // 2]
    reversed_middle = base[:1] + base[1:-1][::-1] + base[-1:]
    print(f"{outputs} outputs of K = {K}: share that differs, float32 sum / bf16 output")
    for name, cancelling in (("hashed", False), ("cancelling", True)):
        x, y = a.copy(), b.copy()
        if cancelling:
            x[:, 0], y[:, 0], x[:, -1], y[:, -1] = 256, 256, -256, 256
        terms = (x * y).astype(np.float32)
        first = ordered_sum(terms, base)
        cells = []
        for order in (swapped, reversed_middle):
            other = ordered_sum(terms, order)
            cells.append(f"{np.mean(first != other):.4f} / {np.mean(to_bf16(first) != to_bf16(other)):.5f}")
        print(f"  {name:<11} two additions swapped {cells[0]}   middle reversed {cells[1]}")


if __name__ == "__main__":
    main()
