"""`ProgramState` (the `s` of a program) and `ForkGroup` (what `s.fork(n)` returns).

The state is the program's handle: appending enqueues onto its `StreamExecutor`; reading waits for it. Role
nesting is checked here, at the `+=` in the program's own thread, so misuse raises where it was written.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from radixgen.lang.executor import ProgramError, StreamExecutor
from radixgen.lang.expr import (
    Expr,
    ExprList,
    RoleBegin,
    RoleEnd,
    VarScopeBegin,
    VarScopeEnd,
    flatten,
    role_expr,
)

if TYPE_CHECKING:
    from typing_extensions import Self


class RoleMisuse(ValueError):
    pass


class ProgramState:
    """The state a program appends to and reads from (SGLang's `ProgramState` surface)."""

    def __init__(self, executor: StreamExecutor) -> None:
        self._ex = executor
        self._open_role: str | None = None
        self.ret_value: Any = None

    # -- appending -------------------------------------------------------------------------------------------
    def __iadd__(self, other: Any) -> Self:
        self._submit(ExprList(tuple(flatten([other]))))
        return self

    def _submit(self, expr: ExprList) -> None:
        for item in expr.items:
            self._check_role(item)
        self._ex.submit(expr)

    def _check_role(self, item: Expr) -> None:
        if isinstance(item, RoleBegin):
            if self._open_role is not None:
                raise RoleMisuse(
                    f"role {item.role!r} opened inside role {self._open_role!r}; roles do not nest. Close the "
                    f"{self._open_role} turn first, e.g. `with s.{self._open_role}(): ...` and then "
                    f"`with s.{item.role}(): ...` one after the other"
                )
            self._open_role = item.role
        elif isinstance(item, RoleEnd):
            if self._open_role != item.role:
                raise RoleMisuse(
                    f"{item.role}_end() without a matching {item.role}_begin() (open role: {self._open_role!r})"
                )
            self._open_role = None

    def _role(self, role: str, expr: Any | None):
        if expr is not None:
            self += role_expr(role, expr)
            return None
        return self._role_scope(role)

    @contextlib.contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self._submit(ExprList((RoleBegin(role),)))
        yield
        self._submit(ExprList((RoleEnd(role),)))

    def system(self, expr: Any | None = None):
        """`s.system("...")` appends a system turn; `with s.system(): ...` wraps what is appended inside."""
        return self._role("system", expr)

    def user(self, expr: Any | None = None):
        return self._role("user", expr)

    def assistant(self, expr: Any | None = None):
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside becomes variable `name` as well."""
        self._ex.submit(VarScopeBegin(name))
        yield
        self._ex.submit(VarScopeEnd(name))

    def set_var(self, name: str, value: Any) -> None:
        self._ex.sync()
        self._ex.set_var(name, value)

    # -- reading ---------------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        self._ex.sync()
        if name in self._ex.variables:
            return self._ex.variables[name]
        if self._ex.error is not None:
            raise ProgramError(f"variable {name!r} was not produced: {self._ex.error!r}") from self._ex.error
        raise KeyError(f"no variable {name!r}; known: {sorted(self._ex.variables)}")

    def __setitem__(self, name: str, value: Any) -> None:
        """`s[name] = value` sets a variable, as `set_var` does."""
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self._ex.sync()
        return name in self._ex.variables

    def get_var(self, name: str) -> Any:
        return self[name]

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """What the model call that produced `name` reported (tokens, cached tokens, logprobs, scores)."""
        self._ex.sync()
        return self._ex.meta_info.get(name, {})

    def text(self) -> str:
        self._ex.sync()
        return self._ex.text

    def messages(self) -> list[dict[str, str]]:
        """The chat turns written so far, as [{"role", "content"}]."""
        self._ex.sync()
        return list(self._ex.messages)

    def variables(self) -> dict[str, Any]:
        self._ex.sync()
        return dict(self._ex.variables)

    def error(self) -> BaseException | None:
        """The exception that stopped this program (its own code or a model call), or None."""
        self._ex.sync()
        return self._ex.error

    def sync(self) -> None:
        self._ex.sync()

    def text_iter(self, var_name: str | None = None, *, var: str | None = None,
                  timeout: float | None = None) -> Iterator[str]:
        """Text deltas as they are produced: of the whole state, or of one generated variable (SGLang calls the
        argument `var_name`; `var=` is accepted too)."""
        return self._ex.log.follow(var if var is not None else var_name, timeout)

    async def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False, *,
                              var: str | None = None) -> AsyncIterator[Any]:
        """`async for delta in state.text_async_iter():` — `text_iter` without blocking the event loop. With
        `return_meta_data` (SGLang's flag) each item is `(delta, meta_info)`, the meta info its call had reported
        by then (the full meta info arrives with the last delta)."""
        name = var if var is not None else var_name
        it: Iterator[Any] = (self._ex.log.follow_with_meta(name) if return_meta_data else self._ex.log.follow(name))
        done = object()
        while True:
            item = await asyncio.to_thread(next, it, done)
            if item is done:
                return
            yield item

    def __aiter__(self) -> AsyncIterator[str]:
        return self.text_async_iter()

    # -- parallel branches -----------------------------------------------------------------------------------
    def fork(self, size: int = 1) -> ForkGroup:
        """`size` copies of this state that continue independently; their model calls run concurrently.

        The shared text is prefilled once first, so the branches all start from a cached prefix.
        """
        self._ex.sync()
        if self._ex.error is not None:
            raise ProgramError(f"cannot fork a failed state: {self._ex.error!r}") from self._ex.error
        if size > 1 and self._ex.text and self._ex.cached_len < len(self._ex.text):
            self._ex.backend.cache_prefix(self._ex.text)
            self._ex.cached_len = len(self._ex.text)
        return ForkGroup(self, [self._copy() for _ in range(size)])

    def _copy(self) -> ProgramState:
        src = self._ex
        ex = StreamExecutor(src.backend, src.defaults, src.stream)
        ex.text, ex.turns, ex.cached_len = src.text, src.turns, src.cached_len
        ex.variables = copy.copy(src.variables)
        ex.var_versions = dict(src.var_versions)
        ex.meta_info = copy.copy(src.meta_info)
        ex.messages = list(src.messages)
        ex._role_start = src._role_start
        ex._template = src._template
        child = ProgramState(ex)
        child._open_role = self._open_role
        return child

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ForkGroup:
    """The branches of one fork; `join()` gathers their variables (as lists) into the parent state."""

    def __init__(self, parent: ProgramState, states: Sequence[ProgramState]) -> None:
        self.parent = parent
        self.states = states

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """Completes `forks[i] += expr` (Python stores the result back); a branch cannot be replaced."""
        if value is not self.states[i]:
            raise TypeError("a fork's branches cannot be replaced; append to one with `forks[i] += ...`")

    def __iadd__(self, other: Any) -> Self:
        """Append the same expression to every branch; a list appends item i to branch i, and a function of the
        branch index (`forks += lambda i: ...`) appends what it returns for each."""
        if callable(other) and not isinstance(other, Expr):
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"got {len(other)} items for {len(self.states)} branches")
            for state, item in zip(self.states, other):
                state += item
        else:
            for state in self.states:
                state += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for all branches. `gather_variable`: each variable new in the branches becomes a list in the
        parent. `concate_and_append`: the branches' new text is appended to the parent, in order."""
        parent = self.parent._ex
        for state in self.states:
            state._ex.sync()
        base_versions, base_len = parent.var_versions, len(parent.text)
        if mode == "gather_variable":
            names: dict[str, None] = {}  # variables assigned in any branch since the fork, in first-seen order
            for state in self.states:
                for name, version in state._ex.var_versions.items():
                    if base_versions.get(name) != version:
                        names.setdefault(name)
            for name in names:
                parent.set_var(name, [s._ex.variables.get(name) for s in self.states])
        elif mode == "concate_and_append":
            self.parent += "".join(s._ex.text[base_len:] for s in self.states)
        else:
            raise ValueError(f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}")
        errors = [s._ex.error for s in self.states if s._ex.error is not None]
        if errors:
            parent.fail(errors[0])
