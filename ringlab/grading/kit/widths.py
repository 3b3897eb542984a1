"""The layer widths of the hidden MLPs that the ZeRO and HSDP graders train."""


def mlp_widths(rng, n, layers):
    """``layers`` Linear layers' widths for N = ``n`` ranks: small, drawn so that
    the parameter counts rarely divide by N (the padding is exercised)."""
    return ([int(rng.integers(n, n + 4))] + [int(rng.integers(n + 4, n + 9))
                                          for _ in range(layers - 1)]
            + [int(rng.integers(n + 2, n + 5))])


def measured_widths(rng, layers):
    """The measured cases' widths: ``layers - 2`` units of 0.5 MB (250 x 250), so
    that the whole model (12 MB at 25 layers) is plain next to one unit in a
    process's resident memory too (``ringlab grade``, ``ringlab.real_memory``)."""
    return [24] + [250] * (layers - 1) + [int(rng.integers(5, 8))]


def units_of(sizes):
    """FSDP's units of ``mlp_model(sizes)``: each Linear's parameter names."""
    return [[f"{2 * i}.weight", f"{2 * i}.bias"] for i in range(len(sizes) - 1)]
