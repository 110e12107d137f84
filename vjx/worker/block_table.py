"""The block tables of the persistent batch: per KV cache group, one row of block ids per slot."""

import numpy as np


class BlockTable:
    """Host copy of every slot's block ids in one group, `[max_num_reqs, max_num_blocks_per_req]`
    int32.

    Entries past a row's last block stay 0 (the scratch block), so a row can be sent to the
    device as it is.
    """

    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int):
        self.block_table = np.zeros((max_num_reqs, max_num_blocks_per_req), np.int32)
        self.num_blocks_per_row = np.zeros(max_num_reqs, np.int32)

    @property
    def max_num_blocks_per_req(self) -> int:
        return self.block_table.shape[1]

    def append_row(self, block_ids: list[int], row: int) -> None:
        start = self.num_blocks_per_row[row]
        end = start + len(block_ids)
        if end > self.max_num_blocks_per_req:
            raise ValueError(
                f"request in row {row} needs {end} blocks, more than the "
                f"{self.max_num_blocks_per_req} that max_model_len allows."
            )
        self.block_table[row, start:end] = block_ids
        self.num_blocks_per_row[row] = end

    def add_row(self, block_ids: list[int], row: int) -> None:
        self.clear_row(row)
        self.append_row(block_ids, row)

    def clear_row(self, row: int) -> None:
        self.block_table[row, : self.num_blocks_per_row[row]] = 0
        self.num_blocks_per_row[row] = 0


class MultiGroupBlockTable:
    """One `BlockTable` per KV cache group; block ids come per group, in group order."""

    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int, num_groups: int):
        self.block_tables = [BlockTable(max_num_reqs, max_num_blocks_per_req) for _ in range(num_groups)]

    def __getitem__(self, group: int) -> BlockTable:
        return self.block_tables[group]

    def append_row(self, block_ids: tuple[list[int], ...], row: int) -> None:
        for table, ids in zip(self.block_tables, block_ids, strict=True):
            table.append_row(ids, row)

    def add_row(self, block_ids: tuple[list[int], ...], row: int) -> None:
        for table, ids in zip(self.block_tables, block_ids, strict=True):
            table.add_row(ids, row)

    def clear_row(self, row: int) -> None:
        for table in self.block_tables:
            table.clear_row(row)
