"""Realistic alpha-beta parameters: the links of a GPU cluster, with sources.

One ``Interconnect`` row per link type. ``bytes_per_s`` is always the
bandwidth **per direction** (what one rank can send while it also receives
as much): vendors usually quote the sum of both directions ("900 GB/s
bidirectional"), which is twice that. ``per`` says what the number belongs
to: a GPU's NVLink ports together, one x16 PCIe link, one NIC port.
``latency_s`` is filled in only where a source states one, else ``None``
(pass your own to ``AlphaBeta.from_interconnect``).

    >>> from ringlab.cost.interconnects import INTERCONNECTS
    >>> INTERCONNECTS["NVLink 4"].bytes_per_s / 1e9      # H100: 900 GB/s both ways
    450.0
    >>> round(INTERCONNECTS["PCIe 5.0 x16"].bytes_per_s / 1e9, 2)
    63.02

Conversions: 1 Gb/s (network line rate) = 1e9 / 8 bytes/s; PCIe's rate per
lane is in GT/s with 128b/130b encoding (PCIe 3.0 to 5.0), so an x16 link
carries 16 * rate * 128/130 / 8 bytes/s per direction. These are peak
signalling rates: measured bus bandwidths (nccl-tests) come out lower, e.g.
an 8 x A100 NVLink node reaches about 195 GB/s of its 300 GB/s per direction
in ``sendrecv_perf`` (github.com/li-plus/playground, cuda/nccl.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Interconnect:
    name: str
    bytes_per_s: float          # per direction
    per: str                    # what the bandwidth belongs to
    latency_s: float | None     # one message's latency, where a source gives one
    source: str
    note: str = ""

    @property
    def gb_per_s(self):
        """Bandwidth per direction in GB/s (1 GB = 1e9 bytes)."""
        return self.bytes_per_s / 1e9


def _pcie_x16(gt_per_s):
    return 16 * gt_per_s * 1e9 * 128 / 130 / 8


def _gbit(gbps):
    return gbps * 1e9 / 8


_NVLINK = "https://www.nvidia.com/de-de/data-center/nvlink/ (NVIDIA, NVLink)"
_HOPPER = "https://nvidia.com/de-de/technologies/hopper-architecture (NVIDIA, Hopper)"
_PCIE = ("PCI-SIG PCI Express Base Specification 4.0 / 5.0: 16 / 32 GT/s per lane, "
         "128b/130b encoding")

ROWS = [
    Interconnect("NVLink 3", 600e9 / 2, "GPU (A100, 12 links)", None, _NVLINK,
                 "12 third-generation links, 600 GB/s in total (both directions)"),
    Interconnect("NVLink 4", 900e9 / 2, "GPU (H100, 18 links)", None, _HOPPER,
                 "900 GB/s bidirectional per GPU"),
    Interconnect("NVLink 5", 1.8e12 / 2, "GPU (Blackwell, 18 links)", None,
                 "https://www.nvidia.com/en-us/data-center/nvlink/ (NVIDIA, NVLink; text "
                 "as reproduced at catalogone.com/data-center-and-cloud-computing-nvlink-nvswitch)",
                 "18 links of 100 GB/s, 1.8 TB/s in total. (NVIDIA's BCM manual, "
                 "docs.nvidia.com/base-command-manager/.../nvlinkinfo, says '900 GB/s "
                 "bidirectional per link': per direction per GPU is what it means.)"),
    Interconnect("NVSwitch (H100 node)", 900e9 / 2, "GPU, to any other GPU of the node", None,
                 _HOPPER, "third-generation NVSwitch: every GPU pair at full NVLink 4 speed"),
    Interconnect("PCIe 4.0 x16", _pcie_x16(16), "x16 link", None, _PCIE),
    Interconnect("PCIe 5.0 x16", _pcie_x16(32), "x16 link", None, _PCIE),
    Interconnect("InfiniBand HDR", _gbit(200), "NIC port", 600e-9,
                 "https://docs.nvidia.com/networking/display/ConnectX6VPI (NVIDIA "
                 "ConnectX-6 InfiniBand/VPI Adapter Cards User Manual: 'HDR IB "
                 "(200Gb/s)'); latency: https://lenovopress.lenovo.com/lp1195 "
                 "(ConnectX-6 HDR VPI adapters: 'sub-600 nanosecond latency')",
                 "200 Gb/s is HDR's rate for a 4x port (four lanes of 50 Gb/s, IBTA); "
                 "latency: the adapter's, an upper bound, without switches"),
    Interconnect("InfiniBand NDR", _gbit(400), "NIC port", None,
                 "https://docs.nvidia.com/networking/display/ConnectX7VPI/Introduction "
                 "(ConnectX-7: NDR 400Gb/s)"),
    Interconnect("InfiniBand XDR", _gbit(800), "NIC port", None,
                 "https://docs.nvidia.com/networking/display/connectx8supernic/introduction "
                 "(ConnectX-8: up to 800 Gb/s)"),
    Interconnect("Ethernet 100G", _gbit(100), "NIC port", None, "IEEE 802.3 line rate"),
    Interconnect("Ethernet 200G", _gbit(200), "NIC port", None, "IEEE 802.3 line rate"),
    Interconnect("Ethernet 400G", _gbit(400), "NIC port", None,
                 "IEEE 802.3 line rate; ConnectX-7 supports 400GbE (source as NDR)"),
]

INTERCONNECTS = {row.name: row for row in ROWS}


def table():
    """One dict per row, for the book: name, GB/s per direction, per, latency, source."""
    return [{"interconnect": r.name, "GB/s per direction": round(r.gb_per_s, 2), "per": r.per,
             "latency (us)": None if r.latency_s is None else r.latency_s * 1e6,
             "source": r.source} for r in ROWS]
