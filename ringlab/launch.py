"""``python -m ringlab.launch``: run a ringlab program under ``torchrun``.

The implementation is ``ringlab/backends/torch/torchrun.py``; this name stays
short because people type it.
"""

from .backends.torch.torchrun import main

if __name__ == "__main__":
    main()
