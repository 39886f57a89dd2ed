"""The input and output nodes of the stage graph: one group per argument (per
returned value), nested by pytree path.

A mixin of `build._Builder` (it needs `new`): `leaf_tree` yields, per flat input or
output, its chain of group nodes, which the edge lifting compares like any other
chain.
"""

from __future__ import annotations

from typing import Any

from .names import path_label, shape_str


class InputsMixin:
    new: Any

    def leaf_tree(self, root, group, label, vars_, kind="input", nest=False):
        """`kind` nodes (input or output) of one argument or returned value (`group`:
        (flat index, name, path tokens)), nested by path under a group node when there
        are several or `nest`; yields (flat index, chain)."""
        if len(group) == 1 and not nest:
            k, name, tokens = group[0]
            rec = self.new(kind, name + "".join(tokens), root.id)
            rec.shapes = (_shape(vars_[k].aval),)
            yield k, (rec.id,)
            return
        top = self.new("scope", label, root.id)
        top.shapes = tuple(_shape(vars_[k].aval) for k, _, _ in group)
        yield from self._level(top, (top.id,), [(k, t) for k, _, t in group], vars_, kind)

    def _level(self, parent, chain, items, vars_, kind):
        # Children by first token, in order; a chain of single children is one label (but
        # a lone leaf's last token: `FourierEmbs_0` > `kernel`, below).
        firsts: dict[str, list[tuple[int, list[str]]]] = {}
        for k, tokens in items:
            firsts.setdefault(tokens[0] if tokens else "", []).append((k, tokens))
        for first, sub in firsts.items():
            prefix = [first]
            while len(sub) > 1 and all(len(t) > len(prefix) for _, t in sub):
                nxt = {t[len(prefix)] for _, t in sub}
                if len(nxt) != 1:
                    break
                prefix.append(nxt.pop())
            label = path_label(prefix)
            if not first:  # paths that end here (names alike): each its own leaf
                for k, _ in sub:
                    rec = self.new(kind, label or "value", parent.id)
                    rec.shapes = (_shape(vars_[k].aval),)
                    yield k, (*chain, rec.id)
                continue
            if len(sub) == 1:
                k, tokens = sub[0]
                holder, here = parent, chain
                if kind == "input" and len(tokens) > 1:
                    # A module's lone parameter is drawn in its module's group, as a
                    # module's several are: `FourierEmbs_0` > `kernel` beside `Dense_0` >
                    # `kernel`, so `probe("FourierEmbs_0/kernel")` finds it (it read
                    # `FourierEmbs_0.kernel`, a path of its own). (Outputs keep one label:
                    # `new model/dropout.rngs.count`.)
                    group = self.new("scope", path_label(tokens[:-1]), parent.id)
                    group.shapes = (_shape(vars_[k].aval),)
                    holder, here, tokens = group, (*chain, group.id), tokens[-1:]
                rec = self.new(kind, path_label(tokens) or label, holder.id)
                rec.shapes = (_shape(vars_[k].aval),)
                yield k, (*here, rec.id)
                continue
            rec = self.new("scope", label, parent.id)
            rec.shapes = tuple(_shape(vars_[k].aval) for k, _ in sub)
            rest = [(k, t[len(prefix) :]) for k, t in sub]
            yield from self._level(rec, (*chain, rec.id), rest, vars_, kind)


def _shape(aval: Any) -> str:
    return shape_str(aval)
