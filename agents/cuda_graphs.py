"""CUDA graphs around a generated ModelNew's forward, as source lines a standalone file carries.

`GRAPH_HELPER` defines `_KstrataGraphs` (it needs `MAP_HELPER`'s `_kstrata_map` and `torch`): the library
space's `cuda_graph` configuration wraps the task's (compiled) model in it, and a template's `GRAPH` schedule
wraps its launches (a forward of many short launches, where the host's launch rate bounds the GPU).
"""

from __future__ import annotations

MAP_HELPER = '''
def _kstrata_map(value, fn):
    """Apply fn to every tensor in a (nested) output."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_kstrata_map(v, fn) for v in value)
    return value
'''.strip("\n").splitlines()


GRAPH_HELPER = '''
class _KstrataGraphs:
    """CUDA graphs of one call, each replayed where its inputs lie and into outputs that nobody else holds.

    A graph is keyed by the shapes, strides, dtypes and addresses of the inputs and by the addresses of the
    module's parameters and buffers: a replay reads the caller's tensors in place (their contents may change
    between calls; a tensor at another address is another key), so nothing is copied in. Its outputs are
    returned as aliases: while the caller holds one (or a view of one) that graph is not replayed -- another
    of the key's graphs is, or a new one is captured -- so an output is never overwritten under its holder,
    and nothing is copied out. A caller that passes tensors at new addresses on every call would capture on
    every call: after MAX_ADDRESSES addresses for one shape, that shape's inputs are copied into static
    buffers of its own graphs instead. At most MAX_KEYS keys keep graphs (least recently used first out: each
    graph holds a memory pool of its own), so new shapes do not grow memory without bound. A call that
    cannot be captured raises (the candidate fails). Called while the caller captures a graph of its own,
    it runs the call plainly (a graph cannot be captured or replayed inside another's capture)."""

    PER_KEY = 2
    MAX_ADDRESSES = 4
    MAX_KEYS = 6

    def __init__(self, call, module):
        self.call, self.module = call, module
        self.graphs = {}  # key -> [(graph, static inputs or None, outputs, their storages' use counts)]
        self.addresses = {}  # shape key -> the input addresses captured for it
        self.warm = set()

    @staticmethod
    def _tensors(value):
        if isinstance(value, torch.Tensor):
            return [value]
        if isinstance(value, (list, tuple)):
            return [t for v in value for t in _KstrataGraphs._tensors(v)]
        return []

    @staticmethod
    def _uses(t):
        return torch._C._storage_Use_Count(t.untyped_storage()._cdata)

    def _free(self, entry):
        return all(self._uses(t) <= n for t, n in zip(self._tensors(entry[2]), entry[3]))

    def _capture(self, inputs, copy_in, shape):
        static = [x.clone() if copy_in and isinstance(x, torch.Tensor) else x for x in inputs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(1 if shape in self.warm else 3):  # compiles, autotunes and allocates outside the capture
                self.call(*static)
        torch.cuda.current_stream().wait_stream(side)
        self.warm.add(shape)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.call(*static)
        uses = [self._uses(t) for t in self._tensors(out)]
        return graph, static if copy_in else None, out, uses

    def __call__(self, *inputs):
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():  # inside a caller's own graph
            return self.call(*inputs)
        shape = tuple((tuple(x.shape), x.stride(), x.dtype, x.device) if isinstance(x, torch.Tensor) else (type(x), x)
                      for x in inputs)
        held = tuple(t.data_ptr() for t in (*self.module.parameters(), *self.module.buffers()))
        where = tuple(x.data_ptr() for x in inputs if isinstance(x, torch.Tensor))
        seen = self.addresses.setdefault((shape, held), set())
        if where not in seen and len(seen) < self.MAX_ADDRESSES:
            seen.add(where)
        copy_in = where not in seen
        key = (shape, held, None if copy_in else where)
        entries = self.graphs.pop(key, [])
        self.graphs[key] = entries  # the most recently used last
        while len(self.graphs) > self.MAX_KEYS:
            del self.graphs[next(iter(self.graphs))]
        entry = next((e for e in entries if self._free(e)), None)
        if entry is None:
            if len(entries) >= self.PER_KEY:
                entries.pop(0)  # its outputs stay valid while held: a graph's memory lives as long as they do
            entry = self._capture(inputs, copy_in, shape)
            entries.append(entry)
        if entry[1] is not None:
            for s, x in zip(entry[1], inputs):
                if isinstance(s, torch.Tensor):
                    s.copy_(x)
        entry[0].replay()
        return _kstrata_map(entry[2], lambda t: t.detach())  # an alias: counted while the caller holds it
'''.strip("\n").splitlines()
