"""What a line of the user's source computes, read from the source itself.

A run of equations from one line of a plain function, with no call to name it, is
folded into one stage. Named `loss:5`, it sends the user to the source to learn what
it is; named by the variables the line assigns (`t, eps`, `xt`), it says it. The
source comes from `linecache`, which also holds notebook cells (IPython registers
them there), and is parsed once per file text.
"""

from __future__ import annotations

import ast
import copy
import functools
import linecache
import re
from collections.abc import Sequence

#: Longest label made of target names; longer lists keep their first names.
_MOST = 28

#: The file each shortened name stands for (`In [3]` for ipykernel's
#: `/tmp/ipykernel_71/2878708385.py`, `model.py` for `<cwd>/model.py`): the graph's
#: locations carry the short names users read, and a cell's short name is no file
#: `linecache` knows (a notebook's lines were all read as unreadable, its functions
#: drawn as primitives).
_FULL_PATHS: dict[str, str] = {}


def remember_path(short: str, full: str) -> None:
    """Record that the location name `short` stands for the file `full`."""
    if short != full:
        _FULL_PATHS[short] = full


def _lines(file: str) -> list[str]:
    """The lines of `file` (its full path when `file` is a short name), as `linecache`
    holds them."""
    return linecache.getlines(_FULL_PATHS.get(file, file))


def assigned(file: str, line: int) -> str | None:
    """The targets the simple statements at `file:line` assign, as the source spells
    them (`k1, k2`, `self.h`, `cache[0]`); None when the source cannot be read or the
    line assigns nothing (a bare call, a loop's header, a `return`: a fold of its line
    may be the arguments of a call, not what it returns)."""
    return _shortened(_targets(file, line) or [])


def assigned_by_call(file: str, line: int, function: str) -> str | None:
    """`assigned`'s answer when what the line assigns is a call of `function` itself
    (`q = jnp.einsum(...)`, `q: Array = einsum(...)`): the call's box holds the line's
    value. None when the line assigns a value computed from the call's (`As =
    jnp.tanh(jnp.einsum(...)) * 0.3`, `y += jnp.einsum(...)`): the name belongs to the
    box of the line's last work, not to the call's."""
    statements = _statements_at("".join(_lines(file)), line)
    if not statements or not all(_assigns_call(st, function) for st in statements):
        return None
    return assigned(file, line)


def calls_from_module(file: str, line: int, function: str) -> bool:
    """Whether the statement at `file:line` calls `function` as an attribute of a module
    or object (`jax.nn.relu(...)`, `nn.relu(...)`): a library's function, not one of the
    user's own defined beside the line (`relu(...)` may be either)."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == function
        for st in _statements_at("".join(_lines(file)), line)
        for node in ast.walk(st)
    )


def _assigns_call(st: ast.stmt, function: str) -> bool:
    """Whether `st` assigns the result of a call of `function` (by name or attribute)."""
    if not isinstance(st, (ast.Assign, ast.AnnAssign)) or not isinstance(st.value, ast.Call):
        return False
    called = st.value.func
    name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)
    return name == function


def _targets(file: str, line: int, column: int | None = None) -> list[str] | None:
    statements = _statements_at("".join(_lines(file)), line)
    if column is not None and len(statements) > 1:  # `kc = ...; vc = ...`: the one there
        statements = [
            st
            for st in statements
            if st.lineno == st.end_lineno == line
            and st.col_offset <= column < (st.end_col_offset or 0)
        ]
    if not statements:
        return None
    names: list[str] = []
    for st in statements:
        targets = (
            st.targets
            if isinstance(st, ast.Assign)
            else [st.target]
            if isinstance(st, (ast.AnnAssign, ast.AugAssign))
            else None
        )
        if targets is None:
            return None
        for t in targets:
            for part in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                text = ast.unparse(part)
                if text not in names:
                    names.append(text)
    return names


def is_loop_header(file: str, line: int) -> bool:
    """Whether `file:line` is in a Python `for` loop's header (`for x in xs:`)."""
    tree = _parsed("".join(_lines(file)))
    return tree is not None and any(
        isinstance(n, ast.For) and n.lineno <= line <= (n.iter.end_lineno or n.lineno)
        for n in ast.walk(tree)
    )


def is_return(file: str, line: int) -> bool:
    """Whether `file:line` is (part of) a `return` statement."""
    statements = _statements_at("".join(_lines(file)), line)
    return len(statements) == 1 and isinstance(statements[0], ast.Return)


def called_alone(file: str, line: int) -> str | None:
    """The function a line that is only a call names, as written (`jax.debug.print` for
    `jax.debug.print("mean {m}", m=h.mean())`); None for any other line. Such a line
    assigns nothing and returns nothing: its run was named by its place (`mlp:35`)."""
    statements = _statements_at("".join(_lines(file)), line)
    if len(statements) != 1 or not isinstance(statements[0], ast.Expr):
        return None
    call = statements[0].value
    if not isinstance(call, ast.Call):
        return None
    return _written("".join(_lines(file)), call.func)


def statement_line(file: str, line: int) -> int:
    """The first line of the simple statement spanning `file:line` (`line` itself when
    the source cannot be read or the line is a compound statement's header). The
    equations of one statement written over two lines (`total = total + ce(\n logits,
    t).mean()`) come from both: they are one line's run."""
    lines = _lines(file)
    key = (file, line)
    hit = _statement_lines.get(key)
    if hit is not None and hit[0] is lines:  # (linecache's list: new when the file changes)
        return hit[1]
    statements = _statements_at("".join(lines), line)
    first = min((st.lineno for st in statements), default=line)
    if len(_statement_lines) > 4096:
        _statement_lines.clear()
    _statement_lines[key] = (lines, first)
    return first


#: `statement_line`'s answers: a program's equations ask once per line, not once each
_statement_lines: dict[tuple[str, int], tuple[list[str], int]] = {}


def _shortened(names: list[str]) -> str | None:
    if not names:
        return None
    out = names[0]
    for name in names[1:]:
        if len(out) + 2 + len(name) > _MOST:
            return f"{out}, …"
        out += f", {name}"
    return out if len(out) <= _MOST else f"{out[: _MOST - 1]}…"


@functools.lru_cache(maxsize=64)
def _parsed(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):  # a cell with IPython magics, a partial file
        return None


def _statements_at(source: str, line: int) -> list[ast.stmt]:
    """The innermost statements spanning `line`: those of one body (several when the
    line holds `a = ...; b = ...`); none when it is a compound statement's header."""
    tree = _parsed(source)
    if tree is None:
        return []
    body: list[ast.stmt] = tree.body
    while True:
        here = [st for st in body if st.lineno <= line <= (st.end_lineno or st.lineno)]
        inner = [
            b
            for st in here
            for b in _bodies(st)
            if b and b[0].lineno <= line <= (b[-1].end_lineno or b[-1].lineno)
        ]
        if not inner:
            return [st for st in here if not _bodies(st)]
        body = inner[0]


def _bodies(st: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists a compound statement holds (none for a simple one)."""
    out = []
    for field in ("body", "orelse", "finalbody"):
        value = getattr(st, field, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            out.append(value)
    for handler in getattr(st, "handlers", ()):
        out.append(handler.body)
    for case in getattr(st, "cases", ()):
        out.append(case.body)
    return out


def returned_place(file: str, line: int, column: int | None = None) -> int | None:
    """Where a value made at `file:line` sits in what its function returns, read from
    the source: `return y, cache` with the value made on a line assigning `cache`
    (1), or `return x + o, kc` with the value made on the return line itself, the one
    element that is no name (0). None when the source does not say: several returns
    unlike each other, a line assigning two returned names, a return of two
    expressions. `column` tells apart the statements of a line of several."""
    tree = _parsed("".join(_lines(file)))
    if tree is None:
        return None
    fn = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
            node.lineno <= line <= (node.end_lineno or node.lineno)
        ):
            if fn is None or node.lineno > fn.lineno:  # the innermost
                fn = node
    if fn is None:
        return None
    returns = _own_returns(fn)
    shapes = {_elements(r.value) for r in returns}
    if len(shapes) != 1 or None in shapes:
        return None
    (elements,) = shapes
    assert elements is not None
    here = [r for r in returns if r.lineno <= line <= (r.end_lineno or r.lineno)]
    if here:  # made on the return line: the one element that is an expression
        places = [k for k, e in enumerate(elements) if e is None]
        return places[0] if len(returns) == 1 and len(places) == 1 else None
    targets = set(_targets(file, line, column) or ())
    places = [k for k, e in enumerate(elements) if e is not None and e in targets]
    if not places:  # a name the function packs into what it returns: `{"s": s2}`
        packed = _packed(fn, returns)
        places = [k for k, names in enumerate(packed) if names & targets]
    return places[0] if len(places) == 1 else None


def _packed(fn: ast.AST, returns: list[ast.Return]) -> list[set[str]]:
    """Per element of `fn`'s returns, the names packed into it, as its leaves: those
    in a container written there (`return obs, {"s": s2}, r`), or in one assigned to a
    returned name (`new_state = {"s": s2}`; `State(s=s2)`, `state.replace(s=s2)`,
    `dict(s=s2)`) or grown in place (`new.append((kc, vc))`), followed through names
    packed in turn. An element that is
    computed (`jnp.stack([a, b])`, `a + b`) packs nothing: its leaves are new values."""
    assigned: dict[str, list[ast.expr]] = {}
    for node in _own_nodes(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name):
                assigned.setdefault(node.targets[0].id, []).append(node.value)
        grown = _grown(node)
        if grown is not None:
            assigned.setdefault(grown[0], []).append(grown[1])
    out: list[set[str]] = []
    for k in range(len(_elements_of(returns[0].value))):
        names: set[str] = set()
        todo = [_elements_of(r.value)[k] for r in returns]
        while todo:
            expr = todo.pop()
            if isinstance(expr, ast.Name):
                todo.extend(assigned.get(expr.id, ()))
            for part in _container_parts(expr):
                if isinstance(part, ast.Name):
                    if part.id in names:  # (seen: `x = (x, y)` ends)
                        continue
                    names.add(part.id)
                todo.append(part)
        out.append(names)
    return out


def _grown(node: ast.AST) -> tuple[str, ast.expr] | None:
    """A list a statement grows in place, and a container of what it adds: `new.append(
    (kc, vc))` (a loop's per-layer caches), `new.extend(parts)`, `new += [h]`; None for
    any other statement."""
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        if isinstance(node.op, ast.Add):
            return node.target.id, node.value
        return None
    call = node.value if isinstance(node, ast.Expr) else None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return None
    owner, method = call.func.value, call.func.attr
    if not isinstance(owner, ast.Name) or call.keywords:
        return None
    if method == "append" and len(call.args) == 1:
        return owner.id, ast.List(elts=list(call.args), ctx=ast.Load())
    if method == "insert" and len(call.args) == 2:
        return owner.id, ast.List(elts=[call.args[1]], ctx=ast.Load())
    if method == "extend" and len(call.args) == 1:
        return owner.id, call.args[0]
    return None


def _elements_of(value: ast.expr | None) -> list[ast.expr]:
    """The expressions a return returns (one when it returns no tuple)."""
    if value is None:
        return []
    return list(value.elts) if isinstance(value, ast.Tuple) else [value]


def _container_parts(expr: ast.expr) -> list[ast.expr]:
    """What a container written in the source holds: a tuple's, list's or dict's
    items, a class's or `dict`'s arguments (`State(s=s2)`), a `.replace(s=s2)`'s
    keywords; nothing for any other expression."""
    if isinstance(expr, (ast.Tuple, ast.List)):
        return list(expr.elts)
    if isinstance(expr, ast.Dict):
        return list(expr.values)
    if not isinstance(expr, ast.Call):
        return []
    called = expr.func
    name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
    keywords = [kw.value for kw in expr.keywords]
    if name == "replace":
        return keywords
    if name == "dict" or name[:1].isupper():  # a dataclass, NamedTuple or struct
        return [*expr.args, *keywords]
    return []


#: Statements whose bodies are another function's or class's
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _own_nodes(fn: ast.AST) -> list[ast.AST]:
    """The nodes of `fn`'s own body, not of the functions and classes it defines."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, _DEFINITIONS):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _elements(value: ast.expr | None) -> tuple[str | None, ...] | None:
    """A return's elements: a name, or None for an expression; None for a bare return."""
    if value is None:
        return None
    parts = value.elts if isinstance(value, ast.Tuple) else [value]
    return tuple(e.id if isinstance(e, ast.Name) else None for e in parts)


def _own_returns(fn: ast.AST) -> list[ast.Return]:
    """`fn`'s return statements, not those of the functions and classes it defines."""
    out: list[ast.Return] = []
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            out.append(node)
        elif not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
        ):
            todo.extend(ast.iter_child_nodes(node))
    return out


def scope_opened_at(file: str, line: int, name: str) -> int | None:
    """The line of the innermost `with jax.named_scope(name):` (or `name_scope`) whose
    block holds `file:line`, the scope's name written as a string (`"attn"`) or an
    f-string it fits (`f"layer_{i}"`); None when there is none or the source cannot be
    read. A scope's first equation may be deep inside a function called in the block
    (`norm(x)`): the block is where the user named it."""
    found = None
    for node in _withs("".join(_lines(file))):
        if not node.body[0].lineno <= line <= (node.body[-1].end_lineno or node.lineno):
            continue
        if any(_opens_scope(item.context_expr, name) for item in node.items):
            if found is None or node.lineno > found:  # (the innermost: the latest start)
                found = node.lineno
    return found


@functools.lru_cache(maxsize=16)
def _withs(source: str) -> tuple[ast.With | ast.AsyncWith, ...]:
    """The `with` statements of a source (asked once per scope: walked once per text)."""
    tree = _parsed(source)
    if tree is None:
        return ()
    return tuple(
        node for node in ast.walk(tree) if isinstance(node, (ast.With, ast.AsyncWith)) and node.body
    )


def _opens_scope(expr: ast.expr, name: str) -> bool:
    """Whether `expr` is `jax.named_scope(<name>)` (or `name_scope`, by any path)."""
    if not isinstance(expr, ast.Call) or not expr.args:
        return False
    called = expr.func
    fn = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)
    return fn in ("named_scope", "name_scope") and _spells(expr.args[0], name)


def _spells(expr: ast.expr, text: str) -> bool:
    """Whether the string expression `expr` can be `text`: a literal equal to it, or an
    f-string whose literal parts it fits."""
    if isinstance(expr, ast.Constant):
        return expr.value == text
    if isinstance(expr, ast.JoinedStr):
        pattern = "".join(
            re.escape(part.value) if isinstance(part, ast.Constant) else ".+"
            for part in expr.values
        )
        return re.fullmatch(pattern, text, re.DOTALL) is not None
    return False


def names_string(file: str, line: int, text: str) -> bool:
    """Whether the statement at `file:line` writes `text` as a string (`name="attn"` in
    `jax.named_call(attention, name="attn")(w, x)`)."""
    return any(
        isinstance(node, ast.Constant) and node.value == text
        for st in _statements_at("".join(_lines(file)), line)
        for node in ast.walk(st)
    )


#: Methods that register a function as another's batching rule (`jax.custom_batching`'s
#: `custom_vmap.def_vmap`): JAX calls the rule in the function's place.
_RULE_REGISTRARS = frozenset({"def_vmap"})


def rule_owner(file: str, line: int, function: str) -> str | None:
    """The function whose rule `function` (defined around `file:line`) is registered as:
    `row_scale` for `@row_scale.def_vmap` above `def _rs_rule`, or for a
    `row_scale.def_vmap(_rs_rule)` anywhere in the file; None otherwise. Under
    `jax.vmap(row_scale)` JAX runs the rule, and the stage is `row_scale`'s."""
    decorated, called = _rule_owners("".join(_lines(file)))
    for start, end, owner in decorated.get(function, ()):
        if start <= line <= end:
            return owner
    return called.get(function)


@functools.lru_cache(maxsize=16)
def _rule_owners(source: str) -> tuple[dict[str, list], dict[str, str]]:
    """Per function name, the registered rules of a source (read once per text): by
    decorator, (first line, last line, owner) per definition; by a call, the owner."""
    decorated: dict[str, list] = {}
    called: dict[str, str] = {}
    tree = _parsed(source)
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                owner = _registrar_owner(deco)
                if owner is not None:
                    where = (node.lineno, node.end_lineno or node.lineno, owner)
                    decorated.setdefault(node.name, []).append(where)
        elif isinstance(node, ast.Call) and len(node.args) == 1:
            owner = _registrar_owner(node.func)
            if owner is not None and isinstance(node.args[0], ast.Name):
                called[node.args[0].id] = owner
    return decorated, called


def _registrar_owner(expr: ast.expr) -> str | None:
    """`row_scale` for the expression `row_scale.def_vmap`, else None."""
    if isinstance(expr, ast.Attribute) and expr.attr in _RULE_REGISTRARS:
        return ast.unparse(expr.value)
    return None


#: A span of source: start line, start column, end line, end column (as JAX's frames).
Span = tuple[int, int, int, int]


def operand_text(file: str, line: int, span: Span) -> str | None:
    """The argument, as written, that the code at `span` computes, when the statement at
    `file:line` assigns or returns a call's result and `span` lies inside one argument
    of that call: `tokens[:, pos]` in `logits, caches = forward_token(params, tokens[:,
    pos], caches, pos)`. The line's targets name the call's result, not its argument's.
    A span over several arguments of one call reads as them (`next_token[:, None], P +
    i`: `_arguments_written`). None otherwise, or when the text is longer than a label."""
    source = "".join(_lines(file))
    statements = _statements_at(source, line)
    if len(statements) != 1:
        return None
    call = getattr(statements[0], "value", None)
    if not isinstance(call, ast.Call):
        return None
    # the innermost argument holding it: `x @ w + b` in `x = relu(norm(x @ w + b))`
    holding = [
        arg
        for c in ast.walk(call)
        if isinstance(c, ast.Call)
        for arg in (*c.args, *(k.value for k in c.keywords))
        if _holds(arg, span)
    ]
    # (a lambda's body is the call's own work: `jax.tree.map(lambda g: g / 4, gs)`; so
    # is a generator's, `sum(jnp.sum(g) for g in gs)`)
    if any(isinstance(n, _FUNCTIONS) and _holds(n, span) for n in ast.walk(call)):
        return None
    if not holding:
        return _arguments_written(source, call, span)
    return _written(source, min(holding, key=_size))


def _arguments_written(source: str, call: ast.Call, span: Span) -> str | None:
    """Consecutive positional arguments of one call in `call` (the innermost) that
    together hold `span`, from where it starts to where it ends, as written: `next_token[:,
    None], P + i` in `logits = decode_step(model, next_token[:, None], P + i)`, a run
    computing two of the call's arguments. None when the span starts or ends outside an
    argument (the call itself), or the text is longer than a label."""
    found: list[tuple[tuple[int, int], str]] = []
    for c in ast.walk(call):
        if not isinstance(c, ast.Call):
            continue
        args = [a for a in c.args if a.end_lineno is not None and a.end_col_offset is not None]
        first = next((k for k, a in enumerate(args) if _starts_in(a, span)), None)
        last = next((k for k, a in enumerate(args) if _ends_in(a, span)), None)
        if first is None or last is None or last <= first:
            continue
        texts = [ast.get_source_segment(source, a) for a in args[first : last + 1]]
        if None in texts:
            continue
        text = ", ".join(" ".join(t.split()) for t in texts if t is not None)
        found.append((_size(c), text))
    if not found:
        return None
    text = min(found)[1]
    return text if len(text) <= _MOST else None


def _starts_in(expr: ast.expr, span: Span) -> bool:
    """Whether `span` starts inside `expr`'s source."""
    start = (span[0], span[1])
    return (expr.lineno, expr.col_offset) <= start < (expr.end_lineno, expr.end_col_offset)


def _ends_in(expr: ast.expr, span: Span) -> bool:
    """Whether `span` ends inside `expr`'s source."""
    end = (span[2], span[3])
    return (expr.lineno, expr.col_offset) < end <= (expr.end_lineno, expr.end_col_offset)


#: Expressions whose code runs as a function of its own, called by the call around them
_FUNCTIONS = (ast.Lambda, ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp)


def _returned_value(file: str, line: int) -> ast.expr | None:
    """The one value the `return` statement at `file:line` returns (None for a return
    of several values or none, or when the source cannot be read)."""
    source = "".join(_lines(file))
    statements = _statements_at(source, line)
    if len(statements) != 1 or not isinstance(statements[0], ast.Return):
        return None
    value = statements[0].value
    if value is None or isinstance(value, (ast.Tuple, ast.List, ast.Dict)):
        return None
    return value


def returned_label(file: str, line: int) -> str | None:
    """What the `return` statement at `file:line` computes, as a label: the function its
    value calls (`mean` for `return jnp.mean((h @ w - y) ** 2)`), else its expression
    as written when short (`x + o`); None for a return of several values, or when the
    source cannot be read. (`return` is no name the user gave anything.)"""
    value = _returned_value(file, line)
    if value is None:
        return None
    if isinstance(value, ast.Call):
        mapped = _mapped_body(value)
        if mapped is not None:
            short = _keyed_short(mapped) or _compact(mapped)
            if short is not None:
                return short
        called = value.func
        name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)
        if name:
            return name
    source = "".join(_lines(file))
    return _written(source, value) or _keyed_short(value) or _compact(value)


def _mapped_body(call: ast.Call) -> ast.expr | None:
    """What a `jax.tree.map` of a lambda computes, written over the trees it maps: `grads
    / divisor` for `jax.tree.map(lambda g: g / divisor, grads)` (its call's name, `map`,
    says nothing of it); None for any other call, or a lambda of other parameters."""
    called = call.func
    chain = []
    while isinstance(called, ast.Attribute):
        chain.append(called.attr)
        called = called.value
    if isinstance(called, ast.Name):
        chain.append(called.id)
    if (
        not chain
        or chain[0] not in ("map", "tree_map")
        or (chain[0] == "map" and chain[1:2] != ["tree"])
    ):
        return None
    if not call.args or call.keywords or not isinstance(call.args[0], ast.Lambda):
        return None
    fn, trees = call.args[0], call.args[1:]
    params = fn.args
    if params.vararg or params.kwarg or params.kwonlyargs or params.posonlyargs:
        return None
    if len(params.args) != len(trees) or params.defaults:
        return None
    if not all(isinstance(t, (ast.Name, ast.Attribute)) for t in trees):
        return None
    by = {a.arg: t for a, t in zip(params.args, trees, strict=True)}

    class _Trees(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return copy.deepcopy(by[node.id]) if node.id in by else node

        def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
            return node  # (its own parameters may shadow the names)

    return _Trees().visit(copy.deepcopy(fn.body))


#: Operators written closer than `+`, `-` by `_compact`
_TIGHT = re.compile(r" (\*\*|\*|/|//|@|%) ")


def _compact(expr: ast.expr) -> str | None:
    """`expr` written as its terms' products closer than its sums (`u_t + u_val*u_x -
    nu*u_xx` for `u_t + u_val * u_x - nu * u_xx`, a PINN's residual, one character too
    long to be a label as written: its last operator alone, `sub`, said nothing of it),
    with string-keyed entries by their keys (`_keyed_short`), if that fits a label."""
    if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub))):
        return None
    text = ast.unparse(_KeysAsNames().visit(copy.deepcopy(expr)))
    if "'" in text or '"' in text:
        return None  # (a string's own spaces are no operator's)
    short = _TIGHT.sub(r"\1", text)
    return short if len(short) <= _MOST else None


class _KeysAsNames(ast.NodeTransformer):
    """`params[-1]["w"]` as `w`: an entry of a dict of parameters read by its key, the
    name its pytree path ends with."""

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        key = node.slice
        if (
            isinstance(key, ast.Constant)
            and isinstance(key.value, str)
            and key.value.isidentifier()
        ):
            return ast.Name(id=key.value, ctx=ast.Load())
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        # a module built and called on the line by the name it gives it:
        # `nn.Dense(3, name="lm_head")(x)` is `lm_head(x)`, its stage's name
        made = node.func
        if isinstance(made, ast.Call):
            given = [
                k.value.value
                for k in made.keywords
                if k.arg == "name" and isinstance(k.value, ast.Constant)
            ]
            if given and isinstance(given[0], str) and given[0].isidentifier():
                node.func = ast.Name(id=given[0], ctx=ast.Load())
        return self.generic_visit(node)


def _keyed_short(expr: ast.expr) -> str | None:
    """`expr` too long as written, with its string-keyed entries named by their keys
    (`x @ params[-1]["w"] + params[-1]["b"]` is `x @ w + b`), if that fits a label."""
    short = ast.unparse(_KeysAsNames().visit(copy.deepcopy(expr)))
    return short if len(short) <= _MOST else None


#: The operators whose work makes a value, by the name of the equation they make
_OPERATORS = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.FloorDiv: "floor_divide",
    ast.Mod: "remainder",
    ast.Pow: "pow",
    ast.MatMult: "matmul",
}


def returned_calls(file: str, line: int) -> tuple[tuple[str, ...], str | None] | None:
    """The functions the `return` statement at `file:line` calls by name, in the order
    Python calls them (`log_softmax`, `arange`, `mean` of `return
    -jnp.mean(jax.nn.log_softmax(x)[jnp.arange(n), y])`;
    `softmax_cross_entropy_with_integer_labels`, `mean` of `return
    optax.softmax_cross_entropy_with_integer_labels(x, y).mean()`), and the binary
    operator that makes the value when one does (`add` of `return head(x) + 0.1 *
    aux.sum()`). None for a return of several values or none, or when the source cannot
    be read."""
    value = _returned_value(file, line)
    if value is None:
        return None
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, _FUNCTIONS):
            return  # (its code runs when the call around it calls it: no work of the line's)
        if isinstance(node, ast.Call):
            # (`f(a).mean()`: `f`, then `mean`; a call's arguments before the call)
            called = node.func
            visit(called.value if isinstance(called, ast.Attribute) else called)
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                visit(arg)
            if isinstance(called, ast.Attribute):
                names.append(called.attr)
            elif isinstance(called, ast.Name):
                names.append(called.id)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(value)
    operator = _OPERATORS.get(type(value.op)) if isinstance(value, ast.BinOp) else None
    return tuple(names), operator


def returned_values(file: str, line: int, spans: Sequence[Span]) -> str | None:
    """What the `return` statement at `file:line` computes at `spans` when it returns
    several values (`return toks[order], s[order]`): those values as written, in order
    (`toks[order], s[order]`; `x + o` of `return x + o, cache`), if that fits a label.
    None when a span lies in no one value, or the statement returns one value
    (`returned_label`). (The line's place, `rerank:9`, says nothing of them.)"""
    source = "".join(_lines(file))
    statements = _statements_at(source, line)
    if len(statements) != 1 or not isinstance(statements[0], ast.Return):
        return None
    value = statements[0].value
    if not isinstance(value, (ast.Tuple, ast.List)) or not spans:
        return None
    made: set[int] = set()
    for span in spans:
        k = next((k for k, v in enumerate(value.elts) if _holds(v, span)), None)
        if k is None:
            return None
        made.add(k)
    texts = [ast.get_source_segment(source, value.elts[k]) for k in sorted(made)]
    if None in texts:
        return None
    text = ", ".join(" ".join(t.split()) for t in texts if t is not None)
    return text if len(text) <= _MOST else None


def returns_expression(file: str, line: int) -> bool:
    """Whether the `return` statement at `file:line` returns one value computed by an
    expression written there (`x @ w + b`, `w - 0.1 * g`), not by a call (`jnp.tanh(x
    @ w)`, whose box would read as the call alone), nor several values."""
    statements = _statements_at("".join(_lines(file)), line)
    if len(statements) != 1 or not isinstance(statements[0], ast.Return):
        return False
    value = statements[0].value
    return isinstance(value, (ast.BinOp, ast.UnaryOp))


def _holds(expr: ast.expr, span: Span) -> bool:
    """Whether `expr`'s source spans `span`."""
    if expr.end_lineno is None or expr.end_col_offset is None:
        return False
    start, end = (expr.lineno, expr.col_offset), (expr.end_lineno, expr.end_col_offset)
    return start <= (span[0], span[1]) and (span[2], span[3]) <= end


def _size(expr: ast.expr) -> tuple[int, int]:
    """How much source `expr` spans (lines, then columns), to find the innermost."""
    lines = (expr.end_lineno or expr.lineno) - expr.lineno
    return lines, (expr.end_col_offset or 0) - expr.col_offset


def _written(source: str, expr: ast.expr) -> str | None:
    """`expr` as the source writes it, on one line, if it fits a label."""
    text = ast.get_source_segment(source, expr)
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= _MOST else None


_INDEXED = re.compile(r"^([A-Za-z_]\w*)\[(\d+)\](.*)$")


def unpacked_arg_names(
    names: tuple[str, ...], file: str, line: int, function: str
) -> tuple[str, ...]:
    """`names` (JAX's names of a body's inputs: `carry[0]`, `carry[1]`, `x`) with each
    element of a tuple parameter the function unpacks at its top level (`h, c = carry`)
    named as it unpacks it (`h`, `c`): JAX records the parameter's path, the user reads
    the names the body's lines use. A nested element keeps its path under the new name
    (`carry[0]['w']` -> `h['w']`); a starred or nested target leaves the names as JAX
    gives them."""
    if not any(_INDEXED.match(n) for n in names):
        return names
    unpacked = _unpackings(file, line, function)
    out = []
    for n in names:
        m = _INDEXED.match(n)
        targets = unpacked.get(m.group(1)) if m else None
        k = int(m.group(2)) if m else -1
        out.append(f"{targets[k]}{m.group(3)}" if targets and k < len(targets) else n)
    return tuple(out)


def _unpackings(file: str, line: int, function: str) -> dict[str, tuple[str, ...]]:
    """For the function `function` defined at `file:line` (its `def` or its first
    decorator), each parameter its body unpacks into plain names by a top-level
    statement (`h, c = carry`) before anything assigns the parameter."""
    fn = _function_def(file, line, function)
    if fn is None:
        return {}
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    out: dict[str, tuple[str, ...]] = {}
    for st in fn.body:
        if not isinstance(st, ast.Assign):
            continue
        value = st.value
        if isinstance(value, ast.Name) and value.id in params and value.id not in out:
            targets = st.targets[0] if len(st.targets) == 1 else None
            if isinstance(targets, (ast.Tuple, ast.List)) and all(
                isinstance(t, ast.Name) for t in targets.elts
            ):
                out[value.id] = tuple(t.id for t in targets.elts)  # type: ignore[union-attr]
        for t in st.targets:  # a parameter assigned anew names something else from here
            for node in ast.walk(t):
                if isinstance(node, ast.Name) and node.id in params:
                    out.setdefault(node.id, ())
    return {k: v for k, v in out.items() if v}


def _function_def(
    file: str, line: int, function: str
) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The definition of the function `function` at `file:line` (its `def` or its first
    decorator), or None when the source cannot be read or parsed."""
    tree = _parsed("".join(_lines(file)))
    if tree is None:
        return None
    return next(
        (
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == function
            and min([node.lineno, *(d.lineno for d in node.decorator_list)]) == line
        ),
        None,
    )


def parameters_and_unpackings(
    file: str, line: int, function: str
) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]] | None:
    """The positional parameters of the function `function` defined at `file:line`, and
    the tuple parameters its body unpacks (`model, x, key = carry`), as
    `unpacked_arg_names` reads them; None when its source is not found."""
    fn = _function_def(file, line, function)
    if fn is None:
        return None
    params = tuple(a.arg for a in (*fn.args.posonlyargs, *fn.args.args))
    return params, _unpackings(file, line, function)


#: JAX transforms whose call on a line evaluates the function several times (its
#: forward and backward passes, `jacfwd`'s basis): `u_t = jax.grad(model)(t, x)`
_DERIVATIVES = frozenset(
    {"grad", "value_and_grad", "jacfwd", "jacrev", "jacobian", "hessian", "jvp", "vjp", "linearize"}
)
#: Transforms that only pass a derivative through (`jax.vmap(jax.grad(f))(x)`)
_WRAPPERS = frozenset({"vmap", "jit", "checkpoint", "remat"})


def _assigned_call(file: str, line: int) -> ast.Call | None:
    """The call whose value the one assignment at `file:line` assigns, or None."""
    statements = _statements_at("".join(_lines(file)), line)
    if len(statements) != 1 or not isinstance(statements[0], (ast.Assign, ast.AnnAssign)):
        return None
    value = statements[0].value
    return value if isinstance(value, ast.Call) else None


def assigned_by_transform(file: str, line: int) -> str | None:
    """What the statement at `file:line` assigns when its value is a derivative JAX
    takes of a function on that line (`u_t = jax.grad(model, argnums=0)(t, x)`, `y, dy =
    jax.jvp(f, (x,), (v,))`, `jax.vmap(jax.grad(f))(x)`): the box of that line holds the
    function's forward and backward evaluations, named by the derivative asked for.
    None for any other line (`h = self.layer(x)`, `y = jax.vmap(f)(x)`)."""
    value = _assigned_call(file, line)
    if value is None:
        return None
    if not (_takes_derivative(value) or _takes_derivative(value.func)):
        return None
    return _with_applied_map(file, line, value) or assigned(file, line)


#: derivative transforms returning a function the program applies later (`y, f_jvp =
#: jax.linearize(g, w)`, `out, pullback = jax.vjp(g, w)`)
_RETURNS_MAP = frozenset({"linearize", "vjp"})


def _with_applied_map(file: str, line: int, value: ast.Call) -> str | None:
    """`y, lin` for `y, f_jvp = jax.linearize(g, w)` whose map a later statement of
    the same block applies (`lin = f_jvp(v)`; `f_jvp(…)` when that statement assigns
    no call of it alone, `return y + f_jvp(v).sum()`); None for any other line. JAX
    records the applied map's equations at the `linearize` (`vjp`) line, so that
    line's box holds `lin` (`ct` of `(ct,) = pullback(ones)`): labelled `y, f_jvp`, it
    said it held `y` while its value was `lin`."""
    found = _applied_map(file, line, value)
    if found is None:
        return None
    first, applied = found
    return applied if first is None else f"{first}, {applied}"


def applied_map(file: str, line: int) -> str | None:
    """What a later statement assigns by applying the map that the `jax.linearize`
    (`jax.vjp`) at `file:line` returns: `t` for `y, f_jvp = jax.linearize(...)` then
    `t = f_jvp(v)` (`f_jvp(…)` when it assigns no call of it alone); None for any other
    line. JAX records the applied map's equations at the `linearize` line, inside the
    linearized function's calls: they are the tangent of that function's stages."""
    value = _assigned_call(file, line)
    if value is None:
        return None
    found = _applied_map(file, line, value)
    return found[1] if found is not None else None


def _applied_map(file: str, line: int, value: ast.Call) -> tuple[str | None, str] | None:
    # (the value the line assigns first, if the block reads it again; what the map's
    # application assigns), as `_with_applied_map` says
    func = value.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    tree = _parsed("".join(linecache.getlines(file)))
    if name not in _RETURNS_MAP or tree is None:
        return None
    for block in (b for node in ast.walk(tree) for b in _bodies(node) if b):
        at = [k for k, st in enumerate(block) if st.lineno == line]
        if not at:
            continue
        st = block[at[0]]
        if not isinstance(st, ast.Assign) or len(st.targets) != 1:
            return None
        target = st.targets[0]
        if not isinstance(target, ast.Tuple) or len(target.elts) != 2:
            return None
        first, fn = target.elts
        if not isinstance(fn, ast.Name):
            return None
        for later in block[at[0] + 1 :]:
            calls = [
                c
                for c in ast.walk(later)
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == fn.id
            ]
            if not calls:
                continue
            if isinstance(later, ast.Assign) and later.value is calls[0]:
                applied = assigned(file, later.lineno)
            else:
                applied = None
            applied = applied or f"{fn.id}(…)"
            # (a value the block never reads again is handed on by no box: `lin` alone)
            rest = block[at[0] + 1 :]
            read = {n.id for st in rest for n in ast.walk(st) if isinstance(n, ast.Name)}
            if isinstance(first, ast.Name) and first.id not in read:
                return None, applied
            return ast.unparse(first), applied
        return None
    return None


def _takes_derivative(expr: ast.expr) -> bool:
    """Whether `expr` is a call of a derivative transform (`jax.grad(f)`), possibly
    inside pass-through ones (`jax.vmap(jax.grad(f))`)."""
    if not isinstance(expr, ast.Call):
        return False
    func = expr.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name in _DERIVATIVES:
        return True
    return name in _WRAPPERS and bool(expr.args) and _takes_derivative(expr.args[0])


#: Derivative transforms whose result is the derivative alone (`jax.value_and_grad`,
#: `jax.jvp`, `jax.vjp` and `jax.linearize` return the function's value with it)
_DERIVATIVE_ALONE = frozenset({"grad", "jacfwd", "jacrev", "jacobian", "hessian"})


def derivative_alone(file: str, line: int) -> bool:
    """Whether the derivative the statement at `file:line` takes (`assigned_by_transform`)
    is all it gets: `force = jax.grad(lambda R: -energy(R))` gets no value of the
    lambda, `loss, g = jax.value_and_grad(lambda q: f(q) + h(q))(q)` gets `loss`."""
    value = _assigned_call(file, line)
    if value is None:
        return False
    expr: ast.expr = value if _takes_derivative(value) else value.func
    while isinstance(expr, ast.Call):
        func = expr.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in _WRAPPERS or not expr.args:
            return name in _DERIVATIVE_ALONE
        expr = expr.args[0]  # (`jax.vmap(jax.grad(f))`: the transform it passes through)
    return False


def returns_one_value(file: str, line: int) -> bool:
    """Whether the `return` statement at `file:line` returns one value (`logits[:, -1]`,
    `jnp.sum(nll * mask) / jnp.sum(mask)`), not several (`toks[order], s[order]`)."""
    statements = _statements_at("".join(_lines(file)), line)
    if len(statements) != 1 or not isinstance(statements[0], ast.Return):
        return False
    value = statements[0].value
    return value is not None and not isinstance(value, (ast.Tuple, ast.List, ast.Dict))
