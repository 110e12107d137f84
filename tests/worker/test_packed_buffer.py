"""PackedBuffer: resetting the other fields to their padding and rewriting only the block
table's used corner leaves the buffer exactly as a whole refill would, step after step."""

import numpy as np

from vjx.worker.step_layout import PackedBuffer, StepLayout

NUM_REQS, WIDTH = 8, 6


def test_block_tables_is_the_last_field():
    layout = StepLayout(16, NUM_REQS, NUM_REQS, WIDTH, 2)
    assert layout.fields["block_tables"][1] == layout.size


def test_each_step_equals_a_whole_refill():
    layout = StepLayout(16, NUM_REQS, NUM_REQS, WIDTH, 2)
    head = layout.fields["block_tables"][0]
    buffer = PackedBuffer(layout)
    rng = np.random.default_rng(0)
    for _ in range(50):
        # The persistent block table: each slot's blocks, zeros past its last block.
        num_blocks = rng.integers(0, WIDTH + 1, size=NUM_REQS)
        table = np.zeros((NUM_REQS, WIDTH), np.int32)
        for row, n in enumerate(num_blocks):
            table[row, :n] = rng.integers(1, 100, n)
        rows = rng.permutation(NUM_REQS)[: rng.integers(1, NUM_REQS + 1)]
        buffer.data[:head] = rng.integers(-9, 9, head)  # what the last step left in the other fields

        buffer.reset()
        buffer.set_block_tables(table, rows, int(num_blocks[rows].max()))

        expected = np.zeros(layout.size, np.int32)
        for name, value in layout.padding.items():
            layout.view(expected, name)[...] = value
        layout.view(expected, "block_tables")[0, : len(rows)] = table[rows]  # the one KV cache group
        np.testing.assert_array_equal(buffer.data, expected)
