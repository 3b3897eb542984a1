"""Part 4, pipeline parallelism: schedules as data, a validator, stages exchanging activations and gradients.

Empty until its part of the book lands."""
