"""Part 7: how today's largest runs communicate.

Context parallelism (``ring_attention``, ``allgather_attention``, ``ulysses``,
over the sequence layouts of ``layout`` and the block maths of
``blockwise``; the layer and the bytes in ``context_parallel``), expert
parallelism (``expert_parallel``, for ``ringlab.nn.MoE``), grouped-query
attention under tensor parallelism (``gqa_tp``), hybrid-sharded data
parallelism (``hsdp``, checked against FSDP2 by ``torch_hsdp``), the bytes
that leave a node (``nodes``) and all dimensions on one mesh (``nd_mesh``).
"""
