"""The IR graph of a traced program: nodes with dependencies, one ordered stream of nodes per state.

A program's state is a stream: each node depends on the one before it in its stream, plus the nodes whose
values it reads (a variable reference depends on the gen or join that produced the variable). `fork` opens one
new stream per branch; `join` depends on the last node of every branch. Nodes keep the expression to execute,
so the compiler can run the graph without re-running the Python function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixgen.lang.expr import Expr

# Node kinds, in the order a reader meets them.
KINDS = ("text", "arg", "var", "role_begin", "role_end", "scope_begin", "scope_end", "gen", "select", "fork",
         "join", "call_begin", "call_end", "set_var")
# Kinds whose value is known before any model call and before the arguments are bound.
CONSTANT_KINDS = ("text", "role_begin", "role_end")


@dataclass(frozen=True)
class Node:
    id: int
    kind: str
    stream: int
    deps: tuple[int, ...]
    label: str
    expr: Expr | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Graph:
    """A traced program. `dynamic` says where tracing stopped (Python reading a generated value), if it did."""

    name: str
    args: tuple[str, ...]
    nodes: list[Node] = field(default_factory=list)
    stream_parent: dict[int, int] = field(default_factory=dict)  # branch stream -> the fork node that opened it
    dynamic: str | None = None

    @property
    def static(self) -> bool:
        return self.dynamic is None

    def stream_nodes(self, stream: int) -> list[Node]:
        return [n for n in self.nodes if n.stream == stream]

    def constant_prefix(self) -> list[Expr]:
        """Leading expressions of the root stream that do not depend on arguments or model output."""
        out: list[Expr] = []
        for node in self.stream_nodes(0):
            if node.kind not in CONSTANT_KINDS or node.expr is None:
                break
            out.append(node.expr)
        return out

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for node in self.nodes:
            out[node.kind] = out.get(node.kind, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [f"program {self.name}({', '.join(self.args)}): {len(self.nodes)} nodes"]
        for node in self.nodes:
            deps = ", ".join(f"%{d}" for d in node.deps)
            where = f"s{node.stream}"
            lines.append(f"  %{node.id:<3} {where:<4} {node.kind:<11} {node.label}" + (f"  <- {deps}" if deps else ""))
        if self.dynamic:
            lines.append(f"  ... traced up to here: {self.dynamic}")
        return "\n".join(lines)
