"""Context-parallel attention as ringlab rank programs, for tests/analysis/test_analysis.py.

Each rank holds 1/c of a sequence: its queries, keys and values (one head,
non-causal: the bytes do not depend on the mask). ``ring_attention`` passes
K and V around a ring and combines the blocks with an online softmax;
backward passes K, V and their gradient accumulators around the ring again,
and the accumulators take one more step home. ``allgather_attention``
gathers K and V and reduce-scatters their gradients. Both return
``(O, dQ, dK, dV)`` of the rank's block, to check against ``reference``.
"""

import numpy as np

from ringlab.collectives import ring_allgather, ring_reduce_scatter


def reference(q, k, v, do):
    """Softmax attention on the whole sequence and its gradients, in numpy."""
    scale = 1 / np.sqrt(q.shape[1])
    p = np.exp(q @ k.T * scale - (q @ k.T * scale).max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    o = p @ v
    dv = p.T @ do
    dp = do @ v.T
    ds = p * (dp - (dp * p).sum(1, keepdims=True))
    return o, ds @ k * scale, ds.T @ q * scale, dv


def _block(q, k, v, scale):
    s = q @ k.T * scale
    return s.max(1), s


def ring_attention(comm, x):
    q, k, v, do = x
    c, r = comm.world_size, comm.rank
    nxt, prv = (r + 1) % c, (r - 1) % c
    scale = 1 / np.sqrt(q.shape[1])
    n = k.shape[0]
    with comm.span("cp.forward"):
        m = np.full(q.shape[0], -np.inf)
        l, acc = np.zeros(q.shape[0]), np.zeros_like(q)
        kb, vb = k, v
        for step in range(c):
            s = q @ kb.T * scale
            m_new = np.maximum(m, s.max(1))
            p, corr = np.exp(s - m_new[:, None]), np.exp(m - m_new)
            l, acc, m = l * corr + p.sum(1), acc * corr[:, None] + p @ vb, m_new
            if step < c - 1:
                kv = comm.sendrecv(np.concatenate([kb, vb]), nxt, prv)
                kb, vb = kv[:n], kv[n:]
        o, lse = acc / l[:, None], m + np.log(l)
    with comm.span("cp.backward"):
        d = (do * o).sum(1)
        dq = np.zeros_like(q)
        kb, vb, dkb, dvb = k, v, np.zeros_like(k), np.zeros_like(v)
        for step in range(c):
            p = np.exp(q @ kb.T * scale - lse[:, None])
            dvb = dvb + p.T @ do
            ds = p * (do @ vb.T - d[:, None])
            dq += ds @ kb * scale
            dkb = dkb + ds.T @ q * scale
            if step < c - 1:
                msg = comm.sendrecv(np.concatenate([kb, vb, dkb, dvb]), nxt, prv)
                kb, vb, dkb, dvb = msg[:n], msg[n:2 * n], msg[2 * n:3 * n], msg[3 * n:]
        # this rank now holds block r + 1's gradients: one more step takes them home
        home = comm.sendrecv(np.concatenate([dkb, dvb]), nxt, prv)
    return o, dq, home[:n], home[n:]


def allgather_attention(comm, x):
    q, k, v, do = x
    c, d = comm.world_size, q.shape[1]
    n = k.shape[0]
    scale = 1 / np.sqrt(d)
    with comm.span("cp.forward"):
        kv = ring_allgather(comm, np.concatenate([k, v], axis=1).ravel())
        kv = kv.reshape(c, n, 2 * d)
        kk, vv = kv[:, :, :d].reshape(-1, d), kv[:, :, d:].reshape(-1, d)
        s = q @ kk.T * scale
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        o = p @ vv
    with comm.span("cp.backward"):
        dp = do @ vv.T
        ds = p * (dp - (dp * p).sum(1, keepdims=True))
        dq = ds @ kk * scale
        dkv = np.concatenate([(ds.T @ q * scale).reshape(c, n, d),
                              (p.T @ do).reshape(c, n, d)], axis=2)
        mine = ring_reduce_scatter(comm, dkv.ravel()).reshape(n, 2 * d)
    return o, dq, mine[:, :d], mine[:, d:]
