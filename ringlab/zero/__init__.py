"""Part 5, ZeRO-1/2/3 and FSDP: sharded optimizer states, gradients and parameters.

Empty until its part of the book lands."""
