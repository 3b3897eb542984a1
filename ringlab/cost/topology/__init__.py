"""Part 6: network topologies, and a network model in which messages share links.

* ``graphs``: builders of networks as graphs (an NVSwitch server, a leaf/spine
  fat tree, a rail-optimized cluster, a ring, a 2-D torus);
* ``routing``: cheapest routes with deterministic ECMP;
* ``flows``: max-min fair sharing by progressive filling;
* ``network``: ``Topology``, the ``network=`` of a run in which every message
  is a flow along its route.

    >>> import numpy as np, ringlab
    >>> from ringlab.collectives import ring_allreduce
    >>> net = Topology(fat_tree(nodes=4, gpus_per_node=2, leaves=2, spines=2))
    >>> res = ringlab.run(ring_allreduce, [np.ones(2 ** 16)] * 8, network=net)
    >>> res.time > 0
    True
"""

from .flows import max_min_fair
from .graphs import duplex, fat_tree, gpus, nvswitch_node, rail_optimized, ring, torus2d
from .network import FlowSim, Topology
from .routing import Routing, ecmp_hash

__all__ = ["Topology", "FlowSim", "Routing", "ecmp_hash", "max_min_fair", "duplex", "gpus",
           "nvswitch_node", "fat_tree", "rail_optimized", "ring", "torus2d"]
