"""A ringlab layer's weights and input as torch leaves, for tests against torch autograd."""


def torch_leaves(layer, x):
    """``(W, xt)``: float64 tensors that require grad, one per named parameter of
    ``layer`` (numpy arrays) and one for the input ``x``; autograd fills their
    ``.grad``. Import torch first (``pytest.importorskip("torch")``)."""
    import torch

    def leaf(a):
        return torch.tensor(a, dtype=torch.float64, requires_grad=True)
    return {k: leaf(v) for k, v in layer.named_parameters().items()}, leaf(x)
