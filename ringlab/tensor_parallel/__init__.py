"""Part 3, tensor parallelism: column- and row-parallel layers, the Megatron MLP, attention with heads split.

Empty until its part of the book lands."""
