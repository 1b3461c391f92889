"""The process that imported zephon_torch: a later process with another pid that sees the same
value is a forked copy of it (see `ops._tokenizer.fork_safe_backend`). Recorded by the
package's own import, which imports nothing heavy, so a child that first reaches the
tokenizer code after a fork still tells itself apart."""

import os

IMPORTED_IN = os.getpid()
