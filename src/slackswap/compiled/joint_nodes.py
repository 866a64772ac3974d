"""Which side of AOTAutograd's joint forward+backward graph a node is on (the partitioner's tags)."""

from __future__ import annotations

import torch.fx as fx


def is_backward_node(node: fx.Node) -> bool:
    return node.meta.get("partitioner_tag") == "is_backward" or (
        node.op == "placeholder" and node.name.startswith("tangents")
    )


def is_forward_op_node(node: fx.Node) -> bool:
    return node.op == "call_function" and not is_backward_node(node)
