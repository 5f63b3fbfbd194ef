"""`fn.trace(**kwargs)`: run a program against a recording state and return its IR graph (ir.py).

Arguments not given become `Argument` placeholders and generated values become `VarRef` placeholders; both can
be appended (`s += "Q: " + question`) but not read by Python. Formatting one into a string (an f-string,
`str()`, `%`) is a mistake the tracer names, with what to write instead. Branching on one (`if s["x"] == ...`)
is legitimate Python control flow that a static graph cannot hold: the trace stops there and the graph says so
(`graph.dynamic`); the compiler then runs such programs eagerly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from radixgen.lang.expr import (
    Expr,
    ExprList,
    Gen,
    RoleBegin,
    RoleEnd,
    Select,
    Text,
    VarScopeBegin,
    VarScopeEnd,
)
from radixgen.lang.ir import Graph, Node
from radixgen.lang.state import ForkGroup, ProgramState

if TYPE_CHECKING:
    from radixgen.lang.function import SglFunction


class TraceMisuse(TypeError):
    """A program does something tracing cannot follow and that has a better spelling."""


class DynamicControlFlow(Exception):
    """Python needs a value that exists only at run time; the static trace ends here."""


def _short(text: str, limit: int = 48) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


class _Placeholder(Expr):
    """Base of values known only at run time; appending them is fine, reading them is not."""

    what: str

    def __str__(self) -> str:
        raise TraceMisuse(
            f"{self.what} was turned into a string while tracing (f-string, str(), % or .format). Append it "
            f"instead so the graph keeps the dependency: write `s += \"text \" + {self.hint}` rather than "
            f"`s += f\"text {{{self.hint}}}\"`"
        )

    def __format__(self, spec: str) -> str:  # f-strings call this
        return self.__str__()

    def _dynamic(self, *_args: Any) -> Any:
        raise DynamicControlFlow(f"Python reads {self.what}")

    __bool__ = __eq__ = __ne__ = __lt__ = __gt__ = __len__ = __iter__ = __contains__ = __int__ = _dynamic
    __hash__ = object.__hash__

    @property
    def hint(self) -> str:
        raise NotImplementedError


class Argument(_Placeholder):
    def __init__(self, name: str) -> None:
        self.name = name
        self.what = f"argument {name!r}"

    @property
    def hint(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Argument({self.name!r})"


class VarRef(_Placeholder):
    def __init__(self, name: str, node: int | None, stream: int) -> None:
        self.name = name
        self.node = node
        self.stream = stream  # the state it was read from (a fork branch's variable may be appended to the parent)
        self.what = f"the generated value of {name!r}"

    @property
    def hint(self) -> str:
        return f"s[{self.name!r}]"

    def __repr__(self) -> str:
        return f"VarRef({self.name!r})"


def _gen_label(item: Gen) -> str:
    spec = item.spec
    parts = [repr(item.name)]
    for f in fields(spec):
        value = getattr(spec, f.name)
        if value is None:
            continue
        if isinstance(value, _Placeholder):
            raise DynamicControlFlow(
                f"gen {item.name!r} option {f.name} depends on {value.what} (bind it to compile a static plan: "
                f"fn.bind({value.hint}=...).compile())"
            )
        if f.name == "constraint":
            parts.append(f"{value.kind}={_short(value.source, 32)}")
        else:
            parts.append(f"{f.name}={value!r}")
    if item.dtype is not None:
        parts.append(f"dtype={item.dtype.__name__}")
    return " ".join(parts)


class TraceRecorder:
    """Stands where a `StreamExecutor` stands, recording one stream's nodes instead of running them."""

    def __init__(self, graph: Graph, stream: int, last: int | None, variables: dict[str, int]) -> None:
        self.graph = graph
        self.stream = stream
        self.last = last
        self.var_nodes = variables  # variable name -> node that produced it
        self.error = None

    def add(self, kind: str, label: str, expr: Expr | None = None, extra_deps: tuple[int, ...] = (),
            **attrs: Any) -> Node:
        deps = tuple(d for d in ((self.last,) if self.last is not None else ()) + extra_deps)
        node = Node(len(self.graph.nodes), kind, self.stream, tuple(dict.fromkeys(deps)), label, expr, attrs)
        self.graph.nodes.append(node)
        self.last = node.id
        return node

    def submit(self, expr: Expr) -> None:
        for item in expr.items if isinstance(expr, ExprList) else (expr,):
            self._record(item)

    def _record(self, item: Expr) -> None:
        if isinstance(item, Text):
            self.add("text", _short(item.value), item)
        elif isinstance(item, Argument):
            self.add("arg", item.name, item, name=item.name)
        elif isinstance(item, VarRef):
            deps = (item.node,) if item.node is not None else ()
            label = item.name if item.stream == self.stream else f"{item.name} of s{item.stream}"
            self.add("var", label, item, deps, name=item.name, stream=item.stream)
        elif isinstance(item, Gen):
            if item.num_samples > 1:
                raise DynamicControlFlow(f"gen {item.name!r} samples {item.num_samples} answers (run eagerly)")
            node = self.add("gen", _gen_label(item), item, name=item.name)
            if item.name:
                self.var_nodes[item.name] = node.id
        elif isinstance(item, Select):
            node = self.add("select", f"{item.name!r} choices={list(item.choices)!r} method={item.method}", item,
                            name=item.name)
            if item.name:
                self.var_nodes[item.name] = node.id
        elif isinstance(item, (RoleBegin, RoleEnd)):
            self.add("role_begin" if isinstance(item, RoleBegin) else "role_end", item.role, item)
        elif isinstance(item, VarScopeBegin):
            self.add("scope_begin", item.name, item)
        elif isinstance(item, VarScopeEnd):
            node = self.add("scope_end", item.name, item, name=item.name)
            self.var_nodes[item.name] = node.id
        else:
            raise TraceMisuse(f"cannot trace {type(item).__name__}")

    def sync(self) -> None:
        """Nothing runs while tracing, so there is nothing to wait for."""


class TracingState(ProgramState):
    """The `s` a program gets while it is being traced."""

    _ex: TraceRecorder  # type: ignore[assignment]

    def __init__(self, recorder: TraceRecorder) -> None:
        super().__init__(recorder)  # type: ignore[arg-type]  # the recorder stands where the executor stands

    def __getitem__(self, name: str) -> VarRef:
        return VarRef(name, self._ex.var_nodes.get(name), self._ex.stream)

    def _dynamic(self, what: str) -> Any:
        raise DynamicControlFlow(f"Python reads {what}")

    def text(self) -> str:
        return self._dynamic("the state's text (s.text())")

    def messages(self) -> list[dict[str, str]]:
        return self._dynamic("the chat messages (s.messages())")

    def get_meta_info(self, name: str) -> dict[str, Any]:
        return self._dynamic(f"the meta info of {name!r}")

    def variables(self) -> dict[str, Any]:
        return self._dynamic("the variables")

    def __contains__(self, name: str) -> bool:
        return self._dynamic(f"whether {name!r} exists")

    def error(self) -> None:
        return None

    def set_var(self, name: str, value: Any) -> None:
        node = self._ex.add("set_var", f"{name} = {value!r}", None, name=name, value=value)
        self._ex.var_nodes[name] = node.id

    def fork(self, size: int = 1) -> TracingForkGroup:
        rec = self._ex
        node = rec.add("fork", f"{size} branches", None, size=size)
        branches = []
        for _ in range(size):
            stream = max(rec.graph.stream_parent, default=0) + 1
            rec.graph.stream_parent[stream] = node.id
            child = TracingState(TraceRecorder(rec.graph, stream, node.id, dict(rec.var_nodes)))
            child._open_role = self._open_role
            branches.append(child)
        return TracingForkGroup(self, branches, node.id)

    def call_program(self, fn: SglFunction, kwargs: dict[str, Any]) -> Any:
        self._ex.add("call_begin", fn.func.__name__, None, name=fn.func.__name__)
        result = fn.func(self, **kwargs)
        self._ex.add("call_end", fn.func.__name__, None, name=fn.func.__name__)
        return result


class TracingForkGroup(ForkGroup):
    states: list[TracingState]

    def __init__(self, parent: TracingState, states: list[TracingState], fork_node: int) -> None:
        super().__init__(parent, states)
        self.fork_node = fork_node

    def __iter__(self) -> Iterator[TracingState]:
        return iter(self.states)

    def join(self, mode: str = "gather_variable") -> None:
        parent: TraceRecorder = self.parent._ex  # type: ignore[assignment]
        ends = tuple(s._ex.last for s in self.states if s._ex.last is not None)
        node = parent.add("join", f"{mode} of {len(self.states)} branches", None, ends, mode=mode,
                          fork=self.fork_node, streams=tuple(s._ex.stream for s in self.states))
        for state in self.states:
            for name, producer in state._ex.var_nodes.items():
                if parent.var_nodes.get(name) != producer:
                    parent.var_nodes[name] = node.id


def trace(fn: SglFunction, kwargs: dict[str, Any]) -> Graph:
    """Trace `fn` with the given arguments; the others become placeholders."""
    unknown = set(kwargs) - set(fn.arg_names)
    if unknown:
        raise TypeError(f"{fn.func.__name__} has no argument(s) {sorted(unknown)}")
    graph = Graph(fn.func.__name__, tuple(fn.arg_names))
    state = TracingState(TraceRecorder(graph, 0, None, {}))
    call_kwargs = {name: kwargs[name] if name in kwargs else Argument(name) for name in fn.arg_names}
    try:
        fn.func(state, **call_kwargs)
    except DynamicControlFlow as stop:
        graph.dynamic = str(stop)
    return graph
