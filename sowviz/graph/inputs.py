"""The input nodes of the stage graph: one group per argument, nested by pytree path.

A mixin of `build._Builder` (it needs `new`): `input_tree` yields, per flat input,
its chain of group nodes, which the edge lifting compares like any other chain.
"""

from __future__ import annotations

from typing import Any

from .names import path_label, shape_str


class InputsMixin:
    new: Any

    def input_tree(self, root, group, label, invars):
        """Input nodes of one argument (`group`: (flat index, arg name, path tokens)),
        nested by path under a group node when there are several; yields
        (flat index, chain)."""
        if len(group) == 1:
            k, name, tokens = group[0]
            rec = self.new("input", name + "".join(tokens), root.id)
            rec.shapes = (_shape(invars[k].aval),)
            yield k, (rec.id,)
            return
        top = self.new("scope", label, root.id)
        top.shapes = tuple(_shape(invars[k].aval) for k, _, _ in group)
        yield from self._input_level(top, (top.id,), [(k, t) for k, _, t in group], invars)

    def _input_level(self, parent, chain, items, invars):
        # Children by first token, in order; a chain of single children is one label.
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
            if len(sub) == 1:
                k, tokens = sub[0]
                rec = self.new("input", path_label(tokens) or label, parent.id)
                rec.shapes = (_shape(invars[k].aval),)
                yield k, (*chain, rec.id)
                continue
            rec = self.new("scope", label, parent.id)
            rec.shapes = tuple(_shape(invars[k].aval) for k, _ in sub)
            rest = [(k, t[len(prefix) :]) for k, t in sub]
            yield from self._input_level(rec, (*chain, rec.id), rest, invars)


def _shape(aval: Any) -> str:
    return shape_str(aval)
