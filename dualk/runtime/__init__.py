"""Per-operator check and run: the code every route of a call ends in (dualk.ops' direct route,
the registered custom ops and the eager autograd route of dualk.autograd). Imports dispatch,
registry, backends and core; nothing above."""
