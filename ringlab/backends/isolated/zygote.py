"""The zygote's last import: what the forkserver does once, before it forks a
process per rank (``server._context`` preloads this module after numpy and
every module of ringlab).

* It indexes every function of the process (``sandbox.index_functions``), so
  that a rank finds the banned answers it must replace without visiting every
  object, which in a fresh fork copies every page of memory.
* It freezes the garbage collector's view of what is loaded (``gc.freeze``):
  a collection in a rank then never visits the zygote's objects, which would
  copy their pages too.

Importing it anywhere else only builds an index that nothing uses there (a
rank uses it only when its parent process built it).
"""

import gc
import tempfile

from . import sandbox

# The temporary folder is found by writing a file in it, which a rank may not do.
tempfile.gettempdir()
sandbox.index_functions()
gc.freeze()
