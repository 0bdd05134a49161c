"""The NCHWc islands of an optimized VITS generator graph joined: the graph rewrite itself (nchwc.py makes the
session, checks it and caches the result; its docstring says what is joined and why)."""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

NCHWC = "com.microsoft.nchwc"
UNARY = ("LeakyRelu", "Relu", "Tanh", "Sigmoid")
BINARY = ("Add", "Sub", "Mul", "Div")
CONVS = ("Conv", "ConvTranspose")
LEAST_BLOCK = 16  # channels a joined value must be a multiple of: no padding lanes with 8- or 16-channel blocks


def join_islands(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """(a copy of the optimized `model` with its elementwise ops over NCHWc conv outputs run on the blocked
    tensors, how many reorders that removed). See nchwc.py's docstring."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    before = sum(n.op_type.startswith("Reorder") for n in g.node)
    scalars = {t.name for t in g.initializer if numpy_helper.to_array(t).size == 1}
    j = _Joiner(g, scalars)
    outputs = {o.name for o in g.output}
    nodes = j.skip_reorders(j.twins(_topological(list(g.node))))
    alive = {id(n) for n in _live(nodes, outputs)}  # not the Unsqueezes of the reorders skipped
    live = _live(j.plain_readers(nodes, alive), outputs)
    del g.node[:]
    g.node.extend(live)
    del g.value_info[:]
    return out, before - sum(n.op_type.startswith("Reorder") for n in live)


class _Joiner:
    """The rewrite's state: `blocked` maps a plain 3-D tensor to its blocked 4-D form and channel count."""

    def __init__(self, graph, scalars):
        self.scalars = scalars
        self.inits = {t.name: t for t in graph.initializer}
        self.blocked: dict[str, tuple[str, int]] = {}
        self.twinned: set[str] = set()  # outputs of the elementwise ops that have a blocked twin
        self.plain_convs: dict[str, int] = {}  # 3-D outputs of plain-layout 2-D convolutions -> channels
        self.axis = None  # the height axis the convolutions' Unsqueeze/Squeeze use
        self.count = 0
        self.producer = {o: n for n in graph.node for o in n.output}
        # the graph inputs each tensor is computed from: two tensors of the same channels from different inputs
        # may differ in length (the speaker's conditioning [1, C, 1] beside the frames [1, C, T]: a broadcast)
        self.sources: dict[str, frozenset] = {i.name: frozenset([i.name]) for i in graph.input}
        for n in _topological(list(graph.node)):
            src = frozenset().union(*(self.sources.get(i, frozenset()) for i in n.input))
            self.sources.update((o, src) for o in n.output)
        # plain tensors that a convolution reads in the blocked layout (through Unsqueeze -> ReorderInput)
        self.reordered = {
            self.producer[r.input[0]].input[0]
            for r in graph.node
            if r.op_type == "ReorderInput"
            and r.domain == NCHWC
            and not _channels_last(r)
            and r.input[0] in self.producer
            and self.producer[r.input[0]].op_type == "Unsqueeze"
        }

    def name(self, what: str) -> str:
        self.count += 1
        return f"speechrt/nchwc/{self.count}/{what}"

    def _seed(self, n) -> None:
        """Squeeze(ReorderOutput(b)): the plain form of a blocked conv output; Squeeze(Conv(...)): a plain one."""
        src = self.producer.get(n.input[0])
        if n.op_type != "Squeeze" or src is None or len(n.input) < 2:
            return
        if src.op_type == "ReorderOutput" and src.domain == NCHWC and not _channels_last(src):
            ch = next((a.i for a in src.attribute if a.name == "channels"), 0)
            if ch % LEAST_BLOCK == 0:
                self.blocked[n.output[0]] = (src.input[0], ch)
                self.axis = self.axis or n.input[1]
        elif src.op_type in CONVS and src.domain in ("", "ai.onnx") and src.input[1] in self.inits:
            w = self.inits[src.input[1]].dims
            group = next((a.i for a in src.attribute if a.name == "group"), 1)
            if len(w) == 4:
                self.plain_convs[n.output[0]] = w[0] if src.op_type == "Conv" else w[1] * group

    def twins(self, nodes: list) -> list:
        """`nodes` with a blocked twin after each elementwise op that reads a blocked value (its plain conv
        inputs of the same channel count reordered to blocked, once each)."""
        out = []
        for n in nodes:
            out.append(n)
            self._seed(n)
            if n.domain not in ("", "ai.onnx") or n.op_type not in UNARY + BINARY:
                continue
            tensors = [i for i in n.input if i not in self.scalars]
            known = [self.blocked[i] for i in tensors if i in self.blocked]
            if not known and n.op_type in UNARY and n.output[0] in self.reordered and tensors[0] in self.plain_convs:
                # a plain conv's output that a convolution reads through this op: reorder its input instead
                known = [(None, self.plain_convs[tensors[0]])]
            if not known or len(n.input) != (1 if n.op_type in UNARY else 2):  # (a binary op's other may be a scalar)
                continue
            ch = known[0][1]
            if ch % LEAST_BLOCK:
                continue
            if (
                any(i not in self.blocked and self.plain_convs.get(i) != ch for i in tensors)
                or any(self.blocked[i][1] != ch for i in tensors if i in self.blocked)
                or len({self.sources.get(i) for i in tensors}) > 1
            ):
                continue
            for i in tensors:
                if i not in self.blocked:  # a plain conv output beside a blocked one: reorder it once
                    u, b = self.name("unsqueezed"), self.name("blocked")
                    out.insert(len(out) - 1, helper.make_node("Unsqueeze", [i, self.axis], [u], name=u))
                    out.insert(
                        len(out) - 1, helper.make_node("ReorderInput", [u], [b], name=b, domain=NCHWC, channels_last=0)
                    )
                    self.blocked[i] = (b, ch)
            twin = self.name(n.op_type)
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            out.append(
                helper.make_node(
                    n.op_type,
                    [self.blocked[i][0] if i in self.blocked else i for i in n.input],
                    [twin],
                    name=twin,
                    **attrs,
                )
            )
            self.blocked[n.output[0]] = (twin, ch)
            self.twinned.add(n.output[0])
        return out

    def skip_reorders(self, nodes: list) -> list:
        """Readers of a reorder of a blocked value (ReorderInput(Unsqueeze(plain))) read the blocked value."""
        producer = {o: n for n in nodes for o in n.output}
        rename, out = {}, []
        for n in nodes:
            u = producer.get(n.input[0]) if n.input else None
            if (
                n.op_type == "ReorderInput"
                and n.domain == NCHWC
                and not n.name.startswith("speechrt/nchwc/")
                and not _channels_last(n)
                and u is not None
                and u.op_type == "Unsqueeze"
                and list(u.input[1:]) == [self.axis]
                and u.input[0] in self.blocked
            ):
                rename[n.output[0]] = self.blocked[u.input[0]][0]
                continue
            _rename_inputs(n, rename)
            out.append(n)
        return out

    def plain_readers(self, nodes: list, alive: set) -> list:
        """Other readers of a twinned value that the graph still needs (ids in `alive`: a transposed or plain
        convolution's Unsqueeze) read it reordered back to plain, once per value, so that the plain
        originals fall out."""
        plain, out = {}, []
        for n in nodes:
            if id(n) in alive and not n.name.startswith("speechrt/nchwc/") and n.op_type not in UNARY + BINARY:
                for i in n.input:
                    if i in self.twinned and i not in plain:
                        b, ch = self.blocked[i]
                        r, p = self.name("reordered"), self.name("plain")
                        out.append(
                            helper.make_node(
                                "ReorderOutput", [b], [r], name=r, domain=NCHWC, channels_last=0, channels=ch
                            )
                        )
                        out.append(helper.make_node("Squeeze", [r, self.axis], [p], name=p))
                        plain[i] = p
                _rename_inputs(n, plain)
            out.append(n)
        return out


def _channels_last(reorder) -> bool:
    """Whether a ReorderInput/ReorderOutput's plain side is NHWC (never joined: the rewrite assumes NCHW)."""
    return any(a.name == "channels_last" and a.i for a in reorder.attribute)


def _rename_inputs(node, rename: dict) -> None:
    if any(i in rename for i in node.input):
        inputs = [rename.get(i, i) for i in node.input]
        del node.input[:]
        node.input.extend(inputs)


def _topological(nodes: list) -> list:
    """`nodes` with each after the producers of its inputs (their order kept where it already is)."""
    producer = {o: n for n in nodes for o in n.output}
    done, out = set(), []
    for root in nodes:
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if id(n) in done:
                continue
            if expanded:
                done.add(id(n))
                out.append(n)
                continue
            stack.append((n, True))
            stack.extend(
                (producer[i], False) for i in reversed(n.input) if i in producer and id(producer[i]) not in done
            )
    return out


def _live(nodes: list, outputs: set) -> list:
    """`nodes` (in topological order) that the graph's `outputs` depend on."""
    need, live = set(outputs), []
    for n in reversed(nodes):
        if any(o in need for o in n.output):
            live.append(n)
            need.update(i for i in n.input if i)
    return live[::-1]
