"""A device mesh: the ranks laid out on a grid, one group per row of every axis.

Parallel training combines strategies: 8 ranks may be 2 data-parallel
replicas of a model split over 4 ranks by tensor parallelism. Lay the ranks
out as a ``(2, 4)`` grid with axes ``("dp", "tp")``, row-major like
``torch.distributed.device_mesh.init_device_mesh``: rank ``r`` sits at
``divmod(r, 4)``. Its "tp" group is its row, its "dp" group its column::

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> def program(comm, x):
    ...     mesh = ringlab.DeviceMesh(comm, (2, 4), ("dp", "tp"))
    ...     row = ring_allreduce(mesh.group("tp"), x)     # sum over my row
    ...     return ring_allreduce(mesh.group("dp"), row)  # then over the columns
    >>> res = ringlab.run(program, [np.array([float(r)]) for r in range(8)])
    >>> float(res.outputs[5][0]), res.trace.groups[:3]
    (28.0, ['tp[0]', 'tp[1]', 'dp[0]'])
"""

from __future__ import annotations

import itertools
import math

from .errors import CommError


class DeviceMesh:
    """``DeviceMesh(comm, shape, names)``: every rank of ``comm`` calls it alike.

    ``mesh.group(name)``: this rank's ``Comm`` along axis ``name``;
    ``mesh.coords``: this rank's coordinates; ``mesh.size(name)``: the axis length.
    Groups are labelled ``"name[k]"``, k counting the axis' groups in row-major order.
    """

    def __init__(self, comm, shape, names):
        shape, names = tuple(int(s) for s in shape), tuple(names)
        if len(shape) != len(names) or len(set(names)) != len(names):
            raise CommError(f"DeviceMesh(shape={shape}, names={names}): one distinct name per axis")
        if math.prod(shape) != comm.world_size or min(shape, default=0) < 1:
            raise CommError(f"DeviceMesh(shape={shape}): the grid has {math.prod(shape)} places "
                            f"but the group has {comm.world_size} ranks")
        self.comm, self.shape, self.names = comm, shape, names
        self.coords = self.coords_of(comm.rank)
        self._groups = {}
        # Every rank creates every group, in the same order (as torch requires).
        for axis, name in enumerate(names):
            others = [range(n) for a, n in enumerate(shape) if a != axis]
            for k, fixed in enumerate(itertools.product(*others)):
                members = [self.rank_at(fixed[:axis] + (i,) + fixed[axis:]) for i in range(shape[axis])]
                group = comm.new_group(members, name=f"{name}[{k}]")
                if group is not None:
                    self._groups[name] = group

    def rank_at(self, coords):
        """The rank (of ``comm``) at grid position ``coords``."""
        r = 0
        for c, n in zip(coords, self.shape):
            r = r * n + c
        return r

    def coords_of(self, rank):
        """Grid position of ``rank``, row-major."""
        out = []
        for n in reversed(self.shape):
            rank, c = divmod(rank, n)
            out.append(c)
        return tuple(reversed(out))

    def group(self, name):
        """This rank's ``Comm`` along axis ``name``."""
        if name not in self._groups:
            raise KeyError(f"no axis {name!r}; the axes are {self.names}")
        return self._groups[name]

    def size(self, name):
        return self.shape[self.names.index(name)]

    def coord(self, name):
        return self.coords[self.names.index(name)]

    def __repr__(self):
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.names, self.shape))
        return f"<DeviceMesh {axes}; rank {self.comm.rank} at {self.coords}>"
